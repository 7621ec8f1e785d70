//! Shared by the CLI's integration tests: a real `ferrum serve` child process.
#![allow(dead_code, clippy::unwrap_used, clippy::zombie_processes)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The tiny SmolLM fixture (tokenizer, chat template, safetensors).
pub fn tiny() -> String {
    ferrum_testdata::fixture("tiny-smollm")
        .to_string_lossy()
        .into_owned()
}

/// A running `ferrum serve`; killed when dropped.
pub struct Server {
    pub child: Child,
    pub base: String,
    /// The server's stderr, line by line.
    pub stderr: mpsc::Receiver<String>,
}

impl Server {
    /// The tiny fixture served as `tiny`, with 256 KV blocks unless `extra` says otherwise.
    pub fn start(extra: &[&str]) -> Server {
        Server::start_model(&tiny(), extra)
    }

    /// `model` served as `tiny` on a free port, with 256 KV blocks unless `extra` says
    /// otherwise.
    pub fn start_model(model: &str, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ferrum"))
            .args(["serve", "--model", model, "--port", "0"])
            .args(["--served-model-name", "tiny"])
            .args(if extra.contains(&"--num-kv-blocks") {
                &[][..]
            } else {
                &["--num-kv-blocks", "256"][..]
            })
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let line = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .expect("the server did not print its address");
            if let Some(at) = line.find("http://") {
                let base = line[at..].trim().to_string();
                return Server {
                    child,
                    base,
                    stderr: rx,
                };
            }
        }
    }

    /// Resident memory of the server process (VmRSS), in bytes.
    pub fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kb: u64 = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap();
        kb * 1024
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }

    /// Waits for the process to exit; its status, or `None` on timeout.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(st) = self.child.try_wait().unwrap() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A gauge from `/metrics`.
pub async fn gauge(c: &reqwest::Client, s: &Server, name: &str) -> f64 {
    let text = c
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in metrics:\n{text}"))
}

/// Polls until every KV block is free and nothing runs; panics after `timeout`.
pub async fn wait_all_free(c: &reqwest::Client, s: &Server, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let total = gauge(c, s, "ferrum_kv_blocks_total").await;
        let free = gauge(c, s, "ferrum_kv_blocks_free").await;
        let running = gauge(c, s, "ferrum_num_requests_running").await;
        if free == total && running == 0.0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "blocks not freed: {free}/{total} free, {running} running"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
