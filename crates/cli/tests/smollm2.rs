//! `ferrum run` on the real SmolLM2-135M-Instruct GGUF: greedy raw and chat prompts answer
//! "Paris", and seeded sampling is reproducible. Needs
//! `models/SmolLM2-135M-Instruct.Q4_1.gguf` (scripts/fetch-smollm2.sh); when absent the tests
//! skip, except under CI (`CI` set), where a missing model is a failure.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::Command;

fn model() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.is_file() {
        return Some(p);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{} is missing under CI (run scripts/fetch-smollm2.sh)",
        p.display()
    );
    eprintln!(
        "skipping: {} is missing (run scripts/fetch-smollm2.sh)",
        p.display()
    );
    None
}

fn run(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ferrum"))
        .arg("run")
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {err}");
    assert!(
        err.contains("tok/s") && err.contains("first token"),
        "{err}"
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn greedy_raw_prompt_continues_with_paris() {
    let Some(m) = model() else { return };
    let out = run(&[
        "--model",
        m.to_str().unwrap(),
        "--prompt",
        "The capital of France is",
        "--temperature",
        "0",
        "--max-tokens",
        "8",
    ]);
    assert!(out.starts_with(" Paris"), "{out:?}");
}

/// The float path reproduces transformers' greedy answer. (The int8 default flips the close
/// first choice of this prompt, "The" against "L", as its stated logit bounds allow.)
#[test]
fn chat_prompt_answers_paris() {
    let Some(m) = model() else { return };
    let out = run(&[
        "--model",
        m.to_str().unwrap(),
        "--matmul-precision",
        "float",
        "--chat",
        "--prompt",
        "What is the capital of France?",
        "--temperature",
        "0",
        "--max-tokens",
        "32",
    ]);
    assert!(out.contains("Paris"), "{out:?}");
}

#[test]
fn same_seed_prints_the_same_text() {
    let Some(m) = model() else { return };
    let args = [
        "--model",
        m.to_str().unwrap(),
        "--chat",
        "--prompt",
        "Write a haiku about rust.",
        "--temperature",
        "0.8",
        "--seed",
        "1234",
        "--max-tokens",
        "24",
    ];
    let a = run(&args);
    assert_eq!(a, run(&args));
    assert!(a.trim().len() > 10, "{a:?}");
}
