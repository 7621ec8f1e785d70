//! `bench perplexity`: how well a model predicts a text, and how far a setting (a quantized KV
//! cache, say) moves it from a reference setting of the same model.
//!
//! The text's tokens are cut into chunks of `ctx`; each chunk is one prefill from an empty
//! cache, and the tokens of its second half are scored from the logits before them (llama.cpp's
//! `llama-perplexity` does the same, so the figures compare). Perplexity is
//! `exp(mean negative log-likelihood)` over the scored tokens, in f64.
//!
//! With a reference model (the same weights, another setting) every chunk also runs through
//! it, and at each scored position the two distributions are compared: the KL divergence
//! `KL(reference ‖ model)`, whether the argmax agrees, and at each chunk's last position the
//! largest logit difference relative to the reference's largest |logit|. Then greedy
//! continuations: from the first half of the first chunks, `greedy_tokens` tokens decoded by
//! each, and how many agree (the first divergence, and positions equal overall).

use anyhow::{bail, Context, Result};
use ferrum_models::{KvCache, Model};
use ferrum_types::{ForwardBatch, TokenId};
use serde::Serialize;

const BLOCK_SIZE: usize = 16;

/// What to measure.
#[derive(Debug, Clone, Copy)]
pub struct PerplexityConfig {
    /// Tokens per chunk (each chunk's second half is scored).
    pub ctx: usize,
    /// Chunks at most (the text's whole chunks otherwise).
    pub max_chunks: Option<usize>,
    /// Greedy tokens decoded from each compared prompt (with a reference).
    pub greedy_tokens: usize,
    /// Prompts (first halves of the first chunks) decoded greedily (with a reference).
    pub greedy_prompts: usize,
}

/// The figures of one model over the text.
#[derive(Debug, Clone, Serialize)]
pub struct PerplexityResult {
    pub ctx: usize,
    pub chunks: usize,
    pub scored_tokens: usize,
    pub perplexity: f64,
    /// Against the reference setting, when one was given.
    pub reference: Option<Comparison>,
}

/// The model against the reference, position by position.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// The reference's own perplexity on the same tokens.
    pub perplexity: f64,
    /// Mean of `KL(reference ‖ model)` over the scored positions, in nats.
    pub mean_kl: f64,
    /// The largest per-position KL divergence.
    pub max_kl: f64,
    /// Share of scored positions whose argmax agrees.
    pub top1_agreement: f64,
    /// Over the chunks' last positions: the largest `max |Δ logit| / max |reference logit|`.
    pub last_logit_err: f64,
    /// One entry per greedy prompt.
    pub greedy: Vec<GreedyAgreement>,
}

/// Greedy continuations of one prompt by the model and by the reference.
#[derive(Debug, Clone, Serialize)]
pub struct GreedyAgreement {
    pub prompt_tokens: usize,
    pub tokens: usize,
    /// Tokens equal before the first difference (`tokens` when none).
    pub first_divergence: usize,
    /// Positions equal overall.
    pub equal: usize,
}

