//! Sampling on the device ([`Backend::sample_rows`] for [`CudaBackend`]): each logits row
//! becomes its token where the logits are, by the rules of [`crate::sampling`], and only the
//! tokens (and the logprobs a row asked for) come back.
//!
//! A step uploads its rows' inputs in one copy (per row: `1 / temperature` (0 for greedy),
//! `ln(min_p)`, top-k, top-p, the draw; the sparse edits; the masks of constrained rows), then
//! launches `sample_prepare` and `logit_edits` (only when a row has a mask or edits: they make
//! an edited copy of the rows), `sample_rows`, and `row_logprobs` (only when a row asks for
//! logprobs; over the raw rows), and reads the results back in one copy.
//!
//! Soft-capped models (Gemma 2) are sampled on the host over the capped rows, as their greedy
//! rows are ([`Backend::argmax_rows`]).

use super::{args, cdiv, i32_arg, p, read_words, CudaBackend, GpuVector, GpuWeight, Grown};
use crate::backend::Backend;
use crate::sampling::{RowSampling, SampledRow, SampledRows, GREEDY_BELOW};
use crate::{ModelError, Result};
use ferrum_runtime::cuda::KernelArg;

/// The device side of sampling: inputs, results, the edited rows, and host staging.
#[derive(Debug, Default)]
pub(super) struct DeviceSampling {
    inputs: Grown,
    results: Grown,
    work: Grown,
    words: Vec<u32>,
    bytes: Vec<u8>,
    read: Vec<u32>,
    /// The top logprobs each row of the step asks for.
    logprobs: Vec<Option<usize>>,
}

/// Word offsets of the input sections (see [`layout`]).
#[derive(Debug, Clone, Copy)]
struct Sections {
    inv_t: usize,
    ln_min_p: usize,
    top_k: usize,
    top_p: usize,
    /// f64, so at an even word.
    uniform: usize,
    edit_off: usize,
    mask_off: usize,
    logprobs: usize,
    tok: usize,
    rep: usize,
    sub: usize,
    bias: usize,
    masks: usize,
    end: usize,
}

/// The sections for `n` rows, `edits` edits in all and `masks` masked rows of `mask_words`.
fn layout(n: usize, edits: usize, masks: usize, mask_words: usize) -> Sections {
    let inv_t = 0;
    let ln_min_p = inv_t + n;
    let top_k = ln_min_p + n;
    let top_p = top_k + n;
    let uniform = (top_p + n).next_multiple_of(2);
    let edit_off = uniform + 2 * n;
    let mask_off = edit_off + n + 1;
    let logprobs = mask_off + n;
    let tok = logprobs + n;
    let rep = tok + edits;
    let sub = rep + edits;
    let bias = sub + edits;
    let masks_at = bias + edits;
    Sections {
        inv_t,
        ln_min_p,
        top_k,
        top_p,
        uniform,
        edit_off,
        mask_off,
        logprobs,
        tok,
        rep,
        sub,
        bias,
        masks: masks_at,
        end: masks_at + masks * mask_words,
    }
}

