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
//! Invariants: a [`DevicePtr`] is only meaningful on the [`Gpu`] that allocated it; operations
//! on one [`Gpu`] run in issue order (one stream), and [`Gpu::read`] returns after everything
//! issued before it has finished ([`Gpu::start_read`] does not wait: the bytes are collected later
//! by [`Gpu::finish_read`], so the host can go on issuing work meanwhile); while a capture is open only launches are allowed (no
//! allocation, free, copy or wait), and a graph replays the addresses and arguments it was
//! captured with.

mod buffer;
mod driver;
mod gpu;
mod interpreted;
pub mod manifest;

pub use buffer::{DeviceBuffer, SharedGpu};
pub use gpu::{DevicePtr, Gpu, GraphId, KernelArg, KernelTime, PendingRead, VariantLaunches};
pub use interpreted::InterpreterConfig;
pub use manifest::{AlignedVariant, KernelBinary, KernelSpec, Manifest, Variant};
