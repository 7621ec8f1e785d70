//! Special tokens from a folder's config files.
#![allow(clippy::unwrap_used)]

use ferrum_tokenizer::{find_chat_template, load_special_tokens};
use std::path::PathBuf;

fn scratch(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrum-tok-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (f, body) in files {
        std::fs::write(dir.join(f), body).unwrap();
    }
    dir
}

#[test]
fn several_eos_ids_from_generation_config_all_stop() {
    let dir = scratch(
        "eos",
        &[
            (
                "tokenizer_config.json",
                r#"{"bos_token": {"content": "<|begin_of_text|>", "special": true}, "eos_token": "<|eot_id|>", "add_bos_token": true,
                   "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}"#,
            ),
            (
                "generation_config.json",
                r#"{"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]}"#,
            ),
            ("config.json", r#"{"eos_token_id": 128001}"#),
        ],
    );
    let s = load_special_tokens(&dir).unwrap();
    assert_eq!(s.bos_token.as_deref(), Some("<|begin_of_text|>"));
    assert_eq!(s.eos_token.as_deref(), Some("<|eot_id|>"));
    assert!(s.add_bos_token && !s.add_eos_token);
    assert_eq!(s.stop_token_ids, vec![128001, 128008, 128009]);
    assert_eq!(find_chat_template(&dir).unwrap().as_deref(), Some("D"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn malformed_config_files_name_the_file() {
    let dir = scratch("bad", &[("tokenizer_config.json", "{not json")]);
    let err = load_special_tokens(&dir).unwrap_err().to_string();
    assert!(
        err.contains("tokenizer_config.json") && err.contains("invalid JSON"),
        "{err}"
    );
    let dir2 = scratch(
        "badtmpl",
        &[("tokenizer_config.json", r#"{"chat_template": 5}"#)],
    );
    let err = find_chat_template(&dir2).unwrap_err().to_string();
    assert!(err.contains("chat_template must be"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&dir2).unwrap();
}
