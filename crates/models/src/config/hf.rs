//! The Hugging Face `config.json` reader: a serde type ([`HfConfig`]) for the keys Ferrum
//! uses, read through `serde_path_to_error`, then turned into a [`ModelConfig`].
//!
//! Invariants:
//! - Both key styles are read: the older `rope_theta` / `rope_scaling` / `torch_dtype` and
//!   transformers-5's `rope_parameters` / `dtype` (the newer wins where both are present).
//! - A key of the wrong type is an error naming the key (its path, for nested keys such as
//!   `rope_scaling.factor`); `null` reads as absent; keys Ferrum does not use are ignored.
//! - Defaults are those of transformers' config classes.

use super::{max_layers, too_many_layers, ModelConfig, MAX_LAYERS};
use crate::registry;
use crate::{ModelError, Result};
use ferrum_runtime::cpu::{GatedAct, KvDtype, RopeScaling};
use ferrum_runtime::DType;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use std::path::Path;

/// The keys of `config.json` that Ferrum reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(expecting = "an object")]
pub struct HfConfig {
    /// The first entry names the architecture.
    pub architectures: Option<Value>,
    pub vocab_size: Option<Uint>,
    pub hidden_size: Option<Uint>,
    pub intermediate_size: Option<Uint>,
    pub num_hidden_layers: Option<Uint>,
    pub num_attention_heads: Option<Uint>,
    /// Defaults to `num_attention_heads`.
    pub num_key_value_heads: Option<Uint>,
    /// Defaults to `hidden_size / num_attention_heads`.
    pub head_dim: Option<Uint>,
    pub rms_norm_eps: Option<Float>,
    pub rope_theta: Option<Float>,
    pub rope_scaling: Option<RopeParams>,
    /// transformers 5: `rope_theta` and the scaling together.
    pub rope_parameters: Option<RopeParams>,
    pub max_position_embeddings: Option<Uint>,
    pub sliding_window: Option<Uint>,
    /// Qwen-style per-layer attention: `full_attention` or `sliding_attention` per layer.
    pub layer_types: Option<Value>,
    pub use_sliding_window: Option<Bool>,
    pub max_window_layers: Option<Uint>,
    pub tie_word_embeddings: Option<Bool>,
    pub attention_bias: Option<Bool>,
    pub dtype: Option<Str>,
    pub torch_dtype: Option<Str>,
    pub bos_token_id: Option<Ids>,
    pub eos_token_id: Option<Ids>,
    /// Gemma: scores are scaled by `query_pre_attn_scalar^-1/2`.
    pub query_pre_attn_scalar: Option<Float>,
    pub attn_logit_softcapping: Option<Float>,
    pub final_logit_softcapping: Option<Float>,
    /// Gemma 3: the sliding layers' RoPE base.
    pub rope_local_base_freq: Option<Float>,
    /// Gemma 3 without `layer_types`: every n-th layer is global.
    pub sliding_window_pattern: Option<Uint>,
    /// Phi-3: the share of each head that is rotated.
    pub partial_rotary_factor: Option<Float>,
    /// Phi-3: the context the model was trained with (LongRoPE's switch to its long factors).
    pub original_max_position_embeddings: Option<Uint>,
    /// Mixture of experts: Mixtral's and the others' names for the count, experts per token,
    /// an expert's size (else `intermediate_size`), the shared expert (Qwen2-MoE),
    /// renormalising the chosen weights, and which layers keep a dense MLP.
    pub num_local_experts: Option<Uint>,
    pub num_experts: Option<Uint>,
    pub num_experts_per_tok: Option<Uint>,
    pub moe_intermediate_size: Option<Uint>,
    pub shared_expert_intermediate_size: Option<Uint>,
    pub norm_topk_prob: Option<Bool>,
    pub decoder_sparse_step: Option<Uint>,
    pub mlp_only_layers: Option<Vec<Uint>>,
    /// The MLP's activation (Gemma's name, preferred) and the common name.
    pub hidden_activation: Option<Str>,
    pub hidden_act: Option<Str>,
}

