//! Plain data shared by every Ferrum layer: ids, the forward batch, sampling parameters (with a
//! constrained request's [`StructuredOutput`]), finish reasons, and the one small seeded generator ([`SplitMix64`]). No tensors and no I/O
//! live here.

pub mod batch;
mod error;
mod finish;
mod micro_batch;
mod sampling;
pub mod splitmix;
mod structured;
mod wire;

pub use batch::{ForwardBatch, SeqSlice};
pub use error::{Result, TypesError};
pub use finish::FinishReason;
pub use sampling::{SamplingParams, MAX_LOGPROBS};
pub use splitmix::SplitMix64;
pub use structured::{StructuredOutput, Trigger};

/// A token id in a model's vocabulary.
pub type TokenId = u32;

/// Identifies one sequence being generated (each of a request's `n` samples has its own).
pub type RequestId = u64;

/// Index of a block in the paged KV cache.
pub type BlockId = u32;
