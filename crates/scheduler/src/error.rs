//! The scheduler crate's error type.

use ferrum_types::RequestId;

/// Requests the scheduler refuses.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    #[error("the prompt has {prompt} tokens, but the KV cache holds at most {capacity} tokens (prompt and at least one generated token must fit)")]
    TooLong { prompt: usize, capacity: usize },
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("request {0} is already scheduled")]
    Duplicate(RequestId),
    #[error("request {0} is not scheduled")]
    Unknown(RequestId),
    #[error("request {0} is not running")]
    NotRunning(RequestId),
    #[error("request {0}: its last token is computed already and cannot change")]
    Computed(RequestId),
    #[error("invalid scheduler configuration: {0}")]
    Config(String),
}

pub type Result<T> = std::result::Result<T, SchedulerError>;