/// `rope_scaling` or `rope_parameters`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(expecting = "an object")]
pub struct RopeParams {
    pub rope_theta: Option<Float>,
    pub rope_type: Option<Str>,
    /// The older name of `rope_type`.
    #[serde(rename = "type")]
    pub kind: Option<Str>,
    pub factor: Option<Float>,
    pub low_freq_factor: Option<Float>,
    pub high_freq_factor: Option<Float>,
    pub original_max_position_embeddings: Option<Float>,
    /// LongRoPE (`longrope`, formerly `su`): per-pair divisors within and beyond the original
    /// context, and the factor on cosine and sine.
    pub short_factor: Option<Vec<Float>>,
    pub long_factor: Option<Vec<Float>>,
    pub attention_factor: Option<Float>,
    /// transformers 5, families with local and global layers: parameters per layer type.
    pub full_attention: Option<Box<RopeParams>>,
    pub sliding_attention: Option<Box<RopeParams>>,
}

/// A non-negative integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uint(pub usize);

impl<'de> Deserialize<'de> for Uint {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        v.as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Uint)
            .ok_or_else(|| D::Error::custom(format!("must be a non-negative integer, found {v}")))
    }
}

/// A number.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Float(pub f64);

impl<'de> Deserialize<'de> for Float {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        v.as_f64()
            .map(Float)
            .ok_or_else(|| D::Error::custom(format!("must be a number, found {v}")))
    }
}

/// `true` or `false`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bool(pub bool);

impl<'de> Deserialize<'de> for Bool {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        v.as_bool()
            .map(Bool)
            .ok_or_else(|| D::Error::custom(format!("must be true or false, found {v}")))
    }
}

/// A string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Str(pub String);

impl<'de> Deserialize<'de> for Str {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) => Ok(Str(s)),
            v => Err(D::Error::custom(format!("must be a string, found {v}"))),
        }
    }
}

/// A token id or a list of them (`eos_token_id` may be either).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ids(pub Vec<u32>);

impl<'de> Deserialize<'de> for Ids {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let bad = || D::Error::custom("must be a token id or a list of token ids");
        let one = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
        match Value::deserialize(d)? {
            Value::Array(a) => a
                .iter()
                .map(|v| one(v).ok_or_else(bad))
                .collect::<std::result::Result<_, _>>()
                .map(Ids),
            v => Ok(Ids(vec![one(&v).ok_or_else(bad)?])),
        }
    }
}

fn key_err(path: &Path, key: &str, msg: impl Into<String>) -> ModelError {
    ModelError::Config {
        path: path.to_path_buf(),
        key: key.to_string(),
        msg: msg.into(),
    }
}

impl HfConfig {
    /// Reads a parsed `config.json` (`path` is used in errors).
    pub fn from_json(path: &Path, v: &Value) -> Result<HfConfig> {
        if !v.is_object() {
            return Err(ModelError::format(path, "config is not a JSON object"));
        }
        serde_path_to_error::deserialize(v).map_err(|e| {
            let inner = e.inner().to_string();
            // A derived object met with another type: name what was found, as the leaves do.
            let msg = match inner
                .strip_prefix("invalid type: ")
                .and_then(|rest| rest.rsplit_once(", expected "))
            {
                Some((_, want)) => match value_at(v, e.path()) {
                    Some(found) => format!("must be {want}, found {found}"),
                    None => format!("must be {want}"),
                },
                None => inner,
            };
            key_err(path, &e.path().to_string(), msg)
        })
    }
}

