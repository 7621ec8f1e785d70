//! A model loaded with a reduced output vocabulary (a draft model's, `LoadOptions::output_vocab`)
//! computes exactly the first columns of the full model's logits, on both families and on a
//! GGUF file, and refuses 0.
#![allow(clippy::unwrap_used)]

mod common;

use common::{fixtures, prompt_logits};
use ferrum_models::{load_model, LoadOptions};
use ferrum_runtime::cpu::MatmulPrecision;

#[test]
fn the_first_columns_of_the_full_logits() {
    for name in [
        "tiny-qwen2",
        "tiny-gemma3",
        "tiny-mixtral-bf16/model-bf16.gguf",
    ] {
        let path = fixtures().join(name);
        let opts = |output_vocab| LoadOptions {
            num_threads: Some(2),
            precision: MatmulPrecision::Float,
            output_vocab,
            ..LoadOptions::default()
        };
        let mut full = load_model(&path, &opts(None)).unwrap();
        let vocab = full.config().vocab_size;
        assert_eq!(full.logits_vocab(), vocab);
        let n = vocab / 3;
        let mut cut = load_model(&path, &opts(Some(n))).unwrap();
        assert_eq!(cut.logits_vocab(), n, "{name}");
        // A limit past the vocabulary is the vocabulary.
        assert_eq!(
            load_model(&path, &opts(Some(vocab + 5)))
                .unwrap()
                .logits_vocab(),
            vocab
        );
        let prompt: Vec<u32> = (0..11).map(|i| (i * 7 + 3) % vocab as u32).collect();
        let a = prompt_logits(&mut full, &prompt);
        let b = prompt_logits(&mut cut, &prompt);
        assert_eq!(b.len(), prompt.len() * n, "{name}");
        for (row_a, row_b) in a.chunks_exact(vocab).zip(b.chunks_exact(n)) {
            assert_eq!(&row_a[..n], row_b, "{name}");
        }
        let e = load_model(&path, &opts(Some(0))).unwrap_err().to_string();
        assert!(e.contains("output vocabulary"), "{e}");
    }
}
