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
//! 7. a draw: the request's uniform for this output position.
//!
//! Steps 1 and 2 are this request's sparse edits ([`LogitEdit`]: one per penalized or biased
//! token) and its mask; the rest, and the precise rules, are [`ferrum_models::sampling`]'s,
//! which the GPU's sampling kernels follow too ([`Sampler::row_spec`] hands a row over).
//!
//! The uniform of the draw for output token `i` is a function of the request's seed and `i`
//! alone ([`Draws`]), so a seeded request gives the same tokens alone or in any batch, with or
//! without speculation, and whether its rows are sampled on the host or on a GPU.
//!
//! Logprobs are those of the raw model distribution (vLLM's default `raw_logprobs`): the
//! sampled token's and the top-N alternatives'.
//!
//! Invariants: the chosen token always has nonzero probability after every filter (each filter
//! keeps at least the most likely token), and a constrained request's token is one its mask
//! allows; the buffers are reused, so a step allocates nothing
//! once warm, except the returned top-logprob list.

use crate::guide::Guide;
use crate::rng::Draws;
use ferrum_models::sampling::{LogitEdit, RowSampler, RowSampling, SampledRow, GREEDY_BELOW};
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

impl From<SampledRow> for SampleOutput {
    fn from(r: SampledRow) -> SampleOutput {
        SampleOutput {
            token: r.token,
            logprob: r.logprob,
            top_logprobs: r.top_logprobs,
        }
    }
}

/// Per-request sampling state: parameters, draws, penalty counts and scratch buffers.
#[derive(Debug, Clone)]
pub struct Sampler {
    temperature: f32,
    top_p: f32,
    top_k: Option<usize>,
    min_p: f32,
    repetition_penalty: f32,
    presence_penalty: f32,
    frequency_penalty: f32,
    /// One entry per token (a request naming a token twice gets the sum).
    logit_bias: Vec<(TokenId, f32)>,
    logprobs: Option<usize>,
    draws: Draws,
    /// Output tokens recorded so far: the index of the next draw.
    position: u64,
    /// Occurrences of each token in the output (all penalties); a token taken back leaves.
    counts: HashMap<TokenId, u32>,
    /// The edits of the prompt (repetition penalty) and the logit bias, and where each
    /// token's sits: made once.
    base: Vec<LogitEdit>,
    base_at: HashMap<TokenId, usize>,
    /// Steps 1 and 2 as edits ([`Sampler::prepare`]).
    edits: Vec<LogitEdit>,
    host: RowSampler,
}

