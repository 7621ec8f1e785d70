//! One request at a time through the engine, for the command line (`ferrum run`, `ferrum
//! chat`): [`EngineHandle::generate_one`] submits a single-sample request to the same step
//! loop the server uses, streams its tokens to a callback and gathers a [`Generation`].
//! Everything the engine does (prefix reuse across calls, chunked prefill, sampling, stop
//! conditions, and each feature added to the step loop later) applies unchanged.
//!
//! Invariant: the returned tokens are exactly those the callback saw; once the callback asks
//! to stop, tokens the engine produced before the abort reached it are dropped.

use crate::handle::EngineHandle;
use crate::request::{Event, GenerateRequest, Usage};
use crate::{EngineError, Result};
use ferrum_types::{FinishReason, TokenId};
use std::time::{Duration, Instant};

/// One generated token as it is reported to the caller.
#[derive(Debug)]
pub struct TokenEvent<'a> {
    pub token: TokenId,
    /// Text that became final with this token.
    pub text: &'a str,
    pub logprob: Option<f32>,
}

/// The result of one generation.
#[derive(Debug, Clone)]
pub struct Generation {
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V came from the prefix cache (an earlier call's).
    pub cached_prompt_tokens: usize,
    pub token_ids: Vec<TokenId>,
    pub text: String,
    pub finish: FinishReason,
    /// From the submission to the first sampled token.
    pub time_to_first_token: Duration,
    pub elapsed: Duration,
    /// The request's usage (speculative decoding's counts included).
    pub usage: Usage,
}

impl Generation {
    /// Decode speed after the first token, in tokens per second.
    pub fn decode_tokens_per_s(&self) -> f64 {
        let t = self
            .elapsed
            .saturating_sub(self.time_to_first_token)
            .as_secs_f64();
        let n = self.token_ids.len().saturating_sub(1);
        if t > 0.0 {
            n as f64 / t
        } else {
            0.0
        }
    }
}

impl EngineHandle {
    /// Runs one single-sample request to its end. `on_token` sees every token with its text;
    /// it returns `false` to stop early (the finish reason is then `Abort`).
    pub fn generate_one(
        &self,
        request: GenerateRequest,
        mut on_token: impl FnMut(&TokenEvent<'_>) -> bool,
    ) -> Result<Generation> {
        if request.params.n != 1 {
            return Err(EngineError::Request(
                "n > 1 is not supported here: this path gathers one sequence".into(),
            ));
        }
        let start = Instant::now();
        let prompt_tokens = request.prompt.len();
        let mut stream = self.generate(request)?;
        let mut token_ids = Vec::new();
        let mut text = String::new();
        let mut ttft = None;
        let mut finish = None;
        let mut stopped = false;
        while let Some(ev) = stream.blocking_next() {
            match ev {
                Event::Token {
                    token,
                    text: delta,
                    logprob,
                    ..
                } if !stopped => {
                    ttft.get_or_insert_with(|| start.elapsed());
                    token_ids.push(token);
                    text.push_str(&delta);
                    let go_on = on_token(&TokenEvent {
                        token,
                        text: &delta,
                        logprob,
                    });
                    if !go_on {
                        stopped = true;
                        self.abort(stream.id());
                    }
                }
                Event::Token { .. } => {}
                Event::Finished {
                    reason, text: rest, ..
                } => {
                    if !stopped {
                        text.push_str(&rest);
                    }
                    finish = Some(if stopped { FinishReason::Abort } else { reason });
                }
                Event::Done { usage } => {
                    return Ok(Generation {
                        prompt_tokens,
                        cached_prompt_tokens: usage.cached_tokens,
                        token_ids,
                        text,
                        finish: finish.unwrap_or(FinishReason::Abort),
                        time_to_first_token: ttft.unwrap_or_else(|| start.elapsed()),
                        elapsed: start.elapsed(),
                        usage,
                    });
                }
                Event::Error(e) => return Err(EngineError::Internal(e)),
            }
        }
        Err(EngineError::Unavailable(
            "the engine stopped before the request finished".into(),
        ))
    }
}
