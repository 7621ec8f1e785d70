//! How one row of logits becomes a token: the rules shared by the host ([`RowSampler`], used
//! by the engine's sampler and by backends that hand their logits over) and the GPU's kernels
//! (`kernels/ferrum_kernels/sampling.py`, [`crate::Model::forward_sample`]), so a request gets
//! the same distribution, and with the same uniform draw the same token, wherever its row is
//! decided.
//!
//! A row is sampled in this order ([`RowSampling`] carries the inputs):
//!
//! 1. the sparse edits (penalties and logit bias, one [`LogitEdit`] per token), then the
//!    allowed-token mask of a constrained request (the others go to minus infinity);
//! 2. greedy (`temperature` below [`GREEDY_BELOW`]): the argmax ([`crate::argmax`]'s rules)
//!    of the edited row;
//! 3. otherwise every logit is multiplied by `1 / temperature`; the candidates are the finite
//!    logits of at least `max + ln(min_p)`;
//! 4. top-k keeps the candidates whose logit is at least the k-th largest (ties with it stay);
//! 5. top-p keeps each logit `v` whose strictly larger candidates hold less than `top_p` of the
//!    candidates' mass (so whole groups of equal logits stay or go);
//! 6. the draw: `x = uniform * mass of the kept`, and the token is the first kept one, in
//!    index order, whose running mass passes `x` (the last kept one when rounding leaves a
//!    sliver).
//!
//! Probabilities are `exp(l - max)` in f32 and masses are f64 sums, so the host and a device
//! differ only in the order of the sums and the last bits of the tempered logits and of `exp`
//! (an ulp or two; a GPU may fuse the multiply into the subtraction): the same uniform picks the
//! same token unless it falls within about 1e-7 of a boundary between two tokens' masses, and a
//! top-p group whose larger candidates' mass lies within that of `top_p` of the total may be
//! kept on one side and dropped on the other.
//! NaN logits count as minus infinity everywhere.
//!
//! Logprobs are those of the raw row (before any edit): `l - logsumexp(row)`, and the top `n`
//! by value, the lower index first among equals.

use crate::{ModelError, Result};
use ferrum_types::TokenId;

/// Temperatures below this are greedy (vLLM's rule): dividing by them would overflow the
/// logits to infinity.
pub const GREEDY_BELOW: f32 = 1e-5;

/// One token's edit of a logit, in this order: the repetition penalty (`l / r` when `l > 0`,
/// else `l * r`; no-op when `r == 1`), then `- subtract` (frequency and presence penalties),
/// then `+ bias` (logit bias). A row's edits name each token at most once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogitEdit {
    pub token: TokenId,
    pub repetition: f32,
    pub subtract: f32,
    pub bias: f32,
}

impl LogitEdit {
    /// The edited logit.
    pub fn apply(&self, l: f32) -> f32 {
        let r = self.repetition;
        let l = if r == 1.0 {
            l
        } else if l > 0.0 {
            l / r
        } else {
            l * r
        };
        (l - self.subtract) + self.bias
    }
}

/// What one row's choice needs besides its logits.
#[derive(Debug, Clone, Copy)]
pub struct RowSampling<'a> {
    /// 0 (or anything below [`GREEDY_BELOW`]) is greedy.
    pub temperature: f32,
    /// 0 keeps every candidate.
    pub top_k: usize,
    /// 1 keeps every candidate.
    pub top_p: f32,
    /// 0 keeps every candidate.
    pub min_p: f32,
    /// The draw, uniform in [0, 1) (unused when greedy).
    pub uniform: f64,
    pub edits: &'a [LogitEdit],
    /// The allowed tokens: bit `t % 32` of word `t / 32`; tokens past the words are not.
    pub mask: Option<&'a [u32]>,
    /// The raw logprob of the token and this many top alternatives.
    pub logprobs: Option<usize>,
}

impl RowSampling<'static> {
    /// Greedy over the raw row, nothing more asked.
    pub fn greedy() -> RowSampling<'static> {
        RowSampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            uniform: 0.0,
            edits: &[],
            mask: None,
            logprobs: None,
        }
    }
}

impl RowSampling<'_> {
    /// The argmax of the raw row is the whole answer: greedy, nothing edited or masked, no
    /// logprobs.
    pub fn is_plain_greedy(&self) -> bool {
        self.temperature < GREEDY_BELOW
            && self.edits.is_empty()
            && self.mask.is_none()
            && self.logprobs.is_none()
    }
}

