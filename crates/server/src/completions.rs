//! `POST /v1/completions`: one engine request per prompt (text or token ids), `n` samples
//! each; choice `p * n + i` is sample `i` of prompt `p`. Answered as one `text_completion` or
//! a stream of them.

use crate::error::{Result, ServerError};
use crate::fields::Fields;
use crate::generate::{collect, finite, Envelope, Merged, TokenLogprob};
use crate::protocol::{CompletionRequest, Prompt};
use crate::sse::{json_response, sse_response, ChunkFormat};
use crate::state::{unix_now, AppState};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use ferrum_engine::GenerateRequest;
use ferrum_tokenizer::Tokenizer;
use ferrum_types::{FinishReason, TokenId};
use serde_json::{json, Map, Value};
use std::sync::Arc;

pub async fn completions(
    State(s): State<Arc<AppState>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let body = s.body(body)?;
    let req = CompletionRequest::parse(&Fields::parse(&body)?)?;
    s.check_model(req.opts.model.as_deref())?;
    let (tok, prompts, echo) = (s.tokenizer.clone(), req.prompts.clone(), req.echo);
    let skip_special = req.opts.params.skip_special_tokens;
    // (token ids, echoed text) per prompt, tokenized off the I/O threads.
    let encoded = tokio::task::spawn_blocking(move || -> Result<Vec<(Vec<TokenId>, String)>> {
        prompts
            .into_iter()
            .map(|p| match p {
                Prompt::Text(t) => {
                    let ids = tok.encode(&t, true)?;
                    Ok((ids, if echo { t } else { String::new() }))
                }
                Prompt::Ids(ids) => {
                    let text = if echo {
                        tok.decode(&ids, skip_special)
                            .map_err(|e| ServerError::param("prompt", e.to_string()))?
                    } else {
                        String::new()
                    };
                    Ok((ids, text))
                }
            })
            .collect()
    })
    .await
    .map_err(|e| ServerError::Internal(format!("tokenizing failed: {e}")))??;
    let params = req.opts.params;
    for (ids, _) in &encoded {
        if ids.is_empty() {
            return Err(ServerError::param("prompt", "a prompt is empty"));
        }
        s.check_context(ids.len(), params.max_tokens, "prompt")?;
    }
    let n = params.n;
    let num_prompts = encoded.len();
    let requests = encoded
        .iter()
        .map(|(ids, _)| GenerateRequest::new(ids.clone(), params.clone()))
        .collect();
    let merged = Merged::submit(&s.engine, requests)?;
    let echoes: Vec<String> = encoded.into_iter().map(|(_, t)| t).collect();
    let mut fmt = CompletionChunks {
        env: Envelope {
            id: s.new_id("cmpl"),
            object: "text_completion",
            created: unix_now(),
            model: s.model_name.clone(),
        },
        n,
        echoes,
        logprobs: req.logprobs.is_some(),
        offsets: vec![0; num_prompts * n],
        tokenizer: s.tokenizer.clone(),
    };
    if req.opts.stream {
        return Ok(sse_response(merged, fmt, n, req.opts.include_usage));
    }
    let (choices, usage) = collect(merged, num_prompts, n).await?;
    let choices: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let echo = fmt.echoes[i / n].clone();
            let logprobs = if fmt.logprobs {
                fmt.offsets[i] = echo.chars().count();
                let mut lp = LogprobLists::default();
                for l in &c.logprobs {
                    let text = fmt.tokenizer.token_text(l.token).unwrap_or_default();
                    fmt.add(&mut lp, i, &text, l);
                }
                lp.into_json()
            } else {
                Value::Null
            };
            json!({
                "index": i,
                "text": format!("{echo}{}", c.text),
                "logprobs": logprobs,
                "finish_reason": c.finish.as_ref().map(FinishReason::as_openai),
            })
        })
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &fmt.env.wrap(Value::Array(choices), Some(&usage)),
    ))
}

/// The legacy completions logprobs object, column by column.
#[derive(Default)]
struct LogprobLists {
    tokens: Vec<Value>,
    token_logprobs: Vec<Value>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<Value>,
}

impl LogprobLists {
    fn into_json(self) -> Value {
        json!({
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        })
    }
}

struct CompletionChunks {
    env: Envelope,
    n: usize,
    /// Per prompt: the text echoed before its completions (empty without `echo`).
    echoes: Vec<String>,
    logprobs: bool,
    /// Per choice: characters of text so far, for `text_offset`.
    offsets: Vec<usize>,
    tokenizer: Arc<Tokenizer>,
}

impl CompletionChunks {
    /// Appends one token; `text` is the token's own text (not the released delta).
    fn add(&mut self, lp: &mut LogprobLists, choice: usize, text: &str, l: &TokenLogprob) {
        let mut top = Map::new();
        for &(id, v) in &l.top {
            let t = self.tokenizer.token_text(id).unwrap_or_default();
            top.insert(t, json!(finite(v)));
        }
        lp.tokens.push(json!(text));
        lp.token_logprobs.push(json!(finite(l.logprob)));
        lp.top_logprobs.push(Value::Object(top));
        let off = self.offsets.get(choice).copied().unwrap_or(0);
        lp.text_offset.push(json!(off));
        if let Some(o) = self.offsets.get_mut(choice) {
            *o += text.chars().count();
        }
    }

    fn chunk(&self, index: usize, text: &str, logprobs: Value, finish: Option<&str>) -> Value {
        self.env.wrap(
            json!([{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}]),
            None,
        )
    }
}

impl ChunkFormat for CompletionChunks {
    fn start(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        for choice in 0..self.echoes.len() * self.n {
            let echo = &self.echoes[choice / self.n];
            if !echo.is_empty() {
                self.offsets[choice] = echo.chars().count();
                out.push(self.chunk(choice, echo, Value::Null, None));
            }
        }
        out
    }

    fn token(&mut self, choice: usize, text: &str, lp: Option<TokenLogprob>) -> Option<Value> {
        let logprobs = match (lp, self.logprobs) {
            (Some(l), true) => {
                let mut lists = LogprobLists::default();
                let tok_text = self.tokenizer.token_text(l.token).unwrap_or_default();
                self.add(&mut lists, choice, &tok_text, &l);
                lists.into_json()
            }
            _ => Value::Null,
        };
        if text.is_empty() && logprobs.is_null() {
            return None;
        }
        Some(self.chunk(choice, text, logprobs, None))
    }

    fn finish(&mut self, choice: usize, text: &str, reason: &FinishReason) -> Vec<Value> {
        let mut out = Vec::with_capacity(2);
        if !text.is_empty() {
            out.push(self.chunk(choice, text, Value::Null, None));
        }
        out.push(self.chunk(choice, "", Value::Null, Some(reason.as_openai())));
        out
    }

    fn envelope(&self) -> &Envelope {
        &self.env
    }
}
