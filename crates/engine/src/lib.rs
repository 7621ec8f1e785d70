//! The sampler chain, the step loop, the async handle and metrics.
//!
//! Nothing is implemented here yet; the engine issue fills this crate.
