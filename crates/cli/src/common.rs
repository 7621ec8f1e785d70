//! Flags and loading shared by the commands that generate: the model, its text assets, the
//! engine for one request at a time, and the sampling flags.

use crate::model_path;
use crate::parallel::Launch;
use anyhow::{bail, Context, Result};
use clap::Args;
use ferrum_engine::{
    EngineConfig, EngineHandle, KvCacheSize, KvDiskConfig, NgramProposer, Proposer,
    SchedulingPolicy, SpeculativeConfig,
};
use ferrum_models::parallel::Layout;
use ferrum_models::{
    load_model, load_model_on, load_text_assets_with, CudaGraphs, GemmChoice, LoadOptions, Model,
};
use ferrum_models::{ModelError, Result as ModelResult};
use ferrum_runtime::cpu::{KvDtype, MatmulPrecision};
use ferrum_runtime::cuda::Gpu;
use ferrum_runtime::Device;
use ferrum_tokenizer::{TemplateMode, TextAssets, Tokenizer};
use ferrum_types::{SamplingParams, TypesError};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where the model is and how to run it.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// Model folder (config.json + safetensors + tokenizer.json), .gguf file, or Hugging Face
    /// id (org/name, or org/name:file.gguf).
    #[arg(long)]
    pub model: String,
    /// Compute threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Context limit in tokens (default: the model's).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Activations in products with block-quantized weights: int8 (fast, llama.cpp's
    /// arithmetic) or float (f32, the reference path).
    #[arg(long, value_enum, default_value_t = Precision::Int8)]
    pub matmul_precision: Precision,
    /// Element type of the KV cache. auto: f32 with --matmul-precision float; otherwise the
    /// checkpoint's half type (f16 for GGUF, as llama.cpp; bf16/f16 for a folder saved in it,
    /// as vLLM), f32 for an f32 folder. Half types halve the cache's memory and attention's
    /// reads; int8 (CPU models) and fp8 (e4m3, GPU models) halve them again, with a scale per
    /// token and KV head.
    #[arg(long, value_enum, default_value_t = KvCacheDtype::Auto)]
    pub kv_cache_dtype: KvCacheDtype,
    /// Compile and render the chat template in this process instead of a memory-capped worker
    /// process (saves about 0.1 ms a request; a hostile template can then exhaust memory).
    #[arg(long)]
    pub no_template_sandbox: bool,
    /// Where the model runs: auto (CUDA device 0 when a GPU and driver are usable and the
    /// model's weight types run there, else the CPU), cpu, cuda, cuda:N, or interpreted (the
    /// CUDA backend's kernels in the Triton interpreter on the host: for tests; slow).
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    pub device: DeviceArg,
    /// On a GPU, launch every decode step's kernels one by one instead of replaying the step
    /// as a CUDA graph captured per batch-size bucket (1, 2, 4, 8, 16, 24, 32, 48, 64, 96,
    /// 128, 160, 192, 224, 256).
    #[arg(long)]
    pub no_cuda_graph: bool,
    /// On a GPU, finish each step (its tokens back on the host) before scheduling the next,
    /// instead of scheduling and enqueueing it while the previous one runs.
    #[arg(long)]
    pub no_overlap: bool,
    /// On a GPU, the kernels of a folder `kernels/build.py --only NAMES --out DIR` wrote (a
    /// tuning sweep's candidate) in place of the embedded ones of the same names.
    #[arg(long, value_name = "DIR")]
    pub kernels: Option<std::path::PathBuf>,
    /// On a GPU, what float products of more than 16 rows (prefill chunks, batched decode,
    /// the LM head at batch) run on: auto (cuBLASLt when it opens, for bf16/f16 weights and
    /// the shapes it takes; the Triton kernels otherwise), cublaslt (an error when it does not
    /// open), triton. The line at start says which.
    #[arg(long, value_enum, default_value_t = GemmArg::Auto)]
    pub gemm: GemmArg,
    /// The cuBLASLt library to open (a file, or a folder holding libcublasLt.so.13 or .12)
    /// instead of looking on the library path and in the PyPI nvidia-cublas wheels' folders.
    #[arg(long, value_name = "PATH")]
    pub cublaslt: Option<std::path::PathBuf>,
    /// Ranks that split every layer (by attention heads and MLP rows), inside one node. A
    /// parallel run is launched with `mpirun -n T*P` and needs a build with `--features mpi`.
    #[arg(long, default_value_t = 1, help_heading = "Parallelism (under mpirun)")]
    pub tensor_parallel_size: usize,
    /// Stages that each run a contiguous range of layers.
    #[arg(long, default_value_t = 1, help_heading = "Parallelism (under mpirun)")]
    pub pipeline_parallel_size: usize,
    /// Layers per stage, comma-separated (e.g. 10,14); default: as even as possible.
    #[arg(
        long,
        value_delimiter = ',',
        help_heading = "Parallelism (under mpirun)"
    )]
    pub pipeline_layer_split: Option<Vec<usize>>,
    /// Micro-batches a step is split into across the stages (default: one per stage).
    #[arg(long, help_heading = "Parallelism (under mpirun)")]
    pub pipeline_micro_batches: Option<usize>,
}

