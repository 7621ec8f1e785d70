//! OpenAI request and response bodies as types.
//!
//! A request body is read in three steps, each with its own errors (all 400s naming the
//! parameter):
//! 1. [`wire`]: the body parsed into derive-based types ([`ChatCompletionRequest`],
//!    [`CompletionRequest`]); a type error names the field's path (`messages[0].role`).
//! 2. `refuse_unsupported`: known OpenAI features Ferrum lacks (tools, audio, ...) are refused naming the parameter instead of being dropped, so a client never
//!    gets an answer to a question it did not ask. The types still parse and carry them.
//! 3. `admit`: ranges, limits and cross-field rules; the result ([`AdmittedChat`],
//!    [`AdmittedCompletion`]) holds the engine's sampling parameters and the messages the chat
//!    template takes.
//!
//! Unknown fields are ignored as OpenAI does; `null` reads as absent. Responses are the types
//! of [`response`].

pub mod anthropic;
pub mod chat;
pub mod completions;
pub mod response;
pub mod responses;
pub mod sampling;
pub mod structured;
pub mod tokenize;
pub mod unsupported;
pub mod wire;

pub use chat::{AdmittedChat, ChatCompletionMessage, ChatCompletionRequest};
pub use completions::{AdmittedCompletion, CompletionRequest, Prompt};

use ferrum_types::SamplingParams;

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

/// What both endpoints share, once admitted.
#[derive(Debug, Clone)]
pub struct Options {
    pub model: Option<String>,
    pub params: SamplingParams,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the token counts.
    pub include_usage: bool,
    /// The field the request's constraint (`params.structured`) came from.
    pub constraint_param: Option<String>,
    /// `priority`: lower first.
    pub priority: i32,
    /// The tenant (`user`, or Anthropic's `metadata.user_id`).
    pub tenant: Option<String>,
    /// The service-level target asked for (`slo` or `slo_class`).
    pub slo: Option<sampling::SloAsk>,
}

