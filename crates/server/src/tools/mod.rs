//! Tool calling: the request's `tools` and `tool_choice` ([`request`]), the model family's
//! call format and the grammar that enforces it ([`mod@format`]), and the parser that turns the
//! model's output into `tool_calls`, streaming or whole ([`parser`]).
//!
//! Formats, chosen from the chat template (or `--tool-call-parser`):
//! - `hermes` (Qwen2.5, Qwen3): `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`,
//!   one block per call;
//! - `llama3` (Llama 3.1/3.2): `{"name": ..., "parameters": {...}}`, calls separated by `; `;
//! - `mistral`: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.
//!
//! With `auto`, calls written without the markup are read too (a bare call object opening the
//! answer, a fenced JSON block holding one; [`loose`]), when they name a declared function.
//!
//! `tool_choice: "required"` and a named function constrain the whole output to calls whose
//! arguments follow the function's `parameters` schema; `auto` leaves text free until the
//! model opens a call (a triggered grammar: the markup's opening, or a loose call's), then
//! constrains the call the same way; `none`
//! neither parses nor constrains.

pub mod format;
pub mod loose;
pub mod parser;
pub mod request;

pub use format::ToolFormat;
pub use loose::CallSyntax;
pub use parser::{ParsedCall, ToolCallParser, ToolEvent};
pub use request::{Tool, ToolChoice, ToolRequest};
