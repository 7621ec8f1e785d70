//! `POST /v1/responses`: OpenAI's Responses API over the chat path, stateless.
//!
//! The body is admitted into a chat request ([`crate::protocol::responses`]) and started like
//! a chat completion ([`start_chat`]). The answer is a `response` object whose `output` holds
//! the assistant's message (one `output_text` part) and then its function calls; or, with
//! `stream`, the typed event sequence: `response.created`, `response.in_progress`, per item
//! `response.output_item.added`, for a message `response.content_part.added`, its
//! `response.output_text.delta`s, `response.output_text.done` and
//! `response.content_part.done`, for a call its `response.function_call_arguments.delta`s and
//! `.done`, then `response.output_item.done`; last `response.completed` (or
//! `response.incomplete` when the token limit was reached, or `response.failed`). Every event
//! carries its `sequence_number`, from 0.
//!
//! Invariant: a streamed response's items reassemble to exactly the non-streamed `output`
//! (both go through the same tool-call parser), and the final event carries the whole object.

use crate::chat::{start_chat, whole_answer, WholeAnswer};
use crate::error::{Result, ServerError};
use crate::generate::{add_usage, TokenLogprob};
use crate::json::json_response;
use crate::protocol::responses::events::{
    ArgumentsDelta, ArgumentsDone, Event, Item, ItemEvent, OpenCall, OpenMessage, PartEvent,
    Snapshot, TextDelta, TextDone,
};
use crate::protocol::responses::{
    IncompleteDetails, OutputItem, OutputText, ResponseError, ResponseObject, ResponsesRequest,
};
use crate::sse::{event_frame, event_stream, FrameWriter};
use crate::state::{unix_now, AppState};
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

pub async fn responses(
    State(s): State<Arc<AppState>>,
    role: Option<axum::Extension<crate::state::KeyRole>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let body = s.body(body)?;
    let req = ResponsesRequest::from_body(&body)?;
    req.refuse_unsupported()?;
    let mut req = req.admit()?;
    if let Some(axum::Extension(r)) = role {
        r.apply(&mut req.chat.opts);
    }
    s.check_model(req.chat.opts.model.as_deref())?;
    let started = start_chat(&s, &mut req.chat).await?;
    let id = s.new_id("resp").replacen('-', "_", 1);
    let object = ResponseObject::new(id, s.model_name.clone(), unix_now(), &req);
    let items = Items::new(&object.id);
    if req.chat.opts.stream {
        let writer = ResponseEvents {
            object,
            items,
            parser: started.calls.clone().map(ToolCallParser::new),
            open: None,
            seq: 0,
            finish: None,
            usage: Usage::default(),
        };
        return Ok(event_stream(started.merged, 1, writer));
    }
    let WholeAnswer {
        content,
        calls,
        finish,
        usage,
    } = whole_answer(started).await?;
    let mut object = object;
    let mut items = items;
    // The last item is `incomplete` when the token limit cut the answer (a cut-off call
    // must not be run).
    let last = item_status(finish.as_ref());
    let num_calls = calls.len();
    if !content.is_empty() || calls.is_empty() {
        let status = if num_calls == 0 { last } else { "completed" };
        object.output.push(items.message(content, status));
    }
    for (k, call) in calls.into_iter().enumerate() {
        let status = if k + 1 == num_calls {
            last
        } else {
            "completed"
        };
        object
            .output
            .push(items.call(call.name, call.arguments, status));
    }
    finish_object(&mut object, finish.as_ref(), &usage);
    Ok(json_response(StatusCode::OK, &object))
}

/// Whether the token limit (or the context) cut the answer.
fn is_cut(finish: Option<&FinishReason>) -> bool {
    matches!(
        finish,
        Some(FinishReason::MaxTokens | FinishReason::MaxModelLen)
    )
}

/// The status of an answer's last item: `incomplete` when the answer was cut.
fn item_status(finish: Option<&FinishReason>) -> &'static str {
    if is_cut(finish) {
        "incomplete"
    } else {
        "completed"
    }
}

/// Sets the final status, incomplete details and usage.
fn finish_object(object: &mut ResponseObject, finish: Option<&FinishReason>, usage: &Usage) {
    let cut = is_cut(finish);
    object.status = if cut { "incomplete" } else { "completed" };
    object.incomplete_details = cut.then_some(IncompleteDetails {
        reason: "max_output_tokens",
    });
    object.usage = Some(usage.into());
}

/// Ids of a response's items: `msg_<base>_<k>`, `fc_<base>_<k>` and `call_<base>_<k>`.
struct Items {
    base: String,
    next: usize,
}

impl Items {
    fn new(response_id: &str) -> Self {
        Items {
            base: response_id.trim_start_matches("resp_").to_string(),
            next: 0,
        }
    }

    fn id(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}_{}_{}", self.base, self.next - 1)
    }

    fn message(&mut self, text: String, status: &'static str) -> OutputItem {
        OutputItem::Message {
            content: vec![OutputText::new(text)],
            id: self.id("msg"),
            role: "assistant",
            status,
        }
    }

    fn call(&mut self, name: String, arguments: String, status: &'static str) -> OutputItem {
        let id = self.id("fc");
        OutputItem::FunctionCall {
            arguments,
            call_id: id.replacen("fc_", "call_", 1),
            id,
            name,
            status,
        }
    }
}

