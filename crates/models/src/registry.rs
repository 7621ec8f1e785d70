//! The architecture registry: which names Ferrum runs, with which family and flags.
//!
//! Hugging Face folders are keyed by `architectures[0]` in config.json, GGUF files by
//! `general.architecture`. Flags that are fixed per architecture live here; flags a config can
//! set (attention bias, sliding window) are read by [`crate::ModelConfig`].

/// A model family: one implementation file each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Llama and its kin (Mistral, Qwen2, Qwen3, SmolLM): pre-norm decoder, RoPE, GQA,
    /// SiLU-gated MLP, RMSNorm.
    Llama,
    /// Gemma 2 and 3: scaled embeddings, `(1 + w)` RMSNorms before and after attention and the
    /// MLP, GELU(tanh)-gated MLP, local (sliding-window) and global layers, soft-capping.
    Gemma,
}

/// What an architecture name means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchSpec {
    /// Canonical name (the HF class name).
    pub name: &'static str,
    pub family: Family,
    /// q/k/v projections carry a bias regardless of config (Qwen2).
    pub qkv_bias: bool,
    /// Per-head RMSNorm of q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    /// `sliding_window` in config.json applies to every layer (Mistral).
    pub sliding_window_all_layers: bool,
    /// Sliding window is governed by `use_sliding_window` / `layer_types` (Qwen2, Qwen3).
    pub sliding_window_by_layer_types: bool,
    /// GGUF files of this architecture store q/k rows in llama.cpp's interleaved-rope order.
    pub gguf_qk_permuted: bool,
    /// Every `n`-th layer is global, the others slide (`layer i` is global when
    /// `(i + 1) % n == 0`), unless the config lists `layer_types` or its own pattern; 0: the
    /// architecture has no such pattern.
    pub sliding_window_pattern: usize,
    /// `attn_logit_softcapping` applies (Gemma 2; transformers' Gemma 3 ignores it).
    pub attn_softcap: bool,
    /// RoPE base of sliding-window layers when the file names none (Gemma 3: 10000); 0: they
    /// share the global layers' rope.
    pub default_local_rope_theta: u32,
    /// The reference keeps RoPE frequencies in a half-precision checkpoint's dtype (the Llama
    /// family's bf16 fixture shows it); the Gemma and Phi-3 references keep them in f32.
    pub rope_in_checkpoint_dtype: bool,
    /// Mixture-of-experts MLPs, and their tensor names (`None`: dense only).
    pub moe: Option<MoeStyle>,
    /// q and k RMSNorm over the whole projection, before the split into heads (OLMoE).
    pub qk_norm_full: bool,
    /// q, k and v are one fused projection (`qkv_proj`), and gate and up one (`gate_up_proj`):
    /// split by rows at load (Phi-3).
    pub fused_projections: bool,
}

const fn spec(name: &'static str) -> ArchSpec {
    ArchSpec {
        name,
        family: Family::Llama,
        qkv_bias: false,
        qk_norm: false,
        sliding_window_all_layers: false,
        sliding_window_by_layer_types: false,
        gguf_qk_permuted: false,
        sliding_window_pattern: 0,
        attn_softcap: false,
        default_local_rope_theta: 0,
        rope_in_checkpoint_dtype: true,
        moe: None,
        qk_norm_full: false,
        fused_projections: false,
    }
}

/// How a family names and routes its experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeStyle {
    /// `block_sparse_moe.gate`, `block_sparse_moe.experts.{e}.w1/w3/w2` (gate, up, down); the
    /// chosen weights always renormalised.
    Mixtral,
    /// `mlp.gate`, `mlp.experts.{e}.{gate,up,down}_proj`, optionally `mlp.shared_expert.*` and
    /// `mlp.shared_expert_gate` (Qwen2-MoE, Qwen3-MoE, OLMoE).
    Qwen,
}

const LLAMA: ArchSpec = ArchSpec {
    gguf_qk_permuted: true,
    ..spec("LlamaForCausalLM")
};
const MISTRAL: ArchSpec = ArchSpec {
    sliding_window_all_layers: true,
    gguf_qk_permuted: true,
    ..spec("MistralForCausalLM")
};
const QWEN2: ArchSpec = ArchSpec {
    qkv_bias: true,
    sliding_window_by_layer_types: true,
    ..spec("Qwen2ForCausalLM")
};
const QWEN3: ArchSpec = ArchSpec {
    qk_norm: true,
    sliding_window_by_layer_types: true,
    ..spec("Qwen3ForCausalLM")
};

