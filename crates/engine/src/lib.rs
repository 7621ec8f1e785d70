//! Generation: the sampling chain ([`sampler`]), per-sequence output processing (text deltas,
//! stop conditions), and a single-sequence [`Generator`] over a model and its KV cache. The
//! continuous-batching step loop, the async handle and metrics build on these.

mod error;
mod generate;
mod output;
mod rng;
pub mod sampler;

pub use error::{EngineError, Result};
pub use generate::{Generation, Generator, GeneratorConfig, TokenEvent};
pub use output::{OutputProcessor, TokenOutput};
pub use rng::Rng;
pub use sampler::{SampleOutput, Sampler};
