//! A model's text side: its tokenizer and chat template, from a Hugging Face folder
//! (`tokenizer.json` and friends) or from a GGUF file's own `tokenizer.*` metadata.

use crate::gguf::{GgufArray, GgufFile, GgufValue};
use crate::source::WeightSource;
use crate::{ModelError, Result};
use ferrum_tokenizer::{GgufVocab, TemplateMode, TextAssets};
use std::borrow::Cow;
use std::path::Path;

/// Loads the tokenizer and chat template of a model folder or `.gguf` file.
pub fn load_text_assets(path: &Path) -> Result<TextAssets> {
    load_text_assets_with(path, &TemplateMode::InProcess)
}

/// [`load_text_assets`], the chat template compiled where `mode` says.
pub fn load_text_assets_with(path: &Path, mode: &TemplateMode) -> Result<TextAssets> {
    match WeightSource::open(path)? {
        WeightSource::HfFolder { dir, .. } => Ok(TextAssets::from_folder_with(&dir, mode)?),
        WeightSource::Gguf(g) => {
            let vocab = gguf_vocab(&g)?;
            let tokenizer = vocab.build().map_err(|e| ModelError::Format {
                path: g.path().to_owned(),
                msg: e.to_string(),
            })?;
            let template = opt_str(&g, "tokenizer.chat_template")?;
            Ok(TextAssets::new_with(tokenizer, template, mode)?)
        }
    }
}

/// Reads the `tokenizer.ggml.*` metadata of a GGUF file; its strings borrow from `g`.
pub fn gguf_vocab(g: &GgufFile) -> Result<GgufVocab<'_>> {
    let model = opt_str(g, "tokenizer.ggml.model")?.ok_or_else(|| ModelError::Config {
        path: g.path().to_owned(),
        key: "tokenizer.ggml.model".into(),
        msg: "missing: this GGUF file carries no tokenizer".into(),
    })?;
    Ok(GgufVocab {
        model: model.to_owned(),
        pre: opt_str(g, "tokenizer.ggml.pre")?.map(str::to_owned),
        tokens: strings(g, "tokenizer.ggml.tokens")?,
        scores: array(
            g,
            "tokenizer.ggml.scores",
            |a| match a {
                GgufArray::F32(v) => Some(v.clone()),
                _ => None,
            },
            |v| v.as_f64().map(|f| f as f32),
        )?,
        token_types: array(
            g,
            "tokenizer.ggml.token_type",
            |a| match a {
                GgufArray::I32(v) => Some(v.clone()),
                _ => None,
            },
            |v| v.as_u64().and_then(|t| i32::try_from(t).ok()),
        )?,
        merges: strings(g, "tokenizer.ggml.merges")?,
        bos_token_id: opt_id(g, "tokenizer.ggml.bos_token_id")?,
        eos_token_id: opt_id(g, "tokenizer.ggml.eos_token_id")?,
        eot_token_id: opt_id(g, "tokenizer.ggml.eot_token_id")?,
        eom_token_id: opt_id(g, "tokenizer.ggml.eom_token_id")?,
        unknown_token_id: opt_id(g, "tokenizer.ggml.unknown_token_id")?,
        padding_token_id: opt_id(g, "tokenizer.ggml.padding_token_id")?,
        add_bos_token: opt_bool(g, "tokenizer.ggml.add_bos_token")?,
        add_eos_token: opt_bool(g, "tokenizer.ggml.add_eos_token")?,
        add_space_prefix: opt_bool(g, "tokenizer.ggml.add_space_prefix")?,
    })
}

fn opt_str<'a>(g: &'a GgufFile, key: &str) -> Result<Option<&'a str>> {
    g.get_as(key, "a string", GgufValue::as_str)
}

fn opt_bool(g: &GgufFile, key: &str) -> Result<Option<bool>> {
    g.get_as(key, "a bool", GgufValue::as_bool)
}

fn opt_id(g: &GgufFile, key: &str) -> Result<Option<u32>> {
    g.get_as(key, "a token id", |v| {
        v.as_u64().and_then(|n| u32::try_from(n).ok())
    })
}

/// An optional array of strings, borrowed; absent gives an empty vector.
fn strings<'a>(g: &'a GgufFile, key: &str) -> Result<Vec<Cow<'a, str>>> {
    let Some(items) = g.get_as(key, "an array", GgufValue::as_array)? else {
        return Ok(Vec::new());
    };
    match items.as_strings() {
        Some(s) => Ok(s.iter().map(Cow::Borrowed).collect()),
        None if items.is_empty() => Ok(Vec::new()),
        None => Err(element_error(g, key, 0, items)),
    }
}

/// An optional array whose every element converts with `f`, or `whole` for the array at once
/// when it has the element type `whole` takes; absent gives an empty vector.
fn array<T>(
    g: &GgufFile,
    key: &str,
    whole: impl Fn(&GgufArray) -> Option<Vec<T>>,
    f: impl Fn(&GgufValue) -> Option<T>,
) -> Result<Vec<T>> {
    let Some(items) = g.get_as(key, "an array", GgufValue::as_array)? else {
        return Ok(Vec::new());
    };
    if let Some(v) = whole(items) {
        return Ok(v);
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| f(&item).ok_or_else(|| element_error(g, key, i, items)))
        .collect()
}

/// Element `i` of `items` is not what `key` holds.
fn element_error(g: &GgufFile, key: &str, i: usize, items: &GgufArray) -> ModelError {
    ModelError::Config {
        path: g.path().to_owned(),
        key: format!("{key}[{i}]"),
        msg: format!("unexpected element type {}", items.element_type_name()),
    }
}
