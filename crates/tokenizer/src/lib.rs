//! Tokenizers, chat templates, the incremental detokenizer and stop strings.
//!
//! Nothing is implemented here yet; the text issue fills this crate.
