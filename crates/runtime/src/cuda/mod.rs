//! The CUDA backend's device layer: device memory, copies and launches of the embedded Triton
//! kernels, over two interchangeable drivers.
//!
//! - [`Gpu::cuda`] talks to an NVIDIA GPU through the CUDA driver API (cudarc, `libcuda` loaded
//!   at run time: building and running the CPU path need no CUDA at all). It probes for the
//!   library before any call, so a machine without a driver gets an error, not a panic.
//! - [`Gpu::interpreted`] keeps buffers in a worker process's host memory and runs each launch,
//!   with the grid and arguments the Rust code computed, in the Triton interpreter
//!   (`kernels/ferrum_kernels/worker.py`). CI runs the backend on it, so every line above the
//!   few driver calls is tested without a GPU.
//!
//! Kernels come from `kernels/` (Triton sources, pinned Triton), compiled ahead of time by
//! `kernels/build.py` into one binary per architecture plus a manifest ([`manifest`]); the
//! binary embeds both. [`Gpu`] loads every kernel at start and checks each launch against the
//! manifest: the number and kinds of arguments, the grid's limits. Launches follow Triton's ABI:
//! the kernel's own parameters, then its global and profile scratch pointers; blocks of
//! `num_warps x 32` threads; the kernel's shared memory as dynamic shared memory, opted in above
//! 48 KiB.
//!
//! A sequence of launches can be captured once ([`Gpu::begin_capture`]) and replayed as one
//! graph ([`Gpu::replay`]): a CUDA graph on a GPU (one submission for hundreds of launches),
//! the recorded launch list on the interpreted device, so the capture logic above the driver is
//! tested in CI. [`Gpu::set_profiling`] times each launch with device events.
//!
//! Beside launches, the device layer has what a serving engine needs: streams and
//! events that callers hold, device-to-device copies, page-locked [`HostBuffer`]s with
//! asynchronous copies to and from them, and vendor matrix products ([`Gemm`], cuBLASLt loaded
//! at run time like libcuda) as operations beside kernel launches. The interpreted device runs
//! each of them (cuBLASLt's product in numpy under its layout rules), so CI runs every one.
//!
//! Invariants: a [`DevicePtr`] is only meaningful on the [`Gpu`] that allocated it; operations
//! on one stream run in issue order, and across streams only as events order them;
//! [`Gpu::read`] returns after everything issued on the main stream before it has finished;
//! while a capture is open only the capturing thread's launches, device copies and vendor
//! products on the main stream are allowed (recorded, never skipped: anything else is an
//! error), and a graph replays the addresses and arguments it was captured with.

mod buffer;
mod cublaslt;
mod driver;
mod gemm;
mod gpu;
mod interpreted;
pub mod manifest;
mod ops;
mod stream;

pub use buffer::{DeviceBuffer, SharedGpu};
pub use gemm::{Gemm, GemmSupport, GemmType};
pub use gpu::{DevicePtr, Gpu, GraphId, KernelArg, KernelTime, VariantLaunches};
pub use interpreted::{InterpretedGemm, InterpreterConfig};
pub use manifest::{AlignedVariant, Dispatch, KernelBinary, KernelSpec, Manifest, Variant};
pub use stream::{Event, HostBuffer, Stream};