const MIXTRAL: ArchSpec = ArchSpec {
    sliding_window_all_layers: true,
    gguf_qk_permuted: true,
    moe: Some(MoeStyle::Mixtral),
    rope_in_checkpoint_dtype: false,
    ..spec("MixtralForCausalLM")
};
const QWEN2_MOE: ArchSpec = ArchSpec {
    qkv_bias: true,
    sliding_window_by_layer_types: true,
    moe: Some(MoeStyle::Qwen),
    rope_in_checkpoint_dtype: false,
    ..spec("Qwen2MoeForCausalLM")
};
const QWEN3_MOE: ArchSpec = ArchSpec {
    qk_norm: true,
    sliding_window_by_layer_types: true,
    moe: Some(MoeStyle::Qwen),
    rope_in_checkpoint_dtype: false,
    ..spec("Qwen3MoeForCausalLM")
};
const OLMOE: ArchSpec = ArchSpec {
    qk_norm_full: true,
    moe: Some(MoeStyle::Qwen),
    rope_in_checkpoint_dtype: false,
    ..spec("OlmoeForCausalLM")
};
const PHI3: ArchSpec = ArchSpec {
    fused_projections: true,
    rope_in_checkpoint_dtype: false,
    sliding_window_all_layers: true,
    ..spec("Phi3ForCausalLM")
};
const GEMMA2: ArchSpec = ArchSpec {
    family: Family::Gemma,
    rope_in_checkpoint_dtype: false,
    sliding_window_by_layer_types: true,
    sliding_window_pattern: 2,
    attn_softcap: true,
    ..spec("Gemma2ForCausalLM")
};
const GEMMA3: ArchSpec = ArchSpec {
    family: Family::Gemma,
    rope_in_checkpoint_dtype: false,
    qk_norm: true,
    sliding_window_by_layer_types: true,
    sliding_window_pattern: 6,
    default_local_rope_theta: 10000,
    ..spec("Gemma3ForCausalLM")
};

/// `(HF architectures name, spec)`.
const HF: [(&str, ArchSpec); 11] = [
    ("LlamaForCausalLM", LLAMA),
    ("MistralForCausalLM", MISTRAL),
    ("Qwen2ForCausalLM", QWEN2),
    ("Qwen3ForCausalLM", QWEN3),
    ("Gemma2ForCausalLM", GEMMA2),
    ("Gemma3ForCausalLM", GEMMA3),
    ("Phi3ForCausalLM", PHI3),
    ("MixtralForCausalLM", MIXTRAL),
    ("Qwen2MoeForCausalLM", QWEN2_MOE),
    ("Qwen3MoeForCausalLM", QWEN3_MOE),
    ("OlmoeForCausalLM", OLMOE),
];

/// `(GGUF general.architecture, spec)`. llama.cpp writes Mistral and SmolLM as `llama`.
/// llama.cpp writes Mixtral as `llama` with `expert_count` (the config reads it).
const LLAMA_GGUF: ArchSpec = ArchSpec {
    moe: Some(MoeStyle::Mixtral),
    ..LLAMA
};

const GGUF: [(&str, ArchSpec); 5] = [
    ("llama", LLAMA_GGUF),
    ("qwen2", QWEN2),
    ("qwen3", QWEN3),
    ("gemma2", GEMMA2),
    ("gemma3", GEMMA3),
];

/// The spec for a Hugging Face `architectures` entry.
pub fn lookup_hf(name: &str) -> Option<ArchSpec> {
    HF.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// The spec for a GGUF `general.architecture`.
pub fn lookup_gguf(name: &str) -> Option<ArchSpec> {
    GGUF.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// Names accepted in Hugging Face folders, for error messages.
pub fn hf_names() -> String {
    HF.map(|(n, _)| n).join(", ")
}

/// Names accepted in GGUF files, for error messages.
pub fn gguf_names() -> String {
    GGUF.map(|(n, _)| n).join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups() {
        assert!(lookup_hf("Qwen2ForCausalLM").is_some_and(|s| s.qkv_bias));
        assert!(lookup_gguf("llama").is_some_and(|s| s.gguf_qk_permuted));
        assert!(lookup_gguf("qwen3").is_some_and(|s| s.qk_norm && !s.gguf_qk_permuted));
        assert_eq!(lookup_hf("GPT2LMHeadModel"), None);
        assert!(lookup_gguf("gemma3").is_some_and(|s| s.family == Family::Gemma && s.qk_norm));
        assert!(lookup_hf("Gemma2ForCausalLM").is_some_and(|s| s.attn_softcap));
    }
}
