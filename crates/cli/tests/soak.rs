//! `ferrum bench soak` against a real `ferrum serve` on the tiny fixture: a random request mix
//! with a fifth of the clients disconnecting; every completed response well-formed, no 5xx,
//! every KV block free again and resident memory flat.
// The child is killed and waited for at the end of the test.
#![allow(clippy::unwrap_used, clippy::zombie_processes)]

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn soak_with_disconnects_passes_on_the_tiny_model() {
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-smollm");
    let mut server = Command::new(env!("CARGO_BIN_EXE_ferrum"))
        .args(["serve", "--model", model.to_str().unwrap(), "--port", "0"])
        .args(["--served-model-name", "tiny", "--num-kv-blocks", "512"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let err = server.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let base = loop {
        let line = rx.recv_timeout(Duration::from_secs(60)).unwrap();
        if let Some(at) = line.find("http://") {
            break line[at..].trim().to_string();
        }
    };
    let out = Command::new(env!("CARGO_BIN_EXE_ferrum"))
        .args(["bench", "soak", "--base-url", &base, "--json"])
        .args([
            "--num-requests",
            "200",
            "--concurrency",
            "32",
            "--warmup",
            "16",
        ])
        .args(["--disconnect-fraction", "0.2", "--seed", "7"])
        .output()
        .unwrap();
    let _ = server.kill();
    let _ = server.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "soak failed:\n{stdout}\n{stderr}");
    let r: Value = serde_json::from_str(stdout.trim()).unwrap();
    let n = |k: &str| r[k].as_u64().unwrap();
    assert_eq!(n("completed") + n("disconnected") + n("failed"), 200, "{r}");
    assert_eq!(n("failed"), 0, "{r}");
    assert!(n("disconnected") > 10, "{r}");
    assert!(n("completed") > 100, "{r}");
    assert_eq!(r["passed"], true, "{r}");
    assert_eq!(r["kv_blocks_free_after"], r["kv_blocks_total"], "{r}");
    assert!(r["rss_after_mib"].as_f64().unwrap() > 0.0, "{r}");
    let statuses = r["statuses"].as_object().unwrap();
    assert!(statuses.keys().all(|s| s == "200"), "{r}");
}

#[test]
fn soak_reports_an_unreachable_server() {
    let out = Command::new(env!("CARGO_BIN_EXE_ferrum"))
        .args([
            "bench",
            "soak",
            "--base-url",
            "http://127.0.0.1:9",
            "--num-requests",
            "3",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot reach"), "{stderr}");
}
