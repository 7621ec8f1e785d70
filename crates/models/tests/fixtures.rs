//! Every tiny fixture against the Hugging Face transformers reference: logits at every prompt
//! position within 1e-4 of the largest |logit|, and the 16 greedy ids exactly.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::path::Path;

fn check_fixture(dir: &Path, model_path: &Path, tolerance: f32) {
    let mut model = load(model_path);
    let reference = reference_json(dir);
    let ref_file = dir.join("reference.safetensors");
    for case in reference["cases"].as_array().unwrap() {
        let i = case["index"].as_u64().unwrap();
        let prompt = ids(&case["prompt_ids"]);
        let (shape, want) = reference_tensor(&ref_file, &format!("logits_{i}"));
        assert_eq!(shape, vec![prompt.len(), model.config().vocab_size]);
        let got = prompt_logits(&mut model, &prompt);
        let (err, scale) = max_err(&got, &want);
        eprintln!(
            "{} case {i} ({} tokens): max |logit err| {err:.3e}, max |logit| {scale:.3}, ratio {:.3e}",
            model_path.display(),
            prompt.len(),
            err / scale
        );
        assert!(
            err <= tolerance * scale,
            "{}: case {i}: logit error {err} exceeds {tolerance} x {scale}",
            model_path.display()
        );
        let greedy_ids = greedy(&mut model, &prompt, 16);
        assert_eq!(
            greedy_ids,
            ids(&case["greedy_ids"]),
            "{}: case {i} greedy",
            model_path.display()
        );
    }
}

fn fixture(name: &str) {
    let dir = fixtures().join(name);
    check_fixture(&dir, &dir, 1e-4);
}

#[test]
fn tiny_llama() {
    fixture("tiny-llama");
}

#[test]
fn tiny_llama_bf16() {
    fixture("tiny-llama-bf16");
}

#[test]
fn tiny_llama3_rope() {
    fixture("tiny-llama3-rope");
}

#[test]
fn tiny_qwen2() {
    fixture("tiny-qwen2");
}

#[test]
fn tiny_qwen3() {
    fixture("tiny-qwen3");
}

#[test]
fn tiny_mistral_swa() {
    fixture("tiny-mistral-swa");
}

#[test]
fn tiny_smollm_safetensors() {
    fixture("tiny-smollm");
}

#[test]
fn tiny_smollm_gguf_bf16() {
    let dir = fixtures().join("tiny-smollm");
    check_fixture(&dir, &dir.join("model-bf16.gguf"), 1e-4);
}
