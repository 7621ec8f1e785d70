//! `ferrum tokenize`: print the ids a model's tokenizer gives for a text.

use crate::model_path;
use anyhow::{Context, Result};
use clap::Args;
use ferrum_models::load_text_assets;

#[derive(Debug, Args)]
pub struct TokenizeArgs {
    /// Model folder, .gguf file, or Hugging Face id.
    #[arg(long)]
    model: String,
    /// The text to tokenize.
    #[arg(long)]
    text: String,
    /// Leave out the BOS/EOS tokens the model's config adds to raw prompts.
    #[arg(long)]
    no_special_tokens: bool,
}

pub fn tokenize(args: &TokenizeArgs) -> Result<()> {
    let path = model_path::resolve(&args.model)?;
    let text = load_text_assets(&path)
        .with_context(|| format!("loading the tokenizer of {}", path.display()))?;
    let ids = text.tokenizer.encode(&args.text, !args.no_special_tokens)?;
    println!("{}", serde_json::json!({ "ids": ids }));
    Ok(())
}
