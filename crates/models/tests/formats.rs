//! Storage variants of the same weights give the reference logits: a sharded Hugging Face folder
//! (`model.safetensors.index.json`), f16 safetensors, and a GGUF written as version 2.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::{json, Map, Value};
use std::path::Path;

/// Largest error of every case's logits against the reference, relative to the largest |logit|.
fn worst_error(model_path: &Path, reference_dir: &Path) -> f32 {
    let mut model = load(model_path);
    let reference = reference_json(reference_dir);
    let mut worst = 0f32;
    for case in reference["cases"].as_array().unwrap() {
        let i = case["index"].as_u64().unwrap();
        let prompt = ids(&case["prompt_ids"]);
        let (_, want) = reference_tensor(
            &reference_dir.join("reference.safetensors"),
            &format!("logits_{i}"),
        );
        let (err, scale) = max_err(&prompt_logits(&mut model, &prompt), &want);
        worst = worst.max(err / scale);
    }
    worst
}

#[test]
fn sharded_folder_matches_the_reference() {
    let src = fixtures().join("tiny-llama");
    let dir = scratch("sharded");
    std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    let tensors = read_safetensors(&src.join("model.safetensors"));
    let (a, b): (Vec<_>, Vec<_>) = tensors.into_iter().partition(|t| t.0.contains("layers.0."));
    let mut weight_map = Map::new();
    for (file, part) in [
        ("model-00001-of-00002.safetensors", &a),
        ("model-00002-of-00002.safetensors", &b),
    ] {
        write_safetensors(&dir.join(file), part);
        for t in part {
            weight_map.insert(t.0.clone(), json!(file));
        }
    }
    let index = json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let err = worst_error(&dir, &src);
    assert!(err <= 1e-4, "sharded: {err}");
}

/// The f32 weights rounded to f16: the reference (f32 weights) is matched within the rounding
/// (f16 keeps 11 significant bits, relative error <= 2^-11 per weight, ~3e-4 RMS through the
/// model); 1e-2 of the largest logit is far above that and far below any real bug.
#[test]
fn f16_safetensors_match_within_rounding() {
    let src = fixtures().join("tiny-llama");
    let dir = scratch("f16");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    // The reference ran with f32 RoPE frequencies; keep them (see `ModelConfig::rope_table_dtype`).
    config["dtype"] = json!("float32");
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let tensors: Vec<_> = read_safetensors(&src.join("model.safetensors"))
        .into_iter()
        .map(|(name, dtype, shape, bytes)| {
            assert_eq!(dtype, "F32");
            (name, "F16".to_string(), shape, f32_bytes_to_f16(&bytes))
        })
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &tensors);
    let err = worst_error(&dir, &src);
    eprintln!("f16: worst logit error {err:.3e} of the largest logit");
    assert!(err <= 1e-2, "f16: {err}");
}

#[test]
fn gguf_version_2_loads_like_version_3() {
    let src = fixtures().join("tiny-smollm");
    let dir = scratch("v2");
    let mut bytes = std::fs::read(src.join("model-bf16.gguf")).unwrap();
    assert_eq!(&bytes[4..8], &3u32.to_le_bytes());
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let path = dir.join("v2.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let err = worst_error(&path, &src);
    assert!(err <= 1e-4, "GGUF v2: {err}");
}
