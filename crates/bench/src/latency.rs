//! `bench latency`: the model's raw speed without scheduling or sampling in the way.
//!
//! Each iteration prefills `batch_size` prompts of `input_len` tokens (one forward pass per
//! prompt, as a single long request runs), then decodes `output_len - 1` steps in which all the
//! sequences advance together in one batch (greedy, each row's argmax taken where the logits
//! are: on a GPU only the token ids come back, as the engine does for greedy requests).
//! Prefill and decode tok/s are the medians over `num_iters` iterations after
//! `num_iters_warmup` unmeasured ones. The bytes a
//! decode token reads (weights as the kernels hold them, once per step for the whole batch,
//! plus its own K/V at the decode's mean context) turn the decode figure into a read rate.
//!
//! With `profile` on a GPU model, one more iteration (not in the medians) times every launch
//! of its decode steps with device events: the device time per kernel against the steps' wall
//! time, so the share of a step spent outside kernels (launches, copies, the host) shows.

use crate::median;
use anyhow::{bail, Context, Result};
use ferrum_models::{KvCache, Model};
use ferrum_runtime::cuda::KernelTime;
use ferrum_types::{ForwardBatch, TokenId};
use std::time::Instant;

const BLOCK_SIZE: usize = 16;

/// What to measure.
#[derive(Debug, Clone, Copy)]
pub struct LatencyConfig {
    /// Prompt tokens per sequence.
    pub input_len: usize,
    /// Tokens decoded per sequence (the first comes from the prefill).
    pub output_len: usize,
    /// Sequences decoding together.
    pub batch_size: usize,
    pub num_iters: usize,
    pub num_iters_warmup: usize,
    /// Time the decode steps' launches on the device in one more iteration (GPU models).
    pub profile: bool,
}

/// Where the decode steps' time went, from one profiled iteration.
#[derive(Debug, Clone)]
pub struct DecodeProfile {
    pub steps: usize,
    /// Wall time of the profiled decode steps (the events add a little host time per launch).
    pub wall_s: f64,
    /// Device time per kernel (a replayed graph counts as one `graph replay`), largest first.
    pub kernels: Vec<KernelTime>,
}

impl DecodeProfile {
    /// Device time of all kernels, in seconds.
    pub fn device_s(&self) -> f64 {
        self.kernels.iter().map(|k| k.total_ms).sum::<f64>() / 1e3
    }
}

/// The medians measured.
#[derive(Debug, Clone)]
pub struct LatencyResult {
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    /// KV cache bytes one token takes (all layers, keys and values, scales included).
    pub kv_bytes_per_token: usize,
    /// Weight bytes one step reads (shared by the batch).
    pub weight_bytes_per_step: usize,
    pub bytes_per_decode_token: f64,
    /// `decode_tok_s * bytes_per_decode_token`, in GB/s.
    pub decode_read_gb_s: f64,
    pub profile: Option<DecodeProfile>,
}

