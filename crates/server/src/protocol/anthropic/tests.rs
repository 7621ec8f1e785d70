//! Reading Messages bodies: blocks into messages, the prefill, the constraint, errors naming
//! the parameter in Anthropic's shape.

use super::*;
use axum::http::StatusCode;

fn admit(body: &str) -> Result<AdmittedChat> {
    MessagesRequest::from_body(body.as_bytes())?.admit(false)
}

#[test]
fn messages_become_chat_messages() {
    let r = admit(
        r#"{"model":"m","max_tokens":9,"system":[{"type":"text","text":"be "},{"type":"text","text":"brief"}],
            "messages":[{"role":"user","content":"weather?"},
            {"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"text","text":"Let me look."},
                {"type":"tool_use","id":"t1","name":"get","input":{"city":"Paris"}}]},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"sunny"}]},{"type":"text","text":"thanks"}]}],
            "stop_sequences":["END"],"temperature":0.5,"top_k":4,
            "tools":[{"name":"get","description":"d","input_schema":{"type":"object"}}],
            "tool_choice":{"type":"any","disable_parallel_tool_use":true}}"#,
    )
    .unwrap();
    let m = &r.messages;
    assert_eq!(m[0], ChatMessage::new("system", "be brief"));
    assert_eq!(m[1], ChatMessage::new("user", "weather?"));
    assert_eq!(m[2].content.text(), "Let me look.");
    assert_eq!(m[2].tool_calls[0].function.arguments, r#"{"city":"Paris"}"#);
    assert_eq!(m[3].role, "tool");
    assert_eq!(m[3].name.as_deref(), Some("get"));
    assert_eq!(m[3].content.text(), "sunny");
    assert_eq!(m[4], ChatMessage::new("user", "thanks"));
    assert_eq!(r.opts.params.max_tokens, Some(9));
    assert_eq!(r.opts.params.stop, vec!["END".to_string()]);
    assert_eq!(r.opts.params.top_k, Some(4));
    let t = r.tool_request.unwrap();
    assert_eq!(t.choice, ToolChoice::Required);
    assert!(!t.parallel);
    assert_eq!(
        r.tools.unwrap()[0]["function"]["parameters"]["type"],
        "object"
    );
}

#[test]
fn output_config_format_constrains() {
    let r = admit(
        r#"{"model":"m","max_tokens":5,"output_config":{"effort":"low","format":{"type":"json_schema","schema":{"type":"object"}}},"messages":[{"role":"user","content":"x"}]}"#,
    )
    .unwrap();
    assert_eq!(
        r.opts.params.structured,
        Some(ferrum_types::StructuredOutput::JsonSchema {
            schema: r#"{"type":"object"}"#.into(),
            strict: true,
        })
    );
    assert_eq!(
        r.opts.constraint_param.as_deref(),
        Some("output_config.format")
    );
}

#[test]
fn a_last_assistant_message_is_a_prefill() {
    let r = admit(
        r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"Name a color."},{"role":"assistant","content":"The color is"}]}"#,
    )
    .unwrap();
    assert_eq!(r.messages.len(), 1);
    assert_eq!(r.prefill.as_deref(), Some("The color is"));
}

