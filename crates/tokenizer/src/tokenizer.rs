//! [`Tokenizer`]: text to ids and back, plus the model's special tokens. A `tokenizer.json` and
//! a GGUF byte-level BPE vocabulary run on the Hugging Face `tokenizers` crate; a GGUF
//! SentencePiece vocabulary on Ferrum's compact implementation ([`crate::spm`]). See
//! [`crate::GgufVocab`].
//!
//! Invariants: `special.bos_token_id`/`eos_token_id`/`pad_token_id` and every stop id are
//! inside the vocabulary; `vocab_size` counts added tokens.

use crate::special::{token_content, token_ids};
use crate::spm::SentencePiece;
use crate::{Result, SpecialTokens, TokenizerError};
use ferrum_types::TokenId;
use serde_json::Value;
use std::path::Path;

/// A loaded tokenizer with its special tokens.
pub struct Tokenizer {
    model: Model,
    special: SpecialTokens,
    vocab_size: usize,
    /// `is_special[id]`: an added token marked special (skipped when decoding for display).
    is_special: Vec<bool>,
}

/// What turns text into ids and back.
enum Model {
    /// The `tokenizers` crate's pipeline: `tokenizer.json`, and GGUF byte-level BPE
    /// vocabularies.
    Hf(Box<tokenizers::Tokenizer>),
    /// SentencePiece BPE of a GGUF `llama` vocabulary, in a compact form of its own.
    Spm(Box<SentencePiece>),
}

impl Model {
    fn token_to_id(&self, token: &str) -> Option<TokenId> {
        match self {
            Model::Hf(t) => t.token_to_id(token),
            Model::Spm(s) => s.token_to_id(token),
        }
    }

    fn id_to_token(&self, id: TokenId) -> Option<String> {
        match self {
            Model::Hf(t) => t.id_to_token(id),
            Model::Spm(s) => s.id_to_token(id).map(str::to_owned),
        }
    }
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("special", &self.special)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Wraps a built `tokenizers` pipeline; see [`Tokenizer::from_model`].
    pub(crate) fn from_parts(
        inner: tokenizers::Tokenizer,
        special: SpecialTokens,
    ) -> Result<Tokenizer> {
        let vocab_size = inner.get_vocab_size(true);
        let mut is_special = vec![false; vocab_size];
        for (id, tok) in inner.get_added_tokens_decoder() {
            if tok.special && (id as usize) < vocab_size {
                is_special[id as usize] = true;
            }
        }
        Tokenizer::from_model(Model::Hf(Box::new(inner)), special, vocab_size, is_special)
    }

    /// Wraps a SentencePiece vocabulary; see [`Tokenizer::from_model`].
    pub(crate) fn from_sentencepiece(
        spm: SentencePiece,
        special: SpecialTokens,
    ) -> Result<Tokenizer> {
        let vocab_size = spm.len();
        let is_special = (0..vocab_size as TokenId)
            .map(|id| spm.is_special(id))
            .collect();
        Tokenizer::from_model(Model::Spm(Box::new(spm)), special, vocab_size, is_special)
    }

    /// Resolves special token strings to ids and checks every id.
    fn from_model(
        model: Model,
        mut special: SpecialTokens,
        vocab_size: usize,
        is_special: Vec<bool>,
    ) -> Result<Tokenizer> {
        let resolve = |name: &Option<String>, id: &mut Option<TokenId>| {
            if id.is_none() {
                if let Some(n) = name {
                    *id = model.token_to_id(n);
                }
            }
        };
        resolve(&special.bos_token, &mut special.bos_token_id);
        resolve(&special.eos_token, &mut special.eos_token_id);
        resolve(&special.pad_token, &mut special.pad_token_id);
        let name_of = |id: TokenId| model.id_to_token(id);
        if special.bos_token.is_none() {
            special.bos_token = special.bos_token_id.and_then(name_of);
        }
        if special.eos_token.is_none() {
            special.eos_token = special.eos_token_id.and_then(name_of);
        }
        if let Some(eos) = special.eos_token_id {
            special.add_stop_id(eos);
        }
        let ids = [
            special.bos_token_id,
            special.eos_token_id,
            special.pad_token_id,
        ];
        for id in ids
            .into_iter()
            .flatten()
            .chain(special.stop_token_ids.iter().copied())
        {
            if id as usize >= vocab_size {
                return Err(TokenizerError::UnknownToken { id, vocab_size });
            }
        }
        if special.add_bos_token && special.bos_token_id.is_none() {
            return Err(TokenizerError::Invalid(
                "the tokenizer config asks to add a BOS token but names none".into(),
            ));
        }
        Ok(Tokenizer {
            model,
            special,
            vocab_size,
            is_special,
        })
    }

