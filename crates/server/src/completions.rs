//! `POST /v1/completions`: one engine request per prompt (text or token ids), `n` samples
//! each; choice `p * n + i` is sample `i` of prompt `p`. Answered as one `text_completion` or
//! a stream of them.

use crate::error::{Result, ServerError};
use crate::generate::{collect, finite, Envelope, Merged, TokenLogprob};
use crate::json::json_response;
use crate::protocol::response::{CompletionChoice, CompletionLogprobs, CompletionObject};
use crate::protocol::{CompletionRequest, Prompt};
use crate::sse::{sse_response, ChunkFormat};
use crate::state::{unix_now, AppState};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use ferrum_engine::{GenerateRequest, Guide};
use ferrum_tokenizer::Tokenizer;
use ferrum_types::{FinishReason, TokenId};
use std::sync::Arc;

pub async fn completions(
    State(s): State<Arc<AppState>>,
    role: Option<axum::Extension<crate::state::KeyRole>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Result<Response> {
    let body = s.body(body)?;
    let req = CompletionRequest::from_body(&body)?;
    req.refuse_unsupported()?;
    let mut req = req.admit()?;
    if let Some(axum::Extension(r)) = role {
        r.apply(&mut req.opts);
    }
    s.check_model(req.opts.model.as_deref())?;
    let (tok, prompts, echo) = (s.tokenizer.clone(), req.prompts.clone(), req.echo);
    let skip_special = req.opts.params.skip_special_tokens;
    // (token ids, echoed text) per prompt, tokenized off the I/O threads.
    let encoded = tokio::task::spawn_blocking(move || -> Result<Vec<(Vec<TokenId>, String)>> {
        prompts
            .into_iter()
            .map(|p| match p {
                Prompt::Text(t) => {
                    let ids = tok.encode(&t, true)?;
                    Ok((ids, if echo { t } else { String::new() }))
                }
                Prompt::Ids(ids) => {
                    let text = if echo {
                        tok.decode(&ids, skip_special)
                            .map_err(|e| ServerError::param("prompt", e.to_string()))?
                    } else {
                        String::new()
                    };
                    Ok((ids, text))
                }
            })
            .collect()
    })
    .await
    .map_err(|e| ServerError::Internal(format!("tokenizing failed: {e}")))??;
    let guide = s.compile_constraint(&req.opts).await?;
    let (priority, tenant) = (req.opts.priority, req.opts.tenant.clone());
    let slo = s.slo(req.opts.slo.as_ref())?;
    let params = req.opts.params;
    for (ids, _) in &encoded {
        if ids.is_empty() {
            return Err(ServerError::param("prompt", "a prompt is empty"));
        }
        s.check_context(ids.len(), params.max_tokens, "prompt")?;
    }
    let n = params.n;
    let num_prompts = encoded.len();
    let requests = encoded
        .iter()
        .map(|(ids, _)| GenerateRequest {
            guide: guide.as_ref().map(Guide::fork),
            priority,
            tenant: tenant.clone(),
            slo,
            ..GenerateRequest::new(ids.clone(), params.clone())
        })
        .collect();
    let merged = Merged::submit(&s.engine, requests)?;
    let echoes: Vec<String> = encoded.into_iter().map(|(_, t)| t).collect();
    let mut fmt = CompletionChunks {
        env: Envelope {
            id: s.new_id("cmpl"),
            object: "text_completion",
            created: unix_now(),
            model: s.model_name.clone(),
        },
        n,
        echoes,
        logprobs: req.logprobs.is_some(),
        offsets: vec![0; num_prompts * n],
        tokenizer: s.tokenizer.clone(),
    };
    if req.opts.stream {
        return Ok(sse_response(merged, fmt, n, req.opts.include_usage));
    }
    let (choices, usage) = collect(merged, num_prompts, n).await?;
    let choices: Vec<CompletionChoice> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let echo = fmt.echoes[i / n].clone();
            let logprobs = fmt.logprobs.then(|| {
                fmt.offsets[i] = echo.chars().count();
                let mut lp = CompletionLogprobs::default();
                for l in &c.logprobs {
                    let text = fmt.tokenizer.token_text(l.token).unwrap_or_default();
                    fmt.add(&mut lp, i, &text, l);
                }
                lp
            });
            CompletionChoice {
                finish_reason: c.finish.as_ref().map(FinishReason::as_openai),
                index: i,
                logprobs,
                text: format!("{echo}{}", c.text),
            }
        })
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &fmt.env.wrap(choices, Some(&usage)),
    ))
}

struct CompletionChunks {
    env: Envelope,
    n: usize,
    /// Per prompt: the text echoed before its completions (empty without `echo`).
    echoes: Vec<String>,
    logprobs: bool,
    /// Per choice: characters of text so far, for `text_offset`.
    offsets: Vec<usize>,
    tokenizer: Arc<Tokenizer>,
}

type Chunk = CompletionObject<CompletionChoice>;

impl CompletionChunks {
    /// Appends one token; `text` is the token's own text (not the released delta).
    fn add(&mut self, lp: &mut CompletionLogprobs, choice: usize, text: &str, l: &TokenLogprob) {
        let top = l
            .top
            .iter()
            .map(|&(id, v)| (self.tokenizer.token_text(id).unwrap_or_default(), finite(v)))
            .collect();
        lp.tokens.push(text.to_string());
        lp.token_logprobs.push(finite(l.logprob));
        lp.top_logprobs.push(top);
        let off = self.offsets.get(choice).copied().unwrap_or(0);
        lp.text_offset.push(off);
        if let Some(o) = self.offsets.get_mut(choice) {
            *o += text.chars().count();
        }
    }

    fn chunk(
        &self,
        index: usize,
        text: &str,
        logprobs: Option<CompletionLogprobs>,
        finish: Option<&'static str>,
    ) -> Chunk {
        self.env.wrap(
            vec![CompletionChoice {
                finish_reason: finish,
                index,
                logprobs,
                text: text.to_string(),
            }],
            None,
        )
    }
}

impl ChunkFormat for CompletionChunks {
    type Choice = CompletionChoice;

    fn start(&mut self) -> Vec<Chunk> {
        let mut out = Vec::new();
        for choice in 0..self.echoes.len() * self.n {
            let echo = &self.echoes[choice / self.n];
            if !echo.is_empty() {
                self.offsets[choice] = echo.chars().count();
                out.push(self.chunk(choice, echo, None, None));
            }
        }
        out
    }

    fn token(&mut self, choice: usize, text: &str, lp: Option<TokenLogprob>) -> Vec<Chunk> {
        let logprobs = match (lp, self.logprobs) {
            (Some(l), true) => {
                let mut lists = CompletionLogprobs::default();
                let tok_text = self.tokenizer.token_text(l.token).unwrap_or_default();
                self.add(&mut lists, choice, &tok_text, &l);
                Some(lists)
            }
            _ => None,
        };
        if text.is_empty() && logprobs.is_none() {
            return Vec::new();
        }
        vec![self.chunk(choice, text, logprobs, None)]
    }

    fn finish(&mut self, choice: usize, text: &str, reason: &FinishReason) -> Vec<Chunk> {
        let mut out = Vec::with_capacity(2);
        if !text.is_empty() {
            out.push(self.chunk(choice, text, None, None));
        }
        out.push(self.chunk(choice, "", None, Some(reason.as_openai())));
        out
    }

    fn envelope(&self) -> &Envelope {
        &self.env
    }
}
