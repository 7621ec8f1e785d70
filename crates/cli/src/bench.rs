//! `ferrum bench`: the flags of each benchmark, the model loading, and the printing; the
//! measurements themselves are in the `ferrum-bench` crate (`latency`, `throughput`,
//! `bandwidth`, and the HTTP clients `serve` and `soak`, whose flags live with them).

use crate::common::{load_parts, EngineArgs, ModelArgs};
use crate::parallel::Launch;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use ferrum_bench::{LatencyConfig, ThroughputConfig};
use ferrum_runtime::cuda::Variant;
use ferrum_runtime::ThreadPool;
use serde_json::json;

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Prefill and decode speed of the model itself.
    Latency(Box<LatencyArgs>),
    /// Offline throughput of many requests through the batching engine.
    Throughput(Box<ThroughputArgs>),
    /// Online load on any OpenAI-compatible server (Ferrum, vLLM, llama.cpp) at several
    /// concurrency levels: throughput, TTFT and inter-token latency.
    Serve(ferrum_bench::serve::ServeBenchArgs),
    /// Fault-injecting load on a server: a random request mix, clients that disconnect, and
    /// checks that every response is well-formed and memory and KV blocks come back.
    Soak(ferrum_bench::soak::SoakArgs),
    /// Perplexity of the model on a text (llama.cpp's `llama-perplexity` scoring), and with
    /// --reference-kv-cache-dtype how far this setting's logits and greedy tokens are from the
    /// same model with that KV cache.
    Perplexity(Box<PerplexityArgs>),
    /// This machine's streaming read bandwidth (the bound on decode speed for large models).
    Bandwidth(BandwidthArgs),
    /// What a parallel run's communication costs: all-reduce and stage-to-stage send of
    /// rows x hidden f32 values (under mpirun -n 2 or more; a build with --features mpi).
    Comm(CommArgs),
}

#[derive(Debug, Args)]
pub struct CommArgs {
    /// Widths of a row (a model's hidden size), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "576,896,1536,4096,8192")]
    hidden_sizes: Vec<usize>,
    /// Rows per operation (tokens in a step), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    rows: Vec<usize>,
    /// Measured repetitions of each (the median is reported).
    #[arg(long, default_value_t = 200)]
    num_iters: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The text (UTF-8), tokenized without special tokens.
    #[arg(long)]
    file: std::path::PathBuf,
    /// Tokens per chunk; each chunk's second half is scored.
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Chunks at most (default: every whole chunk of the text).
    #[arg(long)]
    chunks: Option<usize>,
    /// Also run the model with this KV cache type and compare (KL divergence, argmax
    /// agreement, last-position logits, greedy continuations).
    #[arg(long, value_enum)]
    reference_kv_cache_dtype: Option<crate::common::KvCacheDtype>,
    /// Greedy tokens decoded from each compared prompt.
    #[arg(long, default_value_t = 128)]
    greedy_tokens: usize,
    /// Prompts (the first halves of the first chunks) continued greedily by both.
    #[arg(long, default_value_t = 4)]
    greedy_prompts: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
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
    /// Send the same requests this many times, pass after pass; the figures are the last
    /// pass's (with prompts more than the KV cache holds: what the KV tiers bring back).
    #[arg(long, default_value_t = 1)]
    passes: usize,
    #[command(flatten, next_help_heading = "Batching engine")]
    engine: EngineArgs,
    /// Constrain every request (what constrained decoding costs). Requests end early when
    /// their constraint is complete, so pick one that is not (say an unbounded JSON array).
    #[command(flatten, next_help_heading = "Structured output (one of)")]
    structured: crate::structured::StructuredArgs,
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
    /// Sequences decoding together; several (comma-separated) are measured in turn on one
    /// loaded model.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    batch_size: Vec<usize>,
    /// Measured iterations (the median is reported).
    #[arg(long, default_value_t = 3)]
    num_iters: usize,
    /// Unmeasured iterations first.
    #[arg(long, default_value_t = 1)]
    num_iters_warmup: usize,
    /// On a GPU: one more iteration times every decode launch with device events, and the
    /// device time per step (by kernel) is printed beside the step's wall time.
    #[arg(long)]
    profile_kernels: bool,
    /// Print one JSON object per batch size instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn bench(args: &BenchArgs, launch: &Launch) -> Result<()> {
    match &args.command {
        BenchCommand::Latency(a) => latency(a, launch),
        BenchCommand::Throughput(a) => throughput(a, launch),
        BenchCommand::Serve(a) => ferrum_bench::serve::bench_serve(a),
        BenchCommand::Soak(a) => ferrum_bench::soak::soak(a),
        BenchCommand::Perplexity(a) => perplexity(a, launch),
        BenchCommand::Bandwidth(a) => bandwidth(a),
        BenchCommand::Comm(a) => comm(a, launch),
    }
}