/// Measures `model` as the module doc says. Flag names in errors are the command line's.
pub fn latency(model: &mut Model, cfg: &LatencyConfig) -> Result<LatencyResult> {
    if cfg.input_len == 0 || cfg.output_len < 2 || cfg.batch_size == 0 || cfg.num_iters == 0 {
        bail!(
            "--input-len, --batch-size and --num-iters must be at least 1, --output-len at least 2"
        );
    }
    let c = model.config().clone();
    let len = cfg.input_len + cfg.output_len;
    if len > c.max_position_embeddings {
        bail!(
            "--input-len + --output-len = {len} is more than the model's context of {}",
            c.max_position_embeddings
        );
    }
    let num_blocks = cfg.batch_size * len.div_ceil(BLOCK_SIZE);
    let mut kv = model
        .new_kv_cache(num_blocks, BLOCK_SIZE)
        .context("allocating the KV cache")?;
    let (mut prefills, mut decodes) = (Vec::new(), Vec::new());
    for i in 0..cfg.num_iters_warmup + cfg.num_iters {
        let (p, d) = iteration(model, &mut kv, cfg, false)?.0;
        if i >= cfg.num_iters_warmup {
            prefills.push((cfg.batch_size * cfg.input_len) as f64 / p);
            decodes.push((cfg.batch_size * (cfg.output_len - 1)) as f64 / d);
        }
    }
    let (prefill_tok_s, decode_tok_s) = (median(prefills), median(decodes));
    let profile = if cfg.profile {
        iteration(model, &mut kv, cfg, true)?.1
    } else {
        None
    };
    let weight_bytes_per_step = model.weight_bytes_per_token();
    let kv_per_pos = KvCache::bytes_per_block(&c, BLOCK_SIZE) / BLOCK_SIZE;
    let kv_bytes = kv_per_pos as f64 * (cfg.input_len as f64 + cfg.output_len as f64 / 2.0);
    let bytes_per_decode_token = weight_bytes_per_step as f64 / cfg.batch_size as f64 + kv_bytes;
    Ok(LatencyResult {
        kv_bytes_per_token: kv_per_pos,
        prefill_tok_s,
        decode_tok_s,
        weight_bytes_per_step,
        bytes_per_decode_token,
        decode_read_gb_s: decode_tok_s * bytes_per_decode_token / 1e9,
        profile,
    })
}

/// The one token of a single sequence's step.
fn first(ids: &[TokenId]) -> Result<TokenId> {
    ids.first()
        .copied()
        .context("the model returned no token for the prompt")
}

/// One iteration: (prefill seconds, decode seconds), and with `profile` the decode steps'
/// device times.
fn iteration(
    model: &mut Model,
    kv: &mut KvCache,
    cfg: &LatencyConfig,
    profile: bool,
) -> Result<((f64, f64), Option<DecodeProfile>)> {
    let vocab = model.config().vocab_size;
    let per_seq = (cfg.input_len + cfg.output_len).div_ceil(BLOCK_SIZE);
    let tables: Vec<Vec<u32>> = (0..cfg.batch_size)
        .map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect())
        .collect();
    // A fixed, varied prompt: the speed does not depend on which tokens they are.
    let prompt: Vec<TokenId> = (0..cfg.input_len)
        .map(|i| ((i * 7919 + 13) % vocab) as TokenId)
        .collect();
    let mut b = ForwardBatch::new();
    let mut next = vec![0 as TokenId; cfg.batch_size];
    let t = Instant::now();
    for (s, table) in tables.iter().enumerate() {
        b.clear();
        b.push_seq(&prompt, 0, table, BLOCK_SIZE, 1)?;
        next[s] = first(model.forward_argmax(&b, kv)?)?;
    }
    let prefill = t.elapsed().as_secs_f64();
    let gpu = if profile {
        let gpu = model
            .gpu()
            .cloned()
            .context("--profile-kernels times GPU launches; this model runs on the CPU")?;
        gpu.lock().set_profiling(true)?;
        Some(gpu)
    } else {
        None
    };
    let t = Instant::now();
    for step in 0..cfg.output_len.saturating_sub(1) {
        b.clear();
        for (s, table) in tables.iter().enumerate() {
            b.push_seq(&[next[s]], cfg.input_len + step, table, BLOCK_SIZE, 1)?;
        }
        // [batch_size]: each sequence's greedy token, decided where the logits are.
        let ids = model.forward_argmax(&b, kv)?;
        if ids.len() != next.len() {
            bail!(
                "the model returned {} tokens for {} sequences",
                ids.len(),
                next.len()
            );
        }
        next.copy_from_slice(ids);
    }
    let decode = t.elapsed().as_secs_f64();
    let profile = match gpu {
        Some(gpu) => {
            let mut g = gpu.lock();
            let kernels = g.profile()?;
            g.set_profiling(false)?;
            Some(DecodeProfile {
                steps: cfg.output_len - 1,
                wall_s: decode,
                kernels,
            })
        }
        None => None,
    };
    Ok(((prefill, decode), profile))
}
