//! `bench throughput`: offline serving through the batching engine. `num_prompts` requests of
//! `input_len` prompt tokens (distinct prompts, so no prefix reuse) each generating exactly
//! `output_len` tokens (`ignore_eos`, greedy) go to the engine at once; output tok/s and
//! requests/s are over the wall time from submission to the last token.

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
}

/// What it took.
#[derive(Debug, Clone, Copy)]
pub struct ThroughputResult {
    pub elapsed_s: f64,
    pub output_tok_s: f64,
    pub total_tok_s: f64,
    pub requests_per_s: f64,
}

/// Runs the requests through `engine`. Flag names in errors are the command line's.
pub fn throughput(engine: &EngineHandle, cfg: &ThroughputConfig) -> Result<ThroughputResult> {
    if cfg.num_prompts == 0 || cfg.input_len == 0 || cfg.output_len == 0 {
        bail!("--num-prompts, --input-len and --output-len must be at least 1");
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
    let start = Instant::now();
    let mut streams = Vec::with_capacity(cfg.num_prompts);
    for r in 0..cfg.num_prompts {
        // Distinct from the first token on, so no request reuses another's prefix.
        let prompt: Vec<TokenId> = (0..cfg.input_len)
            .map(|i| ((r * 104_729 + i * 7919 + 13) % vocab) as TokenId)
            .collect();
        streams.push(engine.generate(GenerateRequest::new(prompt, params.clone()))?);
    }
    let mut generated = 0usize;
    for mut s in streams {
        while let Some(ev) = s.blocking_next() {
            match ev {
                Event::Done { usage } => generated += usage.completion_tokens,
                Event::Error(e) => bail!("the engine failed: {e}"),
                _ => {}
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(ThroughputResult {
        elapsed_s: secs,
        output_tok_s: generated as f64 / secs,
        total_tok_s: (cfg.num_prompts * cfg.input_len + generated) as f64 / secs,
        requests_per_s: cfg.num_prompts as f64 / secs,
    })
}
