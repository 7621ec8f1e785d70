//! How the server renders chat templates: in a worker process ([`crate::sandbox`], what
//! `ferrum serve` does) or in-process (`--no-template-sandbox`, and library users).

use crate::sandbox::SandboxedTemplate;
use ferrum_tokenizer::{ChatMessage, ChatTemplate, Result};

/// A chat template and where it runs.
#[derive(Debug)]
pub enum Renderer {
    InProcess(Box<ChatTemplate>),
    Sandboxed(SandboxedTemplate),
}

impl Renderer {
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        match self {
            Renderer::InProcess(t) => t.render(messages, add_generation_prompt),
            Renderer::Sandboxed(t) => t.render(messages, add_generation_prompt),
        }
    }
}
