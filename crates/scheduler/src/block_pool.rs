//! The KV block pool: reference-counted blocks, a free queue, and a map from the chained hash
//! of a full block's tokens to the block that holds their K/V (prefix reuse).
//!
//! Invariants:
//! - every block is either in use (`ref_count > 0`) or in the free queue, never both;
//! - the free queue is in eviction order: blocks that hold nothing reusable (no hash) come
//!   first, most recently freed first (their pages are warm, and untouched blocks stay
//!   untouched), then blocks holding cached K/V, least recently freed first; a cached block is
//!   only overwritten (and forgotten by the cache map) when it is taken;
//! - `cached[h] == b` implies `hash[b] == Some(h)`; a block's hash is set once its tokens are
//!   all computed and cleared when the block is reused for other tokens;
//! - when no sequence holds blocks, `num_free() == num_blocks()` (nothing leaks).

use crate::BlockHash;
use ferrum_types::BlockId;
use std::collections::HashMap;

const NONE: u32 = u32::MAX;

/// Blocks of the paged KV cache, as the scheduler sees them (no tensors here).
#[derive(Debug, Clone)]
pub struct BlockPool {
    ref_count: Vec<u32>,
    hash: Vec<Option<BlockHash>>,
    cached: HashMap<BlockHash, BlockId>,
    // Free queue: a doubly linked list through `prev`/`next`, so a cached block can leave it
    // in O(1) when a new request reuses it.
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    num_free: usize,
}

impl BlockPool {
    pub fn new(num_blocks: usize) -> BlockPool {
        let n = num_blocks as u32;
        let mut pool = BlockPool {
            ref_count: vec![0; num_blocks],
            hash: vec![None; num_blocks],
            cached: HashMap::new(),
            prev: vec![NONE; num_blocks],
            next: vec![NONE; num_blocks],
            head: NONE,
            tail: NONE,
            num_free: 0,
        };
        for b in 0..n {
            pool.push_back(b);
        }
        pool
    }

    pub fn num_blocks(&self) -> usize {
        self.ref_count.len()
    }

    /// Blocks that can be handed out (free ones and evictable cached ones).
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Free blocks that still hold reusable K/V.
    pub fn num_cached_free(&self) -> usize {
        self.cached
            .values()
            .filter(|&&b| self.ref_count[b as usize] == 0)
            .count()
    }

    /// Entries in the prefix cache (in use or evictable).
    pub fn num_cached(&self) -> usize {
        self.cached.len()
    }

    pub fn ref_count(&self, b: BlockId) -> u32 {
        self.ref_count[b as usize]
    }

    fn push_front(&mut self, b: u32) {
        self.prev[b as usize] = NONE;
        self.next[b as usize] = self.head;
        if self.head == NONE {
            self.tail = b;
        } else {
            self.prev[self.head as usize] = b;
        }
        self.head = b;
        self.num_free += 1;
    }

    fn push_back(&mut self, b: u32) {
        self.prev[b as usize] = self.tail;
        self.next[b as usize] = NONE;
        if self.tail == NONE {
            self.head = b;
        } else {
            self.next[self.tail as usize] = b;
        }
        self.tail = b;
        self.num_free += 1;
    }

