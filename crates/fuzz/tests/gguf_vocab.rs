//! Fuzz target: building a tokenizer from GGUF vocabulary metadata that parses but does not
//! make sense. Inputs are edit scripts applied to a real SentencePiece or BPE vocabulary
//! (tokens emptied, duplicated or cut, scores NaN, types out of range, merges naming missing
//! tokens, special ids past the end, unknown model and pre-tokenizer names), so the mutator
//! explores the metadata's meaning rather than its encoding.

mod common;
mod spm_reference;

use ferrum_fuzz::harness::{run, Limits, Target};
use ferrum_fuzz::mutate::Mutator;
use ferrum_models::GgufFile;
use ferrum_tokenizer::GgufVocab;
use std::path::Path;
use std::time::Duration;

#[global_allocator]
static ALLOC: ferrum_fuzz::alloc::Counting = ferrum_fuzz::alloc::Counting;

/// llama.cpp's vocabulary `name` (`scripts/fetch-vocab.sh`); `None` outside CI when absent.
fn base(name: &str) -> Option<GgufVocab<'static>> {
    let bytes = common::vocab_seed(name)?;
    let g = GgufFile::from_bytes(Path::new(name), &bytes).expect("vocabulary parses");
    Some(
        ferrum_models::gguf_vocab(&g)
            .expect("file has a vocabulary")
            .into_owned(),
    )
}

const WEIRD: &[&str] = &[
    "",
    " ",
    "<0x00>",
    "<0xFF>",
    "<0x100>",
    "<0xZZ>",
    "▁",
    "Ġ",
    "a b",
    "a b c",
    "\u{0}",
    "\u{FFFD}",
    "<s>",
    "</s>",
    "<unk>",
    "日本語",
    "\u{1F600}",
    "\\u0000",
    "Ċ",
];
const MODELS: &[&str] = &["llama", "gpt2", "bert", "t5", "rwkv", "", "LLAMA"];
const PRES: &[&str] = &[
    "default",
    "llama3",
    "llama-bpe",
    "qwen2",
    "gpt-2",
    "starcoder",
    "smollm",
    "bogus",
    "",
];

