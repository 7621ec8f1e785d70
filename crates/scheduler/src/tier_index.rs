//! [`TierIndex`]: what a KV tier below the pool (host memory, disk) holds, by block hash, and
//! the order it gives things up in. Pure bookkeeping: the tier's bytes and I/O live with the
//! engine, which drives this index.
//!
//! The order is a segmented LRU, so what is kept is what was used recently *and* often: a new
//! entry joins the probation segment; a hit moves it to the protected segment (at most
//! [`PROTECTED_SHARE`] of the capacity; its least recent entries fall back to probation).
//! Room is made by evicting probation's least recent entry first, then protected's. A scan of
//! once-used blocks (many documents asked in turn) thus evicts other once-used blocks, not the
//! prefixes that are asked for again and again.
//!
//! Invariants (checked by [`TierIndex::check`] and the property tests):
//! - `used` is the sum of the entries' sizes and never exceeds `capacity`;
//! - every entry is in exactly one segment, under its own stamp; the protected segment's
//!   bytes never exceed its share (except for a single entry larger than the share).

use crate::BlockHash;
use std::collections::{BTreeMap, HashMap};

/// The protected segment's share of the capacity, in percent.
pub const PROTECTED_SHARE: u64 = 80;

#[derive(Debug, Clone, Copy)]
struct Entry {
    bytes: u64,
    protected: bool,
    /// Recency: larger is more recent; the entry's key in its segment.
    stamp: u64,
}

/// A tier's contents and eviction order; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct TierIndex {
    capacity: u64,
    used: u64,
    protected_bytes: u64,
    entries: HashMap<BlockHash, Entry>,
    probation: BTreeMap<u64, BlockHash>,
    protected: BTreeMap<u64, BlockHash>,
    clock: u64,
}

impl TierIndex {
    /// An empty index of a tier holding at most `capacity` bytes.
    pub fn new(capacity: u64) -> TierIndex {
        TierIndex {
            capacity,
            ..TierIndex::default()
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes held.
    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains(&self, hash: BlockHash) -> bool {
        self.entries.contains_key(&hash)
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Adds an entry of `bytes` as the most recent of probation, evicting what makes room;
    /// returns the evicted hashes (their bytes are the caller's to delete). An entry larger
    /// than the whole capacity is not added (it is returned as evicted itself); one already
    /// present is only touched.
    pub fn insert(&mut self, hash: BlockHash, bytes: u64) -> Vec<BlockHash> {
        if self.contains(hash) {
            self.touch(hash);
            return Vec::new();
        }
        if bytes > self.capacity {
            return vec![hash];
        }
        let mut evicted = Vec::new();
        while self.used + bytes > self.capacity {
            match self.lru() {
                Some(victim) => {
                    self.remove(victim);
                    evicted.push(victim);
                }
                None => break,
            }
        }
        let stamp = self.tick();
        self.entries.insert(
            hash,
            Entry {
                bytes,
                protected: false,
                stamp,
            },
        );
        self.probation.insert(stamp, hash);
        self.used += bytes;
        evicted
    }

    /// The next entry to evict: probation's least recent, then protected's.
    fn lru(&self) -> Option<BlockHash> {
        self.probation
            .values()
            .next()
            .or_else(|| self.protected.values().next())
            .copied()
    }

    /// Records a hit: the entry becomes the most recent of the protected segment. `false`
    /// when the hash is not here.
    pub fn touch(&mut self, hash: BlockHash) -> bool {
        let Some(e) = self.entries.get(&hash).copied() else {
            return false;
        };
        if e.protected {
            self.protected.remove(&e.stamp);
        } else {
            self.probation.remove(&e.stamp);
            self.protected_bytes += e.bytes;
        }
        let stamp = self.tick();
        self.protected.insert(stamp, hash);
        self.entries.insert(
            hash,
            Entry {
                protected: true,
                stamp,
                ..e
            },
        );
        // Over its share, protected's least recent entries go back to probation (as its most
        // recent), never the one just hit.
        let share = (u128::from(self.capacity) * u128::from(PROTECTED_SHARE) / 100) as u64;
        while self.protected_bytes > share && self.protected.len() > 1 {
            let Some((&old, &h)) = self.protected.iter().next() else {
                break;
            };
            self.protected.remove(&old);
            let s = self.tick();
            self.probation.insert(s, h);
            if let Some(x) = self.entries.get_mut(&h) {
                self.protected_bytes -= x.bytes;
                x.protected = false;
                x.stamp = s;
            }
        }
        true
    }

    /// Forgets an entry (its bytes were found bad, or deleted); `false` when absent.
    pub fn remove(&mut self, hash: BlockHash) -> bool {
        let Some(e) = self.entries.remove(&hash) else {
            return false;
        };
        if e.protected {
            self.protected.remove(&e.stamp);
            self.protected_bytes -= e.bytes;
        } else {
            self.probation.remove(&e.stamp);
        }
        self.used -= e.bytes;
        true
    }

    /// Checks the invariants; for tests.
    pub fn check(&self) -> Result<(), String> {
        let sum: u64 = self.entries.values().map(|e| e.bytes).sum();
        if sum != self.used || self.used > self.capacity {
            return Err(format!(
                "used {} but entries hold {sum} (capacity {})",
                self.used, self.capacity
            ));
        }
        if self.probation.len() + self.protected.len() != self.entries.len() {
            return Err("an entry is in no segment or in two".into());
        }
        let mut protected = 0;
        for (h, e) in &self.entries {
            let seg = if e.protected {
                &self.protected
            } else {
                &self.probation
            };
            if seg.get(&e.stamp) != Some(h) {
                return Err(format!("{h:?} is not in its segment under its stamp"));
            }
            if e.protected {
                protected += e.bytes;
            }
        }
        if protected != self.protected_bytes {
            return Err("protected bytes miscounted".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(i: u128) -> BlockHash {
        BlockHash(i)
    }

    #[test]
    fn once_used_entries_go_before_those_used_again() {
        let mut t = TierIndex::new(10);
        for i in 0..4 {
            assert!(t.insert(h(i), 2).is_empty());
        }
        // 0 and 1 are asked for again: protected.
        assert!(t.touch(h(0)) && t.touch(h(1)));
        // A scan of new entries evicts the once-used ones first, oldest first.
        assert_eq!(t.insert(h(10), 2), Vec::<BlockHash>::new());
        assert_eq!(t.insert(h(11), 2), vec![h(2)]);
        assert_eq!(t.insert(h(12), 2), vec![h(3)]);
        assert_eq!(t.insert(h(13), 2), vec![h(10)]);
        assert!(t.contains(h(0)) && t.contains(h(1)));
        // Too large for the tier: not added.
        assert_eq!(t.insert(h(99), 11), vec![h(99)]);
        assert!(!t.contains(h(99)));
        t.check().unwrap();
        assert!(t.remove(h(0)) && !t.remove(h(0)));
        assert_eq!(t.used(), 8);
        t.check().unwrap();
    }
}
