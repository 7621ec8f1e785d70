//! The CUDA backend's alternative paths against its plain ones, on every device present
//! (`common::gpu`): split-K decode attention and products, and products of more than 16 rows
//! on the vendor library (cuBLASLt; the interpreted device's numpy stand-in in CI), with its
//! fallbacks to the Triton products.
#![allow(clippy::unwrap_used)]

mod common;

use common::gpu::{devices, gpu_cache};
use common::*;
use ferrum_models::backend::CudaBackend;
use ferrum_models::{
    load_model_on_gpu, CudaGraphs, FamilyModel, ForwardBatch, GemmChoice, LoadOptions,
};
use ferrum_runtime::cuda::{Gpu, InterpretedGemm, InterpreterConfig, SharedGpu};

/// Split-K decode attention (ranges of 4 keys here, merged after) gives the logits of one
/// pass over the context: three sequences decoding past their prompts, on a model with full
/// attention and one with a sliding window of 16, graphs on (the split grid's depth is part of
/// a graph's key).
#[test]
fn split_decode_attention_matches_one_pass() {
    for name in ["tiny-llama", "tiny-mistral-swa"] {
        decode_matches_plain(name, 1e-5, |b| b.set_attention_split(4));
    }
}

/// Split-K decode products (the fixtures' 64-column products in 4 ranges of 16 here, or 2 of
/// 32 for Q8_0 blocks, summed in order) give the logits of unsplit products, graphs on: f32
/// weights.
#[test]
fn split_k_decode_products_match_one_pass_f32() {
    decode_matches_plain("tiny-llama", 1e-5, |b| b.set_decode_split(TEST_SPLIT));
}

/// As above, bf16 weights: a partial sum's last f32 bit can flip the bf16 rounding of an
/// activation the next product reads (2^-9 of it), so the bound is the bf16 one, scaled down
/// to one flip.
#[test]
fn split_k_decode_products_match_one_pass_bf16() {
    decode_matches_plain("tiny-llama-bf16", 2e-3, |b| b.set_decode_split(TEST_SPLIT));
}

/// As above, Q8_0 weights (the GGUF file): ranges of two 32-element blocks.
#[test]
fn split_k_decode_products_match_one_pass_q8_0() {
    decode_matches_plain("tiny-smollm/model-q8_0.gguf", 1e-5, |b| {
        b.set_decode_split(TEST_SPLIT)
    });
}

/// The split of the tests above: every decode product of the fixtures splits K. (One test per
/// weight type, so that they run side by side.)
const TEST_SPLIT: ferrum_models::backend::DecodeSplit = ferrum_models::backend::DecodeSplit {
    programs: 64,
    min_k: 16,
};

/// Three sequences' prefill, then 6 decode steps (the second captures, the rest replay), on a model tuned by `tune` (graphs on)
/// against a plain one: logits within `tol` of the largest.
fn decode_matches_plain(name: &str, tol: f32, tune: impl Fn(&mut CudaBackend)) {
    {
        let dir = fixtures().join(name);
        for gpu in devices() {
            let dev = gpu.lock().describe();
            let load = |graphs| {
                let opts = LoadOptions {
                    cuda_graphs: graphs,
                    // The GGUF fixture's 49k-row head through the interpreter takes minutes:
                    // its first 512 rows (every id the test feeds back).
                    output_vocab: name.ends_with(".gguf").then_some(512),
                    ..LoadOptions::default()
                };
                load_model_on_gpu(&dir, &opts, gpu.clone()).unwrap()
            };
            let (mut split, mut plain) = (load(CudaGraphs::On), load(CudaGraphs::Off));
            tune(split.backend_mut());
            let bs = 8;
            let mut kv_s = gpu_cache(&split, 3 * 6 * bs, bs);
            let mut kv_p = gpu_cache(&plain, 3 * 6 * bs, bs);
            let tables: Vec<Vec<u32>> = (0..3u32)
                .map(|s| (6 * s..6 * (s + 1)).rev().collect())
                .collect();
            let prompts: [&[u32]; 3] = [&[1, 5, 9, 200], &[7; 19], &[3, 300, 40, 5, 6, 77, 8]];
            let mut b = ForwardBatch::new();
            let mut next = Vec::new();
            for (p, table) in prompts.iter().zip(&tables) {
                b.clear();
                b.push_seq(p, 0, table, bs, 1).unwrap();
                let got = split.forward(&b, &mut kv_s).unwrap().to_vec();
                let want = plain.forward(&b, &mut kv_p).unwrap().to_vec();
                let (err, scale) = max_err(&got, &want);
                assert!(err <= tol * scale, "{dev} {name}: prefill differs by {err}");
                next.push(argmax(&want));
            }
            let mut done: Vec<usize> = prompts.iter().map(|p| p.len()).collect();
            for step in 0..6 {
                b.clear();
                for s in 0..3 {
                    b.push_seq(&[next[s]], done[s], &tables[s], bs, 1).unwrap();
                }
                let got = split.forward(&b, &mut kv_s).unwrap().to_vec();
                let want = plain.forward(&b, &mut kv_p).unwrap().to_vec();
                let (err, scale) = max_err(&got, &want);
                assert!(
                    err <= tol * scale,
                    "{dev} {name}: decode step {step} differs by {err} (of {scale})"
                );
                for (s, row) in want.chunks_exact(want.len() / 3).enumerate() {
                    next[s] = argmax(row);
                    done[s] += 1;
                }
            }
            let (replays, _) = split.backend().graph_counts();
            assert!(
                replays > 0,
                "{dev} {name}: tuned steps replayed from graphs"
            );
        }
    }
}

