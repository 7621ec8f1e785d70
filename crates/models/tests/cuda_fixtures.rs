//! The Llama-family (Phi-3 included) and Gemma-family fixtures on the CUDA backend, against the Hugging Face transformers
//! reference: on the interpreted device (the Triton interpreter; every commit) and on CUDA
//! device 0 when there is one ("skipped: no GPU" otherwise; a failure with
//! `FERRUM_REQUIRE_GPU` set, as `scripts/test-gpu.sh` does).
//!
//! Bounds. f32 weights: every prompt position's logits within 1e-4 of the largest |logit| and
//! the 16 greedy ids equal (f32 arithmetic throughout, products without tf32). bf16 weights:
//! the product kernels round each activation tile to bf16 for the tensor cores (what
//! transformers does for a bf16 model; the reference computes in f32): a relative error of
//! 2^-9 per rounded operand, about 15 products in series over 2 layers plus the LM head,
//! gives sqrt(15) x 2^-9 ~ 0.8% RMS of a logit, and 1.5% of the largest |logit| bounds the
//! worst one; greedy ids must agree until the reference's top two logits come within that
//! bound (a near-tie may flip).
#![allow(clippy::unwrap_used)]

mod common;

use common::gpu::{devices, gpu_cache, gpu_greedy as greedy, gpu_prompt_logits as prompt_logits};
use common::*;
use ferrum_models::backend::CudaBackend;
use ferrum_models::{load_model_on_gpu, CudaGraphs, FamilyModel, ForwardBatch, LoadOptions};
use ferrum_runtime::cuda::{Gpu, InterpreterConfig, SharedGpu};
use std::path::Path;

/// The reference's gap between its top two logits at the last prompt position.
/// Float products in one 20-token prompt step of `model` on `gpu`: launches of `gemm_*`
/// kernels and vendor products (more rows than the decode products take, so one of either per
/// product, no split-K).
fn prompt_step_products(model: &mut FamilyModel<CudaBackend>, gpu: &SharedGpu) -> u64 {
    let kernels = ferrum_runtime::cuda::Manifest::embedded().unwrap().kernels;
    let count = |model: &FamilyModel<CudaBackend>| -> u64 {
        let g = gpu.lock();
        let gemms = kernels.iter().filter(|k| k.name.starts_with("gemm_"));
        let launches = gemms.filter_map(|k| g.variant_launches(&k.name));
        launches.map(|v| v.generic + v.aligned).sum::<u64>() + model.backend().vendor_products()
    };
    let before = count(model);
    prompt_logits(model, &(1..=20).collect::<Vec<u32>>());
    count(model) - before
}

fn top2_gap(row: &[f32]) -> f32 {
    let mut v = row.to_vec();
    v.sort_by(|a, b| b.total_cmp(a));
    v[0] - v[1]
}

fn check(dir: &Path, model_path: &Path, tol: f32) {
    check_on(devices(), dir, model_path, tol, 16)
}

/// Logits at every prompt position within `tol` of the largest, and `steps` greedy ids (every
/// case's in one batch).
fn check_on(devices: Vec<SharedGpu>, dir: &Path, model_path: &Path, tol: f32, steps: usize) {
    for gpu in devices {
        let dev = gpu.lock().describe();
        let opts = LoadOptions::default();
        let mut model = load_model_on_gpu(model_path, &opts, gpu).unwrap();
        let vocab = model.config().vocab_size;
        let reference = reference_json(dir);
        let ref_file = dir.join("reference.safetensors");
        let cases = reference["cases"].as_array().unwrap();
        let mut prompts = Vec::new();
        let mut last_rows = Vec::new();
        for case in cases {
            let i = case["index"].as_u64().unwrap();
            let prompt = ids(&case["prompt_ids"]);
            let (_, want) = reference_tensor(&ref_file, &format!("logits_{i}"));
            let got = prompt_logits(&mut model, &prompt);
            let (err, scale) = max_err(&got, &want);
            eprintln!(
                "{dev}: {} case {i} ({} tokens): max |logit err| {err:.3e}, max |logit| \
                 {scale:.3}, ratio {:.3e}",
                model_path.display(),
                prompt.len(),
                err / scale
            );
            assert!(
                err <= tol * scale,
                "{dev}: {}: case {i}: logit error {err} exceeds {tol} x {scale}",
                model_path.display()
            );
            last_rows.push((
                want[(prompt.len() - 1) * vocab..prompt.len() * vocab].to_vec(),
                scale,
            ));
            prompts.push(prompt);
        }
        let all_ids = greedy(&mut model, &prompts, steps);
        for ((case, got_ids), (last, scale)) in cases.iter().zip(&all_ids).zip(&last_rows) {
            let i = case["index"].as_u64().unwrap();
            let want_ids = ids(&case["greedy_ids"]);
            let want_ids = &want_ids[..steps];
            if tol <= 1e-4 {
                assert_eq!(
                    got_ids.as_slice(),
                    want_ids,
                    "{dev}: {}: case {i}",
                    model_path.display()
                );
            } else {
                // The first token: a near-tie at the last prompt position may flip it.
                if top2_gap(last) > 2.0 * tol * scale {
                    assert_eq!(got_ids[0], want_ids[0], "{dev}: case {i} first greedy id");
                }
                let agree = got_ids
                    .iter()
                    .zip(want_ids)
                    .take_while(|(a, b)| a == b)
                    .count();
                eprintln!("{dev}: case {i}: greedy ids agree for {agree} of {steps}");
            }
        }
    }
}

