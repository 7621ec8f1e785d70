//! `ferrum bench serve` against a real `ferrum serve` on the tiny fixture: every request
//! completes with exactly --output-len tokens, the JSON report is written and read back by
//! `--compare`, and bad flags or an unreachable server give clear errors.
// The child is killed and waited for in `Server::drop`.
#![allow(clippy::unwrap_used, clippy::zombie_processes)]

mod common;

use common::{tiny, Server};
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrum"))
        .args(["bench", "serve"])
        .args(args)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ferrum-bench-serve-{}-{name}", std::process::id()))
}

#[test]
fn measures_a_real_server_and_compares() {
    let server = Server::start(&[]);
    let out = bench(&[
        "--base-url",
        &server.base,
        "--concurrency",
        "1,4",
        "--num-prompts",
        "8",
        "--input-len",
        "16",
        "--output-len",
        "8",
        "--tokenizer",
        &tiny(),
        "--label",
        "ferrum-tiny",
        "--json",
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).expect(&stdout);
    assert_eq!(v["model"], "tiny", "the model comes from /v1/models");
    assert_eq!(v["label"], "ferrum-tiny");
    assert_eq!(v["base_url"], server.base.as_str());
    assert_eq!(
        (v["input_len"].as_u64(), v["output_len"].as_u64()),
        (Some(16), Some(8))
    );
    assert_eq!(v["num_prompts"], 8);
    let levels = v["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 2);
    for (level, c) in levels.iter().zip([1, 4]) {
        let n = |k: &str| {
            level[k]
                .as_f64()
                .unwrap_or_else(|| panic!("{k} in {level}"))
        };
        assert_eq!(n("concurrency"), c as f64);
        assert_eq!((n("completed"), n("failed")), (8.0, 0.0), "{level}");
        assert_eq!(n("output_tokens"), 64.0);
        // The tokenizer makes each prompt exactly 16 tokens; the fixture adds no BOS.
        assert_eq!(n("prompt_tokens"), 8.0 * 16.0);
        assert!(n("output_tok_s") > 0.0 && n("requests_per_s") > 0.0);
        assert!(n("total_tok_s") > n("output_tok_s"));
        assert!(n("duration_s") > 0.0);
        for lat in ["ttft", "itl", "e2e", "tpot"] {
            let (p50, p90, p99) = (
                n(&format!("{lat}_ms_p50")),
                n(&format!("{lat}_ms_p90")),
                n(&format!("{lat}_ms_p99")),
            );
            assert!(0.0 <= p50 && p50 <= p90 && p90 <= p99, "{lat}: {level}");
        }
        assert!(n("ttft_ms_p50") <= n("e2e_ms_p50"));
    }
    // The saved report goes back in through --compare, next to a second copy.
    let a = tmp("a.json");
    let b = tmp("b.json");
    std::fs::write(&a, &stdout).unwrap();
    std::fs::write(&b, stdout.replace("ferrum-tiny", "other")).unwrap();
    let list = format!("{},{}", a.display(), b.display());
    let out = bench(&["--compare", &list]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert_eq!(table.lines().filter(|l| l.starts_with("other ")).count(), 2);
    assert_eq!(
        table
            .lines()
            .filter(|l| l.starts_with("ferrum-tiny "))
            .count(),
        2
    );
    for p in [a, b] {
        let _ = std::fs::remove_file(p);
    }

    // The human table: a header and one row per level.
    let out = bench(&[
        "--base-url",
        &format!("{}/v1/", server.base),
        "--model",
        "tiny",
        "--concurrency",
        "2",
        "--num-prompts",
        "3",
        "--input-len",
        "8",
        "--output-len",
        "4",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(
        table.contains("out tok/s") && table.contains("TTFT p50"),
        "{table}"
    );
    let row = table
        .lines()
        .find(|l| l.trim_start().starts_with("2 "))
        .expect(&table);
    assert!(row.split_whitespace().nth(1) == Some("3"), "{row}");

    // A wrong model name fails every request: counted, reported, and a non-zero exit.
    let out = bench(&[
        "--base-url",
        &server.base,
        "--model",
        "no-such-model",
        "--concurrency",
        "2",
        "--num-prompts",
        "2",
        "--json",
    ]);
    assert!(!out.status.success());
    let v: Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    assert_eq!(v["levels"][0]["failed"], 2);
    let err = text(&out.stderr);
    assert!(
        err.contains("every request failed") && err.contains("404"),
        "{err}"
    );
}

#[test]
fn unreachable_server_is_a_clear_error() {
    // A port that was free a moment ago.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let out = bench(&["--base-url", &url, "--num-prompts", "2"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains(&format!("cannot connect to {url}")), "{err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn bad_flags_are_clear_errors() {
    let cases: &[(&[&str], &str)] = &[
        (&["--concurrency", ""], "--concurrency"),
        (&["--concurrency", "1,0"], "--concurrency"),
        (&["--num-prompts", "0"], "--num-prompts"),
        (&["--base-url", "localhost:8000"], "--base-url"),
        (
            &["--base-url", "https://example.com"],
            "https is not supported",
        ),
        (&["--timeout", "0"], "--timeout"),
        (&["--tokenizer", "/no/such/tokenizer.json"], "no such file"),
        (&["--compare", "/no/such/x.json"], "/no/such/x.json"),
    ];
    for (args, want) in cases {
        let out = bench(args);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// A mixed workload against a server with a service-level class: an open-loop class naming
/// the class and a closed-loop tenant beside it, each reported with its goodput, percentiles
/// and chunk gaps; a class spec that cannot be read is a clear error.
#[test]
fn a_mixed_workload_reports_each_class() {
    let server = Server::start(&["--slo-class", "chat:60000:2000", "--scheduling", "slo"]);
    let out = bench(&[
        "--base-url",
        &server.base,
        "--tokenizer",
        &tiny(),
        "--duration",
        "2",
        "--class",
        "name=interactive,rate=4,input=12,output=6,ttft_ms=60000,tpot_ms=2000,slo=class:chat",
        "--class",
        "name=batch,concurrency=2,input=24,output=8,user=b",
        "--json",
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).expect(&stdout);
    let classes = v["classes"].as_array().unwrap();
    assert_eq!(classes.len(), 2);
    for c in classes {
        let (sent, done) = (
            c["sent"].as_u64().unwrap(),
            c["completed"].as_u64().unwrap(),
        );
        assert!(sent >= 1 && done == sent, "{c}");
        assert!(c["ttft_ms"]["p50"].as_f64().unwrap() > 0.0, "{c}");
        assert!(c["chunk_gap_ms"]["p99"].as_f64().is_some(), "{c}");
    }
    assert_eq!(classes[0]["goodput"].as_f64(), Some(1.0), "{}", classes[0]);
    assert_eq!(
        classes[1]["output_tokens"].as_u64(),
        Some(8 * classes[1]["completed"].as_u64().unwrap())
    );
    let out = bench(&["--base-url", &server.base, "--class", "name=x,rate=1"]);
    assert!(
        !out.status.success() && text(&out.stderr).contains("--class"),
        "{}",
        text(&out.stderr)
    );
}
