//! Opening a model path and building the right family for it.

use crate::backend::{Collected, CpuBackend, CudaBackend};
use crate::parallel::driver::{Driver, Stage};
use crate::parallel::{Comms, Layout, Placement, Shard};
use crate::source::WeightSource;
use crate::{FamilyModel, KvCache, ModelConfig, ModelError, Result};
use ferrum_runtime::cpu::{KvDtype, Linear, MatmulPrecision};
use ferrum_runtime::cuda::{Gpu, InterpreterConfig, Manifest, SharedGpu};
use ferrum_runtime::{Device, ThreadPool};
use ferrum_types::ForwardBatch;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Compute threads of a pool of its own; `None` uses every available core. Must be unset
    /// with `pool`.
    pub num_threads: Option<usize>,
    /// A compute pool to share with models already loaded (a draft model beside its target:
    /// two models must not double the threads). `None`: the model gets its own pool.
    pub pool: Option<Arc<ThreadPool>>,
    /// Activations of products with block-quantized weights: 8-bit integer (default) or f32.
    pub precision: MatmulPrecision,
    /// Element type of the KV cache; `None` picks one (see [`resolve_kv_dtype`]).
    pub kv_cache_dtype: Option<KvDtype>,
    /// The LM head computes logits for the first this many tokens of the vocabulary only
    /// (`None`: all). For a draft model of speculative decoding: with a byte-level BPE
    /// vocabulary, whose ids follow the merge order (frequent pieces first), the first 64k of
    /// Qwen's 152k tokens hold nearly every token of English and code, and the head's rows are
    /// a third of a small model's bytes per token. Not for parallel layouts.
    pub output_vocab: Option<usize>,
    /// Whether a GPU model replays decode steps as CUDA graphs (see [`CudaGraphs`]).
    pub cuda_graphs: CudaGraphs,
    /// A GPU model's kernels of this folder (`kernels/build.py --only NAMES --out DIR`: a
    /// tuning sweep's candidate, [`Manifest::from_dir`]) in place of the embedded ones of the
    /// same names; an error on the CPU.
    pub kernels: Option<PathBuf>,
    /// What a GPU model's products of more than 16 rows run on ([`GemmChoice`]).
    pub gemm: GemmChoice,
    /// The cuBLASLt library to open (a file, or a folder holding one) instead of looking for
    /// it (`--cublaslt`).
    pub cublaslt: Option<PathBuf>,
}

/// The kernels `opts` puts in place of embedded ones, if any.
fn kernels(opts: &LoadOptions) -> Result<Option<Manifest>> {
    Ok(match &opts.kernels {
        Some(dir) => Some(Manifest::from_dir(dir)?),
        None => None,
    })
}

/// Refuses a kernels folder for a model on the CPU: it would be silently unused.
fn no_kernels_on_cpu(opts: &LoadOptions) -> Result<()> {
    match &opts.kernels {
        Some(dir) => Err(ModelError::Invalid(format!(
            "GPU kernels from {} were asked for a model on the CPU",
            dir.display()
        ))),
        None => Ok(()),
    }
}

/// What a GPU model's float products of more than 16 rows (prefill chunks, batched decode, the
/// LM head at batch) run on (`--gemm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GemmChoice {
    /// cuBLASLt when it opens (bf16/f16 weights, shapes it takes), else the Triton kernels.
    #[default]
    Auto,
    /// cuBLASLt, an error when it does not open.
    CublasLt,
    /// The Triton kernels only.
    Triton,
}

/// Decode steps on a GPU as CUDA graphs, or as plain launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CudaGraphs {
    /// A decode batch (one token per sequence) is padded to the next bucket size
    /// ([`crate::backend::GRAPH_BUCKETS`]) and its whole forward replayed as one captured
    /// graph; other batches launch plainly.
    #[default]
    On,
    /// Every step launches its kernels one by one (`--no-cuda-graph`).
    Off,
}

