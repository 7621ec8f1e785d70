//! A model's description without building it: architecture, sizes, tensor types and what text
//! assets (tokenizer, chat template) come with it.

use crate::loader::load_config;
use crate::source::{ModelFormat, WeightSource};
use crate::{ModelConfig, Result};
use std::collections::BTreeMap;
use std::path::Path;

/// Tensors of one stored type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DTypeSummary {
    pub dtype: String,
    pub num_tensors: usize,
    pub num_params: u64,
    /// `None` when the type cannot be sized (unsupported quant type).
    pub num_bytes: Option<u64>,
}

/// What `ferrum inspect` reports.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub format: ModelFormat,
    pub config: ModelConfig,
    pub num_params: u64,
    pub num_bytes: u64,
    pub num_tensors: usize,
    pub dtypes: Vec<DTypeSummary>,
    pub has_tokenizer: bool,
    pub has_chat_template: bool,
    /// GGUF version, for GGUF files.
    pub gguf_version: Option<u32>,
}

/// Describes the model at `path`.
pub fn inspect(path: &Path) -> Result<ModelInfo> {
    let src = WeightSource::open(path)?;
    let config = load_config(&src)?;
    let tensors = src.tensors();
    let mut by_type: BTreeMap<String, DTypeSummary> = BTreeMap::new();
    for t in &tensors {
        let numel: u64 = t.shape.iter().map(|&d| d as u64).product();
        let e = by_type.entry(t.dtype.clone()).or_insert(DTypeSummary {
            dtype: t.dtype.clone(),
            num_tensors: 0,
            num_params: 0,
            num_bytes: Some(0),
        });
        e.num_tensors += 1;
        e.num_params += numel;
        e.num_bytes = e.num_bytes.zip(t.num_bytes).map(|(a, b)| a + b as u64);
    }
    let (has_tokenizer, has_chat_template, gguf_version) = match &src {
        WeightSource::HfFolder { dir, .. } => (
            dir.join("tokenizer.json").is_file(),
            dir.join("chat_template.jinja").is_file()
                || dir.join("chat_template.json").is_file()
                || tokenizer_config_has_template(&dir.join("tokenizer_config.json")),
            None,
        ),
        WeightSource::Gguf(g) => (
            g.get("tokenizer.ggml.model").is_some() && g.get("tokenizer.ggml.tokens").is_some(),
            g.get("tokenizer.chat_template").is_some(),
            Some(g.version()),
        ),
    };
    Ok(ModelInfo {
        format: src.format(),
        num_params: by_type.values().map(|d| d.num_params).sum(),
        num_bytes: by_type.values().filter_map(|d| d.num_bytes).sum(),
        num_tensors: tensors.len(),
        dtypes: by_type.into_values().collect(),
        config,
        has_tokenizer,
        has_chat_template,
        gguf_version,
    })
}

fn tokenizer_config_has_template(path: &Path) -> bool {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .is_some_and(|v| v.get("chat_template").is_some_and(|c| !c.is_null()))
}
