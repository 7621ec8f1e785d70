//! Streams, events, copies and host buffers on a [`Gpu`], and vendor matrix products.
//!
//! A [`Stream`] is an ordered queue of device work; [`Stream::MAIN`] is the one every
//! operation without a stream of its own uses (and the one graphs are captured on). Work on
//! two streams is ordered only by [`Event`]s: [`Gpu::record`] marks a point in one stream,
//! [`Gpu::wait`] makes another stream wait for it, [`Gpu::sync_event`] makes the host wait.
//! A [`HostBuffer`] is page-locked host memory that copies on any stream read or write while
//! the host goes on; [`Gpu::host_bytes`] waits for every copy issued on the buffer before it
//! hands the bytes out, so the host never sees a copy half done.
//!
//! Invariants: handles belong to the [`Gpu`] that made them (a stale or foreign one is an
//! error naming it, never undefined behaviour); a copy's range lies inside its host buffer;
//! [`Stream::MAIN`] cannot be destroyed.

use super::gemm::{Gemm, GemmSupport};
use super::gpu::{DevicePtr, Gpu};
use super::ops::{Op, MAIN_STREAM};
use crate::{Result, RuntimeError};

/// A stream of device work ([`Gpu::create_stream`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stream(pub(super) usize);

impl Stream {
    /// The stream every operation without a stream of its own uses.
    pub const MAIN: Stream = Stream(MAIN_STREAM);
}

/// A point in a stream's work ([`Gpu::record`]), which other streams and the host can wait
/// for. Complete until first recorded; each record replaces the last.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Event(usize);

/// Page-locked host memory for asynchronous copies ([`Gpu::alloc_host`]).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct HostBuffer {
    id: usize,
    bytes: usize,
}

impl HostBuffer {
    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

/// What a [`Gpu`] keeps of a live host buffer.
#[derive(Debug)]
pub(crate) struct HostState {
    bytes: usize,
    /// Per stream that copied to or from the buffer, an event recorded after its latest copy
    /// there (stream order covers the earlier ones).
    copies: Vec<(usize, usize)>,
}

impl Gpu {
    /// A new stream.
    pub fn create_stream(&mut self) -> Result<Stream> {
        self.not_capturing("creating a stream")?;
        Ok(Stream(self.driver.stream_create()?))
    }

    /// Destroys `stream`; the work issued on it still runs to the end.
    pub fn destroy_stream(&mut self, stream: Stream) -> Result<()> {
        self.not_capturing("destroying a stream")?;
        if stream == Stream::MAIN {
            return Err(RuntimeError::Kernels(
                "the main stream cannot be destroyed".into(),
            ));
        }
        self.driver.stream_destroy(stream.0)
    }

    /// A new event (complete until first recorded).
    pub fn create_event(&mut self) -> Result<Event> {
        self.not_capturing("creating an event")?;
        Ok(Event(self.driver.event_create()?))
    }

    /// Destroys `event`.
    pub fn destroy_event(&mut self, event: Event) -> Result<()> {
        self.not_capturing("destroying an event")?;
        self.driver.event_destroy(event.0)
    }

    /// Records `event` on `stream`: it completes once everything issued there before has.
    pub fn record(&mut self, event: &Event, stream: Stream) -> Result<()> {
        self.not_capturing("recording an event")?;
        self.driver.event_record(event.0, stream.0)
    }

    /// Makes `stream`'s later work wait for `event`'s latest record (the host goes on).
    pub fn wait(&mut self, stream: Stream, event: &Event) -> Result<()> {
        self.not_capturing("a wait for an event")?;
        self.driver.stream_wait(stream.0, event.0)
    }

    /// Blocks until `event`'s latest record has completed; a failed kernel before it surfaces
    /// here.
    pub fn sync_event(&mut self, event: &Event) -> Result<()> {
        self.not_capturing("waiting for an event")?;
        self.driver.event_synchronize(event.0)
    }

    /// Whether `event`'s latest record has completed, without blocking.
    pub fn event_done(&mut self, event: &Event) -> Result<bool> {
        self.not_capturing("querying an event")?;
        self.driver.event_query(event.0)
    }

    /// Copies `bytes` from `src` to `dst` on the device, on `stream` (recorded by a capture on
    /// the main stream). The ranges must not overlap.
    pub fn copy(
        &mut self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: Stream,
    ) -> Result<()> {
        self.may_issue(stream, "a device copy")?;
        let (d, s) = (dst.0 as u128, src.0 as u128);
        if d < s + bytes as u128 && s < d + bytes as u128 && bytes > 0 {
            return Err(RuntimeError::Kernels(format!(
                "a device copy of {bytes} bytes from {src:?} to {dst:?} overlaps itself"
            )));
        }
        if bytes == 0 {
            return Ok(());
        }
        self.issue(Op::Copy { dst, src, bytes }, stream)
    }

    /// `bytes` of page-locked host memory, zeroed.
    pub fn alloc_host(&mut self, bytes: usize) -> Result<HostBuffer> {
        self.not_capturing("allocating host memory")?;
        let id = self.driver.host_alloc(bytes.max(1))?;
        self.hosts.insert(
            id,
            HostState {
                bytes,
                copies: Vec::new(),
            },
        );
        Ok(HostBuffer { id, bytes })
    }

