//! Opening a model path and building the right family for it.

use crate::backend::{CpuBackend, CudaBackend};
use crate::source::WeightSource;
use crate::{FamilyModel, KvCache, ModelConfig, ModelError, Result};
use ferrum_runtime::cpu::{KvDtype, Linear, MatmulPrecision};
use ferrum_runtime::cuda::{Gpu, InterpreterConfig, SharedGpu};
use ferrum_runtime::{Device, ThreadPool};
use ferrum_types::ForwardBatch;
use std::path::Path;
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

/// A loaded model of any supported family, on its device.
// One or two per process, moved only at start: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Model {
    /// On the CPU.
    Cpu(FamilyModel<CpuBackend>),
    /// On a GPU (or the interpreted device).
    Gpu(FamilyModel<CudaBackend>),
}

impl Model {
    pub fn config(&self) -> &ModelConfig {
        match self {
            Model::Cpu(m) => m.config(),
            Model::Gpu(m) => m.config(),
        }
    }

    /// The compute pool a CPU model runs on; pass it in [`LoadOptions::pool`] to load another
    /// model onto the same threads. `None` for a GPU model.
    pub fn compute_pool(&self) -> Option<&Arc<ThreadPool>> {
        match self {
            Model::Cpu(m) => Some(m.backend().pool()),
            Model::Gpu(_) => None,
        }
    }

    /// The device the model runs on, in words (`cpu`, `NVIDIA H200 (sm_90)`).
    pub fn device_name(&self) -> String {
        match self {
            Model::Cpu(_) => "cpu".to_string(),
            Model::Gpu(m) => m.backend().gpu().lock().describe(),
        }
    }

    /// Free and total memory of the model's device in bytes, when it is not the host (a GPU,
    /// with the weights loaded): what the KV cache is sized from.
    pub fn device_memory(&self) -> Result<Option<(u64, u64)>> {
        match self {
            Model::Cpu(_) => Ok(None),
            Model::Gpu(m) => {
                let info = m.backend().gpu().lock().memory_info()?;
                Ok(info.map(|(free, total)| (free as u64, total as u64)))
            }
        }
    }

    /// A KV cache of `num_blocks` blocks of `block_size` slots on the model's device.
    pub fn new_kv_cache(&self, num_blocks: usize, block_size: usize) -> Result<KvCache> {
        match self {
            Model::Cpu(m) => KvCache::new(m.config(), num_blocks, block_size),
            Model::Gpu(m) => m.backend().kv_cache(m.config(), num_blocks, block_size),
        }
    }

    /// See [`crate::LlamaModel::weight_bytes_per_token`].
    pub fn weight_bytes_per_token(&self) -> usize {
        match self {
            Model::Cpu(m) => m.weight_bytes_per_token(),
            Model::Gpu(m) => m.weight_bytes_per_token(),
        }
    }

    /// See [`crate::LlamaModel::forward`].
    pub fn forward(&mut self, batch: &ForwardBatch, kv: &mut KvCache) -> Result<&[f32]> {
        match self {
            Model::Cpu(m) => m.forward(batch, kv),
            Model::Gpu(m) => m.forward(batch, kv),
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
        Device::Cuda(n) => Gpu::cuda(n)?,
        Device::Interpreted => Gpu::interpreted(&InterpreterConfig::from_env())?,
    };
    if opts.pool.is_some() || opts.num_threads.is_some() {
        return Err(ModelError::Invalid(format!(
            "a model on {device} does not take compute threads; leave them unset"
        )));
    }
    Ok(Model::Gpu(load_model_on_gpu(
        path,
        opts,
        SharedGpu::new(gpu),
    )?))
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
    FamilyModel::load_with(config, &src, CudaBackend::new(gpu))
}

/// Opens `path` (a Hugging Face folder or a `.gguf` file) and builds its model.
pub fn load_model(path: &Path, opts: &LoadOptions) -> Result<Model> {
    let src = WeightSource::open(path)?;
    let mut config = load_config(&src)?;
    config.kv_cache_dtype = resolve_kv_dtype(&src, &config, opts);
    let pool = compute_pool(path, opts)?;
    let backend = CpuBackend::new(pool, Linear::new(opts.precision));
    Ok(Model::Cpu(FamilyModel::load_with(config, &src, backend)?))
}