/// Weights of two types in one layer, as Q4_K_M files give v a type of its own: tiny Llama
/// with `v_proj` and `up_proj` rounded to f16, the rest f32. The GPU stacks `[q; k]` and
/// leaves v, gate and up as products of their own, writing K, V and Up at their offsets in
/// the rows of their shared slots (6 products a layer); the logits hold the reference within
/// the f16 rounding (1e-2 of the largest logit, as `formats.rs` bounds a whole f16 model).
#[test]
fn weights_of_mixed_types_stack_by_runs() {
    let src = fixtures().join("tiny-llama");
    let dir = scratch("cuda-mixed-types");
    std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    let tensors: Vec<_> = read_safetensors(&src.join("model.safetensors"))
        .into_iter()
        .map(|(name, dtype, shape, bytes)| {
            if !(name.contains("v_proj") || name.contains("up_proj")) {
                return (name, dtype, shape, bytes);
            }
            (name, "F16".to_string(), shape, f32_bytes_to_f16(&bytes))
        })
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &tensors);
    for gpu in devices() {
        let mut model = load_model_on_gpu(&dir, &LoadOptions::default(), gpu.clone()).unwrap();
        let layers = model.config().num_hidden_layers as u64;
        assert_eq!(prompt_step_products(&mut model, &gpu), 6 * layers + 1);
    }
    check_on(devices(), &src, &dir, 1e-2, 4);
}

