//! The CUDA driver: device memory, module loads, launches, streams, events and copies through
//! `libcuda`, loaded at run time by cudarc; vendor products through cuBLASLt ([`super::cublaslt`]).
//!
//! cudarc panics when a symbol or the library is missing, so [`CudaDriver::new`] first checks
//! that `libcuda` can be opened, then initializes the driver and checks the device before any
//! other call. The main stream is a stream of the primary context created here (the legacy
//! default stream cannot be captured into a graph); side streams are non-blocking too, so
//! streams are ordered only by the events callers record and wait for. Reads wait for the
//! main stream; a free waits for the whole context, so no work still in flight on any stream
//! reads freed memory.
//!
//! Profiling brackets each operation (and each graph replay) with two events on its stream;
//! their elapsed times are summed per kernel when the device is next waited for.

use std::ffi::{c_void, CString};

use cudarc::driver::{result, sys};

use super::cublaslt::CublasLt;
use super::gemm::{GemmSupport, LtMatmul};
use super::gpu::DevicePtr;
use super::manifest::{KernelBinary, KernelSpec, Variant};
use super::ops::{gemm_grid, Driver, KernelHandle, Op, Tally, GEMM_HANDLE, GRAPH_HANDLE};
use crate::{Result, RuntimeError};

mod streams;

/// Shared memory a block may use without opting in.
const DEFAULT_SHARED_LIMIT: u32 = 48 * 1024;

pub(super) fn cuda_err(step: &str, e: result::DriverError) -> RuntimeError {
    let name = e.error_name().map(|c| c.to_string_lossy().into_owned());
    let text = e.error_string().map(|c| c.to_string_lossy().into_owned());
    RuntimeError::Cuda {
        step: step.to_string(),
        detail: match (name, text) {
            (Ok(n), Ok(t)) => format!("{n}: {t}"),
            _ => format!("{:?}", e.0),
        },
    }
}

/// A CUDA device's primary context and the kernels loaded into it.
#[derive(Debug)]
pub(crate) struct CudaDriver {
    device: sys::CUdevice,
    ctx: sys::CUcontext,
    name: String,
    arch: String,
    cc: (i32, i32),
    shared_optin: i32,
    multiprocessors: usize,
    modules: Vec<sys::CUmodule>,
    functions: Vec<sys::CUfunction>,
    /// Streams by handle, the main one first; `None` once destroyed (handles are not reused).
    streams: Vec<Option<sys::CUstream>>,
    /// The main stream (`streams[0]`).
    stream: sys::CUstream,
    events: Vec<Option<sys::CUevent>>,
    /// Page-locked host buffers by handle: address and size; `None` once freed.
    hosts: Vec<Option<(*mut u8, usize)>>,
    /// Instantiated graphs by id; `None` once freed.
    graphs: Vec<Option<sys::CUgraphExec>>,
    capturing: bool,
    profiler: Option<Profiler>,
    /// Pinned staging areas of small writes, used in turn, and the next one's index.
    writes: Vec<Staging>,
    next_write: usize,
    /// cuBLASLt, once opened.
    gemm: Option<CublasLt>,
}

/// Writes up to this size go through a pinned staging area (a copy from pageable memory may
/// wait for the whole stream), so a step's inputs are uploaded while the previous step runs; a
/// write waits only for the copy that last used its area, [`STAGED_WRITES`] writes before
/// (a step makes one or two). Larger ones (weights, at load) copy from the caller's memory.
const STAGED_WRITE_MAX: usize = 4 << 20;

/// Staging areas for writes, used round-robin: one is reused only after its last copy ended.
const STAGED_WRITES: usize = 4;

/// A page-locked host area a write goes through asynchronously, and the event recorded after
/// the copy.
#[derive(Debug)]
struct Staging {
    host: *mut u8,
    capacity: usize,
    event: sys::CUevent,
}

/// Per-launch timing: event pairs in flight, and the totals of those already read.
#[derive(Debug, Default)]
struct Profiler {
    pending: Vec<(KernelHandle, [u32; 3], sys::CUevent, sys::CUevent)>,
    spare: Vec<sys::CUevent>,
    totals: std::collections::HashMap<(usize, [u32; 3]), (u64, f64)>,
}

