//! The typed model config, read from a Hugging Face `config.json` (both the older keys
//! `rope_theta` / `rope_scaling` / `torch_dtype` and transformers-5's `rope_parameters` / `dtype`)
//! or from GGUF metadata (`<arch>.*` keys). Every key is type-checked and a wrong type or value
//! names the key. Defaults are those of transformers' config classes.

use crate::gguf::{GgufFile, GgufValue};
use crate::registry::{self, ArchSpec};
use crate::{ModelError, Result};
use ferrum_runtime::cpu::{KvDtype, RopeScaling, MAX_HEAD_DIM};
use ferrum_runtime::DType;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// Everything a model family needs to build itself.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The architecture name as written in the file.
    pub architecture: String,
    pub spec: ArchSpec,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    pub max_position_embeddings: usize,
    /// Sliding-window size per layer (`None`: full attention).
    pub layer_sliding_window: Vec<Option<usize>>,
    pub tie_word_embeddings: bool,
    /// q/k/v projections have a bias.
    pub attention_bias: bool,
    /// Stored dtype named by the config, if any (informational).
    pub dtype: Option<String>,
    /// Half-precision type the reference implementation keeps RoPE frequencies in: the
    /// checkpoint's dtype when that is bf16 or f16 (see `ferrum_runtime::cpu::Rope`).
    pub rope_table_dtype: Option<DType>,
    /// Element type of the KV cache built for this model: f32 as read from a file, set at
    /// load from `LoadOptions::kv_cache_dtype` (see [`crate::resolve_kv_dtype`]).
    pub kv_cache_dtype: KvDtype,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

/// Typed access to a JSON object with errors naming the key.
struct Keys<'a> {
    path: &'a Path,
    obj: &'a Map<String, Value>,
}

impl Keys<'_> {
    fn err(&self, key: &str, msg: impl Into<String>) -> ModelError {
        ModelError::Config {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            msg: msg.into(),
        }
    }

    fn present(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn usize(&self, key: &str) -> Result<Option<usize>> {
        match self.present(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.err(key, format!("must be a non-negative integer, found {v}"))),
        }
    }

    fn req_usize(&self, key: &str) -> Result<usize> {
        self.usize(key)?.ok_or_else(|| self.err(key, "is missing"))
    }

    fn f64(&self, key: &str) -> Result<Option<f64>> {
        match self.present(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(key, format!("must be a number, found {v}"))),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.present(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(key, format!("must be true or false, found {v}"))),
        }
    }

    fn str(&self, key: &str) -> Result<Option<&str>> {
        match self.present(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(key, format!("must be a string, found {v}"))),
        }
    }

    fn obj(&self, key: &str) -> Result<Option<Keys<'_>>> {
        match self.present(key) {
            None => Ok(None),
            Some(Value::Object(o)) => Ok(Some(Keys {
                path: self.path,
                obj: o,
            })),
            Some(v) => Err(self.err(key, format!("must be an object, found {v}"))),
        }
    }

    /// An id or a list of ids (`eos_token_id` may be either).
    fn ids(&self, key: &str) -> Result<Vec<u32>> {
        let bad = || self.err(key, "must be a token id or a list of token ids");
        let one = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
        match self.present(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a.iter().map(|v| one(v).ok_or_else(bad)).collect(),
            Some(v) => Ok(vec![one(v).ok_or_else(bad)?]),
        }
    }
}

