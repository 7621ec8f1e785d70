//! Where weights come from: a Hugging Face folder (one or several safetensors shards) or a GGUF
//! file. Both hand out [`Tensor`]s by name, mapped and in their stored format.

use crate::gguf::GgufFile;
use crate::safetensors::SafetensorsFile;
use crate::{ModelError, Result};
use ferrum_runtime::Tensor;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The on-disk format of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFormat {
    /// A folder with config.json and safetensors.
    HfFolder,
    /// A single GGUF file.
    Gguf,
}

/// A tensor's description, for listings.
#[derive(Debug, Clone)]
pub struct TensorDesc {
    pub name: String,
    /// dtype or quant type name as stored (`BF16`, `Q4_1`, ...).
    pub dtype: String,
    pub shape: Vec<usize>,
    /// Bytes as stored; `None` for a type Ferrum cannot size.
    pub num_bytes: Option<usize>,
}

/// An opened model file or folder.
#[derive(Debug)]
pub enum WeightSource {
    HfFolder {
        dir: PathBuf,
        /// Shards, and which shard holds each tensor.
        shards: Vec<SafetensorsFile>,
        index: BTreeMap<String, usize>,
    },
    Gguf(GgufFile),
}

impl WeightSource {
    /// Opens a model folder or a `.gguf` file.
    pub fn open(path: &Path) -> Result<WeightSource> {
        let meta = std::fs::metadata(path).map_err(|e| ModelError::io(path, e))?;
        if meta.is_dir() {
            return open_folder(path);
        }
        let mut magic = [0u8; 4];
        let is_gguf = std::fs::File::open(path)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
            .is_ok()
            && &magic == b"GGUF";
        if is_gguf || path.extension().is_some_and(|e| e == "gguf") {
            return Ok(WeightSource::Gguf(GgufFile::open(path)?));
        }
        Err(ModelError::NotAModel {
            path: path.to_path_buf(),
            msg: "not a model folder (config.json + *.safetensors) or a GGUF file".into(),
        })
    }

    pub fn format(&self) -> ModelFormat {
        match self {
            WeightSource::HfFolder { .. } => ModelFormat::HfFolder,
            WeightSource::Gguf(_) => ModelFormat::Gguf,
        }
    }

    /// The folder or file this source was opened from.
    pub fn path(&self) -> &Path {
        match self {
            WeightSource::HfFolder { dir, .. } => dir,
            WeightSource::Gguf(g) => g.path(),
        }
    }

    /// Whether a tensor of that name exists.
    pub fn contains(&self, name: &str) -> bool {
        match self {
            WeightSource::HfFolder { index, .. } => index.contains_key(name),
            WeightSource::Gguf(g) => g.tensor_info(name).is_some(),
        }
    }

    /// A tensor by its stored name.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        match self {
            WeightSource::HfFolder { dir, shards, index } => index
                .get(name)
                .and_then(|&i| shards[i].tensor(name))
                .unwrap_or_else(|| {
                    Err(ModelError::MissingTensor {
                        path: dir.clone(),
                        name: name.to_string(),
                    })
                }),
            WeightSource::Gguf(g) => g.tensor(name),
        }
    }

    /// Every tensor, in a stable order.
    pub fn tensors(&self) -> Vec<TensorDesc> {
        match self {
            WeightSource::HfFolder { shards, index, .. } => index
                .iter()
                .filter_map(|(name, &i)| {
                    let e = shards[i].entries().get(name)?;
                    Some(TensorDesc {
                        name: name.clone(),
                        dtype: e.dtype.clone(),
                        shape: e.shape.clone(),
                        num_bytes: Some(e.end - e.start),
                    })
                })
                .collect(),
            WeightSource::Gguf(g) => g
                .tensor_infos()
                .iter()
                .map(|t| TensorDesc {
                    name: t.name.clone(),
                    dtype: ferrum_runtime::DType::ggml_name(t.ggml_type).to_string(),
                    shape: t.shape.clone(),
                    num_bytes: t.num_bytes,
                })
                .collect(),
        }
    }
}

fn open_folder(dir: &Path) -> Result<WeightSource> {
    let index_path = dir.join("model.safetensors.index.json");
    let files: Vec<PathBuf> = if index_path.is_file() {
        let text =
            std::fs::read_to_string(&index_path).map_err(|e| ModelError::io(&index_path, e))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| ModelError::format(&index_path, format!("not valid JSON: {e}")))?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| ModelError::Config {
                path: index_path.clone(),
                key: "weight_map".into(),
                msg: "missing or not an object".into(),
            })?;
        let mut names: Vec<&str> = Vec::new();
        for (tensor, file) in map {
            let file = file.as_str().ok_or_else(|| ModelError::Config {
                path: index_path.clone(),
                key: format!("weight_map.{tensor}"),
                msg: "must be a file name".into(),
            })?;
            if file.contains('/') || file.contains('\\') || file.starts_with('.') {
                return Err(ModelError::Config {
                    path: index_path.clone(),
                    key: format!("weight_map.{tensor}"),
                    msg: format!("`{file}` is not a plain file name in the folder"),
                });
            }
            if !names.contains(&file) {
                names.push(file);
            }
        }
        names.sort_unstable();
        names.into_iter().map(|n| dir.join(n)).collect()
    } else {
        let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| ModelError::io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors") && p.is_file())
            .collect();
        found.sort();
        found
    };
    if files.is_empty() {
        return Err(ModelError::NotAModel {
            path: dir.to_path_buf(),
            msg: "the folder has no *.safetensors weights".into(),
        });
    }
    let mut shards = Vec::with_capacity(files.len());
    let mut index = BTreeMap::new();
    for f in files {
        let shard = SafetensorsFile::open(&f)?;
        for name in shard.entries().keys() {
            if index.insert(name.clone(), shards.len()).is_some() {
                return Err(ModelError::format(
                    &f,
                    format!("tensor `{name}` appears in more than one shard"),
                ));
            }
        }
        shards.push(shard);
    }
    Ok(WeightSource::HfFolder {
        dir: dir.to_path_buf(),
        shards,
        index,
    })
}
