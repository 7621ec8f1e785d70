//! `POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's Messages API over the
//! chat path.
//!
//! The body is admitted into a chat request ([`crate::protocol::anthropic`]) and started like
//! a chat completion ([`start_chat`]). The answer is a `message` whose content is the text
//! block and then one `tool_use` block per call; or, with `stream`, Anthropic's events:
//! `message_start` (with the prompt's token count), `ping`, per block `content_block_start`,
//! its `content_block_delta`s (`text_delta` or `input_json_delta`) and `content_block_stop`,
//! then `message_delta` (stop reason and usage) and `message_stop`. A `ping` also goes out
//! after [`PING_AFTER`] without an event (a long prompt's prefill), so proxies keep the
//! connection. An engine failure mid-stream is an `error` event. Every error is in Anthropic's
//! shape ([`AnthropicError`]).
//!
//! Usage: `input_tokens` are the prompt tokens not read from the prefix cache and
//! `cache_read_input_tokens` the rest, as Anthropic counts them. A stream's `message_start`
//! goes out before the engine has looked the prompt up in the cache, so its `input_tokens` is
//! the whole prompt; `message_delta` carries the final split (which the SDKs keep).

use crate::chat::{chat_prompt, start_chat, whole_answer, WholeAnswer};
use crate::generate::{add_usage, TokenLogprob};
use crate::json::json_response;
use crate::protocol::anthropic::events::{
    BlockDelta, BlockStart, BlockStop, Delta, Empty, ErrorBody, ErrorDetail, Event, MessageDelta,
    MessageStart, StartedBlock, StartedMessage, StopDelta, TokenCount,
};
use crate::protocol::anthropic::{
    stop_reason, tool_input, AnthropicError, Block, MessageObject, MessageUsage, MessagesRequest,
};
use crate::sse::{event_frame, event_stream, FrameWriter};
use crate::state::AppState;
use crate::tools::parser::split_output;
use crate::tools::{ToolCallParser, ToolEvent};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use ferrum_engine::Usage;
use ferrum_types::FinishReason;
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

/// A stream sends a `ping` after this long without an event.
pub const PING_AFTER: Duration = Duration::from_secs(10);

type Result<T> = std::result::Result<T, AnthropicError>;

pub async fn messages(
    State(s): State<Arc<AppState>>,
    role: Option<axum::Extension<crate::state::KeyRole>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let body = s.body(body)?;
    let mut req = MessagesRequest::from_body(&body)?.admit(false)?;
    if let Some(axum::Extension(r)) = role {
        r.apply(&mut req.opts);
    }
    s.check_model(req.opts.model.as_deref())?;
    let started = start_chat(&s, &mut req).await?;
    let id = s.new_id("msg").replacen('-', "_", 1);
    let tool_base = id.trim_start_matches("msg_").to_string();
    if req.opts.stream {
        let writer = MessageEvents {
            id,
            tool_base,
            model: s.model_name.clone(),
            prompt_tokens: started.prompt_tokens,
            parser: started.calls.clone().map(ToolCallParser::new),
            blocks: 0,
            open: None,
            calls: 0,
            finish: None,
            usage: Usage::default(),
        };
        return Ok(event_stream(started.merged, 1, writer));
    }
    let WholeAnswer {
        content: text,
        calls,
        finish,
        usage,
    } = whole_answer(started).await?;
    let mut content = Vec::new();
    if !text.is_empty() {
        content.push(Block::Text { text });
    }
    let has_calls = !calls.is_empty();
    for (k, call) in calls.into_iter().enumerate() {
        content.push(Block::ToolUse {
            id: format!("toolu_{tool_base}_{k}"),
            input: tool_input(&call.arguments),
            name: call.name,
        });
    }
    let (reason, sequence) = stop_reason(finish.as_ref(), has_calls);
    let message = MessageObject {
        content,
        id,
        model: s.model_name.clone(),
        role: "assistant",
        stop_reason: Some(reason),
        stop_sequence: sequence,
        kind: "message",
        usage: (&usage).into(),
    };
    Ok(json_response(StatusCode::OK, &message))
}

/// `{"input_tokens": N}`: the prompt the same body would run with (template, tools and all).
pub async fn count_tokens(
    State(s): State<Arc<AppState>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let body = s.body(body)?;
    let req = MessagesRequest::from_body(&body)?.admit(true)?;
    s.check_model(req.opts.model.as_deref())?;
    let prompt = chat_prompt(&s, &req).await?;
    Ok(json_response(
        StatusCode::OK,
        &TokenCount {
            input_tokens: prompt.len(),
        },
    ))
}

/// The block being streamed.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Open {
    Text,
    ToolUse,
}

/// Anthropic's event stream of one message.
struct MessageEvents {
    id: String,
    tool_base: String,
    model: String,
    prompt_tokens: usize,
    parser: Option<ToolCallParser>,
    /// Blocks started so far (the next block's index).
    blocks: usize,
    open: Option<Open>,
    calls: usize,
    finish: Option<FinishReason>,
    usage: Usage,
}

fn event<B: Serialize>(kind: &'static str, body: B) -> String {
    event_frame(kind, &Event { body, kind })
}

impl MessageEvents {
    fn close(&mut self, out: &mut Vec<String>) {
        if self.open.take().is_some() {
            let index = self.blocks - 1;
            out.push(event("content_block_stop", BlockStop { index }));
        }
    }

    fn start_block(&mut self, out: &mut Vec<String>, open: Open, block: StartedBlock<'_>) {
        self.close(out);
        let start = BlockStart {
            index: self.blocks,
            content_block: block,
        };
        out.push(event("content_block_start", start));
        self.blocks += 1;
        self.open = Some(open);
    }