/// Measures `model` (and `reference`, when given) on `tokens` as the module doc says. Flag
/// names in errors are the command line's.
pub fn perplexity(
    model: &mut Model,
    mut reference: Option<&mut Model>,
    tokens: &[TokenId],
    cfg: &PerplexityConfig,
) -> Result<PerplexityResult> {
    if cfg.ctx < 4 {
        bail!("--ctx must be at least 4");
    }
    let max_ctx = model.config().max_position_embeddings;
    if cfg.ctx > max_ctx {
        bail!(
            "--ctx {} is more than the model's context of {max_ctx}",
            cfg.ctx
        );
    }
    let mut chunks = tokens.len() / cfg.ctx;
    if let Some(m) = cfg.max_chunks {
        chunks = chunks.min(m);
    }
    if chunks == 0 {
        bail!(
            "the text has {} tokens, fewer than one chunk of --ctx {}",
            tokens.len(),
            cfg.ctx
        );
    }
    if let Some(r) = reference.as_deref() {
        if r.logits_vocab() != model.logits_vocab() {
            bail!("the reference model's vocabulary differs from the model's");
        }
    }
    let half = cfg.ctx / 2;
    let greedy_len = half + cfg.greedy_tokens;
    let blocks = cfg.ctx.max(greedy_len).div_ceil(BLOCK_SIZE);
    let mut kv = model
        .new_kv_cache(blocks, BLOCK_SIZE)
        .context("allocating the KV cache")?;
    let mut ref_kv = match reference.as_deref_mut() {
        Some(r) => Some(
            r.new_kv_cache(blocks, BLOCK_SIZE)
                .context("allocating the reference's KV cache")?,
        ),
        None => None,
    };
    let table: Vec<u32> = (0..blocks as u32).collect();
    let vocab = model.logits_vocab();
    let mut stats = Stats::default();
    let mut ref_logits = Vec::new();
    for c in 0..chunks {
        let chunk = &tokens[c * cfg.ctx..(c + 1) * cfg.ctx];
        // Rows for positions half-1 ..= ctx-1: row r predicts token half + r (the last row
        // predicts past the chunk and is only compared).
        let rows = cfg.ctx - half + 1;
        if let (Some(r), Some(rkv)) = (reference.as_deref_mut(), ref_kv.as_mut()) {
            ref_logits.clear();
            ref_logits.extend_from_slice(prefill(r, rkv, chunk, &table, rows)?);
        }
        let logits = prefill(model, &mut kv, chunk, &table, rows)?;
        if logits.len() != rows * vocab {
            bail!(
                "the model returned {} logits for {rows} rows of {vocab}",
                logits.len()
            );
        }
        for r in 0..rows {
            let row = &logits[r * vocab..(r + 1) * vocab];
            let reference_row = (!ref_logits.is_empty()).then(|| &ref_logits[r * vocab..][..vocab]);
            let target = chunk.get(half + r).map(|&t| t as usize);
            stats.add(row, reference_row, target)?;
        }
    }
    let greedy = match (reference, ref_kv.as_mut()) {
        (Some(r), Some(rkv)) if cfg.greedy_tokens > 0 => {
            let mut out = Vec::new();
            for c in 0..chunks.min(cfg.greedy_prompts) {
                let prompt = &tokens[c * cfg.ctx..c * cfg.ctx + half];
                let a = greedy(model, &mut kv, prompt, &table, cfg.greedy_tokens)?;
                let b = greedy(r, rkv, prompt, &table, cfg.greedy_tokens)?;
                let first_divergence = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
                let equal = a.iter().zip(&b).filter(|(x, y)| x == y).count();
                out.push(GreedyAgreement {
                    prompt_tokens: half,
                    tokens: cfg.greedy_tokens,
                    first_divergence,
                    equal,
                });
            }
            Some(out)
        }
        (Some(_), _) => Some(Vec::new()),
        _ => None,
    };
    let n = stats.scored.max(1) as f64;
    Ok(PerplexityResult {
        ctx: cfg.ctx,
        chunks,
        scored_tokens: stats.scored,
        perplexity: (stats.nll / n).exp(),
        reference: greedy.map(|greedy| Comparison {
            perplexity: (stats.ref_nll / n).exp(),
            mean_kl: stats.kl / n,
            max_kl: stats.max_kl,
            top1_agreement: stats.top1 as f64 / n,
            last_logit_err: stats.last_err,
            greedy,
        }),
    })
}

/// One prefill of `chunk` from an empty cache: the logits of its last `rows` positions.
fn prefill<'m>(
    model: &'m mut Model,
    kv: &mut KvCache,
    chunk: &[TokenId],
    table: &[u32],
    rows: usize,
) -> Result<&'m [f32]> {
    let mut b = ForwardBatch::new();
    b.push_seq(chunk, 0, table, BLOCK_SIZE, rows)?;
    Ok(model.forward(&b, kv)?)
}

/// `n` greedy tokens after `prompt`, from an empty cache.
fn greedy(
    model: &mut Model,
    kv: &mut KvCache,
    prompt: &[TokenId],
    table: &[u32],
    n: usize,
) -> Result<Vec<TokenId>> {
    let mut b = ForwardBatch::new();
    b.push_seq(prompt, 0, table, BLOCK_SIZE, 1)?;
    let mut out = Vec::with_capacity(n);
    let mut next = *model
        .forward_argmax(&b, kv)?
        .first()
        .context("the model returned no token")?;
    out.push(next);
    while out.len() < n {
        b.clear();
        b.push_seq(&[next], prompt.len() + out.len() - 1, table, BLOCK_SIZE, 1)?;
        next = *model
            .forward_argmax(&b, kv)?
            .first()
            .context("the model returned no token")?;
        out.push(next);
    }
    Ok(out)
}

/// Running sums over the scored positions.
#[derive(Debug, Default)]
struct Stats {
    scored: usize,
    nll: f64,
    ref_nll: f64,
    kl: f64,
    max_kl: f64,
    top1: usize,
    last_err: f64,
}