#[test]
fn errors_name_the_parameter() {
    for (body, param) in [
        (
            r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#,
            "max_tokens",
        ),
        (
            r#"{"max_tokens":3,"messages":[{"role":"user","content":"x"}]}"#,
            "model",
        ),
        (r#"{"model":"m","max_tokens":3}"#, "messages"),
        (r#"{"model":"m","max_tokens":3,"messages":[]}"#, "messages"),
        (
            r#"{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}"#,
            "max_tokens",
        ),
        (
            r#"{"model":"m","max_tokens":3,"temperature":1.5,"messages":[{"role":"user","content":"x"}]}"#,
            "temperature",
        ),
        (
            r#"{"model":"m","max_tokens":3,"top_k":-2,"messages":[{"role":"user","content":"x"}]}"#,
            "top_k",
        ),
        (
            r#"{"model":"m","max_tokens":3,"messages":[{"role":"system","content":"x"}]}"#,
            "messages.0.role",
        ),
        (
            r#"{"model":"m","max_tokens":3,"messages":[{"role":"user","content":5}]}"#,
            "messages.0.content",
        ),
        (
            r#"{"model":"m","max_tokens":3,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}"#,
            "messages.0.content.0",
        ),
        (
            r#"{"model":"m","max_tokens":3,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"f","input":{}}]}]}"#,
            "messages.0.content.0.type",
        ),
        (
            r#"{"model":"m","max_tokens":3,"messages":[{"role":"user","content":[{"type":"text"}]}]}"#,
            "messages.0.content.0.text",
        ),
        (
            r#"{"model":"m","max_tokens":3,"stop_sequences":[""],"messages":[{"role":"user","content":"x"}]}"#,
            "stop_sequences",
        ),
        (
            r#"{"model":"m","max_tokens":3,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"x"}]}"#,
            "thinking",
        ),
        (
            r#"{"model":"m","max_tokens":3,"tools":[{"type":"web_search_20250305","name":"web_search"}],"messages":[{"role":"user","content":"x"}]}"#,
            "tools.0.type",
        ),
        (
            r#"{"model":"m","max_tokens":3,"tools":[{"name":"bad name"}],"messages":[{"role":"user","content":"x"}]}"#,
            "tools.0.name",
        ),
        (
            r#"{"model":"m","max_tokens":3,"tools":[{"name":"f","input_schema":3}],"messages":[{"role":"user","content":"x"}]}"#,
            "tools.0.input_schema",
        ),
        (
            r#"{"model":"m","max_tokens":3,"tools":[{"name":"f"}],"tool_choice":{"type":"tool"},"messages":[{"role":"user","content":"x"}]}"#,
            "tool_choice.name",
        ),
        (
            r#"{"model":"m","max_tokens":3,"tool_choice":{"type":"any"},"messages":[{"role":"user","content":"x"}]}"#,
            "tool_choice",
        ),
        (
            r#"{"model":"m","max_tokens":3,"output_config":{"format":{"type":"yaml"}},"messages":[{"role":"user","content":"x"}]}"#,
            "output_config.format.type",
        ),
        (
            r#"{"model":"m","max_tokens":3,"output_config":{"format":{"type":"json_schema"}},"messages":[{"role":"user","content":"x"}]}"#,
            "output_config.format.schema",
        ),
        (
            r#"{"model":"m","max_tokens":3,"output_config":{"format":{"type":"json_schema","schema":{}}},"tools":[{"name":"f"}],"messages":[{"role":"user","content":"x"}]}"#,
            "output_config.format",
        ),
        // A prefill and a grammar would not make one valid whole.
        (
            r#"{"model":"m","max_tokens":3,"output_config":{"format":{"type":"json_schema","schema":{}}},"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"{"}]}"#,
            "messages",
        ),
        (
            r#"{"model":"m","max_tokens":3,"tools":[{"name":"f"}],"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"pre"}]}"#,
            "messages",
        ),
    ] {
        let e = admit(body).expect_err(body);
        let ae = AnthropicError(e);
        assert_eq!(ae.status_and_type().0, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(ae.body().error.kind, "invalid_request_error");
        assert_eq!(ae.0.to_json()["error"]["param"], param, "{body}");
    }
    // Counting needs no max_tokens.
    let r =
        MessagesRequest::from_body(br#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#)
            .unwrap()
            .admit(true)
            .unwrap();
    assert_eq!(r.opts.params.max_tokens, None);
    let e = AnthropicError(ServerError::Overloaded("full".into()));
    assert_eq!(
        e.status_and_type(),
        (StatusCode::from_u16(529).unwrap(), "overloaded_error")
    );
}

#[test]
fn a_cut_answer_is_max_tokens_even_with_calls() {
    use ferrum_types::FinishReason;
    assert_eq!(
        stop_reason(Some(&FinishReason::MaxTokens), true),
        ("max_tokens", None)
    );
    assert_eq!(
        stop_reason(Some(&FinishReason::Eos(2)), true),
        ("tool_use", None)
    );
    assert_eq!(
        stop_reason(Some(&FinishReason::StopString("x".into())), false),
        ("stop_sequence", Some("x".into()))
    );
    assert_eq!(
        stop_reason(Some(&FinishReason::ConstraintEnd), false),
        ("end_turn", None)
    );
}

#[test]
fn priority_and_the_tenant_from_metadata() {
    let r = admit(
        r#"{"model":"m","max_tokens":3,"priority":2,"metadata":{"user_id":"acme"},"messages":[{"role":"user","content":"x"}]}"#,
    )
    .unwrap();
    assert_eq!(
        (r.opts.priority, r.opts.tenant.as_deref()),
        (2, Some("acme"))
    );
    let e = admit(
        r#"{"model":"m","max_tokens":3,"metadata":{"user_id":5},"messages":[{"role":"user","content":"x"}]}"#,
    )
    .unwrap_err();
    assert_eq!(e.to_json()["error"]["param"], "metadata.user_id");
    let long = "u".repeat(300);
    let e = admit(&format!(
        r#"{{"model":"m","max_tokens":3,"metadata":{{"user_id":"{long}"}},"messages":[{{"role":"user","content":"x"}}]}}"#
    ))
    .unwrap_err();
    assert_eq!(e.to_json()["error"]["param"], "metadata.user_id");
}