/// `--no-cuda-graph` as the loader's option.
fn cuda_graphs(args: &ModelArgs) -> CudaGraphs {
    if args.no_cuda_graph {
        CudaGraphs::Off
    } else {
        CudaGraphs::On
    }
}

impl ModelArgs {
    /// The parallel layout the flags ask for.
    pub fn layout(&self) -> Result<Layout> {
        let (t, p) = (self.tensor_parallel_size, self.pipeline_parallel_size);
        if t == 0 || p == 0 {
            bail!("--tensor-parallel-size and --pipeline-parallel-size must be at least 1");
        }
        if self.pipeline_layer_split.is_some() && p == 1 {
            bail!("--pipeline-layer-split goes with --pipeline-parallel-size 2 or more");
        }
        let micro_batches = match self.pipeline_micro_batches {
            Some(0) => bail!("--pipeline-micro-batches must be at least 1"),
            Some(m) => m,
            None => p,
        };
        Ok(Layout {
            tensor_parallel: t,
            pipeline_parallel: p,
            layer_split: self.pipeline_layer_split.clone(),
            micro_batches,
        })
    }
}

/// `--device` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceArg {
    Auto,
    Fixed(Device),
}

fn parse_device(s: &str) -> std::result::Result<DeviceArg, String> {
    match s {
        "auto" => Ok(DeviceArg::Auto),
        _ => s
            .parse()
            .map(DeviceArg::Fixed)
            .map_err(|e: String| e.replace("expected cpu", "expected auto, cpu")),
    }
}

/// Loads `path` on the device `--device` names. `auto` tries CUDA device 0 and falls back to
/// the CPU, saying why on stderr, when no GPU is usable or the model needs something the GPU
/// path does not run yet.
fn load_on_device(
    path: &std::path::Path,
    args: &ModelArgs,
    opts: &LoadOptions,
) -> ModelResult<Model> {
    match args.device {
        DeviceArg::Fixed(device) => load_model_on(path, opts, device),
        DeviceArg::Auto => match Gpu::cuda(0) {
            Err(e) => {
                if !e.to_string().contains("libcuda.so was not found") {
                    eprintln!("ferrum: no usable GPU ({e}); running on the CPU");
                }
                load_model(path, opts)
            }
            Ok(gpu) => {
                drop(gpu);
                let gpu_opts = LoadOptions {
                    num_threads: None,
                    ..opts.clone()
                };
                match load_model_on(path, &gpu_opts, Device::Cuda(0)) {
                    Err(ModelError::NotOnDevice(why)) => {
                        eprintln!("ferrum: {why}; running on the CPU");
                        load_model(path, opts)
                    }
                    other => other,
                }
            }
        },
    }
}

/// `--matmul-precision` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Precision {
    Int8,
    Float,
}

/// `--gemm` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GemmArg {
    Auto,
    Cublaslt,
    Triton,
}

impl From<GemmArg> for GemmChoice {
    fn from(g: GemmArg) -> GemmChoice {
        match g {
            GemmArg::Auto => GemmChoice::Auto,
            GemmArg::Cublaslt => GemmChoice::CublasLt,
            GemmArg::Triton => GemmChoice::Triton,
        }
    }
}

