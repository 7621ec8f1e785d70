//! What callers submit to the engine and the events they get back.

use crate::guide::Guide;
use ferrum_types::{FinishReason, SamplingParams, TokenId};
use std::time::Duration;

/// A request's service-level targets: its first token within `ttft`, and each later token
/// within `tpot` of the one before. Unless `best_effort`, a request the engine's cost model
/// predicts cannot meet its `ttft` is refused when submitted
/// ([`crate::EngineError::Unmeetable`]), before any compute. While it decodes, steps keep their
/// prefill chunks short enough for its `tpot` (see `ferrum_scheduler::Scheduler::set_tpot`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Slo {
    pub ttft: Option<Duration>,
    pub tpot: Option<Duration>,
    pub best_effort: bool,
}

/// One generation request: a tokenized prompt and how to sample it.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt: Vec<TokenId>,
    pub params: SamplingParams,
    /// Lower values are scheduled first; equal priorities are first come, first served
    /// (under the `priority` and `fair` scheduling policies).
    pub priority: i32,
    /// Whose share of the engine the request uses (the `fair` policy); `None`: the tenant of
    /// requests that name none.
    pub tenant: Option<String>,
    /// Service-level targets, if any.
    pub slo: Option<Slo>,
    /// `params.structured` compiled already ([`crate::EngineHandle::compile_guide`], say on a
    /// blocking thread); when `None`, `generate` compiles it.
    pub guide: Option<Guide>,
}

impl GenerateRequest {
    pub fn new(prompt: Vec<TokenId>, params: SamplingParams) -> Self {
        GenerateRequest {
            prompt,
            params,
            priority: 0,
            tenant: None,
            slo: None,
            guide: None,
        }
    }
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Generated tokens over all `n` samples.
    pub completion_tokens: usize,
    /// Prompt tokens whose K/V came from the prefix cache (first sample).
    pub cached_tokens: usize,
    /// Speculative decoding, over all samples: runs that verified proposals, tokens proposed
    /// and tokens accepted.
    pub spec_drafts: usize,
    pub spec_draft_tokens: usize,
    pub spec_accepted_tokens: usize,
}

impl Usage {
    /// Tokens a verifying run produced on average (1.0 without speculation).
    pub fn mean_acceptance_length(&self) -> f64 {
        if self.spec_drafts == 0 {
            1.0
        } else {
            1.0 + self.spec_accepted_tokens as f64 / self.spec_drafts as f64
        }
    }
}

/// What a request's stream yields, in order: `Token`s (interleaved across samples when
/// `n > 1`), one `Finished` per sample, then `Done`. `Error` ends the stream early.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Token {
        /// Which of the `n` samples.
        index: usize,
        token: TokenId,
        /// Text that became final with this token (possibly empty).
        text: String,
        logprob: Option<f32>,
        top_logprobs: Vec<(TokenId, f32)>,
    },
    Finished {
        index: usize,
        reason: FinishReason,
        /// Text released when the sample ended (held-back text); possibly empty.
        text: String,
    },
    Done {
        usage: Usage,
    },
    Error(String),
}
