//! Shared helpers of the models crate's end-to-end tests.
#![allow(dead_code, clippy::unwrap_used)]

use ferrum_models::{load_model, ForwardBatch, KvCache, LoadOptions, Model, SafetensorsFile};
use ferrum_runtime::cpu::{KvDtype, MatmulPrecision};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};

pub mod gpu;

/// `tests/fixtures/`, its packed files unpacked (`ferrum_testdata`).
pub fn fixtures() -> PathBuf {
    ferrum_testdata::fixtures()
}

/// A real model file fetched by a script: `$env` if set, else `models/<file>`. `None` (the
/// tests skip) when it is absent, except under CI (`CI` set), where that is a failure that
/// names `fetch`, the command that brings it.
pub fn real_model(env: &str, file: &str, fetch: &str) -> Option<PathBuf> {
    let path = std::env::var_os(env)
        .map_or_else(|| fixtures().join("../../models").join(file), PathBuf::from);
    if path.is_file() {
        return Some(path);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{} is missing: run {fetch}",
        path.display()
    );
    eprintln!("skipping: {} is missing (run {fetch})", path.display());
    None
}

/// A fresh scratch folder for one test.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrum-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Loads with the float reference path: the reference tests hold it to tight bounds.
pub fn load(path: &Path) -> Model {
    load_with(path, MatmulPrecision::Float)
}

pub fn load_with(path: &Path, precision: MatmulPrecision) -> Model {
    load_kv(path, precision, None)
}

