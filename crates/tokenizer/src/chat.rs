//! Chat templates: the model's Jinja template rendered with minijinja the way transformers'
//! `apply_chat_template` renders it (trim_blocks, lstrip_blocks, no trailing newline kept, the
//! special tokens and `add_generation_prompt` in the context, HF's extension functions).
//!
//! Rendering is bounded: templates run with a fuel limit and minijinja's recursion limit, so a
//! hostile template fails with an error instead of hanging; the output goes into a writer that
//! refuses more than 1 MiB plus four times the messages' text (a loop printing 100 kB strings
//! 100,000 times fails at the cap instead of filling memory); minijinja refuses string
//! repetition over 100 MB and ranges over 100,000 items. What no in-process check can stop:
//! lazily repeated sequences materialized by a filter (`(range(100000) * 30000)|list` asks for
//! 72 GB) or printed (`messages * 100000000` iterates for seconds after the output cap), and
//! strings concatenated with themselves step after step; `ferrum serve` therefore renders in
//! a memory-capped worker process with a timeout ([`crate::sandbox`]).

use crate::sandbox::TemplateWorker;
use crate::template_fns::{indent, raise_exception, strftime_now, tojson};
use crate::{ChatMessage, Result, SpecialTokens, TokenizerError};
use minijinja::{Environment, Value};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Instructions a single render may execute.
const FUEL: u64 = 20_000_000;
const TEMPLATE_NAME: &str = "chat";
/// Rendered text allowed beyond four times the messages' own text.
const RENDER_SLACK_BYTES: usize = 1 << 20;
/// Collects rendered output, refusing to grow past its cap.
struct Capped {
    buf: Vec<u8>,
    cap: usize,
    overflowed: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + b.len() > self.cap {
            self.overflowed = true;
            return Err(std::io::Error::other("chat template output over the cap"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Where a chat template is compiled and rendered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum TemplateMode {
    /// In this process: fastest, but a hostile template can exhaust its memory.
    #[default]
    InProcess,
    /// In a memory-capped worker process running this executable (which must dispatch
    /// [`crate::sandbox::WORKER_ARG`] to [`crate::sandbox::worker_main`]); see
    /// [`crate::sandbox`].
    Worker(std::path::PathBuf),
}

enum Engine {
    InProcess(Box<Environment<'static>>),
    Worker(TemplateWorker),
}

/// A compiled chat template.
pub struct ChatTemplate {
    engine: Engine,
    source: String,
    bos_token: String,
    eos_token: String,
    pad_token: Option<String>,
    unk_token: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source` where `mode` says; syntax errors are reported here, not at the first
    /// request.
    pub fn with_mode(
        source: &str,
        special: &SpecialTokens,
        mode: &TemplateMode,
    ) -> Result<ChatTemplate> {
        match mode {
            TemplateMode::InProcess => ChatTemplate::new(source, special),
            TemplateMode::Worker(exe) => ChatTemplate::in_worker(source, special, exe),
        }
    }

    /// Compiles and renders `source` in a worker process running `exe` (see
    /// [`crate::sandbox`]); this process never compiles it.
    pub fn in_worker(
        source: &str,
        special: &SpecialTokens,
        exe: &std::path::Path,
    ) -> Result<ChatTemplate> {
        let worker = TemplateWorker::start(exe.to_path_buf(), source, special)?;
        Ok(ChatTemplate::assemble(
            Engine::Worker(worker),
            source,
            special,
        ))
    }

    fn assemble(engine: Engine, source: &str, special: &SpecialTokens) -> ChatTemplate {
        ChatTemplate {
            engine,
            source: source.to_owned(),
            bos_token: special.bos_token.clone().unwrap_or_default(),
            eos_token: special.eos_token.clone().unwrap_or_default(),
            pad_token: special.pad_token.clone(),
            unk_token: special.unk_token.clone(),
        }
    }

    /// Whether this template runs in a worker process.
    pub fn is_sandboxed(&self) -> bool {
        matches!(self.engine, Engine::Worker(_))
    }

    /// Compiles `source` in this process; syntax errors are reported here, not at the first
    /// request.
    pub fn new(source: &str, special: &SpecialTokens) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_filter("indent", indent);
        let cleaned = strip_generation_tags(source);
        // minijinja has panicked on some malformed templates (found by fuzzing): a panic is one
        // more way for a template to be bad, not a reason to take the process down.
        catch_unwind(AssertUnwindSafe(|| {
            env.add_template_owned(TEMPLATE_NAME, cleaned)
        }))
        .map_err(|p| panicked("compiling", p.as_ref()))?
        .map_err(|e| TokenizerError::Template(describe(&e)))?;
        Ok(ChatTemplate::assemble(
            Engine::InProcess(Box::new(env)),
            source,
            special,
        ))
    }

    /// The template text as the model ships it.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The special tokens the template sees (`bos_token`, `eos_token`, `pad_token`,
    /// `unk_token`; the other fields are defaults).
    pub fn special(&self) -> SpecialTokens {
        SpecialTokens {
            bos_token: Some(self.bos_token.clone()).filter(|t| !t.is_empty()),
            eos_token: Some(self.eos_token.clone()).filter(|t| !t.is_empty()),
            pad_token: self.pad_token.clone(),
            unk_token: self.unk_token.clone(),
            ..SpecialTokens::default()
        }
    }

    /// Renders a conversation to the prompt text.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// Renders a conversation to the prompt text, with the request's `tools` (OpenAI's array
    /// of tool definitions) as the template's `tools` variable when given; without them
    /// `tools` is left undefined, as it always was.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let env = match &self.engine {
            Engine::InProcess(env) => env,
            Engine::Worker(w) => return w.render(messages, tools, add_generation_prompt),
        };
        let msgs: Vec<Value> = messages.iter().map(ChatMessage::to_template).collect();
        let mut ctx = vec![
            ("messages", Value::from(msgs)),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
            ("bos_token", Value::from(self.bos_token.as_str())),
            ("eos_token", Value::from(self.eos_token.as_str())),
        ];
        if let Some(p) = &self.pad_token {
            ctx.push(("pad_token", Value::from(p.as_str())));
        }
        if let Some(u) = &self.unk_token {
            ctx.push(("unk_token", Value::from(u.as_str())));
        }
        if let Some(t) = tools {
            ctx.push(("tools", Value::from_serialize(t)));
        }
        let tmpl = env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TokenizerError::Template(describe(&e)))?;
        let tools_len = tools.map_or(0, |t| t.to_string().len());
        let text: usize = messages.iter().map(ChatMessage::text_len).sum::<usize>() + tools_len;
        let mut out = Capped {
            buf: Vec::new(),
            cap: text.saturating_mul(4).saturating_add(RENDER_SLACK_BYTES),
            overflowed: false,
        };
        let rendered = catch_unwind(AssertUnwindSafe(|| {
            tmpl.render_captured_to(Value::from_iter(ctx), &mut out)
        }))
        .map_err(|p| panicked("rendering", p.as_ref()))?;
        match rendered {
            Ok(_) => {}
            Err(_) if out.overflowed => {
                return Err(TokenizerError::Template(format!(
                    "the chat template's output grew past {} bytes (1 MiB plus four times the messages' text)",
                    out.cap
                )))
            }
            Err(e) => return Err(TokenizerError::Template(describe(&e))),
        }
        String::from_utf8(out.buf).map_err(|e| {
            TokenizerError::Template(format!("the chat template rendered invalid UTF-8: {e}"))
        })
    }
}

/// The error for a panic inside minijinja.
fn panicked(what: &str, p: &(dyn std::any::Any + Send)) -> TokenizerError {
    let msg = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    TokenizerError::Template(format!(
        "the template engine failed while {what} the chat template: {msg}"
    ))
}

/// An error message with minijinja's cause chain and location.
fn describe(e: &minijinja::Error) -> String {
    let mut msg = match e.line() {
        Some(line) => format!("{e} (line {line})"),
        None => e.to_string(),
    };
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(&format!(": {s}"));
        src = s.source();
    }
    msg
}

/// Removes transformers' `{% generation %}` / `{% endgeneration %}` markers (they only track
/// assistant spans for training masks and render nothing).
fn strip_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(start) = rest.find("{%") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("%}") else {
            break;
        };
        let inner = after[..end].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        out.push_str(&rest[..start]);
        if inner != "generation" && inner != "endgeneration" {
            out.push_str(&rest[start..start + 2 + end + 2]);
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn special() -> SpecialTokens {
        SpecialTokens {
            bos_token: Some("<s>".into()),
            eos_token: Some("</s>".into()),
            ..Default::default()
        }
    }

    fn render(src: &str, msgs: &[ChatMessage]) -> Result<String> {
        ChatTemplate::new(src, &special())?.render(msgs, true)
    }

    #[test]
    /// Expected strings were produced by Python jinja2 with transformers' settings.
    fn hf_whitespace_rules_and_special_tokens() {
        let src = "{{ bos_token }}\n{% for m in messages %}\n  {{ m.role }}: {{ m.content }}\n{% endfor %}\n{% if add_generation_prompt %}A:{% endif %}\n";
        let out = render(src, &[ChatMessage::new("user", "hi")]).unwrap();
        assert_eq!(out, "<s>\n  user: hi\nA:"); // as Python jinja2 renders it
    }

    #[test]
    fn raise_exception_surfaces_the_message() {
        let src = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}";
        let err = render(src, &[ChatMessage::new("assistant", "x")]).unwrap_err();
        assert!(
            err.to_string()
                .contains("Conversation roles must alternate"),
            "{err}"
        );
    }

    #[test]
    fn python_methods_and_tojson() {
        let src = "{{ messages[0].content.strip().upper() }}|{{ messages[0].content.startswith(' a') }}|{{ messages | tojson }}|{{ {'a': [1, 2.5, none]} | tojson(indent=2) }}";
        let out = render(src, &[ChatMessage::new("user", " a<b>\"é\" ")]).unwrap();
        assert_eq!(
            out,
            "A<B>\"É\"|True|[{\"role\": \"user\", \"content\": \" a<b>\\\"é\\\" \"}]|{\n  \"a\": [\n    1,\n    2.5,\n    null\n  ]\n}"
        );
    }

    #[test]
    fn structured_messages_and_tools_reach_the_template() {
        use crate::{Content, ContentPart, FunctionCall, ToolCall};
        let src = "{% if tools %}{{ tools[0].function.name }}|{% endif %}{% for m in messages %}{{ m.role }}:{{ m.content }}{% if m.tool_calls is defined %}{% for c in m.tool_calls %}[{{ c.id }} {{ c.function.name }} {{ c.function.arguments.x }}]{% endfor %}{% endif %}{% if m.tool_call_id is defined %}({{ m.tool_call_id }} {{ m.name }}){% endif %};{% endfor %}";
        let parts = ChatMessage {
            role: "user".into(),
            content: Content::Parts(vec![
                ContentPart::Text { text: "a".into() },
                ContentPart::Text { text: "b".into() },
            ]),
            ..ChatMessage::default()
        };
        let call = ChatMessage {
            role: "assistant".into(),
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                kind: "function".into(),
                function: FunctionCall {
                    name: "f".into(),
                    arguments: r#"{"x": 7}"#.into(),
                },
            }],
            ..ChatMessage::default()
        };
        let answer = ChatMessage {
            role: "tool".into(),
            content: Content::Text("42".into()),
            tool_call_id: Some("c1".into()),
            name: Some("f".into()),
            ..ChatMessage::default()
        };
        let tools = serde_json::json!([{"type": "function", "function": {"name": "f"}}]);
        let t = ChatTemplate::new(src, &special()).unwrap();
        let msgs = [parts, call, answer];
        let out = t.render_with_tools(&msgs, Some(&tools), false).unwrap();
        assert_eq!(out, "f|user:ab;assistant:[c1 f 7];tool:42(c1 f);");
        // Without tools the variable stays undefined, as before.
        let out = t.render(&msgs[..1], false).unwrap();
        assert_eq!(out, "user:ab;");
    }

    #[test]
    fn generation_markers_render_nothing() {
        let src = "{% for m in messages %}{%- generation -%}{{ m.content }}{%- endgeneration -%}{% endfor %}";
        assert_eq!(
            render(src, &[ChatMessage::new("assistant", "ok")]).unwrap(),
            "ok"
        );
    }

    #[test]
    fn syntax_errors_and_runaway_templates_are_errors() {
        assert!(ChatTemplate::new("{% for %}", &special()).is_err());
        let looping =
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let err = render(looping, &[]).unwrap_err();
        assert!(err.to_string().contains("fuel"), "{err}");
        let recursive = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
        assert!(render(recursive, &[]).is_err());
        // 100,000 x 100 kB of output would be 10 GB: stopped at the cap.
        let flood = "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}";
        let err = render(flood, &[]).unwrap_err();
        assert!(err.to_string().contains("grew past 1048576 bytes"), "{err}");
        let huge = "{{ 'x' * 10000000000 }}";
        assert!(render(huge, &[]).is_err());
        let wide = "{{ 'a\nb'|indent(600000000) }}";
        assert!(render(wide, &[])
            .unwrap_err()
            .to_string()
            .contains("at most 256"));
        let wide_json = "{{ messages|tojson(indent=100000000) }}";
        assert!(render(wide_json, &[]).is_err());
        // minijinja 2.24 panics compiling this (found by crates/fuzz): an error here.
        let err = ChatTemplate::new("{% import 'x' as y %te%}", &special()).unwrap_err();
        assert!(err.to_string().contains("chat template"), "{err}");
    }

    #[test]
    fn indent_works_as_in_jinja() {
        let msgs = [ChatMessage::new("user", "a\n\nb\n")];
        let out = |f: &str| render(&format!("{{{{ messages[0].content|{f} }}}}"), &msgs).unwrap();
        assert_eq!(out("indent"), "a\n\n    b");
        assert_eq!(out("indent(2, true)"), "  a\n\n  b");
        assert_eq!(out("indent(2, blank=true)"), "a\n  \n  b");
        assert_eq!(out("indent('> ', first=true)"), "> a\n\n> b");
        assert_eq!(out("indent(width=1)"), "a\n\n b");
    }

    #[test]
    fn strftime_now_is_available() {
        let out = render("{{ strftime_now('%Y') }}", &[]).unwrap();
        assert_eq!(out.len(), 4);
        assert!(out.starts_with('2'));
    }
}