/// A tuning candidate through the engine (`--kernels DIR`, `LoadOptions::kernels`): an overlay
/// of the bf16 decode products with other tiles (BLOCK_N 64, 8 warps), specs only as
/// `kernels/build.py --arch none` writes it for the interpreted device, runs in place of the
/// embedded ones (the backend's grids follow its constexprs) and gives the reference's logits.
/// An overlay kernel that is not this build's, or that takes other parameters, is refused at
/// load, named.
#[test]
fn an_overlay_of_candidate_kernels_runs_through_the_engine() {
    use ferrum_runtime::cuda::Manifest;
    use serde_json::{json, Value};
    let config = InterpreterConfig::from_env();
    if !config.is_available() {
        assert!(std::env::var_os("CI").is_none(), "CI: no Triton venv");
        return eprintln!("skipped: run scripts/test-cuda-interpret.sh");
    }
    let embedded = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runtime/kernels/manifest.json");
    let embedded: Value =
        serde_json::from_str(&std::fs::read_to_string(embedded).unwrap()).unwrap();
    let overlay = |edit: &dyn Fn(&mut Value)| -> std::path::PathBuf {
        let mut kernels: Vec<Value> = embedded["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|k| {
                k["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("gemm_bf16_"))
            })
            .filter(|k| k["name"] != "gemm_bf16_large")
            .cloned()
            .collect();
        for k in &mut kernels {
            k["constexprs"]["BLOCK_N"] = json!(64);
            k["num_warps"] = json!(8);
            k["binaries"] = json!({});
            k["aligned"]["binaries"] = json!({});
            edit(k);
        }
        let dir = scratch("cuda-overlay");
        let m = json!({"triton": embedded["triton"], "archs": [], "blobs": {}, "kernels": kernels});
        std::fs::write(dir.join("manifest.json"), m.to_string()).unwrap();
        dir
    };
    let dir = overlay(&|_| {});
    let gpu = Gpu::interpreted_with(&config, Some(Manifest::from_dir(&dir).unwrap())).unwrap();
    assert_eq!(gpu.constexpr("gemm_bf16_decode", "BLOCK_N").unwrap(), 64);
    assert_eq!(gpu.constexpr("gemm_bf16_large", "BLOCK_N").unwrap(), 128);
    let fixture = fixtures().join("tiny-llama-bf16");
    check_on(vec![SharedGpu::new(gpu)], &fixture, &fixture, 1.5e-2, 4);
    // Refused: a kernel this build does not have, and one with other parameters.
    let dir = overlay(&|k| {
        if k["name"] == "gemm_bf16_decode" {
            k["name"] = json!("gemm_bf16_decode_v2");
        }
    });
    let err = Gpu::interpreted_with(&config, Some(Manifest::from_dir(&dir).unwrap())).unwrap_err();
    assert!(err.to_string().contains("_v2 is not one of"), "{err}");
    // `m` as a u32 where the launches pass an i32.
    let dir = overlay(&|k| {
        for p in k["params"].as_array_mut().unwrap() {
            if p[0] == "m" {
                p[1] = json!("u32");
            }
        }
    });
    let err = Gpu::interpreted_with(&config, Some(Manifest::from_dir(&dir).unwrap())).unwrap_err();
    assert!(err.to_string().contains("takes other parameters"), "{err}");
    // Built with other dispatch values than this build's (`kernels/specs.py` changed since).
    let dir = overlay(&|_| {});
    let path = dir.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    m["dispatch"] = embedded["dispatch"].clone();
    m["dispatch"]["decode_m"] = json!(8);
    std::fs::write(&path, m.to_string()).unwrap();
    let err = Gpu::interpreted_with(&config, Some(Manifest::from_dir(&dir).unwrap())).unwrap_err();
    assert!(err.to_string().contains("other dispatch values"), "{err}");
}

fn fixture(name: &str, tol: f32) {
    let dir = fixtures().join(name);
    check(&dir, &dir, tol);
}

#[test]
fn tiny_llama() {
    fixture("tiny-llama", 1e-4);
}

#[test]
fn tiny_llama_bf16() {
    fixture("tiny-llama-bf16", 1.5e-2);
}

#[test]
fn tiny_llama3_rope() {
    fixture("tiny-llama3-rope", 1e-4);
}

#[test]
fn tiny_qwen2_bias() {
    fixture("tiny-qwen2", 1e-4);
}

#[test]
fn tiny_qwen3_qk_norm() {
    fixture("tiny-qwen3", 1e-4);
}

#[test]
fn tiny_mistral_sliding_window() {
    fixture("tiny-mistral-swa", 1e-4);
}

/// A 49152-token vocabulary: 4 greedy steps, which the interpreter decodes in reasonable time.
#[test]
fn tiny_gemma3_local_and_global_layers() {
    fixture("tiny-gemma3", 1e-4);
}

#[test]
fn tiny_gemma2_softcapping() {
    fixture("tiny-gemma2", 1e-4);
}

#[test]
fn tiny_phi3_partial_longrope() {
    fixture("tiny-phi3", 1e-4);
}

