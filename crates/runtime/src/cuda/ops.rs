//! The operations a device driver offers [`Gpu`](super::Gpu): memory, kernel launches, streams
//! and events, copies between device buffers and to and from page-locked host buffers, vendor
//! matrix products, graph capture and profiling. Two implementations: the CUDA driver
//! (`driver.rs`) and the Triton interpreter in a worker process (`interpreted.rs`).
//!
//! Handles are indices the driver hands out (streams, events, host buffers, graphs, kernels);
//! stream 0 ([`MAIN_STREAM`]) exists from the start and is the one a graph is captured on.
//! Work on one stream runs in issue order; work on two streams is ordered only by events (a
//! stream that waits for an event runs nothing issued after the wait until the work recorded
//! before the event has finished). The interpreted driver runs the main stream's work at once
//! and every other stream's as late as those rules allow, so a missing wait shows in CI as
//! wrong bytes, not as a race that a GPU happens to win.

use std::fmt;

use super::gemm::{GemmSupport, LtMatmul};
use super::gpu::{DevicePtr, KernelArg};
use super::manifest::{KernelBinary, KernelSpec, Variant};
use crate::Result;

/// The stream every [`Gpu`](super::Gpu) operation without a stream of its own goes to.
pub(crate) const MAIN_STREAM: usize = 0;

/// A loaded kernel: an index into the driver's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KernelHandle(pub usize);

/// What a launch needs beyond the arguments.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaunchDims {
    /// Programs in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block (`num_warps x 32`).
    pub block: u32,
    /// Dynamic shared memory per block, in bytes.
    pub shared: u32,
    /// Triton's global scratch (null when the kernel needs none); the profile scratch that
    /// follows it in the ABI is always null.
    pub scratch: DevicePtr,
}

/// One operation a graph can hold: what a capture records and a replay issues.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    /// A kernel launch.
    Launch {
        kernel: KernelHandle,
        dims: LaunchDims,
        args: Vec<KernelArg>,
    },
    /// `bytes` from `src` to `dst`, both on the device.
    Copy {
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    },
    /// A vendor matrix product.
    Gemm(LtMatmul),
}

/// The operations a device offers. Every `stream`, `event` and `host` argument is a handle
/// this driver returned and has not destroyed (a stale one is an error, never undefined).
pub(crate) trait Driver: fmt::Debug + Send {
    /// The device in words (`NVIDIA H100 80GB HBM3 (sm_90)`, `interpreted`).
    fn describe(&self) -> String;
    /// The architecture whose binaries this device runs (`sm90`); `None` runs the sources.
    fn arch(&self) -> Option<&str>;
    /// Streaming multiprocessors (the interpreted device answers as the GPU it stands in for).
    fn multiprocessors(&self) -> usize;
    /// Allocates `bytes` (at least 256-byte aligned).
    fn alloc(&mut self, bytes: usize) -> Result<DevicePtr>;
    /// Frees an allocation, after all work issued before on every stream.
    fn free(&mut self, ptr: DevicePtr) -> Result<()>;
    /// Copies host bytes to the device on the main stream (`src` may change once this
    /// returns).
    fn write(&mut self, dst: DevicePtr, src: &[u8]) -> Result<()>;
    /// Copies device bytes to the host after all work on the main stream.
    fn read(&mut self, src: DevicePtr, dst: &mut [u8]) -> Result<()>;
    /// Loads one binary of a kernel: `variant`'s cubin for [`Driver::arch`] with its figures,
    /// or, for the interpreter, the spec (which checks an aligned variant's hints at each
    /// launch, as the compiled binary assumes them).
    fn load(
        &mut self,
        spec: &KernelSpec,
        variant: Variant,
        image: Option<(&KernelBinary, &[u8])>,
    ) -> Result<KernelHandle>;
    /// Issues `op` on `stream` (while a capture is open, on the main stream: records it).
    fn issue(&mut self, op: &Op, stream: usize) -> Result<()>;
    /// Waits for all issued work on every stream.
    fn synchronize(&mut self) -> Result<()>;
    /// Free and total device memory in bytes; `None` where the device's memory is the host's.
    fn memory_info(&mut self) -> Result<Option<(usize, usize)>>;