/// `--kv-cache-dtype` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KvCacheDtype {
    Auto,
    F32,
    F16,
    Bf16,
    /// int8 with a scale per (token, KV head) row: half an f16 cache's bytes (CPU models).
    Int8,
    /// fp8 (e4m3) with a scale per (token, KV head) row: about half an f16 cache's bytes
    /// (GPU models).
    Fp8,
}

impl KvCacheDtype {
    /// The type asked for; `None` for auto.
    pub fn fixed(self) -> Option<KvDtype> {
        match self {
            KvCacheDtype::Auto => None,
            KvCacheDtype::F32 => Some(KvDtype::F32),
            KvCacheDtype::F16 => Some(KvDtype::F16),
            KvCacheDtype::Bf16 => Some(KvDtype::Bf16),
            KvCacheDtype::Int8 => Some(KvDtype::Int8),
            KvCacheDtype::Fp8 => Some(KvDtype::Fp8),
        }
    }
}

impl From<Precision> for MatmulPrecision {
    fn from(p: Precision) -> Self {
        match p {
            Precision::Int8 => MatmulPrecision::Int8,
            Precision::Float => MatmulPrecision::Float,
        }
    }
}

/// Sampling flags. The defaults are a balanced chat setting; `--temperature 0` is greedy.
#[derive(Debug, Args)]
pub struct SamplingArgs {
    /// Tokens to generate at most (default: to the end of the context).
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub temperature: f32,
    #[arg(long, default_value_t = 0.95, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Keep the K most likely tokens (0 disables).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub repetition_penalty: f32,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Seed for reproducible sampling (default: random).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop when the output contains this string (repeatable; not included in the output;
    /// `\n`, `\t` and `\\` are read as newline, tab and backslash).
    #[arg(long = "stop", value_name = "STR")]
    pub stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
}

impl SamplingArgs {
    /// The validated sampling parameters for a model with `vocab_size` tokens.
    pub fn params(&self, vocab_size: usize) -> Result<SamplingParams> {
        let p = SamplingParams {
            max_tokens: self.max_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: (self.top_k > 0).then_some(self.top_k),
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            stop: self.stop.iter().map(|s| unescape(s)).collect(),
            ignore_eos: self.ignore_eos,
            ..SamplingParams::default()
        };
        match p.validate(vocab_size) {
            Ok(()) => {}
            // Name the flag as the user typed it.
            Err(TypesError::InvalidParam { param, msg }) => {
                bail!("--{}: {msg}", param.replace('_', "-"))
            }
            Err(e) => return Err(e.into()),
        }
        Ok(p)
    }
}

/// The text assets, or an error that explains why this model has none.
pub fn need_text(text: &std::result::Result<TextAssets, String>) -> Result<&TextAssets> {
    match text {
        Ok(t) => Ok(t),
        Err(why) => bail!("this model has no usable tokenizer ({why}); pass --prompt-ids instead"),
    }
}

/// Resolves and loads the model and its text assets; prints progress on a terminal.
pub fn load_parts(
    args: &ModelArgs,
    launch: &Launch,
) -> Result<(Model, std::result::Result<TextAssets, String>, Duration)> {
    let start = Instant::now();
    let layout = args.layout()?;
    let path: PathBuf = model_path::resolve(&args.model)?;
    let parallel = Launch::is_parallel(&layout);
    let interactive = std::io::stderr().is_terminal() && !parallel;
    if interactive {
        eprint!("loading {} ... ", path.display());
    }
    let opts = LoadOptions {
        num_threads: args.threads,
        precision: args.matmul_precision.into(),
        kv_cache_dtype: args.kv_cache_dtype.fixed(),
        pool: None,
        output_vocab: None,
        cuda_graphs: cuda_graphs(args),
        kernels: args.kernels.clone(),
        gemm: args.gemm.into(),
        cublaslt: args.cublaslt.clone(),
    };
    let model = if parallel {
        // Any rank but 0 serves rank 0's steps inside and never returns.
        launch.load(&path, args, &opts, &layout)
    } else {
        load_on_device(&path, args, &opts).map_err(anyhow::Error::from)
    }
    .with_context(|| format!("loading {}", path.display()))?;
    let mode = if args.no_template_sandbox {
        TemplateMode::InProcess
    } else {
        TemplateMode::Worker(
            std::env::current_exe()
                .context("cannot find the ferrum executable for the chat template worker")?,
        )
    };
    let text = load_text_assets_with(&path, &mode).map_err(|e| e.to_string());
    let load_time = start.elapsed();
    if interactive {
        eprintln!("done in {:.2}s", load_time.as_secs_f64());
    }
    if let Some(note) = model.gemm_note() {
        eprintln!("ferrum: {note}");
    }
    if let Some(note) = model.kv_cache_note() {
        eprintln!("ferrum: warning: {note}");
    }
    Ok((model, text, load_time))
}

