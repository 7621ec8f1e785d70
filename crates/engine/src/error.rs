//! The engine crate's error type.

/// Errors from running generation.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ferrum_models::ModelError),
    #[error(transparent)]
    Tokenizer(#[from] ferrum_tokenizer::TokenizerError),
    /// A request that cannot run (bad parameters, a prompt too long for the context, ...).
    #[error(transparent)]
    Params(#[from] ferrum_types::TypesError),
    #[error("{0}")]
    Invalid(String),
    /// A structured-output constraint that does not compile (or the model cannot take one).
    #[error("the {kind} cannot be used: {msg}")]
    Constraint { kind: &'static str, msg: String },
    /// Too many requests are queued; try again later.
    #[error("the engine is at its limit of {0} queued and running requests")]
    Overloaded(usize),
    /// The engine is shutting down or has stopped.
    #[error("{0}")]
    Unavailable(String),
}

pub type Result<T> = std::result::Result<T, EngineError>;
