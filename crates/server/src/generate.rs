//! Submitting a request's prompts to the engine and reading their events as one stream.
//!
//! Each prompt is one engine request; a small task per request forwards its events, tagged
//! with the prompt's index, into one channel. Dropping [`Merged`] (the client went away, the
//! response body was dropped) closes that channel; every forwarder notices at once, drops its
//! engine stream, and the engine aborts the request and frees its blocks. Submission is all or
//! nothing: if one prompt is refused, the ones already submitted are aborted.

use crate::error::{Result, ServerError};
use crate::protocol::response::CompletionObject;
use ferrum_engine::{EngineHandle, Event, GenerateRequest, Usage};
use ferrum_types::{FinishReason, TokenId};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// The events of all prompts of one HTTP request.
#[derive(Debug)]
pub struct Merged {
    rx: UnboundedReceiver<(usize, Event)>,
}

impl Merged {
    /// Submits every request (all or none) and starts forwarding their events.
    pub fn submit(engine: &EngineHandle, requests: Vec<GenerateRequest>) -> Result<Merged> {
        let mut streams = Vec::with_capacity(requests.len());
        for r in requests {
            // On error the streams already started are dropped, which aborts them.
            streams.push(engine.generate(r).map_err(ServerError::from)?);
        }
        let (tx, rx) = unbounded_channel();
        for (prompt, mut stream) in streams.into_iter().enumerate() {
            let tx = tx.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = tx.closed() => break,
                        ev = stream.next() => match ev {
                            Some(ev) => {
                                if tx.send((prompt, ev)).is_err() {
                                    break;
                                }
                            }
                            None => break,
                        },
                    }
                }
            });
        }
        Ok(Merged { rx })
    }

    /// The next event of any prompt, with the prompt's index; `None` once all have ended.
    pub async fn next(&mut self) -> Option<(usize, Event)> {
        self.rx.recv().await
    }
}

/// One generated token with its logprobs (when asked for).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: TokenId,
    pub logprob: f32,
    pub top: Vec<(TokenId, f32)>,
}

impl TokenLogprob {
    /// The logprobs of a token event, when the request asked for them.
    pub fn of(token: TokenId, logprob: Option<f32>, top: Vec<(TokenId, f32)>) -> Option<Self> {
        logprob.map(|logprob| TokenLogprob {
            token,
            logprob,
            top,
        })
    }
}

/// A finished sample, as a non-streaming response reports it.
#[derive(Debug, Clone, Default)]
pub struct Choice {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    pub finish: Option<FinishReason>,
}

/// Reads every event into `num_prompts * n` choices (choice `p * n + i` is sample `i` of
/// prompt `p`) and the summed usage.
pub async fn collect(
    mut merged: Merged,
    num_prompts: usize,
    n: usize,
) -> Result<(Vec<Choice>, Usage)> {
    let mut choices = vec![Choice::default(); num_prompts * n];
    let mut usage = Usage::default();
    while let Some((p, ev)) = merged.next().await {
        match ev {
            Event::Token {
                index,
                token,
                text,
                logprob,
                top_logprobs,
            } => {
                let Some(c) = choices.get_mut(p * n + index) else {
                    continue;
                };
                c.text.push_str(&text);
                c.logprobs
                    .extend(TokenLogprob::of(token, logprob, top_logprobs));
            }
            Event::Finished {
                index,
                reason,
                text,
            } => {
                if let Some(c) = choices.get_mut(p * n + index) {
                    c.text.push_str(&text);
                    c.finish = Some(reason);
                }
            }
            Event::Done { usage: u } => add_usage(&mut usage, &u),
            Event::Error(msg) => return Err(ServerError::Internal(msg)),
        }
    }
    Ok((choices, usage))
}

pub fn add_usage(total: &mut Usage, u: &Usage) {
    total.prompt_tokens += u.prompt_tokens;
    total.completion_tokens += u.completion_tokens;
    total.cached_tokens += u.cached_tokens;
}

/// What every response object and stream chunk of one request carries around its choices.
#[derive(Debug, Clone)]
pub struct Envelope {
    pub id: String,
    /// `chat.completion`, `chat.completion.chunk` or `text_completion`.
    pub object: &'static str,
    pub created: u64,
    pub model: String,
}

impl Envelope {
    /// The object around `choices`, with `usage` when given.
    pub fn wrap<C>(&self, choices: Vec<C>, usage: Option<&Usage>) -> CompletionObject<C> {
        CompletionObject {
            choices,
            created: self.created,
            id: self.id.clone(),
            model: self.model.clone(),
            object: self.object,
            usage: usage.map(|u| Some(u.into())),
        }
    }
}

/// A logprob as JSON clients can parse: never NaN or infinite.
pub fn finite(lp: f32) -> f64 {
    if lp.is_finite() {
        lp as f64
    } else {
        -9999.0
    }
}
