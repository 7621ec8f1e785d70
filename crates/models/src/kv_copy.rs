//! Copies of KV blocks to the host that the next step does not wait for: how a GPU model's
//! newly cached blocks reach the tiers below the pool (`--kv-disk-dir`) without stopping the
//! overlapped steps.
//!
//! On a GPU cache, [`KvCache::start_block_copy`] records an event on the main stream behind the
//! work issued so far (the steps that wrote the block), and a copy stream of the cache's own
//! waits for it, then copies every layer's keys and values into a page-locked host buffer and
//! records the copy's event; the main stream's later work waits for that event, so no later
//! step can change the block before it was read, while the host goes on at once. On the CPU
//! the bytes are read at once ([`KvCache::read_block`]).
//!
//! [`Copier`] is also how the overlapped steps' tokens come back (`backend/cuda/overlap.rs`),
//! which order the main stream after a copy only where they next write what it reads.
//!
//! Invariants: a copy's bytes are [`KvCache::read_block`]'s (same order, same layout); a
//! finished copy's host buffer is reused by a later copy that fits it; copies are collected
//! in any order.

use ferrum_runtime::cuda::{Event, HostBuffer, SharedGpu, Stream};

use crate::kv_cache::KvCache;
use crate::{ModelError, Result};

/// A block's K/V on its way to the host ([`KvCache::start_block_copy`]).
#[derive(Debug)]
pub struct BlockCopy(Pending);

#[derive(Debug)]
enum Pending {
    /// Read already (a host cache).
    Ready(Vec<u8>),
    /// The first `bytes` of a page-locked buffer once `done` completes.
    Device {
        host: HostBuffer,
        done: Event,
        bytes: usize,
    },
}

impl BlockCopy {
    /// The event after the copy (none for a copy that was ready at once).
    pub(crate) fn done(&self) -> Option<&Event> {
        match &self.0 {
            Pending::Device { done, .. } => Some(done),
            Pending::Ready(_) => None,
        }
    }
}

/// A GPU cache's copy stream, the event that orders each copy behind the main stream's work,
/// and finished copies' buffers for reuse.
#[derive(Debug)]
pub(crate) struct Copier {
    gpu: SharedGpu,
    stream: Stream,
    /// `None` only while dropping.
    ready: Option<Event>,
    spare: Vec<(HostBuffer, Event)>,
}

fn err(what: &str) -> impl Fn(ferrum_runtime::RuntimeError) -> ModelError + '_ {
    move |e| ModelError::gpu(what, e)
}

impl Copier {
    pub(crate) fn new(gpu: &SharedGpu) -> Result<Copier> {
        let mut g = gpu.lock();
        let e = err("making the KV copy stream");
        Ok(Copier {
            stream: g.create_stream().map_err(&e)?,
            ready: Some(g.create_event().map_err(&e)?),
            gpu: gpu.clone(),
            spare: Vec::new(),
        })
    }

    /// Starts copying `parts` (device ranges, in order, `bytes` in all) into one host buffer,
    /// behind the work issued on the main stream so far. With `main_waits`, the main stream's
    /// later work waits for the copy; otherwise the caller orders it where it must
    /// ([`BlockCopy::done`]).
    pub(crate) fn start(
        &mut self,
        parts: &[(ferrum_runtime::cuda::DevicePtr, usize)],
        bytes: usize,
        main_waits: bool,
    ) -> Result<BlockCopy> {
        let e = err("a copy to the host");
        let mut g = self.gpu.lock();
        let ready = self.ready.as_ref().ok_or_else(|| {
            ModelError::Invalid("a KV block copy on a copier being dropped".into())
        })?;
        g.record(ready, Stream::MAIN).map_err(&e)?;
        g.wait(self.stream, ready).map_err(&e)?;
        let (host, done) = match self.spare.iter().position(|(h, _)| h.len() >= bytes) {
            Some(i) => self.spare.swap_remove(i),
            None => (
                g.alloc_host(bytes.next_power_of_two().max(4096))
                    .map_err(&e)?,
                g.create_event().map_err(&e)?,
            ),
        };
        let mut at = 0;
        for &(src, len) in parts {
            g.copy_to_host(&host, at, src, len, self.stream)
                .map_err(&e)?;
            at += len;
        }
        g.record(&done, self.stream).map_err(&e)?;
        if main_waits {
            g.wait(Stream::MAIN, &done).map_err(&e)?;
        }
        Ok(BlockCopy(Pending::Device { host, done, bytes }))
    }

