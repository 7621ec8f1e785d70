//! Streamed response bodies: OpenAI's server-sent events.
//!
//! A streamed response is a sequence of `data: {json}\n\n` frames ending with
//! `data: [DONE]\n\n`: first what the endpoint sends before any token (the chat role chunk),
//! then one chunk per token with new text, a chunk with each choice's `finish_reason`, the
//! usage chunk (`choices: []`) when `stream_options.include_usage` is set (every other chunk
//! then carries `"usage": null`), and `[DONE]`. An engine failure mid-stream becomes one
//! `data: {"error": ...}` frame before `[DONE]`.
//!
//! The body pulls events as the client reads: when the client disconnects, hyper drops the
//! body, which drops the [`Merged`] events and so aborts the engine requests.

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

struct Streamer<F> {
    merged: Merged,
    fmt: F,
    n: usize,
    include_usage: bool,
    usage: Usage,
    queue: VecDeque<String>,
    ended: bool,
}

impl<F: ChunkFormat> Streamer<F> {
    fn push(&mut self, mut chunk: CompletionObject<F::Choice>) {
        if self.include_usage {
            chunk.usage.get_or_insert(None);
        }
        self.queue
            .push_back(format!("data: {}\n\n", to_json_string(&chunk)));
    }

    fn end(&mut self) {
        if self.include_usage {
            let u = to_json_string(&self.fmt.usage(&self.usage));
            self.queue.push_back(format!("data: {u}\n\n"));
        }
        self.queue.push_back("data: [DONE]\n\n".to_string());
        self.ended = true;
    }

    async fn next_frame(&mut self) -> Option<String> {
        loop {
            if let Some(f) = self.queue.pop_front() {
                return Some(f);
            }
            if self.ended {
                return None;
            }
            match self.merged.next().await {
                None => self.end(),
                Some((p, ev)) => match ev {
                    Event::Token {
                        index,
                        token,
                        text,
                        logprob,
                        top_logprobs,
                    } => {
                        let lp = TokenLogprob::of(token, logprob, top_logprobs);
                        for c in self.fmt.token(p * self.n + index, &text, lp) {
                            self.push(c);
                        }
                    }
                    Event::Finished {
                        index,
                        reason,
                        text,
                    } => {
                        for c in self.fmt.finish(p * self.n + index, &text, &reason) {
                            self.push(c);
                        }
                    }
                    Event::Done { usage } => add_usage(&mut self.usage, &usage),
                    Event::Error(msg) => {
                        let e = to_json_string(&ServerError::Internal(msg).body());
                        self.queue.push_back(format!("data: {e}\n\n"));
                        self.queue.push_back("data: [DONE]\n\n".to_string());
                        self.ended = true;
                    }
                },
            }
        }
    }
}

/// A `text/event-stream` response that writes `merged`'s events in `fmt`'s chunks.
pub fn sse_response<F: ChunkFormat>(
    merged: Merged,
    mut fmt: F,
    n: usize,
    include_usage: bool,
) -> Response {
    let start = fmt.start();
    let mut s = Streamer {
        merged,
        fmt,
        n,
        include_usage,
        usage: Usage::default(),
        queue: VecDeque::new(),
        ended: false,
    };
    for c in start {
        s.push(c);
    }
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