fn latency(args: &LatencyArgs, launch: &Launch) -> Result<()> {
    let cfg = |batch_size| LatencyConfig {
        input_len: args.input_len,
        output_len: args.output_len,
        batch_size,
        num_iters: args.num_iters,
        num_iters_warmup: args.num_iters_warmup,
        profile: args.profile_kernels,
    };
    if args.input_len == 0
        || args.output_len < 2
        || args.batch_size.is_empty()
        || args.batch_size.contains(&0)
        || args.num_iters == 0
    {
        // Before loading: the same check the measurement makes, without the wait.
        bail!(
            "--input-len, --batch-size and --num-iters must be at least 1, --output-len at least 2"
        );
    }
    let (mut model, _, load_time) = load_parts(&args.model, launch)?;
    if args.profile_kernels && model.gpu().is_none() {
        bail!("--profile-kernels times GPU launches; this model runs on the CPU");
    }
    let kv_cache_dtype = model.config().kv_cache_dtype.name();
    let device = model.device_name();
    let precision = format!("{:?}", args.model.matmul_precision).to_lowercase();
    if !args.json {
        println!("device: {device}");
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
    }
    for &batch_size in &args.batch_size {
        let r = ferrum_bench::latency(&mut model, &cfg(batch_size))?;
        if args.json {
            println!(
                "{}",
                json!({
                    "model": args.model.model,
                    "device": device,
                    "cuda_graph": !args.model.no_cuda_graph,
                    "input_len": args.input_len,
                    "output_len": args.output_len,
                    "batch_size": batch_size,
                    "threads": args.model.threads,
                    "matmul_precision": precision,
                    "kv_cache_dtype": kv_cache_dtype,
                    "load_s": load_time.as_secs_f64(),
                    "prefill_tok_s": r.prefill_tok_s,
                    "decode_tok_s": r.decode_tok_s,
                    "weight_bytes_per_step": r.weight_bytes_per_step,
                    "kv_bytes_per_token": r.kv_bytes_per_token,
                    "bytes_per_decode_token": r.bytes_per_decode_token,
                    "decode_read_gb_s": r.decode_read_gb_s,
                    "profile": r.profile.as_ref().map(profile_json),
                })
            );
        } else {
            println!(
                "{:<10} {:>8} {:>6} {:>6} {:>6} {:>14.1} {:>14.1} {:>14.2}",
                precision,
                kv_cache_dtype,
                args.input_len,
                args.output_len,
                batch_size,
                r.prefill_tok_s,
                r.decode_tok_s,
                r.decode_read_gb_s
            );
            if let Some(p) = &r.profile {
                print_profile(p);
            }
        }
    }
    Ok(())
}

