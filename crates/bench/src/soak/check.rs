//! What a well-formed OpenAI response is, checked strictly: the soak calls a response broken
//! when any of these fails.
//!
//! Non-streamed: `object`, a non-empty `id`, exactly `n` choices with indices `0..n`, each with
//! its text (`message.content` or `text`) and a `finish_reason` of `stop` or `length`, and a
//! `usage` whose counts add up. Streamed: every `data:` payload is a JSON chunk of the right
//! `object` whose choice indices are below `n`; each index gets exactly one finish reason; the
//! usage chunk (asked for with `stream_options.include_usage`) comes with no choices; the
//! stream ends with `data: [DONE]` and nothing after it.

use crate::serve::sse::SseEvent;
use serde_json::Value;

/// Which endpoint a response came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
        }
    }
}

/// A choice's `index`, which must be below `n`.
fn choice_index(c: &Value, n: usize) -> Result<usize, String> {
    c["index"]
        .as_u64()
        .map(|i| i as usize)
        .filter(|&i| i < n)
        .ok_or_else(|| format!("bad choice index {}", c["index"]))
}

fn finish_ok(v: &Value) -> bool {
    matches!(v.as_str(), Some("stop" | "length"))
}

fn usage_ok(u: &Value, n: usize) -> Result<u64, String> {
    let get = |k: &str| u.get(k).and_then(Value::as_u64);
    let (Some(p), Some(c), Some(t)) = (
        get("prompt_tokens"),
        get("completion_tokens"),
        get("total_tokens"),
    ) else {
        return Err(format!("usage lacks token counts: {u}"));
    };
    if p == 0 || c < n as u64 || t != p + c {
        return Err(format!("usage does not add up for n={n}: {u}"));
    }
    Ok(c)
}

/// Checks a complete JSON response; returns its completion tokens.
pub fn response(ep: Endpoint, n: usize, body: &str) -> Result<u64, String> {
    let v: Value = serde_json::from_str(body).map_err(|e| format!("body is not JSON: {e}"))?;
    let object = match ep {
        Endpoint::Chat => "chat.completion",
        Endpoint::Completions => "text_completion",
    };
    if v["object"] != object {
        return Err(format!("object is {}, not {object}", v["object"]));
    }
    if v["id"].as_str().is_none_or(str::is_empty) {
        return Err("no id".into());
    }
    let choices = v["choices"]
        .as_array()
        .ok_or_else(|| "no choices array".to_string())?;
    if choices.len() != n {
        return Err(format!("{} choices for n={n}", choices.len()));
    }
    let mut seen = vec![false; n];
    for c in choices {
        let i = choice_index(c, n)?;
        if std::mem::replace(&mut seen[i], true) {
            return Err(format!("choice index {i} twice"));
        }
        let text = match ep {
            Endpoint::Chat => &c["message"]["content"],
            Endpoint::Completions => &c["text"],
        };
        if !text.is_string() {
            return Err(format!("choice {i} has no text"));
        }
        if !finish_ok(&c["finish_reason"]) {
            return Err(format!("choice {i} finish_reason {}", c["finish_reason"]));
        }
    }
    usage_ok(&v["usage"], n)
}

