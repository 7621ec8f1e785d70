//! Reading Responses bodies: items into messages, the constraint, refusals naming the parameter.

use super::*;
use ferrum_types::StructuredOutput;

fn admit(body: &str) -> Result<AdmittedResponse> {
    let r = ResponsesRequest::from_body(body.as_bytes())?;
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
fn input_items_become_messages() {
    let r = admit(
        r#"{"model":"m","instructions":"be brief","input":[
            {"role":"developer","content":"sys"},
            {"type":"message","role":"user","content":[{"type":"input_text","text":"weather "},{"type":"input_text","text":"in Paris?"}]},
            {"type":"reasoning","id":"r1","summary":[]},
            {"type":"function_call","call_id":"c1","name":"get","arguments":"{\"city\":\"Paris\"}"},
            {"type":"function_call","call_id":"c2","name":"now","arguments":"{}"},
            {"type":"function_call_output","call_id":"c1","output":"sunny"},
            {"role":"assistant","content":[{"type":"output_text","text":"It is sunny."}]}],
            "max_output_tokens":7,"temperature":0.5,"stop":["x"],"seed":3,
            "tools":[{"type":"function","name":"get","parameters":{"type":"object"}},{"type":"function","name":"now"}],
            "tool_choice":{"type":"function","name":"get"},"parallel_tool_calls":false,"store":false}"#,
    )
    .unwrap();
    let m = &r.chat.messages;
    assert_eq!(m[0], ChatMessage::new("system", "be brief"));
    assert_eq!(m[1], ChatMessage::new("system", "sys"));
    assert_eq!(m[2].content.text(), "weather in Paris?");
    assert_eq!(m[3].role, "assistant");
    assert_eq!(m[3].tool_calls.len(), 2);
    assert_eq!(m[3].tool_calls[0].function.arguments, r#"{"city":"Paris"}"#);
    assert_eq!(m[4].role, "tool");
    assert_eq!(m[4].tool_call_id.as_deref(), Some("c1"));
    assert_eq!(m[4].name.as_deref(), Some("get"));
    assert_eq!(m[5].content.text(), "It is sunny.");
    let p = &r.chat.opts.params;
    assert_eq!(p.max_tokens, Some(7));
    assert_eq!(p.stop, vec!["x".to_string()]);
    assert_eq!(p.seed, Some(3));
    let t = r.chat.tool_request.as_ref().unwrap();
    assert_eq!(t.choice, ToolChoice::Function("get".into()));
    assert!(!t.parallel);
    assert_eq!(r.chat.tools.as_ref().unwrap()[0]["function"]["name"], "get");
    assert_eq!(r.tool_choice["name"], "get");

    let r = admit(r#"{"input":"hi"}"#).unwrap();
    assert_eq!(r.chat.messages, vec![ChatMessage::new("user", "hi")]);
    assert_eq!(r.text["format"]["type"], "text");
    assert!(r.chat.tool_request.is_none());
}

#[test]
fn text_format_constrains() {
    let r = admit(
        r#"{"input":"x","text":{"format":{"type":"json_schema","name":"p","schema":{"type":"object"},"strict":true}}}"#,
    )
    .unwrap();
    assert_eq!(
        r.chat.opts.params.structured,
        Some(StructuredOutput::JsonSchema {
            schema: r#"{"type":"object"}"#.into(),
            strict: true,
        })
    );
    assert_eq!(r.chat.opts.constraint_param.as_deref(), Some("text.format"));
    let r = admit(r#"{"input":"x","text":{"format":{"type":"json_object"}}}"#).unwrap();
    assert_eq!(
        r.chat.opts.params.structured,
        Some(StructuredOutput::JsonObject)
    );
}

#[test]
fn refusals_name_the_parameter() {
    for (body, param) in [
        (r#"{}"#, "input"),
        (r#"{"input":[]}"#, "input"),
        (r#"{"input":5}"#, "input"),
        (
            r#"{"input":"x","previous_response_id":"resp_1"}"#,
            "previous_response_id",
        ),
        (r#"{"input":"x","store":true}"#, "store"),
        (r#"{"input":"x","conversation":"c"}"#, "conversation"),
        (r#"{"input":"x","background":true}"#, "background"),
        (r#"{"input":"x","reasoning":{"effort":"low"}}"#, "reasoning"),
        (
            r#"{"input":"x","include":["message.output_text.logprobs"]}"#,
            "include",
        ),
        (r#"{"input":"x","truncation":"auto"}"#, "truncation"),
        (
            r#"{"input":"x","max_output_tokens":0}"#,
            "max_output_tokens",
        ),
        (
            r#"{"input":"x","max_output_tokens":"many"}"#,
            "max_output_tokens",
        ),
        (r#"{"input":"x","n":2}"#, "n"),
        (
            r#"{"input":[{"role":"robot","content":"x"}]}"#,
            "input[0].role",
        ),
        (
            r#"{"input":[{"role":"user","content":[{"type":"input_image","image_url":"u"}]}]}"#,
            "input[0].content[0]",
        ),
        (
            r#"{"input":[{"role":"user","content":[{"type":"input_text"}]}]}"#,
            "input[0].content[0].text",
        ),
        (r#"{"input":[{"role":"user"}]}"#, "input[0].content"),
        (
            r#"{"input":[{"type":"item_reference","id":"x"}]}"#,
            "input[0]",
        ),
        (r#"{"input":[{"type":"web_search_call"}]}"#, "input[0].type"),
        (
            r#"{"input":[{"type":"function_call","name":"f","arguments":"{}"}]}"#,
            "input[0].call_id",
        ),
        (
            r#"{"input":[{"type":"function_call_output","call_id":"c"}]}"#,
            "input[0].output",
        ),
        (
            r#"{"input":"x","tools":[{"type":"web_search"}]}"#,
            "tools[0].type",
        ),
        (
            r#"{"input":"x","tools":[{"type":"function","name":"bad name"}]}"#,
            "tools[0].name",
        ),
        (
            r#"{"input":"x","tools":[{"type":"function","name":"f","parameters":3}]}"#,
            "tools[0].parameters",
        ),
        (
            r#"{"input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"g"}}"#,
            "tool_choice",
        ),
        (
            r#"{"input":"x","text":{"format":{"type":"yaml"}}}"#,
            "text.format.type",
        ),
        (
            r#"{"input":"x","text":{"format":{"type":"json_schema","name":"n"}}}"#,
            "text.format.schema",
        ),
        (r#"{"input":"x","temperature":"hot"}"#, "temperature"),
    ] {
        let e = admit(body).expect_err(body);
        assert_eq!(e.status(), axum::http::StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(param_of(e), param, "{body}");
    }
}
