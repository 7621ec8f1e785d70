//! Building a tokenizer from a GGUF file's own metadata (`tokenizer.ggml.*`), so a `.gguf`
//! alone tokenizes exactly as the model's Hugging Face `tokenizer.json` does.
//!
//! Two vocabulary kinds:
//! - `gpt2`: byte-level BPE (vocab + merges) with the pre-tokenizer named by
//!   `tokenizer.ggml.pre` (`gpt2`/`default`, `llama-bpe`, `qwen2`, `smollm`, `starcoder`, ...).
//! - `llama`: SentencePiece BPE (vocab + scores) with byte fallback, on Ferrum's compact
//!   implementation ([`crate::spm`]): the pair that forms the highest-scored piece merges first,
//!   as SentencePiece merges.
//!
//! Control and user-defined tokens become added tokens, so their text in a prompt maps to their
//! id; control tokens are special (skipped when decoding for display).

use crate::spm::SentencePiece;
use crate::{Result, SpecialTokens, Tokenizer, TokenizerError};
use ferrum_types::TokenId;
use std::borrow::Cow;
use std::collections::HashMap;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

/// GGUF token types (`tokenizer.ggml.token_type`).
pub(crate) const TYPE_UNKNOWN: i32 = 2;
pub(crate) const TYPE_CONTROL: i32 = 3;
pub(crate) const TYPE_USER_DEFINED: i32 = 4;
pub(crate) const TYPE_BYTE: i32 = 6;

/// Llama 3's pre-tokenizer split (from its tokenizer.json).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's pre-tokenizer split: as Llama 3's but one digit per piece.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer variants understood for `gpt2` vocabularies.
pub const SUPPORTED_PRE: &[&str] = &[
    "default",
    "gpt2",
    "gpt-2",
    "smollm",
    "llama-bpe",
    "llama3",
    "qwen2",
    "deepseek-r1-qwen",
    "starcoder",
    "refact",
];

/// The tokenizer part of a GGUF file's metadata. Its strings may borrow from the parsed file
/// (a vocabulary of 262k tokens is then one vector of references, not 262k allocations).
#[derive(Debug, Clone, Default)]
pub struct GgufVocab<'a> {
    /// `tokenizer.ggml.model`: `gpt2` or `llama`.
    pub model: String,
    /// `tokenizer.ggml.pre`.
    pub pre: Option<String>,
    pub tokens: Vec<Cow<'a, str>>,
    /// Empty when absent.
    pub scores: Vec<f32>,
    /// Empty when absent (every token normal).
    pub token_types: Vec<i32>,
    /// `"left right"` pairs, in rank order; empty for `llama` vocabularies.
    pub merges: Vec<Cow<'a, str>>,
    pub bos_token_id: Option<TokenId>,
    pub eos_token_id: Option<TokenId>,
    /// End-of-turn and end-of-message ids, which also end generation.
    pub eot_token_id: Option<TokenId>,
    pub eom_token_id: Option<TokenId>,
    pub unknown_token_id: Option<TokenId>,
    pub padding_token_id: Option<TokenId>,
    pub add_bos_token: Option<bool>,
    pub add_eos_token: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece's dummy prefix); default true.
    pub add_space_prefix: Option<bool>,
}

