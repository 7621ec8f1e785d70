//! [`TextAssets`]: everything a model needs to turn text into ids and back, loaded from a
//! Hugging Face folder here (GGUF files are read by the models crate into a
//! [`crate::GgufVocab`] plus a template string).

use crate::tokenizer::{load_special_tokens, read_json_opt};
use crate::{ChatMessage, ChatTemplate, Result, TemplateMode, Tokenizer, TokenizerError};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;

/// A model's tokenizer and its chat template, if it has one.
#[derive(Debug)]
pub struct TextAssets {
    /// Shared with the engine, which detokenizes with it.
    pub tokenizer: Arc<Tokenizer>,
    pub chat_template: Option<ChatTemplate>,
}

impl TextAssets {
    /// Builds assets from a tokenizer and an optional template source (compiled in-process).
    pub fn new(tokenizer: Tokenizer, template: Option<&str>) -> Result<TextAssets> {
        TextAssets::new_with(tokenizer, template, &TemplateMode::InProcess)
    }

    /// Builds assets, the template compiled where `mode` says.
    pub fn new_with(
        tokenizer: Tokenizer,
        template: Option<&str>,
        mode: &TemplateMode,
    ) -> Result<TextAssets> {
        let chat_template = template
            .map(|src| ChatTemplate::with_mode(src, tokenizer.special(), mode))
            .transpose()?;
        Ok(TextAssets {
            tokenizer: Arc::new(tokenizer),
            chat_template,
        })
    }

    /// Loads `tokenizer.json`, the special tokens and the chat template from a folder.
    pub fn from_folder(dir: &Path) -> Result<TextAssets> {
        TextAssets::from_folder_with(dir, &TemplateMode::InProcess)
    }

    /// [`TextAssets::from_folder`], the template compiled where `mode` says.
    pub fn from_folder_with(dir: &Path, mode: &TemplateMode) -> Result<TextAssets> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(TokenizerError::Invalid(format!(
                "{}: no tokenizer.json in this model folder",
                dir.display()
            )));
        }
        let special = load_special_tokens(dir)?;
        let tokenizer = Tokenizer::from_json_file(&path, special)?;
        let template = find_chat_template(dir)?;
        TextAssets::new_with(tokenizer, template.as_deref(), mode)
    }

    /// The template, or the error that says the model has none.
    pub fn template(&self) -> Result<&ChatTemplate> {
        self.chat_template
            .as_ref()
            .ok_or(TokenizerError::NoChatTemplate)
    }

    /// Renders `messages` with the generation prompt and encodes the result (no BOS is added:
    /// the template writes the special tokens it wants).
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        let text = self.template()?.render(messages, true)?;
        self.tokenizer.encode(&text, false)
    }
}

/// The chat template of a folder: `chat_template.jinja`, then `chat_template.json`, then
/// `tokenizer_config.json`'s `chat_template` (a string, or a list of named templates of which
/// `default` is used).
pub fn find_chat_template(dir: &Path) -> Result<Option<String>> {
    let jinja = dir.join("chat_template.jinja");
    match std::fs::read_to_string(&jinja) {
        Ok(s) => return Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(TokenizerError::io(jinja, e)),
    }
    for file in ["chat_template.json", "tokenizer_config.json"] {
        let path = dir.join(file);
        let Some(v) = read_json_opt(&path)? else {
            continue;
        };
        match v.get("chat_template") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => return Ok(Some(s.clone())),
            Some(Value::Array(list)) => {
                let named = |name: &str| {
                    list.iter().find_map(|t| {
                        (t.get("name")?.as_str()? == name)
                            .then(|| t.get("template")?.as_str().map(str::to_owned))
                            .flatten()
                    })
                };
                return match named("default") {
                    Some(s) => Ok(Some(s)),
                    None => Err(TokenizerError::Json {
                        path,
                        message: "chat_template is a list without a 'default' template".into(),
                    }),
                };
            }
            Some(_) => {
                return Err(TokenizerError::Json {
                    path,
                    message: "chat_template must be a string or a list of named templates".into(),
                })
            }
        }
    }
    Ok(None)
}
