//! The pure scheduler: sequences, the block pool and the scheduling policy.
//!
//! Nothing is implemented here yet; the continuous-batching issue fills this crate. It stays free
//! of tensors, threads and I/O so that it can be tested without a model.