    pub(crate) fn is_done(&self, copy: &BlockCopy) -> Result<bool> {
        match &copy.0 {
            Pending::Ready(_) => Ok(true),
            Pending::Device { done, .. } => self
                .gpu
                .lock()
                .event_done(done)
                .map_err(err("waiting for a copy to the host")),
        }
    }

    /// `copy`'s bytes into `out` (replacing them), waiting for it if need be; its buffer is
    /// kept for a later copy.
    pub(crate) fn finish_into(&mut self, copy: BlockCopy, out: &mut Vec<u8>) -> Result<()> {
        match copy.0 {
            Pending::Ready(bytes) => {
                *out = bytes;
                Ok(())
            }
            Pending::Device { host, done, bytes } => {
                let landed = self.gpu.lock().host_bytes(&host).map(|b| {
                    out.clear();
                    out.extend_from_slice(&b[..bytes]);
                });
                self.spare.push((host, done));
                landed.map_err(err("reading a copy back"))
            }
        }
    }

    fn finish(&mut self, copy: BlockCopy) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.finish_into(copy, &mut out)?;
        Ok(out)
    }
}

impl Drop for Copier {
    fn drop(&mut self) {
        let mut g = self.gpu.lock();
        for (host, done) in self.spare.drain(..) {
            let _ = g.free_host(host);
            let _ = g.destroy_event(done);
        }
        // The stream's copies still run to the end; the main stream waits for them anyway.
        let _ = g.destroy_stream(self.stream);
        if let Some(ready) = self.ready.take() {
            let _ = g.destroy_event(ready);
        }
    }
}

impl KvCache {
    /// Starts copying block `block`'s K/V to the host: the bytes [`KvCache::read_block`]
    /// gives, collected by [`KvCache::finish_block_copy`]. On a GPU the host does not wait
    /// (see the module's docs); on the CPU the block is read now.
    pub fn start_block_copy(&mut self, block: usize) -> Result<BlockCopy> {
        let Some((gpu, parts)) = self.device_block_parts(block)? else {
            let mut bytes = Vec::new();
            self.read_block(block, &mut bytes)?;
            return Ok(BlockCopy(Pending::Ready(bytes)));
        };
        let bytes = self.block_bytes();
        let copier = match self.copier.take() {
            Some(c) => c,
            None => Copier::new(&gpu)?,
        };
        let c = self.copier.insert(copier);
        // Later steps wait for the copy: none of them changes the block before it was read.
        c.start(&parts, bytes, true)
    }

    /// Whether `copy` has finished, without waiting.
    pub fn block_copy_done(&self, copy: &BlockCopy) -> Result<bool> {
        match (&self.copier, &copy.0) {
            (_, Pending::Ready(_)) => Ok(true),
            (Some(c), _) => c.is_done(copy),
            (None, Pending::Device { .. }) => Err(ModelError::Invalid(
                "a KV block copy finished on a cache that did not start it".into(),
            )),
        }
    }

    /// `copy`'s bytes, waiting for it if need be.
    pub fn finish_block_copy(&mut self, copy: BlockCopy) -> Result<Vec<u8>> {
        match (&mut self.copier, copy) {
            (_, BlockCopy(Pending::Ready(bytes))) => Ok(bytes),
            (Some(c), copy) => c.finish(copy),
            (None, _) => Err(ModelError::Invalid(
                "a KV block copy finished on a cache that did not start it".into(),
            )),
        }
    }
}
