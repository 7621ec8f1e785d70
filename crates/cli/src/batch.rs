//! Offline batch mode: `ferrum run --prompts-file in.jsonl [--output out.jsonl]`. Every line
//! runs through the batching engine at once; results are written in input order and the
//! throughput is printed at the end.
//!
//! Input line: `prompt` (text) or `prompt_ids`, optionally `max_tokens`, `temperature`,
//! `top_p`, `top_k`, `min_p`, `seed`, `stop` (string or list), `n`, `chat` (bool); the command
//! line's sampling flags are the defaults. Output line: `index`, `token_ids`, `text`,
//! `finish_reason` (with `n > 1`: `index` and a list `outputs` of those).

use crate::common::{load_parts, EngineArgs, ModelArgs, SamplingArgs};
use crate::parallel::Launch;
use anyhow::{bail, Context, Result};
use ferrum_engine::{Event, GenerateRequest};
use ferrum_tokenizer::{ChatMessage, TextAssets};
use ferrum_types::{SamplingParams, TokenId};
use serde_json::{json, Value};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

pub fn run_batch(
    model: &ModelArgs,
    engine: &EngineArgs,
    sampling: &SamplingArgs,
    input: &Path,
    output: Option<&Path>,
    launch: &Launch,
) -> Result<()> {
    let text =
        std::fs::read_to_string(input).with_context(|| format!("reading {}", input.display()))?;
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| (i + 1, l))
        .collect();
    if lines.is_empty() {
        bail!("{}: no prompts", input.display());
    }
    let (m, assets, load_time) = load_parts(model, launch)?;
    let vocab = m.config().vocab_size;
    let defaults = sampling.params(vocab)?;
    let (tokenizer, template) = match assets {
        Ok(TextAssets {
            tokenizer,
            chat_template,
        }) => (Some(tokenizer), chat_template),
        Err(_) => (None, None),
    };
    // Parse every line before starting, so a bad line fails fast and names itself.
    let mut requests = Vec::with_capacity(lines.len());
    for &(no, line) in &lines {
        let v: Value = serde_json::from_str(line)
            .with_context(|| format!("{}:{no}: invalid JSON", input.display()))?;
        let req = parse_line(&v, &defaults, tokenizer.as_deref(), template.as_ref())
            .with_context(|| format!("{}:{no}", input.display()))?;
        requests.push(req);
    }
    let cfg = engine.config(model, requests.len())?;
    let handle = crate::common::start_engine(m, tokenizer, &cfg, &engine.speculative, model)?;
    let start = Instant::now();
    let mut streams = Vec::with_capacity(requests.len());
    for (i, r) in requests.into_iter().enumerate() {
        let no = lines[i].0;
        streams.push(
            handle
                .generate(r)
                .with_context(|| format!("{}:{no}", input.display()))?,
        );
    }
    let mut out: Box<dyn Write> = match output {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(std::io::stdout().lock()),
    };
    let (mut prompt_tokens, mut gen_tokens) = (0usize, 0usize);
    for (index, mut s) in streams.into_iter().enumerate() {
        let mut samples: Vec<(Vec<TokenId>, String, &'static str)> = Vec::new();
        loop {
            match s.blocking_next() {
                Some(Event::Token {
                    index: k,
                    token,
                    text,
                    ..
                }) => {
                    if samples.len() <= k {
                        samples.resize(k + 1, (Vec::new(), String::new(), ""));
                    }
                    samples[k].0.push(token);
                    samples[k].1.push_str(&text);
                }
                Some(Event::Finished {
                    index: k,
                    reason,
                    text,
                }) => {
                    if samples.len() <= k {
                        samples.resize(k + 1, (Vec::new(), String::new(), ""));
                    }
                    samples[k].1.push_str(&text);
                    samples[k].2 = reason.as_openai();
                }
                Some(Event::Done { usage }) => {
                    prompt_tokens += usage.prompt_tokens;
                    gen_tokens += usage.completion_tokens;
                    break;
                }
                Some(Event::Error(e)) => bail!("{}:{}: {e}", input.display(), lines[index].0),
                None => bail!("the engine stopped"),
            }
        }
        let obj = |(ids, text, finish): &(Vec<TokenId>, String, &str)| json!({ "token_ids": ids, "text": text, "finish_reason": finish });
        let line = if samples.len() == 1 {
            let mut o = obj(&samples[0]);
            o["index"] = json!(index);
            o
        } else {
            json!({ "index": index, "outputs": samples.iter().map(obj).collect::<Vec<_>>() })
        };
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    let secs = start.elapsed().as_secs_f64();
    let m = handle.metrics();
    handle.shutdown();
    eprintln!(
        "[load {:.2}s | {} requests in {secs:.2}s: {:.2} req/s | {prompt_tokens} prompt tokens, {gen_tokens} generated: {:.1} output tok/s | prefix cache hits {} of {} tokens | {} preemptions]",
        load_time.as_secs_f64(),
        lines.len(),
        lines.len() as f64 / secs,
        gen_tokens as f64 / secs,
        m.prefix_cache_hits,
        m.prefix_cache_queries,
        m.preemptions,
    );
    Ok(())
}

fn parse_line(
    v: &Value,
    defaults: &SamplingParams,
    tokenizer: Option<&ferrum_tokenizer::Tokenizer>,
    template: Option<&ferrum_tokenizer::ChatTemplate>,
) -> Result<GenerateRequest> {
    let Some(obj) = v.as_object() else {
        bail!("each line must be a JSON object");
    };
    let mut p = defaults.clone();
    let num = |k: &str| -> Result<Option<f64>> {
        match obj.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_f64()
                .map(Some)
                .with_context(|| format!("`{k}` must be a number")),
        }
    };
    let uint = |k: &str| -> Result<Option<u64>> {
        match obj.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_u64()
                .map(Some)
                .with_context(|| format!("`{k}` must be a non-negative integer")),
        }
    };
    if let Some(x) = uint("max_tokens")? {
        p.max_tokens = Some(x as usize);
    }
    if let Some(x) = num("temperature")? {
        p.temperature = x as f32;
    }
    if let Some(x) = num("top_p")? {
        p.top_p = x as f32;
    }
    if let Some(x) = num("min_p")? {
        p.min_p = x as f32;
    }
    if let Some(x) = uint("top_k")? {
        p.top_k = (x > 0).then_some(x as usize);
    }
    if let Some(x) = uint("seed")? {
        p.seed = Some(x);
    }
    if let Some(x) = uint("n")? {
        p.n = x as usize;
    }
    match obj.get("stop") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => p.stop = vec![s.clone()],
        Some(Value::Array(a)) => {
            p.stop = a
                .iter()
                .map(|s| {
                    s.as_str()
                        .map(str::to_owned)
                        .context("`stop` must be a string or a list of strings")
                })
                .collect::<Result<_>>()?;
        }
        Some(_) => bail!("`stop` must be a string or a list of strings"),
    }
    let chat = match obj.get("chat") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => bail!("`chat` must be true or false"),
    };
    let prompt: Vec<TokenId> = match (obj.get("prompt"), obj.get("prompt_ids")) {
        (Some(_), Some(_)) => bail!("give `prompt` or `prompt_ids`, not both"),
        (Some(Value::String(t)), None) => {
            let tok =
                tokenizer.context("text prompts need a tokenizer, and this model has none")?;
            if chat {
                let tmpl = template.ok_or(ferrum_tokenizer::TokenizerError::NoChatTemplate)?;
                let rendered = tmpl.render(&[ChatMessage::new("user", t.as_str())], true)?;
                tok.encode(&rendered, false)?
            } else {
                tok.encode(t, true)?
            }
        }
        (Some(_), None) => bail!("`prompt` must be a string"),
        (None, Some(ids)) => serde_json::from_value(ids.clone())
            .context("`prompt_ids` must be a list of token ids")?,
        (None, None) => bail!("each line needs `prompt` or `prompt_ids`"),
    };
    p.validate(usize::MAX).map_err(|e| anyhow::anyhow!("{e}"))?;
    let priority = match obj.get("priority") {
        None | Some(Value::Null) => 0,
        Some(x) => x
            .as_i64()
            .and_then(|x| i32::try_from(x).ok())
            .context("`priority` must be a 32-bit integer")?,
    };
    let tenant = match obj.get("user") {
        None | Some(Value::Null) => None,
        Some(Value::String(u)) => Some(u.clone()),
        Some(_) => bail!("`user` must be a string"),
    };
    let slo = match obj.get("slo") {
        None | Some(Value::Null) => None,
        Some(Value::Object(o)) => {
            let ms = |key: &str| -> Result<Option<std::time::Duration>> {
                match o.get(key) {
                    None | Some(Value::Null) => Ok(None),
                    Some(v) => v
                        .as_u64()
                        .filter(|&m| m >= 1)
                        .map(|m| Some(std::time::Duration::from_millis(m)))
                        .with_context(|| {
                            format!(
                                "`slo.{key}` must be a whole number of milliseconds, at least 1"
                            )
                        }),
                }
            };
            let best_effort = match o.get("best_effort") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => bail!("`slo.best_effort` must be true or false"),
            };
            if let Some(k) = o
                .keys()
                .find(|k| !["ttft_ms", "tpot_ms", "best_effort"].contains(&k.as_str()))
            {
                bail!("`slo.{k}` is not a field of `slo` (ttft_ms, tpot_ms, best_effort)");
            }
            let (ttft, tpot) = (ms("ttft_ms")?, ms("tpot_ms")?);
            if ttft.is_none() && tpot.is_none() {
                bail!("`slo` needs `ttft_ms` or `tpot_ms`");
            }
            Some(ferrum_engine::Slo {
                ttft,
                tpot,
                best_effort,
            })
        }
        Some(_) => bail!("`slo` must be an object"),
    };
    Ok(GenerateRequest {
        priority,
        tenant,
        slo,
        ..GenerateRequest::new(prompt, p)
    })
}
