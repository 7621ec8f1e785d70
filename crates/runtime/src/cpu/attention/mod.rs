//! Paged attention over a block-table KV cache, with online softmax.
//!
//! Cache layout, per layer: keys `[num_blocks, num_kv_heads, head_dim, block_size]` (each
//! block's keys transposed, so the scores of a query against a whole block are one vector
//! multiply-add per dimension) and values `[num_blocks, num_kv_heads, block_size, head_dim]`.
//! Token `j` of a sequence lives in block `block_table[j / block_size]` at offset
//! `j % block_size`. The query at position `p` attends to keys `0..=p` (causal), and with a
//! sliding window `w` only to keys `j` with `p - j < w`. Keys and values are read in place
//! through the block table: nothing is gathered.
//!
//! Work items are a sequence's query heads that share one KV head, for a run of its tokens, so a
//! block of keys and values is loaded once for all of them; when that gives too few items for the
//! pool, single heads. Every (token, head) pair runs the same arithmetic whatever item it is in,
//! so results never depend on the batch, the chunking of a prompt or the thread count.
//!
//! The cache holds f32 or a half type ([`KvElem`]); keys and values are widened to f32 as they
//! are loaded, and everything after that is the same f32 arithmetic. An int8 cache also holds
//! f16 scales, one per [`SCALE_GROUP`] values of each (block, KV head, slot)'s key and value
//! ([`RowScales`], `[num_blocks, num_kv_heads, groups, block_size]`): a key group's scale
//! multiplies the group's partial dot product, a value group's scale the key's softmax weight
//! for that group (after the weight joined the denominator).
//!
//! Files: [`planner`] cuts the batch into items and folds split parts; [`kernels`] runs an
//! item; [`block`] runs its pairs against one block, updating each pair's [`softmax`] state;
//! [`prefetch`] hints the blocks read next; [`kv_write`] writes new keys and values; [`KvLayerMut`] dispatches a layer's cache by
//! its element type.

mod block;
#[cfg(test)]
mod int8_tests;
mod kernels;
mod kv_write;
mod planner;
mod prefetch;
mod softmax;
#[cfg(test)]
mod tests;

pub use kv_write::{write_kv, write_kv_par, write_kv_scaled};
pub use planner::{paged_attention, paged_attention_scaled};

use crate::cpu::kv_dtype::SCALE_GROUP;
use crate::ThreadPool;
use ferrum_types::batch::SeqSlice;
use half::{bf16, f16};

/// The scales of a scaled cache's rows (int8): one per [`SCALE_GROUP`] values of each
/// (block, KV head, slot) for keys and for values, `[num_blocks, num_kv_heads, groups,
/// block_size]` each (`AttentionShape::scale_base`). Empty for the float types.
#[derive(Debug, Clone, Copy, Default)]
pub struct RowScales<'a> {
    pub k: &'a [f16],
    pub v: &'a [f16],
}

/// Largest head size the kernel's stack buffers hold.
pub const MAX_HEAD_DIM: usize = 512;
/// Largest KV block size the kernel's stack buffers hold.
pub const MAX_BLOCK_SIZE: usize = 256;
/// Most (token, head) pairs one work item carries.
pub(crate) const MAX_PAIRS: usize = 16;

/// Sizes of an attention layer and its cache.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// Multiplier of `q·k`, usually `1/sqrt(head_dim)`.
    pub scale: f32,
    /// Keys further back than this many positions are masked.
    pub sliding_window: Option<usize>,
    /// Scaled scores become `cap * tanh(s / cap)` (Gemma 2's attention soft-capping).
    pub softcap: Option<f32>,
}

impl AttentionShape {
    /// Start of (block, kv head) in either cache.
    pub(crate) fn block_base(&self, block: usize, kv_head: usize) -> usize {
        (block * self.num_kv_heads + kv_head) * self.block_size * self.head_dim
    }

    /// Scale groups of a row in a scaled cache.
    pub fn scale_groups(&self) -> usize {
        self.head_dim.div_ceil(SCALE_GROUP)
    }

    /// Start of (block, kv head) in either scale buffer of a scaled cache: its
    /// `[groups, block_size]` scales.
    pub(crate) fn scale_base(&self, block: usize, kv_head: usize) -> usize {
        (block * self.num_kv_heads + kv_head) * self.block_size * self.scale_groups()
    }
}

/// Positions per softmax partition: every (token, head) pair's keys are cut at multiples of
/// this, each part gets its own online softmax, and the parts are folded in order
/// ([`fold`]). A decode's parts can so run on different threads with the same result.
pub const PART: usize = 256;
/// Lanes of a pair's softmax denominator: key `j` of a block adds to lane `j % LANES`.
pub(crate) const LANES: usize = 16;

/// One layer's key and value caches (see the module doc for the layout), in
/// whichever type the cache holds.
#[derive(Debug)]
pub enum KvLayerMut<'a> {
    F32(&'a mut [f32], &'a mut [f32]),
    F16(&'a mut [f16], &'a mut [f16]),
    Bf16(&'a mut [bf16], &'a mut [bf16]),
    /// Keys, values, key scales, value scales.
    Int8(&'a mut [i8], &'a mut [i8], &'a mut [f16], &'a mut [f16]),
}

impl KvLayerMut<'_> {
    /// [`write_kv`] into this layer, split over `pool` for larger batches (the same bits).
    pub fn write(
        &mut self,
        pool: &ThreadPool,
        k: &[f32],
        v: &[f32],
        slot_mapping: &[u32],
        shape: &AttentionShape,
    ) {
        match self {
            KvLayerMut::F32(kc, vc) => write_kv_par(pool, k, v, slot_mapping, shape, kc, vc),
            KvLayerMut::F16(kc, vc) => write_kv_par(pool, k, v, slot_mapping, shape, kc, vc),
            KvLayerMut::Bf16(kc, vc) => write_kv_par(pool, k, v, slot_mapping, shape, kc, vc),
            KvLayerMut::Int8(kc, vc, ks, vs) => {
                write_kv_scaled(Some(pool), k, v, slot_mapping, shape, (kc, vc, ks, vs))
            }
        }
    }

    /// [`paged_attention`] over this layer.
    #[allow(clippy::too_many_arguments)]
    pub fn attend(
        &self,
        pool: &ThreadPool,
        q: &[f32],
        seqs: &[SeqSlice],
        block_tables: &[u32],
        shape: &AttentionShape,
        out: &mut [f32],
        partials: &mut Vec<f32>,
    ) {
        match self {
            KvLayerMut::F32(kc, vc) => {
                paged_attention(pool, q, kc, vc, seqs, block_tables, shape, out, partials)
            }
            KvLayerMut::F16(kc, vc) => {
                paged_attention(pool, q, kc, vc, seqs, block_tables, shape, out, partials)
            }
            KvLayerMut::Bf16(kc, vc) => {
                paged_attention(pool, q, kc, vc, seqs, block_tables, shape, out, partials)
            }
            KvLayerMut::Int8(kc, vc, ks, vs) => paged_attention_scaled(
                pool,
                q,
                (kc, vc, RowScales { k: ks, v: vs }),
                seqs,
                block_tables,
                shape,
                out,
                partials,
            ),
        }
    }
}
