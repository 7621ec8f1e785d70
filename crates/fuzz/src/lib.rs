//! Fuzzing for Ferrum's untrusted inputs: model files (GGUF, safetensors, config.json), GGUF
//! tokenizer metadata, chat templates and OpenAI request bodies.
//!
//! Stable Rust has no libFuzzer, so this is a small mutation fuzzer of our own that runs as
//! ordinary `cargo test` targets (`crates/fuzz/tests/*.rs`, one binary per target so the
//! allocation tracker sees one target at a time):
//!
//! - [`mutate`]: a seeded byte mutator (bit flips, interesting integers written over header
//!   fields, truncation, deletion, duplication, splicing between inputs, dictionary words);
//! - [`harness`]: the loop. It mutates corpus entries for a time budget (`FERRUM_FUZZ_SECS`,
//!   default 3 s, so CI runs every target briefly), catches panics, checks each input's time
//!   and memory against the target's limits, and keeps an input in the corpus when it produces
//!   an outcome (an error message shape) not seen before: without coverage instrumentation,
//!   distinct outcomes are the feedback. A failing input is written under
//!   `target/fuzz-failures/` and the test fails naming it and the seed.
//! - [`alloc`]: a counting global allocator: the largest single allocation and the peak of
//!   live bytes while one input runs, so "a header claiming 2^60 elements is refused, not
//!   attempted" is checked, not assumed.
//!
//! Invariant: a target never panics, never runs past its time limit and never allocates more
//! than its memory limit, whatever the input.

pub mod alloc;
pub mod harness;
pub mod mutate;
