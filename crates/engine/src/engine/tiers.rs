//! The engine's side of the KV tiers ([`crate::tier`]): opening them, parking a request while
//! its prompt's blocks are read back, filling loaded blocks before a forward pass, handing
//! newly cached blocks down.
//!
//! Invariants: a parked request is in `parked` and nowhere else (not in the scheduler, not in
//! `reqs`) until its read is answered or it is aborted; a staged block is loadable in the
//! scheduler exactly while it is staged; a block the scheduler loads is staged when the step
//! runs (the engine is the only one that unstages, and only after a step's loads or when the
//! request it was read for is gone).

use super::{EngineCore, NewRequest};
use crate::request::Event;
use crate::tier::disk::{DiskTier, Done};
use crate::tier::{fingerprint, warn, FingerprintParts, KvDiskConfig, KvTiers, TierCounters};
use crate::{EngineError, Result};
use ferrum_scheduler::{hash_block, BlockHash, SchedulerOutput};
use ferrum_types::RequestId;
use std::sync::atomic::Ordering;
use std::time::Instant;

impl EngineCore {
    /// Turns the disk tier on. A folder that cannot be used is a warning, and the engine runs
    /// without the tier.
    pub(crate) fn set_kv_disk(&mut self, cfg: &KvDiskConfig, block_size: usize) -> Result<()> {
        if self.model.shard().is_some() {
            return Err(EngineError::Config(
                "--kv-disk-dir is not supported in a parallel run yet (each rank holds a part of \
                 every block)"
                    .into(),
            ));
        }
        let block_bytes = self.kv.block_bytes();
        let fp = fingerprint(&FingerprintParts {
            model_identity: &cfg.model_identity,
            layout: self.kv.layout(),
            block_size,
            block_bytes,
            config: self.model.config(),
        });
        let mut counters = TierCounters::default();
        match DiskTier::open(&cfg.dir, cfg.max_bytes, fp, block_bytes, &mut counters) {
            Ok(disk) => {
                self.st.sched.set_report_stores(true);
                let mut tiers = KvTiers::new(disk, counters);
                tiers.counters.blocks = tiers.disk.index().len() as u64;
                tiers.counters.bytes = tiers.disk.index().used();
                if let Ok(mut m) = self.metrics.lock() {
                    m.kv_disk = tiers.counters.clone();
                    m.kv_disk_dir = Some(tiers.disk.dir().to_path_buf());
                }
                self.tiers = Some(tiers);
            }
            Err(e) => warn(&format!("{e}; running without it")),
        }
        Ok(())
    }

    pub(super) fn has_parked(&self) -> bool {
        !self.parked.is_empty()
    }

    /// A new request: when its prompt's cached prefix continues past the pool into blocks the
    /// disk tier holds, it waits for them to be read; otherwise it starts now.
    pub(super) fn admit(&mut self, new: NewRequest) {
        let Some(t) = self.tiers.as_mut() else {
            return self.add_request(new);
        };
        let bs = self.st.sched.config().block_size;
        let prompt = &new.request.prompt;
        let reusable = prompt.len().saturating_sub(1) / bs;
        let kv = self.st.sched.kv_manager();
        let mut parent: Option<BlockHash> = None;
        let mut wanted = Vec::new();
        let mut missing = 0u64;
        for i in 0..reusable {
            let h = hash_block(parent, &prompt[i * bs..(i + 1) * bs]);
            parent = Some(h);
            let here = kv.pool().lookup(h).is_some() || kv.is_loadable(h);
            if wanted.is_empty() && missing == 0 && here {
                continue;
            }
            if missing == 0 && t.disk.holds(h) {
                wanted.push(h);
            } else {
                missing += 1;
            }
        }
        t.counters.misses += missing;
        if wanted.is_empty() {
            return self.add_request(new);
        }
        t.disk.fetch(new.id, wanted);
        self.parked.insert(new.id, (new, Instant::now()));
    }

