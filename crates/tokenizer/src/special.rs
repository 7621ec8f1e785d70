//! Special tokens (BOS, EOS, pad, unknown) and whether encoding adds BOS/EOS, gathered from a
//! model's `tokenizer_config.json`, `generation_config.json` and `config.json`, or from GGUF
//! `tokenizer.ggml.*` metadata.
//!
//! Invariant: `stop_token_ids` holds every id that ends generation for this model (the
//! tokenizer's EOS, every `eos_token_id` of the generation config, end-of-turn ids), without
//! duplicates. Ids are resolved against the vocabulary by [`crate::Tokenizer`].

use ferrum_types::TokenId;
use serde_json::Value;

/// The special tokens of one model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecialTokens {
    pub bos_token: Option<String>,
    pub bos_token_id: Option<TokenId>,
    pub eos_token: Option<String>,
    pub eos_token_id: Option<TokenId>,
    pub pad_token: Option<String>,
    pub pad_token_id: Option<TokenId>,
    pub unk_token: Option<String>,
    /// Encoding a raw prompt prepends BOS (chat prompts never do: the template writes it).
    pub add_bos_token: bool,
    /// Encoding a raw prompt appends EOS.
    pub add_eos_token: bool,
    /// Every id that ends generation.
    pub stop_token_ids: Vec<TokenId>,
}

impl SpecialTokens {
    /// Adds `id` to the stop ids unless it is there already.
    pub fn add_stop_id(&mut self, id: TokenId) {
        if !self.stop_token_ids.contains(&id) {
            self.stop_token_ids.push(id);
        }
    }
}

/// A special token in `tokenizer_config.json`: a string, or an AddedToken object with `content`.
pub(crate) fn token_content(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(m) => m.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

/// `eos_token_id` in a config: one id or a list of ids.
pub(crate) fn token_ids(v: Option<&Value>) -> Vec<TokenId> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|n| n as TokenId).into_iter().collect(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_u64)
            .map(|n| n as TokenId)
            .collect(),
        _ => Vec::new(),
    }
}
