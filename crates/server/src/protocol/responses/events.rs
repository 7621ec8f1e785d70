//! The events of a streamed response, as serde types.
//!
//! Every event is its body's fields, then `type` and `sequence_number` ([`Event`]). Fields are
//! in the order the stream has always sent them (an item being opened lists `type`, `id`,
//! `status`, `role`, ...; a finished item is an [`OutputItem`], as in the whole object), which
//! the writer's recorded streams check byte for byte (`testdata/responses.sse`).

use super::object::{OutputItem, OutputText, ResponseObject};
use serde::Serialize;

/// One event: the body's fields, then its kind and its place in the stream.
#[derive(Debug, Serialize)]
pub struct Event<B> {
    #[serde(flatten)]
    pub body: B,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub sequence_number: u64,
}

/// `response.created`, `.in_progress`, `.completed`, `.incomplete`, `.failed`: the whole object
/// as it stands.
#[derive(Debug, Serialize)]
pub struct Snapshot<'a> {
    pub response: &'a ResponseObject,
}

/// `response.output_item.added` and `.done`.
#[derive(Debug, Serialize)]
pub struct ItemEvent<'a> {
    pub output_index: usize,
    pub item: Item<'a>,
}

/// An item as an item event carries it: opened (in progress, nothing in it yet) or done.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Item<'a> {
    Message(OpenMessage<'a>),
    Call(OpenCall<'a>),
    Done(&'a OutputItem),
}

/// A message item when it opens.
#[derive(Debug, Serialize)]
pub struct OpenMessage<'a> {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub id: &'a str,
    pub status: &'static str,
    pub role: &'static str,
    pub content: [OutputText; 0],
}

impl<'a> OpenMessage<'a> {
    pub fn new(id: &'a str) -> Self {
        OpenMessage {
            kind: "message",
            id,
            status: "in_progress",
            role: "assistant",
            content: [],
        }
    }
}

/// A function call item when it opens (its arguments stream after it).
#[derive(Debug, Serialize)]
pub struct OpenCall<'a> {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub id: &'a str,
    pub call_id: &'a str,
    pub name: &'a str,
    pub arguments: &'static str,
    pub status: &'static str,
}

impl<'a> OpenCall<'a> {
    pub fn new(id: &'a str, call_id: &'a str, name: &'a str) -> Self {
        OpenCall {
            kind: "function_call",
            id,
            call_id,
            name,
            arguments: "",
            status: "in_progress",
        }
    }
}

/// `response.content_part.added` and `.done`.
#[derive(Debug, Serialize)]
pub struct PartEvent<'a> {
    pub item_id: &'a str,
    pub output_index: usize,
    pub content_index: usize,
    pub part: OutputText,
}

/// `response.output_text.delta`.
#[derive(Debug, Serialize)]
pub struct TextDelta<'a> {
    pub item_id: &'a str,
    pub output_index: usize,
    pub content_index: usize,
    pub delta: &'a str,
    pub logprobs: [(); 0],
}

/// `response.output_text.done`.
#[derive(Debug, Serialize)]
pub struct TextDone<'a> {
    pub item_id: &'a str,
    pub output_index: usize,
    pub content_index: usize,
    pub text: &'a str,
    pub logprobs: [(); 0],
}

/// `response.function_call_arguments.delta`.
#[derive(Debug, Serialize)]
pub struct ArgumentsDelta<'a> {
    pub item_id: &'a str,
    pub output_index: usize,
    pub delta: &'a str,
}

/// `response.function_call_arguments.done`.
#[derive(Debug, Serialize)]
pub struct ArgumentsDone<'a> {
    pub item_id: &'a str,
    pub output_index: usize,
    pub name: &'a str,
    pub arguments: &'a str,
}
