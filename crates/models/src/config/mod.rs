//! The typed model config, read from a Hugging Face `config.json` ([`hf`]) or from GGUF
//! metadata ([`gguf`]). Both readers type-check every key and name the key in a wrong type or
//! value; both end in [`ModelConfig::validate`], so a config that builds is one a family can
//! size itself by (positive sizes, heads that group, an even head dim within the kernels'
//! limit, at most [`MAX_LAYERS`] layers).

mod gguf;
mod hf;

use crate::registry::ArchSpec;
use crate::{ModelError, Result};
use ferrum_runtime::cpu::{GatedAct, KvDtype, RopeScaling, MAX_HEAD_DIM};
use ferrum_runtime::DType;
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
    /// Rotated elements at the start of each head (`head_dim` but for partial rotary).
    pub rotary_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    pub max_position_embeddings: usize,
    /// Sliding-window size per layer (`None`: full attention).
    pub layer_sliding_window: Vec<Option<usize>>,
    pub tie_word_embeddings: bool,
    /// q/k/v projections have a bias.
    pub attention_bias: bool,
    /// Multiplier of `q·k`; `None`: `1/sqrt(head_dim)` (Gemma: `query_pre_attn_scalar^-1/2`).
    pub attention_scale: Option<f32>,
    /// Scaled attention scores become `cap * tanh(s / cap)` (Gemma 2).
    pub attn_logit_softcap: Option<f32>,
    /// Logits become `cap * tanh(l / cap)` (Gemma 2 and 3).
    pub final_logit_softcap: Option<f32>,
    /// RoPE base of the sliding-window layers, unscaled, where it differs from the global
    /// layers' (Gemma 3's `rope_local_base_freq`).
    pub rope_local_theta: Option<f32>,
    /// The gated MLP's activation.
    pub hidden_act: GatedAct,
    /// Mixture-of-experts MLPs (Mixtral, Qwen2/3-MoE, OLMoE); `None`: every MLP is dense.
    pub moe: Option<MoeConfig>,
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

/// The shape of a model's mixture-of-experts MLPs.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    /// Experts each token is routed to.
    pub top_k: usize,
    /// Intermediate size of one expert.
    pub expert_intermediate_size: usize,
    /// The chosen experts' softmax weights are renormalised to sum to 1 (Mixtral always;
    /// Qwen-MoE and OLMoE by `norm_topk_prob`); otherwise they are the softmax over all.
    pub norm_topk_prob: bool,
    /// A shared expert of this intermediate size runs on every token, scaled by
    /// `sigmoid(shared_expert_gate . x)` (Qwen2-MoE).
    pub shared_expert_intermediate_size: Option<usize>,
    /// Per layer: its MLP is the experts (else a dense MLP of `intermediate_size`).
    pub layer_is_moe: Vec<bool>,
}

/// The most experts a config may declare (the largest open models have a few hundred).
pub const MAX_EXPERTS: usize = 1024;

impl ModelConfig {
    /// A position's rotary angles depend on its sequence's prompt length (LongRoPE): K/V of a
    /// prompt block cannot be shared with a sequence whose prompt differs in length, so the
    /// engine turns prefix caching off for such a model.
    pub fn rope_depends_on_prompt_len(&self) -> bool {
        matches!(self.rope_scaling, RopeScaling::LongRope { .. })
    }

    pub(crate) fn validate(&self, path: &Path) -> Result<()> {
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
        if self.rotary_dim == 0
            || !self.rotary_dim.is_multiple_of(2)
            || self.rotary_dim > self.head_dim
        {
            return Err(err(
                "partial_rotary_factor",
                "must rotate an even number of a head's elements, at least 2",
            ));
        }
        if let RopeScaling::LongRope {
            short_factor,
            long_factor,
            original_max_position_embeddings,
            attention_factor,
        } = &self.rope_scaling
        {
            for (key, f) in [("short_factor", short_factor), ("long_factor", long_factor)] {
                if f.len() != self.rotary_dim / 2 {
                    return Err(err(
                        &format!("rope_scaling.{key}"),
                        &format!(
                            "must hold {} values (one per rotated pair), found {}",
                            self.rotary_dim / 2,
                            f.len()
                        ),
                    ));
                }
                if f.iter().any(|v| !(v.is_finite() && *v > 0.0)) {
                    return Err(err(
                        &format!("rope_scaling.{key}"),
                        "must hold positive numbers",
                    ));
                }
            }
            if *original_max_position_embeddings == 0 {
                return Err(err("original_max_position_embeddings", "must be positive"));
            }
            if !(attention_factor.is_finite() && *attention_factor > 0.0) {
                return Err(err(
                    "rope_scaling.attention_factor",
                    "must be a positive number",
                ));
            }
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return Err(err("rms_norm_eps", "must be a non-negative number"));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(err("rope_theta", "must be a positive number"));
        }
        if let Some(m) = &self.moe {
            if m.num_experts == 0 || m.num_experts > MAX_EXPERTS {
                return Err(err("num_experts", "must be between 1 and 1024"));
            }
            if m.top_k == 0 || m.top_k > m.num_experts {
                return Err(err(
                    "num_experts_per_tok",
                    "must be between 1 and the number of experts",
                ));
            }
            if m.expert_intermediate_size == 0 || m.shared_expert_intermediate_size == Some(0) {
                return Err(err("moe_intermediate_size", "must be positive"));
            }
            if m.layer_is_moe.len() != self.num_hidden_layers {
                return Err(err("mlp_only_layers", "must fit the layers"));
            }
        }
        if self.layer_sliding_window.contains(&Some(0)) {
            return Err(err("sliding_window", "must be positive"));
        }
        for (key, v) in [
            ("query_pre_attn_scalar", self.attention_scale),
            ("attn_logit_softcapping", self.attn_logit_softcap),
            ("final_logit_softcapping", self.final_logit_softcap),
            ("rope_local_base_freq", self.rope_local_theta),
        ] {
            if v.is_some_and(|v| !(v.is_finite() && v > 0.0)) {
                return Err(err(key, "must be a positive number"));
            }
        }
        Ok(())
    }
}

/// The most layers a config may declare (the largest open models have under 200).
pub const MAX_LAYERS: usize = 1024;

pub(crate) fn max_layers(n: usize, limit: usize) -> Option<usize> {
    (n <= limit).then_some(n)
}

pub(crate) fn too_many_layers(limit: usize) -> String {
    format!("is larger than this file can hold (at most {limit} layers)")
}
