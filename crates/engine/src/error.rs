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
    /// A request the engine cannot take as it is (an empty prompt, one longer than the
    /// context, a token outside the vocabulary, a parameter this path does not serve): the
    /// client's to mend.
    #[error("{0}")]
    Request(String),
    /// A configuration the engine cannot start with (limits that contradict each other, a
    /// speculative setting without its draft model...): the operator's to mend.
    #[error("{0}")]
    Config(String),
    /// A fault inside the engine (a failed or panicking step, a broken invariant, a thread
    /// that cannot start): never the client's.
    #[error("{0}")]
    Internal(String),
    /// A structured-output constraint that does not compile (or the model cannot take one).
    #[error("the {kind} cannot be used: {msg}")]
    Constraint { kind: &'static str, msg: String },
    /// The cost model predicts the request's first token after its target: refused before any
    /// compute; `retry_after` is when it could be met.
    #[error("{msg}")]
    Unmeetable {
        msg: String,
        retry_after: std::time::Duration,
    },
    /// Too many requests are queued; try again later.
    #[error("the engine is at its limit of {0} queued and running requests")]
    Overloaded(usize),
    /// The engine is shutting down or has stopped.
    #[error("{0}")]
    Unavailable(String),
}

pub type Result<T> = std::result::Result<T, EngineError>;