/// Decode steps replayed from CUDA graphs (captured per padded batch size) give the logits of
/// plain launches: three sequences (a bucket of 4, one padding token), then two (a bucket of
/// 2), on one KV cache per model, the plain model's greedy tokens fed to both. The first step
/// of a bucket runs plainly, the second captures, the rest replay. Every other step the graphed
/// model decides the greedy tokens on the device (`forward_argmax`): the ids of the plain
/// model's logits.
#[test]
fn decode_graphs_match_plain_launches() {
    let dir = fixtures().join("tiny-llama");
    for gpu in devices() {
        let dev = gpu.lock().describe();
        let load = |graphs| {
            let opts = LoadOptions {
                cuda_graphs: graphs,
                ..LoadOptions::default()
            };
            load_model_on_gpu(&dir, &opts, gpu.clone()).unwrap()
        };
        let (mut graphed, mut plain) = (load(CudaGraphs::On), load(CudaGraphs::Off));
        let vocab = plain.config().vocab_size;
        let bs = 16;
        let prompts: [&[u32]; 3] = [&[1, 5, 9, 200], &[7; 19], &[3, 300, 40, 5, 6, 77, 8]];
        let per_seq = 3;
        let mut kv_g = gpu_cache(&graphed, 3 * per_seq * bs, bs);
        let mut kv_p = gpu_cache(&plain, 3 * per_seq * bs, bs);
        let tables: Vec<Vec<u32>> = (0..3u32)
            .map(|s| {
                (s * per_seq as u32..(s + 1) * per_seq as u32)
                    .rev()
                    .collect()
            })
            .collect();
        let mut b = ForwardBatch::new();
        let mut next = Vec::new();
        for (p, table) in prompts.iter().zip(&tables) {
            b.clear();
            b.push_seq(p, 0, table, bs, 1).unwrap();
            let g = graphed.forward(&b, &mut kv_g).unwrap().to_vec();
            let want = plain.forward(&b, &mut kv_p).unwrap().to_vec();
            assert_eq!(g, want, "{dev}: prefill");
            next.push(argmax(&want));
        }
        let mut done: Vec<usize> = prompts.iter().map(|p| p.len()).collect();
        for (live, steps) in [(3usize, 5usize), (2, 4)] {
            for step in 0..steps {
                b.clear();
                for s in 0..live {
                    b.push_seq(&[next[s]], done[s], &tables[s], bs, 1).unwrap();
                }
                let want = plain.forward(&b, &mut kv_p).unwrap().to_vec();
                let want_ids: Vec<u32> = want.chunks_exact(vocab).map(argmax).collect();
                if step % 2 == 0 {
                    let got = graphed.forward(&b, &mut kv_g).unwrap().to_vec();
                    assert_eq!(got.len(), live * vocab);
                    let (err, scale) = max_err(&got, &want);
                    assert!(
                        err <= 1e-6 * scale,
                        "{dev}: {live} sequences, step {step}: graph logits differ by {err}"
                    );
                } else {
                    // Greedy rows decided on the device: only the ids come back.
                    let got = graphed.forward_argmax(&b, &mut kv_g).unwrap();
                    assert_eq!(got, want_ids, "{dev}: {live} sequences, step {step}");
                }
                next[..live].copy_from_slice(&want_ids);
                done[..live].iter_mut().for_each(|d| *d += 1);
            }
        }
        let (replays, captures) = graphed.backend().graph_counts();
        eprintln!("{dev}: {replays} decode steps replayed from {captures} graphs");
        assert_eq!(captures, 2, "{dev}: one graph per bucket (4 and 2)");
        assert_eq!(
            replays,
            (5 - 2) + (4 - 2),
            "{dev}: every step after each bucket's second"
        );
        assert_eq!(plain.backend().graph_counts(), (0, 0));
    }
}

