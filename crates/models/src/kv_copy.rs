//! Copies of KV blocks between the cache and host memory that the next step does not wait for:
//! how a GPU model's newly cached blocks reach the tiers below the pool (`--kv-offload-memory`,
//! `--kv-disk-dir`) and come back, without stopping the overlapped steps.
//!
//! On a GPU cache, [`KvCache::start_block_copy`] records an event on the main stream behind the
//! work issued so far (the steps that wrote the block), and a copy stream of the cache's own
//! waits for it, then copies every layer's keys and values into a page-locked host buffer and
//! records the copy's event. The main stream does not wait: the host and the next steps go on.
//! The block must not be written again before it was read, so whoever reuses it first orders
//! the main stream after the copy ([`KvCache::order_block_reuse`]; the engine does it for a
//! block the pool gave up while its copy may still run). On the CPU the bytes are read at once
//! ([`KvCache::read_block`]).
//!
//! A finished copy is either read out ([`KvCache::finish_block_copy`], the disk tier's bytes)
//! or kept as it landed, page-locked ([`KvCache::finish_block_copy_held`]: a [`HostBlock`],
//! the host tier's), and a held block goes back into the cache by an asynchronous copy on the
//! main stream ([`KvCache::upload_block`]), ordered before the step that reads it and after
//! nothing else.
//!
//! [`Copier`] is also how the overlapped steps' tokens come back (`backend/cuda/overlap.rs`),
//! which order the main stream after a copy only where they next write what it reads.
//!
//! Invariants: a copy's bytes are [`KvCache::read_block`]'s (same order, same layout), and so
//! are a held block's; a finished copy's host buffer (or a held block given back,
//! [`KvCache::recycle_host_block`]) is reused by a later copy that fits it, which runs only
//! after the main stream's work issued before it (an upload from that buffer among it);
//! copies are collected in any order.

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

/// A block's K/V kept in host memory (the host tier): as [`KvCache::read_block`] gives it,
/// page-locked when it came from a GPU's cache, so it goes back by an asynchronous copy
/// ([`KvCache::upload_block`]).
#[derive(Debug)]
pub struct HostBlock(Held);

#[derive(Debug)]
enum Held {
    Bytes(Vec<u8>),
    Pinned {
        host: HostBuffer,
        done: Event,
        bytes: usize,
    },
}

impl HostBlock {
    /// A block held as plain bytes ([`KvCache::read_block`]'s).
    pub fn from_bytes(bytes: Vec<u8>) -> HostBlock {
        HostBlock(Held::Bytes(bytes))
    }

    /// Host memory it occupies, in bytes (a page-locked buffer's whole size).
    pub fn footprint(&self) -> usize {
        match &self.0 {
            Held::Bytes(b) => b.len(),
            Held::Pinned { host, .. } => host.len(),
        }
    }
}

/// The longest list of finished copies' buffers a copier keeps for reuse; more are freed.
const MAX_SPARE: usize = 64;

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
    /// Buffers sized to the page (copies of one size: KV blocks) rather than to a power of two
    /// (copies of varying sizes: the overlapped steps' tokens).
    exact: bool,
}

fn err(what: &str) -> impl Fn(ferrum_runtime::RuntimeError) -> ModelError + '_ {
    move |e| ModelError::gpu(what, e)
}

impl Copier {
    pub(crate) fn new(gpu: &SharedGpu, exact: bool) -> Result<Copier> {
        let mut g = gpu.lock();
        let e = err("making the KV copy stream");
        Ok(Copier {
            stream: g.create_stream().map_err(&e)?,
            ready: Some(g.create_event().map_err(&e)?),
            gpu: gpu.clone(),
            spare: Vec::new(),
            exact,
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
                g.alloc_host(if self.exact {
                    bytes.div_ceil(4096).max(1) * 4096
                } else {
                    bytes.next_power_of_two().max(4096)
                })
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
                self.keep(host, done);
                landed.map_err(err("reading a copy back"))
            }
        }
    }