// SAFETY: the driver API's handles may be used from any thread once the context is made
// current on it; every method does that first.
unsafe impl Send for CudaDriver {}

impl CudaDriver {
    /// Opens device `ordinal`, naming what is missing when it cannot.
    pub(crate) fn new(ordinal: usize) -> Result<CudaDriver> {
        // SAFETY: only tries to open the library; no symbol is called.
        if !unsafe { sys::is_culib_present() } {
            return Err(RuntimeError::Cuda {
                step: "loading the CUDA driver".into(),
                detail: "libcuda.so was not found: no NVIDIA driver is installed, or it is not on \
                         the library path"
                    .into(),
            });
        }
        result::init().map_err(|e| cuda_err("cuInit", e))?;
        let count = result::device::get_count().map_err(|e| cuda_err("cuDeviceGetCount", e))?;
        if count <= 0 {
            return Err(RuntimeError::Cuda {
                step: "finding a GPU".into(),
                detail: "the CUDA driver sees no device".into(),
            });
        }
        if ordinal >= count as usize {
            return Err(RuntimeError::Cuda {
                step: "finding a GPU".into(),
                detail: format!("cuda:{ordinal} asked for, but the driver sees {count} device(s)"),
            });
        }
        let device = result::device::get(ordinal as i32).map_err(|e| cuda_err("cuDeviceGet", e))?;
        let attr = |a| {
            // SAFETY: `device` came from cuDeviceGet.
            unsafe { result::device::get_attribute(device, a) }
                .map_err(|e| cuda_err("cuDeviceGetAttribute", e))
        };
        use sys::CUdevice_attribute::*;
        let cc = (
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let shared_optin = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
        let multiprocessors = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as usize;
        let name = result::device::get_name(device).map_err(|e| cuda_err("cuDeviceGetName", e))?;
        let arch = match cc.0 {
            8 => "sm80",
            9 => "sm90",
            _ => {
                return Err(RuntimeError::Cuda {
                    step: "choosing kernel binaries".into(),
                    detail: format!(
                        "{name} is compute capability {}.{}; this build embeds kernels for \
                         sm_80 (8.x) and sm_90 (9.x)",
                        cc.0, cc.1
                    ),
                })
            }
        };
        // SAFETY: `device` is valid; the context is released in Drop.
        let ctx = unsafe { result::primary_ctx::retain(device) }
            .map_err(|e| cuda_err("cuDevicePrimaryCtxRetain", e))?;
        let mut driver = CudaDriver {
            device,
            ctx,
            name,
            arch: arch.to_string(),
            cc,
            shared_optin,
            multiprocessors,
            modules: Vec::new(),
            functions: Vec::new(),
            streams: Vec::new(),
            stream: std::ptr::null_mut(),
            events: Vec::new(),
            hosts: Vec::new(),
            graphs: Vec::new(),
            capturing: false,
            profiler: None,
            writes: Vec::new(),
            next_write: 0,
            gemm: None,
        };
        driver.bind()?;
        driver.stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| cuda_err("cuStreamCreate", e))?;
        driver.streams.push(Some(driver.stream));
        Ok(driver)
    }

    fn sync_stream(&self) -> Result<()> {
        // SAFETY: the stream was created in `new` and lives until Drop.
        unsafe { result::stream::synchronize(self.stream) }
            .map_err(|e| cuda_err("cuStreamSynchronize (a kernel failed)", e))
    }

    /// An event for the profiler, reused when one is spare.
    fn event(&mut self) -> Result<sys::CUevent> {
        if let Some(e) = self.profiler.as_mut().and_then(|p| p.spare.pop()) {
            return Ok(e);
        }
        result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(|e| cuda_err("cuEventCreate", e))
    }

