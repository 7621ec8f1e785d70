//! `ferrum run`: greedy generation from token ids (text prompts and sampling come with the
//! tokenizer and sampler).

use anyhow::{bail, Context, Result};
use clap::Args;
use ferrum_models::{load_model, ForwardBatch, KvCache, LoadOptions};
use ferrum_types::TokenId;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

const BLOCK_SIZE: usize = 16;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Model folder (config.json + safetensors) or .gguf file.
    #[arg(long)]
    model: PathBuf,
    /// Prompt as comma-separated token ids, e.g. 1,2,3.
    #[arg(long, value_delimiter = ',', required = true)]
    prompt_ids: Vec<TokenId>,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 16)]
    max_tokens: usize,
    /// Sampling temperature; only 0 (greedy) is available in this version.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Compute threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Print {"token_ids": [...]} instead of plain ids.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &RunArgs) -> Result<()> {
    if args.temperature != 0.0 {
        bail!(
            "--temperature {} is not available yet: this version generates greedily (--temperature 0)",
            args.temperature
        );
    }
    if args.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    let start = Instant::now();
    let mut model = load_model(
        &args.model,
        &LoadOptions {
            num_threads: args.threads,
        },
    )
    .with_context(|| format!("loading {}", args.model.display()))?;
    let config = model.config().clone();
    if let Some(&bad) = args
        .prompt_ids
        .iter()
        .find(|&&t| t as usize >= config.vocab_size)
    {
        bail!(
            "--prompt-ids: token {bad} is outside the vocabulary of {} tokens",
            config.vocab_size
        );
    }
    let prompt_len = args.prompt_ids.len();
    if prompt_len >= config.max_position_embeddings {
        bail!(
            "the prompt has {prompt_len} tokens; the model's context is {}",
            config.max_position_embeddings
        );
    }
    let max_tokens = args
        .max_tokens
        .min(config.max_position_embeddings - prompt_len);
    let total = prompt_len + max_tokens;
    let mut kv = KvCache::new(&config, total.div_ceil(BLOCK_SIZE), BLOCK_SIZE)?;
    let table: Vec<u32> = (0..kv.num_blocks() as u32).collect();
    let load_time = start.elapsed();

    let mut batch = ForwardBatch::new();
    batch.push_seq(&args.prompt_ids, 0, &table, BLOCK_SIZE, true)?;
    let mut generated: Vec<TokenId> = Vec::with_capacity(max_tokens);
    let mut finish = "length";
    let gen_start = Instant::now();
    let mut first_token = None;
    loop {
        let logits = model.forward(&batch, &mut kv)?;
        let next = argmax(logits);
        first_token.get_or_insert_with(|| gen_start.elapsed());
        generated.push(next);
        if !args.ignore_eos && config.eos_token_ids.contains(&next) {
            finish = "stop";
            break;
        }
        if generated.len() == max_tokens {
            break;
        }
        batch.clear();
        let cached = prompt_len + generated.len() - 1;
        batch.push_seq(&[next], cached, &table, BLOCK_SIZE, true)?;
    }
    let gen_time = gen_start.elapsed();

    let mut out = std::io::stdout().lock();
    if args.json {
        let v = serde_json::json!({ "token_ids": generated, "finish_reason": finish });
        writeln!(out, "{v}")?;
    } else {
        let ids: Vec<String> = generated.iter().map(ToString::to_string).collect();
        writeln!(out, "{}", ids.join(","))?;
    }
    let decode_tokens = generated.len().saturating_sub(1);
    let ttft = first_token.unwrap_or_default();
    let decode_time = gen_time.saturating_sub(ttft).as_secs_f64();
    eprintln!(
        "load {:.2}s, prompt {prompt_len} tokens, first token {:.1} ms, {} tokens at {:.1} tok/s",
        load_time.as_secs_f64(),
        ttft.as_secs_f64() * 1e3,
        generated.len(),
        if decode_time > 0.0 {
            decode_tokens as f64 / decode_time
        } else {
            0.0
        },
    );
    Ok(())
}

fn argmax(row: &[f32]) -> TokenId {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as TokenId
}