    fn apply(&mut self, events: Vec<ToolEvent>) -> Vec<String> {
        let mut out = Vec::new();
        for ev in events {
            match ev {
                ToolEvent::Content(text) => {
                    if self.open != Some(Open::Text) {
                        let block = StartedBlock::Text { text: "" };
                        self.start_block(&mut out, Open::Text, block);
                    }
                    let delta = BlockDelta {
                        index: self.blocks - 1,
                        delta: Delta::TextDelta { text: &text },
                    };
                    out.push(event("content_block_delta", delta));
                }
                ToolEvent::CallStart { name, .. } => {
                    let id = format!("toolu_{}_{}", self.tool_base, self.calls);
                    self.calls += 1;
                    let block = StartedBlock::ToolUse {
                        id: &id,
                        name: &name,
                        input: Empty {},
                    };
                    self.start_block(&mut out, Open::ToolUse, block);
                }
                ToolEvent::Arguments { text, .. } => {
                    if self.open == Some(Open::ToolUse) {
                        let delta = BlockDelta {
                            index: self.blocks - 1,
                            delta: Delta::InputJsonDelta {
                                partial_json: &text,
                            },
                        };
                        out.push(event("content_block_delta", delta));
                    }
                }
            }
        }
        out
    }
}

impl FrameWriter for MessageEvents {
    fn start(&mut self) -> Vec<String> {
        let message = StartedMessage::new(&self.id, &self.model, self.prompt_tokens);
        vec![
            event("message_start", MessageStart { message }),
            event("ping", Empty {}),
        ]
    }

    fn token(&mut self, _choice: usize, text: &str, _lp: Option<TokenLogprob>) -> Vec<String> {
        let events = split_output(self.parser.as_mut(), text, false);
        self.apply(events)
    }

    fn finish(&mut self, _choice: usize, text: &str, reason: &FinishReason) -> Vec<String> {
        let events = split_output(self.parser.as_mut(), text, true);
        let mut out = self.apply(events);
        self.close(&mut out);
        self.finish = Some(reason.clone());
        out
    }

    fn usage(&mut self, usage: &Usage) {
        add_usage(&mut self.usage, usage);
    }

    fn end(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        self.close(&mut out);
        let (reason, sequence) = stop_reason(self.finish.as_ref(), self.calls > 0);
        let delta = MessageDelta {
            delta: StopDelta {
                stop_reason: reason,
                stop_sequence: sequence,
            },
            usage: MessageUsage::from(&self.usage),
        };
        out.push(event("message_delta", delta));
        out.push(event("message_stop", Empty {}));
        out
    }

    fn error(&mut self, msg: &str) -> Vec<String> {
        let error = ErrorDetail {
            kind: "api_error",
            message: msg.to_string(),
        };
        vec![event("error", ErrorBody { error })]
    }

    fn keepalive(&self) -> Option<(Duration, String)> {
        Some((PING_AFTER, event("ping", Empty {})))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{CallSyntax, ToolFormat};

    fn writer() -> MessageEvents {
        MessageEvents {
            id: "msg_abc".into(),
            tool_base: "abc".into(),
            model: "m".into(),
            prompt_tokens: 12,
            parser: Some(ToolCallParser::new(CallSyntax::new(
                ToolFormat::Hermes,
                ["get".to_string()],
            ))),
            blocks: 0,
            open: None,
            calls: 0,
            finish: None,
            usage: Usage::default(),
        }
    }

    fn usage() -> Usage {
        Usage {
            prompt_tokens: 12,
            completion_tokens: 9,
            cached_tokens: 4,
            ..Usage::default()
        }
    }

    /// Every kind of event: text then two calls, a stop string, a cut answer, a failure, the
    /// keep-alive; and the errors' and count_tokens' bodies.
    fn streams() -> String {
        let mut out = Vec::new();
        let mut w = writer();
        out.extend(w.start());
        out.extend(w.token(
            0,
            "Let me \"check\". <tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\": ",
            None,
        ));
        out.extend(w.token(0, "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get\", \"arguments\": {}}\n</tool_call>", None));
        w.usage(&usage());
        out.extend(w.finish(0, "", &FinishReason::Eos(2)));
        out.extend(w.end());
        let mut w = writer();
        out.extend(w.start());
        out.extend(w.token(0, "Hello", None));
        out.extend(w.finish(0, " world", &FinishReason::StopString("END".into())));
        out.extend(w.end());
        let mut w = writer();
        out.extend(w.start());
        out.extend(w.finish(0, "cut", &FinishReason::MaxTokens));
        out.extend(w.end());
        out.extend(w.error("the engine \"failed\""));
        out.extend(w.keepalive().map(|(_, f)| f));
        for e in [
            crate::error::ServerError::param("max_tokens", "'max_tokens' must be positive"),
            crate::error::ServerError::Internal("boom".into()),
        ] {
            out.push(format!(
                "{}\n",
                crate::protocol::response::to_json_string(&AnthropicError(e).body())
            ));
        }
        out.push(crate::protocol::response::to_json_string(&TokenCount {
            input_tokens: 7,
        }));
        out.concat()
    }

    /// The events are byte for byte what they were when they were written as untyped JSON
    /// (`testdata/messages.sse`, recorded then; `FERRUM_BLESS=1` records it anew).
    #[test]
    fn the_event_streams_are_unchanged() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/messages.sse");
        let got = streams();
        if std::env::var_os("FERRUM_BLESS").is_some() {
            std::fs::write(path, &got).unwrap();
        }
        let want = std::fs::read_to_string(path).unwrap();
        assert_eq!(got, want);
    }
}