/// Rows sampled on the device (`forward_sample`: edits, masks, temperature, min-p, top-k,
/// top-p, the draw, raw logprobs) give what the host's rules (`RowSampler`) give over the same
/// model's logits: the same token for the same draw, logprobs within 1e-5. Decode steps of
/// three sequences (graphs replayed from the third), each row with its own spec, the specs
/// rotating between steps.
#[test]
fn device_sampling_follows_the_host_rules() {
    use ferrum_models::sampling::{LogitEdit, RowSampler, RowSampling};
    let dir = fixtures().join("tiny-llama");
    for gpu in devices() {
        let dev = gpu.lock().describe();
        let load = |graphs| {
            let opts = LoadOptions {
                cuda_graphs: graphs,
                ..LoadOptions::default()
            };
            load_model_on_gpu(&dir, &opts, gpu.clone()).unwrap()
        };
        let (mut sampled, mut plain) = (load(CudaGraphs::On), load(CudaGraphs::Off));
        let vocab = plain.config().vocab_size;
        let bs = 16;
        let mut kv_s = gpu_cache(&sampled, 3 * 2 * bs, bs);
        let mut kv_p = gpu_cache(&plain, 3 * 2 * bs, bs);
        let tables: Vec<Vec<u32>> = (0..3u32).map(|s| vec![2 * s, 2 * s + 1]).collect();
        let edits = [
            LogitEdit {
                token: 5,
                repetition: 1.3,
                subtract: 0.5,
                bias: 0.0,
            },
            LogitEdit {
                token: 17,
                repetition: 1.0,
                subtract: 0.0,
                bias: 4.0,
            },
        ];
        // Every other token allowed, and a few past the vocabulary's end in the words.
        let mask: Vec<u32> = vec![0x5555_5555; vocab.div_ceil(32)];
        let base = RowSampling {
            temperature: 0.8,
            ..RowSampling::greedy()
        };
        let kinds = [
            RowSampling { ..base },
            RowSampling {
                temperature: 0.0,
                edits: &edits,
                logprobs: Some(4),
                ..base
            },
            RowSampling {
                top_k: 12,
                top_p: 0.8,
                min_p: 0.01,
                mask: Some(&mask),
                ..base
            },
            RowSampling {
                temperature: 1.5,
                top_p: 0.6,
                edits: &edits,
                logprobs: Some(0),
                ..base
            },
        ];
        let mut b = ForwardBatch::new();
        let mut next = [1u32, 7, 300];
        let mut done = [0usize; 3];
        let mut host = RowSampler::default();
        let mut draws = ferrum_types::SplitMix64::new(9);
        for step in 0..6 {
            b.clear();
            for s in 0..3 {
                b.push_seq(&[next[s]], done[s], &tables[s], bs, 1).unwrap();
            }
            let specs: Vec<RowSampling<'_>> = (0..3)
                .map(|s| RowSampling {
                    uniform: (draws.next_u64() >> 11) as f64 / (1u64 << 53) as f64,
                    ..kinds[(s + step) % kinds.len()]
                })
                .collect();
            let logits = plain.forward(&b, &mut kv_p).unwrap().to_vec();
            let got = sampled
                .forward_sample(&b, &mut kv_s, || specs.clone())
                .unwrap()
                .to_vec();
            for (s, (row, spec)) in logits.chunks_exact(vocab).zip(&specs).enumerate() {
                let want = host.sample(row, spec);
                let what = format!("{dev}: step {step}, row {s} ({spec:?})");
                assert_eq!(got[s].token, want.token, "{what}");
                assert_eq!(got[s].logprob.is_some(), want.logprob.is_some(), "{what}");
                if let (Some(g), Some(w)) = (got[s].logprob, want.logprob) {
                    assert!((g - w).abs() < 1e-5, "{what}: logprob {g} against {w}");
                }
                assert_eq!(got[s].top_logprobs.len(), want.top_logprobs.len(), "{what}");
                for (g, w) in got[s].top_logprobs.iter().zip(&want.top_logprobs) {
                    assert_eq!(g.0, w.0, "{what}: top logprobs");
                    assert!(
                        (g.1 - w.1).abs() < 1e-5,
                        "{what}: top logprob {g:?} against {w:?}"
                    );
                }
                if spec.mask.is_some() {
                    assert_eq!(got[s].token % 2, 0, "{what}: a masked token");
                }
                next[s] = got[s].token;
            }
            done.iter_mut().for_each(|d| *d += 1);
        }
        let (replays, _) = sampled.backend().graph_counts();
        assert!(replays > 0, "{dev}: sampling after replayed graphs");
    }
}

/// Mixture-of-experts models do not run on the CUDA backend yet: refused at load, before
/// anything is uploaded, with the error `--device auto` falls back to the CPU on.
#[test]
fn mixture_of_experts_is_refused_at_load() {
    for gpu in devices() {
        let dir = fixtures().join("tiny-mixtral");
        match load_model_on_gpu(&dir, &LoadOptions::default(), gpu) {
            Err(ferrum_models::ModelError::NotOnDevice(why)) => {
                assert!(why.contains("mixture-of-experts"), "{why}")
            }
            other => panic!("expected NotOnDevice, got {:?}", other.map(|_| ())),
        }
    }
}

#[test]
fn tiny_smollm_gguf_bf16() {
    let dir = fixtures().join("tiny-smollm");
    check_on(devices(), &dir, &dir.join("model-bf16.gguf"), 1.5e-2, 4);
}

