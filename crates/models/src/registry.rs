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
    }
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

/// `(HF architectures name, spec)`.
const HF: [(&str, ArchSpec); 4] = [
    ("LlamaForCausalLM", LLAMA),
    ("MistralForCausalLM", MISTRAL),
    ("Qwen2ForCausalLM", QWEN2),
    ("Qwen3ForCausalLM", QWEN3),
];

/// `(GGUF general.architecture, spec)`. llama.cpp writes Mistral and SmolLM as `llama`.
const GGUF: [(&str, ArchSpec); 3] = [("llama", LLAMA), ("qwen2", QWEN2), ("qwen3", QWEN3)];

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
    }
}
