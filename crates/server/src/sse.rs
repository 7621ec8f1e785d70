//! Streamed response bodies: server-sent events.
//!
//! One loop ([`event_stream`]) reads a request's engine events and hands them to a
//! [`FrameWriter`], which turns them into the frames of its API; the response body pulls
//! frames as the client reads. When the client disconnects, hyper drops the body, which drops
//! the [`Merged`] events and so aborts the engine requests.
//!
//! OpenAI's chat and completions streams ([`sse_response`], over a [`ChunkFormat`]) are
//! `data: {json}\n\n` frames ending with `data: [DONE]\n\n`: first what the endpoint sends
//! before any token (the chat role chunk), then one chunk per token with new text, a chunk
//! with each choice's `finish_reason`, the usage chunk (`choices: []`) when
//! `stream_options.include_usage` is set (every other chunk then carries `"usage": null`), and
//! `[DONE]`. An engine failure mid-stream becomes one `data: {"error": ...}` frame before
//! `[DONE]`. The Responses and Anthropic streams are typed events (`event: <type>` lines) with
//! writers of their own.

use crate::error::ServerError;
use crate::generate::{add_usage, Envelope, Merged, TokenLogprob};
use crate::protocol::response::{to_json_string, CompletionObject};
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::Response;
use ferrum_engine::{Event, Usage};
use ferrum_types::FinishReason;
use serde::Serialize;
use std::collections::VecDeque;
use std::convert::Infallible;

/// How one endpoint writes its stream's chunks (chat and completions differ).
pub trait ChunkFormat: Send + 'static {
    /// A choice of this endpoint's chunks.
    type Choice: Serialize;
    /// Chunks before any token.
    fn start(&mut self) -> Vec<CompletionObject<Self::Choice>>;
    /// The chunks for one token of `choice` (none when it has nothing to say).
    fn token(
        &mut self,
        choice: usize,
        text: &str,
        logprob: Option<TokenLogprob>,
    ) -> Vec<CompletionObject<Self::Choice>>;
    /// The chunks that end `choice`: held-back text, then the finish reason.
    fn finish(
        &mut self,
        choice: usize,
        text: &str,
        reason: &FinishReason,
    ) -> Vec<CompletionObject<Self::Choice>>;
    /// The id, object, creation time and model of every chunk.
    fn envelope(&self) -> &Envelope;
    /// The usage chunk (`choices: []`).
    fn usage(&self, usage: &Usage) -> CompletionObject<Self::Choice> {
        self.envelope().wrap(Vec::new(), Some(usage))
    }
}

/// How one API writes a stream: each engine event becomes zero or more whole SSE frames.
pub trait FrameWriter: Send + 'static {
    /// Frames before any token.
    fn start(&mut self) -> Vec<String>;
    /// Frames for one token of `choice`.
    fn token(&mut self, choice: usize, text: &str, logprob: Option<TokenLogprob>) -> Vec<String>;
    /// Frames that end `choice`: held-back text, then its finish.
    fn finish(&mut self, choice: usize, text: &str, reason: &FinishReason) -> Vec<String>;
    /// A prompt's usage (one per prompt, after its samples finished).
    fn usage(&mut self, usage: &Usage);
    /// The last frames, once every prompt has ended.
    fn end(&mut self) -> Vec<String>;
    /// The frames for an engine failure; the stream ends after them.
    fn error(&mut self, msg: &str) -> Vec<String>;
    /// A frame sent after this long without one (a keep-alive), when the API has one.
    fn keepalive(&self) -> Option<(std::time::Duration, String)> {
        None
    }
}

/// One `event: <name>` frame with its JSON data.
pub fn event_frame<T: Serialize>(event: &str, data: &T) -> String {
    format!("event: {event}\ndata: {}\n\n", to_json_string(data))
}

struct Streamer<W> {
    merged: Merged,
    /// Samples per prompt: choice `i` of prompt `p` is `p * n + i`.
    n: usize,
    writer: W,
    queue: VecDeque<String>,
    ended: bool,
}

impl<W: FrameWriter> Streamer<W> {
    async fn next_event(&mut self) -> Option<Option<(usize, Event)>> {
        match self.writer.keepalive() {
            None => Some(self.merged.next().await),
            Some((wait, frame)) => match tokio::time::timeout(wait, self.merged.next()).await {
                Ok(ev) => Some(ev),
                Err(_) => {
                    self.queue.push_back(frame);
                    None
                }
            },
        }
    }