impl Sampler {
    /// `seed` is used when the request carries none.
    pub fn new(
        params: &SamplingParams,
        prompt: &[TokenId],
        vocab_size: usize,
        seed: u64,
    ) -> Sampler {
        let mut logit_bias: Vec<(TokenId, f32)> = Vec::new();
        for &(t, b) in &params.logit_bias {
            match logit_bias.iter_mut().find(|e| e.0 == t) {
                Some(e) => e.1 += b,
                None => logit_bias.push((t, b)),
            }
        }
        let mut s = Sampler {
            // Below GREEDY_BELOW a temperature is greedy (as vLLM has it).
            temperature: if params.temperature < GREEDY_BELOW {
                0.0
            } else {
                params.temperature
            },
            top_p: params.top_p,
            top_k: params.top_k,
            min_p: params.min_p,
            repetition_penalty: params.repetition_penalty,
            presence_penalty: params.presence_penalty,
            frequency_penalty: params.frequency_penalty,
            logit_bias,
            logprobs: params.logprobs,
            draws: Draws::new(params.seed.unwrap_or(seed)),
            position: 0,
            counts: HashMap::new(),
            base: Vec::new(),
            base_at: HashMap::new(),
            edits: Vec::new(),
            host: RowSampler::default(),
        };
        if s.repetition_penalty != 1.0 {
            let mut seen = vec![0u64; vocab_size.div_ceil(64)];
            for &t in prompt {
                if let Some(w) = seen.get_mut(t as usize / 64) {
                    *w |= 1 << (t % 64);
                }
            }
            for (w, &bits) in seen.iter().enumerate() {
                let mut b = bits;
                while b != 0 {
                    let t = (w * 64) as TokenId + b.trailing_zeros();
                    edit_of(&mut s.base, &mut s.base_at, t).repetition = s.repetition_penalty;
                    b &= b - 1;
                }
            }
        }
        for &(t, b) in &s.logit_bias {
            edit_of(&mut s.base, &mut s.base_at, t).bias = b;
        }
        s
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

    /// Whether this request's edits change with its output (penalties): then a row after a
    /// proposal depends on whether the proposal is accepted, and only the host, row by row,
    /// can sample it ([`Sampler::verify`]).
    pub fn edits_follow_output(&self) -> bool {
        self.has_penalties()
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

    /// Takes a row sampled elsewhere under [`Sampler::row_spec`] (on the model's device) and
    /// records its token: what [`Sampler::sample`] would have returned.
    pub fn accept(&mut self, row: &SampledRow) -> SampleOutput {
        self.record(row.token);
        SampleOutput::from(row.clone())
    }

    /// Builds this request's edits (steps 1 and 2 but the mask) from its penalties, its output
    /// so far and its logit bias; [`Sampler::row_spec`] hands them over. The prompt's and the
    /// bias's edits are made once; a step adds the output's.
    pub fn prepare(&mut self) {
        self.edits.clear();
        self.edits.extend_from_slice(&self.base);
        if !self.has_penalties() {
            return;
        }
        let (rp, fp, pp) = (
            self.repetition_penalty,
            self.frequency_penalty,
            self.presence_penalty,
        );
        for (&t, &c) in &self.counts {
            let subtract = if fp != 0.0 || pp != 0.0 {
                fp * c as f32 + pp
            } else {
                0.0
            };
            match self.base_at.get(&t) {
                Some(&i) => {
                    self.edits[i].repetition = rp;
                    self.edits[i].subtract = subtract;
                }
                None => self.edits.push(LogitEdit {
                    token: t,
                    repetition: rp,
                    subtract,
                    bias: 0.0,
                }),
            }
        }
    }

    /// What sampling the row `offset` rows after this request's next one needs (the next
    /// row is 0; later ones are proposals' rows), with the allowed-token mask of a
    /// constrained request; the edits are those of the last [`Sampler::prepare`].
    pub fn row_spec<'a>(&'a self, offset: usize, mask: Option<&'a [u32]>) -> RowSampling<'a> {
        RowSampling {
            temperature: self.temperature,
            top_k: self.top_k.unwrap_or(0),
            top_p: self.top_p,
            min_p: self.min_p,
            uniform: self.draws.uniform(self.position + offset as u64),
            edits: &self.edits,
            mask,
            logprobs: self.logprobs,
        }
    }

    /// Picks the next token from one row of logits and records it for the penalties. With a
    /// guide (a constrained request), only tokens its mask allows can be picked; the guide's
    /// mask must be computed.
    pub fn sample(&mut self, logits: &[f32], guide: Option<&Guide>) -> SampleOutput {
        self.prepare();
        let out = match guide {
            // Greedy and nothing edited: the best allowed token, without a copy.
            Some(g) if self.temperature == 0.0 && self.edits.is_empty() => {
                let token = g.argmax(logits).unwrap_or(0);
                self.host.with_logprobs(logits, token, self.logprobs)
            }
            _ => {
                let mut host = std::mem::take(&mut self.host);
                let out = host.sample(logits, &self.row_spec(0, guide.map(Guide::mask_words)));
                self.host = host;
                out
            }
        };
        self.record(out.token);
        out.into()
    }

    /// Verifies a proposed token (speculative decoding) against one row of logits: draws the
    /// token exactly as [`Sampler::sample`] would (the same draw) and accepts the proposal
    /// when the draw is it. For a proposal that is one fixed token this is rejection
    /// sampling: the proposal is accepted with probability `p(proposal)`, and on rejection
    /// the token comes from `p` without it, renormalized. So the output has exactly the
    /// target's distribution, and a seeded request gives the same tokens with speculation as
    /// without, whatever its batch mates. Returns the token (recorded for the penalties) and
    /// whether it is the proposal.
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
    pub fn processed_logits(&mut self, logits: &[f32], out: &mut Vec<f32>) {
        self.prepare();
        out.clear();
        out.extend_from_slice(logits);
        ferrum_models::sampling::edit_row(out, &self.edits, None);
    }

    /// Records an output token for the penalties without sampling it (replaying a sequence).
    pub fn observe(&mut self, token: TokenId) {
        self.record(token);
    }

    /// Takes back the last output token recorded (a sequence rolled back): its penalty count
    /// and its draw position, so the next draw is the one it had.
    pub fn take_back(&mut self, token: TokenId) {
        if let Some(c) = self.counts.get_mut(&token) {
            *c -= 1;
            if *c == 0 {
                self.counts.remove(&token);
            }
        }
        self.position = self.position.saturating_sub(1);
    }

    fn record(&mut self, token: TokenId) {
        self.position += 1;
        if self.has_penalties() {
            *self.counts.entry(token).or_insert(0) += 1;
        }
    }
}

/// The edit of `t` in `edits` (a new one, changing nothing, when `t` has none).
fn edit_of<'a>(
    edits: &'a mut Vec<LogitEdit>,
    at: &mut HashMap<TokenId, usize>,
    t: TokenId,
) -> &'a mut LogitEdit {
    let i = *at.entry(t).or_insert_with(|| {
        edits.push(LogitEdit {
            token: t,
            repetition: 1.0,
            subtract: 0.0,
            bias: 0.0,
        });
        edits.len() - 1
    });
    &mut edits[i]
}

/// The greedy choice over one row of logits; the CUDA backend's `argmax_rows` kernel keeps the
/// same rules, so a greedy request gets the same token whether the host or the device decides.
pub use ferrum_models::argmax;

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
