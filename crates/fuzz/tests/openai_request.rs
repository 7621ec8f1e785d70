//! Fuzz target: parsing and validating request bodies of every generation route
//! (`/v1/chat/completions`, `/v1/completions`, `/v1/responses`, and `/v1/messages` with its
//! `count_tokens`). Any body gets a typed request or a 4xx error that serializes to the API's
//! error JSON (OpenAI's, or Anthropic's for the Messages routes); never a panic and never a 5xx.

use ferrum_fuzz::harness::{run, Limits, Target};
use ferrum_fuzz::mutate::Mutator;
use ferrum_server::protocol::anthropic::{AnthropicError, MessagesRequest};
use ferrum_server::protocol::responses::ResponsesRequest;
use ferrum_server::protocol::wire::parse_body;
use ferrum_server::protocol::{ChatCompletionRequest, CompletionRequest};
use ferrum_server::ServerError;

#[global_allocator]
static ALLOC: ferrum_fuzz::alloc::Counting = ferrum_fuzz::alloc::Counting;

const SEEDS: &[&str] = &[
    r#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}],"max_tokens":16,"temperature":0.7,"top_p":0.9,"n":2,"stream":true,"stop":["\n","."],"seed":1,"logprobs":true,"top_logprobs":3,"logit_bias":{"42":-100},"presence_penalty":0.5,"frequency_penalty":-0.5,"stream_options":{"include_usage":true}}"#,
    r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"max_completion_tokens":3,"top_k":5,"min_p":0.1,"repetition_penalty":1.1,"ignore_eos":true,"stop_token_ids":[2,3],"user":"u"}"#,
    r#"{"model":"m","prompt":"Once upon a time","max_tokens":5,"echo":true,"logprobs":2,"stop":"\n","n":1,"best_of":1,"suffix":null}"#,
    r#"{"prompt":[[1,2,3],[4,5]],"max_tokens":2,"stream":false}"#,
    r#"{"prompt":["a","b"],"temperature":0,"seed":-1}"#,
    r#"{"prompt":"x","priority":-2147483648,"user":"tenant-a"}"#,
    r#"{"model":"m","max_tokens":1,"priority":3,"metadata":{"user_id":"t"},"messages":[{"role":"user","content":"q"}]}"#,
    r#"{"messages":[],"tools":[{"type":"function"}],"response_format":{"type":"json_object"}}"#,
    r#"{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"1"}],"tools":[]}"#,
    r#"{"model":"m","instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"1"}],"max_output_tokens":5,"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"tool_choice":{"type":"function","name":"f"},"text":{"format":{"type":"json_schema","name":"n","schema":{}}},"stream":true,"store":false}"#,
    r#"{"messages":[{"role":"user","content":"count"},{"role":"assistant","content":"1, 2,"}],"continue_final_message":true,"add_generation_prompt":false,"response_format":{"type":"json_schema","json_schema":{"name":"x","strict":false,"schema":{"type":"array","uniqueItems":true,"x-guidance":{"lenient":false}}}}}"#,
    r#"{"model":"m","max_tokens":5,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"r"}]},{"role":"assistant","content":"pre"}],"stop_sequences":["x"],"temperature":0.5,"top_k":3,"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"f"},"output_config":{"format":{"type":"json_schema","schema":{}}},"stream":true}"#,
];

fn check(r: Result<(), ServerError>) -> Result<String, String> {
    match r {
        Ok(()) => Ok("ok".into()),
        Err(e) => {
            let status = e.status();
            if !status.is_client_error() {
                return Err(format!("status {status} for a bad body: {e}"));
            }
            let json = e.to_json();
            if json["error"]["message"].as_str().is_none_or(str::is_empty) {
                return Err(format!("error without a message: {json}"));
            }
            Ok(format!("{status} {e}"))
        }
    }
}

