//! The compute layer of Ferrum: devices, data types (float and GGUF block-quantized), tensor
//! storage (owned or memory-mapped), the CPU kernels and the persistent compute pool.
//!
//! This crate knows nothing of models or requests. Kernels take plain slices and tensors, so a
//! faster kernel (or a CUDA one behind a feature) replaces one function without touching callers.

pub mod comm;
pub mod cpu;
pub mod cuda;
mod device;
mod dtype;
mod error;
mod pool;
pub mod quant;
mod storage;
mod tensor;

pub use comm::{Communicator, SingleProcess};
pub use device::Device;
pub use dtype::DType;
pub use error::{Result, RuntimeError};
pub use pool::ThreadPool;
pub use storage::Storage;
pub use tensor::Tensor;
