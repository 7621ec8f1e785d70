//! OpenAI request bodies read into typed requests: `/v1/chat/completions` into
//! [`ChatRequest`], `/v1/completions` into [`CompletionRequest`].
//!
//! Unknown fields are ignored as OpenAI does. Known features Ferrum lacks (tools, structured
//! output, audio, ...) are refused with a 400 naming the parameter instead of being dropped,
//! so a client never gets an answer to a question it did not ask.

use crate::error::{Result, ServerError};
use crate::fields::{kind, token_id, Fields};
use ferrum_tokenizer::ChatMessage;
use ferrum_types::{SamplingParams, TokenId, MAX_LOGPROBS};
use serde_json::Value;

/// Most samples one request may ask for (OpenAI's limit).
pub const MAX_N: usize = 128;

/// Most stop strings per request, and the longest one in bytes.
pub const MAX_STOP_STRINGS: usize = 16;
pub const MAX_STOP_BYTES: usize = 1024;

/// Most `logit_bias` entries and `stop_token_ids` per request.
pub const MAX_LOGIT_BIAS: usize = 1024;
pub const MAX_STOP_TOKEN_IDS: usize = 256;

/// OpenAI's default `max_tokens` for the legacy completions endpoint.
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

/// What both endpoints share.
#[derive(Debug, Clone)]
pub struct Options {
    pub model: Option<String>,
    pub params: SamplingParams,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the token counts.
    pub include_usage: bool,
}

#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub opts: Options,
    pub messages: Vec<ChatMessage>,
    pub add_generation_prompt: bool,
    /// `logprobs: true`: the sampled token's logprob per token, with `top_logprobs` more.
    pub logprobs: bool,
}

/// One prompt of a completions request.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Ids(Vec<TokenId>),
}

#[derive(Debug, Clone)]
pub struct CompletionRequest {
    pub opts: Options,
    pub prompts: Vec<Prompt>,
    /// Put the prompt's text before each completion.
    pub echo: bool,
    /// `logprobs: k`: the sampled token's logprob and the `k` most likely tokens.
    pub logprobs: Option<usize>,
}

/// Features of the OpenAI API that Ferrum does not have: refused unless absent or harmless.
fn refuse_unsupported(f: &Fields, keys: &[(&str, &str)]) -> Result<()> {
    for &(key, what) in keys {
        let Some(v) = f.get(key) else { continue };
        let harmless = match key {
            "tools" | "functions" => v.as_array().is_some_and(Vec::is_empty),
            "tool_choice" => v.as_str() == Some("none"),
            "response_format" => {
                v.get("type").and_then(Value::as_str) == Some("text")
                    && v.as_object().is_some_and(|o| o.len() == 1)
            }
            "modalities" => v
                .as_array()
                .is_some_and(|a| a.iter().all(|m| m.as_str() == Some("text"))),
            "suffix" => v.as_str() == Some(""),
            _ => false,
        };
        if !harmless {
            return Err(ServerError::unsupported(key, what));
        }
    }
    Ok(())
}

const UNSUPPORTED_CHAT: &[(&str, &str)] = &[
    ("tools", "tool calling"),
    ("tool_choice", "tool calling"),
    ("functions", "function calling"),
    ("function_call", "function calling"),
    (
        "response_format",
        "structured output (JSON mode, JSON schema)",
    ),
    ("audio", "audio output"),
    ("modalities", "output modalities other than text"),
    ("prediction", "predicted outputs"),
    ("web_search_options", "web search"),
    ("reasoning_effort", "reasoning effort"),
    ("guided_json", "guided decoding"),
    ("guided_regex", "guided decoding"),
    ("guided_choice", "guided decoding"),
    ("guided_grammar", "guided decoding"),
    ("structured_outputs", "structured output"),
];

const UNSUPPORTED_COMPLETIONS: &[(&str, &str)] = &[
    ("suffix", "a suffix (fill in the middle)"),
    (
        "response_format",
        "structured output (JSON mode, JSON schema)",
    ),
    ("guided_json", "guided decoding"),
    ("guided_regex", "guided decoding"),
    ("guided_choice", "guided decoding"),
    ("guided_grammar", "guided decoding"),
    ("structured_outputs", "structured output"),
];