/// Loads with a KV cache type (`None`: auto).
pub fn load_kv(path: &Path, precision: MatmulPrecision, kv: Option<KvDtype>) -> Model {
    load_model(
        path,
        &LoadOptions {
            output_vocab: None,
            num_threads: Some(2),
            precision,
            kv_cache_dtype: kv,
            pool: None,
            cuda_graphs: Default::default(),
            kernels: None,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

pub fn reference_json(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap()
}

/// A float tensor of a reference safetensors file, as f32.
pub fn reference_tensor(file: &Path, name: &str) -> (Vec<usize>, Vec<f32>) {
    let st = SafetensorsFile::open(file).unwrap();
    let t = st.tensor(name).unwrap().unwrap();
    (t.shape().to_vec(), t.to_f32_vec())
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// A cache big enough for `max_tokens` tokens of one sequence, in blocks of `block_size`.
pub fn cache(model: &mut Model, max_tokens: usize, block_size: usize) -> KvCache {
    model
        .new_kv_cache(max_tokens.div_ceil(block_size) + 1, block_size)
        .unwrap()
}

/// Logits at every position of `prompt` in one pass: `[len, vocab]`.
pub fn prompt_logits(model: &mut Model, prompt: &[u32]) -> Vec<f32> {
    let bs = 16;
    let mut kv = cache(model, prompt.len(), bs);
    // A scrambled block table: attention must follow it, not assume contiguity.
    let table: Vec<u32> = (0..kv.num_blocks() as u32).rev().collect();
    let mut b = ForwardBatch::new();
    b.push_seq(prompt, 0, &table, bs, 0).unwrap();
    b.logits_indices = (0..prompt.len() as u32).collect();
    model.forward(&b, &mut kv).unwrap().to_vec()
}

pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy continuation: one prefill, then one decode step per token.
pub fn greedy(model: &mut Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let bs = 16;
    let mut kv = cache(model, prompt.len() + n, bs);
    let table: Vec<u32> = (0..kv.num_blocks() as u32).collect();
    let mut b = ForwardBatch::new();
    b.push_seq(prompt, 0, &table, bs, 1).unwrap();
    let mut out = Vec::new();
    let mut next = argmax(model.forward(&b, &mut kv).unwrap());
    out.push(next);
    while out.len() < n {
        b.clear();
        let done = prompt.len() + out.len() - 1;
        b.push_seq(&[next], done, &table, bs, 1).unwrap();
        next = argmax(model.forward(&b, &mut kv).unwrap());
        out.push(next);
    }
    out
}

/// Largest |a - b| and largest |b|.
pub fn max_err(a: &[f32], b: &[f32]) -> (f32, f32) {
    assert_eq!(a.len(), b.len());
    let err = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let scale = b.iter().map(|x| x.abs()).fold(0f32, f32::max);
    (err, scale)
}

/// One case of a recorded llama.cpp greedy run, replayed by a model.
pub struct Agreement {
    pub name: String,
    /// Tokens equal to llama.cpp's before the first difference.
    pub agree: usize,
    pub got: Vec<u32>,
    pub want: Vec<u32>,
    /// llama.cpp's top-2 logit gap at each step (empty where the file records none).
    pub gaps: Vec<f32>,
}

/// Replays every case of a `llamacpp_greedy.json` (prompt ids, llama.cpp's greedy ids and
/// optionally its top-2 gaps) with `model`'s greedy decoding, printing how far each agrees.
pub fn llamacpp_agreement(model: &mut Model, file: &Path) -> Vec<Agreement> {
    let cases: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let cases = cases["cases"].as_array().unwrap();
    cases
        .iter()
        .map(|case| {
            let want = ids(&case["generated_ids"]);
            let got = greedy(model, &ids(&case["prompt_ids"]), want.len());
            let agree = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
            let name = case["name"].as_str().unwrap().to_owned();
            eprintln!("{name}: {agree} of {} tokens as llama.cpp", want.len());
            let gaps = case["top2_gaps"].as_array().map_or_else(Vec::new, |g| {
                g.iter().map(|v| v.as_f64().unwrap() as f32).collect()
            });
            Agreement {
                name,
                agree,
                got,
                want,
                gaps,
            }
        })
        .collect()
}

/// Replays `file`'s llama.cpp greedy runs: each case agrees to the end, or parts where
/// llama.cpp's own top-2 gap is below `near_tie`; at least `min_whole` agree to the end.
pub fn assert_follows_llamacpp(model: &mut Model, file: &Path, near_tie: f32, min_whole: usize) {
    let mut whole = 0;
    for c in llamacpp_agreement(model, file) {
        if c.agree == c.want.len() {
            whole += 1;
        } else {
            assert!(
                c.gaps[c.agree] < near_tie,
                "{}: parts from llama.cpp at token {} where its top-2 gap is {}: {:?} vs {:?}",
                c.name,
                c.agree,
                c.gaps[c.agree],
                c.got,
                c.want
            );
        }
    }
    assert!(whole >= min_whole, "only {whole} prompts agree to the end");
}

/// `(name, dtype, shape, bytes)` of every tensor of a safetensors file.
pub fn read_safetensors(path: &Path) -> Vec<(String, String, Value, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header
        .into_iter()
        .filter(|(k, _)| k != "__metadata__")
        .map(|(name, v)| {
            let off = &v["data_offsets"];
            let (a, b) = (
                off[0].as_u64().unwrap() as usize,
                off[1].as_u64().unwrap() as usize,
            );
            let data = bytes[8 + n + a..8 + n + b].to_vec();
            (
                name,
                v["dtype"].as_str().unwrap().to_string(),
                v["shape"].clone(),
                data,
            )
        })
        .collect()
}

/// Writes `tensors` (`(name, dtype, shape, bytes)`) as a safetensors file.
pub fn write_safetensors(path: &Path, tensors: &[(String, String, Value, Vec<u8>)]) {
    let mut header = Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let start = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut text = Value::Object(header).to_string().into_bytes();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&data);
    std::fs::write(path, out).unwrap();
}

/// Little-endian f32 values rounded to f16 ([`f32_to_f16`]), as little-endian bytes.
pub fn f32_bytes_to_f16(bytes: &[u8]) -> Vec<u8> {
    bytes
        .chunks_exact(4)
        .flat_map(|c| f32_to_f16(f32::from_le_bytes(c.try_into().unwrap())).to_le_bytes())
        .collect()
}

/// Round-to-nearest f32 -> f16 for normal values (the fixture's weights are all in range).
pub fn f32_to_f16(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    let mant = bits & 0x7f_ffff;
    if v == 0.0 || exp <= 0 {
        return sign;
    }
    assert!(exp < 31, "{v} overflows f16");
    let mut h = ((exp as u32) << 10) | (mant >> 13);
    let rest = mant & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && h & 1 == 1) {
        h += 1;
    }
    sign | h as u16
}
