//! Sampling parameters of one request, with the ranges vLLM and OpenAI accept.
//!
//! Invariant after [`SamplingParams::validate`]: every float is finite and in range, every
//! token id is inside the vocabulary, and `temperature == 0` means greedy.

use crate::{Result, StructuredOutput, TokenId, TypesError};

/// Most top logprobs a request may ask for (OpenAI's limit).
pub const MAX_LOGPROBS: usize = 20;

/// How to pick tokens and when to stop.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Completions to generate for the prompt.
    pub n: usize,
    /// Tokens to generate at most; `None` runs to the end of the model's context.
    pub max_tokens: Option<usize>,
    /// 0 is greedy; otherwise logits are divided by it.
    pub temperature: f32,
    /// Nucleus sampling: the smallest set of top tokens whose probability reaches `top_p`.
    pub top_p: f32,
    /// Keep the `k` most likely tokens.
    pub top_k: Option<usize>,
    /// Drop tokens less likely than `min_p` times the most likely one.
    pub min_p: f32,
    /// vLLM's definition: logits of tokens seen in the prompt or output are divided by it when
    /// positive, multiplied when negative.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token that appeared in the output.
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the output.
    pub frequency_penalty: f32,
    /// Added to the logits of the given tokens.
    pub logit_bias: Vec<(TokenId, f32)>,
    /// Seeds the request's own random generator: same seed, same output.
    pub seed: Option<u64>,
    /// Strings that end generation; not included in the output.
    pub stop: Vec<String>,
    /// Token ids that end generation, besides the model's end-of-sequence ids.
    pub stop_token_ids: Vec<TokenId>,
    /// Keep going past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Return the sampled token's logprob and this many top alternatives.
    pub logprobs: Option<usize>,
    /// Leave special tokens out of the text.
    pub skip_special_tokens: bool,
    /// Constrains the output to a schema, regex, choice or grammar.
    pub structured: Option<StructuredOutput>,
}

impl Default for SamplingParams {
    /// OpenAI's defaults: temperature 1, no truncation, no penalties.
    fn default() -> Self {
        SamplingParams {
            n: 1,
            max_tokens: None,
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            skip_special_tokens: true,
            structured: None,
        }
    }
}

impl SamplingParams {
    /// Greedy: the most likely token (after penalties and bias) every step.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Checks every field against its range and token ids against `vocab_size`.
    pub fn validate(&self, vocab_size: usize) -> Result<()> {
        fn bad(param: &'static str, msg: impl Into<String>) -> Result<()> {
            Err(TypesError::InvalidParam {
                param,
                msg: msg.into(),
            })
        }
        let floats = [
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("repetition_penalty", self.repetition_penalty),
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ];
        for (name, v) in floats {
            if !v.is_finite() {
                return bad(name, format!("{v} is not a finite number"));
            }
        }
        if self.n == 0 {
            return bad("n", "must be at least 1");
        }
        if self.max_tokens == Some(0) {
            return bad("max_tokens", "must be at least 1");
        }
        if !(0.0..=100.0).contains(&self.temperature) {
            return bad(
                "temperature",
                format!("{} is outside [0, 100]", self.temperature),
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", format!("{} is outside (0, 1]", self.top_p));
        }
        if self.top_k == Some(0) {
            return bad("top_k", "must be at least 1 (leave it unset to disable)");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", format!("{} is outside [0, 1]", self.min_p));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty <= 2.0) {
            return bad(
                "repetition_penalty",
                format!("{} is outside (0, 2]", self.repetition_penalty),
            );
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(name, format!("{v} is outside [-2, 2]"));
            }
        }
        for &(id, b) in &self.logit_bias {
            if id as usize >= vocab_size {
                return bad(
                    "logit_bias",
                    format!("token {id} is outside the vocabulary of {vocab_size} tokens"),
                );
            }
            if !(-100.0..=100.0).contains(&b) {
                return bad(
                    "logit_bias",
                    format!("bias {b} for token {id} is outside [-100, 100]"),
                );
            }
        }
        if let Some(&id) = self
            .stop_token_ids
            .iter()
            .find(|&&id| id as usize >= vocab_size)
        {
            return bad(
                "stop_token_ids",
                format!("token {id} is outside the vocabulary of {vocab_size} tokens"),
            );
        }
        if self.stop.iter().any(String::is_empty) {
            return bad("stop", "stop strings must not be empty");
        }
        match &self.structured {
            Some(StructuredOutput::Choice(c)) if c.is_empty() => {
                return bad("structured", "a choice needs at least one string");
            }
            Some(StructuredOutput::Choice(c)) if c.iter().any(String::is_empty) => {
                return bad("structured", "the strings of a choice must not be empty");
            }
            _ => {}
        }
        if let Some(k) = self.logprobs.filter(|&k| k > MAX_LOGPROBS) {
            return bad(
                "logprobs",
                format!("{k} is more than the limit of {MAX_LOGPROBS}"),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_ranges_are_enforced() {
        assert!(SamplingParams::default().validate(10).is_ok());
        assert!(SamplingParams::greedy().is_greedy());
        let cases: Vec<(SamplingParams, &str)> = vec![
            (
                SamplingParams {
                    temperature: -0.5,
                    ..Default::default()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    temperature: f32::NAN,
                    ..Default::default()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    top_p: 0.0,
                    ..Default::default()
                },
                "top_p",
            ),
            (
                SamplingParams {
                    top_k: Some(0),
                    ..Default::default()
                },
                "top_k",
            ),
            (
                SamplingParams {
                    min_p: 1.5,
                    ..Default::default()
                },
                "min_p",
            ),
            (
                SamplingParams {
                    repetition_penalty: 0.0,
                    ..Default::default()
                },
                "repetition_penalty",
            ),
            (
                SamplingParams {
                    presence_penalty: 3.0,
                    ..Default::default()
                },
                "presence_penalty",
            ),
            (
                SamplingParams {
                    logit_bias: vec![(10, 1.0)],
                    ..Default::default()
                },
                "logit_bias",
            ),
            (
                SamplingParams {
                    stop_token_ids: vec![99],
                    ..Default::default()
                },
                "stop_token_ids",
            ),
            (
                SamplingParams {
                    logprobs: Some(21),
                    ..Default::default()
                },
                "logprobs",
            ),
            (
                SamplingParams {
                    n: 0,
                    ..Default::default()
                },
                "n",
            ),
            (
                SamplingParams {
                    max_tokens: Some(0),
                    ..Default::default()
                },
                "max_tokens",
            ),
            (
                SamplingParams {
                    stop: vec![String::new()],
                    ..Default::default()
                },
                "stop",
            ),
        ];
        for (p, name) in cases {
            let err = p.validate(10).unwrap_err().to_string();
            assert!(err.contains(&format!("`{name}`")), "{err}");
        }
    }
}