    /// Runs `issue` (one operation or replay on `stream`) between two recorded events when
    /// profiling and not capturing.
    fn timed(
        &mut self,
        what: KernelHandle,
        grid: [u32; 3],
        stream: sys::CUstream,
        issue: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<()> {
        if self.profiler.is_none() || self.capturing {
            return issue(self);
        }
        let (start, end) = (self.event()?, self.event()?);
        let issued = (|| {
            // SAFETY: both events and the stream are live.
            unsafe { result::event::record(start, stream) }
                .map_err(|e| cuda_err("cuEventRecord", e))?;
            issue(self)?;
            // SAFETY: as above.
            unsafe { result::event::record(end, stream) }.map_err(|e| cuda_err("cuEventRecord", e))
        })();
        if let Some(p) = self.profiler.as_mut() {
            match issued {
                Ok(()) => p.pending.push((what, grid, start, end)),
                // The events go back to the spares, not into the tally.
                Err(_) => p.spare.extend([start, end]),
            }
        }
        issued
    }

    /// Adds the pending event pairs' times to the totals (the stream has been waited for).
    fn harvest(&mut self) -> Result<()> {
        let Some(p) = self.profiler.as_mut() else {
            return Ok(());
        };
        let mut unfinished = Vec::new();
        for (h, grid, start, end) in p.pending.drain(..) {
            // A pair on a stream not yet waited for stays pending.
            // SAFETY: `end` was recorded and is live.
            if unsafe { result::event::query(end) }.is_err() {
                unfinished.push((h, grid, start, end));
                continue;
            }
            // SAFETY: both events were recorded and `end` has completed.
            let ms = unsafe { result::event::elapsed(start, end) }
                .map_err(|e| cuda_err("cuEventElapsedTime", e))?;
            let t = p.totals.entry((h.0, grid)).or_default();
            t.0 += 1;
            t.1 += f64::from(ms);
            p.spare.push(start);
            p.spare.push(end);
        }
        p.pending = unfinished;
        Ok(())
    }

    fn drop_profiler(&mut self) {
        if let Some(p) = self.profiler.take() {
            let _ = self.sync_all();
            let events = p.pending.iter().flat_map(|&(_, _, a, b)| [a, b]);
            for e in events.chain(p.spare.iter().copied()) {
                // SAFETY: each event was created once and is destroyed once.
                let _ = unsafe { result::event::destroy(e) };
            }
        }
    }

    fn bind(&self) -> Result<()> {
        // SAFETY: `ctx` is the retained primary context, alive until Drop.
        unsafe { result::ctx::set_current(self.ctx) }.map_err(|e| cuda_err("cuCtxSetCurrent", e))
    }
}

impl Driver for CudaDriver {
    fn describe(&self) -> String {
        format!("{} (sm_{}{})", self.name, self.cc.0, self.cc.1)
    }

    fn arch(&self) -> Option<&str> {
        Some(&self.arch)
    }

    fn multiprocessors(&self) -> usize {
        self.multiprocessors
    }

    fn alloc(&mut self, bytes: usize) -> Result<DevicePtr> {
        self.bind()?;
        // SAFETY: a plain allocation in the current context.
        let ptr = unsafe { result::malloc_sync(bytes) }
            .map_err(|e| cuda_err(&format!("allocating {bytes} bytes (cuMemAlloc)"), e))?;
        Ok(DevicePtr(ptr))
    }

    fn free(&mut self, ptr: DevicePtr) -> Result<()> {
        self.bind()?;
        self.sync_all()?;
        // SAFETY: the caller frees only what alloc returned, once.
        unsafe { result::free_sync(ptr.0) }.map_err(|e| cuda_err("cuMemFree", e))
    }

