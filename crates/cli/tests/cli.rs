//! The `ferrum` binary end to end on the tiny fixtures.
#![allow(clippy::unwrap_used)]

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn ferrum(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrum"))
        .args(args)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn run_prints_the_reference_greedy_ids_as_json() {
    let dir = fixtures().join("tiny-qwen2");
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let case = &reference["cases"][1];
    let prompt: Vec<String> = case["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.to_string())
        .collect();
    let out = ferrum(&[
        "run",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        &prompt.join(","),
        "--max-tokens",
        "16",
        "--temperature",
        "0",
        "--ignore-eos",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["token_ids"], case["greedy_ids"]);
    assert_eq!(v["finish_reason"], "length");
}

#[test]
fn inspect_describes_a_gguf() {
    let path = fixtures().join("tiny-smollm/model-q8_0.gguf");
    let out = ferrum(&["inspect", "--model", path.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["architecture"], "llama");
    assert_eq!(v["num_hidden_layers"], 2);
    assert_eq!(v["vocab_size"], 49152);
    assert_eq!(v["has_tokenizer"], true);
    assert_eq!(v["has_chat_template"], true);
    let dtypes: Vec<&str> = v["dtypes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["dtype"].as_str().unwrap())
        .collect();
    assert!(dtypes.contains(&"Q8_0"), "{dtypes:?}");
    let table = ferrum(&["inspect", "--model", path.to_str().unwrap()]);
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(text.contains("GGUF v3") && text.contains("Q8_0"), "{text}");
}

#[test]
fn bad_flags_get_clear_errors() {
    let model = fixtures().join("tiny-llama");
    let m = model.to_str().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (
            &["run", "--model", m, "--prompt-ids", "1,x"],
            "invalid value 'x'",
        ),
        (
            &[
                "run",
                "--model",
                m,
                "--prompt-ids",
                "1,2",
                "--temperature",
                "0.7",
            ],
            "--temperature 0.7",
        ),
        (
            &["run", "--model", m, "--prompt-ids", "1,99999"],
            "token 99999 is outside the vocabulary",
        ),
        (
            &[
                "run",
                "--model",
                m,
                "--prompt-ids",
                "1",
                "--max-tokens",
                "0",
            ],
            "--max-tokens",
        ),
        (
            &["run", "--model", "/nonexistent/model", "--prompt-ids", "1"],
            "/nonexistent/model",
        ),
    ];
    for (args, want) in cases {
        let out = ferrum(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr(&out).contains(want), "{args:?}: {}", stderr(&out));
        assert!(
            !stderr(&out).contains("panicked"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}
