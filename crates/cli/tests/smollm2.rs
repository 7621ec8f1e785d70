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

#[test]
fn structured_output_flags_constrain_the_answer() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let out = run(&[
        "--model",
        m,
        "--chat",
        "--prompt",
        "Is water wet? Answer yes or no.",
        "--choice",
        "yes,no",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        ["yes", "no"].contains(&v["text"].as_str().unwrap()),
        "{out}"
    );
    assert_eq!(v["finish_reason"], "stop", "{out}");
    let dir = std::env::temp_dir().join(format!("ferrum-cli-structured-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let schema = dir.join("city.json");
    std::fs::write(
        &schema,
        r#"{"type":"object","properties":{"city":{"type":"string"},"population":{"type":"integer"}},
            "required":["city","population"],"additionalProperties":false}"#,
    )
    .unwrap();
    let out = run(&[
        "--model",
        m,
        "--chat",
        "--prompt",
        "Paris as JSON.",
        "--json-schema",
        schema.to_str().unwrap(),
        "--temperature",
        "0",
        "--max-tokens",
        "80",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(v["city"].is_string() && v["population"].is_i64(), "{out}");
    let grammar = dir.join("list.gbnf");
    std::fs::write(
        &grammar,
        "root ::= item{2}\nitem ::= \"- \" [a-z]+ \"\\n\"\n",
    )
    .unwrap();
    let out = run(&[
        "--model",
        m,
        "--prompt",
        "Two fruits:\n",
        "--grammar",
        grammar.to_str().unwrap(),
        "--temperature",
        "0",
        "--max-tokens",
        "40",
    ]);
    let lines: Vec<&str> = out.trim_end().lines().collect();
    assert_eq!(lines.len(), 2, "{out:?}");
    assert!(
        lines
            .iter()
            .all(|l| l.starts_with("- ") && l[2..].chars().all(|c| c.is_ascii_lowercase())),
        "{out:?}"
    );
    // A constraint that does not compile, and two at once, are errors naming the problem.
    for (args, what) in [
        (vec!["--regex", "("], "the regex cannot be used"),
        (vec!["--regex", "a", "--choice", "b"], "cannot be used with"),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_ferrum"))
            .args(["run", "--model", m, "--prompt", "x"])
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(what), "{args:?}: {err}");
    }
}