/// Logits of every position of a 40-token prompt (products of 40 rows).
fn prompt_logits(model: &mut FamilyModel<CudaBackend>) -> Vec<f32> {
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 37 + 11) % 500).collect();
    let bs = 16;
    let mut kv = gpu_cache(model, prompt.len(), bs);
    let table: Vec<u32> = (0..kv.num_blocks() as u32).collect();
    let mut b = ForwardBatch::new();
    b.push_seq(&prompt, 0, &table, bs, 0).unwrap();
    b.logits_indices = (0..prompt.len() as u32).collect();
    model.forward(&b, &mut kv).unwrap().to_vec()
}

fn load(name: &str, gemm: GemmChoice, gpu: SharedGpu) -> FamilyModel<CudaBackend> {
    let opts = LoadOptions {
        gemm,
        ..LoadOptions::default()
    };
    load_model_on_gpu(&fixtures().join(name), &opts, gpu).unwrap()
}

/// Products of more than 16 rows of bf16 weights run on the vendor library (`--gemm auto`),
/// the MLP's down product with its gated input among them: one vendor product per product
/// of a prompt step (4 a layer and the head's), none with `--gemm triton`; the logits agree
/// within the bf16 bound of `cuda_fixtures` (both round the same bf16 inputs and accumulate
/// in f32, in other orders), and against transformers' reference. An f32 model keeps its
/// Triton products (the library takes half inputs only).
#[test]
fn large_products_run_on_the_vendor_library() {
    for gpu in devices() {
        let dev = gpu.lock().describe();
        let mut vendor = load("tiny-llama-bf16", GemmChoice::Auto, gpu.clone());
        if !vendor.backend().gemm_note().contains("cuBLASLt") {
            eprintln!(
                "{dev}: skipped, no cuBLASLt ({})",
                vendor.backend().gemm_note()
            );
            continue;
        }
        let layers = vendor.config().num_hidden_layers as u64;
        let mut triton = load("tiny-llama-bf16", GemmChoice::Triton, gpu.clone());
        assert!(triton.backend().gemm_note().contains("Triton"), "{dev}");
        let got = prompt_logits(&mut vendor);
        assert_eq!(vendor.backend().vendor_products(), 4 * layers + 1, "{dev}");
        let want = prompt_logits(&mut triton);
        assert_eq!(triton.backend().vendor_products(), 0, "{dev}");
        let (err, scale) = max_err(&got, &want);
        eprintln!(
            "{dev}: vendor against Triton products: {:.3e} of {scale:.3}",
            err / scale
        );
        assert!(
            err <= 1.5e-2 * scale,
            "{dev}: vendor products differ by {err} of {scale}"
        );
        let mut f32_model = load("tiny-llama", GemmChoice::Auto, gpu.clone());
        prompt_logits(&mut f32_model);
        assert_eq!(
            f32_model.backend().vendor_products(),
            0,
            "{dev}: f32 weights"
        );
    }
}