    fn write(&mut self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.bind()?;
        if src.is_empty() {
            return Ok(());
        }
        if src.len() > STAGED_WRITE_MAX {
            // SAFETY: `dst` has room for `src` (the caller's contract, as with cuMemcpyHtoD).
            // From pageable memory the copy is staged before the call returns, so `src` may
            // change afterwards; it lands in stream order.
            return unsafe { result::memcpy_htod_async(dst.0, src, self.stream) }
                .map_err(|e| cuda_err("cuMemcpyHtoDAsync", e));
        }
        if self.writes.len() < STAGED_WRITES {
            self.writes.push(staging_area()?);
        }
        let i = self.next_write % self.writes.len();
        self.next_write = self.next_write.wrapping_add(1);
        let w = &mut self.writes[i];
        // SAFETY: the event is live; a never-recorded one is complete. After it, the area's
        // last copy has ended, so its bytes may be replaced.
        unsafe { result::event::synchronize(w.event) }
            .map_err(|e| cuda_err("cuEventSynchronize (a kernel failed)", e))?;
        ensure_capacity(w, src.len())?;
        // SAFETY: `host` holds `capacity >= src.len()` page-locked bytes no copy is using
        // (the event above); `dst` has room for them (the caller's contract).
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), w.host, src.len());
            let staged = std::slice::from_raw_parts(w.host, src.len());
            result::memcpy_htod_async(dst.0, staged, self.stream)
                .map_err(|e| cuda_err("cuMemcpyHtoDAsync", e))?;
            result::event::record(w.event, self.stream).map_err(|e| cuda_err("cuEventRecord", e))
        }
    }

    fn read(&mut self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        self.bind()?;
        // SAFETY: `src` holds at least `dst.len()` bytes; the stream is waited for before
        // `dst` is used.
        unsafe { result::memcpy_dtoh_async(dst, src.0, self.stream) }
            .map_err(|e| cuda_err("cuMemcpyDtoHAsync", e))?;
        self.sync_stream()?;
        self.harvest()
    }

    fn load(
        &mut self,
        spec: &KernelSpec,
        variant: Variant,
        image: Option<(&KernelBinary, &[u8])>,
    ) -> Result<KernelHandle> {
        self.bind()?;
        let (bin, image) =
            image.ok_or_else(|| RuntimeError::Kernels(format!("{}: no cubin", spec.name)))?;
        let step = |s: &str| {
            format!(
                "loading kernel {} ({}, {}): {s}",
                spec.name,
                self.arch,
                variant.as_str()
            )
        };
        // SAFETY: `image` is a whole, 8-byte-aligned cubin checked by the manifest.
        let module = unsafe { result::module::load_data(image.as_ptr() as *const c_void) }
            .map_err(|e| cuda_err(&step("cuModuleLoadData"), e))?;
        self.modules.push(module);
        let symbol = CString::new(bin.symbol.as_str())
            .map_err(|_| RuntimeError::Kernels(step("symbol has a NUL")))?;
        // SAFETY: `module` was just loaded.
        let function = unsafe { result::module::get_function(module, symbol) }
            .map_err(|e| cuda_err(&step("cuModuleGetFunction"), e))?;
        if bin.shared > DEFAULT_SHARED_LIMIT {
            if bin.shared as i32 > self.shared_optin {
                return Err(RuntimeError::Kernels(step(&format!(
                    "needs {} bytes of shared memory, the device allows {}",
                    bin.shared, self.shared_optin
                ))));
            }
            // SAFETY: `function` is valid; the value is within the device's opt-in limit.
            unsafe {
                result::function::set_function_attribute(
                    function,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    bin.shared as i32,
                )
            }
            .map_err(|e| cuda_err(&step("cuFuncSetAttribute"), e))?;
        }
        self.functions.push(function);
        Ok(KernelHandle(self.functions.len() - 1))
    }

    fn issue(&mut self, op: &Op, stream: usize) -> Result<()> {
        self.bind()?;
        let stream = self.stream_handle(stream)?;
        match op {
            Op::Launch { kernel, dims, args } => self.launch(*kernel, *dims, args, stream),
            Op::Copy { dst, src, bytes } => {
                // Not profiled: a copy is no kernel's time.
                // SAFETY: both ranges lie in live allocations (the caller's contract, as with
                // cuMemcpyDtoD) and do not overlap (Gpu::copy checks).
                unsafe { result::memcpy_dtod_async(dst.0, src.0, *bytes, stream) }
                    .map_err(|e| cuda_err("cuMemcpyDtoDAsync", e))
            }
            Op::Gemm(call) => {
                let grid = gemm_grid(call);
                self.timed(GEMM_HANDLE, grid, stream, |d| {
                    let lt = d.gemm.as_mut().ok_or_else(|| {
                        RuntimeError::Kernels("a vendor product before cuBLASLt was opened".into())
                    })?;
                    lt.matmul(call, stream)
                })
            }
        }
    }

    fn synchronize(&mut self) -> Result<()> {
        self.bind()?;
        self.sync_all()?;
        self.harvest()
    }

    fn stream_create(&mut self) -> Result<usize> {
        self.new_stream()
    }

    fn stream_destroy(&mut self, stream: usize) -> Result<()> {
        self.drop_stream(stream)
    }

    fn event_create(&mut self) -> Result<usize> {
        self.new_event()
    }

    fn event_destroy(&mut self, event: usize) -> Result<()> {
        self.drop_event(event)
    }

    fn event_record(&mut self, event: usize, stream: usize) -> Result<()> {
        self.record_event(event, stream)
    }

    fn stream_wait(&mut self, stream: usize, event: usize) -> Result<()> {
        self.wait_event(stream, event)
    }

    fn event_synchronize(&mut self, event: usize) -> Result<()> {
        self.sync_event(event)?;
        self.harvest()
    }

    fn event_query(&mut self, event: usize) -> Result<bool> {
        self.query_event(event)
    }

    fn host_alloc(&mut self, bytes: usize) -> Result<usize> {
        self.new_host(bytes)
    }

    fn host_free(&mut self, host: usize) -> Result<()> {
        self.drop_host(host)
    }

    fn copy_to_host(
        &mut self,
        host: usize,
        offset: usize,
        src: DevicePtr,
        bytes: usize,
        stream: usize,
    ) -> Result<()> {
        self.copy_out(host, offset, src, bytes, stream)
    }

    fn copy_from_host(
        &mut self,
        dst: DevicePtr,
        host: usize,
        offset: usize,
        bytes: usize,
        stream: usize,
    ) -> Result<()> {
        self.copy_in(dst, host, offset, bytes, stream)
    }

    fn host_bytes(&mut self, host: usize) -> Result<&mut [u8]> {
        self.host_slice(host)
    }

    fn gemm_open(&mut self, path: Option<&std::path::Path>) -> Result<String> {
        self.bind()?;
        if let Some(lt) = &self.gemm {
            return Ok(lt.describe());
        }
        let lt = CublasLt::open(path)?;
        let what = lt.describe();
        self.gemm = Some(lt);
        Ok(what)
    }

    fn gemm_support(&mut self, call: &LtMatmul) -> Result<GemmSupport> {
        self.bind()?;
        match self.gemm.as_mut() {
            Some(lt) => lt.support(call),
            None => Ok(GemmSupport::Unsupported("cuBLASLt is not open".into())),
        }
    }

    fn capture_begin(&mut self) -> Result<()> {
        self.bind()?;
        // SAFETY: the stream is live and not capturing. Thread-local mode: this thread's
        // unsafe calls (an allocation, a synchronous copy) fail the capture instead of
        // slipping outside it.
        unsafe {
            result::stream::begin_capture(
                self.stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(|e| cuda_err("cuStreamBeginCapture", e))?;
        self.capturing = true;
        Ok(())
    }

    fn capture_end(&mut self) -> Result<usize> {
        self.bind()?;
        self.capturing = false;
        // SAFETY: the stream is capturing (capture_begin).
        let graph = unsafe { result::stream::end_capture(self.stream) }
            .map_err(|e| cuda_err("cuStreamEndCapture", e))?;
        // SAFETY: `graph` was just captured; the executable graph does not need it after.
        let exec = unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) };
        // SAFETY: `graph` is destroyed once, after instantiation copied it.
        let _ = unsafe { result::graph::destroy(graph) };
        let exec = exec.map_err(|e| cuda_err("cuGraphInstantiate", e))?;
        self.graphs.push(Some(exec));
        Ok(self.graphs.len() - 1)
    }

    fn capture_abort(&mut self) {
        if self.bind().is_ok() && self.capturing {
            self.capturing = false;
            // SAFETY: ends the open capture; an invalidated one returns an error and no graph.
            if let Ok(graph) = unsafe { result::stream::end_capture(self.stream) } {
                // SAFETY: the graph was never instantiated.
                let _ = unsafe { result::graph::destroy(graph) };
            }
        }
    }

    fn graph_launch(&mut self, id: usize) -> Result<()> {
        self.bind()?;
        let exec = self
            .graphs
            .get(id)
            .copied()
            .flatten()
            .ok_or_else(|| RuntimeError::Kernels(format!("no graph {id}")))?;
        let stream = self.stream;
        self.timed(GRAPH_HANDLE, [1, 1, 1], stream, |_| {
            // SAFETY: `exec` is a live instantiated graph; the stream is live.
            unsafe { result::graph::launch(exec, stream) }.map_err(|e| cuda_err("cuGraphLaunch", e))
        })
    }

    fn graph_drop(&mut self, id: usize) -> Result<()> {
        self.bind()?;
        if let Some(exec) = self.graphs.get_mut(id).and_then(Option::take) {
            self.sync_stream()?;
            // SAFETY: `exec` is live and no longer in use (the stream finished).
            unsafe { result::graph::exec_destroy(exec) }
                .map_err(|e| cuda_err("cuGraphExecDestroy", e))?;
        }
        Ok(())
    }

    fn set_profiling(&mut self, on: bool) -> Result<()> {
        self.bind()?;
        self.drop_profiler();
        if on {
            self.profiler = Some(Profiler::default());
        }
        Ok(())
    }

    fn profile(&mut self) -> Result<Vec<Tally>> {
        self.bind()?;
        self.sync_all()?;
        self.harvest()?;
        let p = self
            .profiler
            .as_ref()
            .ok_or_else(|| RuntimeError::Kernels("profiling is off (Gpu::set_profiling)".into()))?;
        Ok(p.totals
            .iter()
            .map(|(&(h, grid), &(n, ms))| (KernelHandle(h), grid, n, ms))
            .collect())
    }

    fn memory_info(&mut self) -> Result<Option<(usize, usize)>> {
        self.bind()?;
        result::mem_get_info()
            .map(Some)
            .map_err(|e| cuda_err("cuMemGetInfo", e))
    }
}