    /// A new stream.
    fn stream_create(&mut self) -> Result<usize>;
    /// Destroys a stream (its issued work still runs to the end).
    fn stream_destroy(&mut self, stream: usize) -> Result<()>;
    /// A new event, complete until first recorded.
    fn event_create(&mut self) -> Result<usize>;
    /// Destroys an event.
    fn event_destroy(&mut self, event: usize) -> Result<()>;
    /// Records `event` on `stream`: it completes once the work issued there before has.
    fn event_record(&mut self, event: usize, stream: usize) -> Result<()>;
    /// Makes `stream` wait, before its later work, for `event`'s latest record.
    fn stream_wait(&mut self, stream: usize, event: usize) -> Result<()>;
    /// Blocks the host until `event`'s latest record has completed.
    fn event_synchronize(&mut self, event: usize) -> Result<()>;
    /// Whether `event`'s latest record has completed (without blocking).
    fn event_query(&mut self, event: usize) -> Result<bool>;

    /// A page-locked host buffer of `bytes` (zeroed), for asynchronous copies.
    fn host_alloc(&mut self, bytes: usize) -> Result<usize>;
    /// Frees a host buffer once no copy uses it.
    fn host_free(&mut self, host: usize) -> Result<()>;
    /// Copies `bytes` device bytes at `src` into host buffer `host` at `offset`, on `stream`.
    fn copy_to_host(
        &mut self,
        host: usize,
        offset: usize,
        src: DevicePtr,
        bytes: usize,
        stream: usize,
    ) -> Result<()>;
    /// Copies `bytes` of host buffer `host` from `offset` to the device at `dst`, on `stream`
    /// (the bytes are read when the copy runs).
    fn copy_from_host(
        &mut self,
        dst: DevicePtr,
        host: usize,
        offset: usize,
        bytes: usize,
        stream: usize,
    ) -> Result<()>;
    /// A host buffer's bytes; the caller has waited for every copy that uses it.
    fn host_bytes(&mut self, host: usize) -> Result<&mut [u8]>;

    /// Opens the vendor library for matrix products (cuBLASLt): the library at `path` when
    /// given, else the first one found. Returns what was opened, in words.
    fn gemm_open(&mut self, path: Option<&std::path::Path>) -> Result<String>;
    /// Whether the open vendor library runs `call`'s shape, types and alignments.
    fn gemm_support(&mut self, call: &LtMatmul) -> Result<GemmSupport>;

    /// Starts capturing the main stream: operations issued there until
    /// [`Driver::capture_end`] are recorded, not run.
    fn capture_begin(&mut self) -> Result<()>;
    /// Ends a capture: the recorded operations become graph `id`, replayed by
    /// [`Driver::graph_launch`].
    fn capture_end(&mut self) -> Result<usize>;
    /// Abandons a capture (after a failed operation inside it); nothing is kept.
    fn capture_abort(&mut self);
    /// Issues every operation of graph `id` on the main stream, in capture order.
    fn graph_launch(&mut self, id: usize) -> Result<()>;
    /// Frees graph `id`.
    fn graph_drop(&mut self, id: usize) -> Result<()>;
    /// Turns per-operation timing on or off ([`Gpu::set_profiling`](super::Gpu::set_profiling)).
    fn set_profiling(&mut self, on: bool) -> Result<()>;
    /// Launches and device time per kernel handle and grid since profiling began; graph
    /// replays under [`GRAPH_HANDLE`], vendor products under [`GEMM_HANDLE`].
    fn profile(&mut self) -> Result<Vec<Tally>>;
}

/// One kernel's (handle, grid) profile entry: launches and device time in milliseconds.
pub(crate) type Tally = (KernelHandle, [u32; 3], u64, f64);

/// The handle under which [`Driver::profile`] reports graph replays.
pub(crate) const GRAPH_HANDLE: KernelHandle = KernelHandle(usize::MAX);

/// The handle under which [`Driver::profile`] reports vendor matrix products (the grid holds
/// the product's m, n and k, saturated at `u32::MAX`).
pub(crate) const GEMM_HANDLE: KernelHandle = KernelHandle(usize::MAX - 1);

/// A vendor product's profile "grid": its sizes.
pub(crate) fn gemm_grid(call: &LtMatmul) -> [u32; 3] {
    let s = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    // Row-major terms (m rows of activations): cuBLASLt's n, m, k.
    [s(call.n), s(call.m), s(call.k)]
}