/// The value at `path` in `v`, if there is one.
fn value_at<'a>(v: &'a Value, path: &serde_path_to_error::Path) -> Option<&'a Value> {
    use serde_path_to_error::Segment;
    path.iter().try_fold(v, |v, seg| match seg {
        Segment::Seq { index } => v.get(*index),
        Segment::Map { key } => v.get(key.as_str()),
        Segment::Enum { .. } | Segment::Unknown => Some(v),
    })
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
        let c = HfConfig::from_json(path, v)?;
        let err = |key: &str, msg: &str| key_err(path, key, msg);
        let arch = match &c.architectures {
            Some(Value::Array(a)) if !a.is_empty() => a[0]
                .as_str()
                .ok_or_else(|| err("architectures", "must be a list of strings"))?,
            Some(_) => return Err(err("architectures", "must be a non-empty list of strings")),
            None => return Err(err("architectures", "is missing")),
        };
        let spec = registry::lookup_hf(arch).ok_or_else(|| ModelError::UnknownArchitecture {
            path: path.to_path_buf(),
            name: arch.to_string(),
            supported: registry::hf_names(),
        })?;
        let req =
            |key: &str, v: Option<Uint>| v.map(|Uint(n)| n).ok_or_else(|| err(key, "is missing"));
        let hidden_size = req("hidden_size", c.hidden_size)?;
        let num_attention_heads = req("num_attention_heads", c.num_attention_heads)?;
        let num_hidden_layers =
            max_layers(req("num_hidden_layers", c.num_hidden_layers)?, MAX_LAYERS)
                .ok_or_else(|| err("num_hidden_layers", &too_many_layers(MAX_LAYERS)))?;
        let head_dim = match c.head_dim {
            Some(Uint(h)) => h,
            None if num_attention_heads > 0 && hidden_size % num_attention_heads == 0 => {
                hidden_size / num_attention_heads
            }
            None => {
                return Err(err(
                    "num_attention_heads",
                    "does not divide hidden_size and no head_dim is given",
                ))
            }
        };
        let (rope_theta, rope_scaling) = rope(path, &c)?;
        let rotary_dim = match c.partial_rotary_factor {
            None => head_dim,
            Some(Float(f)) if f > 0.0 && f <= 1.0 => (head_dim as f64 * f) as usize,
            Some(_) => return Err(err("partial_rotary_factor", "must be in (0, 1]")),
        };
        let rope_local_theta = local_rope_theta(&c, spec.default_local_rope_theta);
        let sliding = c.sliding_window.map(|Uint(w)| w);
        let layer_sliding_window = if spec.sliding_window_all_layers {
            vec![sliding; num_hidden_layers]
        } else if spec.sliding_window_pattern > 0 {
            // Gemma: transformers' default window is 4096.
            let window = Some(sliding.unwrap_or(4096));
            match &c.layer_types {
                Some(v) => layer_types_windows(path, v, window, num_hidden_layers)?,
                None => {
                    let n = c
                        .sliding_window_pattern
                        .map_or(spec.sliding_window_pattern, |Uint(n)| n);
                    if n == 0 {
                        return Err(err("sliding_window_pattern", "must be positive"));
                    }
                    (0..num_hidden_layers)
                        .map(|i| if (i + 1) % n == 0 { None } else { window })
                        .collect()
                }
            }
        } else if spec.sliding_window_by_layer_types {
            layer_windows(path, &c, sliding, num_hidden_layers)?
        } else {
            vec![None; num_hidden_layers]
        };
        let moe = moe(path, &c, spec.moe, num_hidden_layers)?;
        let dtype = c.dtype.or(c.torch_dtype).map(|Str(d)| d);
        let rope_table_dtype = match dtype.as_deref() {
            _ if !spec.rope_in_checkpoint_dtype => None,
            Some("bfloat16") => Some(DType::BF16),
            Some("float16") => Some(DType::F16),
            _ => None,
        };
        let flag = |v: Option<Bool>| v.is_some_and(|Bool(b)| b);
        let float = |v: Option<Float>| v.map(|Float(x)| x as f32);
        let is_gemma = spec.family == registry::Family::Gemma;
        let act_key = if c.hidden_activation.is_some() {
            "hidden_activation"
        } else {
            "hidden_act"
        };
        let hidden_act = match c.hidden_activation.as_ref().or(c.hidden_act.as_ref()) {
            None if is_gemma => GatedAct::GeluTanh,
            None => GatedAct::Silu,
            Some(Str(a)) => match a.as_str() {
                "silu" | "swish" => GatedAct::Silu,
                "gelu_pytorch_tanh" | "gelu_tanh" | "gelu_new" => GatedAct::GeluTanh,
                other => {
                    return Err(err(
                        act_key,
                        &format!("`{other}` is not supported (silu, gelu_pytorch_tanh)"),
                    ))
                }
            },
        };
        let cfg = ModelConfig {
            architecture: arch.to_string(),
            spec,
            vocab_size: req("vocab_size", c.vocab_size)?,
            hidden_size,
            intermediate_size: req("intermediate_size", c.intermediate_size)?,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: c
                .num_key_value_heads
                .map_or(num_attention_heads, |Uint(n)| n),
            head_dim,
            rotary_dim,
            rms_norm_eps: c.rms_norm_eps.map_or(1e-6, |Float(e)| e) as f32,
            rope_theta,
            rope_scaling,
            max_position_embeddings: c.max_position_embeddings.map_or(2048, |Uint(n)| n),
            layer_sliding_window,
            // transformers' Gemma configs tie by default; the others do not.
            tie_word_embeddings: c.tie_word_embeddings.map_or(is_gemma, |Bool(b)| b),
            attention_bias: spec.qkv_bias || flag(c.attention_bias),
            // transformers' Gemma defaults: query_pre_attn_scalar 256; Gemma 2's soft-caps 50
            // (attention) and 30 (logits).
            attention_scale: is_gemma
                .then(|| float(c.query_pre_attn_scalar).unwrap_or(256.0))
                .map(|s| 1.0 / s.sqrt()),
            attn_logit_softcap: spec
                .attn_softcap
                .then(|| float(c.attn_logit_softcapping).unwrap_or(50.0)),
            final_logit_softcap: match float(c.final_logit_softcapping) {
                Some(cap) if is_gemma => Some(cap),
                None if spec.attn_softcap => Some(30.0),
                _ => None,
            },
            rope_local_theta,
            hidden_act,
            moe,
            dtype,
            rope_table_dtype,
            kv_cache_dtype: KvDtype::F32,
            bos_token_id: c.bos_token_id.and_then(|Ids(ids)| ids.first().copied()),
            eos_token_ids: c.eos_token_id.map(|Ids(ids)| ids).unwrap_or_default(),
        };
        cfg.validate(path)?;
        Ok(cfg)
    }
}