impl ModelConfig {
    /// Reads `config.json` of a Hugging Face folder.
    pub fn from_hf_file(path: &Path) -> Result<ModelConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| ModelError::format(path, format!("not valid JSON: {e}")))?;
        ModelConfig::from_hf_json(path, &v)
    }

    /// Builds the config from a parsed `config.json` (`path` is used in errors).
    pub fn from_hf_json(path: &Path, v: &Value) -> Result<ModelConfig> {
        let Value::Object(obj) = v else {
            return Err(ModelError::format(path, "config is not a JSON object"));
        };
        let k = Keys { path, obj };
        let arch = match k.present("architectures") {
            Some(Value::Array(a)) if !a.is_empty() => a[0]
                .as_str()
                .ok_or_else(|| k.err("architectures", "must be a list of strings"))?,
            Some(_) => return Err(k.err("architectures", "must be a non-empty list of strings")),
            None => return Err(k.err("architectures", "is missing")),
        };
        let spec = registry::lookup_hf(arch).ok_or_else(|| ModelError::UnknownArchitecture {
            path: path.to_path_buf(),
            name: arch.to_string(),
            supported: registry::hf_names(),
        })?;
        let hidden_size = k.req_usize("hidden_size")?;
        let num_attention_heads = k.req_usize("num_attention_heads")?;
        let num_hidden_layers = max_layers(k.req_usize("num_hidden_layers")?, MAX_LAYERS)
            .ok_or_else(|| k.err("num_hidden_layers", too_many_layers(MAX_LAYERS)))?;
        let head_dim = match k.usize("head_dim")? {
            Some(h) => h,
            None if num_attention_heads > 0 && hidden_size % num_attention_heads == 0 => {
                hidden_size / num_attention_heads
            }
            None => {
                return Err(k.err(
                    "num_attention_heads",
                    "does not divide hidden_size and no head_dim is given",
                ))
            }
        };
        let (rope_theta, rope_scaling) = hf_rope(&k)?;
        let sliding = k.usize("sliding_window")?;
        let layer_sliding_window = if spec.sliding_window_all_layers {
            vec![sliding; num_hidden_layers]
        } else if spec.sliding_window_by_layer_types {
            hf_layer_windows(&k, sliding, num_hidden_layers)?
        } else {
            vec![None; num_hidden_layers]
        };
        let dtype = match k.str("dtype")? {
            Some(d) => Some(d.to_string()),
            None => k.str("torch_dtype")?.map(str::to_string),
        };
        let rope_table_dtype = match dtype.as_deref() {
            Some("bfloat16") => Some(DType::BF16),
            Some("float16") => Some(DType::F16),
            _ => None,
        };
        let cfg = ModelConfig {
            architecture: arch.to_string(),
            spec,
            vocab_size: k.req_usize("vocab_size")?,
            hidden_size,
            intermediate_size: k.req_usize("intermediate_size")?,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: k
                .usize("num_key_value_heads")?
                .unwrap_or(num_attention_heads),
            head_dim,
            rms_norm_eps: k.f64("rms_norm_eps")?.unwrap_or(1e-6) as f32,
            rope_theta,
            rope_scaling,
            max_position_embeddings: k.usize("max_position_embeddings")?.unwrap_or(2048),
            layer_sliding_window,
            tie_word_embeddings: k.bool("tie_word_embeddings")?.unwrap_or(false),
            attention_bias: spec.qkv_bias || k.bool("attention_bias")?.unwrap_or(false),
            dtype,
            rope_table_dtype,
            kv_cache_dtype: KvDtype::F32,
            bos_token_id: k.ids("bos_token_id")?.first().copied(),
            eos_token_ids: k.ids("eos_token_id")?,
        };
        cfg.validate(path)?;
        Ok(cfg)
    }

    /// Builds the config from GGUF metadata. `vocab_size` falls back to the embedding's rows.
    pub fn from_gguf(g: &GgufFile) -> Result<ModelConfig> {
        let path = g.path();
        let err = |key: &str, msg: String| ModelError::Config {
            path: path.to_path_buf(),
            key: key.to_string(),
            msg,
        };
        let arch_key = "general.architecture";
        let arch = g
            .get_as(arch_key, "a string", GgufValue::as_str)?
            .ok_or_else(|| err(arch_key, "is missing".into()))?;
        let spec = registry::lookup_gguf(arch).ok_or_else(|| ModelError::UnknownArchitecture {
            path: path.to_path_buf(),
            name: arch.to_string(),
            supported: registry::gguf_names(),
        })?;
        let uint = |suffix: &str| -> Result<Option<usize>> {
            g.get_as(&format!("{arch}.{suffix}"), "a non-negative integer", |v| {
                v.as_u64().and_then(|n| usize::try_from(n).ok())
            })
        };
        let req = |suffix: &str| -> Result<usize> {
            uint(suffix)?.ok_or_else(|| err(&format!("{arch}.{suffix}"), "is missing".into()))
        };
        let float = |suffix: &str| -> Result<Option<f64>> {
            g.get_as(&format!("{arch}.{suffix}"), "a number", GgufValue::as_f64)
        };
        let token_id = |key: &str| -> Result<Option<u32>> {
            g.get_as(key, "a token id", |v| {
                v.as_u64().and_then(|n| u32::try_from(n).ok())
            })
        };
        let hidden_size = req("embedding_length")?;
        let num_attention_heads = req("attention.head_count")?;
        // Every layer has tensors: a count beyond the file's tensors (or MAX_LAYERS) is a
        // broken header, refused before anything is sized by it.
        let limit = MAX_LAYERS.min(g.tensor_infos().len());
        let num_hidden_layers =
            max_layers(req("block_count")?, limit).ok_or_else(|| ModelError::Config {
                path: path.to_path_buf(),
                key: format!("{arch}.block_count"),
                msg: too_many_layers(limit),
            })?;
        let head_dim = match uint("attention.key_length")? {
            Some(h) => h,
            None if num_attention_heads > 0 && hidden_size % num_attention_heads == 0 => {
                hidden_size / num_attention_heads
            }
            None => {
                return Err(err(
                    &format!("{arch}.attention.head_count"),
                    "does not divide embedding_length and no key_length is given".into(),
                ))
            }
        };
        if let Some(rot) = uint("rope.dimension_count")? {
            if rot != head_dim {
                return Err(err(
                    &format!("{arch}.rope.dimension_count"),
                    format!("partial rotary ({rot} of {head_dim} dims) is not supported"),
                ));
            }
        }
        let vocab_size = match uint("vocab_size")? {
            Some(v) => v,
            None => match g.tensor_info("token_embd.weight") {
                Some(t) if t.shape.len() == 2 => t.shape[0],
                _ => return Err(err(&format!("{arch}.vocab_size"), "is missing".into())),
            },
        };
        let rope_scaling = match g.get(&format!("{arch}.rope.scaling.type")) {
            None => RopeScaling::None,
            Some(v) => match v.as_str() {
                Some("none") => RopeScaling::None,
                Some("linear") => RopeScaling::Linear {
                    factor: float("rope.scaling.factor")?.unwrap_or(1.0) as f32,
                },
                other => {
                    return Err(err(
                        &format!("{arch}.rope.scaling.type"),
                        format!("rope scaling {other:?} is not supported (none, linear)"),
                    ))
                }
            },
        };
        let window = uint("attention.sliding_window")?;
        // llama.cpp's `general.file_type`: 1 = mostly F16, 32 = mostly BF16.
        let rope_table_dtype = match g.get("general.file_type").and_then(GgufValue::as_u64) {
            Some(1) => Some(DType::F16),
            Some(32) => Some(DType::BF16),
            _ => None,
        };
        let eos = token_id("tokenizer.ggml.eos_token_id")?;
        let cfg = ModelConfig {
            architecture: arch.to_string(),
            spec,
            vocab_size,
            hidden_size,
            intermediate_size: req("feed_forward_length")?,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: uint("attention.head_count_kv")?.unwrap_or(num_attention_heads),
            head_dim,
            rms_norm_eps: float("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5) as f32,
            rope_theta: float("rope.freq_base")?.unwrap_or(10000.0) as f32,
            rope_scaling,
            max_position_embeddings: uint("context_length")?.unwrap_or(2048),
            layer_sliding_window: vec![window; num_hidden_layers],
            tie_word_embeddings: g.tensor_info("output.weight").is_none(),
            attention_bias: g.tensor_info("blk.0.attn_q.bias").is_some(),
            dtype: None,
            rope_table_dtype,
            kv_cache_dtype: KvDtype::F32,
            bos_token_id: token_id("tokenizer.ggml.bos_token_id")?,
            eos_token_ids: eos.into_iter().collect(),
        };
        cfg.validate(path)?;
        Ok(cfg)
    }

    fn validate(&self, path: &Path) -> Result<()> {
        debug_assert!(self.num_hidden_layers <= MAX_LAYERS);
        let err = |key: &str, msg: &str| ModelError::Config {
            path: PathBuf::from(path),
            key: key.to_string(),
            msg: msg.to_string(),
        };
        for (key, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
        ] {
            if v == 0 {
                return Err(err(key, "must be positive"));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(err(
                "num_key_value_heads",
                "must divide num_attention_heads (grouped-query attention)",
            ));
        }
        if !self.head_dim.is_multiple_of(2) || self.head_dim > MAX_HEAD_DIM {
            return Err(err("head_dim", "must be even and at most 512"));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return Err(err("rms_norm_eps", "must be a non-negative number"));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(err("rope_theta", "must be a positive number"));
        }
        if self.layer_sliding_window.contains(&Some(0)) {
            return Err(err("sliding_window", "must be positive"));
        }
        Ok(())
    }
}

/// The most layers a config may declare (the largest open models have under 200).
pub const MAX_LAYERS: usize = 1024;

fn max_layers(n: usize, limit: usize) -> Option<usize> {
    (n <= limit).then_some(n)
}

fn too_many_layers(limit: usize) -> String {
    format!("is larger than this file can hold (at most {limit} layers)")
}

/// RoPE base and scaling from either key style.
fn hf_rope(k: &Keys<'_>) -> Result<(f32, RopeScaling)> {
    // transformers 5: everything under `rope_parameters`; older: `rope_theta` + `rope_scaling`.
    let params = k.obj("rope_parameters")?;
    let scaling = match &params {
        Some(p) => Some(Keys {
            path: p.path,
            obj: p.obj,
        }),
        None => k.obj("rope_scaling")?,
    };
    let theta = match &params {
        Some(p) => p.f64("rope_theta")?,
        None => None,
    };
    let theta = match theta {
        Some(t) => t,
        None => k.f64("rope_theta")?.unwrap_or(10000.0),
    } as f32;
    let Some(s) = scaling else {
        return Ok((theta, RopeScaling::None));
    };
    let ty = match s.str("rope_type")? {
        Some(t) => Some(t),
        None => s.str("type")?,
    };
    let factor = |s: &Keys<'_>| -> Result<f32> {
        let f = s
            .f64("factor")?
            .ok_or_else(|| s.err("factor", "is missing"))?;
        if f > 0.0 && f.is_finite() {
            Ok(f as f32)
        } else {
            Err(s.err("factor", "must be a positive number"))
        }
    };
    let scaling = match ty.unwrap_or("default") {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: factor(&s)?,
        },
        "llama3" => {
            let num = |key: &str| -> Result<f32> {
                s.f64(key)?
                    .map(|v| v as f32)
                    .ok_or_else(|| s.err(key, "is missing (needed by llama3 rope scaling)"))
            };
            let low = num("low_freq_factor")?;
            let high = num("high_freq_factor")?;
            if high <= low {
                return Err(s.err("high_freq_factor", "must exceed low_freq_factor"));
            }
            RopeScaling::Llama3 {
                factor: factor(&s)?,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: num("original_max_position_embeddings")?,
            }
        }
        other => {
            return Err(s.err(
                "rope_type",
                format!("`{other}` is not supported (default, linear, llama3)"),
            ))
        }
    };
    Ok((theta, scaling))
}

