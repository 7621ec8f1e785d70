//! The devices the CUDA backend's tests run on, and their KV caches.

use super::argmax;
use ferrum_models::backend::CudaBackend;
use ferrum_models::{FamilyModel, ForwardBatch, KvCache};
use ferrum_runtime::cuda::{Gpu, InterpreterConfig, SharedGpu};

/// The interpreted device (the Triton interpreter in a worker: every commit; its venv missing
/// is a failure under CI) and CUDA device 0 when there is one ("skipped: no GPU" otherwise; a
/// failure with `FERRUM_REQUIRE_GPU` set, as `scripts/test-gpu.sh` does).
pub fn devices() -> Vec<SharedGpu> {
    let mut out = Vec::new();
    let config = InterpreterConfig::from_env();
    if config.is_available() {
        out.push(SharedGpu::new(Gpu::interpreted(&config).unwrap()));
    } else if std::env::var_os("CI").is_some() {
        panic!(
            "CI: the Triton venv is missing ({})",
            config.python.display()
        );
    } else {
        eprintln!("interpreted device skipped: run scripts/test-cuda-interpret.sh");
    }
    match Gpu::cuda(0) {
        Ok(gpu) => out.push(SharedGpu::new(gpu)),
        Err(e) if std::env::var_os("FERRUM_REQUIRE_GPU").is_some() => {
            panic!("FERRUM_REQUIRE_GPU is set but CUDA is unusable: {e}")
        }
        Err(e) => eprintln!("skipped: no GPU ({e})"),
    }
    out
}

/// A cache of room for `tokens` tokens in blocks of `bs` (one block spare).
pub fn gpu_cache(model: &FamilyModel<CudaBackend>, tokens: usize, bs: usize) -> KvCache {
    model
        .backend()
        .kv_cache(model.config(), tokens.div_ceil(bs) + 1, bs)
        .unwrap()
}

/// Logits at every prompt position in one pass, over a scrambled block table.
pub fn gpu_prompt_logits(model: &mut FamilyModel<CudaBackend>, prompt: &[u32]) -> Vec<f32> {
    let bs = 16;
    let mut kv = gpu_cache(model, prompt.len(), bs);
    let table: Vec<u32> = (0..kv.num_blocks() as u32).rev().collect();
    let mut b = ForwardBatch::new();
    b.push_seq(prompt, 0, &table, bs, 0).unwrap();
    b.logits_indices = (0..prompt.len() as u32).collect();
    model.forward(&b, &mut kv).unwrap().to_vec()
}

/// Greedy continuations of every prompt in one batch, as a server runs its sequences: a
/// prefill in two chunks (the second with prior context), then one decode step per token for
/// all of them at once. Each sequence has its own blocks of one cache.
pub fn gpu_greedy(
    model: &mut FamilyModel<CudaBackend>,
    prompts: &[Vec<u32>],
    n: usize,
) -> Vec<Vec<u32>> {
    let bs = 16;
    let per_seq = prompts
        .iter()
        .map(|p| (p.len() + n).div_ceil(bs))
        .max()
        .unwrap_or(1);
    let mut kv = gpu_cache(model, prompts.len() * per_seq * bs, bs);
    let tables: Vec<Vec<u32>> = (0..prompts.len())
        .map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect())
        .collect();
    let mut b = ForwardBatch::new();
    // Both chunks know the whole prompt's length, as the scheduler tells the forward.
    for (p, table) in prompts.iter().zip(&tables) {
        let split = p.len() / 2;
        if split > 0 {
            b.push_seq(&p[..split], 0, table, bs, 0).unwrap();
            b.set_prompt_len(p.len());
        }
    }
    if b.num_tokens() > 0 {
        model.forward(&b, &mut kv).unwrap();
    }
    b.clear();
    for (p, table) in prompts.iter().zip(&tables) {
        let split = p.len() / 2;
        b.push_seq(&p[split..], split, table, bs, 1).unwrap();
        b.set_prompt_len(p.len());
    }
    let first = model.forward(&b, &mut kv).unwrap().to_vec();
    // The head's rows (a reduced head computes fewer than the vocabulary).
    let vocab = first.len() / prompts.len();
    let mut out: Vec<Vec<u32>> = first.chunks_exact(vocab).map(|r| vec![argmax(r)]).collect();
    while out[0].len() < n {
        b.clear();
        for ((p, ids), table) in prompts.iter().zip(&out).zip(&tables) {
            let done = p.len() + ids.len() - 1;
            b.push_seq(&[ids[ids.len() - 1]], done, table, bs, 1)
                .unwrap();
        }
        let logits = model.forward(&b, &mut kv).unwrap().to_vec();
        for (ids, row) in out.iter_mut().zip(logits.chunks_exact(vocab)) {
            ids.push(argmax(row));
        }
    }
    out
}
