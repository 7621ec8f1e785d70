//! Structured output: a request's [`StructuredOutput`](ferrum_types::StructuredOutput)
//! constraint as a token mask, with llguidance.
//!
//! - [`GuideCompiler`] is built once per tokenizer (its token trie comes from Ferrum's own
//!   tokenizer, byte-level or SentencePiece alike, see
//!   [`Tokenizer::token_bytes`](ferrum_tokenizer::Tokenizer::token_bytes)); it compiles a
//!   constraint into a [`Guide`] and computes the guide's first mask, so a constraint that
//!   does not compile is refused before the request reaches the engine loop.
//! - A [`Guide`] follows one sequence: before each sampling it offers the mask of the tokens
//!   the constraint allows next, and after it consumes the sampled token. The engine computes
//!   the masks of a step on a helper thread while the forward pass runs.
//! - GBNF (llama.cpp's grammar format) is translated into llguidance's Lark syntax by
//!   [`gbnf::to_lark`].
//!
//! Invariants: a guide only ever consumes tokens its mask allowed; the mask it offers is the
//! one of its current state (consuming a token drops it); special tokens are never allowed
//! except the end-of-sequence ids, which are allowed exactly when the constraint is complete.

mod compiler;
pub mod gbnf;
mod matcher;

pub use compiler::GuideCompiler;
pub use matcher::Guide;
