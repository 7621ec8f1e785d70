//! The sampling chain of one request, in vLLM's order:
//!
//! 1. penalties over the raw logits: repetition (prompt and output tokens; divide positive
//!    logits, multiply negative ones), then frequency (per output occurrence) and presence
//!    (once per token that appeared in the output);
//! 2. logit bias, then the structured-output mask of a constrained request (tokens its
//!    constraint does not allow next go to minus infinity);
//! 3. greedy requests take the argmax here (a fast path skips the copy when 1 and 2 are no-ops);
//! 4. temperature;
//! 5. min-p (drop tokens below `min_p` times the top probability);
//! 6. top-k, then top-p over the renormalized survivors;
//! 7. a draw from the request's own generator.
//!
//! Logprobs are those of the raw model distribution (vLLM's default `raw_logprobs`): the
//! sampled token's and the top-N alternatives'.
//!
//! Invariants: the chosen token always has nonzero probability after every filter (each filter
//! keeps at least the most likely token), and a constrained request's token is one its mask
//! allows; the buffers are reused, so a step allocates nothing
//! once warm, except the returned top-logprob list.

use crate::guide::Guide;
use crate::rng::Rng;
use ferrum_types::{SamplingParams, TokenId};
use std::collections::HashMap;

/// One sampled token.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleOutput {
    pub token: TokenId,
    /// Raw logprob of `token`, when the request asked for logprobs.
    pub logprob: Option<f32>,
    /// The top alternatives by raw logprob, most likely first.
    pub top_logprobs: Vec<(TokenId, f32)>,
}

/// Per-request sampling state: parameters, generator, penalty counts and scratch buffers.
#[derive(Debug, Clone)]
pub struct Sampler {
    temperature: f32,
    top_p: f32,
    top_k: Option<usize>,
    min_p: f32,
    repetition_penalty: f32,
    presence_penalty: f32,
    frequency_penalty: f32,
    logit_bias: Vec<(TokenId, f32)>,
    logprobs: Option<usize>,
    rng: Rng,
    /// Tokens of the prompt (repetition penalty), as a bitset.
    prompt_seen: Vec<u64>,
    /// Occurrences of each token in the output (all penalties); a token taken back leaves.
    counts: HashMap<TokenId, u32>,
    work: Vec<f32>,
    cand: Vec<(f32, TokenId)>,
}

impl Sampler {
    /// `seed` is used when the request carries none.
    pub fn new(
        params: &SamplingParams,
        prompt: &[TokenId],
        vocab_size: usize,
        seed: u64,
    ) -> Sampler {
        let mut s = Sampler {
            temperature: params.temperature,
            top_p: params.top_p,
            top_k: params.top_k,
            min_p: params.min_p,
            repetition_penalty: params.repetition_penalty,
            presence_penalty: params.presence_penalty,
            frequency_penalty: params.frequency_penalty,
            logit_bias: params.logit_bias.clone(),
            logprobs: params.logprobs,
            rng: Rng::new(params.seed.unwrap_or(seed)),
            prompt_seen: Vec::new(),
            counts: HashMap::new(),
            work: Vec::new(),
            cand: Vec::new(),
        };
        if s.repetition_penalty != 1.0 {
            s.prompt_seen = vec![0; vocab_size.div_ceil(64)];
            for &t in prompt {
                if let Some(w) = s.prompt_seen.get_mut(t as usize / 64) {
                    *w |= 1 << (t % 64);
                }
            }
        }
        s
    }

    fn in_prompt(&self, t: TokenId) -> bool {
        self.prompt_seen
            .get(t as usize / 64)
            .is_some_and(|w| w & (1 << (t % 64)) != 0)
    }

    fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }

    /// Whether this request's choice is the argmax of the raw logits and nothing more is asked
    /// of the row: greedy, no penalties, no logit bias, no logprobs. Such a row can be decided
    /// where the logits are ([`Sampler::take`]).
    pub fn is_plain_greedy(&self) -> bool {
        self.temperature == 0.0
            && !self.has_penalties()
            && self.logit_bias.is_empty()
            && self.logprobs.is_none()
    }

    /// Takes a token decided elsewhere for a [`Sampler::is_plain_greedy`] request (the argmax
    /// of its row, made on the model's device): what [`Sampler::sample`] would have returned.
    pub fn take(&mut self, token: TokenId) -> SampleOutput {
        self.record(token);
        SampleOutput {
            token,
            logprob: None,
            top_logprobs: Vec::new(),
        }
    }

    /// Picks the next token from one row of logits and records it for the penalties. With a
    /// guide (a constrained request), only tokens its mask allows can be picked; the guide's
    /// mask must be computed.
    pub fn sample(&mut self, logits: &[f32], guide: Option<&Guide>) -> SampleOutput {
        let transformed = self.has_penalties() || !self.logit_bias.is_empty();
        let token = if self.temperature == 0.0 && !transformed {
            match guide {
                Some(g) => g.argmax(logits).unwrap_or(0),
                None => argmax(logits),
            }
        } else {
            let mut work = std::mem::take(&mut self.work);
            work.clear();
            work.extend_from_slice(logits);
            self.apply_penalties(&mut work);
            apply_logit_bias(&mut work, &self.logit_bias);
            if let Some(g) = guide {
                g.apply(&mut work);
            }
            let t = if self.temperature == 0.0 {
                argmax(&work)
            } else {
                self.draw(&mut work)
            };
            self.work = work;
            t
        };
        let (logprob, top_logprobs) = match self.logprobs {
            Some(n) => {
                let (lp, top) = raw_logprobs(logits, token, n, &mut self.cand);
                (Some(lp), top)
            }
            None => (None, Vec::new()),
        };
        self.record(token);
        SampleOutput {
            token,
            logprob,
            top_logprobs,
        }
    }

    /// Verifies a proposed token (speculative decoding) against one row of logits: draws the
    /// token exactly as [`Sampler::sample`] would (the same generator state, the same draw)
    /// and accepts the proposal when the draw is it. For a proposal that is one fixed token
    /// this is rejection sampling: the proposal is accepted with probability `p(proposal)`,
    /// and on rejection the token comes from `p` without it, renormalized. So the output has
    /// exactly the target's distribution, and a seeded request gives the same tokens with
    /// speculation as without, whatever its batch mates. Returns the token (recorded for the
    /// penalties) and whether it is the proposal.
    pub fn verify(
        &mut self,
        logits: &[f32],
        proposal: TokenId,
        guide: Option<&Guide>,
    ) -> (SampleOutput, bool) {
        let out = self.sample(logits, guide);
        let accepted = out.token == proposal;
        (out, accepted)
    }

    /// The logits after penalties and logit bias (steps 1 and 2), for inspection.
    pub fn processed_logits(&self, logits: &[f32], out: &mut Vec<f32>) {
        out.clear();
        out.extend_from_slice(logits);
        self.apply_penalties(out);
        apply_logit_bias(out, &self.logit_bias);
    }

    /// Records an output token for the penalties without sampling it (replaying a sequence).
    pub fn observe(&mut self, token: TokenId) {
        self.record(token);
    }

    /// Takes back an output token recorded for the penalties (a rejected proposal, or a
    /// sequence rolled back). Taking back a token never recorded changes nothing.
    pub fn take_back(&mut self, token: TokenId) {
        if let Some(c) = self.counts.get_mut(&token) {
            *c -= 1;
            if *c == 0 {
                self.counts.remove(&token);
            }
        }
    }

    fn record(&mut self, token: TokenId) {
        if self.has_penalties() {
            *self.counts.entry(token).or_insert(0) += 1;
        }
    }

    fn apply_penalties(&self, logits: &mut [f32]) {
        if self.repetition_penalty != 1.0 {
            let rp = self.repetition_penalty;
            let penalize = |l: &mut f32| *l = if *l > 0.0 { *l / rp } else { *l * rp };
            for (w, &bits) in self.prompt_seen.iter().enumerate() {
                let mut b = bits;
                while b != 0 {
                    let i = w * 64 + b.trailing_zeros() as usize;
                    b &= b - 1;
                    if let Some(l) = logits.get_mut(i) {
                        penalize(l);
                    }
                }
            }
            for &t in self.counts.keys() {
                if !self.in_prompt(t) {
                    if let Some(l) = logits.get_mut(t as usize) {
                        penalize(l);
                    }
                }
            }
        }
        if self.presence_penalty != 0.0 || self.frequency_penalty != 0.0 {
            for (&t, &c) in &self.counts {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= self.frequency_penalty * c as f32 + self.presence_penalty;
                }
            }
        }
    }

    /// Temperature, min-p, top-k, top-p, then a draw.
    fn draw(&mut self, logits: &mut [f32]) -> TokenId {
        let inv_t = 1.0 / self.temperature;
        let mut max = f32::NEG_INFINITY;
        for l in logits.iter_mut() {
            *l *= inv_t;
            max = max.max(*l);
        }
        let cand = &mut self.cand;
        cand.clear();
        // min-p: p_i >= min_p * p_max  <=>  l_i - max >= ln(min_p).
        let floor = if self.min_p > 0.0 {
            max + self.min_p.ln()
        } else {
            f32::NEG_INFINITY
        };
        cand.extend(
            logits
                .iter()
                .enumerate()
                .filter(|&(_, &l)| l >= floor && l > f32::NEG_INFINITY)
                .map(|(i, &l)| (l, i as TokenId)),
        );
        if cand.is_empty() {
            return argmax(logits);
        }
        if let Some(k) = self.top_k.filter(|&k| k < cand.len()) {
            cand.select_nth_unstable_by(k - 1, |a, b| b.0.total_cmp(&a.0));
            cand.truncate(k);
        }
        // Probabilities (unnormalized exp, their sum is the normalizer).
        let mut total = 0.0f64;
        for c in cand.iter_mut() {
            c.0 = (c.0 - max).exp();
            total += c.0 as f64;
        }
        if self.top_p < 1.0 {
            total = truncate_top_p(cand, total, self.top_p as f64);
        }
        let mut u = self.rng.next_f64() * total;
        for &(p, t) in cand.iter() {
            u -= p as f64;
            if u < 0.0 {
                return t;
            }
        }
        // Rounding left a sliver: the last candidate takes it.
        cand.last().map_or(0, |c| c.1)
    }
}

