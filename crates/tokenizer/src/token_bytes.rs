//! The bytes each token id stands for, as a grammar engine needs them to build its token trie
//! (the text a tokenizer's decoder would produce for the token alone, before any cleanup that
//! depends on its neighbours).
//!
//! Two vocabulary forms are understood, the ones Ferrum loads from `tokenizer.json` files and
//! GGUF metadata:
//! - byte-level BPE (GPT-2 style; Llama 3, Qwen, SmolLM): each character of a token's name
//!   stands for one byte through the byte-level alphabet;
//! - SentencePiece style (Llama 2, Mistral, Gemma): `▁` (or the decoder's replacement
//!   character) is a space, and `<0xNN>` byte-fallback tokens are the byte `NN`.
//!
//! Added tokens stand for their content as written. Ids no token has are empty.

use crate::{Result, TokenizerError};
use serde_json::Value;
use std::collections::HashMap;

/// How a vocabulary's token names map to bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Form {
    ByteLevel,
    /// `space` stands for a space; `<0xNN>` names are bytes.
    SentencePiece {
        space: char,
    },
}

/// Reads the form off the decoder (as its JSON serialization names it).
fn form_of(decoder: &Value) -> Option<Form> {
    match decoder.get("type").and_then(Value::as_str) {
        Some("ByteLevel") => Some(Form::ByteLevel),
        Some("Metaspace") => {
            let space = decoder
                .get("replacement")
                .and_then(Value::as_str)
                .and_then(|s| s.chars().next())
                .unwrap_or('▁');
            Some(Form::SentencePiece { space })
        }
        Some("Sequence") => {
            let parts = decoder.get("decoders").and_then(Value::as_array)?;
            let mut space = None;
            let mut byte_fallback = false;
            for d in parts {
                match d.get("type").and_then(Value::as_str) {
                    Some("ByteLevel") => return Some(Form::ByteLevel),
                    Some("ByteFallback") => byte_fallback = true,
                    Some("Metaspace") => return form_of(d),
                    Some("Replace") if d.get("content").and_then(Value::as_str) == Some(" ") => {
                        let pattern = d.get("pattern").and_then(|p| p.get("String"));
                        let mut chars = pattern.and_then(Value::as_str).unwrap_or("").chars();
                        if let (Some(c), None) = (chars.next(), chars.next()) {
                            space = Some(c);
                        }
                    }
                    _ => {}
                }
            }
            match (space, byte_fallback) {
                (Some(space), _) => Some(Form::SentencePiece { space }),
                (None, true) => Some(Form::SentencePiece { space: '▁' }),
                (None, false) => None,
            }
        }
        _ => None,
    }
}

/// GPT-2's byte-level alphabet, reversed: the character each byte is written as -> the byte.
fn byte_level_chars() -> HashMap<char, u8> {
    let mut map = HashMap::with_capacity(256);
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or(char::REPLACEMENT_CHARACTER);
            next += 1;
            c
        };
        map.insert(c, b);
    }
    map
}

/// The bytes of a token of the model's vocabulary (not an added token), by its name.
fn name_bytes(form: Form, chars: &HashMap<char, u8>, name: &str) -> Result<Vec<u8>> {
    match form {
        Form::ByteLevel => name
            .chars()
            .map(|c| {
                chars.get(&c).copied().ok_or_else(|| {
                    TokenizerError::Invalid(format!(
                        "token {name:?} has the character {c:?}, which is not in the byte-level \
                         alphabet"
                    ))
                })
            })
            .collect(),
        Form::SentencePiece { space } => Ok(sentencepiece_bytes(space, name)),
    }
}

/// The bytes of a SentencePiece-style piece: `<0xNN>` is the byte `NN`; otherwise the name with
/// `space` written as a space.
pub(crate) fn sentencepiece_bytes(space: char, name: &str) -> Vec<u8> {
    let hex = name
        .strip_prefix("<0x")
        .and_then(|h| h.strip_suffix('>'))
        .filter(|h| h.len() == 2);
    if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
        return vec![b];
    }
    name.replace(space, " ").into_bytes()
}

/// The bytes of every id below `vocab_size`; see the module docs.
pub(crate) fn token_bytes(
    inner: &tokenizers::Tokenizer,
    vocab_size: usize,
) -> Result<Vec<Vec<u8>>> {
    let decoder = inner
        .get_decoder()
        .map(serde_json::to_value)
        .transpose()
        .map_err(|e| TokenizerError::Invalid(format!("cannot read the tokenizer's decoder: {e}")))?
        .unwrap_or(Value::Null);
    let form = form_of(&decoder).ok_or_else(|| {
        TokenizerError::Invalid(format!(
            "the tokenizer's decoder ({}) is neither byte-level nor SentencePiece style, so \
             the bytes of its tokens are unknown",
            decoder
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("none")
        ))
    })?;
    let chars = byte_level_chars();
    let mut out = vec![Vec::new(); vocab_size];
    let added = inner.get_added_tokens_decoder();
    for (name, id) in inner.get_vocab(false) {
        if added.contains_key(&id) {
            continue;
        }
        if let Some(slot) = out.get_mut(id as usize) {
            *slot = name_bytes(form, &chars, &name)?;
        }
    }
    for (id, tok) in added {
        if let Some(slot) = out.get_mut(id as usize) {
            *slot = tok.content.into_bytes();
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_alphabet_is_a_bijection_of_all_bytes() {
        let m = byte_level_chars();
        assert_eq!(m.len(), 256);
        let mut seen = [false; 256];
        for &b in m.values() {
            seen[b as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(m[&'Ġ'], b' ');
        assert_eq!(m[&'Ċ'], b'\n');
        assert_eq!(m[&'a'], b'a');
    }

    #[test]
    fn sentencepiece_names_and_byte_fallback() {
        let f = Form::SentencePiece { space: '▁' };
        let c = HashMap::new();
        assert_eq!(name_bytes(f, &c, "▁Hello").unwrap(), b" Hello");
        assert_eq!(name_bytes(f, &c, "<0x0A>").unwrap(), b"\n");
        assert_eq!(name_bytes(f, &c, "<0xE2>").unwrap(), vec![0xE2]);
        // Not a byte token: the name as written.
        assert_eq!(name_bytes(f, &c, "<0xZZ>").unwrap(), b"<0xZZ>");
    }

    #[test]
    fn forms_from_decoders() {
        let seq = serde_json::json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]});
        assert_eq!(form_of(&seq), Some(Form::SentencePiece { space: '▁' }));
        let bl = serde_json::json!({"type": "ByteLevel"});
        assert_eq!(form_of(&bl), Some(Form::ByteLevel));
        assert_eq!(form_of(&serde_json::json!({"type": "WordPiece"})), None);
        assert_eq!(form_of(&Value::Null), None);
    }
}
