//! The GGUF metadata reader: `general.architecture` and the `<arch>.*` keys as llama.cpp
//! writes them. Defaults are llama.cpp's; the vocabulary size falls back to the embedding's
//! rows, tied embeddings and q/k/v biases are read off the tensors present, and the layer count
//! is bounded by the file's tensors before anything is sized by it.

use super::{max_layers, too_many_layers, ModelConfig, MAX_LAYERS};
use crate::gguf::{GgufFile, GgufValue};
use crate::registry;
use crate::{ModelError, Result};
use ferrum_runtime::cpu::{GatedAct, KvDtype, RopeScaling};
use ferrum_runtime::DType;

impl ModelConfig {
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
        let rotary_dim = uint("rope.dimension_count")?.unwrap_or(head_dim);
        if rotary_dim > head_dim {
            return Err(err(
                &format!("{arch}.rope.dimension_count"),
                format!("rotates {rotary_dim} elements of heads of {head_dim}"),
            ));
        }
        // Partial rotary is read for rotate-half files of the Llama family only: llama.cpp's
        // interleaved (permuted) layout pairs other elements, and Gemma rotates whole heads.
        let whole_heads = spec.gguf_qk_permuted || spec.family == registry::Family::Gemma;
        if rotary_dim != head_dim && whole_heads {
            return Err(err(
                &format!("{arch}.rope.dimension_count"),
                format!("partial rotary ({rotary_dim} of {head_dim}) is not supported for {arch}"),
            ));
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
        let is_gemma = spec.family == registry::Family::Gemma;
        let layer_sliding_window = if spec.sliding_window_pattern > 0 {
            // llama.cpp's Gemma: every n-th layer global (n = 2 for Gemma 2, 6 for Gemma 3)
            // unless the file gives the pattern (a period, or one bool per layer: true
            // slides). Without a window Gemma 2 takes 4096, Gemma 3 slides nowhere.
            let window = match (window, arch) {
                (Some(w), _) => Some(w),
                (None, "gemma2") => Some(4096),
                (None, _) => None,
            };
            let key = format!("{arch}.attention.sliding_window_pattern");
            match g.get(&key) {
                Some(GgufValue::Array(flags)) => {
                    if flags.len() != num_hidden_layers {
                        return Err(err(&key, "must hold one flag per layer".into()));
                    }
                    flags
                        .iter()
                        .map(|f| match f.as_bool() {
                            Some(true) => Ok(window),
                            Some(false) => Ok(None),
                            None => Err(err(&key, "must hold booleans".into())),
                        })
                        .collect::<Result<_>>()?
                }
                _ => {
                    let n = uint("attention.sliding_window_pattern")?
                        .unwrap_or(spec.sliding_window_pattern);
                    if n == 0 {
                        return Err(err(&key, "must be positive".into()));
                    }
                    (0..num_hidden_layers)
                        .map(|i| if (i + 1) % n == 0 { None } else { window })
                        .collect()
                }
            }
        } else {
            vec![window; num_hidden_layers]
        };
        let positive =
            |suffix: &str| -> Result<Option<f32>> { Ok(float(suffix)?.map(|v| v as f32)) };
        // llama.cpp's `general.file_type`: 1 = mostly F16, 32 = mostly BF16.
        let rope_table_dtype = match g.get("general.file_type").and_then(GgufValue::as_u64) {
            _ if !spec.rope_in_checkpoint_dtype => None,
            Some(1) => Some(DType::F16),
            Some(32) => Some(DType::BF16),
            _ => None,
        };
        let eos = token_id("tokenizer.ggml.eos_token_id")?;
        // Mixtral (written as `llama` with experts): stacked experts in every layer, the chosen
        // weights renormalised.
        let moe = match (spec.moe, uint("expert_count")?) {
            (_, None | Some(0)) => None,
            (Some(_), Some(n)) => Some(super::MoeConfig {
                num_experts: n,
                top_k: uint("expert_used_count")?.unwrap_or(2),
                expert_intermediate_size: match uint("expert_feed_forward_length")? {
                    Some(i) => i,
                    None => req("feed_forward_length")?,
                },
                norm_topk_prob: true,
                shared_expert_intermediate_size: None,
                layer_is_moe: vec![true; num_hidden_layers],
            }),
            (None, Some(_)) => {
                return Err(err(
                    &format!("{arch}.expert_count"),
                    format!(
                        "mixture-of-experts {arch} files are not supported (Mixtral as `llama` is)"
                    ),
                ))
            }
        };
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
            rotary_dim,
            rms_norm_eps: float("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5) as f32,
            rope_theta: float("rope.freq_base")?.unwrap_or(10000.0) as f32,
            rope_scaling,
            max_position_embeddings: uint("context_length")?.unwrap_or(2048),
            layer_sliding_window,
            tie_word_embeddings: g.tensor_info("output.weight").is_none(),
            attention_bias: g.tensor_info("blk.0.attn_q.bias").is_some(),
            // The file has no query_pre_attn_scalar: llama.cpp scales Gemma's scores by
            // head_dim^-1/2, but the 27B models' (46 layers for Gemma 2, 62 for Gemma 3) by
            // (hidden / heads)^-1/2.
            attention_scale: match (arch, num_hidden_layers) {
                ("gemma2", 46) | ("gemma3", 62) => {
                    Some(1.0 / (hidden_size as f32 / num_attention_heads.max(1) as f32).sqrt())
                }
                _ => None,
            },
            // Gemma 2 files written before the keys existed take llama.cpp's 50 and 30.
            attn_logit_softcap: if spec.attn_softcap {
                Some(positive("attn_logit_softcapping")?.unwrap_or(50.0))
            } else {
                None
            },
            final_logit_softcap: match positive("final_logit_softcapping")? {
                Some(cap) if is_gemma => Some(cap),
                None if spec.attn_softcap => Some(30.0),
                _ => None,
            },
            rope_local_theta: match (
                positive("rope.freq_base_swa")?,
                spec.default_local_rope_theta,
            ) {
                (_, 0) => None,
                (Some(t), _) => Some(t),
                (None, d) => Some(d as f32),
            },
            hidden_act: if is_gemma {
                GatedAct::GeluTanh
            } else {
                GatedAct::Silu
            },
            moe,
            dtype: None,
            rope_table_dtype,
            kv_cache_dtype: KvDtype::F32,
            bos_token_id: token_id("tokenizer.ggml.bos_token_id")?,
            eos_token_ids: eos.into_iter().collect(),
        };
        cfg.validate(path)?;
        Ok(cfg)
    }
}