/// Checks a whole event stream; returns its completion tokens.
pub fn stream(ep: Endpoint, n: usize, events: &[SseEvent]) -> Result<u64, String> {
    let object = match ep {
        Endpoint::Chat => "chat.completion.chunk",
        Endpoint::Completions => "text_completion",
    };
    let Some((last, rest)) = events.split_last() else {
        return Err("empty stream".into());
    };
    if *last != SseEvent::Done {
        return Err("the stream does not end with data: [DONE]".into());
    }
    let mut finished = vec![0u32; n];
    let mut tokens = None;
    for e in rest {
        let SseEvent::Data(d) = e else {
            return Err("data: [DONE] before the end of the stream".into());
        };
        let v: Value =
            serde_json::from_str(d).map_err(|err| format!("a chunk is not JSON ({err}): {d}"))?;
        if v.get("error").is_some() {
            return Err(format!("error chunk: {d}"));
        }
        if v["object"] != object {
            return Err(format!("chunk object is {}, not {object}", v["object"]));
        }
        let choices = v["choices"]
            .as_array()
            .ok_or_else(|| format!("chunk without choices: {d}"))?;
        if !v["usage"].is_null() {
            if !choices.is_empty() {
                return Err("the usage chunk carries choices".into());
            }
            tokens = Some(usage_ok(&v["usage"], n)?);
            continue;
        }
        for c in choices {
            let i = choice_index(c, n)?;
            if !c["finish_reason"].is_null() {
                if !finish_ok(&c["finish_reason"]) {
                    return Err(format!("choice {i} finish_reason {}", c["finish_reason"]));
                }
                finished[i] += 1;
            }
        }
    }
    if let Some(i) = finished.iter().position(|&f| f != 1) {
        return Err(format!(
            "choice {i} got {} finish reasons, not one",
            finished[i]
        ));
    }
    tokens.ok_or_else(|| "no usage chunk".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(v: Value) -> SseEvent {
        SseEvent::Data(v.to_string())
    }

    fn usage() -> Value {
        serde_json::json!({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7})
    }

    #[test]
    fn responses() {
        let good = serde_json::json!({"object": "text_completion", "id": "x", "usage": usage(),
            "choices": [{"index": 1, "text": "a", "finish_reason": "length"},
                        {"index": 0, "text": "", "finish_reason": "stop"}]});
        assert_eq!(response(Endpoint::Completions, 2, &good.to_string()), Ok(4));
        assert!(response(Endpoint::Completions, 3, &good.to_string()).is_err());
        assert!(response(Endpoint::Chat, 2, &good.to_string()).is_err());
        assert!(response(Endpoint::Completions, 2, "{\"object\": ").is_err());
        let mut twice = good.clone();
        twice["choices"][1]["index"] = 1.into();
        assert!(response(Endpoint::Completions, 2, &twice.to_string()).is_err());
        let mut bad_usage = good.clone();
        bad_usage["usage"]["total_tokens"] = 8.into();
        assert!(response(Endpoint::Completions, 2, &bad_usage.to_string()).is_err());
        let mut no_reason = good;
        no_reason["choices"][0]["finish_reason"] = Value::Null;
        assert!(response(Endpoint::Completions, 2, &no_reason.to_string()).is_err());
    }

    #[test]
    fn streams() {
        let chunk = |i: u64, fin: Value| {
            data(serde_json::json!({"object": "chat.completion.chunk",
                "choices": [{"index": i, "delta": {"content": "a"}, "finish_reason": fin}]}))
        };
        let end = data(
            serde_json::json!({"object": "chat.completion.chunk", "choices": [],
            "usage": usage()}),
        );
        let good = vec![
            chunk(0, Value::Null),
            chunk(1, "stop".into()),
            chunk(0, "length".into()),
            end.clone(),
            SseEvent::Done,
        ];
        assert_eq!(stream(Endpoint::Chat, 2, &good), Ok(4));
        assert!(
            stream(Endpoint::Chat, 1, &good).is_err(),
            "index 1 with n=1"
        );
        let missing_done = &good[..4];
        assert!(stream(Endpoint::Chat, 2, missing_done).is_err());
        let mut twice = good.clone();
        twice.insert(2, chunk(1, "stop".into()));
        assert!(stream(Endpoint::Chat, 2, &twice).is_err());
        let mut unfinished = good.clone();
        unfinished.remove(2);
        assert!(stream(Endpoint::Chat, 2, &unfinished).is_err());
        let mut garbage = good.clone();
        garbage.insert(0, SseEvent::Data("{not json".into()));
        assert!(stream(Endpoint::Chat, 2, &garbage).is_err());
        let mut early_done = good;
        early_done.insert(1, SseEvent::Done);
        assert!(stream(Endpoint::Chat, 2, &early_done).is_err());
    }
}
