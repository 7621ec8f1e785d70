//! Every tiny fixture against the Hugging Face transformers reference: logits at every prompt
//! position within 1e-4 of the largest |logit|, and the 16 greedy ids exactly.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use ferrum_models::backend::CpuBackend;
use ferrum_models::{FamilyModel, GgufFile, Model, ModelConfig, WeightSource};
use ferrum_runtime::cpu::{KvDtype, Linear, MatmulPrecision};
use ferrum_runtime::ThreadPool;
use std::path::Path;
use std::sync::Arc;

fn check_fixture(dir: &Path, model_path: &Path, tolerance: f32) {
    check_model(dir, model_path, load(model_path), tolerance);
}

fn check_model(dir: &Path, model_path: &Path, mut model: Model, tolerance: f32) {
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

/// Phi-3: fused projections, partial rotary (12 of 16), LongRoPE: cases 0-2 stay within the
/// original 64 positions (short factors), case 3's 100-token prompt and its greedy steps take
/// the long ones.
#[test]
fn tiny_phi3() {
    fixture("tiny-phi3");
}

#[test]
fn tiny_phi3_bf16() {
    fixture("tiny-phi3-bf16");
}

/// Mixture of experts: Mixtral (top-2 of 4, renormalised), Qwen2-MoE (top-4 of 8, softmax
/// weights, a gated shared expert, q/k/v bias), Qwen3-MoE (top-2 of 8, renormalised, layer 1
/// dense, q/k norm), OLMoE (top-2 of 8, q/k norm over the whole projections).
#[test]
fn tiny_moe() {
    for name in [
        "tiny-mixtral",
        "tiny-mixtral-bf16",
        "tiny-qwen2-moe",
        "tiny-qwen2-moe-bf16",
        "tiny-qwen3-moe",
        "tiny-qwen3-moe-bf16",
        "tiny-olmoe",
        "tiny-olmoe-bf16",
    ] {
        fixture(name);
    }
}

/// llama.cpp's converter on tiny-mixtral (arch `llama` with `expert_count` 4, experts stacked
/// in `ffn_{gate,up,down}_exps`, q/k rows permuted). The reference keeps RoPE frequencies in
/// f32 (transformers 5.24), where Ferrum rounds them to a bf16 file's type for the older Llama
/// references: the test takes f32 frequencies, everything else from the file.
#[test]
fn tiny_mixtral_gguf_bf16() {
    let dir = fixtures().join("tiny-mixtral-bf16");
    let file = dir.join("model-bf16.gguf");
    let src = WeightSource::open(&file).unwrap();
    let WeightSource::Gguf(g) = &src else {
        panic!("not a GGUF file")
    };
    let mut config = ModelConfig::from_gguf(g).unwrap();
    let moe = config.moe.clone().unwrap();
    assert_eq!(
        (moe.num_experts, moe.top_k, moe.norm_topk_prob),
        (4, 2, true)
    );
    config.rope_table_dtype = None;
    let pool = Arc::new(ThreadPool::new(2).unwrap());
    let backend = CpuBackend::new(pool, Linear::new(MatmulPrecision::Float));
    let model = Model::from(FamilyModel::load_with(config, &src, backend).unwrap());
    check_model(&dir, &file, model, 1e-4);
}

#[test]
fn tiny_gemma3() {
    fixture("tiny-gemma3");
}

#[test]
fn tiny_gemma3_bf16() {
    fixture("tiny-gemma3-bf16");
}

#[test]
fn tiny_gemma2() {
    fixture("tiny-gemma2");
}

#[test]
fn tiny_gemma2_bf16() {
    fixture("tiny-gemma2-bf16");
}

/// llama.cpp's converter on tiny-gemma3 (bf16 weights, norms stored as `1 + w`). The file
/// has neither the layer pattern nor `query_pre_attn_scalar` (llama.cpp takes every 6th layer
/// as global and scales by head_dim^-1/2, so from the file alone it is a different model, as
/// the fixture's README says); those two come from the folder's config.json here, everything
/// else (shapes, ropes, window, soft-capping, the tie) from the GGUF.
#[test]
fn tiny_gemma3_gguf_bf16() {
    let dir = fixtures().join("tiny-gemma3-bf16");
    let file = dir.join("model-bf16.gguf");
    let src = WeightSource::open(&file).unwrap();
    let WeightSource::Gguf(g) = &src else {
        panic!("not a GGUF file")
    };
    let mut config = ModelConfig::from_gguf(g).unwrap();
    let from_file = config.clone();
    let hf = ModelConfig::from_hf_file(&dir.join("config.json")).unwrap();
    assert_eq!(from_file.layer_sliding_window, vec![Some(16); 4]);
    assert_eq!(from_file.rope_local_theta, Some(10000.0));
    assert_eq!(from_file.final_logit_softcap, Some(3.0));
    config.layer_sliding_window = hf.layer_sliding_window;
    config.attention_scale = hf.attention_scale;
    let pool = Arc::new(ThreadPool::new(2).unwrap());
    let backend = CpuBackend::new(pool, Linear::new(MatmulPrecision::Float));
    let model = Model::from(FamilyModel::load_with(config, &src, backend).unwrap());
    check_model(&dir, &file, model, 1e-4);
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

/// Relative RMS error of the Q8_0 weights against the same weights in bf16 (both GGUFs were
/// written by llama.cpp from one checkpoint).
fn q8_0_weight_error(dir: &Path) -> f64 {
    let q = GgufFile::open(&dir.join("model-q8_0.gguf")).unwrap();
    let b = GgufFile::open(&dir.join("model-bf16.gguf")).unwrap();
    let (mut err, mut norm) = (0f64, 0f64);
    for t in q.tensor_infos() {
        let (x, y) = (q.tensor(&t.name).unwrap(), b.tensor(&t.name).unwrap());
        for (a, b) in x.to_f32_vec().iter().zip(y.to_f32_vec()) {
            err += ((a - b) as f64).powi(2);
            norm += (b as f64).powi(2);
        }
    }
    (err / norm).sqrt()
}

/// The Q8_0 GGUF against the bf16 reference. Q8_0 rounds each weight to a step of
/// `d = max|w| / 127` per block of 32: an error uniform in `±d/2`, RMS `d / sqrt(12)`, about
/// 0.5% of the weights' RMS (measured here as `eps`). A logit sees `n` independent such
/// perturbations in series (the embedding, 7 projections per layer, the LM head), so its relative
/// RMS error is about `sqrt(n) * eps` (~2%); that is the bound on the RMS error, and 1.5 times
/// it the bound on the worst logit relative to the largest |logit|. The argmax must hold at 90%
/// of positions (the untrained model's top logits are often closer than the error).
#[test]
fn tiny_smollm_gguf_q8_0_within_quantization_error() {
    q8_0_within_quantization_error(MatmulPrecision::Float);
}

/// The fast path also rounds each activation row to 8 bits per block of 32, the same step
/// rule as the Q8_0 weights: a second error of about the weights' size at every stage, so the
/// bounds grow by sqrt(2).
#[test]
fn tiny_smollm_gguf_q8_0_int8_activations_within_quantization_error() {
    q8_0_within_quantization_error(MatmulPrecision::Int8);
}

fn q8_0_within_quantization_error(precision: MatmulPrecision) {
    let dir = fixtures().join("tiny-smollm");
    let mut model = load_with(&dir.join("model-q8_0.gguf"), precision);
    let eps = q8_0_weight_error(&dir);
    let n = 7 * model.config().num_hidden_layers + 2;
    let sources = match precision {
        MatmulPrecision::Float => 1.0,
        MatmulPrecision::Int8 => 2.0,
    };
    let rms_bound = (n as f64 * sources).sqrt() * eps;
    eprintln!(
        "q8_0 ({precision:?}): weight RMS error {eps:.3e}, {n} quantized stages, RMS bound {rms_bound:.3e}"
    );
    within_rms_bound(&mut model, &dir, rms_bound, "q8_0");
}

/// Every case of `dir`'s reference: the RMS logit error at most `rms_bound` times the RMS
/// logit, the worst logit error at most 1.5 times that relative to the largest |logit|, and the
/// reference argmax kept at 90% of positions (untrained models' top logits are often closer
/// than the error).
fn within_rms_bound(model: &mut ferrum_models::Model, dir: &Path, rms_bound: f64, label: &str) {
    let reference = reference_json(dir);
    let vocab = model.config().vocab_size;
    let (mut positions, mut same_argmax) = (0, 0);
    for case in reference["cases"].as_array().unwrap() {
        let i = case["index"].as_u64().unwrap();
        let prompt = ids(&case["prompt_ids"]);
        let (_, want) =
            reference_tensor(&dir.join("reference.safetensors"), &format!("logits_{i}"));
        let got = prompt_logits(model, &prompt);
        let (err, scale) = max_err(&got, &want);
        let rms = |v: &mut dyn Iterator<Item = f32>| {
            let (s, n) = v.fold((0f64, 0usize), |(s, n), x| (s + (x as f64).powi(2), n + 1));
            (s / n as f64).sqrt()
        };
        let rms_err = rms(&mut got.iter().zip(&want).map(|(a, b)| a - b));
        let rms_ref = rms(&mut want.iter().copied());
        eprintln!(
            "{label} case {i}: max |logit err| {err:.3e}, max |logit| {scale:.3}, ratio {:.3e}; \
             rms err / rms logit {:.3e} (bound {rms_bound:.3e})",
            err / scale,
            rms_err / rms_ref
        );
        assert!(
            rms_err <= rms_bound * rms_ref,
            "{label} case {i}: RMS logit error {rms_err} vs {rms_ref}"
        );
        assert!(
            err as f64 <= 1.5 * rms_bound * scale as f64,
            "{label} case {i}: logit error {err} vs largest logit {scale}"
        );
        for p in 0..prompt.len() {
            positions += 1;
            let row = p * vocab..(p + 1) * vocab;
            same_argmax += usize::from(argmax(&got[row.clone()]) == argmax(&want[row]));
        }
    }
    eprintln!("{label}: {same_argmax} of {positions} positions keep the reference argmax");
    assert!(
        same_argmax * 10 >= positions * 9,
        "{label}: only {same_argmax} of {positions} argmaxes agree"
    );
}

/// The fast setting on bf16 weights rounds every activation row to bf16 before each product
/// (where the CPU has AVX-512 BF16; elsewhere it keeps f32), and by default keeps the KV cache
/// in bf16 (the checkpoint's type): a relative error uniform in `±2^-9` per value, RMS
/// `2^-9 / sqrt(3)`, entering at each of the 7 products per layer, the LM head and the cached
/// keys and values (2 per layer). As for Q8_0, a logit's relative RMS error is about `sqrt(n)`
/// times that; the bound on the RMS error is twice it, on the worst logit three times it
/// relative to the largest |logit| ([`within_rms_bound`]).
#[test]
fn tiny_llama_bf16_fast_path_within_activation_rounding() {
    let dir = fixtures().join("tiny-llama-bf16");
    let mut model = load_with(&dir, MatmulPrecision::Int8);
    assert_eq!(model.config().kv_cache_dtype, KvDtype::Bf16);
    let n = 9 * model.config().num_hidden_layers + 1;
    let rms_bound = 2.0 * (n as f64).sqrt() * 2f64.powi(-9) / 3f64.sqrt();
    within_rms_bound(&mut model, &dir, rms_bound, "bf16 fast");
}

/// A half KV cache rounds every cached key and value once, to nearest: a relative error uniform
/// in `±2^-p` (p = 11 for f16, 9 for bf16), RMS `2^-p / sqrt(3)`, at 2 stages per layer. On the
/// float path that is the only error beyond f32's, so the bound is twice `sqrt(2 L)` times it
/// ([`within_rms_bound`]), on fixtures with full attention, biases and a sliding window.
#[test]
fn half_kv_caches_within_rounding() {
    for name in ["tiny-llama", "tiny-qwen2", "tiny-mistral-swa"] {
        let dir = fixtures().join(name);
        for (dtype, p) in [(KvDtype::F16, 11), (KvDtype::Bf16, 9)] {
            let mut model = load_kv(&dir, MatmulPrecision::Float, Some(dtype));
            assert_eq!(model.config().kv_cache_dtype, dtype);
            let n = 2 * model.config().num_hidden_layers;
            let rms_bound = 2.0 * (n as f64).sqrt() * 2f64.powi(-p) / 3f64.sqrt();
            within_rms_bound(
                &mut model,
                &dir,
                rms_bound,
                &format!("{name} {dtype} cache"),
            );
        }
    }
}

/// An int8 KV cache stores each group of 32 values of a (token, KV head) row as `round(x / s)`
/// with the group's scale `s ≈ amax / 127`: an error uniform in `±s / 2` per value, RMS at most
/// `amax / (254 sqrt 3)` with `amax` the row's largest value, which relative to the row's RMS
/// is at most `sqrt(head_dim) / (254 sqrt 3)` (a row's largest value is at most
/// `sqrt(head_dim)` times its RMS), at 2 stages per layer. The bound is twice
/// `sqrt(2 L)` times that ([`within_rms_bound`]), on the float path (the only error beyond
/// f32's), on fixtures with full attention, biases and a sliding window.
#[test]
fn int8_kv_cache_within_quantization() {
    for name in ["tiny-llama", "tiny-qwen2", "tiny-mistral-swa"] {
        let dir = fixtures().join(name);
        let mut model = load_kv(&dir, MatmulPrecision::Float, Some(KvDtype::Int8));
        let c = model.config();
        assert_eq!(c.kv_cache_dtype, KvDtype::Int8);
        let n = 2 * c.num_hidden_layers;
        let per_value = (c.head_dim as f64).sqrt() / (254.0 * 3f64.sqrt());
        let rms_bound = 2.0 * (n as f64).sqrt() * per_value;
        within_rms_bound(&mut model, &dir, rms_bound, &format!("{name} int8 cache"));
    }
}

/// `auto` keeps the float path exact (f32 cache), and on the fast path picks the checkpoint's
/// type: f32 for an f32 folder, bf16 for a bf16 one, f16 for GGUF.
#[test]
fn auto_kv_cache_types() {
    let f = fixtures();
    let kv = |path: &Path, precision| load_kv(path, precision, None).config().kv_cache_dtype;
    let bf16 = f.join("tiny-llama-bf16");
    let gguf = f.join("tiny-smollm/model-q8_0.gguf");
    assert_eq!(kv(&bf16, MatmulPrecision::Float), KvDtype::F32);
    assert_eq!(kv(&gguf, MatmulPrecision::Float), KvDtype::F32);
    assert_eq!(
        kv(&f.join("tiny-llama"), MatmulPrecision::Int8),
        KvDtype::F32
    );
    assert_eq!(kv(&bf16, MatmulPrecision::Int8), KvDtype::Bf16);
    assert_eq!(kv(&gguf, MatmulPrecision::Int8), KvDtype::F16);
}
