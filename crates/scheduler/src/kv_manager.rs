//! The KV cache manager: which blocks hold each sequence's K/V, as vLLM's `KVCacheManager`
//! does it. The scheduler decides *what* runs; this type owns the [`BlockPool`] and every
//! sequence's block table, and answers whether there is room.
//!
//! Operations:
//! - [`KvCacheManager::computed_blocks`]: the longest cached prefix of a prompt (full blocks
//!   wholly before its last token, whose logits are always computed);
//! - [`KvCacheManager::allocate_slots`]: room for `n` new tokens plus a look-ahead (proposed
//!   tokens), all or nothing;
//! - [`KvCacheManager::truncate`]: roll a sequence back to a computed length (rejected
//!   proposals), freeing the blocks wholly past it;
//! - [`KvCacheManager::cache_blocks`]: register full blocks whose tokens are final in the
//!   prefix cache;
//! - [`KvCacheManager::free`]: a finished, aborted or preempted sequence's blocks go back.
//!
//! Tiers below the pool (host memory, disk: their I/O is the engine's) meet the manager in two
//! places. Blocks the engine has read back and checked are *loadable*
//! ([`KvCacheManager::add_loadable`]): a prompt's cached prefix continues through them after
//! the pool's own hits, each taking a fresh block, and [`KvCacheManager::take_loads`] names
//! the blocks the engine must fill before the step's forward pass reads them. With
//! [`KvCacheManager::set_report_stores`], every block newly registered in the prefix cache is
//! named by [`KvCacheManager::take_stores`], for the tiers to keep a copy.
//!
//! Invariants (checked by [`KvCacheManager::check`] and the property tests):
//! - a block's ref count equals the number of block tables holding it; with no sequences the
//!   pool is whole;
//! - a sequence's first `num_cached` blocks were registered under `hashes[..num_cached]`
//!   (the map keeps the first block registered for a hash), and a block enters the prefix
//!   cache only once every token in it is final (never a proposal);
//! - a failed [`KvCacheManager::allocate_slots`] changes nothing;
//! - a block named by a load is registered in the prefix cache under the loaded hash, and the
//!   engine fills it before any forward pass runs.

use crate::{hash_block, BlockHash, BlockPool};
use ferrum_types::{BlockId, RequestId, TokenId};
use std::collections::{HashMap, HashSet};

/// One sequence's blocks.
#[derive(Debug, Clone, Default)]
struct SeqBlocks {
    blocks: Vec<BlockId>,
    /// Chained hashes of the sequence's leading full blocks of final tokens, as far as computed.
    hashes: Vec<BlockHash>,
    /// Leading blocks registered in the prefix cache.
    num_cached: usize,
}

/// A cached prefix found for a sequence about to be admitted. Holding it takes no reference:
/// pass it to [`KvCacheManager::allocate_slots`] before anything else touches the pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ComputedBlocks {
    blocks: Vec<BlockId>,
    /// Loadable blocks that continue the pool's hits, in order.
    loads: Vec<BlockHash>,
    /// Tokens whose K/V these blocks hold (the pool's and the loaded ones).
    pub num_tokens: usize,
}

impl ComputedBlocks {
    /// Tokens of these that come from a tier below the pool.
    pub fn num_loaded_tokens(&self, block_size: usize) -> usize {
        self.loads.len() * block_size
    }
}

/// Block tables of all sequences over one pool.
#[derive(Debug, Clone)]
pub struct KvCacheManager {
    block_size: usize,
    enable_prefix_caching: bool,
    pool: BlockPool,
    seqs: HashMap<RequestId, SeqBlocks>,
    /// Blocks the engine holds, checked, outside the pool (see the module docs).
    loadable: HashSet<BlockHash>,
    /// Blocks to fill from `loadable` before the next forward pass.
    loads: Vec<(BlockId, BlockHash)>,
    /// Blocks newly registered in the prefix cache, when reported.
    stores: Option<Vec<(BlockId, BlockHash)>>,
}

impl KvCacheManager {
    pub fn new(num_blocks: usize, block_size: usize, enable_prefix_caching: bool) -> Self {
        KvCacheManager {
            block_size,
            enable_prefix_caching,
            pool: BlockPool::new(num_blocks),
            seqs: HashMap::new(),
            loadable: HashSet::new(),
            loads: Vec::new(),
            stores: None,
        }
    }

