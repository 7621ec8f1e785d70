//! Why a sequence stopped generating.

use crate::TokenId;

/// The reason a sequence finished. OpenAI's coarser `finish_reason` is [`FinishReason::as_openai`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// The model produced an end-of-sequence token.
    Eos(TokenId),
    /// The model produced one of the request's stop token ids.
    StopToken(TokenId),
    /// The output reached one of the request's stop strings (which is not included).
    StopString(String),
    /// The output completed its structured-output constraint, which allows nothing more.
    ConstraintEnd,
    /// `max_tokens` tokens were generated.
    MaxTokens,
    /// The sequence filled the model's context (`max_model_len`).
    MaxModelLen,
    /// The request was cancelled.
    Abort,
}

impl FinishReason {
    /// `stop`, `length` or `abort`, as the OpenAI API reports it.
    pub fn as_openai(&self) -> &'static str {
        match self {
            FinishReason::Eos(_)
            | FinishReason::StopToken(_)
            | FinishReason::StopString(_)
            | FinishReason::ConstraintEnd => "stop",
            FinishReason::MaxTokens | FinishReason::MaxModelLen => "length",
            FinishReason::Abort => "abort",
        }
    }
}

impl std::fmt::Display for FinishReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FinishReason::Eos(id) => write!(f, "end of sequence (token {id})"),
            FinishReason::StopToken(id) => write!(f, "stop token {id}"),
            FinishReason::StopString(s) => write!(f, "stop string {s:?}"),
            FinishReason::ConstraintEnd => write!(f, "end of the output's constraint"),
            FinishReason::MaxTokens => write!(f, "max tokens"),
            FinishReason::MaxModelLen => write!(f, "max model length"),
            FinishReason::Abort => write!(f, "aborted"),
        }
    }
}