fn perplexity(args: &PerplexityArgs, launch: &Launch) -> Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading --file {}", args.file.display()))?;
    let (mut model, assets, _) = load_parts(&args.model, launch)?;
    let assets = assets.map_err(|e| anyhow::anyhow!("the model's tokenizer: {e}"))?;
    let tokens = assets.tokenizer.encode(&text, false)?;
    let mut reference = match args.reference_kv_cache_dtype {
        Some(d) => {
            let mut a = args.model.clone();
            a.kv_cache_dtype = d;
            Some(load_parts(&a, launch)?.0)
        }
        None => None,
    };
    let cfg = ferrum_bench::PerplexityConfig {
        ctx: args.ctx,
        max_chunks: args.chunks,
        greedy_tokens: args.greedy_tokens,
        greedy_prompts: args.greedy_prompts,
    };
    let r = ferrum_bench::perplexity(&mut model, reference.as_mut(), &tokens, &cfg)?;
    let kv = model.config().kv_cache_dtype.name();
    let ref_kv = reference.as_ref().map(|m| m.config().kv_cache_dtype.name());
    if args.json {
        #[derive(serde::Serialize)]
        struct Report<'a> {
            model: &'a str,
            file: &'a std::path::Path,
            text_tokens: usize,
            kv_cache_dtype: &'a str,
            reference_kv_cache_dtype: Option<&'a str>,
            #[serde(flatten)]
            result: &'a ferrum_bench::PerplexityResult,
        }
        let report = Report {
            model: &args.model.model,
            file: &args.file,
            text_tokens: tokens.len(),
            kv_cache_dtype: kv,
            reference_kv_cache_dtype: ref_kv,
            result: &r,
        };
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!(
        "{} tokens, {} chunks of {}, {} scored",
        tokens.len(),
        r.chunks,
        r.ctx,
        r.scored_tokens
    );
    println!("perplexity ({kv} cache): {:.4}", r.perplexity);
    if let (Some(c), Some(ref_kv)) = (&r.reference, ref_kv) {
        println!("perplexity ({ref_kv} cache): {:.4}", c.perplexity);
        println!(
            "KL({ref_kv} ‖ {kv}): mean {:.3e}, max {:.3e} nats; argmax agreement {:.2}%; \
             last-position max |Δ logit| / max |logit| {:.3e}",
            c.mean_kl,
            c.max_kl,
            100.0 * c.top1_agreement,
            c.last_logit_err
        );
        for (i, g) in c.greedy.iter().enumerate() {
            println!(
                "greedy {i}: {} tokens after {} of the text: first difference at {}, {} equal",
                g.tokens, g.prompt_tokens, g.first_divergence, g.equal
            );
        }
    }
    Ok(())
}

/// Kernels listed by name in a profile; the rest are summed.
const PROFILE_TOP: usize = 12;

fn profile_json(p: &ferrum_bench::DecodeProfile) -> serde_json::Value {
    let per_step = |ms: f64| ms / p.steps.max(1) as f64;
    json!({
        "steps": p.steps,
        "wall_ms_per_step": per_step(p.wall_s * 1e3),
        "device_ms_per_step": per_step(p.device_s() * 1e3),
        "launches_per_step": launches_per_step(p),
        "kernels": p.kernels.iter().map(|k| json!({
            "name": k.name,
            "variant": k.variant.as_str(),
            "grid": k.grid,
            "launches_per_step": k.launches as f64 / p.steps.max(1) as f64,
            "ms_per_step": per_step(k.total_ms),
        })).collect::<Vec<_>>(),
    })
}

/// Kernel launches (a replayed graph counting once) per profiled step.
fn launches_per_step(p: &ferrum_bench::DecodeProfile) -> f64 {
    p.kernels.iter().map(|k| k.launches).sum::<u64>() as f64 / p.steps.max(1) as f64
}

