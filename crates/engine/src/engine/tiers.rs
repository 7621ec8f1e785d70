//! The engine's side of the KV tiers ([`crate::tier`]): opening them, parking a request while
//! its prompt's blocks are read back, filling loaded blocks before a forward pass, handing
//! newly cached blocks down.
//!
//! Invariants: a parked request is in `parked` and nowhere else (not in the scheduler, not in
//! `reqs`) until its read is answered or it is aborted; a staged block is loadable in the
//! scheduler exactly while it is staged; a block the scheduler loads is staged when the step
//! runs (the engine is the only one that unstages, and only after a step's loads or when the
//! request it was read for is gone); a block taken from the host tier is staged or back in
//! the tier, never lost; before a step runs, every copy still reading a block the pool gave
//! up has the main stream ordered after it.

use super::{EngineCore, NewRequest};
use crate::request::Event;
use crate::tier::disk::{DiskTier, Done};
use crate::tier::host::HostTier;
use crate::tier::{
    fingerprint, warn, FingerprintParts, KvDiskConfig, KvTiers, PendingCopy, Staged, TierCounters,
};
use crate::{EngineError, Result};
use ferrum_scheduler::{hash_block, BlockHash, SchedulerOutput};
use ferrum_types::RequestId;
use std::sync::atomic::Ordering;
use std::time::Instant;

fn internal(e: impl std::fmt::Display) -> EngineError {
    EngineError::Internal(e.to_string())
}