/// One row's token, with the raw logprobs it asked for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SampledRow {
    pub token: TokenId,
    pub logprob: Option<f32>,
    /// Most likely first.
    pub top_logprobs: Vec<(TokenId, f32)>,
}

/// The host's implementation of the rules, with its buffers kept between rows (a warm step
/// allocates nothing but the top-logprob lists).
#[derive(Debug, Clone, Default)]
pub struct RowSampler {
    work: Vec<f32>,
    /// The candidates, in index order.
    cand: Vec<Cand>,
    /// Candidate logits, reordered by the selections.
    vals: Vec<f32>,
    ranked: Vec<(f32, TokenId)>,
}

impl RowSampler {
    /// The token for `logits` under `spec`, with its logprobs.
    pub fn sample(&mut self, logits: &[f32], spec: &RowSampling<'_>) -> SampledRow {
        let greedy = spec.temperature < GREEDY_BELOW;
        let token = if greedy && spec.edits.is_empty() && spec.mask.is_none() {
            crate::argmax(logits)
        } else {
            let mut work = std::mem::take(&mut self.work);
            work.clear();
            work.extend_from_slice(logits);
            edit_row(&mut work, spec.edits, spec.mask);
            let t = if greedy {
                crate::argmax(&work)
            } else {
                self.draw(&mut work, spec)
            };
            self.work = work;
            t
        };
        self.with_logprobs(logits, token, spec.logprobs)
    }

    /// `token` (chosen from `logits` by whatever rule) with the raw logprobs of `logits`: its
    /// own and the top `logprobs`, when asked for.
    pub fn with_logprobs(
        &mut self,
        logits: &[f32],
        token: TokenId,
        logprobs: Option<usize>,
    ) -> SampledRow {
        let (logprob, top_logprobs) = match logprobs {
            Some(n) => {
                let (lp, top) = raw_logprobs(logits, token, n, &mut self.ranked);
                (Some(lp), top)
            }
            None => (None, Vec::new()),
        };
        SampledRow {
            token,
            logprob,
            top_logprobs,
        }
    }

    /// Steps 3 to 6 over an edited row.
    fn draw(&mut self, row: &mut [f32], spec: &RowSampling<'_>) -> TokenId {
        let inv_t = 1.0 / spec.temperature;
        let mut max = f32::NEG_INFINITY;
        for l in row.iter_mut() {
            *l *= inv_t;
            max = max.max(*l);
        }
        let floor = if spec.min_p > 0.0 {
            max + spec.min_p.ln()
        } else {
            f32::NEG_INFINITY
        };
        let cand = &mut self.cand;
        cand.clear();
        cand.extend(
            row.iter()
                .enumerate()
                .filter(|&(_, &l)| l >= floor && l > f32::NEG_INFINITY)
                .map(|(i, &l)| Cand {
                    l,
                    p: 0.0,
                    token: i as TokenId,
                }),
        );
        if cand.is_empty() {
            return crate::argmax(row);
        }
        let vals = &mut self.vals;
        if spec.top_k > 0 && spec.top_k < cand.len() {
            vals.clear();
            vals.extend(cand.iter().map(|c| c.l));
            let k = spec.top_k;
            let (_, &mut kth, _) = vals.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
            cand.retain(|c| c.l >= kth);
        }
        let mut total = 0.0f64;
        for c in cand.iter_mut() {
            c.p = prob(c.l, max);
            total += c.p as f64;
        }
        if spec.top_p < 1.0 {
            vals.clear();
            vals.extend(cand.iter().map(|c| c.l));
            let cut = top_p_cutoff(vals, spec.top_p as f64 * total, max);
            cand.retain(|c| c.l >= cut);
            total = cand.iter().map(|c| c.p as f64).sum();
        }
        let x = spec.uniform * total;
        let mut cum = 0.0f64;
        for c in cand.iter() {
            cum += c.p as f64;
            if cum > x {
                return c.token;
            }
        }
        cand.last().map_or(0, |c| c.token)
    }
}

/// A candidate of the draw: its tempered logit, its unnormalized probability, its token.
#[derive(Debug, Clone, Copy)]
struct Cand {
    l: f32,
    p: f32,
    token: TokenId,
}