impl Stats {
    /// Adds one logits row: scored when it has a `target` (the next token), else the chunk's
    /// last position, only compared.
    fn add(&mut self, row: &[f32], reference: Option<&[f32]>, target: Option<usize>) -> Result<()> {
        let lse = log_sum_exp(row);
        match (target, reference) {
            (Some(t), reference) => {
                let logit = *row
                    .get(t)
                    .with_context(|| format!("token {t} is outside the vocabulary"))?;
                self.scored += 1;
                self.nll += lse - logit as f64;
                if let Some(rf) = reference {
                    let rlse = log_sum_exp(rf);
                    self.ref_nll += rlse - rf[t] as f64;
                    // KL(ref ‖ model) = Σ p_ref (log p_ref - log p_model).
                    let kl: f64 = rf
                        .iter()
                        .zip(row)
                        .map(|(&a, &b)| {
                            let lp = a as f64 - rlse;
                            lp.exp() * (lp - (b as f64 - lse))
                        })
                        .sum();
                    self.kl += kl;
                    self.max_kl = self.max_kl.max(kl);
                    self.top1 += usize::from(argmax(row) == argmax(rf));
                }
            }
            (None, Some(rf)) => {
                let scale = rf
                    .iter()
                    .fold(0f32, |m, x| m.max(x.abs()))
                    .max(f32::MIN_POSITIVE);
                let err = row
                    .iter()
                    .zip(rf)
                    .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                self.last_err = self.last_err.max((err / scale) as f64);
            }
            (None, None) => {}
        }
        Ok(())
    }
}

fn log_sum_exp(row: &[f32]) -> f64 {
    let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln()
}

/// The first index of the largest value.
fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the tiny GGUF: an int8 cache against an f16 one over a short text, every figure
    /// present and sane; a text shorter than a chunk is an error naming `--ctx`.
    #[test]
    fn compares_kv_cache_types_on_the_tiny_model() {
        use ferrum_models::{load_model, LoadOptions};
        use ferrum_runtime::cpu::KvDtype;
        let path = ferrum_testdata::fixture("tiny-smollm/model-q8_0.gguf");
        let load = |kv| {
            load_model(
                &path,
                &LoadOptions {
                    num_threads: Some(2),
                    kv_cache_dtype: Some(kv),
                    ..LoadOptions::default()
                },
            )
            .unwrap()
        };
        let (mut int8, mut f16) = (load(KvDtype::Int8), load(KvDtype::F16));
        let vocab = int8.config().vocab_size as u32;
        let tokens: Vec<TokenId> = (0..400u32).map(|i| (i * 7919 + 13) % vocab).collect();
        let cfg = PerplexityConfig {
            ctx: 64,
            max_chunks: Some(3),
            greedy_tokens: 8,
            greedy_prompts: 2,
        };
        let r = perplexity(&mut int8, Some(&mut f16), &tokens, &cfg).unwrap();
        assert_eq!((r.chunks, r.scored_tokens), (3, 96));
        let c = r.reference.as_ref().unwrap();
        assert!(r.perplexity > 1.0 && r.perplexity.is_finite(), "{r:?}");
        assert!((r.perplexity / c.perplexity - 1.0).abs() < 0.1, "{r:?}");
        assert!(
            (0.0..0.1).contains(&c.mean_kl) && c.top1_agreement > 0.5,
            "{r:?}"
        );
        assert_eq!(c.greedy.len(), 2);
        assert!(c
            .greedy
            .iter()
            .all(|g| g.equal <= 8 && g.first_divergence <= g.equal));
        // Against itself: no divergence at all.
        let mut again = load(KvDtype::F16);
        let same = perplexity(&mut f16, Some(&mut again), &tokens, &cfg).unwrap();
        let c = same.reference.unwrap();
        assert!(c.mean_kl.abs() < 1e-9 && c.top1_agreement == 1.0, "{c:?}");
        assert!(c.greedy.iter().all(|g| g.equal == 8));
        let short = PerplexityConfig { ctx: 1000, ..cfg };
        let e = perplexity(&mut f16, None, &tokens, &short).unwrap_err();
        assert!(e.to_string().contains("--ctx"), "{e}");
    }

    #[test]
    fn stats_score_and_compare_rows() {
        let mut s = Stats::default();
        // Uniform over 4: nll ln 4; identical reference: KL 0, argmax agrees.
        let row = [0.0f32; 4];
        s.add(&row, Some(&row), Some(2)).unwrap();
        assert!((s.nll - 4f64.ln()).abs() < 1e-12);
        assert!(s.kl.abs() < 1e-12 && s.top1 == 1);
        // A reference sure of token 0 against a uniform model: KL ≈ ln 4.
        s.add(&row, Some(&[100.0, 0.0, 0.0, 0.0]), Some(0)).unwrap();
        assert!((s.max_kl - 4f64.ln()).abs() < 1e-6, "{}", s.max_kl);
        // The last position is compared only.
        s.add(&[1.0, 2.0], Some(&[1.0, 4.0]), None).unwrap();
        assert_eq!(s.scored, 2);
        assert!((s.last_err - 0.5).abs() < 1e-12);
        assert!(
            s.add(&row, None, Some(9)).is_err(),
            "a token past the vocabulary"
        );
    }
}
