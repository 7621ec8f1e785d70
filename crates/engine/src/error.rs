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
}

pub type Result<T> = std::result::Result<T, EngineError>;
