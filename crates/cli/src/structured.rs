//! The structured-output flags of `ferrum run`: at most one of `--json-schema FILE`,
//! `--json-object`, `--regex R`, `--choice a,b,c` and `--grammar FILE` (GBNF when the file has
//! a `::=` rule, llguidance's Lark otherwise).

use anyhow::{bail, Context, Result};
use clap::Args;
use ferrum_types::StructuredOutput;
use std::path::PathBuf;

#[derive(Debug, Args)]
#[group(multiple = false)]
pub struct StructuredArgs {
    /// The output is JSON valid under the JSON Schema in FILE.
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<PathBuf>,
    /// The output is a JSON object.
    #[arg(long)]
    pub json_object: bool,
    /// The output matches this regular expression as a whole.
    #[arg(long, value_name = "REGEX")]
    pub regex: Option<String>,
    /// The output is exactly one of these comma-separated strings.
    #[arg(long, value_name = "A,B,C", value_delimiter = ',')]
    pub choice: Option<Vec<String>>,
    /// The output follows the grammar in FILE: GBNF (llama.cpp's grammars) when it has a `::=`
    /// rule, else llguidance's Lark syntax.
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
}

fn read(flag: &str, path: &std::path::Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{flag} {}: cannot read the file", path.display()))?;
    if text.trim().is_empty() {
        bail!("{flag} {}: the file is empty", path.display());
    }
    Ok(text)
}

impl StructuredArgs {
    /// The constraint the flags ask for, if any.
    pub fn constraint(&self) -> Result<Option<StructuredOutput>> {
        Ok(Some(if let Some(p) = &self.json_schema {
            let text = read("--json-schema", p)?;
            serde_json::from_str::<serde_json::Value>(&text)
                .with_context(|| format!("--json-schema {}: not JSON", p.display()))?;
            StructuredOutput::JsonSchema {
                schema: text,
                strict: true,
            }
        } else if self.json_object {
            StructuredOutput::JsonObject
        } else if let Some(r) = &self.regex {
            if r.is_empty() {
                bail!("--regex: the expression is empty");
            }
            StructuredOutput::Regex(r.clone())
        } else if let Some(c) = &self.choice {
            if c.is_empty() || c.iter().any(String::is_empty) {
                bail!("--choice: give non-empty strings separated by commas");
            }
            StructuredOutput::Choice(c.clone())
        } else if let Some(p) = &self.grammar {
            let text = read("--grammar", p)?;
            if text.contains("::=") {
                StructuredOutput::Gbnf(text)
            } else {
                StructuredOutput::Lark(text)
            }
        } else {
            return Ok(None);
        }))
    }
}
