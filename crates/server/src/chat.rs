//! `POST /v1/chat/completions`: messages through the model's chat template, one engine
//! request with `n` samples, answered as one `chat.completion` or a stream of
//! `chat.completion.chunk`s.

use crate::error::{Result, ServerError};
use crate::fields::Fields;
use crate::generate::{collect, finite, Envelope, Merged, TokenLogprob};
use crate::protocol::ChatRequest;
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
use serde_json::{json, Value};
use std::sync::Arc;

pub async fn chat_completions(
    State(s): State<Arc<AppState>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let body = s.body(body)?;
    let req = ChatRequest::parse(&Fields::parse(&body)?)?;
    s.check_model(req.opts.model.as_deref())?;
    let Some(template) = s.template.clone() else {
        return Err(ServerError::bad(
            "this model has no chat template; use /v1/completions with a prompt",
        ));
    };
    // Rendering and tokenizing a long conversation is CPU work: keep it off the I/O threads.
    let (tok, messages, add_gen) = (
        s.tokenizer.clone(),
        req.messages.clone(),
        req.add_generation_prompt,
    );
    let prompt = tokio::task::spawn_blocking(move || -> Result<Vec<TokenId>> {
        let text = template.render(&messages, add_gen)?;
        Ok(tok.encode(&text, false)?)
    })
    .await
    .map_err(|e| ServerError::Internal(format!("tokenizing failed: {e}")))??;
    let params = req.opts.params;
    s.check_context(prompt.len(), params.max_tokens, "messages")?;
    let n = params.n;
    let merged = Merged::submit(&s.engine, vec![GenerateRequest::new(prompt, params)])?;
    let fmt = ChatChunks {
        env: Envelope {
            id: s.new_id("chatcmpl"),
            object: if req.opts.stream {
                "chat.completion.chunk"
            } else {
                "chat.completion"
            },
            created: unix_now(),
            model: s.model_name.clone(),
        },
        n,
        logprobs: req.logprobs,
        tokenizer: s.tokenizer.clone(),
    };
    if req.opts.stream {
        return Ok(sse_response(merged, fmt, n, req.opts.include_usage));
    }
    let (choices, usage) = collect(merged, 1, n).await?;
    let choices: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({
                "index": i,
                "message": {"role": "assistant", "content": c.text},
                "logprobs": if req.logprobs {
                    json!({"content": c.logprobs.iter().map(|l| fmt.entry(l)).collect::<Vec<_>>()})
                } else {
                    Value::Null
                },
                "finish_reason": c.finish.as_ref().map(FinishReason::as_openai),
            })
        })
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &fmt.env.wrap(Value::Array(choices), Some(&usage)),
    ))
}

/// A token as OpenAI's logprob objects show it: text, logprob and UTF-8 bytes.
pub fn token_json(tok: &Tokenizer, id: TokenId, logprob: f32) -> Value {
    let text = tok.token_text(id).unwrap_or_default();
    json!({"token": text, "logprob": finite(logprob), "bytes": text.as_bytes()})
}

struct ChatChunks {
    env: Envelope,
    n: usize,
    logprobs: bool,
    tokenizer: Arc<Tokenizer>,
}

impl ChatChunks {
    fn entry(&self, l: &TokenLogprob) -> Value {
        let mut e = token_json(&self.tokenizer, l.token, l.logprob);
        e["top_logprobs"] = l
            .top
            .iter()
            .map(|&(id, lp)| token_json(&self.tokenizer, id, lp))
            .collect();
        e
    }

    fn chunk(&self, index: usize, delta: Value, logprobs: Value, finish: Option<&str>) -> Value {
        self.env.wrap(
            json!([{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]),
            None,
        )
    }
}

impl ChunkFormat for ChatChunks {
    fn start(&mut self) -> Vec<Value> {
        (0..self.n)
            .map(|i| {
                self.chunk(
                    i,
                    json!({"role": "assistant", "content": ""}),
                    Value::Null,
                    None,
                )
            })
            .collect()
    }

    fn token(&mut self, choice: usize, text: &str, lp: Option<TokenLogprob>) -> Option<Value> {
        let logprobs = match (&lp, self.logprobs) {
            (Some(l), true) => json!({"content": [self.entry(l)]}),
            _ => Value::Null,
        };
        if text.is_empty() && logprobs.is_null() {
            return None;
        }
        Some(self.chunk(choice, json!({"content": text}), logprobs, None))
    }

    fn finish(&mut self, choice: usize, text: &str, reason: &FinishReason) -> Vec<Value> {
        let mut out = Vec::with_capacity(2);
        if !text.is_empty() {
            out.push(self.chunk(choice, json!({"content": text}), Value::Null, None));
        }
        out.push(self.chunk(choice, json!({}), Value::Null, Some(reason.as_openai())));
        out
    }

    fn envelope(&self) -> &Envelope {
        &self.env
    }
}