    /// The K/V of the full block `hash` is at hand outside the pool (read back and checked):
    /// a prompt's cached prefix may continue through it.
    pub fn add_loadable(&mut self, hash: BlockHash) {
        if self.enable_prefix_caching {
            self.loadable.insert(hash);
        }
    }

    /// The block `hash` is no longer at hand outside the pool.
    pub fn remove_loadable(&mut self, hash: BlockHash) {
        self.loadable.remove(&hash);
    }

    pub fn is_loadable(&self, hash: BlockHash) -> bool {
        self.loadable.contains(&hash)
    }

    /// The blocks to fill with loadable K/V before the next forward pass (taken once).
    pub fn take_loads(&mut self) -> Vec<(BlockId, BlockHash)> {
        std::mem::take(&mut self.loads)
    }

    /// Whether blocks newly registered in the prefix cache are reported by
    /// [`KvCacheManager::take_stores`].
    pub fn set_report_stores(&mut self, on: bool) {
        self.stores = on.then(Vec::new);
    }

    /// The blocks registered in the prefix cache since the last call, whose K/V is computed
    /// and final (taken once; empty unless reported).
    pub fn take_stores(&mut self) -> Vec<(BlockId, BlockHash)> {
        self.stores.as_mut().map(std::mem::take).unwrap_or_default()
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// A sequence's block table (empty when it holds none).
    pub fn block_table(&self, id: RequestId) -> &[BlockId] {
        self.seqs.get(&id).map_or(&[], |s| s.blocks.as_slice())
    }

    /// Blocks that cover `num_tokens` tokens.
    fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }

    /// The longest run of leading full blocks of `tokens` found in the prefix cache, stopping
    /// before the block holding the last token (its logits are needed, so it is computed).
    /// Hashes computed on the way are kept for [`KvCacheManager::cache_blocks`].
    pub fn computed_blocks(&mut self, id: RequestId, tokens: &[TokenId]) -> ComputedBlocks {
        if !self.enable_prefix_caching || tokens.is_empty() {
            return ComputedBlocks::default();
        }
        let bs = self.block_size;
        let reusable = (tokens.len() - 1) / bs;
        let seq = self.seqs.entry(id).or_default();
        extend_hashes(&mut seq.hashes, tokens, reusable, bs);
        let mut blocks = Vec::new();
        let mut loads = Vec::new();
        for h in &seq.hashes[..reusable] {
            match self.pool.lookup(*h) {
                Some(b) if loads.is_empty() => blocks.push(b),
                // Past the pool's hits: loadable blocks only (a block in the pool after a
                // loadable one is loaded again rather than shared: rare, and simpler).
                _ if self.loadable.contains(h) => loads.push(*h),
                _ => break,
            }
        }
        ComputedBlocks {
            num_tokens: (blocks.len() + loads.len()) * bs,
            blocks,
            loads,
        }
    }

    /// Makes room for `num_new + num_lookahead` tokens after the sequence's first
    /// `num_computed`. A sequence holding no blocks may start from `hits` (from
    /// [`KvCacheManager::computed_blocks`] on the same tokens; `num_computed` is then
    /// `hits.num_tokens`). All or nothing: `false` when the pool lacks free blocks, and then
    /// nothing changed.
    pub fn allocate_slots(
        &mut self,
        id: RequestId,
        num_computed: usize,
        num_new: usize,
        num_lookahead: usize,
        hits: Option<&ComputedBlocks>,
    ) -> bool {
        let need = self.blocks_for(num_computed + num_new + num_lookahead);
        let held = self.block_table(id).len();
        let loads = hits.map_or(&[][..], |h| h.loads.as_slice());
        let hits = hits.map_or(&[][..], |h| h.blocks.as_slice());
        debug_assert!(
            (hits.is_empty() && loads.is_empty()) || held == 0,
            "hits only start a sequence"
        );
        let missing = need.saturating_sub(held + hits.len() + loads.len());
        // A cached block with no holder sits in the free queue: taking it costs a free block.
        let hits_free = hits
            .iter()
            .filter(|&&b| self.pool.ref_count(b) == 0)
            .count();
        if missing + loads.len() + hits_free > self.pool.num_free() {
            return false;
        }
        let seq = self.seqs.entry(id).or_default();
        for &b in hits {
            self.pool.touch(b);
            seq.blocks.push(b);
        }
        for &h in loads {
            let Some(b) = self.pool.allocate() else {
                unreachable!("free blocks were counted")
            };
            // Registered now: the engine fills it before the forward pass that reads it.
            self.pool.cache(b, h);
            self.loads.push((b, h));
            seq.blocks.push(b);
        }
        seq.num_cached = seq.num_cached.max(hits.len() + loads.len());
        for _ in 0..missing {
            match self.pool.allocate() {
                Some(b) => seq.blocks.push(b),
                None => unreachable!("free blocks were counted"),
            }
        }
        true
    }

