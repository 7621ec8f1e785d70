//! `ferrum bench`: `latency`, the model's raw speed without scheduling or sampling in the way,
//! and `throughput`, offline serving through the batching engine.
//!
//! Latency: each iteration prefills `--batch-size` prompts of `--input-len` tokens (one forward pass
//! per prompt, as a single long request runs), then decodes `--output-len` steps in which all
//! the sequences advance together in one batch (greedy argmax). Prefill and decode tok/s are
//! the medians over `--num-iters` iterations after `--num-iters-warmup` unmeasured ones.
//!
//! Throughput: `--num-prompts` requests of `--input-len` prompt tokens (distinct prompts, so
//! no prefix reuse) each generating exactly `--output-len` tokens (`ignore_eos`, greedy) go to
//! the engine at once; output tok/s and requests/s are over the wall time from submission to
//! the last token.
//!
//! Serve: an HTTP client measuring a running server; see [`crate::bench_serve`]. Soak: a
//! fault-injecting load that checks a server's responses and recovery; see [`crate::bench_soak`].
//!
//! Bandwidth: this machine's streaming read bandwidth with `--threads` threads, over a buffer
//! far larger than the caches: the bound on decode speed for a model larger than the cache.
//! Latency reports the bytes a decode token reads (weights as the kernels hold them, plus the
//! KV cache at the decode's mean context), so a decode figure can be stated as a share of it.

use crate::common::{load_parts, EngineArgs, ModelArgs};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use ferrum_engine::sampler::argmax;
use ferrum_engine::{EngineHandle, Event, GenerateRequest};
use ferrum_models::{KvCache, Model};
use ferrum_runtime::cpu::stream;
use ferrum_runtime::ThreadPool;
use ferrum_types::{ForwardBatch, SamplingParams, TokenId};
use serde_json::json;
use std::time::Instant;

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Prefill and decode speed of the model itself.
    Latency(LatencyArgs),
    /// Offline throughput of many requests through the batching engine.
    Throughput(ThroughputArgs),
    /// Online load on any OpenAI-compatible server (Ferrum, vLLM, llama.cpp) at several
    /// concurrency levels: throughput, TTFT and inter-token latency.
    Serve(crate::bench_serve::ServeBenchArgs),
    /// Fault-injecting load on a server: a random request mix, clients that disconnect, and
    /// checks that every response is well-formed and memory and KV blocks come back.
    Soak(crate::bench_soak::SoakArgs),
    /// This machine's streaming read bandwidth (the bound on decode speed for large models).
    Bandwidth(BandwidthArgs),
}

#[derive(Debug, Args)]
pub struct BandwidthArgs {
    /// Reading threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Size of the buffer read, in MiB (far larger than the caches).
    #[arg(long, default_value_t = 1024)]
    size_mib: usize,
    /// Measured passes over the buffer (the median is reported).
    #[arg(long, default_value_t = 7)]
    num_iters: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct ThroughputArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Requests, all submitted at once.
    #[arg(long, default_value_t = 64)]
    num_prompts: usize,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 128)]
    input_len: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 128)]
    output_len: usize,
    #[command(flatten, next_help_heading = "Batching engine")]
    engine: EngineArgs,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct LatencyArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt tokens per sequence.
    #[arg(long, default_value_t = 512)]
    input_len: usize,
    /// Tokens decoded per sequence.
    #[arg(long, default_value_t = 128)]
    output_len: usize,
    /// Sequences decoding together.
    #[arg(long, default_value_t = 1)]
    batch_size: usize,
    /// Measured iterations (the median is reported).
    #[arg(long, default_value_t = 3)]
    num_iters: usize,
    /// Unmeasured iterations first.
    #[arg(long, default_value_t = 1)]
    num_iters_warmup: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn bench(args: &BenchArgs) -> Result<()> {
    match &args.command {
        BenchCommand::Latency(a) => latency(a),
        BenchCommand::Throughput(a) => throughput(a),
        BenchCommand::Serve(a) => crate::bench_serve::bench_serve(a),
        BenchCommand::Soak(a) => crate::bench_soak::soak(a),
        BenchCommand::Bandwidth(a) => bandwidth(a),
    }
}

const BLOCK_SIZE: usize = 16;

