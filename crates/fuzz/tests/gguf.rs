//! Fuzz target: the GGUF parser, the model config read from its metadata and every tensor
//! view it hands out. Seeds: a hand-built one-layer llama, a vocabulary-only file and the
//! tiny SmolLM Q8_0 model.

mod common;

use ferrum_fuzz::harness::{run, Limits, Target};
use ferrum_fuzz::mutate::Mutator;
use ferrum_models::{GgufFile, ModelConfig};
use std::path::Path;

#[global_allocator]
static ALLOC: ferrum_fuzz::alloc::Counting = ferrum_fuzz::alloc::Counting;

#[test]
fn fuzz_gguf() {
    let target = Target {
        name: "gguf",
        seeds: std::iter::once(common::tiny_llama_gguf())
            .chain(common::vocab_seed("llama-spm"))
            .chain([common::read("tiny-smollm/model-q8_0.gguf")])
            .collect(),
        mutator: Mutator {
            // The vocabulary arrays fill the first megabyte of the real files.
            hot: 1 << 20,
            ..Mutator::default()
        },
        limits: Limits::default(),
    };
    let report = run(target, |bytes| {
        let g = match GgufFile::from_bytes(Path::new("fuzz.gguf"), bytes) {
            Ok(g) => g,
            Err(e) => return Ok(e.to_string()),
        };
        for info in g.tensor_infos() {
            if let Ok(t) = g.tensor(&info.name) {
                // Decode the last row: the view must lie inside the file.
                if t.rows() > 0 && t.cols() <= 1 << 16 {
                    let mut row = vec![0f32; t.cols()];
                    t.dequantize_row(t.rows() - 1, &mut row);
                    std::hint::black_box(&row);
                }
            }
        }
        let _ = ferrum_models::gguf_vocab(&g);
        Ok(match ModelConfig::from_gguf(&g) {
            Ok(c) => format!("ok {}", c.architecture),
            Err(e) => e.to_string(),
        })
    });
    assert!(report.execs > 0);
}
