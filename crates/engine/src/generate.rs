//! [`Generator`]: one sequence at a time over a model and its own KV cache. The command line
//! uses it for `ferrum run` and `ferrum chat`; the continuous-batching engine will run many
//! sequences per step with the same sampler and output processor.
//!
//! Per call: validate, reuse the longest cached prefix (a chat's earlier turns are not
//! recomputed), prefill the rest in chunks, then decode one token per forward until the
//! output processor reports a finish reason.
//!
//! Invariants: `cached` lists exactly the tokens whose K/V sit in cache slots `0..cached.len()`
//! (block table = identity); the cache never holds more than `max_model_len` tokens.

use crate::output::OutputProcessor;
use crate::sampler::{SampleOutput, Sampler};
use crate::{EngineError, Result};
use ferrum_models::{ForwardBatch, KvCache, Model};
use ferrum_tokenizer::Tokenizer;
use ferrum_types::{FinishReason, SamplingParams, TokenId};
use std::time::{Duration, Instant};

/// Settings of a [`Generator`].
#[derive(Debug, Clone)]
pub struct GeneratorConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Prompt tokens per forward pass during prefill.
    pub prefill_chunk: usize,
    /// Context limit; `None` uses the model's `max_position_embeddings`.
    pub max_model_len: Option<usize>,
}

impl Default for GeneratorConfig {
    fn default() -> Self {
        GeneratorConfig {
            block_size: 16,
            prefill_chunk: 512,
            max_model_len: None,
        }
    }
}

/// One generated token as it is reported to the caller.
#[derive(Debug)]
pub struct TokenEvent<'a> {
    pub token: TokenId,
    /// Text that became final with this token.
    pub text: &'a str,
    pub sample: &'a SampleOutput,
}

/// The result of one generation.
#[derive(Debug, Clone)]
pub struct Generation {
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V were reused from the previous call.
    pub cached_prompt_tokens: usize,
    pub token_ids: Vec<TokenId>,
    pub text: String,
    pub finish: FinishReason,
    /// From the start of the call to the first sampled token.
    pub time_to_first_token: Duration,
    pub elapsed: Duration,
}

impl Generation {
    /// Decode speed after the first token, in tokens per second.
    pub fn decode_tokens_per_s(&self) -> f64 {
        let t = self
            .elapsed
            .saturating_sub(self.time_to_first_token)
            .as_secs_f64();
        let n = self.token_ids.len().saturating_sub(1);
        if t > 0.0 {
            n as f64 / t
        } else {
            0.0
        }
    }
}

/// Runs one sequence at a time on a model.
#[derive(Debug)]
pub struct Generator {
    model: Model,
    cfg: GeneratorConfig,
    max_model_len: usize,
    kv: Option<KvCache>,
    table: Vec<u32>,
    batch: ForwardBatch,
    cached: Vec<TokenId>,
}