/// One iteration: (prefill seconds, decode seconds).
fn iteration(model: &mut Model, kv: &mut KvCache, args: &LatencyArgs) -> Result<(f64, f64)> {
    let c = model.config().clone();
    let per_seq = (args.input_len + args.output_len).div_ceil(BLOCK_SIZE);
    let tables: Vec<Vec<u32>> = (0..args.batch_size)
        .map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect())
        .collect();
    // A fixed, varied prompt: the speed does not depend on which tokens they are.
    let prompt: Vec<TokenId> = (0..args.input_len)
        .map(|i| ((i * 7919 + 13) % c.vocab_size) as TokenId)
        .collect();
    let mut b = ForwardBatch::new();
    let mut next = vec![0 as TokenId; args.batch_size];
    let t = Instant::now();
    for (s, table) in tables.iter().enumerate() {
        b.clear();
        b.push_seq(&prompt, 0, table, BLOCK_SIZE, 1)?;
        next[s] = argmax(model.forward(&b, kv)?);
    }
    let prefill = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for step in 0..args.output_len.saturating_sub(1) {
        b.clear();
        for (s, table) in tables.iter().enumerate() {
            b.push_seq(&[next[s]], args.input_len + step, table, BLOCK_SIZE, 1)?;
        }
        let logits = model.forward(&b, kv)?;
        for (s, row) in logits.chunks_exact(c.vocab_size).enumerate() {
            next[s] = argmax(row);
        }
    }
    Ok((prefill, t.elapsed().as_secs_f64()))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn latency(args: &LatencyArgs) -> Result<()> {
    if args.input_len == 0 || args.output_len < 2 || args.batch_size == 0 || args.num_iters == 0 {
        bail!(
            "--input-len, --batch-size and --num-iters must be at least 1, --output-len at least 2"
        );
    }
    let (mut model, _, load_time) = load_parts(&args.model)?;
    let c = model.config().clone();
    let len = args.input_len + args.output_len;
    if len > c.max_position_embeddings {
        bail!(
            "--input-len + --output-len = {len} is more than the model's context of {}",
            c.max_position_embeddings
        );
    }
    let num_blocks = args.batch_size * len.div_ceil(BLOCK_SIZE);
    let mut kv = KvCache::new(&c, num_blocks, BLOCK_SIZE).context("allocating the KV cache")?;
    let (mut prefills, mut decodes) = (Vec::new(), Vec::new());
    for i in 0..args.num_iters_warmup + args.num_iters {
        let (p, d) = iteration(&mut model, &mut kv, args)?;
        if i >= args.num_iters_warmup {
            prefills.push((args.batch_size * args.input_len) as f64 / p);
            decodes.push((args.batch_size * (args.output_len - 1)) as f64 / d);
        }
    }
    let (prefill, decode) = (median(prefills), median(decodes));
    // What a decode token reads: the weights once per step for the whole batch, and its own
    // sequence's K/V at the decode's mean context.
    let weight_bytes = model.weight_bytes_per_token();
    let kv_per_pos = KvCache::bytes_per_block(&c, BLOCK_SIZE) / BLOCK_SIZE;
    let kv_bytes = kv_per_pos as f64 * (args.input_len as f64 + args.output_len as f64 / 2.0);
    let bytes_per_token = weight_bytes as f64 / args.batch_size as f64 + kv_bytes;
    let decode_read_gb_s = decode * bytes_per_token / 1e9;
    if args.json {
        println!(
            "{}",
            json!({
                "model": args.model.model,
                "input_len": args.input_len,
                "output_len": args.output_len,
                "batch_size": args.batch_size,
                "threads": args.model.threads,
                "matmul_precision": format!("{:?}", args.model.matmul_precision).to_lowercase(),
                "kv_cache_dtype": c.kv_cache_dtype.name(),
                "load_s": load_time.as_secs_f64(),
                "prefill_tok_s": prefill,
                "decode_tok_s": decode,
                "weight_bytes_per_step": weight_bytes,
                "bytes_per_decode_token": bytes_per_token,
                "decode_read_gb_s": decode_read_gb_s,
            })
        );
    } else {
        println!(
            "{:<10} {:>8} {:>6} {:>6} {:>6} {:>14} {:>14} {:>14}",
            "precision",
            "kv cache",
            "input",
            "output",
            "batch",
            "prefill tok/s",
            "decode tok/s",
            "decode GB/s"
        );
        println!(
            "{:<10} {:>8} {:>6} {:>6} {:>6} {:>14.1} {:>14.1} {:>14.2}",
            format!("{:?}", args.model.matmul_precision).to_lowercase(),
            c.kv_cache_dtype.name(),
            args.input_len,
            args.output_len,
            args.batch_size,
            prefill,
            decode,
            decode_read_gb_s
        );
    }
    Ok(())
}