/// The unnormalized probability of a tempered logit: `exp(l - max)` in f32 (the kernels'
/// `tl.exp`), summed in f64.
fn prob(l: f32, max: f32) -> f32 {
    (l - max).exp()
}

/// Sampled rows and the host's sampler that makes them where a backend hands its logits
/// over ([`crate::backend::Backend::sample_rows`]'s default).
#[derive(Debug, Default)]
pub struct SampledRows {
    pub rows: Vec<SampledRow>,
    pub(crate) host: RowSampler,
}

impl SampledRows {
    /// Each of `specs`' rows sampled on the host from `logits` (`[specs.len(), vocab]`).
    pub(crate) fn sample_logits(
        &mut self,
        logits: &[f32],
        specs: &[RowSampling<'_>],
    ) -> Result<()> {
        self.rows.clear();
        if specs.is_empty() {
            return Ok(());
        }
        let vocab = logits.len() / specs.len();
        if vocab == 0 || vocab * specs.len() != logits.len() {
            return Err(ModelError::Invalid(format!(
                "{} logits do not make {} rows to sample",
                logits.len(),
                specs.len()
            )));
        }
        for (row, spec) in logits.chunks_exact(vocab).zip(specs) {
            let out = self.host.sample(row, spec);
            self.rows.push(out);
        }
        Ok(())
    }
}

/// Step 1: the edits, then the mask, in place.
pub fn edit_row(row: &mut [f32], edits: &[LogitEdit], mask: Option<&[u32]>) {
    for e in edits {
        if let Some(l) = row.get_mut(e.token as usize) {
            *l = e.apply(*l);
        }
    }
    if let Some(words) = mask {
        for (w, chunk) in row.chunks_mut(32).enumerate() {
            let bits = words.get(w).copied().unwrap_or(0);
            if bits == u32::MAX {
                continue;
            }
            for (i, l) in chunk.iter_mut().enumerate() {
                if bits & (1 << i) == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }
}

/// The smallest kept logit of top-p: walking the candidates' logits from the largest, a group
/// of equal logits stays while the mass of the larger ones is below `target`. Sorts only as
/// far as needed (the top 256 first, then four times more each round).
fn top_p_cutoff(vals: &mut [f32], target: f64, max: f32) -> f32 {
    let desc = |a: &f32, b: &f32| b.total_cmp(a);
    let mut m = 256.min(vals.len());
    loop {
        if m < vals.len() {
            vals.select_nth_unstable_by(m - 1, desc);
        }
        vals[..m].sort_unstable_by(desc);
        let mut cum = 0.0f64;
        let mut cut = vals[0];
        for (i, &v) in vals[..m].iter().enumerate() {
            // A new group (`-0.0 == 0.0`: one group).
            if i > 0 && v != vals[i - 1] {
                if cum >= target {
                    return cut;
                }
                cut = v;
            }
            cum += prob(v, max) as f64;
        }
        if m == vals.len() {
            return cut;
        }
        m = (m * 4).min(vals.len());
    }
}

/// Raw logprob of `token` and the top `n` (token, logprob) pairs, most likely first (the lower
/// index first among equals); NaN counts as minus infinity.
pub fn raw_logprobs(
    logits: &[f32],
    token: TokenId,
    n: usize,
    scratch: &mut Vec<(f32, TokenId)>,
) -> (f32, Vec<(TokenId, f32)>) {
    let clean = |l: f32| if l.is_nan() { f32::NEG_INFINITY } else { l };
    let max = logits
        .iter()
        .fold(f32::NEG_INFINITY, |m, &l| m.max(clean(l)));
    let sum: f64 = logits
        .iter()
        .map(|&l| ((clean(l) - max) as f64).exp())
        .sum();
    let lse = max + sum.ln() as f32;
    let lp = logits
        .get(token as usize)
        .map_or(f32::NEG_INFINITY, |&l| clean(l) - lse);
    let mut top = Vec::new();
    if n > 0 {
        scratch.clear();
        scratch.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (clean(l), i as TokenId)),
        );
        let order = |a: &(f32, TokenId), b: &(f32, TokenId)| {
            b.0.partial_cmp(&a.0)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.1.cmp(&b.1))
        };
        let n = n.min(scratch.len());
        if n < scratch.len() {
            scratch.select_nth_unstable_by(n - 1, order);
        }
        scratch[..n].sort_unstable_by(order);
        top.extend(scratch[..n].iter().map(|&(l, t)| (t, l - lse)));
    }
    (lp, top)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(temperature: f32) -> RowSampling<'static> {
        RowSampling {
            temperature,
            uniform: 0.5,
            ..RowSampling::greedy()
        }
    }

    #[test]
    fn edits_apply_in_order_and_mask_after() {
        let e = LogitEdit {
            token: 0,
            repetition: 2.0,
            subtract: 0.5,
            bias: 1.0,
        };
        assert_eq!(e.apply(3.0), 2.0);
        assert_eq!(e.apply(-1.0), -1.5);
        let mut row = vec![3.0, 1.0, 2.0];
        edit_row(&mut row, &[e], Some(&[0b101]));
        assert_eq!(row, vec![2.0, f32::NEG_INFINITY, 2.0]);
    }

    #[test]
    fn top_k_keeps_ties_and_top_p_keeps_whole_groups() {
        let mut s = RowSampler::default();
        // Tempered logits 3, 2, 2, 1: top-k 2 keeps the tie (three tokens).
        let row = [3.0, 2.0, 2.0, 1.0];
        let mut seen = [false; 4];
        for i in 0..200 {
            let sp = RowSampling {
                top_k: 2,
                uniform: i as f64 / 200.0,
                ..spec(1.0)
            };
            seen[s.sample(&row, &sp).token as usize] = true;
        }
        assert_eq!(seen, [true, true, true, false]);
        // top-p 0.5: the 3 alone holds 0.53 of [3, 2, 2, 1]'s mass, so only it stays.
        let mut seen = [false; 4];
        for i in 0..200 {
            let sp = RowSampling {
                top_p: 0.5,
                uniform: i as f64 / 200.0,
                ..spec(1.0)
            };
            seen[s.sample(&row, &sp).token as usize] = true;
        }
        assert_eq!(seen, [true, false, false, false]);
        // top-p 0.6: the mass above the 2s (0.53) is below 0.6, so both 2s stay.
        let mut seen = [false; 4];
        for i in 0..200 {
            let sp = RowSampling {
                top_p: 0.6,
                uniform: i as f64 / 200.0,
                ..spec(1.0)
            };
            seen[s.sample(&row, &sp).token as usize] = true;
        }
        assert_eq!(seen, [true, true, true, false]);
    }

    #[test]
    fn the_draw_walks_the_kept_tokens_in_index_order() {
        let mut s = RowSampler::default();
        // Equal logits: the uniform's quarter is the token.
        let row = [0.0f32; 4];
        for (u, want) in [(0.0, 0), (0.26, 1), (0.6, 2), (0.99, 3)] {
            let sp = RowSampling {
                uniform: u,
                ..spec(1.0)
            };
            assert_eq!(s.sample(&row, &sp).token, want);
        }
        // Nothing finite: the argmax's rule (0).
        let row = [f32::NEG_INFINITY, f32::NAN];
        assert_eq!(s.sample(&row, &spec(0.7)).token, 0);
    }

    #[test]
    fn tiny_temperatures_are_greedy() {
        let mut s = RowSampler::default();
        let row = [1.0f32, 3.0, 2.0];
        for t in [1e-40f32, 1e-6, 0.0] {
            let sp = RowSampling {
                uniform: 0.0,
                ..spec(t)
            };
            assert_eq!(s.sample(&row, &sp).token, 1, "temperature {t}");
        }
    }

    #[test]
    fn logprobs_are_the_raw_rows_with_ties_by_index() {
        let mut s = RowSampler::default();
        let row = [1.0f32, 2.0, 2.0, f32::NAN];
        let sp = RowSampling {
            logprobs: Some(3),
            edits: &[LogitEdit {
                token: 1,
                repetition: 1.0,
                subtract: 0.0,
                bias: -10.0,
            }],
            ..spec(0.0)
        };
        let out = s.sample(&row, &sp);
        assert_eq!(out.token, 2);
        let lse = (1f64.exp() + 2.0 * 2f64.exp()).ln() as f32;
        let lp = out.logprob.unwrap_or(0.0);
        assert!((lp - (2.0 - lse)).abs() < 1e-6, "{lp}");
        let ids: Vec<u32> = out.top_logprobs.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 2, 0]);
    }
}