impl GgufVocab<'_> {
    /// A copy that owns its strings.
    pub fn into_owned(self) -> GgufVocab<'static> {
        let own = |v: Vec<Cow<'_, str>>| -> Vec<Cow<'static, str>> {
            v.into_iter().map(|s| Cow::Owned(s.into_owned())).collect()
        };
        GgufVocab {
            model: self.model,
            pre: self.pre,
            tokens: own(self.tokens),
            scores: self.scores,
            token_types: self.token_types,
            merges: own(self.merges),
            bos_token_id: self.bos_token_id,
            eos_token_id: self.eos_token_id,
            eot_token_id: self.eot_token_id,
            eom_token_id: self.eom_token_id,
            unknown_token_id: self.unknown_token_id,
            padding_token_id: self.padding_token_id,
            add_bos_token: self.add_bos_token,
            add_eos_token: self.add_eos_token,
            add_space_prefix: self.add_space_prefix,
        }
    }

    /// Builds the tokenizer this metadata describes.
    pub fn build(&self) -> Result<Tokenizer> {
        if self.tokens.is_empty() {
            return Err(TokenizerError::Gguf(
                "tokenizer.ggml.tokens is missing or empty".into(),
            ));
        }
        let n = self.tokens.len();
        for (key, len) in [
            ("tokenizer.ggml.scores", self.scores.len()),
            ("tokenizer.ggml.token_type", self.token_types.len()),
        ] {
            if len != 0 && len != n {
                return Err(TokenizerError::Gguf(format!(
                    "{key} has {len} entries for {n} tokens"
                )));
            }
        }
        let ids = [
            ("bos_token_id", self.bos_token_id),
            ("eos_token_id", self.eos_token_id),
            ("eot_token_id", self.eot_token_id),
            ("eom_token_id", self.eom_token_id),
            ("unknown_token_id", self.unknown_token_id),
            ("padding_token_id", self.padding_token_id),
        ];
        for (key, id) in ids {
            if let Some(id) = id.filter(|&id| id as usize >= n) {
                return Err(TokenizerError::Gguf(format!(
                    "tokenizer.ggml.{key} = {id} is outside the vocabulary of {n} tokens"
                )));
            }
        }
        let default_add_bos = match self.model.as_str() {
            "gpt2" => false,
            "llama" => true,
            other => {
                return Err(TokenizerError::Gguf(format!(
                    "tokenizer.ggml.model '{other}' is not supported (supported: gpt2, llama)"
                )))
            }
        };
        let name = |id: Option<TokenId>| id.map(|i| self.tokens[i as usize].to_string());
        let mut special = SpecialTokens {
            bos_token: name(self.bos_token_id),
            bos_token_id: self.bos_token_id,
            eos_token: name(self.eos_token_id),
            eos_token_id: self.eos_token_id,
            pad_token: name(self.padding_token_id),
            pad_token_id: self.padding_token_id,
            unk_token: name(self.unknown_token_id),
            add_bos_token: self.add_bos_token.unwrap_or(default_add_bos),
            add_eos_token: self.add_eos_token.unwrap_or(false),
            stop_token_ids: Vec::new(),
        };
        for id in [self.eos_token_id, self.eot_token_id, self.eom_token_id]
            .into_iter()
            .flatten()
        {
            special.add_stop_id(id);
        }
        if special.add_bos_token && special.bos_token_id.is_none() {
            special.add_bos_token = false;
        }
        if self.model == "llama" {
            return Tokenizer::from_sentencepiece(SentencePiece::new(self)?, special);
        }
        let mut inner = self.build_bpe()?;
        self.add_added_tokens(&mut inner);
        Tokenizer::from_parts(inner, special)
    }

    fn token_type(&self, id: usize) -> i32 {
        self.token_types.get(id).copied().unwrap_or(1)
    }

    fn vocab_map(&self) -> HashMap<String, u32> {
        let mut vocab = HashMap::with_capacity(self.tokens.len());
        for (i, t) in self.tokens.iter().enumerate() {
            vocab.entry(t.to_string()).or_insert(i as u32);
        }
        vocab
    }

    fn build_bpe(&self) -> Result<tokenizers::Tokenizer> {
        let vocab = self.vocab_map();
        let mut merges = Vec::with_capacity(self.merges.len());
        for (i, m) in self.merges.iter().enumerate() {
            let (a, b) = m.split_once(' ').ok_or_else(|| {
                TokenizerError::Gguf(format!(
                    "tokenizer.ggml.merges[{i}] = {m:?} is not two tokens separated by a space"
                ))
            })?;
            merges.push((a.to_owned(), b.to_owned()));
        }
        let pre = self.pre.as_deref().unwrap_or("default");
        let byte_level = |regex: bool| ByteLevel::new(false, true, regex);
        let split = |re: &str| -> Result<PreTokenizerWrapper> {
            let s = Split::new(
                SplitPattern::Regex(re.to_owned()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(TokenizerError::backend)?;
            Ok(s.into())
        };
        let (pre_tok, normalizer, ignore_merges): (
            PreTokenizerWrapper,
            Option<NormalizerWrapper>,
            bool,
        ) = match pre {
            "default" | "gpt2" | "gpt-2" | "smollm" => (byte_level(true).into(), None, false),
            "llama-bpe" | "llama3" => (
                PreSequence::new(vec![split(LLAMA3_SPLIT)?, byte_level(false).into()]).into(),
                None,
                true,
            ),
            "qwen2" | "deepseek-r1-qwen" => (
                PreSequence::new(vec![split(QWEN2_SPLIT)?, byte_level(false).into()]).into(),
                Some(NFC.into()),
                false,
            ),
            "starcoder" | "refact" => (
                PreSequence::new(vec![Digits::new(true).into(), byte_level(true).into()]).into(),
                None,
                false,
            ),
            other => {
                return Err(TokenizerError::Gguf(format!(
                    "tokenizer.ggml.pre '{other}' is not supported (supported: {})",
                    SUPPORTED_PRE.join(", ")
                )))
            }
        };
        let bpe = BPE::builder()
            .vocab_and_merges(vocab.into_iter().collect::<Vocab>(), merges)
            .ignore_merges(ignore_merges)
            .build()
            .map_err(|e| TokenizerError::Gguf(format!("invalid BPE vocabulary: {e}")))?;
        let mut t = tokenizers::Tokenizer::new(bpe);
        t.with_pre_tokenizer(Some(pre_tok));
        t.with_normalizer(normalizer);
        t.with_decoder(Some(byte_level(true)));
        Ok(t)
    }

    /// Control, unknown and user-defined tokens are matched whole in input text (byte-level
    /// BPE vocabularies; [`SentencePiece`] does the same for its own).
    fn add_added_tokens(&self, t: &mut tokenizers::Tokenizer) {
        let mut special = Vec::new();
        let mut user = Vec::new();
        for (id, tok) in self.tokens.iter().enumerate() {
            match self.token_type(id) {
                TYPE_CONTROL | TYPE_UNKNOWN => {
                    special.push(AddedToken::from(tok.to_string(), true))
                }
                // Only tokens whose text is their vocabulary string can be added without
                // giving them a new id (byte-level strings with Ġ and the like are left to BPE).
                TYPE_USER_DEFINED if tok.is_ascii() && !tok.contains(' ') => {
                    user.push(AddedToken::from(tok.to_string(), false).normalized(false))
                }
                _ => {}
            }
        }
        t.add_special_tokens(&special);
        t.add_tokens(&user);
    }
}
