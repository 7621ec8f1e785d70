//! `POST /v1/chat/completions`: messages through the model's chat template, one engine
//! request with `n` samples, answered as one `chat.completion` or a stream of
//! `chat.completion.chunk`s. With tools, each choice's output goes through the tool-call
//! parser of the model's format ([`crate::tools`]): calls become `tool_calls` (in a stream,
//! the call's index, id and name first, then its arguments in pieces) with
//! `finish_reason: "tool_calls"`, and none of the call markup reaches `content`.

use crate::error::{Result, ServerError};
use crate::generate::{collect, finite, Envelope, Merged, TokenLogprob};
use crate::json::json_response;
use crate::protocol::response::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatLogprobs, CompletionObject, Delta,
    FunctionDelta, FunctionOut, TokenLogprobEntry, ToolCallDelta, ToolCallOut, TopLogprob,
};
use crate::protocol::{AdmittedChat, ChatCompletionRequest};
use crate::sse::{sse_response, ChunkFormat};
use crate::state::{unix_now, AppState};
use crate::tools::parser::{parse_whole, split_output};
use crate::tools::{CallSyntax, ParsedCall, ToolCallParser, ToolEvent, ToolRequest};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use ferrum_engine::GenerateRequest;
use ferrum_tokenizer::Tokenizer;
use ferrum_types::{FinishReason, StructuredOutput, TokenId};
use std::sync::Arc;

pub async fn chat_completions(
    State(s): State<Arc<AppState>>,
    role: Option<axum::Extension<crate::state::KeyRole>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let body = s.body(body)?;
    let req = ChatCompletionRequest::from_body(&body)?;
    req.refuse_unsupported()?;
    let mut req = req.admit()?;
    if let Some(axum::Extension(r)) = role {
        r.apply(&mut req.opts);
    }
    s.check_model(req.opts.model.as_deref())?;
    let started = start_chat(&s, &mut req).await?;
    let (merged, calls, n) = (started.merged, started.calls, started.n);
    let fmt = ChatChunks {
        env: Envelope {
            id: s.new_id("chatcmpl"),
            object: if req.opts.stream {
                "chat.completion.chunk"
            } else {
                "chat.completion"
            },
            created: unix_now(),
            model: s.model_name.clone(),
        },
        n,
        logprobs: req.logprobs,
        tokenizer: s.tokenizer.clone(),
        parsers: (0..n)
            .map(|_| calls.clone().map(ToolCallParser::new))
            .collect(),
    };
    if req.opts.stream {
        return Ok(sse_response(merged, fmt, n, req.opts.include_usage));
    }
    let (choices, usage) = collect(merged, 1, n).await?;
    let choices: Vec<ChatChoice> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (content, calls) = match &calls {
                Some(syntax) => parse_whole(syntax, &c.text),
                None => (c.text.clone(), Vec::new()),
            };
            let tool_calls: Vec<ToolCallOut> = calls
                .into_iter()
                .enumerate()
                .map(|(k, call)| ToolCallOut {
                    id: fmt.call_id(i, k),
                    kind: "function",
                    function: FunctionOut {
                        name: call.name,
                        arguments: call.arguments,
                    },
                })
                .collect();
            ChatChoice {
                finish_reason: c
                    .finish
                    .as_ref()
                    .map(|f| finish_reason(f, !tool_calls.is_empty())),
                index: i,
                logprobs: req.logprobs.then(|| ChatLogprobs {
                    content: c.logprobs.iter().map(|l| fmt.entry(l)).collect(),
                }),
                message: AssistantMessage {
                    content: (tool_calls.is_empty() || !content.is_empty()).then_some(content),
                    role: "assistant",
                    tool_calls,
                },
            }
        })
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &fmt.env.wrap(choices, Some(&usage)),
    ))
}

/// A chat request submitted to the engine: its events, and what reading them needs.
#[derive(Debug)]
pub struct StartedChat {
    pub merged: Merged,
    /// How its output is read for tool calls, when it has tools.
    pub calls: Option<CallSyntax>,
    /// Prompt tokens (the rendered conversation).
    pub prompt_tokens: usize,
    pub n: usize,
}

/// A one-sample answer, whole: its text split into content and tool calls (when the request
/// has tools), its finish and usage.
#[derive(Debug)]
pub struct WholeAnswer {
    pub content: String,
    pub calls: Vec<ParsedCall>,
    pub finish: Option<FinishReason>,
    pub usage: ferrum_engine::Usage,
}

