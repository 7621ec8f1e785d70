//! `ferrum serve` as a real process, driven over HTTP with reqwest: SSE framing, aborting on
//! disconnect (the KV gauges return to full), graceful shutdown, and error statuses.
// The child is killed and waited for in `Server::drop`.
#![allow(clippy::unwrap_used, clippy::zombie_processes)]

mod common;

use common::{gauge, tiny, wait_all_free, Server};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Splits an SSE body into its `data:` payloads, checking the framing on the way.
fn frames(body: &str) -> Vec<String> {
    assert!(body.ends_with("\n\n"), "body must end with a blank line");
    body.split_terminator("\n\n")
        .map(|f| {
            assert!(f.starts_with("data: "), "bad frame {f:?}");
            assert!(!f[6..].contains('\n'), "frame spans lines: {f:?}");
            f[6..].to_string()
        })
        .collect()
}

#[tokio::test]
async fn sse_framing_matches_openai() {
    let s = Server::start(&[]);
    let c = reqwest::Client::new();
    let body = json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": "Say something"}],
        "max_tokens": 12, "temperature": 0, "ignore_eos": true,
        "n": 2, "stream": true, "stream_options": {"include_usage": true},
    });
    let r = c
        .post(s.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let text = r.text().await.unwrap();
    let f = frames(&text);
    assert_eq!(f.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = f[..f.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    // One id for the whole stream; every chunk but the last has "usage": null.
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"));
    for ch in &chunks {
        assert_eq!(ch["id"], id);
        assert_eq!(ch["object"], "chat.completion.chunk");
        assert_eq!(ch["model"], "tiny");
    }
    for ch in &chunks[..chunks.len() - 1] {
        assert!(ch["usage"].is_null());
        assert_eq!(ch["choices"].as_array().unwrap().len(), 1);
    }
    // The role chunks come first, one per choice.
    for (i, ch) in chunks[..2].iter().enumerate() {
        assert_eq!(ch["choices"][0]["index"], i);
        assert_eq!(ch["choices"][0]["delta"]["role"], "assistant");
    }
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 24);
    let prompt_tokens = usage["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(usage["usage"]["total_tokens"], prompt_tokens + 24);
    // Per choice: content deltas, then exactly one finish chunk with an empty delta.
    let mut texts = [String::new(), String::new()];
    for (i, text) in texts.iter_mut().enumerate() {
        let mine: Vec<&Value> = chunks[..chunks.len() - 1]
            .iter()
            .filter(|c| c["choices"][0]["index"] == i)
            .collect();
        let last = mine.last().unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        assert_eq!(last["choices"][0]["delta"], json!({}));
        for ch in &mine[..mine.len() - 1] {
            assert!(ch["choices"][0]["finish_reason"].is_null());
            *text += ch["choices"][0]["delta"]["content"].as_str().unwrap();
        }
    }
    // Greedy: both samples agree, and the stream says what the plain response says.
    assert_eq!(texts[0], texts[1]);
    let mut plain = body.clone();
    plain["stream"] = json!(false);
    plain["stream_options"] = Value::Null;
    let v: Value = c
        .post(s.url("/v1/chat/completions"))
        .json(&plain)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], texts[0].as_str());
    assert_eq!(v["usage"]["prompt_tokens"], prompt_tokens);
}