/// The sampling fields both endpoints accept.
fn options(f: &Fields, max_tokens: Option<usize>) -> Result<Options> {
    let n = f.usize("n")?.unwrap_or(1);
    if !(1..=MAX_N).contains(&n) {
        return Err(ServerError::param(
            "n",
            format!("'n' must be between 1 and {MAX_N}, got {n}"),
        ));
    }
    let top_k = match f.i64("top_k")? {
        None | Some(-1) | Some(0) => None,
        Some(k) if k < 0 => {
            return Err(ServerError::param(
                "top_k",
                format!("'top_k' must be positive (or -1 to disable), got {k}"),
            ))
        }
        Some(k) => Some(usize::try_from(k).unwrap_or(usize::MAX)),
    };
    let mut logit_bias = Vec::new();
    if let Some(map) = f.object("logit_bias")? {
        if map.len() > MAX_LOGIT_BIAS {
            return Err(ServerError::param(
                "logit_bias",
                format!(
                    "'logit_bias' has {} entries; at most {MAX_LOGIT_BIAS} are allowed",
                    map.len()
                ),
            ));
        }
        for (k, v) in map {
            let id: TokenId = k.trim().parse().map_err(|_| {
                ServerError::param(
                    "logit_bias",
                    format!("'logit_bias' keys must be token ids, got {k:?}"),
                )
            })?;
            let b = v.as_f64().ok_or_else(|| {
                ServerError::param(
                    "logit_bias",
                    format!("'logit_bias' values must be numbers, got {}", kind(v)),
                )
            })?;
            logit_bias.push((id, b as f32));
        }
    }
    let seed = match f.get("seed") {
        None => None,
        Some(v) => Some(
            v.as_i64()
                .map(|s| s as u64)
                .or_else(|| v.as_u64())
                .ok_or_else(|| {
                    ServerError::param(
                        "seed",
                        format!("'seed' must be an integer, got {}", kind(v)),
                    )
                })?,
        ),
    };
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.object("stream_options")? {
        None => false,
        Some(_) if !stream => {
            return Err(ServerError::param(
                "stream_options",
                "'stream_options' is only allowed when 'stream' is true",
            ))
        }
        Some(o) => Fields::from_map(o.clone())
            .bool("include_usage")
            .map_err(|_| {
                ServerError::param(
                    "stream_options.include_usage",
                    "'stream_options.include_usage' must be a boolean",
                )
            })?
            .unwrap_or(false),
    };
    if let Some(v) = f.get("user") {
        if !v.is_string() {
            return Err(ServerError::param(
                "user",
                format!("'user' must be a string, got {}", kind(v)),
            ));
        }
    }
    let stop = f.strings("stop")?;
    if stop.len() > MAX_STOP_STRINGS {
        return Err(ServerError::param(
            "stop",
            format!(
                "'stop' has {} strings; at most {MAX_STOP_STRINGS} are allowed",
                stop.len()
            ),
        ));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ServerError::param("stop", "stop strings must not be empty"));
    }
    if let Some(long) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ServerError::param(
            "stop",
            format!(
                "a stop string of {} bytes is longer than the limit of {MAX_STOP_BYTES}",
                long.len()
            ),
        ));
    }
    let stop_token_ids = f.token_ids("stop_token_ids")?.unwrap_or_default();
    if stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(ServerError::param(
            "stop_token_ids",
            format!("at most {MAX_STOP_TOKEN_IDS} stop token ids are allowed"),
        ));
    }
    let d = SamplingParams::default();
    let params = SamplingParams {
        n,
        max_tokens,
        temperature: f.f32("temperature")?.unwrap_or(d.temperature),
        top_p: f.f32("top_p")?.unwrap_or(d.top_p),
        top_k,
        min_p: f.f32("min_p")?.unwrap_or(d.min_p),
        repetition_penalty: f.f32("repetition_penalty")?.unwrap_or(d.repetition_penalty),
        presence_penalty: f.f32("presence_penalty")?.unwrap_or(d.presence_penalty),
        frequency_penalty: f.f32("frequency_penalty")?.unwrap_or(d.frequency_penalty),
        logit_bias,
        seed,
        stop,
        stop_token_ids,
        ignore_eos: f.bool("ignore_eos")?.unwrap_or(false),
        logprobs: None,
        skip_special_tokens: f.bool("skip_special_tokens")?.unwrap_or(true),
    };
    Ok(Options {
        model: f.str("model")?.map(str::to_string),
        params,
        stream,
        include_usage,
    })
}

/// `max_tokens` of 0 is refused here so the message names the field the client used.
fn max_tokens(f: &Fields, key: &str) -> Result<Option<usize>> {
    match f.usize(key)? {
        Some(0) => Err(ServerError::param(
            key,
            format!("'{key}' must be at least 1"),
        )),
        v => Ok(v),
    }
}

