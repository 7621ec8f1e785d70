//! Generation: the sampling chain ([`sampler`]), per-sequence output processing (text deltas,
//! stop conditions), the continuous-batching engine loop on its own thread behind
//! [`EngineHandle`] (streams of [`Event`]s, abort, graceful shutdown, [`Metrics`]), and
//! [`EngineHandle::generate_one`], which runs one request through that same loop for the
//! command line; speculative decoding ([`spec`]) verifies proposed tokens inside that loop.

mod config;
mod engine;
mod error;
pub mod guide;
mod handle;
pub mod metrics;
mod output;
mod overlap;
mod request;
mod requests;
mod rng;
pub mod sampler;
mod single;
mod slo;
pub mod spec;
mod step_limit;
mod tenants;
pub mod tier;

#[cfg(feature = "fault-injection")]
pub use config::FaultInjection;
pub use config::{available_memory, EngineConfig, KvCacheSize, DEFAULT_COST_SEED};
pub use error::{EngineError, Result};
pub use ferrum_scheduler::SchedulingPolicy;
pub use guide::{Guide, GuideCompiler};
pub use handle::{EngineHandle, EventStream};
pub use metrics::{Metrics, SpecCounters};
pub use output::{OutputProcessor, TokenOutput};
pub use request::{Event, GenerateRequest, Slo, Usage};
pub use rng::{Draws, Rng};
pub use sampler::{SampleOutput, Sampler};
pub use single::{Generation, TokenEvent};
pub use spec::{NgramProposer, Proposer, SpeculativeConfig};
pub use tier::{KvDiskConfig, TierCounters};
