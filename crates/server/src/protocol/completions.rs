//! `/v1/completions` bodies: [`CompletionRequest`] as sent, then admitted into an
//! [`AdmittedCompletion`] (prompts as text or token ids, sampling parameters built).
//!
//! Invariants: at most [`MAX_N`] prompts and at most [`MAX_N`] choices (prompts times `n`) per
//! request; `echo` with `logprobs` (prompt logprobs) and `suffix` are refused by
//! [`CompletionRequest::refuse_unsupported`], which the route calls before admitting.

use super::sampling::{max_tokens, SamplingFields};
use super::structured::StructuredFields;
use super::unsupported::refuse;
use super::wire::{from_value, parse_body, token_id, Count, Flag};
use super::{Options, COMPLETIONS_DEFAULT_MAX_TOKENS, MAX_N};
use crate::error::{Result, ServerError};
use ferrum_types::{TokenId, MAX_LOGPROBS};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// A completions body, as sent: the shared sampling fields and the completion fields, each
/// a derived type read from the same body (see [`super::ChatCompletionRequest`]).
#[derive(Debug, Clone, Default)]
pub struct CompletionRequest {
    pub sampling: SamplingFields,
    pub completion: CompletionFields,
    pub structured: StructuredFields,
}

/// The fields only the completions endpoint has.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(expecting = "an object")]
pub struct CompletionFields {
    pub prompt: Option<PromptInput>,
    pub max_tokens: Option<Count>,
    /// Must equal `n` (ranking samples is not served).
    pub best_of: Option<Count>,
    /// `k`: the sampled token's logprob and the `k` most likely tokens.
    pub logprobs: Option<Count>,
    /// Put the prompt's text before each completion.
    pub echo: Option<Flag>,
    pub suffix: Option<Value>,
}

/// One prompt of a completions request.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Ids(Vec<TokenId>),
}

/// `prompt`: a string, a list of strings, a list of token ids, or a list of those lists.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptInput(pub Vec<Prompt>);

impl<'de> Deserialize<'de> for PromptInput {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let bad = |v: &Value| {
            D::Error::custom(format!(
                "must be a string, a list of strings, a list of token ids or a list of such lists, got {}",
                super::wire::kind(v)
            ))
        };
        let ids = |items: &[Value]| {
            items
                .iter()
                .map(token_id)
                .collect::<std::result::Result<Vec<_>, String>>()
                .map_err(D::Error::custom)
        };
        let prompts = match Value::deserialize(d)? {
            Value::String(s) => vec![Prompt::Text(s)],
            Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_number) => {
                vec![Prompt::Ids(ids(&items)?)]
            }
            Value::Array(items) => items
                .into_iter()
                .map(|p| match p {
                    Value::String(s) => Ok(Prompt::Text(s)),
                    Value::Array(x) => Ok(Prompt::Ids(ids(&x)?)),
                    other => Err(bad(&other)),
                })
                .collect::<std::result::Result<_, _>>()?,
            other => return Err(bad(&other)),
        };
        Ok(PromptInput(prompts))
    }
}

/// A completions request ready for the engine.
#[derive(Debug, Clone)]
pub struct AdmittedCompletion {
    pub opts: Options,
    pub prompts: Vec<Prompt>,
    /// Put the prompt's text before each completion.
    pub echo: bool,
    /// `logprobs: k`: the sampled token's logprob and the `k` most likely tokens.
    pub logprobs: Option<usize>,
}

/// Features of the completions API that Ferrum does not have (key, what it is).
const UNSUPPORTED_COMPLETIONS: &[(&str, &str)] = &[("suffix", "a suffix (fill in the middle)")];

impl CompletionRequest {
    /// Reads a body (see [`super::wire`]): types checked, nothing else.
    pub fn from_body(body: &[u8]) -> Result<Self> {
        Self::from_json(&parse_body(body)?)
    }

    /// Reads a parsed body.
    pub fn from_json(body: &Value) -> Result<Self> {
        Ok(CompletionRequest {
            sampling: from_value(body)?,
            completion: from_value(body)?,
            structured: from_value(body)?,
        })
    }

    /// The 400 for the first feature asked for that this server does not serve yet.
    pub fn refuse_unsupported(&self) -> Result<()> {
        let c = &self.completion;
        refuse(UNSUPPORTED_COMPLETIONS, |key| match key {
            "suffix" => c.suffix.as_ref(),
            _ => None,
        })
    }

    /// Checks every rule and builds the request the engine takes.
    pub fn admit(self) -> Result<AdmittedCompletion> {
        let c = self.completion;
        let max = max_tokens("max_tokens", c.max_tokens)?.or(Some(COMPLETIONS_DEFAULT_MAX_TOKENS));
        let mut opts = self.sampling.options(max)?;
        opts.set_constraint(self.structured.constraint()?);
        if let Some(Count(b)) = c.best_of {
            if b != opts.params.n {
                return Err(ServerError::unsupported(
                    "best_of",
                    "'best_of' other than 'n' (ranking samples)",
                ));
            }
        }
        let logprobs = c.logprobs.map(|Count(k)| k);
        if let Some(k) = logprobs {
            if k > MAX_LOGPROBS {
                return Err(ServerError::param(
                    "logprobs",
                    format!("'logprobs' must be between 0 and {MAX_LOGPROBS}, got {k}"),
                ));
            }
        }
        opts.params.logprobs = logprobs;
        let echo = c.echo.is_some_and(|Flag(b)| b);
        if echo && logprobs.is_some() {
            return Err(ServerError::unsupported(
                "echo",
                "'echo' together with 'logprobs' (prompt logprobs)",
            ));
        }
        let Some(PromptInput(prompts)) = c.prompt else {
            return Err(ServerError::param("prompt", "'prompt' is required"));
        };
        if prompts.is_empty() {
            return Err(ServerError::param("prompt", "'prompt' must not be empty"));
        }
        if prompts.len() > MAX_N {
            return Err(ServerError::param(
                "prompt",
                format!("at most {MAX_N} prompts per request, got {}", prompts.len()),
            ));
        }
        if prompts.len() * opts.params.n > MAX_N {
            return Err(ServerError::param(
                "n",
                format!(
                    "{} prompts with 'n' = {} make {} choices; at most {MAX_N} per request",
                    prompts.len(),
                    opts.params.n,
                    prompts.len() * opts.params.n
                ),
            ));
        }
        Ok(AdmittedCompletion {
            opts,
            prompts,
            echo,
            logprobs,
        })
    }
}