    /// Loads `tokenizer.json`; special tokens come from `special` (see [`load_special_tokens`]).
    pub fn from_json_file(path: &Path, special: SpecialTokens) -> Result<Tokenizer> {
        let bytes = std::fs::read(path).map_err(|e| TokenizerError::io(path, e))?;
        let inner =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| TokenizerError::Json {
                path: path.to_owned(),
                message: format!("not a tokenizer the `tokenizers` library can load: {e}"),
            })?;
        Tokenizer::from_parts(inner, special)
    }

    pub fn special(&self) -> &SpecialTokens {
        &self.special
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn token_to_id(&self, token: &str) -> Option<TokenId> {
        self.model.token_to_id(token)
    }

    /// Whether `id` is a special added token (BOS, EOS, chat markers, ...).
    pub fn is_special(&self, id: TokenId) -> bool {
        self.is_special.get(id as usize).copied().unwrap_or(false)
    }

    /// Encodes `text`. With `add_special_tokens` the tokenizer's post-processor runs and
    /// BOS/EOS are added as the model's config asks; chat prompts pass `false` because the
    /// template writes them. Special-token strings in `text` become their ids.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<TokenId>> {
        let mut ids = match &self.model {
            Model::Hf(t) => t
                .encode_fast(text, add_special_tokens)
                .map_err(TokenizerError::backend)?
                .get_ids()
                .to_vec(),
            Model::Spm(s) => s.encode(text),
        };
        if add_special_tokens {
            if let (true, Some(bos)) = (self.special.add_bos_token, self.special.bos_token_id) {
                if ids.first() != Some(&bos) {
                    ids.insert(0, bos);
                }
            }
            if let (true, Some(eos)) = (self.special.add_eos_token, self.special.eos_token_id) {
                if ids.last() != Some(&eos) {
                    ids.push(eos);
                }
            }
        }
        Ok(ids)
    }

    /// Decodes ids to text; ids outside the vocabulary are an error.
    pub fn decode(&self, ids: &[TokenId], skip_special_tokens: bool) -> Result<String> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(TokenizerError::UnknownToken {
                id,
                vocab_size: self.vocab_size,
            });
        }
        match &self.model {
            Model::Hf(t) => t
                .decode(ids, skip_special_tokens)
                .map_err(TokenizerError::backend),
            Model::Spm(s) => Ok(s.decode(ids, skip_special_tokens)),
        }
    }

    /// The bytes every id stands for (`vocab_size` entries; special tokens as their content,
    /// see [`Tokenizer::is_special`]): what a grammar engine builds its token trie from.
    /// Errors when the vocabulary is of a form whose bytes are unknown (not byte-level or
    /// SentencePiece style) or a byte-level name has a character outside the alphabet.
    pub fn token_bytes(&self) -> Result<Vec<Vec<u8>>> {
        match &self.model {
            Model::Hf(t) => crate::token_bytes::token_bytes(t, self.vocab_size),
            Model::Spm(s) => Ok(s.token_bytes()),
        }
    }

    /// The text of one token as a client would see it (special tokens included).
    pub fn token_text(&self, id: TokenId) -> Result<String> {
        self.decode(&[id], false)
    }
}

/// Reads special tokens from a Hugging Face folder: `tokenizer_config.json` (token strings,
/// `add_bos_token`, `add_eos_token`), `generation_config.json` and `config.json`
/// (`eos_token_id`, one or several, and `bos_token_id`). Missing files are fine; malformed ones
/// are errors.
pub fn load_special_tokens(dir: &Path) -> Result<SpecialTokens> {
    let mut s = SpecialTokens::default();
    if let Some(tc) = read_json_opt(&dir.join("tokenizer_config.json"))? {
        s.bos_token = tc.get("bos_token").and_then(token_content);
        s.eos_token = tc.get("eos_token").and_then(token_content);
        s.pad_token = tc.get("pad_token").and_then(token_content);
        s.unk_token = tc.get("unk_token").and_then(token_content);
        s.add_bos_token = tc
            .get("add_bos_token")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        s.add_eos_token = tc
            .get("add_eos_token")
            .and_then(Value::as_bool)
            .unwrap_or(false);
    }
    let gen = read_json_opt(&dir.join("generation_config.json"))?;
    let cfg = read_json_opt(&dir.join("config.json"))?;
    for v in [&gen, &cfg].into_iter().flatten() {
        for id in token_ids(v.get("eos_token_id")) {
            s.add_stop_id(id);
        }
        if s.bos_token.is_none() && s.bos_token_id.is_none() {
            s.bos_token_id = token_ids(v.get("bos_token_id")).first().copied();
        }
        if s.pad_token.is_none() && s.pad_token_id.is_none() {
            s.pad_token_id = token_ids(v.get("pad_token_id")).first().copied();
        }
    }
    if s.eos_token.is_none() {
        s.eos_token_id = s.stop_token_ids.first().copied();
    }
    Ok(s)
}

/// Parses a JSON file if it exists.
pub(crate) fn read_json_opt(path: &Path) -> Result<Option<Value>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| TokenizerError::Json {
                path: path.to_owned(),
                message: format!("invalid JSON: {e}"),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(TokenizerError::io(path, e)),
    }
}
