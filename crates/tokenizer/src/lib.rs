//! Text for Ferrum: tokenizers (from `tokenizer.json` or GGUF metadata), special tokens, chat
//! templates (minijinja with Hugging Face's extensions), the incremental detokenizer and stop
//! strings. Nothing here knows about tensors or the engine.

mod assets;
mod chat;
mod detokenizer;
mod error;
mod gguf_vocab;
mod message;
pub mod sandbox;
mod special;
mod spm;
mod stop;
mod template_fns;
mod token_bytes;
mod tokenizer;

pub use assets::{find_chat_template, TextAssets};
pub use chat::{ChatTemplate, TemplateMode};
pub use detokenizer::{IncrementalDetokenizer, CONTEXT_TOKENS, MAX_PENDING_TOKENS};
pub use error::{Result, TokenizerError};
pub use gguf_vocab::{GgufVocab, SUPPORTED_PRE};
pub use message::{ChatMessage, Content, ContentPart, FunctionCall, ToolCall};
pub use special::SpecialTokens;
pub use stop::{StopCheck, StopStrings};
pub use tokenizer::{load_special_tokens, Tokenizer};
