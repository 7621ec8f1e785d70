//! The error type of plain-data validation.

/// A value that breaks the invariants of its type.
#[derive(Debug, thiserror::Error)]
pub enum TypesError {
    /// A forward batch is inconsistent with itself or with the cache it targets.
    #[error("invalid forward batch: {0}")]
    InvalidBatch(String),
    /// A sampling parameter out of range; names the parameter as the API spells it.
    #[error("invalid `{param}`: {msg}")]
    InvalidParam { param: &'static str, msg: String },
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, TypesError>;
