//! A step's start ([`Backend::begin`]): sizing the activation buffers, packing the batch's
//! indices into one upload, planning the attention (which tokens attend one at a time, split-K
//! depth, prefill tiles), taking the overlapped step's pending inputs, and the ropes'
//! frequencies and runs.
//!
//! Invariant: every index section starts on a 16-byte boundary (the kernels that read one take
//! their aligned binaries); a padded decode batch repeats its last token in every section.

use super::*;

/// Where one batch's indices sit in the index buffer (element offsets of u32). The
/// per-token sections come first and the block tables (whose length varies step to step) last,
/// so a padded decode batch's sections sit at the same offsets every step.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Indices {
    pub(super) ids: usize,
    pub(super) positions: usize,
    pub(super) slots: usize,
    pub(super) bt_start: usize,
    pub(super) rows: usize,
    pub(super) block_tables: usize,
    /// The prefill attention's tiles `(first token, count, block-table start)`, three u32
    /// each, and how many: present when a sequence has more than one query token.
    pub(super) tiles: Option<(usize, usize)>,
    /// The tokens that attend one at a time, and how many (see [`Backend::begin`]).
    pub(super) toks: (usize, usize),
    /// The step's pending inputs ([`CudaBackend::set_pending_inputs`]) and the padding's
    /// copies of them: pairs of a token index and the previous step's row, and how many.
    pub(super) pending: (usize, usize),
}

/// Pads `h` to a 16-byte boundary and returns where the next section starts.
fn align(h: &mut Vec<u32>) -> usize {
    h.resize(h.len().next_multiple_of(4), 0);
    h.len()
}

/// Appends a section of `xs` and `pad` copies of its last value; returns where it starts.
fn put(h: &mut Vec<u32>, xs: &[u32], pad: usize) -> usize {
    let at = align(h);
    h.extend_from_slice(xs);
    if let Some(&last) = xs.last() {
        h.extend(std::iter::repeat_n(last, pad));
    }
    at
}

impl CudaBackend {
    pub(super) fn begin_impl(
        &mut self,
        dims: Dims,
        batch: &ForwardBatch,
        ropes: &[Rope],
        graphs: bool,
    ) -> Result<()> {
        // A capture left open by a failed step is abandoned; its graph never existed.
        if matches!(self.graphs.step.take(), Some((_, GraphStep::Capture))) {
            self.gpu.lock().abort_capture();
        }
        self.dims = dims;
        let real = batch.num_tokens();
        self.num_real_tokens = real;
        self.graphs.bucket = self.bucket(batch).filter(|_| graphs);
        // Padded decode batches repeat their last token.
        let t = self.graphs.bucket.unwrap_or(real);
        self.tokens = t;
        self.num_logits = batch.logits_indices.len();
        self.device_rows = if self.graphs.bucket.is_some() {
            t
        } else {
            self.num_logits
        };
        self.size_buffers()?;
        self.pack_indices(batch)?;
        self.resolve_pending()?;
        self.upload_ropes(ropes)?;
        self.plan_rope_runs(batch, ropes, t - real);
        Ok(())
    }

    /// Every activation buffer sized for this step's tokens and logits rows.
    fn size_buffers(&mut self) -> Result<()> {
        let (dims, t) = (self.dims, self.tokens);
        for b in [Buf::X, Buf::H, Buf::Q, Buf::Attn, Buf::Gate] {
            let (slot, _, stride) = place(&dims, b);
            self.bufs[slot].ensure(&self.gpu, 4 * t * stride)?;
        }
        self.normed.ensure(&self.gpu, 4 * t * dims.hidden)?;
        self.rows
            .ensure(&self.gpu, 4 * self.device_rows * dims.hidden)?;
        self.logits
            .ensure(&self.gpu, 4 * self.device_rows * dims.vocab)?;
        Ok(())
    }

    /// The batch's indices in one upload ([`Indices`]): ids, positions, slots, block-table
    /// start per token, the tokens that attend one at a time, rows, block tables, prefill
    /// tiles and pending inputs; and the split-K attention's depth.
    fn pack_indices(&mut self, batch: &ForwardBatch) -> Result<()> {
        let (t, real) = (self.tokens, self.num_real_tokens);
        let pad = t - real;
        let h = &mut self.host_indices;
        h.clear();
        let ids = put(h, &batch.token_ids, pad);
        let positions = put(h, &batch.positions, pad);
        let slots = put(h, &batch.slot_mapping, pad);
        let bt_start = align(h);
        for s in &batch.seqs {
            h.extend(std::iter::repeat_n(s.block_table_start as u32, s.query_len));
        }
        if let Some(&last) = h.last() {
            h.extend(std::iter::repeat_n(last, pad));
        }
        let (toks, singles, longest) = single_tokens(h, batch, t);
        // Split-K for the single tokens when the longest context spans several ranges; the
        // grid depth rounds up to a power of two, so graphs are captured again rarely.
        self.attn_splits = longest
            .div_ceil(self.split_keys)
            .clamp(1, ATTENTION_RANGES)
            .next_power_of_two();
        let rows = align(h);
        h.extend_from_slice(&batch.logits_indices);
        // A padded bucket computes a row per token; the padding's are never read.
        h.extend((self.num_logits..self.device_rows).map(|i| i as u32));
        let block_tables = put(h, &batch.block_tables, 0);
        let tiles = prefill_tiles(h, batch, self.dispatch.prefill_m);
        // Pending inputs, and the padding's copies of a pending last token: the padding
        // writes its K/V into the last token's slot, so it must be the same token.
        let pending = align(h);
        for pair in self.overlap.pending.chunks_exact(2) {
            h.extend_from_slice(pair);
            if pair[0] as usize + 1 == real {
                h.extend((real..t).flat_map(|j| [j as u32, pair[1]]));
            }
        }
        let pending = (pending, (h.len() - pending) / 2);
        self.at = Indices {
            ids,
            positions,
            slots,
            bt_start,
            rows,
            block_tables,
            tiles,
            toks: (toks, singles),
            pending,
        };
        let bytes = &mut self.host_bytes;
        bytes.clear();
        bytes.extend(h.iter().flat_map(|v| v.to_le_bytes()));
        let ptr = self.indices.ensure(&self.gpu, bytes.len())?;
        self.gpu.lock().write(ptr, bytes)?;
        Ok(())
    }

