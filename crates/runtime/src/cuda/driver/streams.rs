//! The CUDA driver's launches, streams, events and page-locked host buffers.

use std::ffi::c_void;

use cudarc::driver::{result, sys};

use super::{cuda_err, CudaDriver};
use crate::cuda::gpu::{DevicePtr, KernelArg};
use crate::cuda::ops::{KernelHandle, LaunchDims, MAIN_STREAM};
use crate::{Result, RuntimeError};

impl CudaDriver {
    /// Waits for every stream of the context.
    pub(super) fn sync_all(&self) -> Result<()> {
        result::ctx::synchronize().map_err(|e| cuda_err("cuCtxSynchronize (a kernel failed)", e))
    }

    /// The live stream `id`.
    pub(super) fn stream_handle(&self, id: usize) -> Result<sys::CUstream> {
        self.streams
            .get(id)
            .copied()
            .flatten()
            .ok_or_else(|| RuntimeError::Kernels(format!("no stream {id}")))
    }

    fn event_handle(&self, id: usize) -> Result<sys::CUevent> {
        self.events
            .get(id)
            .copied()
            .flatten()
            .ok_or_else(|| RuntimeError::Kernels(format!("no event {id}")))
    }

    /// The live host buffer `id`'s range `offset .. offset + bytes`.
    fn host_range(&self, id: usize, offset: usize, bytes: usize) -> Result<*mut u8> {
        let (host, len) = self
            .hosts
            .get(id)
            .copied()
            .flatten()
            .ok_or_else(|| RuntimeError::Kernels(format!("no host buffer {id}")))?;
        if offset.checked_add(bytes).is_none_or(|end| end > len) {
            return Err(RuntimeError::Kernels(format!(
                "{bytes} bytes at {offset} of a {len}-byte host buffer"
            )));
        }
        // SAFETY: `offset <= len`, inside the allocation.
        Ok(unsafe { host.add(offset) })
    }