/// The KV cache type `auto` stands for. The float setting is the reference path and keeps f32.
/// On the fast setting, the checkpoint's half type: f16 for a GGUF file (llama.cpp's default
/// cache type), bf16 or f16 for a Hugging Face folder saved in that type (vLLM's `auto`: the
/// model's dtype), f32 for an f32 folder.
pub fn resolve_kv_dtype(src: &WeightSource, config: &ModelConfig, opts: &LoadOptions) -> KvDtype {
    if let Some(d) = opts.kv_cache_dtype {
        return d;
    }
    if opts.precision == MatmulPrecision::Float {
        return KvDtype::F32;
    }
    match src {
        WeightSource::Gguf(_) => KvDtype::F16,
        WeightSource::HfFolder { .. } => match config.dtype.as_deref() {
            Some("bfloat16") => KvDtype::Bf16,
            Some("float16") => KvDtype::F16,
            _ => KvDtype::F32,
        },
    }
}

/// A family model on its device.
// One or two per process, moved only at start: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum OnDevice {
    Cpu(FamilyModel<CpuBackend>),
    Gpu(FamilyModel<CudaBackend>),
}

/// What a submitted step returned ([`Model::collect`]).
#[derive(Debug, Clone, Copy)]
pub enum StepRows<'a> {
    /// Each logits row's greedy token.
    Tokens(&'a [u32]),
    /// Each logits row sampled under its spec.
    Sampled(&'a [crate::sampling::SampledRow]),
}

/// Runs `$body` with `$m` bound to the family model, whatever its device.
macro_rules! on_device {
    ($d:expr, $m:ident => $body:expr) => {
        match $d {
            OnDevice::Cpu($m) => $body,
            OnDevice::Gpu($m) => $body,
        }
    };
}

impl Stage for OnDevice {
    fn new_kv(&self, num_blocks: usize, block_size: usize) -> Result<KvCache> {
        match self {
            OnDevice::Cpu(m) => KvCache::new(m.local_config(), num_blocks, block_size),
            OnDevice::Gpu(m) => m
                .backend()
                .kv_cache(m.local_config(), num_blocks, block_size),
        }
    }

    fn step(&mut self, batch: &ForwardBatch, kv: &mut KvCache, out: &mut Vec<f32>) -> Result<()> {
        out.extend_from_slice(on_device!(self, m => m.forward(batch, kv))?);
        Ok(())
    }
}

/// A loaded model of any supported family, on its device: the whole model, or in a parallel
/// run this rank's shard (see [`crate::parallel`]).
#[derive(Debug)]
pub struct Model {
    device: OnDevice,
    /// The step protocol, in a parallel run.
    run: Option<Driver>,
    /// Each row's argmax, in a parallel run ([`Model::forward_argmax`]).
    argmax: Vec<u32>,
    /// Each row's sample, in a parallel run ([`Model::forward_sample`]).
    sampled: crate::sampling::SampledRows,
}

impl From<FamilyModel<CpuBackend>> for Model {
    fn from(m: FamilyModel<CpuBackend>) -> Model {
        Model::new(OnDevice::Cpu(m))
    }
}

impl From<FamilyModel<CudaBackend>> for Model {
    fn from(m: FamilyModel<CudaBackend>) -> Model {
        Model::new(OnDevice::Gpu(m))
    }
}

impl Model {
    fn new(device: OnDevice) -> Model {
        Model {
            device,
            run: None,
            argmax: Vec::new(),
            sampled: Default::default(),
        }
    }

    pub fn config(&self) -> &ModelConfig {
        on_device!(&self.device, m => m.config())
    }

    /// The config as this rank runs it: the shard's heads, intermediate rows and layers (the
    /// whole config in one process).
    pub fn local_config(&self) -> &ModelConfig {
        on_device!(&self.device, m => m.local_config())
    }

    /// Columns of a logits row: the vocabulary, or [`LoadOptions::output_vocab`] when smaller.
    pub fn logits_vocab(&self) -> usize {
        on_device!(&self.device, m => m.logits_vocab())
    }

    /// The model on the CPU, when it runs there.
    pub fn cpu(&self) -> Option<&FamilyModel<CpuBackend>> {
        match &self.device {
            OnDevice::Cpu(m) => Some(m),
            OnDevice::Gpu(_) => None,
        }
    }

    /// This rank's shard in a parallel run (`None` in one process).
    pub fn shard(&self) -> Option<&Shard> {
        self.run.as_ref().map(Driver::shard)
    }

    /// The compute pool a CPU model runs on; pass it in [`LoadOptions::pool`] to load another
    /// model onto the same threads. `None` for a GPU model.
    pub fn compute_pool(&self) -> Option<&Arc<ThreadPool>> {
        self.cpu().map(|m| m.backend().pool())
    }

    /// The device the model runs on, in words (`cpu`, `NVIDIA H200 (sm_90)`).
    pub fn device_name(&self) -> String {
        match &self.device {
            OnDevice::Cpu(_) => "cpu".to_string(),
            OnDevice::Gpu(m) => m.backend().gpu().lock().describe(),
        }
    }

    /// The GPU (or interpreted device) the model runs on; `None` on the CPU.
    pub fn gpu(&self) -> Option<&SharedGpu> {
        match &self.device {
            OnDevice::Cpu(_) => None,
            OnDevice::Gpu(m) => Some(m.backend().gpu()),
        }
    }

    /// What a GPU model's products of more than 16 rows run on, in words (`None` on the CPU):
    /// the line a server prints at start.
    pub fn gemm_note(&self) -> Option<&str> {
        match &self.device {
            OnDevice::Gpu(m) => Some(m.backend().gemm_note()),
            OnDevice::Cpu(_) => None,
        }
    }

    /// A line for the operator about the KV cache's type on this model
    /// ([`KvCache::quality_note`]), printed at start.
    pub fn kv_cache_note(&self) -> Option<String> {
        KvCache::quality_note(self.config())
    }

    /// Free and total memory of the model's device in bytes, when it is not the host (a GPU,
    /// with the weights loaded): what the KV cache is sized from.
    pub fn device_memory(&self) -> Result<Option<(u64, u64)>> {
        match &self.device {
            OnDevice::Cpu(_) => Ok(None),
            OnDevice::Gpu(m) => {
                let info = m.backend().gpu().lock().memory_info()?;
                Ok(info.map(|(free, total)| (free as u64, total as u64)))
            }
        }
    }

    /// Bytes one KV block takes on a rank (its layers and KV heads): in a parallel run, on
    /// the rank whose stage has the most layers, so a cache sized by it fits every rank.
    pub fn kv_bytes_per_block(&self, block_size: usize) -> usize {
        let local = self.local_config();
        let bytes = KvCache::bytes_per_block(local, block_size);
        match &self.run {
            Some(run) if local.num_hidden_layers > 0 => {
                bytes / local.num_hidden_layers * run.max_stage_layers()
            }
            _ => bytes,
        }
    }

    /// A KV cache of `num_blocks` blocks of `block_size` slots on the model's device; in a
    /// parallel run every rank makes its own for its shard.
    pub fn new_kv_cache(&mut self, num_blocks: usize, block_size: usize) -> Result<KvCache> {
        if let Some(run) = self.run.as_mut() {
            run.new_kv_cache(num_blocks, block_size)?;
        }
        self.device.new_kv(num_blocks, block_size)
    }

    /// See [`crate::LlamaModel::weight_bytes_per_token`] (this rank's share).
    pub fn weight_bytes_per_token(&self) -> usize {
        on_device!(&self.device, m => m.weight_bytes_per_token())
    }

    /// See [`crate::LlamaModel::forward`]. In a parallel run (on rank 0), every rank runs
    /// the step on its shard and the logits come back here.
    pub fn forward(&mut self, batch: &ForwardBatch, kv: &mut KvCache) -> Result<&[f32]> {
        match self.run.as_mut() {
            Some(run) => {
                // Checked before the other ranks hear of the step (see `driver`).
                if !kv.fits(on_device!(&self.device, m => m.local_config())) {
                    return Err(ModelError::Invalid(
                        "the KV cache was built for another model".into(),
                    ));
                }
                run.forward(batch, kv, &mut self.device)
            }
            None => on_device!(&mut self.device, m => m.forward(batch, kv)),
        }
    }

    /// The argmax of each row [`Model::forward`] would return (`[rows]` token ids: greedy
    /// decisions). On a GPU they are made there and only the ids come back; in a parallel
    /// run, over the gathered logits on rank 0.
    pub fn forward_argmax(&mut self, batch: &ForwardBatch, kv: &mut KvCache) -> Result<&[u32]> {
        if self.run.is_none() {
            return on_device!(&mut self.device, m => m.forward_argmax(batch, kv));
        }
        let rows = batch.logits_indices.len();
        let mut ids = std::mem::take(&mut self.argmax);
        let logits = self.forward(batch, kv)?;
        crate::backend::host_argmax(logits, rows, &mut ids);
        self.argmax = ids;
        Ok(&self.argmax)
    }

    /// Each row [`Model::forward`] would return, sampled under its spec (one per row, by the
    /// rules of [`crate::sampling`]). On a GPU the rows are sampled there and only the tokens
    /// (and requested logprobs) come back; in a parallel run, on rank 0 over the gathered
    /// logits. `specs` makes the specs; on a GPU it is called while the device runs the pass
    /// (see [`crate::LlamaModel::forward_sample`]).
    pub fn forward_sample<'s>(
        &mut self,
        batch: &ForwardBatch,
        kv: &mut KvCache,
        specs: impl FnOnce() -> Vec<crate::sampling::RowSampling<'s>>,
    ) -> Result<&[crate::sampling::SampledRow]> {
        if self.run.is_none() {
            return on_device!(&mut self.device, m => m.forward_sample(batch, kv, specs));
        }
        let mut sampled = std::mem::take(&mut self.sampled);
        let logits = self.forward(batch, kv);
        let done = logits.and_then(|l| sampled.sample_logits(l, &specs()));
        self.sampled = sampled;
        done?;
        Ok(&self.sampled.rows)
    }

    /// Whether a step can be issued before the previous one's tokens are on the host
    /// ([`Model::submit_argmax`], [`Model::submit_sample`]): a whole model on a GPU that
    /// decides its tokens there.
    ///
    /// A soft-capped model (Gemma 2) decides its tokens on the host (see
    /// [`crate::backend::Backend::argmax_rows`]), so its steps cannot overlap: the
    /// submissions work, but each waits for its logits.
    pub fn can_overlap(&self) -> bool {
        self.samples_on_device() && self.config().final_logit_softcap.is_none()
    }

    /// [`Model::forward_argmax`] without waiting for the tokens: they come back by an
    /// asynchronous copy, collected by [`Model::collect`] in the order steps were submitted.
    /// `pending` names the batch's inputs that are the previous step's tokens, still on the
    /// device: `(token index, that step's logits row)` (the batch holds placeholders there).
    pub fn submit_argmax(
        &mut self,
        batch: &ForwardBatch,
        kv: &mut KvCache,
        pending: &[(u32, u32)],
    ) -> Result<()> {
        self.deferred("submit_argmax", pending, |m| {
            m.forward_argmax(batch, kv).map(drop)
        })
    }

    /// [`Model::forward_sample`] without waiting for the rows (see [`Model::submit_argmax`]).
    pub fn submit_sample<'s>(
        &mut self,
        batch: &ForwardBatch,
        kv: &mut KvCache,
        pending: &[(u32, u32)],
        specs: impl FnOnce() -> Vec<crate::sampling::RowSampling<'s>>,
    ) -> Result<()> {
        self.deferred("submit_sample", pending, |m| {
            m.forward_sample(batch, kv, specs).map(drop)
        })
    }

    /// Runs `step` on the model's GPU with its results deferred and `pending` as its inputs
    /// from the previous step; the backend is back to plain steps afterwards, failed or not.
    fn deferred(
        &mut self,
        what: &str,
        pending: &[(u32, u32)],
        step: impl FnOnce(&mut FamilyModel<CudaBackend>) -> Result<()>,
    ) -> Result<()> {
        let m = match (&mut self.device, &self.run) {
            (OnDevice::Gpu(m), None) => m,
            _ => {
                return Err(ModelError::Invalid(format!(
                    "{what}: overlapped steps need a whole model on a GPU"
                )))
            }
        };
        m.backend_mut().set_pending_inputs(pending);
        m.backend_mut().set_deferred(true);
        let done = step(m);
        m.backend_mut().set_deferred(false);
        m.backend_mut().set_pending_inputs(&[]);
        done
    }

    /// Waits for the oldest submitted step's tokens (or sampled rows).
    pub fn collect(&mut self) -> Result<StepRows<'_>> {
        let (argmax, sampled) = (&mut self.argmax, &mut self.sampled);
        let m = match (&mut self.device, &self.run) {
            (OnDevice::Gpu(m), None) => m,
            _ => {
                return Err(ModelError::Invalid(
                    "no step was submitted to collect".into(),
                ))
            }
        };
        Ok(match m.backend_mut().collect(argmax, sampled)? {
            Collected::Tokens => StepRows::Tokens(argmax),
            Collected::Sampled => StepRows::Sampled(&sampled.rows),
        })
    }

    /// Whether [`Model::forward_sample`] samples where the logits are, so only tokens cross
    /// to the host: a whole model on a GPU (or the interpreted device).
    pub fn samples_on_device(&self) -> bool {
        self.run.is_none() && matches!(self.device, OnDevice::Gpu(_))
    }

    /// Rank 0 of a parallel run whose other ranks never started their loops (a load failed
    /// elsewhere): dropping the model then sends them nothing.
    pub fn disarm_parallel(&mut self) {
        if let Some(run) = self.run.as_mut() {
            run.disarm();
        }
    }

    /// A worker rank's loop (any rank but 0 of a parallel run): runs rank 0's commands on
    /// this shard until rank 0 stops.
    pub fn run_worker(mut self) -> Result<()> {
        match self.run.as_mut() {
            Some(run) => run.serve(&mut self.device),
            None => Err(ModelError::Invalid(
                "a worker loop for a model outside a parallel run".into(),
            )),
        }
    }
}