    async fn next_frame(&mut self) -> Option<String> {
        loop {
            if let Some(f) = self.queue.pop_front() {
                return Some(f);
            }
            if self.ended {
                return None;
            }
            let Some(ev) = self.next_event().await else {
                continue;
            };
            let frames = match ev {
                None => {
                    self.ended = true;
                    self.writer.end()
                }
                Some((
                    p,
                    Event::Token {
                        index,
                        token,
                        text,
                        logprob,
                        top_logprobs,
                    },
                )) => {
                    let lp = TokenLogprob::of(token, logprob, top_logprobs);
                    self.writer.token(p * self.n + index, &text, lp)
                }
                Some((
                    p,
                    Event::Finished {
                        index,
                        reason,
                        text,
                    },
                )) => self.writer.finish(p * self.n + index, &text, &reason),
                Some((_, Event::Done { usage })) => {
                    self.writer.usage(&usage);
                    Vec::new()
                }
                Some((_, Event::Error(msg))) => {
                    self.ended = true;
                    self.writer.error(&msg)
                }
            };
            self.queue.extend(frames);
        }
    }
}

/// A `text/event-stream` response of `writer`'s frames for `merged`'s events, `n` samples
/// per prompt (choice `i` of prompt `p` reaches the writer as `p * n + i`).
pub fn event_stream<W: FrameWriter>(merged: Merged, n: usize, mut writer: W) -> Response {
    let start = writer.start();
    let s = Streamer {
        merged,
        n,
        writer,
        queue: start.into(),
        ended: false,
    };
    let stream = futures_util::stream::unfold(s, |mut s| async move {
        s.next_frame()
            .await
            .map(|f| (Ok::<Bytes, Infallible>(Bytes::from(f)), s))
    });
    let mut r = Response::new(Body::from_stream(stream));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

/// OpenAI's chunk stream as a [`FrameWriter`].
struct OpenAiFrames<F> {
    fmt: F,
    include_usage: bool,
    usage: Usage,
}

impl<F: ChunkFormat> OpenAiFrames<F> {
    fn frame(&self, mut chunk: CompletionObject<F::Choice>) -> String {
        if self.include_usage {
            chunk.usage.get_or_insert(None);
        }
        format!("data: {}\n\n", to_json_string(&chunk))
    }

    fn frames(&self, chunks: Vec<CompletionObject<F::Choice>>) -> Vec<String> {
        chunks.into_iter().map(|c| self.frame(c)).collect()
    }
}

impl<F: ChunkFormat> FrameWriter for OpenAiFrames<F> {
    fn start(&mut self) -> Vec<String> {
        let chunks = self.fmt.start();
        self.frames(chunks)
    }

    fn token(&mut self, choice: usize, text: &str, lp: Option<TokenLogprob>) -> Vec<String> {
        let chunks = self.fmt.token(choice, text, lp);
        self.frames(chunks)
    }

    fn finish(&mut self, choice: usize, text: &str, reason: &FinishReason) -> Vec<String> {
        let chunks = self.fmt.finish(choice, text, reason);
        self.frames(chunks)
    }

    fn usage(&mut self, usage: &Usage) {
        add_usage(&mut self.usage, usage);
    }

    fn end(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        if self.include_usage {
            let u = to_json_string(&self.fmt.usage(&self.usage));
            out.push(format!("data: {u}\n\n"));
        }
        out.push("data: [DONE]\n\n".to_string());
        out
    }

    fn error(&mut self, msg: &str) -> Vec<String> {
        let e = to_json_string(&ServerError::Internal(msg.to_string()).body());
        vec![format!("data: {e}\n\n"), "data: [DONE]\n\n".to_string()]
    }
}

/// A `text/event-stream` response that writes `merged`'s events in `fmt`'s chunks.
pub fn sse_response<F: ChunkFormat>(
    merged: Merged,
    fmt: F,
    n: usize,
    include_usage: bool,
) -> Response {
    event_stream(
        merged,
        n,
        OpenAiFrames {
            fmt,
            include_usage,
            usage: Usage::default(),
        },
    )
}