    /// Each rope's frequencies on the device, uploaded again only when they changed.
    fn upload_ropes(&mut self, ropes: &[Rope]) -> Result<()> {
        self.inv_freq.truncate(ropes.len());
        for (i, rope) in ropes.iter().enumerate() {
            let same = self.inv_freq.get(i).is_some_and(|u| {
                u.short.1 == rope.inv_freq()
                    && u.long.as_ref().map(|l| l.1.as_slice()) == rope.long_inv_freq().map(|l| l.0)
                    && u.head_dim == rope.head_dim()
                    && u.mscale == rope.mscale()
            });
            if same {
                continue;
            }
            let upload = |v: &[f32]| -> Result<(DeviceBuffer, Vec<f32>)> {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Ok((self.gpu.upload(&bytes)?, v.to_vec()))
            };
            let uploaded = UploadedRope {
                short: upload(rope.inv_freq())?,
                long: rope.long_inv_freq().map(|(l, _)| upload(l)).transpose()?,
                head_dim: rope.head_dim(),
                mscale: rope.mscale(),
            };
            if i < self.inv_freq.len() {
                self.inv_freq[i] = uploaded;
            } else {
                self.inv_freq.push(uploaded);
            }
        }
        Ok(())
    }

    /// Runs of tokens taking one frequency set, per rope (the padding continues the last).
    fn plan_rope_runs(&mut self, batch: &ForwardBatch, ropes: &[Rope], pad: usize) {
        self.rope_runs.resize_with(ropes.len(), Vec::new);
        for (rope, runs) in ropes.iter().zip(&mut self.rope_runs) {
            runs.clear();
            for sq in &batch.seqs {
                for j in 0..sq.query_len {
                    let t = sq.query_start + j;
                    let pos = batch.positions.get(t).copied().unwrap_or(0) as usize;
                    let long = rope.uses_long(sq.prompt_len, pos);
                    match runs.last_mut() {
                        Some((first, n, l)) if *l == long && *first + *n == t => *n += 1,
                        _ => runs.push((t, 1, long)),
                    }
                }
            }
            if let Some((_, n, _)) = runs.last_mut() {
                *n += pad;
            }
        }
    }
}

/// The tokens that attend one at a time (`paged_attention`), appended to `h`: every token of
/// a batch of decodes (padding included: `t` tokens), else the one-token sequences beside
/// prompt chunks, which take the tiles (so a decode's arithmetic never depends on its batch
/// mates). Returns where the section starts, its length, and the longest context among them.
fn single_tokens(h: &mut Vec<u32>, batch: &ForwardBatch, t: usize) -> (usize, usize, usize) {
    let prefill = batch.seqs.iter().any(|s| s.query_len > 1);
    let toks = align(h);
    if prefill {
        for s in batch.seqs.iter().filter(|s| s.query_len == 1) {
            h.push(s.query_start as u32);
        }
    } else {
        h.extend(0..t as u32);
    }
    let singles = h.len() - toks;
    let longest = h[toks..]
        .iter()
        .map(|&i| {
            batch
                .positions
                .get(i as usize)
                .map_or(0, |&p| p as usize + 1)
        })
        .max()
        .unwrap_or(0);
    (toks, singles, longest)
}

/// Chunks of query tokens attend in tiles of `tile` (the manifest's `prefill_m`) on the tensor
/// cores: each tile's (first token, count, block-table start), appended to `h`; where they
/// start and how many.
fn prefill_tiles(h: &mut Vec<u32>, batch: &ForwardBatch, tile: usize) -> Option<(usize, usize)> {
    if !batch.seqs.iter().any(|s| s.query_len > 1) {
        return None;
    }
    let at = align(h);
    for s in batch.seqs.iter().filter(|s| s.query_len > 1) {
        for first in (0..s.query_len).step_by(tile) {
            h.extend([
                (s.query_start + first) as u32,
                (s.query_len - first).min(tile) as u32,
                s.block_table_start as u32,
            ]);
        }
    }
    Some((at, (h.len() - at) / 3))
}
