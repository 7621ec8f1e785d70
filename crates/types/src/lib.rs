//! Plain data shared by every Ferrum layer: ids, the forward batch, and later sampling
//! parameters, requests, events and engine configuration. No tensors and no I/O live here.

pub mod batch;
mod error;

pub use batch::{ForwardBatch, SeqSlice};
pub use error::{Result, TypesError};

/// A token id in a model's vocabulary.
pub type TokenId = u32;

/// Index of a block in the paged KV cache.
pub type BlockId = u32;
