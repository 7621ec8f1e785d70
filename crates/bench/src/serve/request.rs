//! One streamed completion request, timed from the client's side.
//!
//! TTFT runs from just before the request is sent to the first chunk with non-empty text;
//! inter-token latencies are the gaps between successive chunks with text (a server that
//! packs several tokens into one chunk shows fewer, longer gaps); end-to-end runs to the end
//! of the stream. Output tokens come from the final `usage.completion_tokens` when the server
//! sends one (`stream_options.include_usage`), else the number of chunks with text.
//!
//! Every failure (connection, non-2xx status, a broken or malformed stream, an `error` chunk,
//! the timeout, a stream without text) becomes an error message, never a panic.

use super::sse::{SseEvent, SseParser};
use serde_json::Value;
use std::time::Instant;

/// Measurements of one completed request, in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub ttft_s: f64,
    pub itl_s: Vec<f64>,
    pub e2e_s: f64,
    pub output_tokens: usize,
    /// `usage.prompt_tokens` when the server sends it, else the client's own count.
    pub prompt_tokens: usize,
    /// Whether the token counts came from a usage chunk.
    pub usage: bool,
}

/// A request the server declined up front (HTTP 429 or 503).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Refusal {
    /// Seconds from sending to the refusal's status line.
    pub after_s: f64,
    /// When the server said to come back, in seconds: `retry-after-ms` (the precise header
    /// the OpenAI and Anthropic SDKs prefer), else `Retry-After` in seconds.
    pub retry_after_s: Option<f64>,
}

/// A failed request: what went wrong, and the refusal's details when it was one.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub message: String,
    pub refusal: Option<Refusal>,
}

/// The wait a refusal's headers ask for (see [`Refusal::retry_after_s`]).
fn retry_after(h: &reqwest::header::HeaderMap) -> Option<f64> {
    let num = |name: &str| {
        h.get(name)?
            .to_str()
            .ok()?
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x >= 0.0)
    };
    num("retry-after-ms")
        .map(|ms| ms / 1e3)
        .or_else(|| num("retry-after"))
}

/// What the request needs besides its body.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: String,
    pub api_key: Option<String>,
    pub timeout: std::time::Duration,
}

/// An error with its chain of causes ("error sending request: ...: Connection refused").
pub fn describe(e: &reqwest::Error, timeout: std::time::Duration) -> String {
    if e.is_timeout() {
        return format!("timed out after {}s", timeout.as_secs_f64());
    }
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        source = s.source();
    }
    msg
}

/// At most `n` characters of `s`, on one line.
pub fn clip(s: &str, n: usize) -> String {
    let one_line = s.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(n) {
        Some((at, _)) => format!("{}...", &one_line[..at]),
        None => one_line,
    }
}

/// The message of an OpenAI error object (`{"message": ...}`), or the value itself.
fn error_message(err: &Value) -> String {
    let msg = err.get("message").and_then(Value::as_str);
    clip(&msg.map_or_else(|| err.to_string(), str::to_owned), 300)
}

/// Sends `body` (which asks for `stream: true`) and reads the stream to its end.
pub async fn send(
    client: &reqwest::Client,
    target: &Target,
    body: &Value,
    prompt_tokens: usize,
) -> Result<Outcome, String> {
    send_detailed(client, target, body, prompt_tokens)
        .await
        .map_err(|f| f.message)
}

/// [`send`], with a refusal's timing and requested wait.
pub async fn send_detailed(
    client: &reqwest::Client,
    target: &Target,
    body: &Value,
    prompt_tokens: usize,
) -> Result<Outcome, Failure> {
    let fail = |message: String| Failure {
        message,
        refusal: None,
    };
    let mut req = client
        .post(&target.url)
        .timeout(target.timeout)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_string());
    if let Some(key) = &target.api_key {
        req = req.bearer_auth(key);
    }
    let start = Instant::now();
    let mut resp = req
        .send()
        .await
        .map_err(|e| fail(describe(&e, target.timeout)))?;
    let status = resp.status();
    if !status.is_success() {
        let refused = status == reqwest::StatusCode::TOO_MANY_REQUESTS
            || status == reqwest::StatusCode::SERVICE_UNAVAILABLE;
        let refusal = refused.then(|| Refusal {
            after_s: start.elapsed().as_secs_f64(),
            retry_after_s: retry_after(resp.headers()),
        });
        let text = resp.text().await.unwrap_or_default();
        let detail = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v.get("error").map(error_message))
            .unwrap_or_else(|| clip(&text, 300));
        return Err(Failure {
            message: format!("HTTP {status}: {detail}"),
            refusal,
        });
    }
    let mut stream = StreamState::default();
    let mut parser = SseParser::default();
    let mut events = Vec::new();
    loop {
        let piece = resp.chunk().await.map_err(|e| {
            fail(format!(
                "the stream broke after {} chunks: {}",
                stream.chunks,
                describe(&e, target.timeout)
            ))
        })?;
        match &piece {
            Some(bytes) => parser.push(bytes, &mut events),
            None => parser.finish(&mut events),
        }
        let now = start.elapsed().as_secs_f64();
        for ev in events.drain(..) {
            stream.take(ev, now).map_err(fail)?;
        }
        if piece.is_none() {
            break;
        }
    }
    let e2e_s = start.elapsed().as_secs_f64();
    stream.outcome(e2e_s, prompt_tokens).map_err(fail)
}