/// RoPE base and scaling from either key style.
fn rope(path: &Path, c: &HfConfig) -> Result<(f32, RopeScaling)> {
    // transformers 5: everything under `rope_parameters`; older: `rope_theta` + `rope_scaling`.
    // Families with local and global layers nest them by layer type; the global layers'
    // parameters are the model's rope (the local base is read by `local_rope_theta`).
    let params = c
        .rope_parameters
        .as_ref()
        .map(|p| p.full_attention.as_deref().unwrap_or(p));
    let (prefix, scaling) = match (params, &c.rope_scaling) {
        (Some(p), _)
            if c.rope_parameters
                .as_ref()
                .is_some_and(|q| q.full_attention.is_some()) =>
        {
            ("rope_parameters.full_attention", Some(p))
        }
        (Some(p), _) => ("rope_parameters", Some(p)),
        (None, s) => ("rope_scaling", s.as_ref()),
    };
    let theta = params
        .and_then(|p| p.rope_theta)
        .or(c.rope_theta)
        .map_or(10000.0, |Float(t)| t) as f32;
    let Some(s) = scaling else {
        return Ok((theta, RopeScaling::None));
    };
    let err = |key: &str, msg: String| key_err(path, &format!("{prefix}.{key}"), msg);
    let ty = s
        .rope_type
        .as_ref()
        .or(s.kind.as_ref())
        .map(|Str(t)| t.as_str());
    let factor = || -> Result<f32> {
        let Some(Float(f)) = s.factor else {
            return Err(err("factor", "is missing".into()));
        };
        if f > 0.0 && f.is_finite() {
            Ok(f as f32)
        } else {
            Err(err("factor", "must be a positive number".into()))
        }
    };
    let scaling = match ty.unwrap_or("default") {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: factor()? },
        "llama3" => {
            let num = |key: &str, v: Option<Float>| -> Result<f32> {
                v.map(|Float(x)| x as f32)
                    .ok_or_else(|| err(key, "is missing (needed by llama3 rope scaling)".into()))
            };
            let low = num("low_freq_factor", s.low_freq_factor)?;
            let high = num("high_freq_factor", s.high_freq_factor)?;
            if high <= low {
                return Err(err(
                    "high_freq_factor",
                    "must exceed low_freq_factor".into(),
                ));
            }
            RopeScaling::Llama3 {
                factor: factor()?,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: num(
                    "original_max_position_embeddings",
                    s.original_max_position_embeddings,
                )?,
            }
        }
        "longrope" | "su" => {
            let list = |key: &str, v: &Option<Vec<Float>>| -> Result<Vec<f32>> {
                v.as_ref()
                    .map(|l| l.iter().map(|Float(x)| *x as f32).collect())
                    .ok_or_else(|| err(key, "is missing (needed by longrope)".into()))
            };
            let orig = s
                .original_max_position_embeddings
                .map(|Float(x)| x)
                .or(c.original_max_position_embeddings.map(|Uint(n)| n as f64))
                .filter(|&n| n >= 1.0)
                .ok_or_else(|| {
                    key_err(
                        path,
                        "original_max_position_embeddings",
                        "is missing or not positive (needed by longrope)",
                    )
                })?;
            // transformers: the factor is the ratio of the context to the original one, and
            // the attention factor sqrt(1 + ln(factor) / ln(original)) unless given.
            let max_pos = c.max_position_embeddings.map_or(2048.0, |Uint(n)| n as f64);
            let factor = max_pos / orig;
            let attention_factor = match s.attention_factor {
                Some(Float(a)) => a,
                None if factor <= 1.0 => 1.0,
                None => (1.0 + factor.ln() / orig.ln()).sqrt(),
            };
            RopeScaling::LongRope {
                short_factor: list("short_factor", &s.short_factor)?,
                long_factor: list("long_factor", &s.long_factor)?,
                original_max_position_embeddings: orig as usize,
                attention_factor: attention_factor as f32,
            }
        }
        other => {
            return Err(err(
                "rope_type",
                format!("`{other}` is not supported (default, linear, llama3, longrope)"),
            ))
        }
    };
    Ok((theta, scaling))
}