impl Options {
    /// Sets the request's structured-output constraint.
    pub fn set_constraint(&mut self, c: Option<structured::Constraint>) {
        match c {
            Some(c) => {
                self.params.structured = Some(c.spec);
                self.constraint_param = Some(c.param);
            }
            None => {
                self.params.structured = None;
                self.constraint_param = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Result, ServerError};
    use ferrum_tokenizer::ChatMessage;

    /// As the route reads a body.
    fn chat(body: &str) -> Result<AdmittedChat> {
        let r = ChatCompletionRequest::from_body(body.as_bytes())?;
        r.refuse_unsupported()?;
        r.admit()
    }

    fn completion(body: &str) -> Result<AdmittedCompletion> {
        let r = CompletionRequest::from_body(body.as_bytes())?;
        r.refuse_unsupported()?;
        r.admit()
    }

    fn param_of(e: ServerError) -> String {
        e.to_json()["error"]["param"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    #[test]
    fn a_last_assistant_message_is_continued() {
        let conv =
            r#"[{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}]"#;
        // llama-server's habit: the last assistant message is continued.
        let a = chat(&format!(r#"{{"messages": {conv}}}"#)).unwrap();
        assert_eq!(a.prefill.as_deref(), Some("1, 2,"));
        assert_eq!(a.messages, vec![ChatMessage::new("user", "Count")]);
        assert!(a.add_generation_prompt);
        // vLLM's way.
        let a = chat(&format!(
            r#"{{"messages": {conv}, "continue_final_message": true, "add_generation_prompt": false}}"#
        ))
        .unwrap();
        assert_eq!(a.prefill.as_deref(), Some("1, 2,"));
        // Asked not to: the conversation as it is, answered after it.
        let a = chat(&format!(
            r#"{{"messages": {conv}, "continue_final_message": false}}"#
        ))
        .unwrap();
        assert_eq!((a.prefill, a.messages.len()), (None, 2));
        // A last user message is answered, as ever.
        let a = chat(r#"{"messages": [{"role": "user", "content": "hi"}]}"#).unwrap();
        assert_eq!(a.prefill, None);
        for bad in [
            format!(
                r#"{{"messages": {conv}, "continue_final_message": true, "add_generation_prompt": true}}"#
            ),
            r#"{"messages": [{"role": "user", "content": "hi"}], "continue_final_message": true}"#
                .to_string(),
        ] {
            assert_eq!(
                param_of(chat(&bad).unwrap_err()),
                "continue_final_message",
                "{bad}"
            );
        }
        let constrained =
            format!(r#"{{"messages": {conv}, "response_format": {{"type": "json_object"}}}}"#);
        assert_eq!(param_of(chat(&constrained).unwrap_err()), "messages");
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
        assert_eq!(r.messages[1].content.text(), "hi there");
        assert_eq!(r.tools, None);
        assert_eq!(r.opts.params.max_tokens, Some(5));
        assert_eq!(r.opts.params.logprobs, Some(2));
        assert_eq!(r.opts.params.stop, vec!["x".to_string()]);
        assert_eq!(r.opts.params.seed, Some(-3i64 as u64));
        assert_eq!(r.opts.params.top_k, None);
        assert_eq!(r.opts.params.logit_bias, vec![(7, -100.0)]);
        assert!(r.opts.stream && r.opts.include_usage);
    }

    /// `priority` and the tenant (`user`) reach the options of both endpoints; bad ones are
    /// 400s naming the field.
    #[test]
    fn priority_and_tenant_are_read_and_checked() {
        let c = chat(r#"{"messages":[{"role":"user","content":"x"}],"priority":-3,"user":"acme"}"#)
            .unwrap();
        assert_eq!(
            (c.opts.priority, c.opts.tenant.as_deref()),
            (-3, Some("acme"))
        );
        let c = completion(r#"{"prompt":"x","priority":7}"#).unwrap();
        assert_eq!((c.opts.priority, c.opts.tenant), (7, None));
        use sampling::SloAsk;
        let c = completion(r#"{"prompt":"x","slo":{"ttft_ms":800,"best_effort":true}}"#).unwrap();
        assert_eq!(
            c.opts.slo,
            Some(SloAsk::Target {
                ttft_ms: Some(800),
                tpot_ms: None,
                best_effort: true
            })
        );
        let c = completion(r#"{"prompt":"x","slo":{"tpot_ms":50}}"#).unwrap();
        assert_eq!(
            c.opts.slo,
            Some(SloAsk::Target {
                ttft_ms: None,
                tpot_ms: Some(50),
                best_effort: false
            })
        );
        let c = chat(r#"{"messages":[{"role":"user","content":"x"}],"slo_class":"chat"}"#).unwrap();
        assert_eq!(c.opts.slo, Some(SloAsk::Class("chat".into())));
        let long = "u".repeat(300);
        for (body, param) in [
            (
                r#"{"prompt":"x","priority":"high"}"#.to_string(),
                "priority",
            ),
            (r#"{"prompt":"x","priority":1.5}"#.to_string(), "priority"),
            (
                r#"{"prompt":"x","priority":3000000000}"#.to_string(),
                "priority",
            ),
            (format!(r#"{{"prompt":"x","user":"{long}"}}"#), "user"),
            (r#"{"prompt":"x","user":5}"#.to_string(), "user"),
            (
                r#"{"prompt":"x","slo":{"ttft_ms":0}}"#.to_string(),
                "slo.ttft_ms",
            ),
            (r#"{"prompt":"x","slo":{}}"#.to_string(), "slo.ttft_ms"),
            (
                r#"{"prompt":"x","slo":{"ttft_ms":5,"tpot_ms":0}}"#.to_string(),
                "slo.tpot_ms",
            ),
            (
                r#"{"prompt":"x","slo":{"tpot_ms":"fast"}}"#.to_string(),
                "slo.tpot_ms",
            ),
            (
                r#"{"prompt":"x","slo":{"ttft_ms":5},"slo_class":"a"}"#.to_string(),
                "slo_class",
            ),
            (r#"{"prompt":"x","slo":5}"#.to_string(), "slo"),
        ] {
            let e = completion(&body).map(|_| ()).unwrap_err();
            assert_eq!(param_of(e), param, "{body}");
        }
    }

    #[test]
    fn chat_refusals_name_the_parameter() {
        let cases = [
            (
                r#"{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}"#,
                "tools[0].function",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"yaml"}}"#,
                "response_format.type",
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
                r#"{"messages":[{"role":"function","content":"x"}]}"#,
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
    fn tools_and_tool_messages_parse_and_are_carried() {
        let body = r#"{"messages":[{"role":"user","content":"weather?"},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
                "function":{"name":"get","arguments":"{\"city\":\"Paris\"}"}}]},
            {"role":"tool","tool_call_id":"c1","name":"get","content":[{"type":"text","text":"sunny"}]}],
            "tools":[{"type":"function","function":{"name":"get","parameters":{}}}],
            "response_format":{"type":"json_object"}}"#;
        let r = ChatCompletionRequest::from_body(body.as_bytes()).unwrap();
        let format: serde_json::Value = serde_json::from_str(r#"{"type":"json_object"}"#).unwrap();
        assert_eq!(r.structured.response_format, Some(format));
        r.refuse_unsupported().unwrap();
        // A response format and tool calls both constrain the output.
        assert_eq!(param_of(r.clone().admit().unwrap_err()), "response_format");
        let mut r = r;
        r.structured.response_format = None;
        let a = r.admit().unwrap();
        assert_eq!(a.tool_request.as_ref().map(|t| t.tools.len()), Some(1));

        let call = &a.messages[1].tool_calls[0];
        assert_eq!(
            (call.id.as_str(), call.function.name.as_str()),
            ("c1", "get")
        );
        assert_eq!(call.function.arguments, r#"{"city":"Paris"}"#);
        assert_eq!(a.messages[1].content.text(), "");
        assert_eq!(a.messages[2].role, "tool");
        assert_eq!(a.messages[2].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(a.messages[2].content.text(), "sunny");
        assert_eq!(
            a.tools.as_ref().and_then(|t| t.as_array()).map(Vec::len),
            Some(1)
        );
        // Type errors deep inside name their path.
        let e = chat(r#"{"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"function":{"name":3}}]}]}"#)
            .unwrap_err();
        assert_eq!(param_of(e), "messages[1].tool_calls[0].function.name");
        let e = chat(r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},7]}]}"#)
            .unwrap_err();
        assert_eq!(param_of(e), "messages[0].content[1]");
        assert_eq!(
            chat(r#"{"messages":[{"role":5,"content":"x"}]}"#)
                .unwrap_err()
                .to_string(),
            "'messages[0].role' must be a string, got an integer"
        );
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
