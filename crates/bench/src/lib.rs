//! The measurements behind `ferrum bench`, apart from the binary that parses its flags.
//!
//! - [`mod@latency`], [`mod@throughput`], [`mod@bandwidth`], [`mod@comm`]: offline figures of a
//!   loaded model, the batching engine, the machine and the links between ranks, as typed configs in and typed results out; the command
//!   line loads the model and prints.
//! - [`mod@perplexity`]: a model's perplexity on a text, and its distance from a reference
//!   setting of the same model (KL divergence, argmax and greedy agreement).
//! - [`serve`]: an online load generator for any OpenAI-compatible server; [`soak`]: a
//!   fault-injecting load that checks a server's responses and recovery. Both are HTTP clients
//!   and own their flags (clap `Args`), which the command line mounts as subcommands.
//!
//! Like the binary, this is tooling at the top of the stack: errors are `anyhow` errors that
//! name the flag or the server at fault, not a library error type.

pub mod bandwidth;
pub mod comm;
pub mod latency;
pub mod perplexity;
pub mod serve;
pub mod soak;
pub mod throughput;

pub use bandwidth::{bandwidth, BandwidthResult};
pub use comm::{comm, CommResult};
pub use latency::{latency, DecodeProfile, LatencyConfig, LatencyResult};
pub use perplexity::{perplexity, PerplexityConfig, PerplexityResult};
pub use throughput::{throughput, ThroughputConfig, ThroughputResult};

/// The median of `v` (the upper one of an even count); `v` is not empty.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
