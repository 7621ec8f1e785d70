//! Incremental detokenization: text deltas as tokens arrive.
//!
//! Decoding is not per-token: a byte-level token may hold half a UTF-8 character, and
//! SentencePiece decoders change a token's text by its position. So, as vLLM does, the
//! detokenizer decodes a small window `ids[prefix_offset..]` and compares it with the text of
//! `ids[prefix_offset..read_offset]` that was already released.
//!
//! Invariants:
//! - `prefix_offset <= read_offset <= ids.len()`; text up to `read_offset` has been released.
//! - A delta never ends with U+FFFD caused by a character split across tokens: the window is
//!   held until the character completes. To bound the cost per token, a window that stays
//!   unfinished for [`MAX_PENDING_TOKENS`] tokens is released as it is.
//! - The window starts at a token boundary where the released text ended on a whole character,
//!   so the cost per token does not depend on how long the output already is, and the
//!   concatenated deltas equal the decode of the whole sequence (after the context tokens).

use crate::{Result, Tokenizer};
use ferrum_types::TokenId;

/// How many prompt tokens are decoded as context before the first output token, so that the
/// first delta gets the spacing it has in context.
pub const CONTEXT_TOKENS: usize = 5;

/// Tokens a window may wait for a character to complete before it is released regardless.
pub const MAX_PENDING_TOKENS: usize = 32;

/// Streams the text of one sequence's output tokens.
#[derive(Debug, Clone)]
pub struct IncrementalDetokenizer {
    ids: Vec<TokenId>,
    prefix_offset: usize,
    read_offset: usize,
    skip_special_tokens: bool,
}

impl IncrementalDetokenizer {
    /// `prompt` gives context: its last [`CONTEXT_TOKENS`] ids are decoded but never emitted.
    pub fn new(prompt: &[TokenId], skip_special_tokens: bool) -> Self {
        let ctx = &prompt[prompt.len().saturating_sub(CONTEXT_TOKENS)..];
        IncrementalDetokenizer {
            ids: ctx.to_vec(),
            prefix_offset: 0,
            read_offset: ctx.len(),
            skip_special_tokens,
        }
    }

    /// Adds one token and returns the text it completes (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: TokenId) -> Result<String> {
        self.ids.push(id);
        let skip = self.skip_special_tokens;
        let prefix_text = tok.decode(&self.ids[self.prefix_offset..self.read_offset], skip)?;
        let new_text = tok.decode(&self.ids[self.prefix_offset..], skip)?;
        let pending = self.ids.len() - self.read_offset;
        let give_up = pending >= MAX_PENDING_TOKENS;
        if new_text.ends_with('\u{FFFD}') && !give_up {
            return Ok(String::new());
        }
        if new_text.len() <= prefix_text.len() {
            // Nothing new (a skipped special token, say): keep the window unless it grew long.
            if give_up {
                self.advance();
            }
            return Ok(String::new());
        }
        let delta = match new_text.strip_prefix(prefix_text.as_str()) {
            Some(d) => d.to_owned(),
            // The decoder rewrote earlier text (rare): release what differs from the end of
            // the common prefix, on a character boundary.
            None => {
                let common = common_prefix_len(&prefix_text, &new_text);
                new_text[common..].to_owned()
            }
        };
        self.advance();
        Ok(delta)
    }

    /// Releases whatever is still held (an unfinished character at the very end comes out as
    /// U+FFFD, as a full decode would give it). Call once when the sequence ends.
    pub fn finish(&mut self, tok: &Tokenizer) -> Result<String> {
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        let skip = self.skip_special_tokens;
        let prefix_text = tok.decode(&self.ids[self.prefix_offset..self.read_offset], skip)?;
        let new_text = tok.decode(&self.ids[self.prefix_offset..], skip)?;
        self.advance();
        Ok(match new_text.strip_prefix(prefix_text.as_str()) {
            Some(d) => d.to_owned(),
            None => new_text[common_prefix_len(&prefix_text, &new_text)..].to_owned(),
        })
    }

    /// Moves the window past the released text; keeps only the ids the window needs.
    fn advance(&mut self) {
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        if self.prefix_offset > 1024 {
            self.ids.drain(..self.prefix_offset);
            self.read_offset -= self.prefix_offset;
            self.prefix_offset = 0;
        }
    }
}

fn common_prefix_len(a: &str, b: &str) -> usize {
    let mut n = 0;
    for ((i, ca), cb) in a.char_indices().zip(b.chars()) {
        if ca != cb {
            return i;
        }
        n = i + ca.len_utf8();
    }
    n
}
