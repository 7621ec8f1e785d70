//! `POST /v1/chat/completions`: messages through the model's chat template, one engine
//! request with `n` samples, answered as one `chat.completion` or a stream of
//! `chat.completion.chunk`s.

use crate::error::{Result, ServerError};
use crate::generate::{collect, finite, Envelope, Merged, TokenLogprob};
use crate::json::json_response;
use crate::protocol::response::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatLogprobs, CompletionObject, Delta,
    TokenLogprobEntry, TopLogprob,
};
use crate::protocol::ChatCompletionRequest;
use crate::sse::{sse_response, ChunkFormat};
use crate::state::{unix_now, AppState};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use ferrum_engine::GenerateRequest;
use ferrum_tokenizer::Tokenizer;
use ferrum_types::{FinishReason, TokenId};
use std::sync::Arc;

pub async fn chat_completions(
    State(s): State<Arc<AppState>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let body = s.body(body)?;
    let req = ChatCompletionRequest::from_body(&body)?;
    // Tools parse, but are not served yet.
    req.refuse_unsupported()?;
    let req = req.admit()?;
    s.check_model(req.opts.model.as_deref())?;
    let Some(template) = s.template.clone() else {
        return Err(ServerError::bad(
            "this model has no chat template; use /v1/completions with a prompt",
        ));
    };
    // Rendering and tokenizing a long conversation is CPU work: keep it off the I/O threads.
    let (tok, messages, tools, add_gen) = (
        s.tokenizer.clone(),
        req.messages.clone(),
        req.tools.clone(),
        req.add_generation_prompt,
    );
    let prompt = tokio::task::spawn_blocking(move || -> Result<Vec<TokenId>> {
        let text = template.render_with_tools(&messages, tools.as_ref(), add_gen)?;
        Ok(tok.encode(&text, false)?)
    })
    .await
    .map_err(|e| ServerError::Internal(format!("tokenizing failed: {e}")))??;
    let guide = s.compile_constraint(&req.opts).await?;
    let params = req.opts.params;
    s.check_context(prompt.len(), params.max_tokens, "messages")?;
    let n = params.n;
    let mut request = GenerateRequest::new(prompt, params);
    request.guide = guide;
    let merged = Merged::submit(&s.engine, vec![request])?;
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
    let choices: Vec<ChatChoice> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| ChatChoice {
            finish_reason: c.finish.as_ref().map(FinishReason::as_openai),
            index: i,
            logprobs: req.logprobs.then(|| ChatLogprobs {
                content: c.logprobs.iter().map(|l| fmt.entry(l)).collect(),
            }),
            message: AssistantMessage {
                content: c.text.clone(),
                role: "assistant",
            },
        })
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &fmt.env.wrap(choices, Some(&usage)),
    ))
}

/// A token as OpenAI's logprob objects show it: text, logprob and UTF-8 bytes.
pub fn top_logprob(tok: &Tokenizer, id: TokenId, logprob: f32) -> TopLogprob {
    let text = tok.token_text(id).unwrap_or_default();
    TopLogprob {
        bytes: text.as_bytes().to_vec(),
        logprob: finite(logprob),
        token: text,
    }
}

struct ChatChunks {
    env: Envelope,
    n: usize,
    logprobs: bool,
    tokenizer: Arc<Tokenizer>,
}

type Chunk = CompletionObject<ChatChunkChoice>;

impl ChatChunks {
    fn entry(&self, l: &TokenLogprob) -> TokenLogprobEntry {
        let t = top_logprob(&self.tokenizer, l.token, l.logprob);
        TokenLogprobEntry {
            bytes: t.bytes,
            logprob: t.logprob,
            token: t.token,
            top_logprobs: l
                .top
                .iter()
                .map(|&(id, lp)| top_logprob(&self.tokenizer, id, lp))
                .collect(),
        }
    }

    fn chunk(
        &self,
        index: usize,
        delta: Delta,
        logprobs: Option<ChatLogprobs>,
        finish: Option<&'static str>,
    ) -> Chunk {
        self.env.wrap(
            vec![ChatChunkChoice {
                delta,
                finish_reason: finish,
                index,
                logprobs,
            }],
            None,
        )
    }
}

fn text_delta(text: &str) -> Delta {
    Delta {
        content: Some(text.to_string()),
        role: None,
    }
}

impl ChunkFormat for ChatChunks {
    type Choice = ChatChunkChoice;

    fn start(&mut self) -> Vec<Chunk> {
        (0..self.n)
            .map(|i| {
                let delta = Delta {
                    content: Some(String::new()),
                    role: Some("assistant"),
                };
                self.chunk(i, delta, None, None)
            })
            .collect()
    }

    fn token(&mut self, choice: usize, text: &str, lp: Option<TokenLogprob>) -> Option<Chunk> {
        let logprobs = match (&lp, self.logprobs) {
            (Some(l), true) => Some(ChatLogprobs {
                content: vec![self.entry(l)],
            }),
            _ => None,
        };
        if text.is_empty() && logprobs.is_none() {
            return None;
        }
        Some(self.chunk(choice, text_delta(text), logprobs, None))
    }

    fn finish(&mut self, choice: usize, text: &str, reason: &FinishReason) -> Vec<Chunk> {
        let mut out = Vec::with_capacity(2);
        if !text.is_empty() {
            out.push(self.chunk(choice, text_delta(text), None, None));
        }
        out.push(self.chunk(choice, Delta::default(), None, Some(reason.as_openai())));
        out
    }

    fn envelope(&self) -> &Envelope {
        &self.env
    }
}
