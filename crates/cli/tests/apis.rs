//! The Responses and Anthropic Messages routes, the chat page and CORS, on a real
//! `ferrum serve` of the tiny fixture, driven over HTTP: whole and streamed answers agree, the
//! event sequences are the APIs' own, errors have each API's shape, a dropped stream frees its
//! blocks. (The official SDKs drive the same routes in tests/openai.)
// The child is killed and waited for in `Server::drop`.
#![allow(clippy::unwrap_used, clippy::zombie_processes)]

mod common;

use common::{wait_all_free, Server};
use serde_json::{json, Value};
use std::time::Duration;

/// An SSE body's `(event, data)` pairs, checking the framing on the way.
fn events(body: &str) -> Vec<(String, Value)> {
    assert!(body.ends_with("\n\n"), "body must end with a blank line");
    body.split_terminator("\n\n")
        .map(|f| {
            let (ev, data) = f.split_once('\n').unwrap();
            let ev = ev.strip_prefix("event: ").unwrap();
            let data = data.strip_prefix("data: ").unwrap();
            assert!(!data.contains('\n'), "frame spans lines: {f:?}");
            let v: Value = serde_json::from_str(data).unwrap();
            assert_eq!(v["type"], ev, "the data's type is the event's name");
            (ev.to_string(), v)
        })
        .collect()
}

async fn post(c: &reqwest::Client, s: &Server, path: &str, body: &Value) -> (u16, String) {
    let r = c.post(s.url(path)).json(body).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn post_json(c: &reqwest::Client, s: &Server, path: &str, body: &Value) -> (u16, Value) {
    let (status, text) = post(c, s, path, body).await;
    (status, serde_json::from_str(&text).unwrap())
}

#[tokio::test]
async fn responses_whole_and_streamed_agree() {
    let s = Server::start(&[]);
    let c = reqwest::Client::new();
    let body = json!({
        "model": "tiny", "instructions": "Answer briefly.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Say something"}]}],
        "max_output_tokens": 10, "temperature": 0, "ignore_eos": true,
    });
    let (status, whole) = post_json(&c, &s, "/v1/responses", &body).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "response");
    assert!(whole["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(whole["status"], "incomplete");
    assert_eq!(whole["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(whole["instructions"], "Answer briefly.");
    assert_eq!(whole["usage"]["output_tokens"], 10);
    let input_tokens = whole["usage"]["input_tokens"].as_u64().unwrap();
    assert_eq!(whole["usage"]["total_tokens"], input_tokens + 10);
    let out = &whole["output"];
    assert_eq!(out.as_array().unwrap().len(), 1);
    assert_eq!(out[0]["type"], "message");
    assert_eq!(out[0]["role"], "assistant");
    assert_eq!(out[0]["content"][0]["type"], "output_text");
    // The limit cut the answer: its item is incomplete too.
    assert_eq!(out[0]["status"], "incomplete");
    let text = out[0]["content"][0]["text"].as_str().unwrap().to_string();

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = c
        .post(s.url("/v1/responses"))
        .json(&streamed)
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let ev = events(&r.text().await.unwrap());
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert_eq!(
        names[names.len() - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.incomplete",
        ]
    );
    for (i, (_, v)) in ev.iter().enumerate() {
        assert_eq!(v["sequence_number"], i as u64);
    }
    assert_eq!(ev[0].1["response"]["status"], "in_progress");
    let deltas: String = ev
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, v)| v["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, text);
    let done = &ev
        .iter()
        .find(|(n, _)| n == "response.output_text.done")
        .unwrap()
        .1;
    assert_eq!(done["text"], text.as_str());
    let last = &ev.last().unwrap().1["response"];
    assert_eq!(last["status"], "incomplete");
    assert_eq!(last["output"][0]["content"][0]["text"], text.as_str());
    assert_eq!(last["output"][0]["status"], "incomplete");
    assert_eq!(last["usage"]["output_tokens"], 10);
    assert_eq!(last["id"], ev[0].1["response"]["id"]);
}

#[tokio::test]
async fn responses_errors_are_openai_errors() {
    let s = Server::start(&[]);
    let c = reqwest::Client::new();
    for (body, param) in [
        (
            json!({"input": "x", "previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (json!({"input": "x", "store": true}), "store"),
        (json!({"input": []}), "input"),
        (
            json!({"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": "required"}),
            "tools",
        ),
    ] {
        let (status, v) = post_json(&c, &s, "/v1/responses", &body).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["error"]["param"], param, "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    let (status, v) = post_json(
        &c,
        &s,
        "/v1/responses",
        &json!({"model": "other", "input": "x"}),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(v["error"]["code"], "model_not_found");
}

#[tokio::test]
async fn anthropic_messages_whole_streamed_and_counted() {
    let s = Server::start(&[]);
    let c = reqwest::Client::new();
    let body = json!({
        "model": "tiny", "max_tokens": 9, "temperature": 0,
        "system": "Answer briefly.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Say something"}]}],
    });
    let (status, whole) = post_json(&c, &s, "/v1/messages", &body).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["type"], "message");
    assert_eq!(whole["role"], "assistant");
    assert!(whole["id"].as_str().unwrap().starts_with("msg_"));
    let text = whole["content"][0]["text"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let out_tokens = whole["usage"]["output_tokens"].as_u64().unwrap();
    let reason = whole["stop_reason"].as_str().unwrap().to_string();
    assert!(["end_turn", "max_tokens"].contains(&reason.as_str()));
    assert_eq!(reason == "max_tokens", out_tokens == 9);
    let prompt = whole["usage"]["input_tokens"].as_u64().unwrap()
        + whole["usage"]["cache_read_input_tokens"].as_u64().unwrap();

    let (status, counted) = post_json(&c, &s, "/v1/messages/count_tokens", &body).await;
    assert_eq!(status, 200);
    assert_eq!(counted["input_tokens"], prompt);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, text_body) = post(&c, &s, "/v1/messages", &streamed).await;
    assert_eq!(status, 200);
    let ev = events(&text_body);
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..2], ["message_start", "ping"]);
    assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"]);
    assert_eq!(ev[0].1["message"]["usage"]["input_tokens"], prompt);
    let deltas: String = ev
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, v)| {
            assert_eq!(v["delta"]["type"], "text_delta");
            v["delta"]["text"].as_str().unwrap()
        })
        .collect();
    assert_eq!(deltas, text);
    if !text.is_empty() {
        assert_eq!(names[2], "content_block_start");
        assert_eq!(
            ev[2].1["content_block"],
            json!({"type": "text", "text": ""})
        );
        assert_eq!(names[names.len() - 3], "content_block_stop");
    }
    let delta = &ev[ev.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], reason.as_str());
    assert_eq!(delta["usage"]["output_tokens"], out_tokens);

    // A last assistant message is a prefill: the prompt grows by it, the answer goes on.
    let mut prefilled = body.clone();
    prefilled["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": "Well, the answer is"}));
    let (_, counted2) = post_json(&c, &s, "/v1/messages/count_tokens", &prefilled).await;
    assert!(counted2["input_tokens"].as_u64().unwrap() > prompt);
    let (status, v) = post_json(&c, &s, "/v1/messages", &prefilled).await;
    assert_eq!(status, 200, "{v}");
}