    /// Launches a loaded kernel on `stream`.
    pub(super) fn launch(
        &mut self,
        kernel: KernelHandle,
        dims: LaunchDims,
        args: &[KernelArg],
        stream: sys::CUstream,
    ) -> Result<()> {
        let function = *self
            .functions
            .get(kernel.0)
            .ok_or_else(|| RuntimeError::Kernels(format!("no loaded kernel {}", kernel.0)))?;
        // One 8-byte cell per parameter (the kernel's own, then the two scratch pointers);
        // the driver reads each parameter's size from the cubin, little-endian.
        let mut cells: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                KernelArg::Ptr(p) => p.0,
                KernelArg::I32(v) => v as u32 as u64,
                KernelArg::U32(v) => v as u64,
                KernelArg::F32(v) => v.to_bits() as u64,
            })
            .collect();
        cells.push(dims.scratch.0);
        cells.push(0);
        let mut params: Vec<*mut c_void> = cells
            .iter_mut()
            .map(|c| c as *mut u64 as *mut c_void)
            .collect();
        let [gx, gy, gz] = dims.grid;
        self.timed(kernel, dims.grid, stream, |_| {
            // SAFETY: `function` is loaded; `params` points at one live cell per parameter in
            // the compiled order (checked against the manifest by the caller). A capture
            // copies the parameters into the graph's node.
            unsafe {
                result::launch_kernel(
                    function,
                    (gx, gy, gz),
                    (dims.block, 1, 1),
                    dims.shared,
                    stream,
                    &mut params,
                )
            }
            .map_err(|e| cuda_err("cuLaunchKernel", e))
        })
    }

    pub(super) fn new_stream(&mut self) -> Result<usize> {
        self.bind()?;
        let s = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| cuda_err("cuStreamCreate", e))?;
        self.streams.push(Some(s));
        Ok(self.streams.len() - 1)
    }

    pub(super) fn drop_stream(&mut self, id: usize) -> Result<()> {
        self.bind()?;
        if id == MAIN_STREAM {
            return Err(RuntimeError::Kernels(
                "the main stream is not destroyed".into(),
            ));
        }
        let s = self.stream_handle(id)?;
        self.streams[id] = None;
        // SAFETY: a live stream, destroyed once; its pending work still completes.
        unsafe { result::stream::destroy(s) }.map_err(|e| cuda_err("cuStreamDestroy", e))
    }

    pub(super) fn new_event(&mut self) -> Result<usize> {
        self.bind()?;
        let e = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(|e| cuda_err("cuEventCreate", e))?;
        self.events.push(Some(e));
        Ok(self.events.len() - 1)
    }

    pub(super) fn drop_event(&mut self, id: usize) -> Result<()> {
        self.bind()?;
        let e = self.event_handle(id)?;
        self.events[id] = None;
        // SAFETY: a live event, destroyed once (a pending record still completes).
        unsafe { result::event::destroy(e) }.map_err(|e| cuda_err("cuEventDestroy", e))
    }

    pub(super) fn record_event(&mut self, event: usize, stream: usize) -> Result<()> {
        self.bind()?;
        let (e, s) = (self.event_handle(event)?, self.stream_handle(stream)?);
        // SAFETY: both are live.
        unsafe { result::event::record(e, s) }.map_err(|e| cuda_err("cuEventRecord", e))
    }

    pub(super) fn wait_event(&mut self, stream: usize, event: usize) -> Result<()> {
        self.bind()?;
        let (e, s) = (self.event_handle(event)?, self.stream_handle(stream)?);
        // SAFETY: both are live.
        unsafe { result::stream::wait_event(s, e, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }
            .map_err(|e| cuda_err("cuStreamWaitEvent", e))
    }

    pub(super) fn sync_event(&mut self, event: usize) -> Result<()> {
        self.bind()?;
        let e = self.event_handle(event)?;
        // SAFETY: a live event; one never recorded is complete.
        unsafe { result::event::synchronize(e) }
            .map_err(|e| cuda_err("cuEventSynchronize (a kernel failed)", e))
    }

    pub(super) fn query_event(&mut self, event: usize) -> Result<bool> {
        self.bind()?;
        let e = self.event_handle(event)?;
        // SAFETY: a live event.
        match unsafe { result::event::query(e) } {
            Ok(()) => Ok(true),
            Err(err) if err.0 == sys::cudaError_enum::CUDA_ERROR_NOT_READY => Ok(false),
            Err(err) => Err(cuda_err("cuEventQuery (a kernel failed)", err)),
        }
    }

    pub(super) fn new_host(&mut self, bytes: usize) -> Result<usize> {
        self.bind()?;
        // SAFETY: a fresh page-locked allocation, zeroed below before any use.
        let host = unsafe { result::malloc_host(bytes, 0) }
            .map_err(|e| cuda_err(&format!("cuMemHostAlloc of {bytes} bytes"), e))?;
        let host: *mut u8 = host.cast();
        // SAFETY: `host` holds `bytes` writable bytes.
        unsafe { std::ptr::write_bytes(host, 0, bytes) };
        self.hosts.push(Some((host, bytes)));
        Ok(self.hosts.len() - 1)
    }

    pub(super) fn drop_host(&mut self, id: usize) -> Result<()> {
        self.bind()?;
        let host = self.host_range(id, 0, 0)?;
        self.hosts[id] = None;
        // SAFETY: from cuMemHostAlloc, freed once; the caller waited for its copies.
        unsafe { result::free_host(host.cast()) }.map_err(|e| cuda_err("cuMemFreeHost", e))
    }

    pub(super) fn copy_out(
        &mut self,
        host: usize,
        offset: usize,
        src: DevicePtr,
        bytes: usize,
        stream: usize,
    ) -> Result<()> {
        self.bind()?;
        let (dst, s) = (
            self.host_range(host, offset, bytes)?,
            self.stream_handle(stream)?,
        );
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: `dst` holds `bytes` page-locked bytes the host does not touch until the
        // copy's event has completed (Gpu::host_bytes waits); `src` holds `bytes` (the
        // caller's contract, as with cuMemcpyDtoH).
        let dst = unsafe { std::slice::from_raw_parts_mut(dst, bytes) };
        unsafe { result::memcpy_dtoh_async(dst, src.0, s) }
            .map_err(|e| cuda_err("cuMemcpyDtoHAsync", e))
    }

    pub(super) fn copy_in(
        &mut self,
        dst: DevicePtr,
        host: usize,
        offset: usize,
        bytes: usize,
        stream: usize,
    ) -> Result<()> {
        self.bind()?;
        let (src, s) = (
            self.host_range(host, offset, bytes)?,
            self.stream_handle(stream)?,
        );
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: `src` holds `bytes` page-locked bytes the host leaves alone until the copy
        // has run; `dst` has room for them (the caller's contract).
        let src = unsafe { std::slice::from_raw_parts(src, bytes) };
        unsafe { result::memcpy_htod_async(dst.0, src, s) }
            .map_err(|e| cuda_err("cuMemcpyHtoDAsync", e))
    }

    pub(super) fn host_slice(&mut self, id: usize) -> Result<&mut [u8]> {
        let len = self.hosts.get(id).copied().flatten().map_or(0, |(_, l)| l);
        let host = self.host_range(id, 0, len)?;
        // SAFETY: `len` bytes at `host`, page-locked and owned by this driver; the caller
        // waited for every copy that uses them, and the borrow of `self` keeps them alive.
        Ok(unsafe { std::slice::from_raw_parts_mut(host, len) })
    }
}
