//! [`HostTier`]: full KV blocks kept in host memory below a GPU's pool (`--kv-offload-memory`),
//! page-locked, as the copies that took them out of the cache left them, so a prefix hit
//! brings them back by an asynchronous copy instead of a prefill.
//!
//! The engine thread owns it; it holds no device state of its own (a [`HostBlock`]'s memory
//! is the KV cache's to reuse, [`ferrum_models::KvCache::recycle_host_block`]).
//!
//! Invariants:
//! - `blocks` and `index` hold the same hashes; `index.used()` is the sum of their
//!   footprints and never exceeds the capacity;
//! - a block taken for a request ([`HostTier::take`]) is in neither until it is put back
//!   ([`HostTier::put`]), so eviction never frees memory a pending upload reads; while taken,
//!   its bytes are outside the count (at most the prefixes of the requests being admitted).

use super::TierCounters;
use ferrum_models::HostBlock;
use ferrum_scheduler::{BlockHash, TierIndex};
use std::collections::HashMap;

/// The host tier of one engine; see the module docs.
#[derive(Debug)]
pub struct HostTier {
    index: TierIndex,
    blocks: HashMap<BlockHash, HostBlock>,
}

impl HostTier {
    /// An empty tier holding at most `max_bytes` of blocks.
    pub fn new(max_bytes: u64) -> HostTier {
        HostTier {
            index: TierIndex::new(max_bytes),
            blocks: HashMap::new(),
        }
    }

    pub fn holds(&self, hash: BlockHash) -> bool {
        self.blocks.contains_key(&hash)
    }

    pub fn index(&self) -> &TierIndex {
        &self.index
    }

    /// Keeps `block` under `hash`, as a hit (`hit`: it was just used) or not (new, or taken
    /// and not used); returns what it let go to make room (`block` itself when it is larger
    /// than the tier, or when the hash is held already), for the caller to reuse. Counts
    /// evictions and what is held.
    pub fn put(
        &mut self,
        hash: BlockHash,
        block: HostBlock,
        hit: bool,
        counters: &mut TierCounters,
    ) -> Vec<HostBlock> {
        if self.blocks.contains_key(&hash) {
            self.index.touch(hash);
            return vec![block];
        }
        let size = block.footprint() as u64;
        let mut freed = Vec::new();
        for old in self.index.insert(hash, size) {
            if old == hash {
                // Larger than the whole tier: not kept.
                freed.push(block);
                return freed;
            }
            if let Some(b) = self.blocks.remove(&old) {
                counters.evictions += 1;
                freed.push(b);
            }
        }
        if hit {
            self.index.touch(hash);
        }
        self.blocks.insert(hash, block);
        counters.blocks = self.blocks.len() as u64;
        counters.bytes = self.index.used();
        freed
    }

    /// Takes `hash`'s block out for a request (see the module docs), or `None`.
    pub fn take(&mut self, hash: BlockHash, counters: &mut TierCounters) -> Option<HostBlock> {
        let b = self.blocks.remove(&hash)?;
        self.index.remove(hash);
        counters.blocks = self.blocks.len() as u64;
        counters.bytes = self.index.used();
        Some(b)
    }

    /// Every block, for the caller to free (the engine is ending).
    pub fn drain(&mut self) -> Vec<HostBlock> {
        self.index = TierIndex::new(self.index.capacity());
        self.blocks.drain().map(|(_, b)| b).collect()
    }

    /// Checks the invariants; for tests.
    pub fn check(&self) -> Result<(), String> {
        self.index.check()?;
        if self.index.len() != self.blocks.len()
            || self.blocks.keys().any(|h| !self.index.contains(*h))
        {
            return Err("the index and the blocks disagree".into());
        }
        let sum: u64 = self.blocks.values().map(|b| b.footprint() as u64).sum();
        if sum != self.index.used() {
            return Err(format!(
                "{sum} bytes held, the index counts {}",
                self.index.used()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrum_scheduler::hash_block;

    fn block(bytes: usize) -> HostBlock {
        HostBlock::from_bytes(vec![7; bytes])
    }

    #[test]
    fn keeps_what_is_used_again_and_gives_back_what_it_lets_go() {
        let mut c = TierCounters::default();
        let mut t = HostTier::new(300);
        let h: Vec<BlockHash> = (0..5).map(|i| hash_block(None, &[i])).collect();
        assert!(t.put(h[0], block(100), false, &mut c).is_empty());
        assert!(t.put(h[1], block(100), false, &mut c).is_empty());
        // h[0] is used again: protected.
        let b = t.take(h[0], &mut c).unwrap();
        assert!(!t.holds(h[0]));
        assert!(t.put(h[0], b, true, &mut c).is_empty());
        assert!(t.put(h[2], block(100), false, &mut c).is_empty());
        // Full: h[1], used once, goes first, and its memory comes back.
        let freed = t.put(h[3], block(100), false, &mut c);
        assert_eq!(freed.len(), 1);
        assert!(t.holds(h[0]) && !t.holds(h[1]) && t.holds(h[2]) && t.holds(h[3]));
        assert_eq!((c.evictions, c.blocks, c.bytes), (1, 3, 300));
        // Larger than the tier: given back at once; held already: given back, touched.
        assert_eq!(t.put(h[4], block(301), false, &mut c).len(), 1);
        assert_eq!(t.put(h[0], block(100), false, &mut c).len(), 1);
        assert!(!t.holds(h[4]));
        t.check().unwrap();
        assert_eq!(t.drain().len(), 3);
        t.check().unwrap();
        assert_eq!(t.index().used(), 0);
    }
}