/// Applies the edit script `ops` (5 bytes per edit) to a copy of one of the bases.
fn edit(bases: &[GgufVocab<'static>], ops: &[u8]) -> GgufVocab<'static> {
    let mut v = bases[usize::from(ops.first().copied().unwrap_or(0)) % bases.len()].clone();
    for op in ops.get(1..).unwrap_or(&[]).chunks(5) {
        let mut a = [0u8; 4];
        for (i, b) in op.iter().skip(1).enumerate() {
            a[i] = *b;
        }
        let a = u32::from_le_bytes(a);
        let i = |len: usize| a as usize % len.max(1);
        let w = WEIRD[a as usize % WEIRD.len()];
        match op[0] % 13 {
            0 => v.tokens.truncate(i(v.tokens.len() + 1)),
            1 => {
                let n = v.tokens.len();
                if n > 0 {
                    v.tokens[i(n)] = w.into();
                }
            }
            2 => {
                let n = v.tokens.len();
                if n > 0 {
                    v.tokens[i(n)] = v.tokens[(a as usize >> 8) % n].clone();
                }
            }
            3 => {
                let n = v.scores.len();
                match a % 3 {
                    0 => v.scores.truncate(i(n + 1)),
                    1 if n > 0 => v.scores[i(n)] = f32::NAN,
                    _ if n > 0 => v.scores[i(n)] = f32::INFINITY,
                    _ => {}
                }
            }
            4 => {
                if v.token_types.is_empty() {
                    v.token_types = vec![1; v.tokens.len()];
                }
                let n = v.token_types.len();
                v.token_types[i(n)] = (a >> 8) as i32 - 8;
            }
            5 => v.merges.truncate(i(v.merges.len() + 1)),
            6 => {
                let n = v.merges.len();
                if n > 0 {
                    v.merges[i(n)] = w.into();
                } else {
                    v.merges.push(w.into());
                }
            }
            7 => {
                let id = Some(a >> 4);
                match a % 6 {
                    0 => v.bos_token_id = id,
                    1 => v.eos_token_id = id,
                    2 => v.unknown_token_id = id,
                    3 => v.padding_token_id = id,
                    4 => v.eot_token_id = id,
                    _ => v.eom_token_id = id,
                }
            }
            8 => v.model = MODELS[a as usize % MODELS.len()].to_string(),
            9 => v.pre = (a % 5 != 0).then(|| PRES[a as usize % PRES.len()].to_string()),
            10 => {
                let b = Some(a & 2 != 0);
                match a % 3 {
                    0 => v.add_bos_token = b,
                    1 => v.add_eos_token = b,
                    _ => v.add_space_prefix = b,
                }
            }
            11 => v.tokens.push(w.into()),
            _ => {
                // Swap two tokens: ids and merge ranks stop agreeing.
                let n = v.tokens.len();
                if n > 1 {
                    v.tokens.swap(i(n), (a as usize >> 12) % n);
                }
            }
        }
    }
    v
}

/// A SentencePiece vocabulary, however odd (repeated pieces, tied or NaN scores, types out of
/// range), tokenizes as the `tokenizers` pipeline Ferrum used before ([`spm_reference`]).
fn same_as_reference(v: &GgufVocab<'_>, tok: &ferrum_tokenizer::Tokenizer) -> Result<(), String> {
    let Ok(reference) = spm_reference::build(v) else {
        return Ok(());
    };
    for text in spm_reference::texts(v, 6, v.tokens.len() as u64) {
        let Ok(want) = reference.encode_fast(text.as_str(), false) else {
            continue;
        };
        let ids = tok.encode(&text, false).map_err(|e| e.to_string())?;
        if ids != want.get_ids() {
            return Err(format!(
                "ids of {text:?}: {ids:?}, the reference gives {:?}",
                want.get_ids()
            ));
        }
        spm_reference::same_decodes(tok, &reference, &ids)?;
    }
    // Runs of ids, where every text names one id (the reference knew only a text's first id).
    let distinct: std::collections::HashSet<&str> = v.tokens.iter().map(|t| t.as_ref()).collect();
    if distinct.len() == v.tokens.len() {
        let n = v.tokens.len() as u32;
        for ids in spm_reference::id_runs(n, 8, u64::from(n).wrapping_mul(0x9e37_79b9)) {
            spm_reference::same_decodes(tok, &reference, &ids)?;
        }
    }
    Ok(())
}

#[test]
fn fuzz_gguf_vocab() {
    let (Some(spm), Some(bpe)) = (base("llama-spm"), base("gpt-2")) else {
        return;
    };
    let bases = [spm, bpe];
    let target = Target {
        name: "gguf_vocab",
        seeds: vec![
            vec![0],
            vec![1],
            vec![0, 1, 5, 0, 0, 0, 7, 0xff, 0xff, 0xff, 0xff],
            vec![1, 6, 3, 0, 0, 0, 9, 1, 0, 0, 0],
            vec![1, 0, 0, 1, 0, 0],
        ],
        mutator: Mutator {
            hot: 64,
            max_len: 256,
            ..Mutator::default()
        },
        limits: Limits {
            time: Duration::from_secs(20),
            memory_base: 512 << 20,
            memory_per_input_byte: 0,
        },
    };
    let report = run(target, |ops| {
        let v = edit(&bases, ops);
        let tok = match v.build() {
            Ok(tok) => tok,
            Err(e) => return Ok(e.to_string()),
        };
        if v.model == "llama" {
            same_as_reference(&v, &tok)?;
        }
        Ok(common::exercise(&tok))
    });
    assert!(report.execs > 0);
}
