//! Fuzz target: loading a Hugging Face folder whose config.json is mutated (the config
//! parser, architecture registry, weight mapping and shape checks, up to a loaded model).
//! The weights are the tiny Llama's; seeds are the configs of every tiny fixture.

mod common;

use ferrum_fuzz::harness::{run, Limits, Target};
use ferrum_fuzz::mutate::Mutator;
use ferrum_models::{load_model, LoadOptions};

#[global_allocator]
static ALLOC: ferrum_fuzz::alloc::Counting = ferrum_fuzz::alloc::Counting;

#[test]
fn fuzz_model_config() {
    let dir = std::env::temp_dir().join(format!("ferrum-fuzz-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(
        dir.join("model.safetensors"),
        common::read("tiny-llama/model.safetensors"),
    )
    .expect("weights");
    let dictionary = [
        "\"num_attention_heads\"",
        "\"num_key_value_heads\"",
        "\"hidden_size\"",
        "\"intermediate_size\"",
        "\"num_hidden_layers\"",
        "\"vocab_size\"",
        "\"head_dim\"",
        "\"max_position_embeddings\"",
        "\"rope_theta\"",
        "\"rope_scaling\"",
        "\"rope_type\"",
        "\"llama3\"",
        "\"factor\"",
        "\"sliding_window\"",
        "\"tie_word_embeddings\"",
        "\"architectures\"",
        "\"LlamaForCausalLM\"",
        "\"Qwen2ForCausalLM\"",
        "\"Qwen3ForCausalLM\"",
        "\"MistralForCausalLM\"",
        "\"torch_dtype\"",
        "\"rms_norm_eps\"",
        "\"eos_token_id\"",
        "\"bos_token_id\"",
        "18446744073709551615",
        "4294967296",
        "-1",
        "0",
        "1e308",
        "-0.0",
        "NaN",
        "null",
        "true",
        "[]",
        "{}",
        "[1,2]",
        "\"\"",
        ",",
        ":",
    ];
    let seeds = [
        "tiny-llama",
        "tiny-llama3-rope",
        "tiny-qwen2",
        "tiny-qwen3",
        "tiny-mistral-swa",
    ]
    .iter()
    .map(|m| common::read(&format!("{m}/config.json")))
    .collect();
    let target = Target {
        name: "model_config",
        seeds,
        mutator: Mutator {
            hot: 4096,
            dictionary: dictionary.iter().map(|w| w.as_bytes().to_vec()).collect(),
            max_len: 64 << 10,
        },
        limits: Limits {
            memory_base: 128 << 20,
            ..Limits::default()
        },
    };
    let opts = LoadOptions {
        num_threads: Some(1),
        ..LoadOptions::default()
    };
    let report = run(target, |bytes| {
        std::fs::write(dir.join("config.json"), bytes).map_err(|e| e.to_string())?;
        Ok(match load_model(&dir, &opts) {
            Ok(m) => format!("ok {}", m.config().architecture),
            Err(e) => e.to_string(),
        })
    });
    let _ = std::fs::remove_dir_all(&dir);
    assert!(report.execs > 0);
}