    /// Rolls a sequence back to its first `num_tokens` tokens (rejected proposals): blocks
    /// wholly past them are freed; the slots past them in the last kept block are simply
    /// overwritten when the sequence grows again. Blocks in the prefix cache hold final tokens
    /// and may be shared, so they are never cut: the rollback stops at the cached prefix.
    /// Returns the tokens kept.
    pub fn truncate(&mut self, id: RequestId, num_tokens: usize) -> usize {
        let Some(seq) = self.seqs.get_mut(&id) else {
            return 0;
        };
        let num_tokens = num_tokens.max(seq.num_cached * self.block_size);
        let keep = num_tokens.div_ceil(self.block_size);
        if seq.blocks.len() > keep {
            self.pool.free_all(&seq.blocks[keep..]);
            seq.blocks.truncate(keep);
        }
        seq.hashes.truncate(num_tokens / self.block_size);
        num_tokens
    }

    /// Registers in the prefix cache the full blocks among `tokens[..num_final]`: these tokens
    /// are final (prompt or accepted output) and their K/V is computed.
    pub fn cache_blocks(&mut self, id: RequestId, tokens: &[TokenId], num_final: usize) {
        if !self.enable_prefix_caching {
            return;
        }
        let bs = self.block_size;
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        let full = (num_final.min(tokens.len()) / bs).min(seq.blocks.len());
        if full <= seq.num_cached {
            return;
        }
        extend_hashes(&mut seq.hashes, tokens, full, bs);
        for i in seq.num_cached..full {
            let (b, h) = (seq.blocks[i], seq.hashes[i]);
            // Only the block the map keeps for a hash is reported (a duplicate adds nothing).
            self.pool.cache(b, h);
            if let Some(stores) = self.stores.as_mut() {
                if self.pool.lookup(h) == Some(b) {
                    stores.push((b, h));
                }
            }
        }
        seq.num_cached = full;
    }

    /// Frees all of a sequence's blocks (last first, so its tail is evicted before its
    /// prefix) and forgets it. Unknown ids are ignored.
    pub fn free(&mut self, id: RequestId) {
        if let Some(seq) = self.seqs.remove(&id) {
            self.pool.free_all(&seq.blocks);
        }
    }

    /// Checks the pool against the block tables; for tests.
    pub fn check(&self) -> Result<(), String> {
        self.pool.check()?;
        let mut refs = vec![0u32; self.pool.num_blocks()];
        for (id, s) in &self.seqs {
            if s.num_cached > s.blocks.len() || s.num_cached > s.hashes.len() {
                return Err(format!("sequence {id}: more cached blocks than blocks"));
            }
            for &b in &s.blocks {
                refs[b as usize] += 1;
            }
        }
        for (b, &r) in refs.iter().enumerate() {
            if self.pool.ref_count(b as BlockId) != r {
                return Err(format!(
                    "block {b}: ref count {} but {r} tables hold it",
                    self.pool.ref_count(b as BlockId)
                ));
            }
        }
        Ok(())
    }
}