/// Reads the config of a model folder or GGUF file.
pub fn load_config(src: &WeightSource) -> Result<ModelConfig> {
    match src {
        WeightSource::HfFolder { dir, .. } => ModelConfig::from_hf_file(&dir.join("config.json")),
        WeightSource::Gguf(g) => ModelConfig::from_gguf(g),
    }
}

/// The pool `opts` names: the shared one, or a new one of `num_threads`.
fn compute_pool(path: &Path, opts: &LoadOptions) -> Result<Arc<ThreadPool>> {
    let pool = match (&opts.pool, opts.num_threads) {
        (Some(_), Some(_)) => {
            return Err(ModelError::Invalid(
                "a model given a shared compute pool takes its threads from it; leave the number of threads unset".into(),
            ))
        }
        (Some(p), None) => return Ok(Arc::clone(p)),
        (None, Some(0)) => {
            return Err(ModelError::Invalid(
                "the number of threads must be at least 1".into(),
            ))
        }
        (None, Some(n)) => ThreadPool::new(n),
        (None, None) => ThreadPool::with_available_parallelism(),
    };
    pool.map(Arc::new).map_err(|e| ModelError::io(path, e))
}

/// Opens `path` and builds its model on `device`: [`load_model`] for the CPU; for a GPU (or the
/// interpreted device) the CUDA backend, after probing the driver and the device (an error
/// naming what is missing, never a panic).
pub fn load_model_on(path: &Path, opts: &LoadOptions, device: Device) -> Result<Model> {
    let gpu = match device {
        Device::Cpu => return load_model(path, opts),
        Device::Cuda(n) => Gpu::cuda_with(n, kernels(opts)?)?,
        Device::Interpreted => {
            Gpu::interpreted_with(&InterpreterConfig::from_env(), kernels(opts)?)?
        }
    };
    if opts.pool.is_some() || opts.num_threads.is_some() {
        return Err(ModelError::Invalid(format!(
            "a model on {device} does not take compute threads; leave them unset"
        )));
    }
    Ok(Model::new(OnDevice::Gpu(load_model_on_gpu(
        path,
        opts,
        SharedGpu::new(gpu),
    )?)))
}