/// A library that does not open falls back to the Triton products under `auto` (saying so)
/// and fails the load under `cublaslt`; a library that takes no shape falls back product by
/// product, giving the Triton products' bits exactly.
#[test]
fn without_a_vendor_library_the_triton_products_give_the_same_bits() {
    let base = InterpreterConfig::from_env();
    if !base.is_available() {
        assert!(std::env::var_os("CI").is_none(), "CI: no Triton venv");
        return eprintln!("skipped: run scripts/test-cuda-interpret.sh");
    }
    let device = |gemm| {
        let config = InterpreterConfig {
            gemm,
            ..base.clone()
        };
        SharedGpu::new(Gpu::interpreted(&config).unwrap())
    };
    let mut triton = load(
        "tiny-llama-bf16",
        GemmChoice::Triton,
        device(InterpretedGemm::StandIn),
    );
    let want = prompt_logits(&mut triton);

    let mut missing = load(
        "tiny-llama-bf16",
        GemmChoice::Auto,
        device(InterpretedGemm::Missing),
    );
    let note = missing.backend().gemm_note().to_string();
    assert!(
        note.contains("Triton") && note.contains("FERRUM_INTERPRETED_GEMM=none"),
        "{note}"
    );
    assert_eq!(prompt_logits(&mut missing), want, "no library");

    let opts = LoadOptions {
        gemm: GemmChoice::CublasLt,
        ..LoadOptions::default()
    };
    let dir = fixtures().join("tiny-llama-bf16");
    let err = load_model_on_gpu(&dir, &opts, device(InterpretedGemm::Missing))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("--gemm cublaslt"), "{err}");

    let mut refusing = load(
        "tiny-llama-bf16",
        GemmChoice::Auto,
        device(InterpretedGemm::Unsupported),
    );
    assert!(refusing.backend().gemm_note().contains("cuBLASLt"));
    assert_eq!(prompt_logits(&mut refusing), want, "no shape taken");
    assert_eq!(refusing.backend().vendor_products(), 0);
}

/// Decode steps of 18 sequences (more rows than the decode products take, so the products go
/// to the vendor library) replayed from a graph give the logits of plain launches: the graph
/// holds vendor products like launches.
#[test]
fn graphs_hold_vendor_products() {
    for gpu in devices() {
        let dev = gpu.lock().describe();
        let mut graphed = load("tiny-llama-bf16", GemmChoice::Auto, gpu.clone());
        if !graphed.backend().gemm_note().contains("cuBLASLt") {
            continue;
        }
        let opts = LoadOptions {
            cuda_graphs: CudaGraphs::Off,
            ..LoadOptions::default()
        };
        let mut plain =
            load_model_on_gpu(&fixtures().join("tiny-llama-bf16"), &opts, gpu.clone()).unwrap();
        let (seqs, bs) = (18usize, 8usize);
        let mut kv_g = gpu_cache(&graphed, seqs * 2 * bs, bs);
        let mut kv_p = gpu_cache(&plain, seqs * 2 * bs, bs);
        let tables: Vec<Vec<u32>> = (0..seqs as u32).map(|s| vec![2 * s, 2 * s + 1]).collect();
        let mut b = ForwardBatch::new();
        for (s, table) in tables.iter().enumerate() {
            b.push_seq(&[s as u32 + 1, 7, 9], 0, table, bs, 1).unwrap();
        }
        let first = plain.forward(&b, &mut kv_p).unwrap().to_vec();
        graphed.forward(&b, &mut kv_g).unwrap();
        let vocab = plain.config().vocab_size;
        let mut next: Vec<u32> = first.chunks_exact(vocab).map(argmax).collect();
        // The bucket of 24's first step runs plainly, the second captures, the third replays.
        for step in 0..3 {
            b.clear();
            for (s, table) in tables.iter().enumerate() {
                b.push_seq(&[next[s]], 3 + step, table, bs, 1).unwrap();
            }
            let got = graphed.forward(&b, &mut kv_g).unwrap().to_vec();
            let want = plain.forward(&b, &mut kv_p).unwrap().to_vec();
            let (err, scale) = max_err(&got, &want);
            assert!(
                err <= 1e-5 * scale,
                "{dev}: step {step} differs by {err} of {scale}"
            );
            next = want.chunks_exact(vocab).map(argmax).collect();
        }
        let (replays, captures) = graphed.backend().graph_counts();
        assert!(
            replays > 0 && captures > 0,
            "{dev}: no graph ({replays}, {captures})"
        );
        assert!(
            graphed.backend().vendor_products() > 0,
            "{dev}: no vendor product"
        );
    }
}
