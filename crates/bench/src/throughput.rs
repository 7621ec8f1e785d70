//! `bench throughput`: offline serving through the batching engine. `num_prompts` requests of
//! `input_len` prompt tokens (distinct prompts, so no prefix reuse within a pass) each
//! generating exactly `output_len` tokens (`ignore_eos`, greedy) go to the engine at once;
//! output tok/s and requests/s are over the wall time from submission to the last token.
//!
//! With `passes` > 1 the same requests go again, pass after pass (each after the previous one
//! finished): a later pass finds its prompts' blocks in the prefix cache, or, when the prompts
//! are more than the KV cache holds, in the tiers below it (`--kv-offload-memory`,
//! `--kv-disk-dir`) or nowhere. The figures are the last pass's; every pass's time is kept.

use anyhow::{bail, Result};
use ferrum_engine::{EngineHandle, Event, GenerateRequest};
use ferrum_types::{SamplingParams, StructuredOutput, TokenId};
use std::time::Instant;

/// What to run.
#[derive(Debug, Clone)]
pub struct ThroughputConfig {
    pub num_prompts: usize,
    pub input_len: usize,
    pub output_len: usize,
    /// Constrains every request (the engine needs the model's tokenizer then).
    pub structured: Option<StructuredOutput>,
    /// Times the same requests go (at least 1).
    pub passes: usize,
}

/// What it took: the last pass's figures, and each pass's seconds.
#[derive(Debug, Clone)]
pub struct ThroughputResult {
    pub elapsed_s: f64,
    pub output_tok_s: f64,
    pub total_tok_s: f64,
    pub requests_per_s: f64,
    pub pass_seconds: Vec<f64>,
}

/// Runs the requests through `engine`. Flag names in errors are the command line's.
pub fn throughput(engine: &EngineHandle, cfg: &ThroughputConfig) -> Result<ThroughputResult> {
    if cfg.num_prompts == 0 || cfg.input_len == 0 || cfg.output_len == 0 || cfg.passes == 0 {
        bail!("--num-prompts, --input-len, --output-len and --passes must be at least 1");
    }
    if cfg.input_len + cfg.output_len > engine.max_model_len() {
        bail!(
            "--input-len + --output-len = {} is more than the engine's context of {}",
            cfg.input_len + cfg.output_len,
            engine.max_model_len()
        );
    }
    let vocab = engine.vocab_size();
    let params = SamplingParams {
        max_tokens: Some(cfg.output_len),
        ignore_eos: true,
        structured: cfg.structured.clone(),
        ..SamplingParams::greedy()
    };
    if let Some(spec) = &cfg.structured {
        // The first constraint builds the tokenizer's trie: not part of the measurement.
        engine.compile_guide(spec)?;
    }
    let prompts: Vec<Vec<TokenId>> = (0..cfg.num_prompts)
        .map(|r| {
            // Distinct from the first token on, so no request reuses another's prefix.
            (0..cfg.input_len)
                .map(|i| ((r * 104_729 + i * 7919 + 13) % vocab) as TokenId)
                .collect()
        })
        .collect();
    let mut pass_seconds = Vec::with_capacity(cfg.passes);
    let mut generated = 0usize;
    for _ in 0..cfg.passes {
        let start = Instant::now();
        let mut streams = Vec::with_capacity(cfg.num_prompts);
        for prompt in &prompts {
            streams.push(engine.generate(GenerateRequest::new(prompt.clone(), params.clone()))?);
        }
        generated = 0;
        for mut s in streams {
            while let Some(ev) = s.blocking_next() {
                match ev {
                    Event::Done { usage } => generated += usage.completion_tokens,
                    Event::Error(e) => bail!("the engine failed: {e}"),
                    _ => {}
                }
            }
        }
        pass_seconds.push(start.elapsed().as_secs_f64());
    }
    let secs = pass_seconds.last().copied().unwrap_or(f64::NAN);
    Ok(ThroughputResult {
        elapsed_s: secs,
        output_tok_s: generated as f64 / secs,
        total_tok_s: (cfg.num_prompts * cfg.input_len + generated) as f64 / secs,
        requests_per_s: cfg.num_prompts as f64 / secs,
        pass_seconds,
    })
}