/// A Llama-3.1-8B-shaped model with random bf16 weights (32 layers, hidden 4096, 32 heads over
/// 8 KV heads of 128, intermediate 14336, vocab 128256, Llama 3 rope scaling), made on the GPU
/// by `scripts/gpu/llama8b_reference.py` with transformers' reference (bf16 weights, f32
/// compute) beside it; `FERRUM_GPU_LLAMA8B` names its folder (`scripts/test-gpu.sh --llama8b`
/// sets it). CUDA only: the interpreter would take hours.
///
/// Bound: each of the 32 x 7 + 1 products rounds its input to bf16 (RMS relative error
/// 2^-8 / sqrt(12) ~ 0.11% each, independent), so a logit's RMS relative error is about
/// sqrt(225) x 0.11% ~ 1.7%; 5% of the largest |logit| bounds the worst one.
#[test]
fn llama31_8b_shaped_on_gpu() {
    let Some(dir) = std::env::var_os("FERRUM_GPU_LLAMA8B") else {
        eprintln!("skipped: FERRUM_GPU_LLAMA8B is unset (scripts/test-gpu.sh --llama8b)");
        return;
    };
    let gpu = match Gpu::cuda(0) {
        Ok(gpu) => SharedGpu::new(gpu),
        Err(e) => panic!("FERRUM_GPU_LLAMA8B is set but CUDA is unusable: {e}"),
    };
    let dir = Path::new(&dir);
    check_on(vec![gpu], dir, dir, 5e-2, 16);
}

/// The Q8_0 GGUF (Q8_0 weights and embedding table, decoded in the kernels) against the CPU's
/// float path on the same file: both decode the blocks exactly as ggml does, so they differ
/// only by the GPU products' tf32 operands (2^-11 relative each, sqrt(15) products in series:
/// ~0.1% RMS of a logit) and the KV cache (f16 here, f32 on the CPU's float path): bound 1% of
/// the largest logit; measured 1.9e-4..2.9e-4 on the interpreted device. The greedy ids must
/// start the same. Both heads compute the first 4096 of the 49152 rows (`output_vocab`): every
/// row is the same Q8_0 kernel's, and the interpreter's time went to the head.
#[test]
fn tiny_smollm_gguf_q8_0_against_the_cpu() {
    let file = fixtures().join("tiny-smollm/model-q8_0.gguf");
    let opts = LoadOptions {
        output_vocab: Some(4096),
        ..LoadOptions::default()
    };
    let cpu_opts = LoadOptions {
        precision: ferrum_runtime::cpu::MatmulPrecision::Float,
        num_threads: Some(2),
        ..opts.clone()
    };
    let mut cpu = ferrum_models::load_model(&file, &cpu_opts).unwrap();
    let reference = reference_json(&fixtures().join("tiny-smollm"));
    for gpu in devices() {
        let dev = gpu.lock().describe();
        let mut model = load_model_on_gpu(&file, &opts, gpu).unwrap();
        for (i, case) in reference["cases"].as_array().unwrap().iter().enumerate() {
            let prompt = ids(&case["prompt_ids"]);
            let want = common::prompt_logits(&mut cpu, &prompt);
            let got = prompt_logits(&mut model, &prompt);
            let (err, scale) = max_err(&got, &want);
            eprintln!("{dev}: q8_0 against the CPU: ratio {:.3e}", err / scale);
            assert!(err <= 1e-2 * scale, "{dev}: q8_0 logits {err} vs {scale}");
            // A few decode steps of one case (the logits check above covers every position of
            // every case).
            if i == 0 {
                let cpu_ids = common::greedy(&mut cpu, &prompt, 4);
                let got_ids = greedy(&mut model, std::slice::from_ref(&prompt), 4).remove(0);
                assert_eq!(got_ids[0], cpu_ids[0], "{dev}: the first greedy id differs");
                let agree = got_ids
                    .iter()
                    .zip(&cpu_ids)
                    .take_while(|(a, b)| a == b)
                    .count();
                eprintln!("{dev}: q8_0 greedy ids agree with the CPU for {agree} of 4");
            }
        }
    }
}