    /// Frees `buffer` once its copies have finished.
    pub fn free_host(&mut self, buffer: HostBuffer) -> Result<()> {
        self.not_capturing("freeing host memory")?;
        self.settle_host(&buffer)?;
        if let Some(state) = self.hosts.remove(&buffer.id) {
            for (_, e) in state.copies {
                self.driver.event_destroy(e)?;
            }
        }
        self.driver.host_free(buffer.id)
    }

    /// Copies `bytes` device bytes at `src` into `dst` from `offset`, on `stream`; the host
    /// goes on ([`Gpu::host_bytes`] waits for the copy).
    pub fn copy_to_host(
        &mut self,
        dst: &HostBuffer,
        offset: usize,
        src: DevicePtr,
        bytes: usize,
        stream: Stream,
    ) -> Result<()> {
        self.not_capturing("a copy to the host")?;
        self.host_range(dst, offset, bytes)?;
        self.driver
            .copy_to_host(dst.id, offset, src, bytes, stream.0)?;
        self.mark_copy(dst, stream)
    }

    /// Copies `bytes` of `src` from `offset` to the device at `dst`, on `stream`; the bytes
    /// are read when the copy runs, so the host must not change them before
    /// ([`Gpu::host_bytes`] waits).
    pub fn copy_from_host(
        &mut self,
        dst: DevicePtr,
        src: &HostBuffer,
        offset: usize,
        bytes: usize,
        stream: Stream,
    ) -> Result<()> {
        self.not_capturing("a copy from the host")?;
        self.host_range(src, offset, bytes)?;
        self.driver
            .copy_from_host(dst, src.id, offset, bytes, stream.0)?;
        self.mark_copy(src, stream)
    }

    /// `buffer`'s bytes, once every copy issued on it has finished.
    pub fn host_bytes(&mut self, buffer: &HostBuffer) -> Result<&mut [u8]> {
        self.not_capturing("reading host memory")?;
        self.settle_host(buffer)?;
        let bytes = buffer.bytes;
        Ok(&mut self.driver.host_bytes(buffer.id)?[..bytes])
    }

    /// Runs `call` on `stream` with the vendor library ([`Gpu::open_gemm`]), recorded by a
    /// capture on the main stream like a launch. Checked first ([`Gemm::check`]); a product
    /// the library does not take is an error ([`Gpu::gemm_support`] says beforehand).
    pub fn gemm(&mut self, call: &Gemm, stream: Stream) -> Result<()> {
        call.check()?;
        self.may_issue(stream, "a vendor product")?;
        if self.gemm_library.is_none() {
            return Err(RuntimeError::Kernels(
                "a vendor product before the library was opened (Gpu::open_gemm)".into(),
            ));
        }
        self.issue(Op::Gemm(call.lt()), stream)
    }

    /// Whether the vendor library runs `call` (its shape, types and alignments).
    pub fn gemm_support(&mut self, call: &Gemm) -> Result<GemmSupport> {
        call.check()?;
        self.not_capturing("asking the vendor library")?;
        if self.gemm_library.is_none() {
            return Ok(GemmSupport::Unsupported("no vendor library is open".into()));
        }
        self.driver.gemm_support(&call.lt())
    }

    /// Opens the vendor library for matrix products (cuBLASLt): the one at `path` when given,
    /// else the first found. Returns what was opened, in words; an error names every place
    /// looked in.
    pub fn open_gemm(&mut self, path: Option<&std::path::Path>) -> Result<String> {
        self.not_capturing("opening the vendor library")?;
        let found = self.driver.gemm_open(path)?;
        self.gemm_library = Some(found.clone());
        Ok(found)
    }

    /// The vendor library opened ([`Gpu::open_gemm`]), in words.
    pub fn gemm_library(&self) -> Option<&str> {
        self.gemm_library.as_deref()
    }

    fn host_range(&self, buffer: &HostBuffer, offset: usize, bytes: usize) -> Result<()> {
        let state = self.hosts.get(&buffer.id).ok_or_else(|| {
            RuntimeError::Kernels(format!("host buffer {} is not this device's", buffer.id))
        })?;
        if offset
            .checked_add(bytes)
            .is_none_or(|end| end > state.bytes)
        {
            return Err(RuntimeError::Kernels(format!(
                "a copy of {bytes} bytes at offset {offset} of a {}-byte host buffer",
                state.bytes
            )));
        }
        Ok(())
    }

    /// Records, after a copy on `stream`, the event [`Gpu::host_bytes`] waits for.
    fn mark_copy(&mut self, buffer: &HostBuffer, stream: Stream) -> Result<()> {
        let known = self
            .hosts
            .get(&buffer.id)
            .and_then(|s| s.copies.iter().find(|(st, _)| *st == stream.0))
            .map(|&(_, e)| e);
        let event = match known {
            Some(e) => e,
            None => {
                let e = self.driver.event_create()?;
                if let Some(state) = self.hosts.get_mut(&buffer.id) {
                    state.copies.push((stream.0, e));
                }
                e
            }
        };
        self.driver.event_record(event, stream.0)
    }

    /// Waits for the latest copy on `buffer` on every stream (and, through stream order, for
    /// the ones before).
    fn settle_host(&mut self, buffer: &HostBuffer) -> Result<()> {
        let state = self.hosts.get(&buffer.id).ok_or_else(|| {
            RuntimeError::Kernels(format!("host buffer {} is not this device's", buffer.id))
        })?;
        let events: Vec<usize> = state.copies.iter().map(|&(_, e)| e).collect();
        events
            .into_iter()
            .try_for_each(|e| self.driver.event_synchronize(e))
    }
}