    /// Keeps a buffer for a later copy, or frees it when enough are kept.
    fn keep(&mut self, host: HostBuffer, done: Event) {
        if self.spare.len() < MAX_SPARE {
            self.spare.push((host, done));
            return;
        }
        let mut g = self.gpu.lock();
        let _ = g.free_host(host);
        let _ = g.destroy_event(done);
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
            None => Copier::new(&gpu, true)?,
        };
        let c = self.copier.insert(copier);
        // The main stream does not wait: whoever writes the block again orders it first
        // (`order_block_reuse`).
        c.start(&parts, bytes, false)
    }

    /// Orders the main stream's later work after `copy`: call it before a step that may write
    /// the copied block again (the pool gave it up). Nothing to do for a host cache.
    pub fn order_block_reuse(&mut self, copy: &BlockCopy) -> Result<()> {
        let (Some(c), Some(done)) = (&self.copier, copy.done()) else {
            return Ok(());
        };
        c.gpu
            .lock()
            .wait(Stream::MAIN, done)
            .map_err(err("ordering a block's reuse after its copy"))
    }

    /// `copy` kept as it landed: the host tier's block, waiting for the copy if need be.
    pub fn finish_block_copy_held(&mut self, copy: BlockCopy) -> Result<HostBlock> {
        match copy.0 {
            Pending::Ready(bytes) => Ok(HostBlock(Held::Bytes(bytes))),
            Pending::Device { host, done, bytes } => {
                let Some(c) = &self.copier else {
                    return Err(ModelError::Invalid(
                        "a KV block copy finished on a cache that did not start it".into(),
                    ));
                };
                c.gpu
                    .lock()
                    .sync_event(&done)
                    .map_err(err("waiting for a copy to the host"))?;
                Ok(HostBlock(Held::Pinned { host, done, bytes }))
            }
        }
    }

    /// A held block's bytes into `out` (replacing them), as [`KvCache::read_block`] gives
    /// them.
    pub fn host_block_bytes(&self, block: &HostBlock, out: &mut Vec<u8>) -> Result<()> {
        match (&block.0, &self.copier) {
            (Held::Bytes(b), _) => {
                out.clear();
                out.extend_from_slice(b);
                Ok(())
            }
            (Held::Pinned { host, bytes, .. }, Some(c)) => {
                let mut g = c.gpu.lock();
                let b = g.host_bytes(host).map_err(err("reading a held block"))?;
                out.clear();
                out.extend_from_slice(&b[..*bytes]);
                Ok(())
            }
            (Held::Pinned { .. }, None) => Err(ModelError::Invalid(
                "a page-locked KV block read through a cache that did not copy it".into(),
            )),
        }
    }

    /// Fills block `block` with a held block's K/V. On a GPU this is an asynchronous copy on
    /// the main stream: the host goes on, and the next step's work runs after it.
    pub fn upload_block(&mut self, block: usize, held: &HostBlock) -> Result<()> {
        let (host, bytes) = match &held.0 {
            Held::Bytes(b) => return self.write_block(block, b),
            Held::Pinned { host, bytes, .. } => (host, *bytes),
        };
        if bytes != self.block_bytes() {
            return Err(ModelError::Invalid(format!(
                "a held KV block of {bytes} bytes for a cache whose blocks are {} bytes",
                self.block_bytes()
            )));
        }
        let Some((gpu, parts)) = self.device_block_parts(block)? else {
            return Err(ModelError::Invalid(
                "a page-locked KV block for a cache in host memory".into(),
            ));
        };
        let mut g = gpu.lock();
        let mut at = 0;
        for (dst, len) in parts {
            g.copy_from_host(dst, host, at, len, Stream::MAIN)
                .map_err(err("a KV block's copy back to the device"))?;
            at += len;
        }
        Ok(())
    }

    /// Gives a held block's memory back for later copies (the host tier let it go).
    pub fn recycle_host_block(&mut self, block: HostBlock) {
        // A pinned block comes from this cache's copier; without one (not reached) it is left
        // to the device's drop rather than freed on a device it may not belong to.
        if let (Held::Pinned { host, done, .. }, Some(c)) = (block.0, &mut self.copier) {
            c.keep(host, done);
        }
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
