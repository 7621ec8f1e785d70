//! Output processing for one sequence: text deltas from the incremental detokenizer, stop
//! strings with hold-back, and the stop conditions, in this order per token:
//!
//! 1. an end-of-sequence id (unless `ignore_eos`) or a request stop id ends the sequence; its
//!    text is not shown, and any held-back text is released;
//! 2. the token's text goes through the stop strings; a match ends the sequence and the text
//!    from the match on is dropped;
//! 3. reaching `max_tokens` or the model's context ends the sequence, releasing held text.
//!
//! Invariant: once a finish reason is returned, later calls are refused.

use crate::{EngineError, Result};
use ferrum_tokenizer::{IncrementalDetokenizer, StopStrings, Tokenizer};
use ferrum_types::{FinishReason, SamplingParams, TokenId};

/// What one token produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenOutput {
    /// Text that became final with this token (possibly empty).
    pub text: String,
    /// Set when the sequence is finished.
    pub finish: Option<FinishReason>,
}

/// Turns a sequence's sampled tokens into text and a finish reason.
#[derive(Debug, Clone)]
pub struct OutputProcessor {
    detok: Option<IncrementalDetokenizer>,
    stops: StopStrings,
    eos_ids: Vec<TokenId>,
    stop_token_ids: Vec<TokenId>,
    limit: usize,
    limit_reason: FinishReason,
    generated: usize,
    finished: bool,
}

impl OutputProcessor {
    /// `eos_ids` are the model's end-of-sequence ids. Without a tokenizer only ids are
    /// produced, and stop strings are refused.
    pub fn new(
        params: &SamplingParams,
        prompt: &[TokenId],
        tokenizer: Option<&Tokenizer>,
        eos_ids: &[TokenId],
        max_model_len: usize,
    ) -> Result<OutputProcessor> {
        if prompt.len() >= max_model_len {
            return Err(EngineError::Request(format!(
                "the prompt has {} tokens, but the model's context is {max_model_len} tokens \
                 (prompt and output must fit)",
                prompt.len()
            )));
        }
        if tokenizer.is_none() && !params.stop.is_empty() {
            return Err(EngineError::Request(
                "stop strings need a tokenizer, and this model has none".into(),
            ));
        }
        let room = max_model_len - prompt.len();
        let (limit, limit_reason) = match params.max_tokens {
            Some(m) if m <= room => (m, FinishReason::MaxTokens),
            _ => (room, FinishReason::MaxModelLen),
        };
        Ok(OutputProcessor {
            detok: tokenizer
                .map(|_| IncrementalDetokenizer::new(prompt, params.skip_special_tokens)),
            stops: StopStrings::new(&params.stop),
            eos_ids: if params.ignore_eos {
                Vec::new()
            } else {
                eos_ids.to_vec()
            },
            stop_token_ids: params.stop_token_ids.clone(),
            limit,
            limit_reason,
            generated: 0,
            finished: false,
        })
    }

    /// Tokens this sequence may still generate at most.
    pub fn remaining(&self) -> usize {
        self.limit - self.generated
    }

    /// Processes one sampled token.
    pub fn push(&mut self, tokenizer: Option<&Tokenizer>, id: TokenId) -> Result<TokenOutput> {
        if self.finished {
            return Err(EngineError::Internal(
                "token pushed after the sequence finished".into(),
            ));
        }
        self.generated += 1;
        let stop_id = if self.eos_ids.contains(&id) {
            Some(FinishReason::Eos(id))
        } else if self.stop_token_ids.contains(&id) {
            Some(FinishReason::StopToken(id))
        } else {
            None
        };
        if let Some(reason) = stop_id {
            let text = self.release(tokenizer)?;
            return Ok(self.finish(text.0, text.1.unwrap_or(reason)));
        }
        let mut text = String::new();
        if let (Some(d), Some(tok)) = (self.detok.as_mut(), tokenizer) {
            let delta = d.push(tok, id)?;
            let check = self.stops.push(&delta);
            text = check.text;
            if let Some(i) = check.matched {
                let s = self.stops.stops()[i].clone();
                return Ok(self.finish(text, FinishReason::StopString(s)));
            }
        }
        if self.generated >= self.limit {
            let (rest, matched) = self.release(tokenizer)?;
            text.push_str(&rest);
            let reason = matched.unwrap_or_else(|| self.limit_reason.clone());
            return Ok(self.finish(text, reason));
        }
        Ok(TokenOutput { text, finish: None })
    }

    /// Ends the sequence early (cancelled): releases held text.
    pub fn abort(&mut self, tokenizer: Option<&Tokenizer>) -> Result<TokenOutput> {
        self.end(tokenizer, FinishReason::Abort)
    }

    /// Ends the sequence for a reason found outside the output (its constraint is complete):
    /// releases held text; a stop string the released text completes is the reason instead.
    pub fn end(
        &mut self,
        tokenizer: Option<&Tokenizer>,
        reason: FinishReason,
    ) -> Result<TokenOutput> {
        if self.finished {
            return Err(EngineError::Internal(
                "a sequence ended after it finished".into(),
            ));
        }
        let (text, matched) = self.release(tokenizer)?;
        let reason = match reason {
            FinishReason::Abort => FinishReason::Abort,
            r => matched.unwrap_or(r),
        };
        Ok(self.finish(text, reason))
    }

    /// Whether a finish reason was returned.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Flushes the detokenizer through the stop strings, then the stop strings' hold-back.
    /// Returns the text and, if the flushed text completed a stop string, that reason.
    fn release(&mut self, tokenizer: Option<&Tokenizer>) -> Result<(String, Option<FinishReason>)> {
        let mut text = String::new();
        if let (Some(d), Some(tok)) = (self.detok.as_mut(), tokenizer) {
            let tail = d.finish(tok)?;
            let check = self.stops.push(&tail);
            text.push_str(&check.text);
            if let Some(i) = check.matched {
                return Ok((
                    text,
                    Some(FinishReason::StopString(self.stops.stops()[i].clone())),
                ));
            }
        }
        text.push_str(&self.stops.finish());
        Ok((text, None))
    }

    fn finish(&mut self, text: String, reason: FinishReason) -> TokenOutput {
        self.finished = true;
        TokenOutput {
            text,
            finish: Some(reason),
        }
    }
}
