//! The `ferrum` binary end to end on the tiny fixtures.
#![allow(clippy::unwrap_used)]

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

fn fixtures() -> PathBuf {
    ferrum_testdata::fixtures()
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

/// Case `i` of a fixture's reference: its prompt as `--prompt-ids` takes it, and its greedy ids.
fn reference_case(dir: &std::path::Path, i: usize) -> (String, Value) {
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let case = &reference["cases"][i];
    let prompt: Vec<String> = case["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.to_string())
        .collect();
    (prompt.join(","), case["greedy_ids"].clone())
}

/// `ferrum run` of 16 greedy tokens after `prompt` on `device`, as JSON.
fn run_greedy_json(dir: &std::path::Path, prompt: &str, device: &str) -> Output {
    ferrum(&[
        "run",
        "--device",
        device,
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        prompt,
        "--max-tokens",
        "16",
        "--temperature",
        "0",
        "--ignore-eos",
        "--json",
    ])
}

#[test]
fn run_prints_the_reference_greedy_ids_as_json() {
    let dir = fixtures().join("tiny-qwen2");
    let (prompt, greedy_ids) = reference_case(&dir, 1);
    let out = run_greedy_json(&dir, &prompt, "cpu");
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["token_ids"], greedy_ids);
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
fn inspect_shows_gemma_particulars() {
    let path = fixtures().join("tiny-gemma3");
    let out = ferrum(&["inspect", "--model", path.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["family"], "Gemma3ForCausalLM");
    assert_eq!(v["sliding_window"], serde_json::json!([16, 16, null, 16]));
    assert_eq!(v["rope_local_theta"], 10000.0);
    assert_eq!(v["final_logit_softcapping"], 3.0);
    assert_eq!(v["hidden_act"], "gelu_pytorch_tanh");
    let table = ferrum(&["inspect", "--model", path.to_str().unwrap()]);
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(
        text.contains("16 on 3 of 4 layers (full attention: layers 2)"),
        "{text}"
    );
    assert!(text.contains("local rope        theta 10000"), "{text}");
}

#[test]
fn inspect_shows_experts() {
    let path = fixtures().join("tiny-qwen3-moe");
    let out = ferrum(&["inspect", "--model", path.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["num_experts"], 8);
    assert_eq!(v["num_experts_per_tok"], 2);
    assert_eq!(v["moe_layers"], serde_json::json!([true, false, true]));
    let table = ferrum(&["inspect", "--model", path.to_str().unwrap()]);
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(
        text.contains("2 of 8 per token (weights renormalised), expert size 32, on 2 of 3 layers"),
        "{text}"
    );
}

#[test]
fn bad_flags_get_clear_errors() {
    let model = fixtures().join("tiny-llama");
    let m = model.to_str().unwrap();
    let smol = fixtures().join("tiny-smollm");
    let s = smol.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["run", "--model", m, "--prompt-ids", "1,x"],
            "invalid value 'x'",
        ),
        (
            vec!["run", "--model", m, "--prompt-ids", "1,99999"],
            "token 99999 is outside the vocabulary",
        ),
        (
            vec![
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
            vec!["run", "--model", m, "--prompt-ids", "1", "--top-p", "1.5"],
            "--top-p",
        ),
        (
            vec![
                "run",
                "--model",
                m,
                "--prompt-ids",
                "1",
                "--temperature",
                "-1",
            ],
            "--temperature",
        ),
        (
            vec!["run", "--model", "/nonexistent/model", "--prompt-ids", "1"],
            "/nonexistent/model",
        ),
        (vec!["run", "--model", m], "give a prompt"),
        (
            vec![
                "run",
                "--model",
                m,
                "--prompt-ids",
                "1",
                "--kv-cache-dtype",
                "fp8",
                "--device",
                "cpu",
            ],
            "--kv-cache-dtype fp8 is a GPU cache",
        ),
        (
            vec![
                "run",
                "--model",
                m,
                "--prompt-ids",
                "1",
                "--kv-cache-dtype",
                "fp4",
            ],
            "invalid value 'fp4' for '--kv-cache-dtype",
        ),
        (
            vec!["run", "--model", m, "--prompt", "hi"],
            "no usable tokenizer",
        ),
        (
            vec!["run", "--model", m, "--prompt-ids", "1", "--stop", "x"],
            "stop strings need a tokenizer",
        ),
        (
            vec!["run", "--model", s, "--prompt", "", "--max-tokens", "2"],
            "the prompt is empty",
        ),
        (
            vec![
                "run",
                "--model",
                s,
                "--prompt",
                "hi",
                "--max-model-len",
                "999999",
            ],
            "max model length",
        ),
        (
            vec![
                "run",
                "--model",
                s,
                "--prompt",
                "hi",
                "--speculative-method",
                "ngram",
                "--num-speculative-tokens",
                "0",
            ],
            "--num-speculative-tokens 0 is outside 1..=16",
        ),
        (
            vec![
                "run",
                "--model",
                s,
                "--prompt",
                "hi",
                "--prompt-lookup-max",
                "3",
            ],
            "--speculative-method",
        ),
        (
            vec!["tokenize", "--model", m, "--text", "hi"],
            "tokenizer.json",
        ),
    ];
    for (args, want) in cases {
        let out = ferrum(&args);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr(&out).contains(want), "{args:?}: {}", stderr(&out));
        assert!(
            !stderr(&out).contains("panicked"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}

fn run_json(args: &[&str]) -> Value {
    let out = ferrum(args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn tokenize_prints_the_hf_ids_from_a_folder_and_a_gguf() {
    let folder = fixtures().join("tiny-smollm");
    let gguf = folder.join("model-q8_0.gguf");
    for m in [&folder, &gguf] {
        let v = run_json(&[
            "tokenize",
            "--model",
            m.to_str().unwrap(),
            "--text",
            "Hello, world!",
        ]);
        assert_eq!(v["ids"], serde_json::json!([19556, 28, 905, 17]));
    }
}

#[test]
fn text_prompts_stream_and_stop_strings_cut_the_output() {
    let m = fixtures().join("tiny-smollm/model-q8_0.gguf");
    let m = m.to_str().unwrap();
    let base = [
        "run",
        "--model",
        m,
        "--prompt",
        "Once upon a time",
        "--temperature",
        "0",
    ];
    let mut args = base.to_vec();
    args.extend(["--max-tokens", "24", "--ignore-eos", "--json"]);
    let full = run_json(&args);
    let text = full["text"].as_str().unwrap().to_string();
    assert_eq!(full["finish_reason"], "length");
    assert_eq!(full["token_ids"].as_array().unwrap().len(), 24);
    assert!(text.chars().count() > 8, "{text:?}");

    // Streaming prints the same text (plus a final newline).
    let mut args = base.to_vec();
    args.extend(["--max-tokens", "24", "--ignore-eos"]);
    let out = ferrum(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8(out.stdout.clone()).unwrap(),
        format!("{text}\n")
    );
    assert!(stderr(&out).contains("tok/s") && stderr(&out).contains("first token"));

    // A stop string taken from the middle of that text ends generation just before it.
    let chars: Vec<char> = text.chars().collect();
    let cut = chars.len() / 2;
    let stop: String = chars[cut..cut + 3].iter().collect();
    let before: String = text[..text.find(&stop).unwrap()].to_string();
    let mut args = base.to_vec();
    args.extend([
        "--max-tokens",
        "24",
        "--ignore-eos",
        "--json",
        "--stop",
        &stop,
    ]);
    let v = run_json(&args);
    assert_eq!(v["text"].as_str().unwrap(), before);
    assert_eq!(v["finish_reason"], "stop");
}

#[test]
fn same_seed_same_text() {
    let m = fixtures().join("tiny-smollm/model-q8_0.gguf");
    let m = m.to_str().unwrap();
    let go = |seed: &str| {
        run_json(&[
            "run",
            "--model",
            m,
            "--prompt",
            "Hello",
            "--temperature",
            "1.0",
            "--top-k",
            "0",
            "--top-p",
            "1",
            "--min-p",
            "0",
            "--seed",
            seed,
            "--max-tokens",
            "16",
            "--ignore-eos",
            "--json",
        ])["token_ids"]
            .clone()
    };
    assert_eq!(go("5"), go("5"));
    assert_ne!(go("5"), go("6"));
}

#[test]
fn chat_needs_a_template_and_says_so() {
    let src = fixtures().join("tiny-smollm");
    let dir = std::env::temp_dir().join(format!("ferrum-cli-notemplate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let out = ferrum(&[
        "run",
        "--model",
        dir.to_str().unwrap(),
        "--prompt",
        "hi",
        "--chat",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no chat template"),
        "{}",
        stderr(&out)
    );
    // Raw prompts still work without a template.
    let v = run_json(&[
        "run",
        "--model",
        dir.to_str().unwrap(),
        "--prompt",
        "hi",
        "--max-tokens",
        "2",
        "--ignore-eos",
        "--json",
    ]);
    assert_eq!(v["token_ids"].as_array().unwrap().len(), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn chat_runs_several_turns_from_stdin() {
    use std::io::Write;
    let m = fixtures().join("tiny-smollm/model-q8_0.gguf");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferrum"))
        .args([
            "chat",
            "--model",
            m.to_str().unwrap(),
            "--max-tokens",
            "5",
            "--seed",
            "1",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"Hi there\nAnd again\n/reset\nThird\n/exit\nnever read\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    assert_eq!(
        stdout.matches('\n').count(),
        3,
        "one answer line per turn: {stdout:?}"
    );
    assert!(stderr(&out).contains("conversation cleared"));
}

#[test]
fn hub_ids_without_network_get_a_clear_error() {
    let home = std::env::temp_dir().join(format!("ferrum-hf-home-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_ferrum"))
        .args([
            "tokenize",
            "--model",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "--text",
            "hi",
        ])
        // A closed local port stands in for a network that is not there.
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .env("HF_HOME", &home)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("could not fetch config.json"), "{err}");
    assert!(err.contains("Without network access"), "{err}");
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn offline_batch_mode_runs_every_line_through_the_engine() {
    let m = fixtures().join("tiny-smollm/model-q8_0.gguf");
    let m = m.to_str().unwrap();
    let dir = std::env::temp_dir().join(format!("ferrum-batch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("in.jsonl");
    let output = dir.join("out.jsonl");
    std::fs::write(
        &input,
        concat!(
            r#"{"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}"#,
            "\n",
            r#"{"prompt_ids": [1, 2, 3], "max_tokens": 5, "temperature": 0}"#,
            "\n",
            "\n",
            r#"{"prompt": "Hi", "chat": true, "n": 2, "max_tokens": 4, "seed": 3}"#,
            "\n",
        ),
    )
    .unwrap();
    let out = ferrum(&[
        "run",
        "--model",
        m,
        "--prompts-file",
        input.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
        "--ignore-eos",
        "--max-num-seqs",
        "2",
        "--max-num-batched-tokens",
        "8",
        "--num-kv-blocks",
        "64",
        "--block-size",
        "4",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("req/s") && stderr(&out).contains("output tok/s"),
        "{}",
        stderr(&out)
    );
    let lines: Vec<Value> = std::fs::read_to_string(&output)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0]["index"], 0);
    assert_eq!(lines[0]["token_ids"].as_array().unwrap().len(), 12);
    assert_eq!(lines[0]["finish_reason"], "length");
    assert_eq!(lines[1]["token_ids"].as_array().unwrap().len(), 5);
    let outputs = lines[2]["outputs"].as_array().unwrap();
    assert_eq!(outputs.len(), 2);
    // The batch engine and the single-prompt path agree on greedy text.
    let single = run_json(&[
        "run",
        "--model",
        m,
        "--prompt",
        "Once upon a time",
        "--temperature",
        "0",
        "--max-tokens",
        "12",
        "--ignore-eos",
        "--json",
    ]);
    assert_eq!(lines[0]["text"], single["text"]);
    assert_eq!(lines[0]["token_ids"], single["token_ids"]);
    // A bad line names its line number; bad engine flags name the flag.
    let run_file = || {
        ferrum(&[
            "run",
            "--model",
            m,
            "--prompts-file",
            input.to_str().unwrap(),
        ])
    };
    std::fs::write(&input, "{\"prompt\": 5}\n").unwrap();
    let out = run_file();
    assert!(
        stderr(&out).contains("in.jsonl:1") && stderr(&out).contains("`prompt` must be a string"),
        "{}",
        stderr(&out)
    );
    std::fs::write(&input, "{\"prompt\": \"x\", \"slo\": {\"tpot_ms\": 0}}\n").unwrap();
    let out = run_file();
    assert!(stderr(&out).contains("`slo.tpot_ms`"), "{}", stderr(&out));
    std::fs::write(
        &input,
        "{\"prompt\": \"x\", \"max_tokens\": 2, \"slo\": {\"tpot_ms\": 500}}\n",
    )
    .unwrap();
    let out = run_file();
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::write(&input, "{\"prompt\": \"x\"}\n").unwrap();
    let out = ferrum(&[
        "run",
        "--model",
        m,
        "--prompts-file",
        input.to_str().unwrap(),
        "--kv-cache-memory",
        "lots",
    ]);
    assert!(
        stderr(&out).contains("--kv-cache-memory"),
        "{}",
        stderr(&out)
    );
    let out = ferrum(&[
        "run",
        "--model",
        m,
        "--prompts-file",
        input.to_str().unwrap(),
        "--kv-offload-memory",
        "0",
    ]);
    assert!(
        !out.status.success() && stderr(&out).contains("--kv-offload-memory \"0\": expected bytes"),
        "{}",
        stderr(&out)
    );
    let out = ferrum(&[
        "run",
        "--model",
        m,
        "--prompts-file",
        input.to_str().unwrap(),
        "--block-size",
        "0",
    ]);
    assert!(stderr(&out).contains("--block-size"), "{}", stderr(&out));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bench_latency_and_throughput_report_json() {
    let model = fixtures().join("tiny-smollm/model-q8_0.gguf");
    let m = model.to_str().unwrap();
    // `bench latency --json` with these extra flags.
    let latency = |extra: &[&str]| -> Value {
        let mut args = vec![
            "bench",
            "latency",
            "--model",
            m,
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--num-iters",
            "1",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = ferrum(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let v = latency(&["--batch-size", "2"]);
    assert!(v["prefill_tok_s"].as_f64().unwrap() > 0.0);
    assert!(v["decode_tok_s"].as_f64().unwrap() > 0.0);
    assert_eq!(v["matmul_precision"], "int8");
    assert_eq!(
        v["kv_cache_dtype"], "f16",
        "auto is f16 for GGUF on the fast path"
    );
    let v = latency(&["--kv-cache-dtype", "bf16"]);
    assert_eq!(v["kv_cache_dtype"], "bf16");
    let out = ferrum(&[
        "bench",
        "throughput",
        "--model",
        m,
        "--num-prompts",
        "5",
        "--input-len",
        "8",
        "--output-len",
        "4",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["output_tok_s"].as_f64().unwrap() > 0.0);
    let rps = v["requests_per_s"].as_f64().unwrap();
    let secs = v["elapsed_s"].as_f64().unwrap();
    assert!((rps * secs - 5.0).abs() < 1e-6, "{v}");
    let bad = ferrum(&["bench", "latency", "--model", m, "--output-len", "1"]);
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("--output-len"), "{}", stderr(&bad));
}

/// `--device interpreted` runs the CUDA backend (kernels in the Triton interpreter) through the
/// whole `run` path and prints the reference's greedy ids, as the CPU does. Skipped without the
/// Triton venv (scripts/test-cuda-interpret.sh), a failure under CI.
#[test]
fn run_on_the_interpreted_device_prints_the_reference_greedy_ids() {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/triton-venv");
    if !venv.join("bin/python").is_file() && std::env::var_os("FERRUM_TRITON_PYTHON").is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI: the Triton venv is missing"
        );
        eprintln!("skipped: run scripts/test-cuda-interpret.sh");
        return;
    }
    let dir = fixtures().join("tiny-qwen2");
    let (prompt, greedy_ids) = reference_case(&dir, 1);
    let out = run_greedy_json(&dir, &prompt, "interpreted");
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["token_ids"], greedy_ids);
    // The line at start says what large products run on (the device's cuBLASLt stand-in).
    assert!(
        stderr(&out).contains("ferrum: products of more than 16 rows (bf16/f16 weights): cuBLASLt"),
        "{}",
        stderr(&out)
    );
    // --gemm cublaslt where no library opens is an error naming it; --gemm triton says so.
    let run = |gemm: &str, env: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ferrum"));
        c.args([
            "run",
            "--device",
            "interpreted",
            "--model",
            dir.to_str().unwrap(),
        ])
        .args(["--prompt-ids", &prompt, "--max-tokens", "1", "--gemm", gemm]);
        if let Some(v) = env {
            c.env("FERRUM_INTERPRETED_GEMM", v);
        }
        c.output().unwrap()
    };
    let out = run("cublaslt", Some("none"));
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--gemm cublaslt: cuBLASLt did not open"),
        "{}",
        stderr(&out)
    );
    let out = run("triton", None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the Triton kernels (--gemm triton)"),
        "{}",
        stderr(&out)
    );
}

/// Asking for a GPU where there is none is an error that says what is missing, not a panic;
/// `--device auto` quietly runs on the CPU; a device name that does not parse is refused.
#[test]
fn device_flags_fail_clearly() {
    let tiny = fixtures().join("tiny-llama");
    let tiny = tiny.to_str().unwrap();
    let base = [
        "run",
        "--model",
        tiny,
        "--prompt-ids",
        "1,2",
        "--max-tokens",
        "2",
    ];
    let with = |device: &str| {
        let mut a = base.to_vec();
        a.extend(["--device", device]);
        ferrum(&a)
    };
    let gpu_present = std::path::Path::new("/dev/nvidiactl").exists();
    if !gpu_present {
        let out = with("cuda");
        assert!(!out.status.success());
        let err = stderr(&out);
        assert!(
            err.contains("libcuda.so was not found") || err.contains("sees no device"),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
        let out = with("auto");
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let smollm = fixtures().join("tiny-smollm");
    let out = ferrum(&[
        "serve",
        "--model",
        smollm.to_str().unwrap(),
        "--device",
        "cpu",
        "--port",
        "0",
        "--gpu-memory-utilization",
        "0.5",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--gpu-memory-utilization applies to a model on a GPU"),
        "{}",
        stderr(&out)
    );
    let out = with("cuda:x");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("expected auto, cpu, cuda, cuda:N or interpreted"),
        "{}",
        stderr(&out)
    );
}