/// Opens `path` and builds its model on `gpu` with the CUDA backend (f32, f16 and bf16
/// weights; the KV cache type as [`resolve_kv_dtype`] picks it).
pub fn load_model_on_gpu(
    path: &Path,
    opts: &LoadOptions,
    gpu: SharedGpu,
) -> Result<FamilyModel<CudaBackend>> {
    let src = WeightSource::open(path)?;
    let mut config = load_config(&src)?;
    if config.moe.is_some() {
        // Refused before anything is uploaded; `--device auto` falls back to the CPU.
        return Err(ModelError::NotOnDevice(format!(
            "{} is a mixture-of-experts model, which runs on the CPU only so far",
            config.architecture
        )));
    }
    config.kv_cache_dtype = resolve_kv_dtype(&src, &config, opts);
    FamilyModel::load_whole(config, &src, gpu_backend(gpu, opts)?, opts.output_vocab)
}

/// The CUDA backend on `gpu` as `opts` configure it: graphs, and what large products run on.
fn gpu_backend(gpu: SharedGpu, opts: &LoadOptions) -> Result<CudaBackend> {
    let mut backend = CudaBackend::new(gpu, opts.cuda_graphs);
    backend.set_gemm(opts.gemm, opts.cublaslt.as_deref())?;
    Ok(backend)
}

