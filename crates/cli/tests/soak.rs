//! `ferrum bench soak` end to end: against a real `ferrum serve` on the tiny fixture (a random
//! request mix with a fifth of the clients disconnecting must pass: every completed response
//! well-formed, no 5xx, every KV block free again, no leak: the heap in use does not keep rising
//! round after round, and the counts add up), against a fake server whose answers are broken
//! (must fail, naming why), and against nothing.
// The child is killed and waited for at the end of the test.
#![allow(clippy::unwrap_used, clippy::zombie_processes)]

mod common;

use common::Server;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output};

fn fixture() -> PathBuf {
    ferrum_testdata::fixture("tiny-smollm")
}

fn soak(base: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrum"))
        .args(["bench", "soak", "--base-url", base])
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn soak_with_disconnects_passes_on_the_tiny_model() {
    let model = fixture();
    let server = Server::start_model(model.to_str().unwrap(), &["--num-kv-blocks", "512"]);
    let base = server.base.clone();
    let out = soak(
        &base,
        &[
            "--json",
            "--num-requests",
            "200",
            "--concurrency",
            "32",
            "--warmup",
            "64",
            // Four rounds of 50: a leak is memory that rises in each of the last three; the
            // growth of warm-up (up to 66 MiB of resident memory on a loaded machine) stops.
            "--rounds",
            "4",
            "--disconnect-fraction",
            "0.2",
            "--seed",
            "7",
            "--tokenizer",
            model.to_str().unwrap(),
        ],
    );
    drop(server);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "soak failed:\n{stdout}\n{stderr}");
    let r: Value = serde_json::from_str(stdout.trim()).unwrap();
    let n = |k: &str| r[k].as_u64().unwrap();
    assert_eq!(n("sent"), 200, "{r}");
    assert_eq!(
        n("completed") + n("disconnected") + n("failed"),
        n("sent"),
        "{r}"
    );
    assert_eq!((n("failed"), n("warmup_failed")), (0, 0), "{r}");
    assert!(n("disconnected") > 0, "{r}");
    assert!(n("completed") > 100, "{r}");
    assert!(n("output_tokens") >= n("completed"), "{r}");
    assert_eq!(r["passed"], true, "{r}");
    assert_eq!(r["problems"], serde_json::json!([]), "{r}");
    assert_eq!(r["idle_after"], true, "{r}");
    assert_eq!(r["kv_blocks_total_after"], 512.0, "{r}");
    assert_eq!(r["kv_blocks_free_after"], r["kv_blocks_total_after"], "{r}");
    assert!(r["rss_after_mib"].as_f64().unwrap() > 0.0, "{r}");
    // Ferrum exports its heap in use, and the leak check ran on it.
    assert_eq!(r["memory_watched"], "heap in use", "{r}");
    assert_eq!(r["heap_mib_by_round"].as_array().unwrap().len(), 5, "{r}");
    assert_eq!(r["leak"], false, "{r}");
    // The shared preambles of the mix reach the prefix cache.
    assert!(r["prefix_cache_hit_tokens"].as_f64().unwrap() > 0.0, "{r}");
    // Disconnected streams got their 200 before walking away; nothing else was answered.
    let statuses = r["statuses"].as_object().unwrap();
    assert!(statuses.keys().all(|s| s == "200"), "{r}");
    assert!(r["requests_per_s"].as_f64().unwrap() > 0.0, "{r}");
}

/// A one-thread HTTP server: idle gauges at /metrics, model "fake", a 500 for every chat
/// request and a completion with no `choices` for every completions request.
fn fake_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming().map_while(Result::ok) {
            answer(conn);
        }
    });
    format!("http://{addr}")
}

fn answer(mut conn: TcpStream) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut first = String::new();
    let _ = reader.read_line(&mut first);
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let _ = reader.take(length as u64).read_to_end(&mut Vec::new());
    let path = first.split(' ').nth(1).unwrap_or("");
    let (status, body) = match path {
        "/metrics" => (
            "200 OK",
            "ferrum_num_requests_running 0\nferrum_num_requests_waiting 0\n\
             ferrum_kv_blocks_total 8\nferrum_kv_blocks_free 8\n"
                .to_string(),
        ),
        "/v1/models" => ("200 OK", r#"{"data":[{"id":"fake"}]}"#.to_string()),
        "/v1/chat/completions" => (
            "500 Internal Server Error",
            r#"{"error":{"message":"boom"}}"#.to_string(),
        ),
        _ => (
            "200 OK",
            r#"{"object":"text_completion","id":"x","usage":{}}"#.to_string(),
        ),
    };
    let _ = write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
}

#[test]
fn soak_fails_on_broken_responses_and_says_why() {
    let base = fake_server();
    let out = soak(
        &base,
        &[
            "--json",
            "--num-requests",
            "40",
            "--concurrency",
            "4",
            "--warmup",
            "0",
            "--disconnect-fraction",
            "0",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("the soak failed: 40 requests failed"),
        "{stderr}"
    );
    assert!(stderr.contains("responses were 5xx"), "{stderr}");
    let r: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        (r["sent"].as_u64(), r["failed"].as_u64()),
        (Some(40), Some(40))
    );
    assert_eq!(r["passed"], false);
    let failures: Vec<&str> = r["failures"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(failures.len(), 10, "{r}");
    assert!(failures.iter().any(|f| f.contains("HTTP 500")), "{r}");
    assert!(
        failures.iter().any(|f| f.contains("malformed")),
        "{failures:?}"
    );
    let fivexx = r["statuses"]["500"].as_u64().unwrap();
    assert_eq!(fivexx + r["statuses"]["200"].as_u64().unwrap(), 40, "{r}");
}

#[test]
fn soak_reports_an_unreachable_server() {
    let out = soak("http://127.0.0.1:9", &["--num-requests", "3"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot reach"), "{stderr}");
}