impl ChatRequest {
    pub fn parse(f: &Fields) -> Result<ChatRequest> {
        refuse_unsupported(f, UNSUPPORTED_CHAT)?;
        let max = match max_tokens(f, "max_completion_tokens")? {
            Some(m) => Some(m),
            None => max_tokens(f, "max_tokens")?,
        };
        let mut opts = options(f, max)?;
        let logprobs = f.bool("logprobs")?.unwrap_or(false);
        let top = f.usize("top_logprobs")?;
        if let Some(k) = top {
            if k > MAX_LOGPROBS {
                return Err(ServerError::param(
                    "top_logprobs",
                    format!("'top_logprobs' must be between 0 and {MAX_LOGPROBS}, got {k}"),
                ));
            }
            if !logprobs {
                return Err(ServerError::param(
                    "top_logprobs",
                    "'top_logprobs' needs 'logprobs' set to true",
                ));
            }
        }
        if logprobs {
            opts.params.logprobs = Some(top.unwrap_or(0));
        }
        let messages = parse_messages(f)?;
        Ok(ChatRequest {
            opts,
            messages,
            add_generation_prompt: f.bool("add_generation_prompt")?.unwrap_or(true),
            logprobs,
        })
    }
}

fn parse_messages(f: &Fields) -> Result<Vec<ChatMessage>> {
    let Some(items) = f.get("messages") else {
        return Err(ServerError::param("messages", "'messages' is required"));
    };
    let items = items.as_array().ok_or_else(|| {
        ServerError::param(
            "messages",
            format!("'messages' must be an array, got {}", kind(items)),
        )
    })?;
    if items.is_empty() {
        return Err(ServerError::param(
            "messages",
            "'messages' must not be empty",
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, m)| parse_message(i, m))
        .collect()
}

fn parse_message(i: usize, m: &Value) -> Result<ChatMessage> {
    let at = |field: &str| format!("messages[{i}].{field}");
    let obj = m.as_object().ok_or_else(|| {
        ServerError::param(
            format!("messages[{i}]"),
            format!("'messages[{i}]' must be an object, got {}", kind(m)),
        )
    })?;
    let role = match obj.get("role").and_then(Value::as_str) {
        Some(r @ ("system" | "user" | "assistant")) => r,
        // OpenAI's newer name for the system role; templates only know "system".
        Some("developer") => "system",
        Some(r @ ("tool" | "function")) => {
            return Err(ServerError::unsupported(
                &at("role"),
                &format!("the '{r}' role (tool calling)"),
            ))
        }
        Some(r) => {
            return Err(ServerError::param(
                at("role"),
                format!(
                    "'{}' must be system, developer, user or assistant, got {r:?}",
                    at("role")
                ),
            ))
        }
        None => {
            return Err(ServerError::param(
                at("role"),
                format!("'{}' is required and must be a string", at("role")),
            ))
        }
    };
    if obj.get("tool_calls").is_some_and(|v| !v.is_null()) {
        return Err(ServerError::unsupported(&at("tool_calls"), "tool calling"));
    }
    let content = match obj.get("content") {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) if role == "assistant" => String::new(),
        None | Some(Value::Null) => {
            return Err(ServerError::param(
                at("content"),
                format!("'{}' is required", at("content")),
            ))
        }
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                let field = at(&format!("content[{j}]"));
                match p.get("type").and_then(Value::as_str) {
                    Some("text") => match p.get("text").and_then(Value::as_str) {
                        Some(t) => text.push_str(t),
                        None => {
                            return Err(ServerError::param(
                                field.clone(),
                                format!("'{field}.text' must be a string"),
                            ))
                        }
                    },
                    Some(t @ ("image_url" | "input_audio" | "file" | "refusal")) => {
                        return Err(ServerError::unsupported(
                            &field,
                            &format!("content of type '{t}'"),
                        ))
                    }
                    _ => {
                        return Err(ServerError::param(
                            field.clone(),
                            format!("'{field}' must be a part with type 'text'"),
                        ))
                    }
                }
            }
            text
        }
        Some(v) => {
            return Err(ServerError::param(
                at("content"),
                format!(
                    "'{}' must be a string or an array of text parts, got {}",
                    at("content"),
                    kind(v)
                ),
            ))
        }
    };
    Ok(ChatMessage::new(role, content))
}