/// Prompt tokens per step while prefilling for one request at a time (`run`, `chat`).
const SINGLE_PREFILL_CHUNK: usize = 512;

/// The smallest KV cache of [`single_engine`], in tokens, so a short request does not get a
/// cache sized to the token.
const SINGLE_MIN_KV_TOKENS: usize = 256;

/// Starts the engine for one request at a time (`run`, `chat`) with a KV cache of room for
/// `kv_tokens` tokens (at least [`SINGLE_MIN_KV_TOKENS`], at most the context). Its pages
/// become resident as they are used. The engine's prefix cache makes a call that repeats an
/// earlier call's tokens (a chat's earlier turns) skip their blocks.
pub fn single_engine(
    model: Model,
    tokenizer: Option<Arc<Tokenizer>>,
    model_args: &ModelArgs,
    kv_tokens: usize,
    speculative: &SpeculativeArgs,
    kv_disk: Option<KvDiskConfig>,
) -> Result<EngineHandle> {
    let max_model_len = model_args.max_model_len;
    const BLOCK_SIZE: usize = 16;
    let context = max_model_len.unwrap_or(model.config().max_position_embeddings);
    let tokens = kv_tokens.max(SINGLE_MIN_KV_TOKENS).min(context).max(2);
    let cfg = EngineConfig {
        max_num_seqs: 1,
        max_num_batched_tokens: SINGLE_PREFILL_CHUNK,
        block_size: BLOCK_SIZE,
        kv_cache: KvCacheSize::Blocks(tokens.div_ceil(BLOCK_SIZE)),
        max_model_len,
        enable_prefix_caching: true,
        max_waiting: 0,
        prefault_kv_cache: false,
        speculative: speculative.config(),
        overlap_steps: !model_args.no_overlap,
        kv_disk,
        kv_offload_memory: None,
        scheduling: SchedulingPolicy::Priority,
        tenant_weights: Vec::new(),
        cost_seed: ferrum_engine::DEFAULT_COST_SEED,
        calibrate: false,
    };
    start_engine(model, tokenizer, &cfg, speculative, model_args)
}

/// A seed for requests that set none: different every run.
pub fn fresh_seed() -> u64 {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ (u64::from(std::process::id()) << 32)
}