impl Generator {
    pub fn new(model: Model, cfg: GeneratorConfig) -> Result<Generator> {
        let model_len = model.config().max_position_embeddings;
        let max_model_len = cfg.max_model_len.unwrap_or(model_len);
        if max_model_len == 0 || max_model_len > model_len {
            return Err(EngineError::Invalid(format!(
                "max model length {max_model_len} must be between 1 and the model's {model_len}"
            )));
        }
        if cfg.block_size == 0 || cfg.prefill_chunk == 0 {
            return Err(EngineError::Invalid(
                "block size and prefill chunk must be at least 1".into(),
            ));
        }
        Ok(Generator {
            model,
            cfg,
            max_model_len,
            kv: None,
            table: Vec::new(),
            batch: ForwardBatch::new(),
            cached: Vec::new(),
        })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// Forgets the cached prefix.
    pub fn reset(&mut self) {
        self.cached.clear();
    }

    /// Makes room for `tokens` tokens; a reallocation drops the cached prefix.
    fn ensure_capacity(&mut self, tokens: usize) -> Result<()> {
        let bs = self.cfg.block_size;
        let have = self.kv.as_ref().map_or(0, |k| k.num_blocks() * bs);
        if have >= tokens {
            return Ok(());
        }
        // Grow geometrically so a chat does not reallocate every turn.
        let want = tokens
            .max(2 * have)
            .max(256)
            .min(self.max_model_len.max(tokens));
        let blocks = want.div_ceil(bs);
        self.kv = None;
        self.kv = Some(KvCache::new(self.model.config(), blocks, bs)?);
        self.table = (0..blocks as u32).collect();
        self.cached.clear();
        Ok(())
    }

    /// Generates a continuation of `prompt`. `on_token` sees every token with its text; it
    /// returns `false` to stop early (the finish reason is then `Abort`). `seed` is used when
    /// `params.seed` is unset.
    pub fn generate(
        &mut self,
        prompt: &[TokenId],
        params: &SamplingParams,
        tokenizer: Option<&Tokenizer>,
        seed: u64,
        mut on_token: impl FnMut(&TokenEvent<'_>) -> bool,
    ) -> Result<Generation> {
        let start = Instant::now();
        let config = self.model.config();
        let vocab = config.vocab_size;
        params.validate(vocab)?;
        if params.n != 1 {
            return Err(EngineError::Invalid(
                "n > 1 needs the batching engine; this path generates one sequence".into(),
            ));
        }
        if prompt.is_empty() {
            return Err(EngineError::Invalid("the prompt is empty".into()));
        }
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::Invalid(format!(
                "prompt token {bad} is outside the vocabulary of {vocab} tokens"
            )));
        }
        let eos: Vec<TokenId> = match tokenizer {
            Some(t) => t.special().stop_token_ids.clone(),
            None => config.eos_token_ids.clone(),
        };
        let mut out = OutputProcessor::new(params, prompt, tokenizer, &eos, self.max_model_len)?;
        let mut sampler = Sampler::new(params, prompt, vocab, seed);
        self.ensure_capacity(prompt.len() + out.remaining())?;

        // Reuse the cached prefix; the last prompt token is always recomputed for its logits.
        let common = self
            .cached
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len() - 1);
        self.cached.truncate(common);
        let bs = self.cfg.block_size;
        let mut pos = common;
        let mut sample = None;
        while pos < prompt.len() {
            let end = (pos + self.cfg.prefill_chunk).min(prompt.len());
            let last = end == prompt.len();
            self.batch.clear();
            self.batch
                .push_seq(&prompt[pos..end], pos, &self.table, bs, last)?;
            let kv = self
                .kv
                .as_mut()
                .ok_or_else(|| EngineError::Invalid("no KV cache".into()))?;
            let logits = self.model.forward(&self.batch, kv)?;
            if last {
                sample = Some(sampler.sample(logits));
            }
            self.cached.extend_from_slice(&prompt[pos..end]);
            pos = end;
        }
        let mut sample =
            sample.ok_or_else(|| EngineError::Invalid("prefill produced no logits".into()))?;
        let ttft = start.elapsed();

        let mut ids = Vec::new();
        let mut text = String::new();
        loop {
            let tok = sample.token;
            ids.push(tok);
            let step = out.push(tokenizer, tok)?;
            text.push_str(&step.text);
            let keep_going = on_token(&TokenEvent {
                token: tok,
                text: &step.text,
                sample: &sample,
            });
            if let Some(finish) = step.finish {
                return Ok(self.done(prompt, common, ids, text, finish, ttft, start));
            }
            if !keep_going {
                let rest = out.abort(tokenizer)?;
                text.push_str(&rest.text);
                return Ok(self.done(prompt, common, ids, text, FinishReason::Abort, ttft, start));
            }
            let cached = self.cached.len();
            self.batch.clear();
            self.batch.push_seq(&[tok], cached, &self.table, bs, true)?;
            let kv = self
                .kv
                .as_mut()
                .ok_or_else(|| EngineError::Invalid("no KV cache".into()))?;
            let logits = self.model.forward(&self.batch, kv)?;
            self.cached.push(tok);
            sample = sampler.sample(logits);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn done(
        &self,
        prompt: &[TokenId],
        reused: usize,
        token_ids: Vec<TokenId>,
        text: String,
        finish: FinishReason,
        ttft: Duration,
        start: Instant,
    ) -> Generation {
        Generation {
            prompt_tokens: prompt.len(),
            cached_prompt_tokens: reused,
            token_ids,
            text,
            finish,
            time_to_first_token: ttft,
            elapsed: start.elapsed(),
        }
    }
}