/// Reads a started one-sample chat to its end (the Responses and Messages routes).
pub async fn whole_answer(started: StartedChat) -> Result<WholeAnswer> {
    let (choices, usage) = collect(started.merged, 1, 1).await?;
    let choice = choices.into_iter().next().unwrap_or_default();
    let (content, calls) = match &started.calls {
        Some(syntax) => parse_whole(syntax, &choice.text),
        None => (choice.text, Vec::new()),
    };
    Ok(WholeAnswer {
        content,
        calls,
        finish: choice.finish,
        usage,
    })
}

/// The prompt of an admitted chat: the conversation through the chat template (and the
/// assistant prefill after it, when the last message is one), tokenized on the blocking pool.
pub async fn chat_prompt(s: &AppState, req: &AdmittedChat) -> Result<Vec<TokenId>> {
    let Some(template) = s.template.clone() else {
        return Err(ServerError::bad(
            "this model has no chat template; use /v1/completions with a prompt",
        ));
    };
    // Rendering and tokenizing a long conversation is CPU work: keep it off the I/O threads.
    let (tok, messages, tools, add_gen, prefill) = (
        s.tokenizer.clone(),
        req.messages.clone(),
        req.tools.clone(),
        req.add_generation_prompt,
        req.prefill.clone(),
    );
    tokio::task::spawn_blocking(move || -> Result<Vec<TokenId>> {
        let mut text = template.render_with_tools(&messages, tools.as_ref(), add_gen)?;
        if let Some(p) = prefill {
            text.push_str(&p);
        }
        Ok(tok.encode(&text, false)?)
    })
    .await
    .map_err(|e| ServerError::Internal(format!("tokenizing failed: {e}")))?
}

/// What every chat-shaped route (chat completions, Responses, Anthropic Messages) does once
/// its body is admitted: render and tokenize the prompt, turn tools into their call grammar,
/// compile the constraint, check the context, and submit one engine request with `n`
/// samples. `req.opts` is updated with what the tools imply.
pub async fn start_chat(s: &AppState, req: &mut AdmittedChat) -> Result<StartedChat> {
    let prompt = chat_prompt(s, req).await?;
    let calls = match &req.tool_request {
        Some(tr) => {
            let format = s.tool_format.ok_or_else(|| {
                ServerError::param(
                    "tools",
                    "this model's chat template does not take tools (or its call format is not known: pass --tool-call-parser)",
                )
            })?;
            req.opts.params.structured = format.constraint(tr, &s.tokenizer);
            req.opts.constraint_param = Some("tools".into());
            // Call markup made of special tokens must reach the parser as text.
            if format.markup_is_special(&s.tokenizer) {
                req.opts.params.skip_special_tokens = false;
            }
            Some(format.syntax(tr))
        }
        None => None,
    };
    let guide = match s.compile_constraint(&req.opts).await {
        Ok(g) => g,
        // Name the tool whose parameters do not compile.
        Err(e) => return Err(tool_error(s, req.tool_request.as_ref(), e).await),
    };
    let params = req.opts.params.clone();
    s.check_context(prompt.len(), params.max_tokens, req.prompt_param)?;
    let n = params.n;
    let prompt_tokens = prompt.len();
    let mut request = GenerateRequest::new(prompt, params);
    request.guide = guide;
    request.priority = req.opts.priority;
    request.tenant = req.opts.tenant.clone();
    request.slo = s.slo(req.opts.slo.as_ref())?;
    let merged = Merged::submit(&s.engine, vec![request])?;
    Ok(StartedChat {
        merged,
        calls,
        prompt_tokens,
        n,
    })
}

/// A token as OpenAI's logprob objects show it: text, logprob and UTF-8 bytes.
pub fn top_logprob(tok: &Tokenizer, id: TokenId, logprob: f32) -> TopLogprob {
    let text = tok.token_text(id).unwrap_or_default();
    TopLogprob {
        bytes: text.as_bytes().to_vec(),
        logprob: finite(logprob),
        token: text,
    }
}

/// A tool-call grammar that does not compile: the 400 names the first tool whose `parameters`
/// schema does not compile on its own, when one does not.
async fn tool_error(s: &AppState, tools: Option<&ToolRequest>, e: ServerError) -> ServerError {
    let Some(tools) = tools else {
        return e;
    };
    for (i, t) in tools.tools.iter().enumerate() {
        let engine = s.engine.clone();
        let spec = StructuredOutput::JsonSchema {
            schema: t.parameters.to_string(),
            strict: true,
        };
        let compiled = tokio::task::spawn_blocking(move || engine.compile_guide(&spec)).await;
        if let Ok(Err(err)) = compiled {
            let p = format!("tools[{i}].function.parameters");
            return ServerError::param(p.clone(), format!("'{p}': {err}"));
        }
    }
    e
}

