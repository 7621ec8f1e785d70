//! Batch invariance of the paged forward: prompts run together in one ForwardBatch, as chunked
//! prefills continuing cached context, and mixed with decodes give the logits each prompt gives
//! alone in one pass (bit for bit: every kernel computes each row independently).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use ferrum_models::{ForwardBatch, KvCache, Model};
use ferrum_runtime::cpu::{KvDtype, MatmulPrecision};

const BS: usize = 16;

fn prompts(name: &str) -> Vec<Vec<u32>> {
    reference_json(&fixtures().join(name))["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| ids(&c["prompt_ids"]))
        .collect()
}

/// Block tables of disjoint, interleaved blocks: sequence `s` gets blocks `s, s + n, s + 2n, ...`.
fn tables(lens: &[usize]) -> (Vec<Vec<u32>>, usize) {
    let n = lens.len();
    let per_seq = lens.iter().map(|l| l.div_ceil(BS)).max().unwrap();
    let t = (0..n)
        .map(|s| (0..per_seq).map(|j| (s + j * n) as u32).collect())
        .collect();
    (t, n * per_seq)
}

struct Setup {
    model: Model,
    prompts: Vec<Vec<u32>>,
    /// Each prompt's logits from a single pass of its own.
    alone: Vec<Vec<f32>>,
    lens: Vec<usize>,
    tables: Vec<Vec<u32>>,
    kv: KvCache,
}

fn setup(name: &str) -> Setup {
    setup_model(load(&fixtures().join(name)), name)
}

/// The prompts of fixture `name` on `model`.
fn setup_model(mut model: Model, name: &str) -> Setup {
    let prompts = prompts(name);
    let alone = prompts
        .iter()
        .map(|p| prompt_logits(&mut model, p))
        .collect();
    let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    let (tables, num_blocks) = tables(&lens);
    let kv = KvCache::new(model.config(), num_blocks, BS).unwrap();
    Setup {
        model,
        prompts,
        alone,
        lens,
        tables,
        kv,
    }
}

fn all_prompts_in_one_batch(name: &str) {
    all_in_one_batch(setup(name), name);
}

fn all_in_one_batch(setup: Setup, name: &str) {
    let Setup {
        mut model,
        prompts,
        alone,
        lens,
        tables,
        mut kv,
    } = setup;
    let mut b = ForwardBatch::new();
    for (p, t) in prompts.iter().zip(&tables) {
        b.push_seq(p, 0, t, BS, 0).unwrap();
    }
    b.logits_indices = (0..b.num_tokens() as u32).collect();
    let got = model.forward(&b, &mut kv).unwrap().to_vec();
    let vocab = model.config().vocab_size;
    let mut row = 0;
    for (i, a) in alone.iter().enumerate() {
        let together = &got[row * vocab..(row + lens[i]) * vocab];
        assert_eq!(
            max_err(together, a).0,
            0.0,
            "{name}: prompt {i} differs in a batch"
        );
        row += lens[i];
    }
}

/// Runs every prompt as prefill chunks of `chunk` tokens, all sequences advancing together in
/// each step, and compares every position's logits with the single-pass ones.
fn chunked(name: &str, chunk: usize) {
    chunked_setup(setup(name), name, chunk);
}

fn chunked_setup(setup: Setup, name: &str, chunk: usize) {
    let Setup {
        mut model,
        prompts,
        alone,
        lens,
        tables,
        mut kv,
    } = setup;
    let vocab = model.config().vocab_size;
    let mut done = vec![0usize; prompts.len()];
    let mut b = ForwardBatch::new();
    while done.iter().zip(&lens).any(|(d, l)| d < l) {
        b.clear();
        let mut spans = Vec::new();
        for (s, p) in prompts.iter().enumerate() {
            if done[s] == lens[s] {
                continue;
            }
            let end = (done[s] + chunk).min(lens[s]);
            let start_row = b.num_tokens();
            b.push_seq(&p[done[s]..end], done[s], &tables[s], BS, 0)
                .unwrap();
            // The whole prompt's length, as the scheduler gives it (LongRoPE picks by it).
            b.set_prompt_len(lens[s]);
            spans.push((s, done[s], end, start_row));
            done[s] = end;
        }
        b.logits_indices = (0..b.num_tokens() as u32).collect();
        let got = model.forward(&b, &mut kv).unwrap().to_vec();
        for (s, from, to, row) in spans {
            let got = &got[row * vocab..(row + to - from) * vocab];
            let want = &alone[s][from * vocab..to * vocab];
            assert_eq!(
                max_err(got, want).0,
                0.0,
                "{name}: prompt {s} positions {from}..{to} differ when chunked by {chunk}"
            );
        }
    }
}

#[test]
fn batched_prompts_match_single_runs() {
    all_prompts_in_one_batch("tiny-llama");
    all_prompts_in_one_batch("tiny-qwen3");
    all_prompts_in_one_batch("tiny-mistral-swa");
    all_prompts_in_one_batch("tiny-gemma3");
    all_prompts_in_one_batch("tiny-gemma2");
    all_prompts_in_one_batch("tiny-phi3");
    // Experts run on the rows routed to them, gathered across the batch.
    all_prompts_in_one_batch("tiny-mixtral");
    all_prompts_in_one_batch("tiny-qwen2-moe");
    all_prompts_in_one_batch("tiny-qwen3-moe");
    all_prompts_in_one_batch("tiny-olmoe");
}

/// Each expert's weights are read once per layer and step for all its tokens: a 100-token
/// prompt through tiny-mixtral (2 MoE layers, 4 experts, top-2) runs at most 8 expert products,
/// serving 400 token-expert pairs (per token, 400 runs would read the experts 50 times over).
#[test]
fn experts_run_once_per_step_for_all_their_tokens() {
    let Setup {
        mut model,
        prompts,
        tables,
        mut kv,
        ..
    } = setup("tiny-mixtral");
    let prompt = &prompts[3];
    assert_eq!(prompt.len(), 100);
    let stats = |model: &ferrum_models::Model| match model.cpu() {
        Some(m) => m.backend().moe_stats(),
        None => panic!("a CPU model"),
    };
    let before = stats(&model);
    let mut b = ForwardBatch::new();
    b.push_seq(prompt, 0, &tables[3], BS, 1).unwrap();
    model.forward(&b, &mut kv).unwrap();
    let after = stats(&model);
    let stats = ferrum_models::backend::MoeStats {
        layers: after.layers - before.layers,
        expert_runs: after.expert_runs - before.expert_runs,
        routed: after.routed - before.routed,
    };
    eprintln!("{stats:?}");
    assert_eq!(stats.layers, 2);
    assert_eq!(stats.routed, 2 * 100 * 2);
    assert!(stats.expert_runs <= 2 * 4, "{stats:?}");
}

#[test]
fn chunked_prefill_matches_single_runs() {
    // 40 tokens as 16 + 16 + 8; the sliding window (16) is crossed inside and across chunks.
    chunked("tiny-llama", 16);
    chunked("tiny-mistral-swa", 16);
    chunked("tiny-mistral-swa", 7);
    chunked("tiny-qwen2", 23);
    // Gemma: local and global layers with their own ropes; Gemma 2's soft-capped scores.
    chunked("tiny-gemma3", 16);
    chunked("tiny-gemma3", 7);
    chunked("tiny-gemma2", 9);
    // Phi-3's 100-token prompt takes LongRoPE's long factors in every chunk, as in one pass.
    chunked("tiny-phi3", 16);
    chunked("tiny-qwen2-moe", 11);
    chunked("tiny-olmoe", 5);
}

/// The int8-activation path (Q8_0 weights): activations are quantized per row, so a row's
/// result cannot depend on its batch-mates either. With the default cache for GGUF, f16.
#[test]
fn int8_activations_keep_batch_invariance() {
    let q8 = || {
        let m = load_with(
            &fixtures().join("tiny-smollm/model-q8_0.gguf"),
            MatmulPrecision::Int8,
        );
        assert_eq!(m.config().kv_cache_dtype, KvDtype::F16);
        m
    };
    all_in_one_batch(setup_model(q8(), "tiny-smollm"), "tiny-smollm q8_0 int8");
    chunked_setup(setup_model(q8(), "tiny-smollm"), "tiny-smollm q8_0 int8", 3);
}

/// bf16 weights on the fast setting (bf16 activations where the CPU has AVX-512 BF16, and a
/// bf16 KV cache): the same contract.
#[test]
fn bf16_activations_keep_batch_invariance() {
    let name = "tiny-llama-bf16";
    let bf16 = || {
        let m = load_with(&fixtures().join(name), MatmulPrecision::Int8);
        assert_eq!(m.config().kv_cache_dtype, KvDtype::Bf16);
        m
    };
    all_in_one_batch(setup_model(bf16(), name), "tiny-llama-bf16 fast");
    chunked_setup(setup_model(bf16(), name), "tiny-llama-bf16 fast", 5);
}

/// Decodes of one sequence share steps with another sequence's prefill chunks; the decode
/// logits equal those of the sequence's own single pass over prompt + generated tokens.
#[test]
fn decodes_mixed_with_prefill_chunks() {
    let name = "tiny-llama3-rope";
    let mut model = load(&fixtures().join(name));
    let prompts = prompts(name);
    let (short, long) = (&prompts[1], &prompts[3]);
    let steps = long.len().div_ceil(10);
    let gen = greedy(&mut model, short, steps + 1);
    let mut full = short.clone();
    full.extend_from_slice(&gen[..steps]);
    let want = prompt_logits(&mut model, &full);
    let vocab = model.config().vocab_size;
    let (tables, num_blocks) = tables(&[full.len(), long.len()]);
    let mut kv = KvCache::new(model.config(), num_blocks, BS).unwrap();
    let mut b = ForwardBatch::new();
    b.push_seq(short, 0, &tables[0], BS, 1).unwrap();
    model.forward(&b, &mut kv).unwrap();
    for step in 0..steps {
        b.clear();
        let pos = short.len() + step;
        b.push_seq(&full[pos..pos + 1], pos, &tables[0], BS, 1)
            .unwrap();
        let end = ((step + 1) * 10).min(long.len());
        b.push_seq(&long[step * 10..end], step * 10, &tables[1], BS, 0)
            .unwrap();
        let got = model.forward(&b, &mut kv).unwrap();
        assert_eq!(
            max_err(&got[..vocab], &want[pos * vocab..(pos + 1) * vocab]).0,
            0.0,
            "decode step {step} differs when mixed with a prefill chunk"
        );
    }
}