/// What the stream has said so far; times in seconds since the request was sent.
#[derive(Debug, Default)]
struct StreamState {
    first: Option<f64>,
    last: f64,
    itl_s: Vec<f64>,
    chunks: usize,
    usage_completion: Option<usize>,
    usage_prompt: Option<usize>,
    finished: bool,
    done: bool,
}

impl StreamState {
    fn take(&mut self, ev: SseEvent, now: f64) -> Result<(), String> {
        let data = match ev {
            SseEvent::Done => {
                self.done = true;
                return Ok(());
            }
            SseEvent::Data(d) => d,
        };
        let v: Value = serde_json::from_str(&data)
            .map_err(|e| format!("a stream chunk is not JSON ({e}): {}", clip(&data, 200)))?;
        if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
            return Err(format!("error in the stream: {}", error_message(err)));
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            let count = |k: &str| u.get(k).and_then(Value::as_u64).map(|n| n as usize);
            self.usage_completion = count("completion_tokens").or(self.usage_completion);
            self.usage_prompt = count("prompt_tokens").or(self.usage_prompt);
        }
        let Some(choice) = v
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|c| c.first())
        else {
            return Ok(());
        };
        let text = choice
            .get("text")
            .or_else(|| choice.get("delta").and_then(|d| d.get("content")))
            .and_then(Value::as_str)
            .unwrap_or("");
        if !text.is_empty() {
            match self.first {
                None => self.first = Some(now),
                Some(_) => self.itl_s.push(now - self.last),
            }
            self.last = now;
            self.chunks += 1;
        }
        if choice.get("finish_reason").is_some_and(|r| !r.is_null()) {
            self.finished = true;
        }
        Ok(())
    }

    fn outcome(self, e2e_s: f64, prompt_tokens: usize) -> Result<Outcome, String> {
        if !self.done && !self.finished {
            return Err(format!(
                "the stream ended after {} chunks with neither a finish_reason nor [DONE]",
                self.chunks
            ));
        }
        let Some(ttft_s) = self.first else {
            return Err("the stream held no text".into());
        };
        Ok(Outcome {
            ttft_s,
            itl_s: self.itl_s,
            e2e_s,
            output_tokens: self.usage_completion.unwrap_or(self.chunks),
            prompt_tokens: self.usage_prompt.unwrap_or(prompt_tokens),
            usage: self.usage_completion.is_some(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(frames: &[(&str, f64)]) -> Result<Outcome, String> {
        let mut s = StreamState::default();
        for (data, t) in frames {
            let ev = if *data == "[DONE]" {
                SseEvent::Done
            } else {
                SseEvent::Data(data.to_string())
            };
            s.take(ev, *t)?;
        }
        s.outcome(1.0, 5)
    }

    #[test]
    fn times_chunks_and_prefers_usage() {
        let o = run(&[
            (
                r#"{"choices":[{"text":"","finish_reason":null}],"usage":null}"#,
                0.1,
            ),
            (
                r#"{"choices":[{"text":"a","finish_reason":null}],"usage":null}"#,
                0.2,
            ),
            (r#"{"choices":[{"text":"bc","finish_reason":null}]}"#, 0.5),
            (r#"{"choices":[{"text":"","finish_reason":"length"}]}"#, 0.6),
            (
                r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3}}"#,
                0.7,
            ),
            ("[DONE]", 0.7),
        ]);
        let o = o.expect("a complete stream");
        assert_eq!((o.ttft_s, o.output_tokens, o.prompt_tokens), (0.2, 3, 9));
        assert_eq!(o.itl_s.len(), 1);
        assert!((o.itl_s[0] - 0.3).abs() < 1e-12);
    }

    #[test]
    fn counts_chunks_without_usage() {
        let o = run(&[
            (r#"{"choices":[{"delta":{"content":"x"}}]}"#, 0.1),
            (r#"{"choices":[{"delta":{"content":"y"}}]}"#, 0.2),
            ("[DONE]", 0.3),
        ]);
        let o = o.expect("a complete stream");
        assert_eq!((o.output_tokens, o.prompt_tokens), (2, 5));
    }

    #[test]
    fn bad_streams_are_errors() {
        let err = |frames: &[(&str, f64)]| run(frames).err().unwrap_or_default();
        assert!(err(&[("not json", 0.1)]).contains("not JSON"));
        assert!(err(&[(r#"{"error":{"message":"engine died"}}"#, 0.1)]).contains("engine died"));
        assert!(err(&[(r#"{"choices":[{"text":"a"}]}"#, 0.1)]).contains("neither"));
        assert!(err(&[("[DONE]", 0.1)]).contains("no text"));
    }

    #[test]
    fn the_wait_prefers_milliseconds() {
        use reqwest::header::{HeaderMap, HeaderValue};
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after(&h), Some(2.0));
        h.insert("retry-after-ms", HeaderValue::from_static("1250"));
        assert_eq!(retry_after(&h), Some(1.25));
        h.insert("retry-after-ms", HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h), Some(2.0));
        h.insert(
            "retry-after",
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn clip_keeps_one_short_line() {
        assert_eq!(clip("a\n  b", 10), "a b");
        assert_eq!(clip("abcdef", 3), "abc...");
    }
}