/// Deferred steps (`CudaBackend::set_deferred`): each decode step is issued before the
/// previous one's token is read back, its input a placeholder the device replaces with that
/// token (`set_pending_inputs`), two steps in flight at a time, collected in order. The tokens
/// are those of steps read back one at a time, for a model that decides them on the device
/// (tiny Llama) and one that decides them on the host (tiny Gemma 2's soft-capping) and
/// copies them back for the next step; with graphs, a batch of 3 pads to a bucket of 4, whose
/// padding repeats the pending last token.
#[test]
fn deferred_steps_take_their_inputs_on_the_device() {
    use ferrum_models::sampling::SampledRows;
    for name in ["tiny-llama", "tiny-gemma2"] {
        let dir = fixtures().join(name);
        for gpu in devices() {
            let dev = gpu.lock().describe();
            let mut model = load_model_on_gpu(&dir, &LoadOptions::default(), gpu).unwrap();
            let prompts: [&[u32]; 3] = [&[1, 5, 9, 200], &[7; 9], &[3, 300, 40]];
            let steps = 5;
            let want = greedy(&mut model, &prompts.map(<[u32]>::to_vec), steps);
            let bs = 8;
            let mut kv = gpu_cache(&model, 3 * 4 * bs, bs);
            let tables: Vec<Vec<u32>> = (0..3u32).map(|s| (4 * s..4 * (s + 1)).collect()).collect();
            let mut b = ForwardBatch::new();
            let mut ids = Vec::new();
            let mut rows = SampledRows::default();
            let mut got = vec![Vec::new(); 3];
            model.backend_mut().set_deferred(true);
            // The prompts in one step, then decode steps of three placeholders each.
            for (p, table) in prompts.iter().zip(&tables) {
                b.push_seq(p, 0, table, bs, 1).unwrap();
            }
            model.forward_argmax(&b, &mut kv).unwrap();
            for step in 0..steps {
                if step + 1 < steps {
                    b.clear();
                    for (p, table) in prompts.iter().zip(&tables) {
                        b.push_seq(&[0], p.len() + step, table, bs, 1).unwrap();
                    }
                    model
                        .backend_mut()
                        .set_pending_inputs(&[(0, 0), (1, 1), (2, 2)]);
                    model.forward_argmax(&b, &mut kv).unwrap();
                    assert_eq!(model.backend().in_flight(), 2, "{dev}: two steps in flight");
                }
                model.backend_mut().collect(&mut ids, &mut rows).unwrap();
                for (g, &t) in got.iter_mut().zip(&ids) {
                    g.push(t);
                }
            }
            model.backend_mut().set_deferred(false);
            assert_eq!(got, want, "{dev}: {name}: deferred steps");
        }
    }
}

/// The model's own launches take the aligned binaries where its shapes allow: the tiny
/// fixtures' sizes, strides and head sizes are multiples of 16, so every product, norm and
/// attention launch qualifies (and the interpreted worker checks each aligned launch's hints
/// as it runs it), K and V included at their offsets in the rows of the stacked q/k/v
/// product. And the stacked weights make one product each: a prompt step launches four
/// products per layer (q/k/v, o, gate/up, down) and the LM head's.
#[test]
fn a_model_with_aligned_shapes_launches_the_aligned_binaries() {
    let dir = fixtures().join("tiny-llama-bf16");
    let names: Vec<String> = ferrum_runtime::cuda::Manifest::embedded()
        .unwrap()
        .kernels
        .into_iter()
        .map(|k| k.name)
        .collect();
    for gpu in devices() {
        let mut model = load_model_on_gpu(&dir, &LoadOptions::default(), gpu.clone()).unwrap();
        let layers = model.config().num_hidden_layers as u64;
        assert_eq!(prompt_step_products(&mut model, &gpu), 4 * layers + 1);
        let ids = greedy(&mut model, &[vec![1, 2, 3, 4, 5, 6, 7]], 3).remove(0);
        assert_eq!(ids.len(), 3);
        let g = gpu.lock();
        let mut hot = 0;
        for name in &names {
            let Some(n) = g.variant_launches(name) else {
                continue;
            };
            if n.generic + n.aligned > 0 {
                eprintln!("{name}: {} generic, {} aligned", n.generic, n.aligned);
            }
            let is_hot = ["gemm_", "paged_attention", "prefill_attention", "rms_norm"]
                .iter()
                .any(|p| name.starts_with(p));
            if is_hot {
                assert_eq!(
                    n.generic,
                    0,
                    "{}: {name} took the generic binary",
                    g.describe()
                );
                hot += n.aligned;
            }
        }
        assert!(hot > 0, "no hot kernel launched");
    }
}