#[tokio::test]
async fn disconnect_aborts_and_frees_blocks() {
    let s = Server::start(&[]);
    let c = reqwest::Client::new();
    // Four samples of 2000 tokens each: 2000 steps of four rows, several seconds even on an
    // idle fast machine, so the request is still running whenever the client walks away.
    let long = json!({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 2000,
                      "n": 4, "ignore_eos": true, "stream": true});
    let whole = 8000.0;
    // A stream read for a while, then dropped.
    let mut r = c
        .post(s.url("/v1/completions"))
        .json(&long)
        .send()
        .await
        .unwrap();
    for _ in 0..5 {
        assert!(r.chunk().await.unwrap().is_some());
    }
    let total = gauge(&c, &s, "ferrum_kv_blocks_total").await;
    assert!(gauge(&c, &s, "ferrum_kv_blocks_free").await < total);
    // Its four samples run (each counts).
    assert_eq!(gauge(&c, &s, "ferrum_num_requests_running").await, 4.0);
    drop(r);
    wait_all_free(&c, &s, Duration::from_secs(10)).await;
    let generated = gauge(&c, &s, "ferrum_generation_tokens_total").await;
    assert!(
        generated < whole,
        "{generated} tokens: the request was not aborted"
    );
    // A plain request whose client gives up once it is running (dropping the task drops the
    // connection).
    let mut plain = long.clone();
    plain["stream"] = json!(false);
    let pending = tokio::spawn(c.post(s.url("/v1/completions")).json(&plain).send());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while gauge(&c, &s, "ferrum_num_requests_running").await < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the plain request never ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pending.abort();
    assert!(pending.await.is_err_and(|e| e.is_cancelled()));
    wait_all_free(&c, &s, Duration::from_secs(10)).await;
    let after = gauge(&c, &s, "ferrum_generation_tokens_total").await;
    assert!(
        after - generated < whole,
        "the plain request was not aborted"
    );
}