/// Opens `path` (a Hugging Face folder or a `.gguf` file) and builds its model.
pub fn load_model(path: &Path, opts: &LoadOptions) -> Result<Model> {
    no_kernels_on_cpu(opts)?;
    let src = WeightSource::open(path)?;
    let mut config = load_config(&src)?;
    config.kv_cache_dtype = resolve_kv_dtype(&src, &config, opts);
    let pool = compute_pool(path, opts)?;
    let backend = CpuBackend::new(pool, Linear::new(opts.precision));
    Ok(Model::new(OnDevice::Cpu(FamilyModel::load_whole(
        config,
        &src,
        backend,
        opts.output_vocab,
    )?)))
}

/// Opens `path` and builds this rank's shard of its model under `layout` on `device` (the
/// rank is `comms.world`'s). Rank 0 gets a model whose [`Model::forward`] runs every rank;
/// the others run [`Model::run_worker`].
pub fn load_model_sharded(
    path: &Path,
    opts: &LoadOptions,
    device: Device,
    layout: &Layout,
    comms: Comms,
) -> Result<Model> {
    layout.check_world_size(comms.world.size())?;
    if opts.output_vocab.is_some() {
        return Err(ModelError::Invalid(
            "a reduced output vocabulary (a draft model's) does not run sharded".into(),
        ));
    }
    let src = WeightSource::open(path)?;
    let mut config = load_config(&src)?;
    config.kv_cache_dtype = resolve_kv_dtype(&src, &config, opts);
    let shard = Shard::new(&config, layout, comms.world.rank())?;
    let max_stage_layers = layout
        .stage_layers(config.num_hidden_layers)?
        .iter()
        .map(|r| r.len())
        .max()
        .unwrap_or(0);
    let place = Placement {
        shard: shard.clone(),
        comms: Some(comms.clone()),
    };
    let vocab = config.vocab_size;
    let device = match device {
        Device::Cpu => {
            no_kernels_on_cpu(opts)?;
            let pool = compute_pool(path, opts)?;
            let backend = CpuBackend::new(pool, Linear::new(opts.precision));
            OnDevice::Cpu(FamilyModel::load_placed(config, &src, backend, place)?)
        }
        Device::Cuda(_) | Device::Interpreted => {
            if config.moe.is_some() {
                return Err(ModelError::NotOnDevice(format!(
                    "{} is a mixture-of-experts model, which runs on the CPU only so far",
                    config.architecture
                )));
            }
            let gpu = match device {
                Device::Cuda(n) => Gpu::cuda_with(n, kernels(opts)?)?,
                _ => Gpu::interpreted_with(&InterpreterConfig::from_env(), kernels(opts)?)?,
            };
            let backend = gpu_backend(SharedGpu::new(gpu), opts)?;
            OnDevice::Gpu(FamilyModel::load_placed(config, &src, backend, place)?)
        }
    };
    Ok(Model {
        device,
        argmax: Vec::new(),
        sampled: Default::default(),
        run: Some(Driver::new(
            comms,
            shard,
            layout.micro_batches,
            vocab,
            max_stage_layers,
        )),
    })
}