/// Keeps the most likely candidates whose mass before each reaches less than `top_p` of the
/// total; returns the kept mass. Sorts only as far as needed: the top 256 first.
fn truncate_top_p(cand: &mut Vec<(f32, TokenId)>, total: f64, top_p: f64) -> f64 {
    let target = top_p * total;
    let mut m = 256.min(cand.len());
    loop {
        if m < cand.len() {
            cand.select_nth_unstable_by(m - 1, |a, b| b.0.total_cmp(&a.0));
        }
        cand[..m].sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
        let mut cum = 0.0f64;
        for i in 0..m {
            if cum >= target {
                cand.truncate(i);
                return cum;
            }
            cum += cand[i].0 as f64;
        }
        if m == cand.len() {
            return cum;
        }
        m = (m * 4).min(cand.len());
    }
}

fn apply_logit_bias(logits: &mut [f32], bias: &[(TokenId, f32)]) {
    for &(t, b) in bias {
        if let Some(l) = logits.get_mut(t as usize) {
            *l += b;
        }
    }
}

/// The greedy choice over one row of logits; the CUDA backend's `argmax_rows` kernel keeps the
/// same rules, so a greedy request gets the same token whether the host or the device decides.
pub use ferrum_models::argmax;

/// Raw logprob of `token` and the top `n` (token, logprob) pairs, most likely first.
fn raw_logprobs(
    logits: &[f32],
    token: TokenId,
    n: usize,
    scratch: &mut Vec<(f32, TokenId)>,
) -> (f32, Vec<(TokenId, f32)>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let lse = max + sum.ln() as f32;
    let lp = logits
        .get(token as usize)
        .map_or(f32::NEG_INFINITY, |&l| l - lse);
    let mut top = Vec::new();
    if n > 0 {
        scratch.clear();
        scratch.extend(logits.iter().enumerate().map(|(i, &l)| (l, i as TokenId)));
        let n = n.min(scratch.len());
        if n < scratch.len() {
            scratch.select_nth_unstable_by(n - 1, |a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        }
        scratch[..n].sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        top.extend(scratch[..n].iter().map(|&(l, t)| (t, l - lse)));
    }
    (lp, top)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition: one value at a time, the first of equals.
    fn argmax_scan(row: &[f32]) -> TokenId {
        let mut best = 0;
        let mut best_v = f32::NEG_INFINITY;
        for (i, &v) in row.iter().enumerate() {
            if v > best_v {
                best = i;
                best_v = v;
            }
        }
        best as TokenId
    }

    #[test]
    fn argmax_equals_the_one_at_a_time_scan() {
        let mut rng = crate::rng::Rng::new(5);
        for len in [0usize, 1, 5, 16, 17, 33, 100, 49152] {
            for case in 0..6 {
                let mut row: Vec<f32> = (0..len)
                    .map(|_| (rng.next_f64() * 8.0).floor() as f32 - 4.0)
                    .collect();
                match case {
                    1 => row.iter_mut().for_each(|v| *v = f32::NEG_INFINITY),
                    2 => row.iter_mut().step_by(3).for_each(|v| *v = f32::NAN),
                    3 => row.iter_mut().for_each(|v| *v = 1.0),
                    4 => {
                        if let Some(v) = row.last_mut() {
                            *v = 100.0;
                        }
                    }
                    5 => row.iter_mut().for_each(|v| *v = f32::NAN),
                    _ => {}
                }
                assert_eq!(argmax(&row), argmax_scan(&row), "len {len} case {case}");
            }
        }
    }
}