impl CompletionRequest {
    pub fn parse(f: &Fields) -> Result<CompletionRequest> {
        refuse_unsupported(f, UNSUPPORTED_COMPLETIONS)?;
        let max = max_tokens(f, "max_tokens")?.or(Some(COMPLETIONS_DEFAULT_MAX_TOKENS));
        let mut opts = options(f, max)?;
        if let Some(b) = f.usize("best_of")? {
            if b != opts.params.n {
                return Err(ServerError::unsupported(
                    "best_of",
                    "'best_of' other than 'n' (ranking samples)",
                ));
            }
        }
        let logprobs = f.usize("logprobs")?;
        if let Some(k) = logprobs {
            if k > MAX_LOGPROBS {
                return Err(ServerError::param(
                    "logprobs",
                    format!("'logprobs' must be between 0 and {MAX_LOGPROBS}, got {k}"),
                ));
            }
        }
        opts.params.logprobs = logprobs;
        let echo = f.bool("echo")?.unwrap_or(false);
        if echo && logprobs.is_some() {
            return Err(ServerError::unsupported(
                "echo",
                "'echo' together with 'logprobs' (prompt logprobs)",
            ));
        }
        let prompts = parse_prompts(f)?;
        if prompts.len() * opts.params.n > MAX_N {
            return Err(ServerError::param(
                "n",
                format!(
                    "{} prompts with 'n' = {} make {} choices; at most {MAX_N} per request",
                    prompts.len(),
                    opts.params.n,
                    prompts.len() * opts.params.n
                ),
            ));
        }
        Ok(CompletionRequest {
            opts,
            prompts,
            echo,
            logprobs,
        })
    }
}