#[tokio::test]
async fn anthropic_errors_and_keys() {
    let s = Server::start(&["--api-key", "sekret"]);
    let c = reqwest::Client::new();
    let body = json!({"model": "tiny", "max_tokens": 2,
                      "messages": [{"role": "user", "content": "hi"}]});
    // No key, a wrong key: Anthropic's 401.
    let r = c
        .post(s.url("/v1/messages"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "authentication_error");
    let r = c
        .post(s.url("/v1/messages"))
        .header("x-api-key", "wrong")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // x-api-key and Bearer both work, on every route.
    let r = c
        .post(s.url("/v1/messages"))
        .header("x-api-key", "sekret")
        .header("anthropic-version", "2023-06-01")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .get(s.url("/v1/models"))
        .header("x-api-key", "sekret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .post(s.url("/v1/messages/count_tokens"))
        .bearer_auth("sekret")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    for (body, status, kind) in [
        (
            json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}),
            400,
            "invalid_request_error",
        ),
        (
            json!({"model": "claude-x", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}),
            404,
            "not_found_error",
        ),
        (json!([1, 2]), 400, "invalid_request_error"),
    ] {
        let r = c
            .post(s.url("/v1/messages"))
            .header("x-api-key", "sekret")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "{body}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], kind, "{v}");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    }
    // The chat page needs no key; the API behind it does.
    let r = c.get(s.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(r.headers().contains_key("content-security-policy"));
    let page = r.text().await.unwrap();
    assert!(page.contains("/v1/chat/completions") && page.contains("id=\"stop\""));
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "no network assets"
    );
    assert_eq!(
        c.get(s.url("/v1/models")).send().await.unwrap().status(),
        401
    );
}

#[tokio::test]
async fn a_dropped_anthropic_stream_frees_its_blocks() {
    let s = Server::start(&[]);
    let c = reqwest::Client::new();
    let body = json!({"model": "tiny", "max_tokens": 100000, "stream": true, "temperature": 1,
                      "messages": [{"role": "user", "content": "Go on forever"}]});
    let mut r = c
        .post(s.url("/v1/messages"))
        .json(&body)
        .send()
        .await
        .unwrap();
    // Read a few frames, then hang up.
    for _ in 0..3 {
        r.chunk().await.unwrap();
    }
    drop(r);
    wait_all_free(&c, &s, Duration::from_secs(30)).await;
}

#[tokio::test]
async fn web_ui_can_be_turned_off_and_cors_is_opt_in() {
    let c = reqwest::Client::new();
    let plain = Server::start(&["--no-web-ui"]);
    assert_eq!(c.get(plain.url("/")).send().await.unwrap().status(), 404);
    let r = c
        .get(plain.url("/v1/models"))
        .header("origin", "http://app.test")
        .send()
        .await
        .unwrap();
    assert!(!r.headers().contains_key("access-control-allow-origin"));
    drop(plain);

    let s = Server::start(&[
        "--api-key",
        "k",
        "--allowed-origins",
        "http://app.test,http://other.test:8080",
    ]);
    // A preflight is answered before the key check.
    let r = c
        .request(reqwest::Method::OPTIONS, s.url("/v1/chat/completions"))
        .header("origin", "http://app.test")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization,content-type",
        )
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let h = r.headers();
    assert_eq!(h["access-control-allow-origin"], "http://app.test");
    assert!(h["access-control-allow-methods"]
        .to_str()
        .unwrap()
        .contains("POST"));
    assert!(h["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .contains("authorization"));
    let r = c
        .get(s.url("/v1/models"))
        .header("origin", "http://other.test:8080")
        .bearer_auth("k")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://other.test:8080"
    );
    let r = c
        .get(s.url("/v1/models"))
        .header("origin", "http://evil.test")
        .bearer_auth("k")
        .send()
        .await
        .unwrap();
    assert!(!r.headers().contains_key("access-control-allow-origin"));
}