/// `tool_calls` when a choice that made calls stopped, else OpenAI's reason.
fn finish_reason(f: &FinishReason, has_calls: bool) -> &'static str {
    match f.as_openai() {
        "stop" if has_calls => "tool_calls",
        r => r,
    }
}

struct ChatChunks {
    env: Envelope,
    n: usize,
    logprobs: bool,
    tokenizer: Arc<Tokenizer>,
    /// Per choice, the tool-call parser when the request has tools.
    parsers: Vec<Option<ToolCallParser>>,
}

type Chunk = CompletionObject<ChatChunkChoice>;

impl ChatChunks {
    /// The id of call `k` of choice `choice`: unique per response.
    fn call_id(&self, choice: usize, k: usize) -> String {
        let base = self.env.id.trim_start_matches("chatcmpl-");
        format!("call_{base}_{choice}_{k}")
    }

    /// The deltas of a choice's text: as it is, or through its tool-call parser.
    fn deltas(&mut self, choice: usize, text: &str, last: bool) -> Vec<Delta> {
        let parser = self.parsers.get_mut(choice).and_then(Option::as_mut);
        let events = split_output(parser, text, last);
        events
            .into_iter()
            .map(|ev| match ev {
                ToolEvent::Content(t) => text_delta(&t),
                ToolEvent::CallStart { index, name } => Delta {
                    tool_calls: Some(vec![ToolCallDelta {
                        index,
                        id: Some(self.call_id(choice, index)),
                        kind: Some("function"),
                        function: FunctionDelta {
                            name: Some(name),
                            arguments: String::new(),
                        },
                    }]),
                    ..Delta::default()
                },
                ToolEvent::Arguments { index, text } => Delta {
                    tool_calls: Some(vec![ToolCallDelta {
                        index,
                        id: None,
                        kind: None,
                        function: FunctionDelta {
                            name: None,
                            arguments: text,
                        },
                    }]),
                    ..Delta::default()
                },
            })
            .collect()
    }

    fn entry(&self, l: &TokenLogprob) -> TokenLogprobEntry {
        let t = top_logprob(&self.tokenizer, l.token, l.logprob);
        TokenLogprobEntry {
            bytes: t.bytes,
            logprob: t.logprob,
            token: t.token,
            top_logprobs: l
                .top
                .iter()
                .map(|&(id, lp)| top_logprob(&self.tokenizer, id, lp))
                .collect(),
        }
    }

    fn chunk(
        &self,
        index: usize,
        delta: Delta,
        logprobs: Option<ChatLogprobs>,
        finish: Option<&'static str>,
    ) -> Chunk {
        self.env.wrap(
            vec![ChatChunkChoice {
                delta,
                finish_reason: finish,
                index,
                logprobs,
            }],
            None,
        )
    }
}

fn text_delta(text: &str) -> Delta {
    Delta {
        content: Some(text.to_string()),
        ..Delta::default()
    }
}

impl ChunkFormat for ChatChunks {
    type Choice = ChatChunkChoice;

    fn start(&mut self) -> Vec<Chunk> {
        (0..self.n)
            .map(|i| {
                let delta = Delta {
                    content: Some(String::new()),
                    role: Some("assistant"),
                    tool_calls: None,
                };
                self.chunk(i, delta, None, None)
            })
            .collect()
    }

    fn token(&mut self, choice: usize, text: &str, lp: Option<TokenLogprob>) -> Vec<Chunk> {
        let mut logprobs = match (&lp, self.logprobs) {
            (Some(l), true) => Some(ChatLogprobs {
                content: vec![self.entry(l)],
            }),
            _ => None,
        };
        let mut deltas = self.deltas(choice, text, false);
        if deltas.is_empty() && logprobs.is_some() {
            deltas.push(Delta::default());
        }
        deltas
            .into_iter()
            .map(|d| self.chunk(choice, d, logprobs.take(), None))
            .collect()
    }

    fn finish(&mut self, choice: usize, text: &str, reason: &FinishReason) -> Vec<Chunk> {
        let mut out: Vec<Chunk> = self
            .deltas(choice, text, true)
            .into_iter()
            .map(|d| self.chunk(choice, d, None, None))
            .collect();
        let has_calls = self
            .parsers
            .get(choice)
            .and_then(Option::as_ref)
            .is_some_and(|p| !p.calls().is_empty());
        out.push(self.chunk(
            choice,
            Delta::default(),
            None,
            Some(finish_reason(reason, has_calls)),
        ));
        out
    }

    fn envelope(&self) -> &Envelope {
        &self.env
    }
}