    /// Takes what the tiers' I/O finished: read blocks are staged (loadable), and the requests
    /// they were read for start; staged blocks of requests gone are dropped.
    pub(super) fn poll_tiers(&mut self) {
        self.collect_copies(false);
        let Some(t) = self.tiers.as_mut() else {
            return;
        };
        let mut ready = Vec::new();
        for done in t.disk.poll(&mut t.counters) {
            let Done::Fetched {
                id,
                blocks,
                stopped,
                ..
            } = done
            else {
                continue;
            };
            if stopped.is_some() {
                // The stopped block and the rest of the prefix are recomputed.
                t.counters.misses += 1;
            }
            for (h, bytes) in blocks {
                self.st.sched.add_loadable(h);
                t.staged.insert(h, (id, bytes));
            }
            ready.push(id);
        }
        let mut waited = 0.0;
        for id in ready {
            if let Some((new, since)) = self.parked.remove(&id) {
                waited += since.elapsed().as_secs_f64();
                self.add_request(new);
            }
        }
        let Some(t) = self.tiers.as_mut() else {
            return;
        };
        t.counters.wait_seconds += waited;
        // Blocks read for a request that is gone (finished, aborted) are not kept.
        let (reqs, parked, sched) = (&self.st.reqs, &self.parked, &mut self.st.sched);
        t.staged.retain(|h, (id, _)| {
            let keep = reqs.contains_key(id) || parked.contains_key(id);
            if !keep {
                sched.remove_loadable(*h);
            }
            keep
        });
        if let Ok(mut m) = self.metrics.lock() {
            m.kv_disk = t.counters.clone();
        }
    }

    /// Fills the blocks the step loads with the staged K/V (before its forward pass).
    pub(super) fn load_blocks(&mut self, out: &SchedulerOutput) -> Result<()> {
        if out.kv_loads.is_empty() {
            return Ok(());
        }
        let Some(t) = self.tiers.as_mut() else {
            return Err(EngineError::Internal(
                "the scheduler loads blocks, but no tier is on".into(),
            ));
        };
        for &(b, h) in &out.kv_loads {
            let Some((_, bytes)) = t.staged.remove(&h) else {
                return Err(EngineError::Internal(format!(
                    "the scheduler loads block {} that is not staged",
                    h.to_hex()
                )));
            };
            self.st.sched.remove_loadable(h);
            self.kv
                .write_block(b as usize, &bytes)
                .map_err(|e| EngineError::Internal(e.to_string()))?;
        }
        Ok(())
    }

    /// Hands the blocks newly registered in the prefix cache down to the tiers: their K/V is
    /// computed and final, and its copy to the host starts now, ordered before any later step
    /// that may reuse the block; on a GPU the host does not wait for it
    /// ([`ferrum_models::KvCache::start_block_copy`]), and [`Self::collect_copies`] hands the
    /// finished ones to the disk.
    pub(super) fn store_blocks(&mut self) -> Result<()> {
        let Some(t) = self.tiers.as_mut() else {
            return Ok(());
        };
        for (b, h) in self.st.sched.take_kv_stores() {
            if t.disk.holds(h) || t.copies.iter().any(|(c, _)| *c == h) {
                continue;
            }
            let copy = self
                .kv
                .start_block_copy(b as usize)
                .map_err(|e| EngineError::Internal(e.to_string()))?;
            t.copies.push_back((h, copy));
        }
        self.collect_copies(false);
        Ok(())
    }

    /// Hands the finished block copies to the disk, in the order they started; with `all`,
    /// waits for every one. A copy that failed is a warning and a write failure in the
    /// metrics (the block is recomputed when next needed).
    pub(super) fn collect_copies(&mut self, all: bool) {
        let Some(t) = self.tiers.as_mut() else {
            return;
        };
        while let Some((_, copy)) = t.copies.front() {
            let done = self.kv.block_copy_done(copy).unwrap_or(true);
            if !all && !done {
                break;
            }
            let Some((h, copy)) = t.copies.pop_front() else {
                break;
            };
            match self.kv.finish_block_copy(copy) {
                Ok(bytes) => t.disk.store(h, bytes, &mut t.counters),
                Err(e) => {
                    t.counters.write_failures += 1;
                    warn(&format!(
                        "block {}'s copy to the host failed: {e}",
                        h.to_hex()
                    ));
                }
            }
        }
    }

    /// At the end of the engine loop: the tiers finish their writes, and the metrics show
    /// them.
    pub(super) fn close_tiers(&mut self) {
        self.collect_copies(true);
        if let Some(t) = self.tiers.as_mut() {
            t.disk.close();
        }
        self.poll_tiers();
    }

    /// Ends a parked request (its client went away); `false` when it is not parked.
    pub(super) fn abort_parked(&mut self, id: RequestId) -> bool {
        let Some((new, _)) = self.parked.remove(&id) else {
            return false;
        };
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        let _ = new.tx.send(Event::Done {
            usage: crate::request::Usage {
                prompt_tokens: new.request.prompt.len(),
                ..Default::default()
            },
        });
        true
    }

    /// Fails every parked request (the engine is ending after an error).
    pub(super) fn fail_parked(&mut self, msg: &str) {
        for (_, (new, _)) in self.parked.drain() {
            let _ = new.tx.send(Event::Error(msg.to_owned()));
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