fn print_profile(p: &ferrum_bench::DecodeProfile) {
    let steps = p.steps.max(1) as f64;
    let (wall, device) = (p.wall_s * 1e3 / steps, p.device_s() * 1e3 / steps);
    println!(
        "  profiled decode step: {wall:.3} ms wall, {device:.3} ms in kernels ({:.1}%), {:.3} ms \
         outside, {:.0} launches",
        100.0 * device / wall.max(1e-9),
        wall - device,
        launches_per_step(p)
    );
    println!(
        "  {:<34} {:>16} {:>10} {:>12} {:>7}",
        "kernel", "grid", "launches", "ms/step", "share"
    );
    for k in p.kernels.iter().take(PROFILE_TOP) {
        // An aligned binary is marked `*`: the generic one ran where it is not.
        let mark = if k.variant == Variant::Aligned {
            "*"
        } else {
            ""
        };
        println!(
            "  {:<34} {:>16} {:>10.1} {:>12.4} {:>6.1}%",
            format!("{}{mark}", k.name),
            format!("{}x{}x{}", k.grid[0], k.grid[1], k.grid[2]),
            k.launches as f64 / steps,
            k.total_ms / steps,
            100.0 * k.total_ms / steps / device.max(1e-9)
        );
    }
    let rest: f64 = p.kernels.iter().skip(PROFILE_TOP).map(|k| k.total_ms).sum();
    if rest > 0.0 {
        println!(
            "  {:<34} {:>16} {:>10} {:>12.4} {:>6.1}%",
            "(others)",
            "",
            "",
            rest / steps,
            100.0 * rest / steps / device.max(1e-9)
        );
    }
    if p.kernels
        .iter()
        .take(PROFILE_TOP)
        .any(|k| k.variant == Variant::Aligned)
    {
        println!("  * the aligned binary (every hinted argument divisible by 16)");
    }
}