/// Reads `\n`, `\t` and `\\` in a flag value as newline, tab and backslash.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('\\') => out.push('\\'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_memory_flags() {
        assert_eq!(
            parse_kv_memory("2GiB").unwrap(),
            KvCacheSize::Bytes(2 << 30)
        );
        assert_eq!(
            parse_kv_memory("512M").unwrap(),
            KvCacheSize::Bytes(512_000_000)
        );
        assert_eq!(parse_kv_memory("1000").unwrap(), KvCacheSize::Bytes(1000));
        assert_eq!(
            parse_kv_memory("0.25").unwrap(),
            KvCacheSize::FractionOfFree(0.25)
        );
        for bad in ["", "x", "2TB", "1.2.3", "99999999999999999999"] {
            assert!(parse_kv_memory(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn stop_flags_read_escapes() {
        assert_eq!(super::unescape(r"a\n\tb\\c\x\"), "a\n\tb\\c\\x\\");
    }
}

/// Flags of the batching engine.
#[derive(Debug, Args)]
pub struct EngineArgs {
    /// Sequences running at once.
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Tokens computed per step (long prompts are prefilled in chunks of at most this).
    #[arg(long, default_value_t = 2048)]
    pub max_num_batched_tokens: usize,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// KV cache size: bytes (suffixes K, M, G, KiB, MiB, GiB) or a fraction of free memory
    /// (e.g. 0.2). Default 2GiB.
    #[arg(long, conflicts_with = "num_kv_blocks")]
    pub kv_cache_memory: Option<String>,
    /// KV cache size as an exact number of blocks.
    #[arg(long)]
    pub num_kv_blocks: Option<usize>,
    /// For a model on a GPU: the fraction of the GPU's memory this process may use (vLLM's
    /// meaning); the KV cache gets what the weights leave of it.
    #[arg(long, conflicts_with_all = ["kv_cache_memory", "num_kv_blocks"])]
    pub gpu_memory_utilization: Option<f64>,
    /// Turn off reuse of cached prompt prefixes.
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Keep cached full KV blocks as files in DIR too (in a folder per model and cache
    /// layout): a prefix evicted from the KV cache, or asked for after a restart, is read back
    /// instead of recomputed. Every file is checked before use; a folder that cannot be
    /// written to is a warning.
    #[arg(long, value_name = "DIR")]
    pub kv_disk_dir: Option<PathBuf>,
    /// Most bytes the disk tier keeps (suffixes as --kv-cache-memory; default 16GiB); beyond
    /// it, blocks used once go before blocks used again, least recently used first.
    #[arg(long, value_name = "BYTES", requires = "kv_disk_dir")]
    pub kv_disk_size: Option<String>,
    /// Host memory for cached KV blocks below the KV cache (suffixes as --kv-cache-memory).
    /// For a model on a GPU: page-locked memory that every newly cached block is copied to
    /// in the background; a prefix evicted from the GPU's cache comes back from it by a copy
    /// instead of a prefill. For a model on the CPU, whose cache is host memory already, the
    /// bytes are added to the KV cache.
    #[arg(long, value_name = "BYTES")]
    pub kv_offload_memory: Option<String>,
    /// The order waiting requests are admitted in, and which running one is preempted when KV
    /// blocks run out: `priority` (a request's `priority`, lower first, then arrival), `fifo`
    /// (arrival only), `fair` (a weighted fair queue between tenants, see --tenant-weights;
    /// within a tenant, priority then arrival), `slo` (priority, then the least slack to a
    /// request's first-token target, `slo`/`slo_class`; the victim has the most slack).
    #[arg(long, value_enum, default_value_t = Scheduling::Priority)]
    pub scheduling: Scheduling,
    /// Tenants' weights under `--scheduling fair`, as NAME=WEIGHT,... (a request's tenant is
    /// its `user`, or on the Messages API its `metadata.user_id`); unlisted tenants weigh 1.
    #[arg(long, value_name = "NAME=W,...")]
    pub tenant_weights: Option<String>,
    #[command(flatten, next_help_heading = "Speculative decoding")]
    pub speculative: SpeculativeArgs,
}

/// `--speculative-method` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SpeculativeMethod {
    /// Prompt lookup decoding: tokens that followed an earlier occurrence of the sequence's
    /// last n-gram in its own prompt and output.
    Ngram,
    /// A smaller draft model with the same vocabulary (--speculative-model), on the same
    /// threads.
    Draft,
}

/// Flags of speculative decoding (vLLM's names).
#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("speculation")
        .args(["speculative_method", "speculative_model"])
        .multiple(true)
))]
pub struct SpeculativeArgs {
    /// Propose tokens and verify them in the same step as the sequence's next token (greedy
    /// output stays exactly the same; sampled output keeps its distribution).
    #[arg(long, value_enum, value_name = "METHOD")]
    pub speculative_method: Option<SpeculativeMethod>,
    /// The draft model (a folder, .gguf file or Hub id) for `--speculative-method draft`,
    /// which it implies.
    #[arg(long, value_name = "M")]
    pub speculative_model: Option<String>,
    /// Tokens proposed per sequence and step at most.
    #[arg(long, default_value_t = 4, requires = "speculation")]
    pub num_speculative_tokens: usize,
    /// The draft model proposes only among the first N tokens of the vocabulary: its LM head
    /// computes N rows instead of all (with byte-level BPE vocabularies, whose ids follow the
    /// merge order, the first 65536 of Qwen's 151936 tokens cover nearly all English and code).
    /// Output is unchanged (the target verifies every token); proposals get cheaper, and a
    /// token past N is never proposed.
    #[arg(long, value_name = "N", requires = "speculative_model")]
    pub speculative_draft_vocab: Option<usize>,
    /// ngram: the longest suffix looked up in the sequence (the lookup window).
    #[arg(long, default_value_t = 4, requires = "speculation")]
    pub prompt_lookup_max: usize,
    /// ngram: the shortest suffix that may match.
    #[arg(long, default_value_t = 2, requires = "speculation")]
    pub prompt_lookup_min: usize,
    /// Steps with more decoding sequences than this propose nothing (there the batch already
    /// fills the step's compute).
    #[arg(long, default_value_t = 4, requires = "speculation")]
    pub speculative_disable_by_batch_size: usize,
}

/// Starts the engine for `model` with `cfg`, loading the draft model `spec` names (onto the
/// target's compute threads, with the target's precision and KV type) when there is one.
pub fn start_engine(
    model: Model,
    tokenizer: Option<Arc<Tokenizer>>,
    cfg: &EngineConfig,
    spec: &SpeculativeArgs,
    model_args: &ModelArgs,
) -> Result<EngineHandle> {
    let cfg = &EngineConfig {
        overlap_steps: !model_args.no_overlap,
        ..cfg.clone()
    };
    let draft = match (spec.method(), &spec.speculative_model) {
        (Some(SpeculativeMethod::Draft), Some(m)) => m,
        (Some(SpeculativeMethod::Draft), None) => {
            bail!("--speculative-method draft needs --speculative-model M")
        }
        (_, Some(_)) => bail!("--speculative-model goes with --speculative-method draft"),
        (_, None) => return Ok(EngineHandle::start(model, tokenizer, cfg)?),
    };
    let path = model_path::resolve(draft)?;
    let Some(pool) = model.compute_pool() else {
        bail!(
            "--speculative-model runs beside a CPU model only for now; the target runs on {}",
            model.device_name()
        );
    };
    let draft = load_model(
        &path,
        &LoadOptions {
            num_threads: None,
            pool: Some(Arc::clone(pool)),
            precision: model_args.matmul_precision.into(),
            kv_cache_dtype: model_args.kv_cache_dtype.fixed(),
            output_vocab: spec.speculative_draft_vocab,
            cuda_graphs: cuda_graphs(model_args),
            kernels: model_args.kernels.clone(),
            ..LoadOptions::default()
        },
    )
    .with_context(|| format!("loading the draft model {}", path.display()))?;
    Ok(EngineHandle::start_with_draft(
        model, draft, tokenizer, cfg,
    )?)
}

impl SpeculativeArgs {
    /// The method asked for: `--speculative-method`, or draft when only
    /// `--speculative-model` is given.
    fn method(&self) -> Option<SpeculativeMethod> {
        self.speculative_method.or(self
            .speculative_model
            .as_ref()
            .map(|_| SpeculativeMethod::Draft))
    }

    /// The engine's setting; `None` without speculation.
    pub fn config(&self) -> Option<SpeculativeConfig> {
        let proposer = match self.method()? {
            SpeculativeMethod::Ngram => Proposer::Ngram(NgramProposer {
                min: self.prompt_lookup_min,
                max: self.prompt_lookup_max,
            }),
            SpeculativeMethod::Draft => Proposer::Draft,
        };
        Some(SpeculativeConfig {
            proposer,
            num_speculative_tokens: self.num_speculative_tokens,
            disable_by_batch_size: self.speculative_disable_by_batch_size,
        })
    }
}

/// `--scheduling`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scheduling {
    Fifo,
    Priority,
    Fair,
    Slo,
}