/// The item being streamed.
enum Open {
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

/// The Responses event stream of one response.
struct ResponseEvents {
    object: ResponseObject,
    items: Items,
    parser: Option<ToolCallParser>,
    open: Option<Open>,
    seq: u64,
    finish: Option<FinishReason>,
    usage: Usage,
}

impl ResponseEvents {
    fn event<B: Serialize>(&mut self, kind: &'static str, body: B) -> String {
        let event = Event {
            body,
            kind,
            sequence_number: self.seq,
        };
        self.seq += 1;
        event_frame(kind, &event)
    }

    /// An event carrying the whole object as it stands.
    fn snapshot(&mut self, kind: &'static str) -> String {
        let event = Event {
            body: Snapshot {
                response: &self.object,
            },
            kind,
            sequence_number: self.seq,
        };
        self.seq += 1;
        event_frame(kind, &event)
    }

    fn output_index(&self) -> usize {
        self.object.output.len()
    }

    fn open_message(&mut self, out: &mut Vec<String>) {
        let id = self.items.id("msg");
        let index = self.output_index();
        let added = ItemEvent {
            output_index: index,
            item: Item::Message(OpenMessage::new(&id)),
        };
        out.push(self.event("response.output_item.added", added));
        let part = PartEvent {
            item_id: &id,
            output_index: index,
            content_index: 0,
            part: OutputText::new(String::new()),
        };
        out.push(self.event("response.content_part.added", part));
        self.open = Some(Open::Message {
            id,
            text: String::new(),
        });
    }

    /// Ends the open item with `status` (`completed`, or `incomplete` when the answer was
    /// cut or failed inside it).
    fn close(&mut self, out: &mut Vec<String>, status: &'static str) {
        let index = self.output_index();
        let item = match self.open.take() {
            None => return,
            Some(Open::Message { id, text }) => {
                let done = TextDone {
                    item_id: &id,
                    output_index: index,
                    content_index: 0,
                    text: &text,
                    logprobs: [],
                };
                out.push(self.event("response.output_text.done", done));
                let part = PartEvent {
                    item_id: &id,
                    output_index: index,
                    content_index: 0,
                    part: OutputText::new(text.clone()),
                };
                out.push(self.event("response.content_part.done", part));
                OutputItem::Message {
                    content: vec![OutputText::new(text)],
                    id,
                    role: "assistant",
                    status,
                }
            }
            Some(Open::Call {
                id,
                call_id,
                name,
                arguments,
            }) => {
                let done = ArgumentsDone {
                    item_id: &id,
                    output_index: index,
                    name: &name,
                    arguments: &arguments,
                };
                out.push(self.event("response.function_call_arguments.done", done));
                OutputItem::FunctionCall {
                    arguments,
                    call_id,
                    id,
                    name,
                    status,
                }
            }
        };
        let done = ItemEvent {
            output_index: index,
            item: Item::Done(&item),
        };
        out.push(self.event("response.output_item.done", done));
        self.object.output.push(item);
    }

    fn apply(&mut self, events: Vec<ToolEvent>) -> Vec<String> {
        let mut out = Vec::new();
        for ev in events {
            match ev {
                ToolEvent::Content(t) => {
                    if !matches!(self.open, Some(Open::Message { .. })) {
                        self.close(&mut out, "completed");
                        self.open_message(&mut out);
                    }
                    let index = self.output_index();
                    let id = match &mut self.open {
                        Some(Open::Message { id, text }) => {
                            text.push_str(&t);
                            id.clone()
                        }
                        _ => continue,
                    };
                    let delta = TextDelta {
                        item_id: &id,
                        output_index: index,
                        content_index: 0,
                        delta: &t,
                        logprobs: [],
                    };
                    out.push(self.event("response.output_text.delta", delta));
                }
                ToolEvent::CallStart { name, .. } => {
                    self.close(&mut out, "completed");
                    let OutputItem::FunctionCall { id, call_id, .. } =
                        self.items.call(name.clone(), String::new(), "in_progress")
                    else {
                        continue;
                    };
                    let added = ItemEvent {
                        output_index: self.output_index(),
                        item: Item::Call(OpenCall::new(&id, &call_id, &name)),
                    };
                    out.push(self.event("response.output_item.added", added));
                    self.open = Some(Open::Call {
                        id,
                        call_id,
                        name,
                        arguments: String::new(),
                    });
                }
                ToolEvent::Arguments { text, .. } => {
                    let index = self.output_index();
                    let id = match &mut self.open {
                        Some(Open::Call { id, arguments, .. }) => {
                            arguments.push_str(&text);
                            id.clone()
                        }
                        _ => continue,
                    };
                    let delta = ArgumentsDelta {
                        item_id: &id,
                        output_index: index,
                        delta: &text,
                    };
                    out.push(self.event("response.function_call_arguments.delta", delta));
                }
            }
        }
        out
    }
}

impl FrameWriter for ResponseEvents {
    fn start(&mut self) -> Vec<String> {
        vec![
            self.snapshot("response.created"),
            self.snapshot("response.in_progress"),
        ]
    }