#[test]
fn fuzz_openai_request() {
    let dictionary = [
        "\"model\"",
        "\"messages\"",
        "\"prompt\"",
        "\"continue_final_message\"",
        "\"priority\"",
        "\"user_id\"",
        "\"metadata\"",
        "\"add_generation_prompt\"",
        "\"strict\"",
        "\"x-guidance\"",
        "\"role\"",
        "\"content\"",
        "\"user\"",
        "\"assistant\"",
        "\"system\"",
        "\"tool\"",
        "\"max_tokens\"",
        "\"max_completion_tokens\"",
        "\"temperature\"",
        "\"top_p\"",
        "\"top_k\"",
        "\"min_p\"",
        "\"n\"",
        "\"stream\"",
        "\"stop\"",
        "\"seed\"",
        "\"logprobs\"",
        "\"top_logprobs\"",
        "\"logit_bias\"",
        "\"presence_penalty\"",
        "\"frequency_penalty\"",
        "\"repetition_penalty\"",
        "\"echo\"",
        "\"stream_options\"",
        "\"include_usage\"",
        "\"ignore_eos\"",
        "\"stop_token_ids\"",
        "\"type\"",
        "\"text\"",
        "\"image_url\"",
        "\"tool_calls\"",
        "\"tool_call_id\"",
        "\"tools\"",
        "\"function\"",
        "\"arguments\"",
        "\"input\"",
        "\"instructions\"",
        "\"max_output_tokens\"",
        "\"function_call\"",
        "\"function_call_output\"",
        "\"call_id\"",
        "\"output\"",
        "\"input_text\"",
        "\"previous_response_id\"",
        "\"system\"",
        "\"tool_use\"",
        "\"tool_result\"",
        "\"tool_use_id\"",
        "\"input_schema\"",
        "\"stop_sequences\"",
        "\"tool_choice\"",
        "\"output_config\"",
        "\"format\"",
        "\"json_schema\"",
        "\"schema\"",
        "18446744073709551615",
        "9223372036854775807",
        "-9223372036854775808",
        "4294967296",
        "1e308",
        "-1e308",
        "1e-320",
        "-0",
        "0.0",
        "-1",
        "129",
        "21",
        "100000",
        "null",
        "true",
        "false",
        "[]",
        "{}",
        "\"\"",
        "[[]]",
        "[[-1]]",
        "\"\\u0000\"",
        "\"\\ud800\"",
        ",",
        ":",
        "[",
        "]",
        "{",
        "}",
    ];
    let target = Target {
        name: "openai_request",
        seeds: SEEDS.iter().map(|s| s.as_bytes().to_vec()).collect(),
        mutator: Mutator {
            hot: 4096,
            dictionary: dictionary.iter().map(|w| w.as_bytes().to_vec()).collect(),
            max_len: 64 << 10,
        },
        limits: Limits {
            memory_base: 16 << 20,
            memory_per_input_byte: 64,
            ..Limits::default()
        },
    };
    let report = run(target, |body| {
        let body = match parse_body(body) {
            Ok(b) => b,
            Err(e) => return check(Err(e)),
        };
        // As the routes read a body: types, then refusals, then the rules.
        let chat = check(ChatCompletionRequest::from_json(&body).and_then(|r| {
            r.refuse_unsupported()?;
            r.admit().map(|_| ())
        }))?;
        let completion = check(CompletionRequest::from_json(&body).and_then(|r| {
            r.refuse_unsupported()?;
            r.admit().map(|_| ())
        }))?;
        let responses = check(ResponsesRequest::from_json(&body).and_then(|r| {
            r.refuse_unsupported()?;
            r.admit().map(|_| ())
        }))?;
        let mut messages = String::new();
        for count in [false, true] {
            match MessagesRequest::from_json(&body).and_then(|r| r.admit(count)) {
                Ok(_) => messages.push_str("ok "),
                Err(e) => {
                    let e = AnthropicError(e);
                    let (status, _) = e.status_and_type();
                    if !status.is_client_error() {
                        return Err(format!(
                            "status {status} for a bad Messages body: {:?}",
                            e.0
                        ));
                    }
                    let body = serde_json::to_value(e.body()).unwrap_or_default();
                    if body["type"] != "error"
                        || body["error"]["message"].as_str().is_none_or(str::is_empty)
                    {
                        return Err(format!("a Messages error without its shape: {body}"));
                    }
                    messages.push_str(&format!("{status} "));
                }
            }
        }
        Ok(format!("{chat} | {completion} | {responses} | {messages}"))
    });
    assert!(report.execs > 0);
}