    fn unlink(&mut self, b: u32) {
        let (p, n) = (self.prev[b as usize], self.next[b as usize]);
        if p == NONE {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NONE {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[b as usize] = NONE;
        self.next[b as usize] = NONE;
        self.num_free -= 1;
    }

    /// Takes the least recently freed block (evicting its cached K/V, if any) with one ref.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let b = self.head;
        if b == NONE {
            return None;
        }
        self.unlink(b);
        if let Some(h) = self.hash[b as usize].take() {
            if self.cached.get(&h) == Some(&b) {
                self.cached.remove(&h);
            }
        }
        self.ref_count[b as usize] = 1;
        Some(b)
    }

    /// The block caching `hash`, if any.
    pub fn lookup(&self, hash: BlockHash) -> Option<BlockId> {
        self.cached.get(&hash).copied()
    }

    /// Adds a reference to a block (a cache hit or a fork); a free block leaves the queue.
    pub fn touch(&mut self, b: BlockId) {
        if self.ref_count[b as usize] == 0 {
            self.unlink(b);
        }
        self.ref_count[b as usize] += 1;
    }

    /// Drops one reference. A block with none left joins the free queue: at the back, keeping
    /// its cached K/V until it is reused, when it holds any; else at the front, to be reused
    /// first.
    pub fn free(&mut self, b: BlockId) {
        let rc = &mut self.ref_count[b as usize];
        debug_assert!(*rc > 0, "block {b} freed twice");
        if *rc == 0 {
            return;
        }
        *rc -= 1;
        if *rc == 0 {
            if self.hash[b as usize].is_some() {
                self.push_back(b);
            } else {
                self.push_front(b);
            }
        }
    }

    /// Frees a sequence's blocks last first, so its tail (the least shareable part) is
    /// evicted before its prefix.
    pub fn free_all(&mut self, blocks: &[BlockId]) {
        for &b in blocks.iter().rev() {
            self.free(b);
        }
    }

    /// Records that block `b` (in use) holds the full block with chained hash `hash`. If another
    /// block already caches the same tokens, the map keeps that one.
    pub fn cache(&mut self, b: BlockId, hash: BlockHash) {
        if self.hash[b as usize].is_some() {
            return;
        }
        self.hash[b as usize] = Some(hash);
        self.cached.entry(hash).or_insert(b);
    }

    /// Forgets every cached prefix (blocks in use keep their contents).
    pub fn reset_prefix_cache(&mut self) {
        self.cached.clear();
        for h in &mut self.hash {
            *h = None;
        }
    }

    /// Checks the invariants; for tests.
    pub fn check(&self) -> Result<(), String> {
        let mut in_queue = vec![false; self.num_blocks()];
        let mut n = 0;
        let mut b = self.head;
        while b != NONE {
            if in_queue[b as usize] {
                return Err(format!("block {b} twice in the free queue"));
            }
            in_queue[b as usize] = true;
            n += 1;
            b = self.next[b as usize];
        }
        if n != self.num_free {
            return Err(format!(
                "free queue has {n} blocks, counter says {}",
                self.num_free
            ));
        }
        for (i, (&rc, &q)) in self.ref_count.iter().zip(&in_queue).enumerate() {
            if (rc == 0) != q {
                return Err(format!("block {i}: ref count {rc} but in free queue: {q}"));
            }
        }
        for (h, &b) in &self.cached {
            if self.hash[b as usize] != Some(*h) {
                return Err(format!("cache map points at block {b} whose hash differs"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash_block;

    #[test]
    fn allocate_free_and_lru_eviction() {
        let mut p = BlockPool::new(3);
        let a = p.allocate().unwrap();
        let b = p.allocate().unwrap();
        let c = p.allocate().unwrap();
        assert_eq!(p.allocate(), None);
        let ha = hash_block(None, &[1, 2]);
        let hb = hash_block(Some(ha), &[3, 4]);
        p.cache(a, ha);
        p.cache(b, hb);
        // Free c, then b, then a: c is evicted first, then b.
        p.free(c);
        p.free(b);
        p.free(a);
        assert_eq!(p.num_free(), 3);
        assert_eq!(p.num_cached_free(), 2);
        assert_eq!(p.lookup(ha), Some(a));
        // Reusing `a` through the cache takes it out of the free queue.
        p.touch(a);
        assert_eq!(p.num_free(), 2);
        assert_eq!(p.allocate(), Some(c));
        assert_eq!(p.allocate(), Some(b));
        assert_eq!(p.lookup(hb), None, "b was evicted");
        assert_eq!(p.lookup(ha), Some(a));
        p.check().unwrap();
    }

    #[test]
    fn blocks_without_cached_kv_are_reused_first() {
        let mut p = BlockPool::new(4);
        let a = p.allocate().unwrap();
        let b = p.allocate().unwrap();
        p.cache(a, hash_block(None, &[1]));
        p.free(a);
        p.free(b);
        // b (nothing cached, warm) first, then the untouched blocks, then a (cached) last.
        let order: Vec<_> = (0..4).map(|_| p.allocate().unwrap()).collect();
        assert_eq!(order, vec![b, 2, 3, a]);
        p.check().unwrap();
    }
}
