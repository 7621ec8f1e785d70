//! `ferrum run`: generate a continuation of one prompt (text, chat, or token ids), streaming
//! the text to stdout, with time to first token and decode speed on stderr.

use crate::common::{load_parts, need_text, single_engine, EngineArgs, ModelArgs, SamplingArgs};
use crate::parallel::Launch;
use crate::structured::StructuredArgs;
use anyhow::{bail, Result};
use clap::Args;
use ferrum_engine::GenerateRequest;
use ferrum_tokenizer::ChatMessage;
use ferrum_types::TokenId;
use std::io::Write;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt text.
    #[arg(long, conflicts_with = "prompt_ids")]
    prompt: Option<String>,
    /// The prompt as comma-separated token ids, e.g. 1,2,3.
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<TokenId>>,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long, requires = "prompt")]
    chat: bool,
    /// System message for --chat.
    #[arg(long, requires = "chat")]
    system: Option<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten, next_help_heading = "Structured output (one of)")]
    structured: StructuredArgs,
    /// Offline batch mode: one JSON request per line ({"prompt" | "prompt_ids", "max_tokens",
    /// "temperature", "top_p", "top_k", "seed", "stop", "n", "chat"}), all run at once.
    #[arg(long, conflicts_with_all = ["prompt", "prompt_ids"])]
    prompts_file: Option<PathBuf>,
    /// Where batch mode writes its results, one JSON line per input line (default: stdout).
    #[arg(long, requires = "prompts_file")]
    output: Option<PathBuf>,
    // The batching engine's flags apply with --prompts-file; the speculative decoding flags
    // apply to every prompt.
    #[command(flatten, next_help_heading = "Batching engine (with --prompts-file)")]
    engine: EngineArgs,
    /// Print one JSON object at the end ({"text", "token_ids", "finish_reason", ...}) instead
    /// of streaming text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &RunArgs, launch: &Launch) -> Result<()> {
    if let Some(file) = &args.prompts_file {
        if args.structured.constraint()?.is_some() {
            bail!(
                "the structured-output flags apply to one prompt; batch lines cannot take them yet"
            );
        }
        return crate::batch::run_batch(
            &args.model,
            &args.engine,
            &args.sampling,
            file,
            args.output.as_deref(),
            launch,
        );
    }
    if args.prompt.is_none() && args.prompt_ids.is_none() {
        bail!("give a prompt: --prompt TEXT, --prompt-ids 1,2,3 or --prompts-file FILE");
    }
    let (model, text, load_time) = load_parts(&args.model, launch)?;
    let vocab = model.config().vocab_size;
    let mut params = args.sampling.params(vocab)?;
    params.structured = args.structured.constraint()?;
    let prompt: Vec<TokenId> = match (&args.prompt, &args.prompt_ids) {
        (_, Some(ids)) => ids.clone(),
        (Some(t), None) if args.chat => {
            let mut msgs = Vec::new();
            if let Some(s) = &args.system {
                msgs.push(ChatMessage::new("system", s.as_str()));
            }
            msgs.push(ChatMessage::new("user", t.as_str()));
            need_text(&text)?.encode_chat(&msgs)?
        }
        (Some(t), None) => need_text(&text)?.tokenizer.encode(t, true)?,
        (None, None) => Vec::new(),
    };
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    // Token-id prompts print ids, so they run without a tokenizer too (a text prompt without
    // one was refused above).
    let has_tokenizer = text.is_ok();
    let context = args
        .model
        .max_model_len
        .unwrap_or(model.config().max_position_embeddings);
    let room = context.saturating_sub(prompt.len());
    let kv_tokens = prompt.len() + params.max_tokens.map_or(room, |m| m.min(room));
    let tokenizer = text.as_ref().ok().map(|t| t.tokenizer.clone());
    let engine = single_engine(
        model,
        tokenizer,
        &args.model,
        kv_tokens,
        &args.engine.speculative,
        args.engine.kv_disk(&args.model)?,
    )?;
    let stream = !args.json && has_tokenizer;
    let mut stdout = std::io::stdout().lock();
    let mut write_error = None;
    let gen = engine.generate_one(GenerateRequest::new(prompt, params), |ev| {
        if stream && !ev.text.is_empty() {
            if let Err(e) = stdout
                .write_all(ev.text.as_bytes())
                .and_then(|()| stdout.flush())
            {
                write_error = Some(e);
                return false;
            }
        }
        true
    });
    engine.shutdown();
    let gen = gen?;
    if let Some(e) = write_error {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            return Err(e.into());
        }
        return Ok(());
    }
    if args.json {
        let v = serde_json::json!({
            "text": has_tokenizer.then(|| gen.text.clone()),
            "token_ids": gen.token_ids,
            "finish_reason": gen.finish.as_openai(),
            "finish_detail": gen.finish.to_string(),
            "prompt_tokens": gen.prompt_tokens,
            "completion_tokens": gen.token_ids.len(),
            "time_to_first_token_ms": gen.time_to_first_token.as_secs_f64() * 1e3,
            "decode_tok_s": gen.decode_tokens_per_s(),
            "mean_acceptance_length": gen.usage.mean_acceptance_length(),
            "spec_draft_tokens": gen.usage.spec_draft_tokens,
            "spec_accepted_tokens": gen.usage.spec_accepted_tokens,
        });
        writeln!(stdout, "{v}")?;
    } else if stream {
        writeln!(stdout)?;
    } else {
        let ids: Vec<String> = gen.token_ids.iter().map(ToString::to_string).collect();
        writeln!(stdout, "{}", ids.join(","))?;
    }
    let speculation = if args.engine.speculative.config().is_some() {
        let u = &gen.usage;
        format!(
            " | speculation: {:.2} tokens per verifying step, {} of {} proposed accepted",
            u.mean_acceptance_length(),
            u.spec_accepted_tokens,
            u.spec_draft_tokens
        )
    } else {
        String::new()
    };
    eprintln!(
        "[load {:.2}s | prompt {} tokens | first token {:.0} ms | {} tokens at {:.1} tok/s{speculation} | finish: {}]",
        load_time.as_secs_f64(),
        gen.prompt_tokens,
        gen.time_to_first_token.as_secs_f64() * 1e3,
        gen.token_ids.len(),
        gen.decode_tokens_per_s(),
        gen.finish,
    );
    Ok(())
}