/// Per-layer windows for Qwen-style configs: `layer_types` when present, else
/// `use_sliding_window` with `max_window_layers`.
fn hf_layer_windows(
    k: &Keys<'_>,
    window: Option<usize>,
    num_layers: usize,
) -> Result<Vec<Option<usize>>> {
    if let Some(v) = k.present("layer_types") {
        let types = v
            .as_array()
            .filter(|a| a.len() == num_layers)
            .ok_or_else(|| k.err("layer_types", "must list one type per layer"))?;
        return types
            .iter()
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(None),
                Some("sliding_attention") => window.map(Some).ok_or_else(|| {
                    k.err("sliding_window", "is needed by sliding_attention layers")
                }),
                _ => Err(k.err("layer_types", format!("unknown layer type {t}"))),
            })
            .collect();
    }
    if !k.bool("use_sliding_window")?.unwrap_or(false) {
        return Ok(vec![None; num_layers]);
    }
    let from = k.usize("max_window_layers")?.unwrap_or(num_layers);
    Ok((0..num_layers)
        .map(|i| if i >= from { window } else { None })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "architectures": ["LlamaForCausalLM"], "vocab_size": 10, "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
        })
    }

    #[test]
    fn both_rope_key_styles() {
        let mut old = base();
        old["rope_theta"] = json!(500000.0);
        old["rope_scaling"] = json!({"rope_type": "linear", "factor": 2.0});
        let c = ModelConfig::from_hf_json(Path::new("c.json"), &old).unwrap();
        assert_eq!(c.rope_theta, 500000.0);
        assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 2.0 });
        let mut new = base();
        new["rope_parameters"] = json!({"rope_theta": 1e6, "rope_type": "default"});
        let c = ModelConfig::from_hf_json(Path::new("c.json"), &new).unwrap();
        assert_eq!(
            (c.rope_theta, c.head_dim, c.num_key_value_heads),
            (1e6, 4, 2)
        );
    }

    #[test]
    fn wrong_types_name_the_key() {
        let mut v = base();
        v["hidden_size"] = json!("eight");
        let e = ModelConfig::from_hf_json(Path::new("c.json"), &v).unwrap_err();
        assert!(e.to_string().contains("`hidden_size`"), "{e}");
        let mut v = base();
        v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0});
        let e = ModelConfig::from_hf_json(Path::new("c.json"), &v).unwrap_err();
        assert!(e.to_string().contains("yarn"), "{e}");
        let mut v = base();
        v["num_key_value_heads"] = json!(3);
        assert!(ModelConfig::from_hf_json(Path::new("c.json"), &v).is_err());
    }

    #[test]
    fn qwen_layer_types_select_windows() {
        let mut v = base();
        v["architectures"] = json!(["Qwen2ForCausalLM"]);
        v["sliding_window"] = json!(4);
        v["layer_types"] = json!(["full_attention", "sliding_attention"]);
        let c = ModelConfig::from_hf_json(Path::new("c.json"), &v).unwrap();
        assert_eq!(c.layer_sliding_window, vec![None, Some(4)]);
        assert!(c.attention_bias);
    }
}
