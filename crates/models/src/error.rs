//! The models crate's error type. Every variant names the file, key or tensor at fault.

use std::path::PathBuf;

/// Errors from loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file system refused an operation.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file is malformed or truncated.
    #[error("{}: {msg}", path.display())]
    Format { path: PathBuf, msg: String },
    /// A config key is missing, has the wrong type or an unusable value.
    #[error("{}: key `{key}`: {msg}", path.display())]
    Config {
        path: PathBuf,
        key: String,
        msg: String,
    },
    /// A tensor the architecture needs is absent.
    #[error("{}: missing tensor `{name}`", path.display())]
    MissingTensor { path: PathBuf, name: String },
    /// A tensor has the wrong shape for the config.
    #[error("{}: tensor `{name}` has shape {actual:?}, expected {expected:?}", path.display())]
    TensorShape {
        path: PathBuf,
        name: String,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    /// A tensor is stored in a type Ferrum cannot compute with.
    #[error("{}: tensor `{name}` has type {dtype}, which Ferrum does not support", path.display())]
    UnsupportedDType {
        path: PathBuf,
        name: String,
        dtype: String,
    },
    /// The architecture is not in the registry.
    #[error("{}: unknown architecture `{name}` (supported: {supported})", path.display())]
    UnknownArchitecture {
        path: PathBuf,
        name: String,
        supported: String,
    },
    /// A model path is neither a model folder nor a GGUF file.
    #[error("{}: {msg}", path.display())]
    NotAModel { path: PathBuf, msg: String },
    /// A KV cache or batch does not fit the model.
    #[error("{0}")]
    Invalid(String),
    /// A device operation failed (a kernel launch, a copy, a vendor product): what ran, and
    /// the device's error. A server answers it as its own failure, never as a bad request.
    #[error("GPU: {what}: {source}")]
    Gpu {
        what: String,
        source: ferrum_runtime::RuntimeError,
    },
    /// The model uses something its device cannot run yet (a weight format on the GPU, say).
    #[error("{0}")]
    NotOnDevice(String),
    #[error(transparent)]
    Runtime(#[from] ferrum_runtime::RuntimeError),
    #[error(transparent)]
    Batch(#[from] ferrum_types::TypesError),
    #[error(transparent)]
    Tokenizer(#[from] ferrum_tokenizer::TokenizerError),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, ModelError>;

impl ModelError {
    pub(crate) fn format(path: impl Into<PathBuf>, msg: impl Into<String>) -> ModelError {
        ModelError::Format {
            path: path.into(),
            msg: msg.into(),
        }
    }

    /// A device operation's failure, naming the operation.
    pub(crate) fn gpu(what: impl Into<String>, source: ferrum_runtime::RuntimeError) -> ModelError {
        ModelError::Gpu {
            what: what.into(),
            source,
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> ModelError {
        ModelError::Io {
            path: path.into(),
            source,
        }
    }
}