fn bandwidth(args: &BandwidthArgs) -> Result<()> {
    if args.size_mib == 0 || args.num_iters == 0 {
        bail!("--size-mib and --num-iters must be at least 1");
    }
    let pool = match args.threads {
        Some(0) => bail!("--threads must be at least 1"),
        Some(n) => ThreadPool::new(n),
        None => ThreadPool::with_available_parallelism(),
    }
    .context("starting the compute threads")?;
    // At most 64 GiB: a figure about memory, not a way to exhaust it.
    if args.size_mib > 64 << 10 {
        bail!("--size-mib is at most 65536");
    }
    let data = stream::StreamBuffer::new(args.size_mib << 20);
    let bytes = data.num_bytes() as f64;
    let mut rates = Vec::with_capacity(args.num_iters);
    let mut check = 0u64;
    for i in 0..args.num_iters + 1 {
        let t = Instant::now();
        check = check.wrapping_add(data.read(&pool));
        let secs = t.elapsed().as_secs_f64();
        if i > 0 {
            rates.push(bytes / secs / 1e9);
        }
    }
    let best = rates.iter().copied().fold(0f64, f64::max);
    let med = median(rates);
    if args.json {
        println!(
            "{}",
            json!({
                "threads": pool.num_threads(),
                "size_mib": args.size_mib,
                "read_gb_s": med,
                "read_gb_s_best": best,
                "checksum": check,
            })
        );
    } else {
        println!(
            "{:>8} {:>10} {:>14} {:>14}",
            "threads", "MiB", "read GB/s", "best GB/s"
        );
        println!(
            "{:>8} {:>10} {:>14.2} {:>14.2}",
            pool.num_threads(),
            args.size_mib,
            med,
            best
        );
    }
    Ok(())
}

fn throughput(args: &ThroughputArgs) -> Result<()> {
    if args.num_prompts == 0 || args.input_len == 0 || args.output_len == 0 {
        bail!("--num-prompts, --input-len and --output-len must be at least 1");
    }
    let (model, _, _) = load_parts(&args.model)?;
    let vocab = model.config().vocab_size;
    let cfg = args
        .engine
        .config(args.model.max_model_len, args.num_prompts)?;
    let engine = EngineHandle::start(model, None, &cfg)?;
    if args.input_len + args.output_len > engine.max_model_len() {
        bail!(
            "--input-len + --output-len = {} is more than the engine's context of {}",
            args.input_len + args.output_len,
            engine.max_model_len()
        );
    }
    let params = SamplingParams {
        max_tokens: Some(args.output_len),
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    let start = Instant::now();
    let mut streams = Vec::with_capacity(args.num_prompts);
    for r in 0..args.num_prompts {
        // Distinct from the first token on, so no request reuses another's prefix.
        let prompt: Vec<TokenId> = (0..args.input_len)
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
    engine.shutdown();
    let (out_tok_s, req_s) = (generated as f64 / secs, args.num_prompts as f64 / secs);
    let total_tok_s = (args.num_prompts * args.input_len + generated) as f64 / secs;
    if args.json {
        println!(
            "{}",
            json!({
                "model": args.model.model,
                "num_prompts": args.num_prompts,
                "input_len": args.input_len,
                "output_len": args.output_len,
                "max_num_seqs": args.engine.max_num_seqs,
                "elapsed_s": secs,
                "output_tok_s": out_tok_s,
                "total_tok_s": total_tok_s,
                "requests_per_s": req_s,
            })
        );
    } else {
        println!(
            "{:>8} {:>6} {:>6} {:>10} {:>14} {:>14} {:>12}",
            "prompts", "input", "output", "elapsed s", "output tok/s", "total tok/s", "requests/s"
        );
        println!(
            "{:>8} {:>6} {:>6} {:>10.2} {:>14.1} {:>14.1} {:>12.2}",
            args.num_prompts, args.input_len, args.output_len, secs, out_tok_s, total_tok_s, req_s
        );
    }
    Ok(())
}
