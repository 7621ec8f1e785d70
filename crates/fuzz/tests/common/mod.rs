//! Shared by the fuzz targets: fixture paths and a minimal GGUF writer for seeds.
#![allow(dead_code)]

use std::path::PathBuf;

/// `tests/fixtures/`, its packed files unpacked (`ferrum_testdata`).
pub fn fixtures() -> PathBuf {
    ferrum_testdata::fixtures()
}

/// llama.cpp's vocabulary GGUF `ggml-vocab-<name>.gguf` as a fuzz seed; `None` outside CI when
/// `scripts/fetch-vocab.sh` has not fetched it (the target runs on its other seeds).
pub fn vocab_seed(name: &str) -> Option<Vec<u8>> {
    let p = ferrum_testdata::vocab(name)?;
    Some(std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
}

pub fn read(rel: &str) -> Vec<u8> {
    let p = fixtures().join(rel);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A GGUF metadata value.
pub enum Val {
    U32(u32),
    F32(f32),
    Bool(bool),
    Str(&'static str),
    StrArray(Vec<&'static str>),
    F32Array(Vec<f32>),
    I32Array(Vec<i32>),
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A version-3 GGUF file: `meta`, then `tensors` as (name, GGUF dims, ggml type, data bytes),
/// data 32-byte aligned.
pub fn gguf(meta: &[(&str, Val)], tensors: &[(&str, Vec<u64>, u32, Vec<u8>)]) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    for (k, v) in meta {
        put_str(&mut out, k);
        match v {
            Val::U32(x) => {
                out.extend_from_slice(&4u32.to_le_bytes());
                out.extend_from_slice(&x.to_le_bytes());
            }
            Val::F32(x) => {
                out.extend_from_slice(&6u32.to_le_bytes());
                out.extend_from_slice(&x.to_le_bytes());
            }
            Val::Bool(x) => {
                out.extend_from_slice(&7u32.to_le_bytes());
                out.push(u8::from(*x));
            }
            Val::Str(s) => {
                out.extend_from_slice(&8u32.to_le_bytes());
                put_str(&mut out, s);
            }
            Val::StrArray(a) => {
                out.extend_from_slice(&9u32.to_le_bytes());
                out.extend_from_slice(&8u32.to_le_bytes());
                out.extend_from_slice(&(a.len() as u64).to_le_bytes());
                for s in a {
                    put_str(&mut out, s);
                }
            }
            Val::F32Array(a) => {
                out.extend_from_slice(&9u32.to_le_bytes());
                out.extend_from_slice(&6u32.to_le_bytes());
                out.extend_from_slice(&(a.len() as u64).to_le_bytes());
                for x in a {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
            Val::I32Array(a) => {
                out.extend_from_slice(&9u32.to_le_bytes());
                out.extend_from_slice(&5u32.to_le_bytes());
                out.extend_from_slice(&(a.len() as u64).to_le_bytes());
                for x in a {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
    }
    let mut offset = 0u64;
    for (name, dims, ty, data) in tensors {
        put_str(&mut out, name);
        out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&ty.to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offset += (data.len() as u64).div_ceil(32) * 32;
    }
    while !out.len().is_multiple_of(32) {
        out.push(0);
    }
    for (_, _, _, data) in tensors {
        let start = out.len();
        out.extend_from_slice(data);
        while !(out.len() - start).is_multiple_of(32) {
            out.push(0);
        }
    }
    out
}

/// A complete one-layer llama GGUF (f32, hidden 8, vocab 4, with a tiny SentencePiece vocab).
pub fn tiny_llama_gguf() -> Vec<u8> {
    let f32s = |n: usize| -> Vec<u8> {
        (0..n)
            .flat_map(|i| ((i % 7) as f32 * 0.01).to_le_bytes())
            .collect()
    };
    let (h, ff, v) = (8u64, 16u64, 4u64);
    let mut tensors = vec![
        ("token_embd.weight", vec![h, v], 0, f32s((h * v) as usize)),
        ("output_norm.weight", vec![h], 0, f32s(h as usize)),
    ];
    for (name, dims) in [
        ("blk.0.attn_norm.weight", vec![h]),
        ("blk.0.ffn_norm.weight", vec![h]),
        ("blk.0.attn_q.weight", vec![h, h]),
        ("blk.0.attn_k.weight", vec![h, h / 2]),
        ("blk.0.attn_v.weight", vec![h, h / 2]),
        ("blk.0.attn_output.weight", vec![h, h]),
        ("blk.0.ffn_gate.weight", vec![h, ff]),
        ("blk.0.ffn_up.weight", vec![h, ff]),
        ("blk.0.ffn_down.weight", vec![ff, h]),
    ] {
        let n: u64 = dims.iter().product();
        tensors.push((name, dims, 0, f32s(n as usize)));
    }
    gguf(
        &[
            ("general.architecture", Val::Str("llama")),
            ("general.alignment", Val::U32(32)),
            ("llama.block_count", Val::U32(1)),
            ("llama.context_length", Val::U32(64)),
            ("llama.embedding_length", Val::U32(h as u32)),
            ("llama.feed_forward_length", Val::U32(ff as u32)),
            ("llama.attention.head_count", Val::U32(2)),
            ("llama.attention.head_count_kv", Val::U32(1)),
            ("llama.attention.layer_norm_rms_epsilon", Val::F32(1e-5)),
            ("llama.rope.freq_base", Val::F32(10000.0)),
            ("tokenizer.ggml.model", Val::Str("llama")),
            (
                "tokenizer.ggml.tokens",
                Val::StrArray(vec!["<unk>", "<s>", "</s>", "▁a"]),
            ),
            (
                "tokenizer.ggml.scores",
                Val::F32Array(vec![0.0, 0.0, 0.0, -1.0]),
            ),
            ("tokenizer.ggml.token_type", Val::I32Array(vec![2, 3, 3, 1])),
            ("tokenizer.ggml.bos_token_id", Val::U32(1)),
            ("tokenizer.ggml.eos_token_id", Val::U32(2)),
            (
                "tokenizer.chat_template",
                Val::Str("{% for m in messages %}{{ m.content }}{% endfor %}"),
            ),
            ("general.name", Val::Bool(true)),
        ],
        &tensors,
    )
}

/// Encodes and decodes a few texts; any clean error is an outcome.
pub fn exercise(tok: &ferrum_tokenizer::Tokenizer) -> String {
    let mut out = String::from("built");
    for text in [
        "Hello world! 123",
        " ünïcödé\t\n  spaces",
        "<s></s><|im_start|>",
        "",
    ] {
        match tok.encode(text, true) {
            Ok(ids) => {
                let _ = tok.decode(&ids, false);
            }
            Err(e) => out = e.to_string(),
        }
    }
    let n = tok.vocab_size() as u32;
    let ids: Vec<u32> = (0..n.min(64))
        .chain([n.saturating_sub(1), n, u32::MAX])
        .collect();
    if let Err(e) = tok.decode(&ids, true) {
        out = e.to_string();
    }
    out
}