/// The mixture-of-experts shape of `style`'s configs (transformers' defaults where a key is
/// absent).
fn moe(
    path: &Path,
    c: &HfConfig,
    style: Option<registry::MoeStyle>,
    num_layers: usize,
) -> Result<Option<super::MoeConfig>> {
    use registry::MoeStyle;
    let Some(style) = style else {
        return Ok(None);
    };
    let n = |v: Option<Uint>, default: usize| v.map_or(default, |Uint(x)| x);
    let inter = n(c.intermediate_size, 0);
    let (num_experts, expert_intermediate_size, norm_topk_prob, shared) = match style {
        MoeStyle::Mixtral => (n(c.num_local_experts, 8), inter, true, None),
        MoeStyle::Qwen => {
            let shared = if c.shared_expert_intermediate_size.is_some() {
                Some(n(c.shared_expert_intermediate_size, 0))
            } else {
                None
            };
            (
                n(c.num_experts, 64),
                n(c.moe_intermediate_size, inter),
                c.norm_topk_prob.is_some_and(|Bool(b)| b),
                shared,
            )
        }
    };
    let step = n(c.decoder_sparse_step, 1);
    if step == 0 {
        return Err(key_err(path, "decoder_sparse_step", "must be positive"));
    }
    let dense: Vec<usize> = c
        .mlp_only_layers
        .as_ref()
        .map(|l| l.iter().map(|Uint(i)| *i).collect())
        .unwrap_or_default();
    if let Some(&bad) = dense.iter().find(|&&i| i >= num_layers) {
        return Err(key_err(
            path,
            "mlp_only_layers",
            format!("names layer {bad} of {num_layers}"),
        ));
    }
    Ok(Some(super::MoeConfig {
        num_experts,
        top_k: n(c.num_experts_per_tok, 2),
        expert_intermediate_size,
        norm_topk_prob,
        shared_expert_intermediate_size: shared,
        layer_is_moe: (0..num_layers)
            .map(|i| !dense.contains(&i) && (i + 1) % step == 0)
            .collect(),
    }))
}

/// The sliding layers' RoPE base: `rope_parameters.sliding_attention.rope_theta`
/// (transformers 5), `rope_local_base_freq`, or the architecture's default; `None` when the
/// architecture has no separate local rope.
fn local_rope_theta(c: &HfConfig, default: u32) -> Option<f32> {
    if default == 0 {
        return None;
    }
    let nested = c
        .rope_parameters
        .as_ref()
        .and_then(|p| p.sliding_attention.as_ref())
        .and_then(|p| p.rope_theta);
    Some(
        nested
            .or(c.rope_local_base_freq)
            .map_or(default as f32, |Float(t)| t as f32),
    )
}

/// Per-layer windows from `layer_types` (`full_attention` or `sliding_attention` per layer).
fn layer_types_windows(
    path: &Path,
    v: &Value,
    window: Option<usize>,
    num_layers: usize,
) -> Result<Vec<Option<usize>>> {
    let types = v
        .as_array()
        .filter(|a| a.len() == num_layers)
        .ok_or_else(|| key_err(path, "layer_types", "must list one type per layer"))?;
    types
        .iter()
        .map(|t| match t.as_str() {
            Some("full_attention") => Ok(None),
            Some("sliding_attention") => window.map(Some).ok_or_else(|| {
                key_err(
                    path,
                    "sliding_window",
                    "is needed by sliding_attention layers",
                )
            }),
            _ => Err(key_err(
                path,
                "layer_types",
                format!("unknown layer type {t}"),
            )),
        })
        .collect()
}