/// An empty staging area with its event.
fn staging_area() -> Result<Staging> {
    let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
        .map_err(|e| cuda_err("cuEventCreate", e))?;
    Ok(Staging {
        host: std::ptr::null_mut(),
        capacity: 0,
        event,
    })
}

/// Grows `area` to at least `bytes`; the caller knows no copy uses it.
fn ensure_capacity(area: &mut Staging, bytes: usize) -> Result<()> {
    if area.capacity >= bytes {
        return Ok(());
    }
    if !area.host.is_null() {
        // SAFETY: the area came from cuMemHostAlloc and no copy uses it (the caller's word).
        unsafe { result::free_host(area.host.cast()) }.map_err(|e| cuda_err("cuMemFreeHost", e))?;
        area.host = std::ptr::null_mut();
        area.capacity = 0;
    }
    let capacity = bytes.next_power_of_two().max(4096);
    // SAFETY: a fresh page-locked allocation; its bytes are read only after a copy into it.
    let host =
        unsafe { result::malloc_host(capacity, 0) }.map_err(|e| cuda_err("cuMemHostAlloc", e))?;
    area.host = host.cast();
    area.capacity = capacity;
    Ok(())
}

impl Drop for CudaDriver {
    fn drop(&mut self) {
        if self.bind().is_ok() {
            self.capture_abort();
            let _ = self.sync_all();
            self.drop_profiler();
            // Its handle and workspace, while the context lives.
            self.gemm = None;
            for r in self.writes.drain(..) {
                // SAFETY: the device is idle, so no copy from the area is pending; each area
                // and event is freed once.
                unsafe {
                    if !r.host.is_null() {
                        let _ = result::free_host(r.host.cast());
                    }
                    let _ = result::event::destroy(r.event);
                }
            }
            for exec in self.graphs.drain(..).flatten() {
                // SAFETY: each graph is destroyed once, after the stream finished.
                let _ = unsafe { result::graph::exec_destroy(exec) };
            }
            for e in self.events.drain(..).flatten() {
                // SAFETY: each event is destroyed once; the device is idle.
                let _ = unsafe { result::event::destroy(e) };
            }
            for (host, _) in self.hosts.drain(..).flatten() {
                // SAFETY: from cuMemHostAlloc, freed once; no copy uses it (the device is idle).
                let _ = unsafe { result::free_host(host.cast()) };
            }
            for s in self.streams.drain(..).flatten() {
                // SAFETY: each stream (the main one included) is idle and destroyed once.
                let _ = unsafe { result::stream::destroy(s) };
            }
            for &m in &self.modules {
                // SAFETY: each module was loaded once and is unloaded once.
                let _ = unsafe { result::module::unload(m) };
            }
            // SAFETY: balances the retain in `new`.
            let _ = unsafe { result::primary_ctx::release(self.device) };
        }
    }
}