fn comm(args: &CommArgs, launch: &Launch) -> Result<()> {
    launch.with_world(&mut |world| {
        let r = ferrum_bench::comm(world, &args.hidden_sizes, &args.rows, args.num_iters)?;
        if world.rank() != 0 {
            return Ok(());
        }
        if args.json {
            println!("{}", json!({ "ranks": world.size(), "results": r }));
        } else {
            println!(
                "{:>11} {:>6} {:>7} {:>10} {:>10} {:>9}",
                "op", "rows", "hidden", "bytes", "median us", "GB/s"
            );
            for c in &r {
                println!(
                    "{:>11} {:>6} {:>7} {:>10} {:>10.2} {:>9.2}",
                    c.op,
                    c.rows,
                    c.hidden,
                    c.bytes,
                    c.median_us,
                    c.bytes as f64 / c.median_us / 1e3
                );
            }
        }
        Ok(())
    })
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
    let r = ferrum_bench::bandwidth(&pool, args.size_mib, args.num_iters)?;
    if args.json {
        println!(
            "{}",
            json!({
                "threads": pool.num_threads(),
                "size_mib": args.size_mib,
                "read_gb_s": r.read_gb_s,
                "read_gb_s_best": r.read_gb_s_best,
                "checksum": r.checksum,
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
            r.read_gb_s,
            r.read_gb_s_best
        );
    }
    Ok(())
}

fn throughput(args: &ThroughputArgs, launch: &Launch) -> Result<()> {
    let cfg = ThroughputConfig {
        num_prompts: args.num_prompts,
        input_len: args.input_len,
        output_len: args.output_len,
        structured: args.structured.constraint()?,
        passes: args.passes,
    };
    if cfg.num_prompts == 0 || cfg.input_len == 0 || cfg.output_len == 0 || cfg.passes == 0 {
        bail!("--num-prompts, --input-len, --output-len and --passes must be at least 1");
    }
    let (model, text, _) = load_parts(&args.model, launch)?;
    let device = model.device_name();
    let engine_cfg = args.engine.config(&args.model, args.num_prompts)?;
    let tokenizer = match &cfg.structured {
        Some(_) => Some(crate::common::need_text(&text)?.tokenizer.clone()),
        None => None,
    };
    let engine = crate::common::start_engine(
        model,
        tokenizer,
        &engine_cfg,
        &args.engine.speculative,
        &args.model,
    )?;
    let r = ferrum_bench::throughput(&engine, &cfg);
    let m = engine.metrics();
    let spec = m.spec;
    engine.shutdown();
    let r = r?;
    let per_mask_us = m.structured_mask_seconds * 1e6 / m.structured_masks.max(1) as f64;
    let wait_share = m.structured_mask_wait_seconds / r.elapsed_s;
    if args.json {
        println!(
            "{}",
            json!({
                "model": args.model.model,
                "device": device,
                "num_prompts": args.num_prompts,
                "input_len": args.input_len,
                "output_len": args.output_len,
                "max_num_seqs": args.engine.max_num_seqs,
                "overlap": !args.model.no_overlap,
                "steps": m.steps,
                "steps_overlapped": m.steps_overlapped,
                "step_ms": 1e3 * m.step_seconds / m.steps.max(1) as f64,
                "host_ms_per_step": 1e3 * (m.step_seconds - m.device_wait_seconds) / m.steps.max(1) as f64,
                "device_wait_share": m.device_wait_seconds / m.step_seconds.max(1e-9),
                "elapsed_s": r.elapsed_s,
                "passes": args.passes,
                "pass_seconds": r.pass_seconds,
                "output_tok_s": r.output_tok_s,
                "total_tok_s": r.total_tok_s,
                "requests_per_s": r.requests_per_s,
                "mean_acceptance_length": spec.mean_acceptance_length(),
                "spec_draft_tokens": spec.num_draft_tokens,
                "spec_accepted_tokens": spec.num_accepted_tokens,
                "structured": cfg.structured.as_ref().map(|s| s.kind()),
                "structured_masks": m.structured_masks,
                "structured_mask_us": per_mask_us,
                "structured_mask_wait_share": wait_share,
                "kv_host": tier_report(&m.kv_host),
                "kv_disk": tier_report(&m.kv_disk),
            })
        );
    } else {
        println!("device: {device}");
        println!(
            "{:>8} {:>6} {:>6} {:>10} {:>14} {:>14} {:>12}",
            "prompts", "input", "output", "elapsed s", "output tok/s", "total tok/s", "requests/s"
        );
        println!(
            "{:>8} {:>6} {:>6} {:>10.2} {:>14.1} {:>14.1} {:>12.2}",
            args.num_prompts,
            args.input_len,
            args.output_len,
            r.elapsed_s,
            r.output_tok_s,
            r.total_tok_s,
            r.requests_per_s
        );
        if r.pass_seconds.len() > 1 {
            let each: Vec<String> = r.pass_seconds.iter().map(|s| format!("{s:.2}")).collect();
            println!(
                "seconds per pass: {} (the figures above are the last pass's)",
                each.join(", ")
            );
        }
        if m.kv_host.enabled {
            let h = &m.kv_host;
            println!(
                "KV host tier: {} blocks brought back ({} MB), {} recomputed, {} MB written, {} held ({} MB), {} evicted, {} copy failures",
                h.hits,
                h.bytes_read / 1_000_000,
                h.misses,
                h.bytes_written / 1_000_000,
                h.blocks,
                h.bytes / 1_000_000,
                h.evictions,
                h.write_failures
            );
        }
        if m.kv_disk.enabled {
            let d = &m.kv_disk;
            println!(
                "KV disk tier: {} blocks read back ({} MB, {:.3} s reading, requests waited {:.3} s), {} recomputed, {} MB written, {} bad files, {} write failures, {} evicted",
                d.hits,
                d.bytes_read / 1_000_000,
                d.read_seconds,
                d.wait_seconds,
                d.misses,
                d.bytes_written / 1_000_000,
                d.bad_files,
                d.write_failures,
                d.evictions
            );
        }
        if let Some(s) = &cfg.structured {
            println!(
                "structured output ({}): {} masks, {per_mask_us:.0} us each; steps waited {:.3} s for masks ({:.1}% of the run)",
                s.kind(),
                m.structured_masks,
                m.structured_mask_wait_seconds,
                wait_share * 100.0
            );
        }
    }
    Ok(())
}

/// A KV tier's counters in `bench throughput`'s JSON report; `None` when the tier is off.
fn tier_report(c: &ferrum_engine::TierCounters) -> Option<serde_json::Value> {
    c.enabled.then(|| {
        json!({
            "hits": c.hits,
            "misses": c.misses,
            "bytes_read": c.bytes_read,
            "bytes_written": c.bytes_written,
            "bad_files": c.bad_files,
            "write_failures": c.write_failures,
            "evictions": c.evictions,
            "read_s": c.read_seconds,
            "wait_s": c.wait_seconds,
        })
    })
}