/// The inputs of `specs` as words in `layout`'s order, for a vocabulary of `vocab`; returns the
/// sections and the most top logprobs a row asks for.
fn encode(specs: &[RowSampling<'_>], vocab: usize, words: &mut Vec<u32>) -> (Sections, usize) {
    let n = specs.len();
    let edits: usize = specs.iter().map(|s| s.edits.len()).sum();
    let masked = specs.iter().filter(|s| s.mask.is_some()).count();
    let mask_words = vocab.div_ceil(32);
    let at = layout(n, edits, masked, mask_words);
    words.clear();
    words.resize(at.end, 0);
    let clamp = |v: usize| v.min(vocab).min(i32::MAX as usize) as u32;
    let (mut e, mut m, mut max_n) = (0, 0, 0);
    for (r, s) in specs.iter().enumerate() {
        let greedy = s.temperature < GREEDY_BELOW;
        words[at.inv_t + r] = if greedy { 0.0 } else { 1.0 / s.temperature }.to_bits();
        let ln_min_p = if s.min_p > 0.0 {
            s.min_p.ln()
        } else {
            f32::NEG_INFINITY
        };
        words[at.ln_min_p + r] = ln_min_p.to_bits();
        words[at.top_k + r] = clamp(s.top_k);
        words[at.top_p + r] = s.top_p.to_bits();
        let u = s.uniform.to_bits();
        words[at.uniform + 2 * r] = u as u32;
        words[at.uniform + 2 * r + 1] = (u >> 32) as u32;
        words[at.edit_off + r] = e as u32;
        for edit in s.edits {
            words[at.tok + e] = edit.token;
            words[at.rep + e] = edit.repetition.to_bits();
            words[at.sub + e] = edit.subtract.to_bits();
            words[at.bias + e] = edit.bias.to_bits();
            e += 1;
        }
        words[at.mask_off + r] = match s.mask {
            Some(mask) => {
                let start = m * mask_words;
                let take = mask.len().min(mask_words);
                let dst = at.masks + start;
                words[dst..dst + take].copy_from_slice(&mask[..take]);
                m += 1;
                start as u32
            }
            None => -1i32 as u32,
        };
        words[at.logprobs + r] = match s.logprobs {
            Some(k) => {
                let k = clamp(k);
                max_n = max_n.max(k as usize);
                k
            }
            None => -1i32 as u32,
        };
    }
    words[at.edit_off + n] = e as u32;
    (at, max_n)
}

impl CudaBackend {
    /// [`Backend::sample_rows`] on the device.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn device_sample(
        &mut self,
        norm: &GpuVector,
        eps: f32,
        head: &GpuWeight,
        rows: &[u32],
        softcap: Option<f32>,
        specs: &[RowSampling<'_>],
        out: &mut SampledRows,
    ) -> Result<()> {
        if softcap.is_some() {
            let logits = self.logits(norm, eps, head, rows, softcap)?;
            out.sample_logits(logits, specs)?;
            return self.host_sampled(&out.rows);
        }
        let n = rows.len();
        if specs.len() != n {
            return Err(ModelError::Invalid(format!(
                "{} sampling specs for {n} logits rows",
                specs.len()
            )));
        }
        self.step_logits(norm, eps, head, n)?;
        out.rows.clear();
        if n == 0 {
            return self.host_sampled(&[]);
        }
        let vocab = head.rows;
        let s = &mut self.sampling;
        let (at, max_n) = encode(specs, vocab, &mut s.words);
        s.bytes.clear();
        s.bytes.extend(s.words.iter().flat_map(|w| w.to_le_bytes()));
        let inputs = s.inputs.ensure(&self.gpu, s.bytes.len())?;
        let write = |e| ModelError::gpu("copying the sampling inputs to the GPU", e);
        self.gpu.lock().write(inputs, &s.bytes).map_err(write)?;
        // Results: tokens [n], logprobs [n], top ids [n, max_n], top values [n, max_n].
        let results = s.results.ensure(&self.gpu, 4 * (2 * n + 2 * n * max_n))?;
        self.guard_tokens()?;
        let word = |i: usize| inputs.offset(4 * i);
        let logits = self.logits.ptr()?;
        let (cols, stride) = (i32_arg(vocab, "vocabulary")?, i32_arg(vocab, "row stride")?);
        let edited = specs
            .iter()
            .any(|s| s.mask.is_some() || !s.edits.is_empty());
        let src = if edited {
            let work = self.sampling.work.ensure(&self.gpu, 4 * n * vocab)?;
            let block = self.block("sample_prepare", "BLOCK")?;
            let args = args![
                logits_ptr: p(logits),
                work_ptr: p(work),
                mask_ptr: p(word(at.masks)),
                mask_off_ptr: p(word(at.mask_off)),
                n_cols: cols,
                row_stride: stride,
            ];
            self.launch("sample_prepare", [n as u32, cdiv(vocab, block), 1], &args)?;
            if specs.iter().any(|s| !s.edits.is_empty()) {
                let args = args![
                    work_ptr: p(work),
                    edit_off_ptr: p(word(at.edit_off)),
                    tok_ptr: p(word(at.tok)),
                    rep_ptr: p(word(at.rep)),
                    sub_ptr: p(word(at.sub)),
                    bias_ptr: p(word(at.bias)),
                    mask_ptr: p(word(at.masks)),
                    mask_off_ptr: p(word(at.mask_off)),
                    n_cols: cols,
                    row_stride: stride,
                ];
                self.launch("logit_edits", [n as u32, 1, 1], &args)?;
            }
            work
        } else {
            logits
        };
        let args = args![
            src_ptr: p(src),
            inv_t_ptr: p(word(at.inv_t)),
            ln_min_p_ptr: p(word(at.ln_min_p)),
            top_k_ptr: p(word(at.top_k)),
            top_p_ptr: p(word(at.top_p)),
            u_ptr: p(word(at.uniform)),
            out_ptr: p(results),
            n_cols: cols,
            row_stride: stride,
        ];
        self.launch("sample_rows", [n as u32, 1, 1], &args)?;
        let with_logprobs = specs.iter().any(|s| s.logprobs.is_some());
        if with_logprobs {
            let args = args![
                logits_ptr: p(logits),
                tok_ptr: p(results),
                n_ptr: p(word(at.logprobs)),
                lp_ptr: p(results.offset(4 * n)),
                top_id_ptr: p(results.offset(4 * 2 * n)),
                top_val_ptr: p(results.offset(4 * (2 * n + n * max_n))),
                n_cols: cols,
                row_stride: stride,
                max_n: KernelArg::I32(max_n as i32),
            ];
            self.launch("row_logprobs", [n as u32, 1, 1], &args)?;
        }
        let words = if with_logprobs {
            2 * n + 2 * n * max_n
        } else {
            n
        };
        // (Taken out for the call and put back: reused from step to step.)
        let mut logprobs = std::mem::take(&mut self.sampling.logprobs);
        logprobs.clear();
        logprobs.extend(specs.iter().map(|s| s.logprobs));
        let done = match self.defer_sampled(results, words, &logprobs, max_n, vocab) {
            Ok(false) => {
                let s = &mut self.sampling;
                let what = "reading the sampled tokens back";
                let read = read_words(
                    &self.gpu,
                    results,
                    words,
                    &mut s.bytes,
                    &mut s.read,
                    u32::from_le_bytes,
                    what,
                );
                read.map(|()| decode_rows(&s.read, &logprobs, max_n, vocab, &mut out.rows))
            }
            deferred => deferred.map(drop),
        };
        self.sampling.logprobs = logprobs;
        done
    }
}

/// The rows of a sampling step's results (`words`: tokens `[n]`, logprobs `[n]`, top ids
/// `[n, max_n]`, top values `[n, max_n]`; only the tokens when no row asked for logprobs),
/// for rows asking for `logprobs` (one entry per row) of a `vocab`-token vocabulary.
pub(super) fn decode_rows(
    words: &[u32],
    logprobs: &[Option<usize>],
    max_n: usize,
    vocab: usize,
    out: &mut Vec<SampledRow>,
) {
    let n = logprobs.len();
    out.clear();
    for (r, k) in logprobs.iter().enumerate() {
        let mut row = SampledRow {
            token: words[r],
            ..SampledRow::default()
        };
        if let Some(k) = *k {
            row.logprob = Some(f32::from_bits(words[n + r]));
            let ids = 2 * n + r * max_n;
            let vals = 2 * n + n * max_n + r * max_n;
            row.top_logprobs = (0..k.min(vocab))
                .map(|j| (words[ids + j], f32::from_bits(words[vals + j])))
                .collect();
        }
        out.push(row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::LogitEdit;

    #[test]
    fn the_inputs_sit_where_the_layout_says() {
        let edits = [LogitEdit {
            token: 4,
            repetition: 1.5,
            subtract: 0.25,
            bias: -1.0,
        }];
        let mask = [0b1011u32];
        let base = RowSampling {
            temperature: 0.5,
            top_k: 1000,
            top_p: 0.9,
            min_p: 0.0,
            uniform: 0.75,
            edits: &[],
            mask: None,
            logprobs: None,
        };
        let specs = [
            base,
            RowSampling {
                temperature: 0.0,
                edits: &edits,
                mask: Some(&mask),
                logprobs: Some(3),
                ..base
            },
        ];
        let mut words = Vec::new();
        let (at, max_n) = encode(&specs, 40, &mut words);
        assert_eq!(max_n, 3);
        assert_eq!(at.uniform % 2, 0);
        assert_eq!(f32::from_bits(words[at.inv_t]), 2.0);
        assert_eq!(words[at.inv_t + 1], 0);
        assert_eq!(words[at.top_k], 40, "top-k clamps to the vocabulary");
        assert_eq!(f32::from_bits(words[at.ln_min_p]), f32::NEG_INFINITY);
        let u = words[at.uniform] as u64 | (words[at.uniform + 1] as u64) << 32;
        assert_eq!(f64::from_bits(u), 0.75);
        assert_eq!(&words[at.edit_off..at.edit_off + 3], &[0, 0, 1]);
        assert_eq!(words[at.mask_off] as i32, -1);
        assert_eq!(words[at.mask_off + 1], 0);
        assert_eq!(
            &words[at.masks..at.masks + 2],
            &[0b1011, 0],
            "masks pad with zeros"
        );
        assert_eq!((words[at.logprobs] as i32, words[at.logprobs + 1]), (-1, 3));
        assert_eq!(words[at.tok], 4);
        assert_eq!(f32::from_bits(words[at.bias]), -1.0);
        assert_eq!(words.len(), at.end);
    }
}