impl EngineCore {
    /// Turns the tiers on: host memory below a GPU's pool (`host_bytes`; a model on the CPU
    /// has its bytes in the pool instead, see [`crate::tier`]) and the disk. A disk folder
    /// that cannot be used is a warning, and the engine runs without that tier.
    pub(crate) fn set_kv_tiers(
        &mut self,
        disk: Option<&KvDiskConfig>,
        host_bytes: Option<u64>,
        block_size: usize,
    ) -> Result<()> {
        // On the CPU the bytes joined the pool (`EngineHandle::start`).
        let host_bytes = host_bytes.filter(|_| self.kv.is_on_gpu());
        if disk.is_none() && host_bytes.is_none() {
            return Ok(());
        }
        if self.model.shard().is_some() {
            return Err(EngineError::Config(
                "--kv-disk-dir and --kv-offload-memory are not supported in a parallel run yet \
                 (each rank holds a part of every block)"
                    .into(),
            ));
        }
        let mut tiers = KvTiers::default();
        if let Some(bytes) = host_bytes {
            tiers.host = Some(HostTier::new(bytes));
            tiers.host_counters.enabled = true;
        }
        if let Some(cfg) = disk {
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
                Ok(d) => {
                    counters.enabled = true;
                    counters.blocks = d.index().len() as u64;
                    counters.bytes = d.index().used();
                    if let Ok(mut m) = self.metrics.lock() {
                        m.kv_disk_dir = Some(d.dir().to_path_buf());
                    }
                    tiers.disk = Some(d);
                    tiers.disk_counters = counters;
                }
                Err(e) => warn(&format!("{e}; running without it")),
            }
        }
        if tiers.is_empty() {
            return Ok(());
        }
        self.st.sched.set_report_stores(true);
        if let Ok(mut m) = self.metrics.lock() {
            m.kv_disk = tiers.disk_counters.clone();
            m.kv_host = tiers.host_counters.clone();
        }
        self.tiers = Some(tiers);
        Ok(())
    }

    pub(super) fn has_parked(&self) -> bool {
        !self.parked.is_empty()
    }

    /// A new request: the blocks of its prompt's cached prefix the host tier holds are taken
    /// from it (staged at once), those past the pool that only the disk holds are read (the
    /// request waits for them); with none to read it starts now.
    pub(super) fn admit(&mut self, new: NewRequest) {
        let Some(t) = self.tiers.as_mut() else {
            return self.add_request(new);
        };
        let bs = self.st.sched.config().block_size;
        let prompt = &new.request.prompt;
        let reusable = prompt.len().saturating_sub(1) / bs;
        let mut parent: Option<BlockHash> = None;
        let mut wanted = Vec::new();
        let (mut past_pool, mut stopped) = (false, false);
        let (mut host_misses, mut disk_misses) = (0u64, 0u64);
        for i in 0..reusable {
            let h = hash_block(parent, &prompt[i * bs..(i + 1) * bs]);
            parent = Some(h);
            if stopped {
                host_misses += u64::from(t.host.is_some());
                disk_misses += u64::from(t.disk.is_some());
                continue;
            }
            let kv = self.st.sched.kv_manager();
            let in_pool = kv.pool().lookup(h).is_some();
            if kv.is_loadable(h) {
                past_pool |= !in_pool;
                continue;
            }
            // The host tier's blocks are staged even where the pool has them: the pool may
            // evict them before the request is scheduled, and its prefix would then stop at
            // the first one gone.
            if let Some(b) = t
                .host
                .as_mut()
                .and_then(|x| x.take(h, &mut t.host_counters))
            {
                self.st.sched.add_loadable(h);
                t.staged.insert(h, (new.id, Staged::Held(b)));
                past_pool |= !in_pool;
                continue;
            }
            if in_pool && !past_pool {
                continue;
            }
            past_pool = true;
            host_misses += u64::from(t.host.is_some());
            if t.disk.as_ref().is_some_and(|d| d.holds(h)) {
                wanted.push(h);
                continue;
            }
            disk_misses += u64::from(t.disk.is_some());
            stopped = true;
        }
        t.host_counters.misses += host_misses;
        t.disk_counters.misses += disk_misses;
        match t.disk.as_mut() {
            Some(d) if !wanted.is_empty() => {
                d.fetch(new.id, wanted);
                self.parked.insert(new.id, (new, Instant::now()));
            }
            _ => self.add_request(new),
        }
    }

    /// Takes what the tiers' I/O finished: read blocks are staged (loadable), and the requests
    /// they were read for start; staged blocks of requests gone go back (the host tier's) or
    /// are dropped.
    pub(super) fn poll_tiers(&mut self) {
        self.collect_copies(false);
        let Some(t) = self.tiers.as_mut() else {
            return;
        };
        let mut ready = Vec::new();
        let done = match t.disk.as_mut() {
            Some(d) => d.poll(&mut t.disk_counters),
            None => Vec::new(),
        };
        for done in done {
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
                t.disk_counters.misses += 1;
            }
            for (h, bytes) in blocks {
                self.st.sched.add_loadable(h);
                t.staged.insert(h, (id, Staged::Read(bytes)));
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
        t.disk_counters.wait_seconds += waited;
        // Blocks staged for a request that is gone (finished, aborted) are not kept there.
        let (reqs, parked, sched) = (&self.st.reqs, &self.parked, &mut self.st.sched);
        let gone: Vec<BlockHash> = t
            .staged
            .iter()
            .filter(|(_, (id, _))| !reqs.contains_key(id) && !parked.contains_key(id))
            .map(|(h, _)| *h)
            .collect();
        for h in gone {
            sched.remove_loadable(h);
            if let Some((_, Staged::Held(b))) = t.staged.remove(&h) {
                if let Some(host) = t.host.as_mut() {
                    for freed in host.put(h, b, false, &mut t.host_counters) {
                        self.kv.recycle_host_block(freed);
                    }
                }
            }
        }
        if let Ok(mut m) = self.metrics.lock() {
            m.kv_disk = t.disk_counters.clone();
            m.kv_host = t.host_counters.clone();
        }
    }

    /// Before a step's forward pass: orders the main stream after the copies still reading
    /// blocks the pool gave up (the step may write them), then fills the blocks it loads with
    /// the staged K/V.
    pub(super) fn load_blocks(&mut self, out: &SchedulerOutput) -> Result<()> {
        if let Some(t) = self.tiers.as_mut() {
            let pool = self.st.sched.kv_manager().pool();
            for c in t.copies.iter_mut().filter(|c| !c.ordered) {
                if pool.lookup(c.hash) != Some(c.block) {
                    self.kv.order_block_reuse(&c.copy).map_err(internal)?;
                    c.ordered = true;
                }
            }
        }
        if out.kv_loads.is_empty() {
            return Ok(());
        }
        let Some(t) = self.tiers.as_mut() else {
            return Err(EngineError::Internal(
                "the scheduler loads blocks, but no tier is on".into(),
            ));
        };
        for &(b, h) in &out.kv_loads {
            let Some((_, staged)) = t.staged.remove(&h) else {
                return Err(EngineError::Internal(format!(
                    "the scheduler loads block {} that is not staged",
                    h.to_hex()
                )));
            };
            self.st.sched.remove_loadable(h);
            match staged {
                Staged::Read(bytes) => self.kv.write_block(b as usize, &bytes),
                Staged::Held(held) => {
                    let up = self.kv.upload_block(b as usize, &held);
                    if up.is_ok() {
                        t.host_counters.hits += 1;
                        t.host_counters.bytes_read += self.kv.block_bytes() as u64;
                    }
                    if let Some(host) = t.host.as_mut() {
                        for freed in host.put(h, held, true, &mut t.host_counters) {
                            self.kv.recycle_host_block(freed);
                        }
                    }
                    up
                }
            }
            .map_err(internal)?;
        }
        Ok(())
    }

    /// Hands the blocks newly registered in the prefix cache down to the tiers that lack
    /// them: their K/V is computed and final, and its copy to the host starts now, behind the
    /// steps that wrote it; on a GPU neither the host nor the next steps wait for it
    /// ([`ferrum_models::KvCache::start_block_copy`]; [`Self::load_blocks`] orders a step
    /// that reuses the block), and [`Self::collect_copies`] hands the finished ones down.
    pub(super) fn store_blocks(&mut self) -> Result<()> {
        let Some(t) = self.tiers.as_mut() else {
            return Ok(());
        };
        for (b, h) in self.st.sched.take_kv_stores() {
            if t.all_hold(h) || t.copies.iter().any(|c| c.hash == h) {
                continue;
            }
            let copy = self.kv.start_block_copy(b as usize).map_err(internal)?;
            t.copies.push_back(PendingCopy {
                hash: h,
                block: b,
                copy,
                ordered: false,
            });
        }
        self.collect_copies(false);
        Ok(())
    }

    /// Hands the finished block copies to the tiers, in the order they started; with `all`,
    /// waits for every one. A copy that failed is a warning and a write failure in the
    /// metrics (the block is recomputed when next needed).
    pub(super) fn collect_copies(&mut self, all: bool) {
        let Some(t) = self.tiers.as_mut() else {
            return;
        };
        let mut bytes = Vec::new();
        while let Some(c) = t.copies.front() {
            let done = self.kv.block_copy_done(&c.copy).unwrap_or(true);
            if !all && !done {
                break;
            }
            let Some(PendingCopy { hash, copy, .. }) = t.copies.pop_front() else {
                break;
            };
            let to_disk = t.disk.as_ref().is_some_and(|d| !d.holds(hash));
            let landed = match t.host.as_mut() {
                Some(host) => self.kv.finish_block_copy_held(copy).and_then(|held| {
                    if to_disk {
                        self.kv.host_block_bytes(&held, &mut bytes)?;
                    }
                    if !host.holds(hash) {
                        t.host_counters.bytes_written += held.footprint() as u64;
                    }
                    for freed in host.put(hash, held, false, &mut t.host_counters) {
                        self.kv.recycle_host_block(freed);
                    }
                    Ok(())
                }),
                None => self.kv.finish_block_copy(copy).map(|b| bytes = b),
            };
            match (landed, t.disk.as_mut()) {
                (Ok(()), Some(d)) if to_disk => {
                    d.store(hash, std::mem::take(&mut bytes), &mut t.disk_counters)
                }
                (Ok(()), _) => {}
                (Err(e), _) => {
                    let c = match t.host.is_some() {
                        true => &mut t.host_counters,
                        false => &mut t.disk_counters,
                    };
                    c.write_failures += 1;
                    eprintln!(
                        "ferrum: KV tiers: block {}'s copy to the host failed: {e}",
                        hash.to_hex()
                    );
                }
            }
        }
    }

    /// At the end of the engine loop: the tiers finish their writes, the metrics show them,
    /// and the host tier's memory goes back to the cache's copier.
    pub(super) fn close_tiers(&mut self) {
        self.collect_copies(true);
        if let Some(d) = self.tiers.as_mut().and_then(|t| t.disk.as_mut()) {
            d.close();
        }
        self.poll_tiers();
        let held = match self.tiers.as_mut().and_then(|t| t.host.as_mut()) {
            Some(h) => h.drain(),
            None => Vec::new(),
        };
        for b in held {
            self.kv.recycle_host_block(b);
        }
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