/// Per-layer windows for Qwen-style configs: `layer_types` when present, else
/// `use_sliding_window` with `max_window_layers`.
fn layer_windows(
    path: &Path,
    c: &HfConfig,
    window: Option<usize>,
    num_layers: usize,
) -> Result<Vec<Option<usize>>> {
    if let Some(v) = &c.layer_types {
        return layer_types_windows(path, v, window, num_layers);
    }
    if !c.use_sliding_window.is_some_and(|Bool(b)| b) {
        return Ok(vec![None; num_layers]);
    }
    let from = c.max_window_layers.map_or(num_layers, |Uint(n)| n);
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
    fn nested_keys_are_named_by_path() {
        let mut v = base();
        v["rope_scaling"] = json!({"rope_type": "linear", "factor": "two"});
        let e = ModelConfig::from_hf_json(Path::new("c.json"), &v).unwrap_err();
        assert!(e.to_string().contains("`rope_scaling.factor`"), "{e}");
        let mut v = base();
        v["rope_parameters"] = json!(7);
        let e = ModelConfig::from_hf_json(Path::new("c.json"), &v).unwrap_err();
        assert!(e.to_string().contains("must be an object, found 7"), "{e}");
        let mut v = base();
        v["eos_token_id"] = json!([1, -1]);
        let e = ModelConfig::from_hf_json(Path::new("c.json"), &v).unwrap_err();
        assert!(e.to_string().contains("`eos_token_id`"), "{e}");
    }

    #[test]
    fn gemma_windows_scales_and_activation() {
        let mut v = base();
        v["architectures"] = json!(["Gemma3ForCausalLM"]);
        v["num_hidden_layers"] = json!(7);
        v["sliding_window"] = json!(4);
        v["query_pre_attn_scalar"] = json!(16);
        v["final_logit_softcapping"] = json!(30.0);
        // Gemma 3 ignores attention soft-capping, as transformers does.
        v["attn_logit_softcapping"] = json!(50.0);
        let c = ModelConfig::from_hf_json(Path::new("c.json"), &v).unwrap();
        // Every 6th layer global when no layer_types are given.
        let mut want = vec![Some(4); 7];
        want[5] = None;
        assert_eq!(c.layer_sliding_window, want);
        assert_eq!(c.attention_scale, Some(0.25));
        assert_eq!(c.rope_local_theta, Some(10000.0));
        assert_eq!(
            (c.final_logit_softcap, c.attn_logit_softcap),
            (Some(30.0), None)
        );
        assert_eq!(c.hidden_act, GatedAct::GeluTanh);
        v["sliding_window_pattern"] = json!(2);
        v["rope_parameters"] = json!({
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4 + 1.0},
        });
        let c = ModelConfig::from_hf_json(Path::new("c.json"), &v).unwrap();
        assert_eq!(c.layer_sliding_window[1], None);
        assert_eq!(c.layer_sliding_window[2], Some(4));
        assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 8.0 });
        assert_eq!((c.rope_theta, c.rope_local_theta), (1e6, Some(10001.0)));
        for (key, value, named) in [
            ("hidden_activation", json!("relu"), "`hidden_activation`"),
            (
                "sliding_window_pattern",
                json!(0),
                "`sliding_window_pattern`",
            ),
            (
                "query_pre_attn_scalar",
                json!(-1.0),
                "`query_pre_attn_scalar`",
            ),
        ] {
            let mut bad = v.clone();
            bad[key] = value;
            let e = ModelConfig::from_hf_json(Path::new("c.json"), &bad).unwrap_err();
            assert!(e.to_string().contains(named), "{e}");
        }
        // A Llama config with an activation Ferrum does not run is refused, not ignored.
        let mut v = base();
        v["hidden_act"] = json!("gelu");
        let e = ModelConfig::from_hf_json(Path::new("c.json"), &v).unwrap_err();
        assert!(e.to_string().contains("`hidden_act`"), "{e}");
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
