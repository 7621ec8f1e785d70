//! `ferrum chat`: an interactive multi-turn conversation using the model's chat template.
//! Each turn renders the whole conversation and runs it through the engine, whose prefix cache
//! holds the earlier turns' blocks, so only the new turn is computed. When the conversation outgrows the context, the oldest turns are
//! dropped (the system message stays).
//!
//! Commands: `/reset` starts over, `/exit` (or end of input) quits.

use crate::common::{
    fresh_seed, load_parts, need_text, single_engine, ModelArgs, SamplingArgs, SpeculativeArgs,
};
use crate::parallel::Launch;
use anyhow::Result;
use clap::Args;
use ferrum_engine::GenerateRequest;
use ferrum_tokenizer::ChatMessage;
use std::io::{BufRead, IsTerminal, Write};

#[derive(Debug, Args)]
pub struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// System message.
    #[arg(long)]
    system: Option<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten, next_help_heading = "Speculative decoding")]
    speculative: SpeculativeArgs,
}

pub fn chat(args: &ChatArgs, launch: &Launch) -> Result<()> {
    let (model, text, _) = load_parts(&args.model, launch)?;
    let vocab = model.config().vocab_size;
    let params = args.sampling.params(vocab)?;
    // Fail before the first prompt when the model cannot chat.
    let text = need_text(&text)?;
    text.template()?;
    // The conversation may grow to the whole context.
    let engine = single_engine(
        model,
        Some(text.tokenizer.clone()),
        &args.model,
        usize::MAX,
        &args.speculative,
        None,
    )?;
    let max_len = engine.max_model_len();
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!(
            "chatting with {} (/reset to start over, /exit to quit)",
            args.model.model
        );
    }
    let base: Vec<ChatMessage> = args
        .system
        .iter()
        .map(|s| ChatMessage::new("system", s.as_str()))
        .collect();
    let mut messages = base.clone();
    let mut seed = args.sampling.seed.unwrap_or_else(fresh_seed);
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            eprint!("> ");
            std::io::stderr().flush()?;
        }
        let Some(line) = lines.next() else {
            break;
        };
        let line = line?;
        let input = line.trim();
        match input {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages = base.clone();
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::new("user", input));
        // Keep at least a few tokens of room for the answer; drop the oldest turns if needed.
        let room = params.max_tokens.unwrap_or(1).min(max_len / 2).max(1);
        let mut prompt = text.encode_chat(&messages)?;
        while prompt.len() + room > max_len && messages.len() > base.len() + 1 {
            messages.remove(base.len());
            prompt = text.encode_chat(&messages)?;
            eprintln!("(context full: dropped the oldest message)");
        }
        if prompt.len() + room > max_len {
            eprintln!(
                "error: this message alone ({} tokens) does not fit the context of {max_len} tokens",
                prompt.len()
            );
            messages.pop();
            continue;
        }
        let mut stdout = std::io::stdout().lock();
        // Same seed, same conversation: each turn draws from the next seed.
        let turn_params = ferrum_types::SamplingParams {
            seed: Some(seed),
            ..params.clone()
        };
        seed = seed.wrapping_add(1);
        let gen = engine.generate_one(GenerateRequest::new(prompt, turn_params), |ev| {
            stdout
                .write_all(ev.text.as_bytes())
                .and_then(|()| stdout.flush())
                .is_ok()
        });
        writeln!(stdout)?;
        match gen {
            Ok(g) => {
                if interactive {
                    eprintln!(
                        "[{} tokens, {:.1} tok/s, first token {:.0} ms, {} prompt tokens reused]",
                        g.token_ids.len(),
                        g.decode_tokens_per_s(),
                        g.time_to_first_token.as_secs_f64() * 1e3,
                        g.cached_prompt_tokens
                    );
                }
                messages.push(ChatMessage::new("assistant", g.text));
            }
            Err(e) => {
                eprintln!("error: {e}");
                messages.pop();
            }
        }
    }
    engine.shutdown();
    Ok(())
}
