//! Fuzz target: building a tokenizer from GGUF metadata, by mutating real vocabulary files
//! byte by byte (parse, read `tokenizer.ggml.*`, build, encode, decode).

mod common;

use ferrum_fuzz::harness::{run, Limits, Target};
use ferrum_fuzz::mutate::Mutator;
use ferrum_models::GgufFile;
use std::path::Path;
use std::time::Duration;

#[global_allocator]
static ALLOC: ferrum_fuzz::alloc::Counting = ferrum_fuzz::alloc::Counting;

#[test]
fn fuzz_gguf_tokenizer() {
    let target = Target {
        name: "gguf_tokenizer",
        seeds: std::iter::once(common::tiny_llama_gguf())
            .chain(
                ["llama-spm", "gpt-2"]
                    .into_iter()
                    .filter_map(common::vocab_seed),
            )
            .collect(),
        mutator: Mutator {
            hot: 2 << 20,
            ..Mutator::default()
        },
        limits: Limits {
            time: Duration::from_secs(20),
            memory_base: 256 << 20,
            memory_per_input_byte: 64,
        },
    };
    let report = run(target, |bytes| {
        let g = match GgufFile::from_bytes(Path::new("fuzz.gguf"), bytes) {
            Ok(g) => g,
            Err(e) => return Ok(e.to_string()),
        };
        let vocab = match ferrum_models::gguf_vocab(&g) {
            Ok(v) => v,
            Err(e) => return Ok(e.to_string()),
        };
        Ok(match vocab.build() {
            Ok(tok) => common::exercise(&tok),
            Err(e) => e.to_string(),
        })
    });
    assert!(report.execs > 0);
}
