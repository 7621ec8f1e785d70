//! Ferrum's SentencePiece tokenizer (GGUF `llama` vocabularies) against the `tokenizers`
//! pipeline it replaced ([`spm_reference`]), on real vocabularies: llama.cpp's Llama 2 and
//! Phi-3 test vocabularies, and Gemma 3's 262k-token vocabulary when the model file is present
//! (`$FERRUM_GEMMA3_GGUF`, else `models/gemma-3-270m-q4_k_m.gguf`; required under CI). Every
//! text's ids, the decoding of those ids and of random id runs, each id's bytes, the special
//! flags and the vocabulary size must be the same.

mod common;
mod spm_reference;

use ferrum_models::GgufFile;
use ferrum_tokenizer::{GgufVocab, SpecialTokens, Tokenizer};
use std::borrow::Cow;
use std::path::{Path, PathBuf};

fn compare(name: &str, v: &GgufVocab<'_>, texts: usize) {
    let ours = v.build().expect("builds");
    let reference = spm_reference::build(v).expect("reference builds");
    for text in spm_reference::texts(v, texts, 0x5eed) {
        let ids = ours.encode(&text, false).expect("encodes");
        let want = reference
            .encode_fast(text.as_str(), false)
            .expect("reference encodes")
            .get_ids()
            .to_vec();
        assert_eq!(ids, want, "{name}: the ids of {text:?}");
        if let Err(e) = spm_reference::same_decodes(&ours, &reference, &ids) {
            panic!("{name}: {e}");
        }
    }
    for ids in spm_reference::id_runs(v.tokens.len() as u32, texts, 0x9e37_79b9_7f4a_7c15) {
        if let Err(e) = spm_reference::same_decodes(&ours, &reference, &ids) {
            panic!("{name}: {e}");
        }
    }
    // The rest of the API, through the reference saved as tokenizer.json and loaded back.
    let path = std::env::temp_dir().join(format!("ferrum-spm-{name}-{}.json", std::process::id()));
    std::fs::write(&path, reference.to_string(false).expect("serializes")).expect("writes");
    let via = Tokenizer::from_json_file(&path, SpecialTokens::default());
    let _ = std::fs::remove_file(&path);
    let via = via.expect("loads");
    assert_eq!(
        ours.vocab_size(),
        via.vocab_size(),
        "{name}: vocabulary size"
    );
    assert_eq!(
        ours.token_bytes().expect("bytes"),
        via.token_bytes().expect("bytes"),
        "{name}"
    );
    for id in 0..ours.vocab_size() as u32 {
        assert_eq!(
            ours.is_special(id),
            via.is_special(id),
            "{name}: special flag of {id}"
        );
    }
}

/// llama.cpp's vocabulary `name` (`scripts/fetch-vocab.sh`); `None` outside CI when absent.
fn vocab(name: &str) -> Option<GgufFile> {
    let bytes = common::vocab_seed(name)?;
    Some(GgufFile::from_bytes(Path::new(name), &bytes).expect("vocabulary parses"))
}

#[test]
fn llama2_vocabulary_matches_the_reference() {
    let Some(g) = vocab("llama-spm") else { return };
    compare(
        "llama-spm",
        &ferrum_models::gguf_vocab(&g).expect("vocab"),
        400,
    );
}

#[test]
fn phi3_vocabulary_matches_the_reference() {
    let Some(g) = vocab("phi-3") else { return };
    compare("phi-3", &ferrum_models::gguf_vocab(&g).expect("vocab"), 400);
}

#[test]
fn gemma3_vocabulary_matches_the_reference() {
    let path = std::env::var_os("FERRUM_GEMMA3_GGUF").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/gemma-3-270m-q4_k_m.gguf"),
        PathBuf::from,
    );
    if !path.exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{} is missing (bash scripts/fetch-model.sh gemma3-270m)",
            path.display()
        );
        eprintln!("skipped: {} is missing", path.display());
        return;
    }
    let g = GgufFile::open(&path).expect("opens");
    compare(
        "gemma3",
        &ferrum_models::gguf_vocab(&g).expect("vocab"),
        300,
    );
}