/// `prompt`: a string, a list of strings, a list of token ids, or a list of those lists.
fn parse_prompts(f: &Fields) -> Result<Vec<Prompt>> {
    let bad = |v: &Value| {
        ServerError::param(
            "prompt",
            format!(
                "'prompt' must be a string, a list of strings, a list of token ids or a list of such lists, got {}",
                kind(v)
            ),
        )
    };
    let Some(v) = f.get("prompt") else {
        return Err(ServerError::param("prompt", "'prompt' is required"));
    };
    let prompts = match v {
        Value::String(s) => vec![Prompt::Text(s.clone())],
        Value::Array(items) if items.is_empty() => {
            return Err(ServerError::param("prompt", "'prompt' must not be empty"))
        }
        Value::Array(items) if items.iter().all(Value::is_number) => vec![Prompt::Ids(
            items
                .iter()
                .map(|x| token_id("prompt", x))
                .collect::<Result<_>>()?,
        )],
        Value::Array(items) => items
            .iter()
            .map(|p| match p {
                Value::String(s) => Ok(Prompt::Text(s.clone())),
                Value::Array(ids) => Ok(Prompt::Ids(
                    ids.iter()
                        .map(|x| token_id("prompt", x))
                        .collect::<Result<_>>()?,
                )),
                other => Err(bad(other)),
            })
            .collect::<Result<_>>()?,
        other => return Err(bad(other)),
    };
    if prompts.len() > MAX_N {
        return Err(ServerError::param(
            "prompt",
            format!("at most {MAX_N} prompts per request, got {}", prompts.len()),
        ));
    }
    Ok(prompts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<ChatRequest> {
        ChatRequest::parse(&Fields::parse(body.as_bytes())?)
    }

    fn completion(body: &str) -> Result<CompletionRequest> {
        CompletionRequest::parse(&Fields::parse(body.as_bytes())?)
    }

    fn param_of(e: ServerError) -> String {
        e.to_json()["error"]["param"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    #[test]
    fn chat_fields() {
        let r = chat(
            r#"{"model":"m","messages":[{"role":"developer","content":"be brief"},
                {"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]}],
                "max_completion_tokens":5,"max_tokens":9,"logprobs":true,"top_logprobs":2,
                "stop":"x","seed":-3,"top_k":-1,"stream":true,"stream_options":{"include_usage":true},
                "logit_bias":{"7":-100},"unknown_field":1,"tools":[]}"#,
        )
        .unwrap();
        assert_eq!(r.messages[0], ChatMessage::new("system", "be brief"));
        assert_eq!(r.messages[1].content, "hi there");
        assert_eq!(r.opts.params.max_tokens, Some(5));
        assert_eq!(r.opts.params.logprobs, Some(2));
        assert_eq!(r.opts.params.stop, vec!["x".to_string()]);
        assert_eq!(r.opts.params.seed, Some(-3i64 as u64));
        assert_eq!(r.opts.params.top_k, None);
        assert_eq!(r.opts.params.logit_bias, vec![(7, -100.0)]);
        assert!(r.opts.stream && r.opts.include_usage);
    }

    #[test]
    fn chat_refusals_name_the_parameter() {
        let cases = [
            (
                r#"{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}"#,
                "tools",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}}"#,
                "response_format",
            ),
            (r#"{"messages":[{"role":"user","content":"x"}],"n":0}"#, "n"),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"n":129}"#,
                "n",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"top_logprobs":21,"logprobs":true}"#,
                "top_logprobs",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"top_logprobs":2}"#,
                "top_logprobs",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#,
                "temperature",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}"#,
                "stream_options",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":0}"#,
                "max_tokens",
            ),
            (r#"{"messages":[]}"#, "messages"),
            (r#"{"messages":"hi"}"#, "messages"),
            (r#"{}"#, "messages"),
            (
                r#"{"messages":[{"role":"robot","content":"x"}]}"#,
                "messages[0].role",
            ),
            (
                r#"{"messages":[{"role":"tool","content":"x"}]}"#,
                "messages[0].role",
            ),
            (
                r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#,
                "messages[0].content[0]",
            ),
            (
                r#"{"messages":[{"role":"user","content":5}]}"#,
                "messages[0].content",
            ),
            (r#"{"messages":[{"role":"user"}]}"#, "messages[0].content"),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"logit_bias":{"a":1}}"#,
                "logit_bias",
            ),
        ];
        for (body, param) in cases {
            let e = chat(body).expect_err(body);
            assert_eq!(e.status(), axum::http::StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(param_of(e), param, "{body}");
        }
    }

    #[test]
    fn list_limits() {
        fn body(key: &str, value: String) -> String {
            format!(r#"{{"messages":[{{"role":"user","content":"x"}}],"{key}":{value}}}"#)
        }
        fn list(n: usize, item: impl Fn(usize) -> String) -> String {
            let items: Vec<String> = (0..n).map(item).collect();
            format!("[{}]", items.join(","))
        }
        let bias: Vec<String> = (0..=MAX_LOGIT_BIAS).map(|i| format!("\"{i}\":1")).collect();
        let over = [
            body("stop", list(MAX_STOP_STRINGS + 1, |i| format!("\"s{i}\""))),
            body("stop", format!("\"{}\"", "x".repeat(MAX_STOP_BYTES + 1))),
            body("stop", "[\"\"]".to_string()),
            body("logit_bias", format!("{{{}}}", bias.join(","))),
            body(
                "stop_token_ids",
                list(MAX_STOP_TOKEN_IDS + 1, |i| i.to_string()),
            ),
        ];
        for b in &over {
            let e = chat(b).expect_err(&b.chars().take(60).collect::<String>());
            assert_eq!(e.status(), axum::http::StatusCode::BAD_REQUEST);
        }
        let ok = body("stop", list(MAX_STOP_STRINGS, |i| format!("\"s{i}\"")));
        assert_eq!(chat(&ok).unwrap().opts.params.stop.len(), MAX_STOP_STRINGS);
    }

    #[test]
    fn completion_prompts() {
        let r = completion(r#"{"prompt":"hi"}"#).unwrap();
        assert_eq!(r.prompts, vec![Prompt::Text("hi".into())]);
        assert_eq!(
            r.opts.params.max_tokens,
            Some(COMPLETIONS_DEFAULT_MAX_TOKENS)
        );
        let r = completion(r#"{"prompt":[1,2,3],"logprobs":2,"max_tokens":4}"#).unwrap();
        assert_eq!(r.prompts, vec![Prompt::Ids(vec![1, 2, 3])]);
        assert_eq!(r.logprobs, Some(2));
        let r = completion(r#"{"prompt":["a",[4]],"echo":true}"#).unwrap();
        assert_eq!(r.prompts.len(), 2);
        assert!(r.echo);
        for (body, param) in [
            (r#"{"prompt":[]}"#, "prompt"),
            (r#"{"prompt":[-1]}"#, "prompt"),
            (r#"{"prompt":[1.5]}"#, "prompt"),
            (r#"{"prompt":{"a":1}}"#, "prompt"),
            (r#"{}"#, "prompt"),
            (r#"{"prompt":"x","suffix":"y"}"#, "suffix"),
            (r#"{"prompt":"x","best_of":3}"#, "best_of"),
            (r#"{"prompt":"x","echo":true,"logprobs":1}"#, "echo"),
            (r#"{"prompt":"x","logprobs":30}"#, "logprobs"),
            (r#"{"prompt":["a","b","c"],"n":50}"#, "n"),
        ] {
            let e = completion(body).expect_err(body);
            assert_eq!(param_of(e), param, "{body}");
        }
    }
}
