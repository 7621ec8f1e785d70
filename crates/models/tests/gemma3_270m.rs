//! The real Gemma 3 270M (Q4_K_M GGUF: Q8_0 embedding, Q5_0, Q4_K and Q6_K layers; 262,144
//! SentencePiece tokens; 15 local and 3 global layers, head dim 256, one KV head), fetched by
//! `scripts/fetch-model.sh gemma3-270m`, against llama.cpp on the same file
//! (`tests/fixtures/gemma3-270m/llamacpp.json`, made by `benchmarks/llamacpp_reference.py`):
//! tokenization of varied strings, greedy continuations of raw prompts (a base model: no chat
//! template) and the top-5 log-probabilities at the first generated position. The file is
//! looked up at `$FERRUM_GEMMA3_GGUF`, else `models/gemma-3-270m-q4_k_m.gguf`; when absent the
//! tests skip, except under CI (`CI` set), where a missing model is a failure.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use ferrum_models::load_text_assets;
use ferrum_runtime::cpu::MatmulPrecision;
use serde_json::Value;
use std::path::PathBuf;

fn model_path() -> Option<PathBuf> {
    real_model(
        "FERRUM_GEMMA3_GGUF",
        "gemma-3-270m-q4_k_m.gguf",
        "scripts/fetch-model.sh gemma3-270m",
    )
}

fn reference() -> Value {
    let p = fixtures().join("gemma3-270m/llamacpp.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// Where the engines may choose differently: Ferrum's int8 products are llama.cpp's integer
/// block dot products summed in another order, and its f16 KV cache keeps f32 queries where
/// llama.cpp rounds them. A wrong norm, rope base or window moves logits by whole units.
const NEAR_TIE: f32 = 0.25;

#[test]
fn tokenization_matches_llama_cpp() {
    let Some(path) = model_path() else { return };
    let tok = load_text_assets(&path).unwrap().tokenizer;
    let reference = reference();
    let cases = reference["tokenization"].as_array().unwrap();
    assert!(cases.len() >= 10);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        let got = tok.encode(text, true).unwrap();
        assert_eq!(got, want, "{text:?}");
    }
    for case in reference["cases"].as_array().unwrap() {
        let text = case["prompt"].as_str().unwrap();
        assert_eq!(tok.encode(text, true).unwrap(), ids(&case["prompt_ids"]));
    }
}

#[test]
fn greedy_follows_llama_cpp_up_to_near_ties() {
    let Some(path) = model_path() else { return };
    let mut model = load_with(&path, MatmulPrecision::Int8);
    let file = fixtures().join("gemma3-270m/llamacpp.json");
    // Measured: two of five to the end; the others part at llama.cpp gaps of 0.03, 0.15 and
    // 0.12 (after 15, 9 and 7 tokens).
    assert_follows_llamacpp(&mut model, &file, NEAR_TIE, 2);
}

/// log-softmax of one row, in f64.
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let z: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum();
    row.iter().map(|&l| l as f64 - max - z.ln()).collect()
}

/// Ferrum's log-probabilities of `tokens` at the last position of every reference prompt.
fn first_position_logprobs(precision: MatmulPrecision) -> Vec<Vec<f64>> {
    let path = model_path().unwrap();
    let mut model = load_with(&path, precision);
    let vocab = model.config().vocab_size;
    reference()["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| {
            let prompt = ids(&case["prompt_ids"]);
            let logits = prompt_logits(&mut model, &prompt);
            log_softmax(&logits[(prompt.len() - 1) * vocab..prompt.len() * vocab])
        })
        .collect()
}

/// `(token, log-prob)` pairs of a reference list.
fn pairs(v: &Value) -> Vec<(usize, f64)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_u64().unwrap() as usize, p[1].as_f64().unwrap()))
        .collect()
}

/// The float path (f32 products and cache) against an exact computation of the same file: a
/// float64 numpy forward of the dequantized weights (`f64_top5.json`, by
/// `benchmarks/gemma3_f64_reference.py`): the same five tokens in the same order, each
/// log-probability within 2e-3 (measured: 1e-4).
#[test]
fn float_path_equals_the_float64_reference() {
    if model_path().is_none() {
        return;
    }
    let f64_ref: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("gemma3-270m/f64_top5.json")).unwrap(),
    )
    .unwrap();
    let ours = first_position_logprobs(MatmulPrecision::Float);
    let mut worst = 0f64;
    for (case, lp) in f64_ref["cases"].as_array().unwrap().iter().zip(&ours) {
        let mut order: Vec<usize> = (0..lp.len()).collect();
        order.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]));
        for (rank, (token, want)) in pairs(&case["top5"]).into_iter().enumerate() {
            worst = worst.max((lp[token] - want).abs());
            assert!(
                (lp[token] - want).abs() < 2e-3,
                "{}: token {token}: {} vs {want}",
                case["name"],
                lp[token]
            );
            assert_eq!(order[rank], token, "{}: rank {rank}", case["name"]);
        }
    }
    eprintln!("float path: largest top-5 log-prob difference from float64 {worst:.2e}");
}

/// Both product paths against llama.cpp at the first generated position: the same most likely
/// token, and llama.cpp's five log-probabilities within 1 nat. This model is sensitive to
/// 8-bit activations: against the exact float64 computation llama.cpp's own values move by up
/// to 0.40 nats (its Q8 activations, f16 cache and GELU table), Ferrum's int8 path's by about
/// as much in other directions (measured largest difference from llama.cpp: float 0.40, int8
/// 0.35).
#[test]
fn first_position_top5_logprobs_near_llama_cpp() {
    if model_path().is_none() {
        return;
    }
    let cases = reference()["cases"].as_array().unwrap().clone();
    for precision in [MatmulPrecision::Float, MatmulPrecision::Int8] {
        let ours = first_position_logprobs(precision);
        let mut worst = 0f64;
        for (case, lp) in cases.iter().zip(&ours) {
            let want = pairs(&case["first_top5_logprobs"]);
            let top = (0..lp.len()).max_by(|&a, &b| lp[a].total_cmp(&lp[b]));
            assert_eq!(top, Some(want[0].0), "{precision:?} {}", case["name"]);
            for (token, l) in want {
                let diff = (lp[token] - l).abs();
                worst = worst.max(diff);
                assert!(
                    diff < 1.0,
                    "{precision:?} {}: token {token}: {} vs llama.cpp {l}",
                    case["name"],
                    lp[token]
                );
            }
        }
        eprintln!("{precision:?}: largest top-5 log-prob difference from llama.cpp {worst:.3}");
    }
}
