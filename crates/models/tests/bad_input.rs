//! Bad model files and configs give clear errors naming the file, key or tensor: truncated
//! files, missing or misshapen tensors, unknown architectures and quant types, config keys of
//! the wrong type, and headers that claim more than the file holds.
#![allow(clippy::unwrap_used)]

mod common;

use common::{fixtures, scratch};
use ferrum_models::{inspect, load_model, LoadOptions, ModelError};
use serde_json::Value;
use std::path::Path;

fn load_err(path: &Path) -> String {
    let err = load_model(
        path,
        &LoadOptions {
            num_threads: Some(1),
            ..LoadOptions::default()
        },
    )
    .unwrap_err();
    let msg = err.to_string();
    eprintln!("{msg}");
    msg
}

/// Copies tiny-llama into `dir`, letting `edit` change config.json and the safetensors header.
fn edited_llama(
    dir: &Path,
    edit_config: impl FnOnce(&mut Value),
    edit_header: impl FnOnce(&mut Value),
) {
    let src = fixtures().join("tiny-llama");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit_config(&mut config);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit_header(&mut header);
    let mut text = header.to_string().into_bytes();
    while text.len() < n {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(dir.join("model.safetensors"), out).unwrap();
}

#[test]
fn truncated_gguf_names_the_file_and_what_is_cut() {
    let dir = scratch("bad-trunc-gguf");
    let bytes = std::fs::read(fixtures().join("tiny-smollm/model-q8_0.gguf")).unwrap();
    let path = dir.join("cut.gguf");
    // Inside the magic, the header counts, the metadata (vocabulary), and the tensor data.
    for cut in [2, 20, 1000, 500_000, bytes.len() - 100] {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let msg = load_err(&path);
        assert!(msg.contains("cut.gguf"), "{msg}");
        assert!(
            msg.contains("truncated") || msg.contains("bad magic"),
            "cut at {cut}: {msg}"
        );
    }
}

#[test]
fn truncated_safetensors_names_the_file() {
    let dir = scratch("bad-trunc-st");
    let src = fixtures().join("tiny-llama");
    std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    for cut in [4, 100, bytes.len() - 1] {
        std::fs::write(dir.join("model.safetensors"), &bytes[..cut]).unwrap();
        let msg = load_err(&dir);
        assert!(
            msg.contains("model.safetensors") && msg.contains("truncated"),
            "{msg}"
        );
    }
}

#[test]
fn missing_tensor_is_named() {
    let dir = scratch("bad-missing");
    edited_llama(
        &dir,
        |_| {},
        |h| {
            h.as_object_mut()
                .unwrap()
                .remove("model.layers.1.mlp.up_proj.weight");
        },
    );
    let msg = load_err(&dir);
    assert!(
        msg.contains("missing tensor `model.layers.1.mlp.up_proj.weight`"),
        "{msg}"
    );
}

#[test]
fn misshapen_tensor_is_named_with_both_shapes() {
    let dir = scratch("bad-shape");
    edited_llama(
        &dir,
        |_| {},
        |h| {
            h["model.layers.0.self_attn.q_proj.weight"]["shape"] = serde_json::json!([32, 128]);
        },
    );
    let msg = load_err(&dir);
    assert!(
        msg.contains(
            "`model.layers.0.self_attn.q_proj.weight` has shape [32, 128], expected [64, 64]"
        ),
        "{msg}"
    );
}

#[test]
fn shape_that_disagrees_with_data_size_is_refused() {
    let dir = scratch("bad-shape-size");
    edited_llama(
        &dir,
        |_| {},
        |h| {
            h["model.norm.weight"]["shape"] = serde_json::json!([1152921504606846976u64, 16]);
        },
    );
    let msg = load_err(&dir);
    assert!(
        msg.contains("model.norm.weight") && msg.contains("does not match"),
        "{msg}"
    );
}

#[test]
fn unknown_architecture_is_named_with_the_supported_ones() {
    let dir = scratch("bad-arch");
    edited_llama(
        &dir,
        |c| c["architectures"] = serde_json::json!(["GPT2LMHeadModel"]),
        |_| {},
    );
    let msg = load_err(&dir);
    assert!(
        msg.contains("unknown architecture `GPT2LMHeadModel`") && msg.contains("LlamaForCausalLM"),
        "{msg}"
    );
}

#[test]
fn config_key_of_the_wrong_type_is_named() {
    let dir = scratch("bad-key");
    edited_llama(
        &dir,
        |c| c["num_hidden_layers"] = serde_json::json!("two"),
        |_| {},
    );
    let msg = load_err(&dir);
    assert!(
        msg.contains("config.json") && msg.contains("`num_hidden_layers`"),
        "{msg}"
    );
    edited_llama(
        &dir,
        |c| c["rope_parameters"] = serde_json::json!(10000),
        |_| {},
    );
    let msg = load_err(&dir);
    assert!(
        msg.contains("`rope_parameters`") && msg.contains("object"),
        "{msg}"
    );
}

#[test]
fn unsupported_safetensors_dtype_is_named() {
    let dir = scratch("bad-st-dtype");
    edited_llama(
        &dir,
        |_| {},
        |h| {
            // Same byte size (4): I32 instead of F32.
            h["model.norm.weight"]["dtype"] = serde_json::json!("I32");
        },
    );
    let msg = load_err(&dir);
    assert!(msg.contains("`model.norm.weight` has type I32"), "{msg}");
}

/// Offset of the type field of tensor `name` in a GGUF header.
fn gguf_type_offset(bytes: &[u8], name: &str) -> usize {
    let mut pat = (name.len() as u64).to_le_bytes().to_vec();
    pat.extend_from_slice(name.as_bytes());
    let at = bytes.windows(pat.len()).position(|w| w == pat).unwrap() + pat.len();
    let n_dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    at + 4 + 8 * n_dims
}

#[test]
fn unknown_quant_type_is_named() {
    let dir = scratch("bad-quant");
    let mut bytes = std::fs::read(fixtures().join("tiny-smollm/model-q8_0.gguf")).unwrap();
    let at = gguf_type_offset(&bytes, "blk.0.ffn_up.weight");
    bytes[at..at + 4].copy_from_slice(&10u32.to_le_bytes()); // Q2_K
    let path = dir.join("q2k.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let msg = load_err(&path);
    assert!(
        msg.contains("`blk.0.ffn_up.weight` has type Q2_K (ggml type 10)"),
        "{msg}"
    );
    // inspect still describes the file and lists the type it cannot size.
    let info = inspect(&path).unwrap();
    assert!(info
        .dtypes
        .iter()
        .any(|d| d.dtype == "Q2_K" && d.num_bytes.is_none()));
    bytes[at..at + 4].copy_from_slice(&4000u32.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let msg = load_err(&path);
    assert!(msg.contains("unknown (ggml type 4000)"), "{msg}");
}

#[test]
fn huge_counts_in_a_gguf_header_are_refused_before_allocating() {
    let dir = scratch("bad-huge");
    let path = dir.join("huge.gguf");
    let header = |tensors: u64, kvs: u64| {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&tensors.to_le_bytes());
        b.extend_from_slice(&kvs.to_le_bytes());
        b
    };
    std::fs::write(&path, header(1 << 60, 0)).unwrap();
    let msg = load_err(&path);
    assert!(
        msg.contains("tensor count 1152921504606846976") && msg.contains("cannot fit"),
        "{msg}"
    );
    // A string claiming 2^60 bytes.
    let mut b = header(0, 1);
    b.extend_from_slice(&(1u64 << 60).to_le_bytes());
    std::fs::write(&path, &b).unwrap();
    assert!(load_err(&path).contains("cannot fit"));
    // An array claiming 2^60 elements.
    let mut b = header(0, 1);
    b.extend_from_slice(&3u64.to_le_bytes());
    b.extend_from_slice(b"key");
    b.extend_from_slice(&9u32.to_le_bytes());
    b.extend_from_slice(&4u32.to_le_bytes());
    b.extend_from_slice(&(1u64 << 60).to_le_bytes());
    std::fs::write(&path, &b).unwrap();
    assert!(load_err(&path).contains("cannot fit"));
}

#[test]
fn a_tensor_claiming_2_pow_60_elements_is_refused() {
    let dir = scratch("bad-huge-tensor");
    let mut bytes = std::fs::read(fixtures().join("tiny-smollm/model-q8_0.gguf")).unwrap();
    let at = gguf_type_offset(&bytes, "output_norm.weight");
    // The 1-D tensor's only dimension sits just before its type.
    bytes[at - 8..at].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let path = dir.join("big.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let msg = load_err(&path);
    assert!(msg.contains("output_norm.weight"), "{msg}");
}

#[test]
fn not_a_model_path_is_explained() {
    let dir = scratch("bad-empty");
    let msg = load_err(&dir);
    assert!(msg.contains("no *.safetensors"), "{msg}");
    let f = dir.join("notes.txt");
    std::fs::write(&f, "hello").unwrap();
    assert!(load_err(&f).contains("not a model folder"));
    let missing = load_err(&dir.join("nope.gguf"));
    assert!(missing.contains("nope.gguf"), "{missing}");
    assert!(matches!(
        load_model(&dir.join("nope.gguf"), &LoadOptions::default()),
        Err(ModelError::Io { .. })
    ));
}

/// A layer count sizes per-layer tables: one far beyond what the file holds is refused before
/// anything is allocated for it (a fuzzed GGUF once asked for 61 GB this way).
#[test]
fn a_huge_layer_count_is_refused_before_allocating() {
    let bytes = std::fs::read(fixtures().join("tiny-smollm/model-q8_0.gguf")).unwrap();
    let key = b"llama.block_count";
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("block_count key")
        + key.len();
    // The value type, then the value.
    let ty = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    assert_eq!(ty, 4, "block_count is a u32");
    let mut b = bytes.clone();
    b[at + 4..at + 8].copy_from_slice(&u32::MAX.to_le_bytes());
    let dir = scratch("bad-layers");
    let path = dir.join("layers.gguf");
    std::fs::write(&path, &b).unwrap();
    let msg = load_err(&path);
    assert!(
        msg.contains("llama.block_count") && msg.contains("at most"),
        "{msg}"
    );
    let hf = scratch("bad-layers-hf");
    edited_llama(
        &hf,
        |c| c["num_hidden_layers"] = (1u64 << 40).into(),
        |_| {},
    );
    let msg = load_err(&hf);
    assert!(
        msg.contains("num_hidden_layers") && msg.contains("at most 1024"),
        "{msg}"
    );
}

/// GPU kernels from a folder (`--kernels`) for a model on the CPU would go unused: refused,
/// named, before anything loads.
#[test]
fn gpu_kernels_for_a_cpu_model_are_refused() {
    let opts = LoadOptions {
        kernels: Some("/tmp/some-candidate".into()),
        ..LoadOptions::default()
    };
    let err = load_model(&fixtures().join("tiny-llama"), &opts)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("/tmp/some-candidate") && err.contains("on the CPU"),
        "{err}"
    );
}