    fn token(&mut self, _choice: usize, text: &str, _lp: Option<TokenLogprob>) -> Vec<String> {
        let events = split_output(self.parser.as_mut(), text, false);
        self.apply(events)
    }

    fn finish(&mut self, _choice: usize, text: &str, reason: &FinishReason) -> Vec<String> {
        let events = split_output(self.parser.as_mut(), text, true);
        let mut out = self.apply(events);
        let status = item_status(Some(reason));
        self.close(&mut out, status);
        self.finish = Some(reason.clone());
        out
    }

    fn usage(&mut self, usage: &Usage) {
        add_usage(&mut self.usage, usage);
    }

    fn end(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        let status = item_status(self.finish.as_ref());
        self.close(&mut out, status);
        if self.object.output.is_empty() {
            // An empty answer is still a message, as the whole response has it.
            self.open_message(&mut out);
            self.close(&mut out, status);
        }
        let usage = self.usage;
        let finish = self.finish.clone();
        finish_object(&mut self.object, finish.as_ref(), &usage);
        let kind = if self.object.status == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        out.push(self.snapshot(kind));
        out
    }

    fn error(&mut self, msg: &str) -> Vec<String> {
        let mut out = Vec::new();
        self.close(&mut out, "incomplete");
        let e = ServerError::Internal(msg.to_string());
        self.object.status = "failed";
        self.object.error = Some(ResponseError {
            code: "server_error",
            message: e.to_string(),
        });
        out.push(self.snapshot("response.failed"));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::responses::ResponsesRequest;
    use crate::tools::{CallSyntax, ToolFormat};

    /// A writer for a fixed request, id and time.
    fn writer() -> ResponseEvents {
        let body = br#"{"model":"m","input":"weather?","instructions":"be brief","max_output_tokens":40,
            "tools":[{"type":"function","name":"get","parameters":{"type":"object"}}],"metadata":{"k":"v"}}"#;
        let req = ResponsesRequest::from_body(body).unwrap().admit().unwrap();
        let object = ResponseObject::new("resp_abc".into(), "m".into(), 1_700_000_000, &req);
        ResponseEvents {
            items: Items::new(&object.id),
            object,
            parser: Some(ToolCallParser::new(CallSyntax::new(
                ToolFormat::Hermes,
                ["get".to_string()],
            ))),
            open: None,
            seq: 0,
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

    /// Every kind of event, in the streams a client sees: text then a call, a cut answer,
    /// an empty one, a loose call, and a failure inside a message.
    fn streams() -> String {
        let mut out = Vec::new();
        let mut w = writer();
        out.extend(w.start());
        out.extend(w.token(0, "Let me ", None));
        out.extend(w.token(
            0,
            "check. <tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\": ",
            None,
        ));
        out.extend(w.token(0, "\"Paris\"}}\n</tool_call>", None));
        w.usage(&usage());
        out.extend(w.finish(0, "", &FinishReason::Eos(2)));
        out.extend(w.end());
        let mut w = writer();
        out.extend(w.start());
        out.extend(w.token(0, "Hello \"you\"", None));
        out.extend(w.finish(0, " world", &FinishReason::MaxTokens));
        w.usage(&usage());
        out.extend(w.end());
        let mut w = writer();
        out.extend(w.start());
        out.extend(w.finish(0, "", &FinishReason::Eos(2)));
        out.extend(w.end());
        let mut w = writer();
        out.extend(w.start());
        out.extend(w.token(0, "{\"name\": \"get\", \"arguments\": {\"a\": 1}}", None));
        out.extend(w.finish(0, "", &FinishReason::ConstraintEnd));
        out.extend(w.end());
        let mut w = writer();
        out.extend(w.start());
        out.extend(w.token(0, "Par", None));
        out.extend(w.error("the engine \"failed\""));
        out.concat()
    }

    /// A streamed snapshot writes the object's numbers as the whole object does (through a
    /// JSON value, an f32 temperature of 0.7 came out as 0.699999988079071).
    #[test]
    fn snapshots_write_numbers_as_the_whole_object() {
        let mut w = writer();
        w.object.temperature = 0.7;
        w.object.top_p = 0.9;
        let frames = w.start().concat();
        assert!(frames.contains("\"temperature\":0.7,"), "{frames}");
        assert!(frames.contains("\"top_p\":0.9,"), "{frames}");
        let whole = crate::protocol::response::to_json_string(&w.object);
        assert!(frames.contains(&whole), "{frames}");
    }

    /// The events are byte for byte what they were when they were written as untyped JSON
    /// (`testdata/responses.sse`, recorded then; `FERRUM_BLESS=1` records it anew).
    #[test]
    fn the_event_streams_are_unchanged() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/responses.sse");
        let got = streams();
        if std::env::var_os("FERRUM_BLESS").is_some() {
            std::fs::write(path, &got).unwrap();
        }
        let want = std::fs::read_to_string(path).unwrap();
        assert_eq!(got, want);
    }
}
