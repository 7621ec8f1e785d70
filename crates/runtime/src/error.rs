//! The runtime's error type.

/// Errors raised by tensor construction and kernels when their inputs disagree.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A tensor's byte length does not match its shape and dtype.
    #[error(
        "tensor of dtype {dtype} and shape {shape:?} needs {expected} bytes, storage has {actual}"
    )]
    StorageSize {
        dtype: crate::DType,
        shape: Vec<usize>,
        expected: usize,
        actual: usize,
    },
    /// A row length is not a whole number of quantization blocks.
    #[error("dtype {dtype} stores blocks of {block} elements; a row of {cols} elements is not a whole number of blocks")]
    PartialBlock {
        dtype: crate::DType,
        cols: usize,
        block: usize,
    },
    /// Shapes of kernel operands disagree.
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// The embedded GPU kernels or their manifest are unusable, or a launch does not match
    /// its kernel.
    #[error("GPU kernels: {0}")]
    Kernels(String),
    /// A CUDA driver call (or the interpreted device standing in for it) failed.
    #[error("CUDA, {step}: {detail}")]
    Cuda { step: String, detail: String },
    /// A communicator between the ranks of a parallel run failed or was misused.
    #[error("communicator: {0}")]
    Comm(String),
    /// Element count overflows the address space.
    #[error("tensor shape {0:?} is too large")]
    TooLarge(Vec<usize>),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, RuntimeError>;