/// A small vocabulary with the odd cases real ones lack: byte pieces missing (so some
/// characters fall to the unknown piece, between others that fall back to bytes), a text
/// repeated with different scores, tied and NaN scores, and a user-defined copy of a control
/// token.
fn odd_vocab(add_prefix: bool) -> GgufVocab<'static> {
    const NORMAL: i32 = 1;
    const UNKNOWN: i32 = 2;
    const CONTROL: i32 = 3;
    const USER: i32 = 4;
    const BYTE: i32 = 6;
    let mut v: Vec<(String, f32, i32)> = vec![
        ("<unk>".into(), 0.0, UNKNOWN),
        ("<s>".into(), 0.0, CONTROL),
        ("</s>".into(), 0.0, CONTROL),
    ];
    // No byte piece for 0xE4: CJK characters from U+4E00 fall to the unknown piece.
    for b in (0..=255u8).filter(|&b| b != 0xE4) {
        v.push((format!("<{b:#04X}>"), 0.0, BYTE));
    }
    for (t, score) in [
        ("▁", -1.0),
        ("a", -2.0),
        ("b", -2.0),
        ("c", -2.0),
        ("x", -3.0),
        ("y", -3.0),
        ("ab", 5.0),
        ("bc", 0.0),
        ("abc", 1.0),
        ("▁a", f32::NAN),
        ("▁ab", 2.0),
        ("xy", 2.0),
        ("yx", 2.0),
        ("xyx", f32::NAN),
        ("ca", 0.0),
        ("cab", 0.0),
        // A repeat of "ab" that ranks below "bc": the merge forming "ab" ranks as it does.
        ("ab", -5.0),
        // So does "pq"'s: "pqr" is "p", "qr", not "pq", "r".
        ("p", -2.0),
        ("q", -2.0),
        ("r", -2.0),
        ("pq", 5.0),
        ("qr", 0.0),
        ("pq", -5.0),
    ] {
        v.push((t.into(), score, NORMAL));
    }
    v.push(("<s>".into(), 0.0, USER));
    v.push(("<tool>".into(), 0.0, USER));
    let tokens = v.iter().map(|t| Cow::Owned(t.0.clone())).collect();
    GgufVocab {
        model: "llama".into(),
        tokens,
        scores: v.iter().map(|t| t.1).collect(),
        token_types: v.iter().map(|t| t.2).collect(),
        unknown_token_id: Some(0),
        add_space_prefix: Some(add_prefix),
        ..GgufVocab::default()
    }
}

#[test]
fn odd_vocabularies_match_the_reference() {
    let texts = [
        "pqr",
        "rpqrpq pqr",
        "abc",
        "ab c abc cab",
        "xyxyx yx",
        "x\u{e9}\u{4e00}\u{4e01}y\u{e9}",
        "\u{4e00}\u{e9}\u{4e01}z",
        "<s>abc<tool>ab</s>",
        "<s><s> a",
        " ",
        "",
    ];
    for prefix in [true, false] {
        let v = odd_vocab(prefix);
        let ours = v.build().expect("builds");
        let reference = spm_reference::build(&v).expect("reference builds");
        for text in texts {
            let ids = ours.encode(text, false).expect("encodes");
            let want = reference.encode_fast(text, false).expect("encodes");
            assert_eq!(ids, want.get_ids(), "the ids of {text:?} (prefix {prefix})");
            for skip in [false, true] {
                assert_eq!(
                    ours.decode(&ids, skip).expect("decodes"),
                    reference.decode(&ids, skip).expect("decodes"),
                    "decoding {ids:?}"
                );
            }
        }
        // The repeat of "ab" (the last id of that text) decodes as its text and is counted,
        // where the reference knew only the first.
        let repeat = v.tokens.iter().rposition(|t| t == "ab").expect("there") as u32;
        assert_eq!(ours.decode(&[repeat], false).expect("decodes"), "ab");
        assert_eq!(ours.vocab_size(), v.tokens.len());
        // A user-defined copy of a control token's text is special as the text is.
        let copy = v.tokens.iter().rposition(|t| t == "<s>").expect("there") as u32;
        assert!(ours.is_special(copy) && ours.is_special(1));
        assert_eq!(ours.decode(&[copy, 1], true).expect("decodes"), "");
    }
}