/// Makes sure `hashes` covers the first `blocks` full blocks of `tokens`.
fn extend_hashes(hashes: &mut Vec<BlockHash>, tokens: &[TokenId], blocks: usize, bs: usize) {
    while hashes.len() < blocks {
        let i = hashes.len();
        let parent = i.checked_sub(1).map(|p| hashes[p]);
        hashes.push(hash_block(parent, &tokens[i * bs..(i + 1) * bs]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_truncate_and_cache_only_final_blocks() {
        let mut m = KvCacheManager::new(8, 4, true);
        let toks: Vec<TokenId> = (0..10).collect();
        let hits = m.computed_blocks(1, &toks);
        assert_eq!(hits.num_tokens, 0);
        // 10 prompt tokens plus 3 proposed: 4 blocks.
        assert!(m.allocate_slots(1, 0, 10, 3, Some(&hits)));
        assert_eq!(m.block_table(1).len(), 4);
        // Only the first 8 tokens are final and full: two blocks enter the cache.
        m.cache_blocks(1, &toks, 10);
        assert_eq!(m.pool().num_cached(), 2);
        // All proposals rejected: back to 10 tokens, the fourth block is freed.
        m.truncate(1, 10);
        assert_eq!(m.block_table(1).len(), 3);
        assert_eq!(m.pool().num_free(), 5);
        // Too much at once changes nothing.
        assert!(!m.allocate_slots(1, 10, 30, 0, None));
        assert_eq!(m.block_table(1).len(), 3);
        m.check().unwrap();
        // A second sequence with the same first 9 tokens reuses both cached blocks.
        let hits = m.computed_blocks(2, &toks[..9]);
        assert_eq!(hits.num_tokens, 8);
        assert!(m.allocate_slots(2, 8, 1, 0, Some(&hits)));
        assert_eq!(m.block_table(2)[..2], m.block_table(1)[..2]);
        assert_eq!(m.pool().ref_count(m.block_table(1)[0]), 2);
        m.check().unwrap();
        m.free(1);
        m.free(2);
        m.check().unwrap();
        assert_eq!(m.pool().num_free(), 8);
        assert_eq!(m.pool().num_cached(), 2, "cached K/V outlives its holders");
    }

    #[test]
    fn blocks_evicted_from_the_pool_come_back_as_loads() {
        let mut m = KvCacheManager::new(3, 2, true);
        m.set_report_stores(true);
        let a: Vec<TokenId> = (0..5).collect();
        let hits = m.computed_blocks(1, &a);
        assert!(m.allocate_slots(1, 0, 5, 0, Some(&hits)));
        m.cache_blocks(1, &a, 5);
        let stored = m.take_stores();
        assert_eq!(stored.len(), 2, "two full blocks");
        assert!(m.take_stores().is_empty(), "taken once");
        for &(_, h) in &stored {
            m.add_loadable(h);
        }
        m.free(1);
        // Another prompt takes every block: the first one's K/V is gone from the pool.
        assert!(m.allocate_slots(2, 0, 5, 0, None));
        m.free(2);
        assert_eq!(m.pool().num_cached(), 0);
        // Asked again, its prefix comes back from the tier: two loads, no recompute.
        let hits = m.computed_blocks(3, &a);
        assert_eq!((hits.num_tokens, hits.num_loaded_tokens(2)), (4, 4));
        assert!(m.allocate_slots(3, 4, 1, 0, Some(&hits)));
        let loads = m.take_loads();
        let hashes: Vec<BlockHash> = loads.iter().map(|&(_, h)| h).collect();
        assert_eq!(hashes, stored.iter().map(|&(_, h)| h).collect::<Vec<_>>());
        assert_eq!(m.block_table(3)[..2], [loads[0].0, loads[1].0]);
        assert_eq!(m.pool().lookup(hashes[1]), Some(loads[1].0));
        // Loaded blocks are not stored again.
        m.cache_blocks(3, &a, 5);
        assert!(m.take_stores().is_empty());
        m.check().unwrap();
        m.free(3);
        m.check().unwrap();
        // Not loadable any more: nothing to load.
        m.remove_loadable(hashes[0]);
        let mut n = KvCacheManager::new(3, 2, true);
        n.add_loadable(hashes[1]);
        assert_eq!(
            n.computed_blocks(4, &a).num_tokens,
            0,
            "a chain starts at its first block"
        );
    }

    #[test]
    fn a_rollback_never_cuts_into_cached_blocks() {
        let mut m = KvCacheManager::new(4, 2, true);
        let toks: Vec<TokenId> = (0..6).collect();
        assert!(m.allocate_slots(7, 0, 6, 2, None));
        m.cache_blocks(7, &toks, 5);
        assert_eq!(m.truncate(7, 3), 4, "two cached blocks stay whole");
        assert_eq!(m.block_table(7).len(), 2);
        m.check().unwrap();
        assert!(m.allocate_slots(7, 4, 2, 0, None));
        m.cache_blocks(7, &toks, 6);
        assert_eq!(m.pool().num_cached(), 3);
        m.check().unwrap();
    }
}
