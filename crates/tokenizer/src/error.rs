//! The tokenizer crate's error type. Every variant names the file, key or token at fault.

use std::path::PathBuf;

/// Errors from loading tokenizers and chat templates, encoding, decoding and rendering.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Json { path: PathBuf, message: String },
    /// A tokenizer.json the `tokenizers` crate refused, or an encode/decode failure inside it.
    #[error("tokenizer: {0}")]
    Backend(String),
    /// GGUF tokenizer metadata that cannot describe a vocabulary.
    #[error("GGUF tokenizer metadata: {0}")]
    Gguf(String),
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    UnknownToken { id: u32, vocab_size: usize },
    #[error("this model has no chat template (looked in tokenizer_config.json, chat_template.jinja and GGUF tokenizer.chat_template); use a raw prompt instead")]
    NoChatTemplate,
    #[error("chat template: {0}")]
    Template(String),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, TokenizerError>;

impl TokenizerError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        TokenizerError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn backend(e: impl std::fmt::Display) -> Self {
        TokenizerError::Backend(e.to_string())
    }
}
