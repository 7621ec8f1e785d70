//! Model loading and execution: Hugging Face folders (config.json + safetensors) and GGUF files,
//! typed model configs, the physical paged KV cache, and the model families (one file each)
//! behind a registry keyed by architecture name.
//!
//! Entry points: [`load_model`] opens a path and returns a ready [`Model`]; [`Model::forward`]
//! runs one [`ForwardBatch`] over a [`KvCache`]; [`inspect`] describes a model without building
//! it.

mod argmax;
pub mod backend;
mod config;
mod error;
mod family;
mod file_map;
mod gemma;
mod gguf;
mod identity;
mod inspect;
mod kv_cache;
mod kv_copy;
mod llama;
mod loader;
pub mod moe;
pub mod parallel;
mod registry;
mod safetensors;
pub mod sampling;
mod source;
mod text;
mod weights;

pub use argmax::argmax;
pub use config::{ModelConfig, MoeConfig};
pub use error::{ModelError, Result};
pub use family::FamilyModel;
pub use ferrum_types::{ForwardBatch, SeqSlice};
pub use gemma::GemmaModel;
pub use gguf::{GgufArray, GgufFile, GgufStrings, GgufValue};
pub use identity::weights_identity;
pub use inspect::{inspect, DTypeSummary, ModelInfo};
pub use kv_cache::KvCache;
pub use kv_copy::{BlockCopy, HostBlock};
pub use llama::LlamaModel;
pub use loader::{
    load_model, load_model_on, load_model_on_gpu, load_model_sharded, resolve_kv_dtype, CudaGraphs,
    GemmChoice, LoadOptions, Model, StepRows,
};
pub use registry::{ArchSpec, Family, MoeStyle};
pub use safetensors::SafetensorsFile;
pub use source::{ModelFormat, WeightSource};
pub use text::{gguf_vocab, load_text_assets, load_text_assets_with};