impl EngineArgs {
    /// `--tenant-weights` read: `NAME=W` pairs, weights at least 1, names once each.
    fn tenant_weights(&self) -> Result<Vec<(String, u32)>> {
        let Some(spec) = &self.tenant_weights else {
            return Ok(Vec::new());
        };
        if self.scheduling != Scheduling::Fair {
            bail!("--tenant-weights goes with --scheduling fair");
        }
        let mut out: Vec<(String, u32)> = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((name, w)) = part.split_once('=') else {
                bail!("--tenant-weights: {part:?} is not NAME=WEIGHT");
            };
            let w: u32 = match w.trim().parse() {
                Ok(w) if w >= 1 => w,
                _ => bail!("--tenant-weights: the weight of {name:?} must be a whole number of at least 1, got {w:?}"),
            };
            let name = name.trim().to_string();
            if name.is_empty() || out.iter().any(|(n, _)| *n == name) {
                bail!("--tenant-weights: tenant names must be given once each and not be empty ({part:?})");
            }
            out.push((name, w));
        }
        Ok(out)
    }

    /// The disk tier's setting for `model` (its identity read from its files), when asked for.
    pub fn kv_disk(&self, model: &ModelArgs) -> Result<Option<KvDiskConfig>> {
        let Some(dir) = &self.kv_disk_dir else {
            return Ok(None);
        };
        let max_bytes = match self.kv_disk_size.as_deref() {
            None => 16 << 30,
            Some(s) => match parse_kv_memory(s) {
                Ok(KvCacheSize::Bytes(b)) if b > 0 => b,
                _ => bail!("--kv-disk-size {s:?}: expected bytes (e.g. 16GiB, 500M)"),
            },
        };
        let path = model_path::resolve(&model.model)?;
        let model_identity = ferrum_models::weights_identity(&path)
            .with_context(|| format!("identifying {} for --kv-disk-dir", path.display()))?;
        Ok(Some(KvDiskConfig {
            dir: dir.clone(),
            max_bytes,
            model_identity,
        }))
    }

    /// `--kv-offload-memory` in bytes.
    pub fn kv_offload_memory(&self) -> Result<Option<u64>> {
        let Some(s) = self.kv_offload_memory.as_deref() else {
            return Ok(None);
        };
        match parse_kv_memory(s) {
            Ok(KvCacheSize::Bytes(b)) if b > 0 => Ok(Some(b)),
            _ => bail!("--kv-offload-memory {s:?}: expected bytes (e.g. 64GiB, 500M)"),
        }
    }

    pub fn config(&self, model: &ModelArgs, max_waiting: usize) -> Result<EngineConfig> {
        let max_model_len = model.max_model_len;
        let kv_cache = match (
            self.gpu_memory_utilization,
            &self.kv_cache_memory,
            self.num_kv_blocks,
        ) {
            (Some(f), _, _) => KvCacheSize::GpuUtilization(f),
            (None, _, Some(n)) => KvCacheSize::Blocks(n),
            (None, Some(s), None) => parse_kv_memory(s)?,
            (None, None, None) => EngineConfig::default().kv_cache,
        };
        Ok(EngineConfig {
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            block_size: self.block_size,
            kv_cache,
            max_model_len,
            enable_prefix_caching: !self.no_prefix_caching,
            max_waiting,
            prefault_kv_cache: false,
            speculative: self.speculative.config(),
            overlap_steps: true,
            kv_disk: self.kv_disk(model)?,
            kv_offload_memory: self.kv_offload_memory()?,
            scheduling: match self.scheduling {
                Scheduling::Fifo => SchedulingPolicy::Fifo,
                Scheduling::Priority => SchedulingPolicy::Priority,
                Scheduling::Fair => SchedulingPolicy::Fair(Vec::new()),
                Scheduling::Slo => SchedulingPolicy::Slo,
            },
            tenant_weights: self.tenant_weights()?,
            cost_seed: ferrum_engine::DEFAULT_COST_SEED,
            calibrate: false,
        })
    }
}

/// `2GiB`, `512M`, `1000000` (bytes) or `0.25` (fraction of free memory).
pub fn parse_kv_memory(s: &str) -> Result<KvCacheSize> {
    let t = s.trim();
    let bad = || {
        anyhow::anyhow!("--kv-cache-memory {s:?}: expected bytes (e.g. 2GiB, 512M) or a fraction of free memory (e.g. 0.2)")
    };
    if t.contains('.') {
        let f: f64 = t.parse().map_err(|_| bad())?;
        return Ok(KvCacheSize::FractionOfFree(f));
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| bad())?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KB" => 1_000,
        "M" | "MB" => 1_000_000,
        "G" | "GB" => 1_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return Err(bad()),
    };
    n.checked_mul(mult).map(KvCacheSize::Bytes).ok_or_else(bad)
}
