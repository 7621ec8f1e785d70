//! Attention and its neighbours: RoPE, the KV cache writes (with or without RoPE fused), decode
//! attention (one pass, or split-K ranges merged after) and prefill attention in tiles.
//!
//! Invariant: a decode token's attention never depends on its batch mates: one-token sequences
//! beside prompt chunks take the decode kernels, not the tiles.

use super::*;
use crate::kv_cache::DeviceKvLayer;

/// `before`, a layer's cache arguments (the key and value caches, then an fp8 cache's row
/// scales: the `_fp8` kernels' parameters), then `after`.
fn with_cache<'a>(
    before: &[(&'a str, KernelArg)],
    kv: DeviceKvLayer,
    after: &[(&'a str, KernelArg)],
) -> Vec<(&'a str, KernelArg)> {
    let mut a = Vec::with_capacity(before.len() + 4 + after.len());
    a.extend_from_slice(before);
    a.extend(args![k_cache_ptr: p(kv.k), v_cache_ptr: p(kv.v)]);
    if let Some((ks, vs)) = kv.scales {
        a.extend(args![k_scale_ptr: p(ks), v_scale_ptr: p(vs)]);
    }
    a.extend_from_slice(after);
    a
}

impl CudaBackend {
    /// Split-K decode attention of the tokens that attend one at a time: ranges of
    /// `split_keys` keys in parallel (`paged_attention_split`), then the merge of the tokens
    /// that took several (`attention_combine`). A token's result depends on its context only.
    pub(super) fn attend_split(
        &mut self,
        cache: DeviceKvLayer,
        kind: &str,
        shape: &AttentionShape,
        d: usize,
        group: usize,
    ) -> Result<()> {
        let (toks, singles) = self.at.toks;
        let splits = self.attn_splits;
        let part_bytes = 4 * singles * shape.num_heads * splits * (d + 2);
        let part = self.attn_part.ensure(&self.gpu, part_bytes)?;
        let window = i32_arg(shape.sliding_window.unwrap_or(0), "sliding window")?;
        let keys = i32_arg(self.split_keys, "split keys")?;
        let depth = i32_arg(splits, "attention splits")?;
        let ranges = i32_arg(ATTENTION_RANGES, "attention ranges")?;
        let args = with_cache(
            &args![q_ptr: p(self.buf(Buf::Q)?)],
            cache,
            &args![
                block_tables_ptr: p(self.index(self.at.block_tables)?),
                bt_start_ptr: p(self.index(self.at.bt_start)?),
                pos_ptr: p(self.index(self.at.positions)?),
                tok_ptr: p(self.index(toks)?),
                out_ptr: p(self.buf(Buf::Attn)?),
                part_ptr: p(part),
                q_stride: i32_arg(self.stride(Buf::Q), "row stride")?,
                out_stride: i32_arg(self.stride(Buf::Attn), "row stride")?,
                group: i32_arg(group, "GQA group")?,
                num_kv_heads: i32_arg(shape.num_kv_heads, "kv heads")?,
                head_dim: i32_arg(shape.head_dim, "head_dim")?,
                block_size: i32_arg(shape.block_size, "block size")?,
                window: window,
                scale: KernelArg::F32(shape.scale),
                softcap: KernelArg::F32(shape.softcap.unwrap_or(0.0)),
                split_keys: keys,
                max_ranges: ranges,
                max_splits: depth,
            ],
        );
        let name = format!("paged_attention_split_{kind}_d{d}");
        let heads = self.head_programs(&name, shape.num_kv_heads, group)?;
        self.launch(&name, [singles as u32, heads, splits as u32], &args)?;
        let args = args![
            part_ptr: p(part),
            pos_ptr: p(self.index(self.at.positions)?),
            tok_ptr: p(self.index(toks)?),
            out_ptr: p(self.buf(Buf::Attn)?),
            out_stride: i32_arg(self.stride(Buf::Attn), "row stride")?,
            head_dim: i32_arg(shape.head_dim, "head_dim")?,
            window: window,
            split_keys: keys,
            max_ranges: ranges,
            max_splits: depth,
        ];
        let grid = [singles as u32, shape.num_heads as u32, 1];
        self.launch(&format!("attention_combine_d{d}"), grid, &args)
    }

    /// Rope `rope`'s frequencies on the device and the batch's runs of tokens under it.
    #[allow(clippy::type_complexity)]
    pub(super) fn rope_of(&self, rope: usize) -> Result<(&UploadedRope, &[(usize, usize, bool)])> {
        match (self.inv_freq.get(rope), self.rope_runs.get(rope)) {
            (Some(u), Some(r)) => Ok((u, r)),
            _ => Err(ModelError::Invalid(format!(
                "rope {rope} was not given to begin"
            ))),
        }
    }

    /// Programs per token of decode attention (`paged_attention[_split]`): one per KV head
    /// and chunk of `G_BLOCK` of its `group` query heads.
    pub(super) fn head_programs(
        &self,
        name: &str,
        num_kv_heads: usize,
        group: usize,
    ) -> Result<u32> {
        let g_block = usize::try_from(self.block(name, "G_BLOCK")?)
            .ok()
            .filter(|&g| g > 0)
            .ok_or_else(|| ModelError::Invalid(format!("kernel {name}: bad G_BLOCK")))?;
        u32::try_from(num_kv_heads * group.div_ceil(g_block))
            .map_err(|_| ModelError::Invalid(format!("{num_kv_heads} KV heads are too many")))
    }

    pub(super) fn head_block(&self, head_dim: usize) -> Result<usize> {
        let blocks = &self.dispatch.head_blocks;
        blocks
            .iter()
            .copied()
            .find(|&b| b >= head_dim)
            .ok_or_else(|| {
                ModelError::NotOnDevice(format!(
                    "head_dim {head_dim} is larger than the GPU kernels' largest ({})",
                    blocks.last().copied().unwrap_or(0)
                ))
            })
    }

    pub(super) fn rope_impl(&mut self, rope: usize, buf: Buf) -> Result<()> {
        let (width, stride) = (self.width(buf), self.stride(buf));
        let (u, runs) = self.rope_of(rope)?;
        let (half, hd) = (u.short.1.len(), u.head_dim);
        if half > self.block("rope", "HALF_BLOCK")? as usize {
            return Err(ModelError::Invalid(format!(
                "rotary dimension {} is larger than the GPU kernel's",
                2 * half
            )));
        }
        let x = self.buf(buf)?;
        let positions = self.index(self.at.positions)?;
        for &(first, n, long) in runs {
            let freq = u.freq(long);
            let args = args![
                x_ptr: p(x.offset(4 * first * stride)),
                pos_ptr: p(positions.offset(4 * first)),
                inv_freq_ptr: p(freq),
                row_stride: i32_arg(stride, "row stride")?,
                head_dim: i32_arg(hd, "head_dim")?,
                rot_half: i32_arg(half, "rotary half")?,
                scale: KernelArg::F32(u.mscale),
            ];
            self.launch("rope", [n as u32, (width / hd) as u32, 1], &args)?;
        }
        Ok(())
    }

    pub(super) fn rope_write_kv_impl(
        &mut self,
        rope: usize,
        kv: &mut KvCache,
        layer: usize,
        shape: &AttentionShape,
        _batch: &ForwardBatch,
    ) -> Result<()> {
        let cache = kv.device_layer(layer)?;
        let d = self.head_block(shape.head_dim)?;
        let name = format!("rope_kv_write_{}_d{d}", kv.dtype().name());
        let (u, runs) = self.rope_of(rope)?;
        let (half, hd) = (u.short.1.len(), u.head_dim);
        if hd != shape.head_dim || 2 * half > d {
            return Err(ModelError::Invalid(format!(
                "rope {rope} (head_dim {hd}, rotary {}) does not fit the keys' heads of {}",
                2 * half,
                shape.head_dim
            )));
        }
        // K and V share their slot's stride ([`place`]).
        let width = self.stride(Buf::K);
        let (k, v) = (self.buf(Buf::K)?, self.buf(Buf::V)?);
        let (slots, positions) = (self.index(self.at.slots)?, self.index(self.at.positions)?);
        for &(first, n, long) in runs {
            let freq = u.freq(long);
            let before = args![
                k_ptr: p(k.offset(4 * first * width)),
                v_ptr: p(v.offset(4 * first * width)),
            ];
            let args = with_cache(
                &before,
                cache,
                &args![
                    slot_ptr: p(slots.offset(4 * first)),
                    pos_ptr: p(positions.offset(4 * first)),
                    inv_freq_ptr: p(freq),
                    src_stride: i32_arg(width, "row stride")?,
                    num_kv_heads: i32_arg(shape.num_kv_heads, "kv heads")?,
                    head_dim: i32_arg(hd, "head_dim")?,
                    rot_half: i32_arg(half, "rotary half")?,
                    scale: KernelArg::F32(u.mscale),
                ],
            );
            self.launch(&name, [n as u32, shape.num_kv_heads as u32, 1], &args)?;
        }
        Ok(())
    }

    pub(super) fn write_kv_impl(
        &mut self,
        kv: &mut KvCache,
        layer: usize,
        shape: &AttentionShape,
        _batch: &ForwardBatch,
    ) -> Result<()> {
        let cache = kv.device_layer(layer)?;
        let d = self.head_block(shape.head_dim)?;
        let name = format!("kv_write_{}_d{d}", kv.dtype().name());
        let before = args![k_ptr: p(self.buf(Buf::K)?), v_ptr: p(self.buf(Buf::V)?)];
        let args = with_cache(
            &before,
            cache,
            &args![
                slot_ptr: p(self.index(self.at.slots)?),
                src_stride: i32_arg(self.stride(Buf::K), "row stride")?,
                num_kv_heads: i32_arg(shape.num_kv_heads, "kv heads")?,
                head_dim: i32_arg(shape.head_dim, "head_dim")?,
            ],
        );
        let grid = [self.tokens as u32, shape.num_kv_heads as u32, 1];
        self.launch(&name, grid, &args)
    }

    pub(super) fn attend_impl(
        &mut self,
        kv: &mut KvCache,
        layer: usize,
        shape: &AttentionShape,
        _batch: &ForwardBatch,
    ) -> Result<()> {
        let cache = kv.device_layer(layer)?;
        let d = self.head_block(shape.head_dim)?;
        let group = shape.num_heads / shape.num_kv_heads.max(1);
        let kind = kv.dtype().name();
        // Prompt chunks: tiles of query tokens (prefill_attention); the tokens that attend
        // alone: one program per token and head (paged_attention, through the token list).
        let (toks, singles) = self.at.toks;
        let mut launches = Vec::with_capacity(2);
        if let Some((at, n)) = self.at.tiles {
            let name = format!("prefill_attention_{kind}_d{d}");
            let prefill_m = self.dispatch.prefill_m;
            if self.block(&name, "BLOCK_M")? != prefill_m as i64 {
                return Err(ModelError::Invalid(format!(
                    "kernel {name} was built for another tile height than {prefill_m}"
                )));
            }
            let indices = vec![
                ("tiles_ptr", p(self.index(at)?)),
                ("pos_ptr", p(self.index(self.at.positions)?)),
            ];
            launches.push((name, indices, [n as u32, shape.num_heads as u32, 1]));
        }
        let split = singles > 0 && self.attn_splits > 1;
        if singles > 0 && !split {
            let name = format!("paged_attention_{kind}_d{d}");
            let indices = vec![
                ("bt_start_ptr", p(self.index(self.at.bt_start)?)),
                ("pos_ptr", p(self.index(self.at.positions)?)),
                ("tok_ptr", p(self.index(toks)?)),
            ];
            let heads = self.head_programs(&name, shape.num_kv_heads, group)?;
            launches.push((name, indices, [singles as u32, heads, 1]));
        }
        if split {
            self.attend_split(cache, kind, shape, d, group)?;
        }
        for (name, indices, grid) in launches {
            let mut args = with_cache(
                &args![q_ptr: p(self.buf(Buf::Q)?)],
                cache,
                &args![
                    block_tables_ptr: p(self.index(self.at.block_tables)?),
                ],
            );
            args.extend(indices);
            args.extend(args![
                out_ptr: p(self.buf(Buf::Attn)?),
                q_stride: i32_arg(self.stride(Buf::Q), "row stride")?,
                out_stride: i32_arg(self.stride(Buf::Attn), "row stride")?,
                group: i32_arg(group, "GQA group")?,
                num_kv_heads: i32_arg(shape.num_kv_heads, "kv heads")?,
                head_dim: i32_arg(shape.head_dim, "head_dim")?,
                block_size: i32_arg(shape.block_size, "block size")?,
                window: i32_arg(shape.sliding_window.unwrap_or(0), "sliding window")?,
                scale: KernelArg::F32(shape.scale),
                softcap: KernelArg::F32(shape.softcap.unwrap_or(0.0)),
            ]);
            self.launch(&name, grid, &args)?;
        }
        Ok(())
    }
}