#[tokio::test]
async fn sigterm_lets_streams_finish_then_exits() {
    let mut s = Server::start(&["--shutdown-timeout", "60"]);
    let c = reqwest::Client::new();
    let req = json!({"prompt": "Hello", "max_tokens": 150, "ignore_eos": true, "stream": true});
    let mut r = c
        .post(s.url("/v1/completions"))
        .json(&req)
        .send()
        .await
        .unwrap();
    let mut body = String::new();
    body += std::str::from_utf8(&r.chunk().await.unwrap().unwrap()).unwrap();
    s.signal("-TERM");
    // New connections are refused once the listener has closed.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let fresh = reqwest::Client::new();
        if fresh.get(s.url("/health")).send().await.is_err() {
            break;
        }
        assert!(Instant::now() < deadline, "still accepting after SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The in-flight stream runs to its end.
    while let Some(b) = r.chunk().await.unwrap() {
        body += std::str::from_utf8(&b).unwrap();
    }
    let f = frames(&body);
    assert_eq!(f.last().unwrap(), "[DONE]");
    let fin: Value = serde_json::from_str(&f[f.len() - 2]).unwrap();
    assert_eq!(fin["choices"][0]["finish_reason"], "length");
    let st = s
        .wait_exit(Duration::from_secs(20))
        .expect("no exit after SIGTERM");
    assert!(st.success(), "{st:?}");
    let log: Vec<String> = s.stderr.try_iter().collect();
    assert!(log.iter().any(|l| l.contains("shutting down")), "{log:?}");
}

#[tokio::test]
async fn grace_period_bounds_shutdown() {
    let mut s = Server::start(&["--shutdown-timeout", "0.5"]);
    let c = reqwest::Client::new();
    // Four samples of 2000 tokens: seconds of work, well past the half-second grace.
    let req =
        json!({"prompt": "Hello", "max_tokens": 2000, "n": 4, "ignore_eos": true, "stream": true});
    let mut r = c
        .post(s.url("/v1/completions"))
        .json(&req)
        .send()
        .await
        .unwrap();
    assert!(r.chunk().await.unwrap().is_some());
    let t = Instant::now();
    s.signal("-INT");
    let st = s
        .wait_exit(Duration::from_secs(15))
        .expect("no exit after the grace period");
    assert!(st.success(), "{st:?}");
    assert!(t.elapsed() < Duration::from_secs(10));
    // The cut-off stream ends (without [DONE]).
    let mut body = Vec::new();
    while let Ok(Some(b)) = r.chunk().await {
        body.extend_from_slice(&b);
    }
    assert!(!String::from_utf8_lossy(&body).contains("[DONE]"));
}

/// Every error status the server gives, each in OpenAI's JSON shape.
#[tokio::test]
async fn error_statuses() {
    let s = Server::start(&[
        "--api-key",
        "sekret",
        "--max-request-bytes",
        "4000",
        "--max-num-seqs",
        "1",
        "--max-waiting-requests",
        "0",
    ]);
    let c = reqwest::Client::new();
    let chat =
        json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let post = |path: &str, body: String, key: Option<&str>| {
        let mut b = c
            .post(s.url(path))
            .header("content-type", "application/json")
            .body(body);
        if let Some(k) = key {
            b = b.bearer_auth(k);
        }
        b.send()
    };
    let check = |status: u16, expect: u16, v: &Value, what: &str| {
        assert_eq!(status, expect, "{what}: {v}");
        assert!(v["error"]["message"].as_str().is_some(), "{what}: {v}");
        assert!(v["error"]["type"].as_str().is_some(), "{what}: {v}");
        assert!(v["error"].get("param").is_some(), "{what}: {v}");
        assert!(v["error"].get("code").is_some(), "{what}: {v}");
    };
    let key = Some("sekret");
    // (path, body, key, status, param)
    type Case<'a> = (&'a str, String, Option<&'a str>, u16, Option<&'a str>);
    let cases: Vec<Case<'_>> = vec![
        ("/v1/chat/completions", chat.to_string(), None, 401, None),
        ("/v1/chat/completions", chat.to_string(), Some("wrong"), 401, None),
        ("/v1/chat/completions", "{not json".into(), key, 400, None),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"})
                .to_string(),
            key,
            400,
            Some("temperature"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "top_p": 7}).to_string(),
            key,
            400,
            Some("top_p"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]})
                .to_string(),
            key,
            400,
            Some("tools[0].function"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": 5000}).to_string(),
            key,
            400,
            Some("prompt"),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}).to_string(),
            key,
            404,
            None,
        ),
        ("/v1/nothing", "{}".into(), key, 404, None),
        // The model name is compared, never used as a path.
        (
            "/v1/chat/completions",
            json!({"model": "../../../../etc/passwd", "messages": [{"role": "user", "content": "hi"}]})
                .to_string(),
            key,
            404,
            None,
        ),
        ("/v1/completions", "x".repeat(5000), key, 413, None),
    ];
    for (path, body, k, expect, param) in cases {
        let r = post(path, body, k).await.unwrap();
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap();
        check(status, expect, &v, path);
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{v}");
        }
    }
    // Health and metrics need no key.
    assert_eq!(c.get(s.url("/health")).send().await.unwrap().status(), 200);
    assert_eq!(c.get(s.url("/metrics")).send().await.unwrap().status(), 200);
    // Queue full: one request runs, none may wait.
    // 2000 tokens: a second or more of work, so the probe below finds it still running.
    let long = json!({"prompt": "hi", "max_tokens": 2000, "ignore_eos": true, "stream": true});
    let mut held = post("/v1/completions", long.to_string(), key)
        .await
        .unwrap();
    assert_eq!(held.status(), 200);
    assert!(held.chunk().await.unwrap().is_some());
    let r = post("/v1/chat/completions", chat.to_string(), key)
        .await
        .unwrap();
    assert_eq!(r.headers()["retry-after"], "1");
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap();
    check(status, 503, &v, "overloaded");
    drop(held);
    wait_all_free(&c, &s, Duration::from_secs(10)).await;
    let r = post("/v1/chat/completions", chat.to_string(), key)
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_concurrent_streams() {
    let s = Server::start(&[]);
    let c = reqwest::Client::new();
    // Calibrated at start (the default): the cost model is trusted before any request, and
    // the calibration's own requests are not counted.
    assert_eq!(gauge(&c, &s, "ferrum_cost_model_ready").await, 1.0);
    assert!(gauge(&c, &s, "ferrum_cost_calibration_seconds").await > 0.0);
    assert_eq!(gauge(&c, &s, "ferrum_request_success_total").await, 0.0);
    let tasks: Vec<_> = (0..300)
        .map(|i| {
            let c = c.clone();
            let url = s.url("/v1/completions");
            tokio::spawn(async move {
                let body = json!({"prompt": format!("Request number {i}"), "max_tokens": 4,
                                  "ignore_eos": true, "stream": true});
                let r = c.post(url).json(&body).send().await.unwrap();
                assert_eq!(r.status(), 200);
                r.text().await.unwrap()
            })
        })
        .collect();
    for t in tasks {
        let body = t.await.unwrap();
        let f = frames(&body);
        assert_eq!(f.last().unwrap(), "[DONE]");
        let fin: Value = serde_json::from_str(&f[f.len() - 2]).unwrap();
        assert_eq!(fin["choices"][0]["finish_reason"], "length");
    }
    wait_all_free(&c, &s, Duration::from_secs(10)).await;
    assert_eq!(gauge(&c, &s, "ferrum_request_success_total").await, 300.0);
}

/// A prompt longer than the whole KV cache is refused at admission with a 400 naming the
/// limit, at once; a request whose samples together outgrow the cache still completes (its
/// samples take turns).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_that_cannot_fit_the_kv_cache_are_refused_at_admission() {
    // 4 blocks of 16 tokens: 64 tokens in all.
    let s = Server::start(&["--num-kv-blocks", "4"]);
    let c = reqwest::Client::new();
    let long = "one two three four five six seven eight nine ten ".repeat(20);
    let t = Instant::now();
    let r = c
        .post(s.url("/v1/completions"))
        .json(&json!({"prompt": long, "max_tokens": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("64 tokens"),
        "{v}"
    );
    // Refused before any work: nothing was computed (the elapsed time is only a safety net).
    assert_eq!(gauge(&c, &s, "ferrum_generation_tokens_total").await, 0.0);
    assert!(t.elapsed() < Duration::from_secs(30));
    // 3 samples of up to 20 + 30 tokens: more than 64 together, each one fits.
    let prompt = "one two three four five six seven eight nine ten ".repeat(2);
    let r = c
        .post(s.url("/v1/completions"))
        .json(&json!({"prompt": prompt, "max_tokens": 30, "n": 3, "ignore_eos": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["choices"].as_array().unwrap().len(), 3, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 90, "{v}");
    wait_all_free(&c, &s, Duration::from_secs(10)).await;
}

/// Bursts far beyond the queue limit: every request gets a 200 or a 503 with `Retry-After`
/// and OpenAI's error JSON, the server keeps serving, and its memory does not grow with the
/// bursts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_is_refused_with_503_and_memory_stays_bounded() {
    let s = Server::start(&["--max-num-seqs", "2", "--max-waiting-requests", "4"]);
    let c = reqwest::Client::new();
    let burst = |round: usize| {
        let tasks: Vec<_> = (0..150)
            .map(|i| {
                let c = c.clone();
                let url = s.url("/v1/completions");
                tokio::spawn(async move {
                    let body = json!({"prompt": format!("Burst {round} request {i}"),
                                      "max_tokens": 8, "ignore_eos": true, "stream": i % 2 == 0});
                    let r = c.post(url).json(&body).send().await.unwrap();
                    let status = r.status().as_u16();
                    let retry = r.headers().get("retry-after").cloned();
                    let text = r.text().await.unwrap();
                    (status, retry, text)
                })
            })
            .collect::<Vec<_>>();
        async move {
            let mut ok = 0;
            let mut refused = 0;
            for t in tasks {
                let (status, retry, text) = t.await.unwrap();
                match status {
                    200 => ok += 1,
                    503 => {
                        refused += 1;
                        assert_eq!(retry.unwrap(), "1");
                        let v: Value = serde_json::from_str(&text).unwrap();
                        assert_eq!(v["error"]["code"], "overloaded", "{v}");
                    }
                    other => panic!("status {other}: {text}"),
                }
            }
            (ok, refused)
        }
    };
    let (ok, refused) = burst(0).await;
    assert!(ok >= 6 && refused > 0, "{ok} served, {refused} refused");
    wait_all_free(&c, &s, Duration::from_secs(20)).await;
    // The heap in use, not resident memory: pages the allocator keeps or a parallel build
    // evicts and faults back in move resident memory by tens of MiB on a loaded machine.
    let heap = "ferrum_heap_in_use_bytes";
    let before = gauge(&c, &s, heap).await;
    for round in 1..=3 {
        let (ok, refused) = burst(round).await;
        assert!(ok >= 6 && refused > 0, "{ok} served, {refused} refused");
        wait_all_free(&c, &s, Duration::from_secs(20)).await;
    }
    let after = gauge(&c, &s, heap).await;
    assert!(
        after < before + f64::from(32 << 20),
        "the heap in use grew from {:.1} to {:.1} MiB over three bursts",
        before / f64::from(1 << 20),
        after / f64::from(1 << 20)
    );
    // Still serving.
    let r = c
        .post(s.url("/v1/completions"))
        .json(&json!({"prompt": "hi", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// A chat template that asks for tens of gigabytes when a message says "boom": the render
/// fails with a 400 (its worker process hits its memory cap and dies), the server itself
/// stays small and healthy, and the next chat request gets a fresh worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_chat_template_cannot_take_the_server_down() {
    let src = PathBuf::from(tiny());
    let dir = std::env::temp_dir().join(format!("ferrum-hostile-template-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    std::fs::write(
        dir.join("chat_template.jinja"),
        "{% if 'boom' in messages[-1].content %}{{ (range(100000) * 30000)|list|length }}{% endif %}\
         {% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
    )
    .unwrap();
    let s = Server::start_model(dir.to_str().unwrap(), &["--num-kv-blocks", "64"]);
    let c = reqwest::Client::new();
    let chat = |text: &str| {
        c.post(s.url("/v1/chat/completions"))
            .json(&json!({"messages": [{"role": "user", "content": text}], "max_tokens": 2}))
            .send()
    };
    assert_eq!(chat("hello").await.unwrap().status(), 200);
    let t = Instant::now();
    let r = chat("boom").await.unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("memory"), "{msg}");
    assert!(t.elapsed() < Duration::from_secs(15));
    assert!(s.rss() < 512 << 20, "server RSS {} MiB", s.rss() >> 20);
    assert_eq!(chat("hello again").await.unwrap().status(), 200);
    assert_eq!(c.get(s.url("/health")).send().await.unwrap().status(), 200);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--api-key-role` keys are accepted beside `--api-key` (each standing for its class and
/// tenant), others are refused; a role naming an unknown class stops the server at start.
#[tokio::test]
async fn api_key_roles_are_keys_too() {
    let s = Server::start(&[
        "--api-key",
        "plain",
        "--slo-class",
        "chat:60000:2000",
        "--api-key-role",
        "team-a:class=chat:tenant=a",
        "--scheduling",
        "fair",
    ]);
    let c = reqwest::Client::new();
    let body = json!({"model": "tiny", "prompt": "hi", "max_tokens": 2, "user": "b"}).to_string();
    for (key, status) in [("plain", 200), ("team-a", 200), ("team-b", 401)] {
        let r = c
            .post(s.url("/v1/completions"))
            .header("content-type", "application/json")
            .bearer_auth(key)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{key}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ferrum"))
        .args([
            "serve",
            "--model",
            &common::tiny(),
            "--api-key-role",
            "k:class=none",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--api-key-role"),
        "{err}"
    );
}
