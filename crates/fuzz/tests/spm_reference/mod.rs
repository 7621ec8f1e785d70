//! The reference for Ferrum's SentencePiece tokenizer (`ferrum_tokenizer`'s `spm` module): the
//! same GGUF `llama` vocabulary as a `tokenizers` pipeline, which is how Ferrum tokenized these
//! vocabularies before (and which matched llama.cpp and transformers on the vocabulary tests):
//! a BPE model whose merges are derived from the scores (every split of a piece into two
//! vocabulary pieces, ranked by the piece's score), byte fallback, fused unknowns; `▁` for
//! spaces with an optional prefix; control, unknown and user-defined tokens added whole.
#![allow(dead_code)]

use ferrum_tokenizer::GgufVocab;
use std::collections::HashMap;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace};
use tokenizers::{AddedToken, NormalizerWrapper};

const TYPE_UNKNOWN: i32 = 2;
const TYPE_CONTROL: i32 = 3;
const TYPE_USER_DEFINED: i32 = 4;
const TYPE_BYTE: i32 = 6;

/// The `tokenizers` pipeline for `v` (a `llama` vocabulary whose ids check out), or why it
/// could not be built.
pub fn build(v: &GgufVocab<'_>) -> Result<tokenizers::Tokenizer, String> {
    let kind = |id: usize| v.token_types.get(id).copied().unwrap_or(1);
    let score = |i: usize| v.scores.get(i).copied().unwrap_or(0.0);
    let mut vocab: HashMap<String, u32> = HashMap::with_capacity(v.tokens.len());
    for (i, t) in v.tokens.iter().enumerate() {
        vocab.entry(t.to_string()).or_insert(i as u32);
    }
    let mut merges: Vec<(String, String, f32)> = Vec::new();
    for (id, piece) in v.tokens.iter().enumerate() {
        if matches!(kind(id), TYPE_CONTROL | TYPE_BYTE | TYPE_UNKNOWN) {
            continue;
        }
        let mut local: Vec<(u32, u32, &str, &str)> = Vec::new();
        for (cut, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(cut);
            if let (Some(&li), Some(&ri)) = (vocab.get(l), vocab.get(r)) {
                local.push((li, ri, l, r));
            }
        }
        local.sort_unstable_by_key(|&(li, ri, _, _)| (li, ri));
        merges.extend(
            local
                .into_iter()
                .map(|(_, _, l, r)| (l.to_owned(), r.to_owned(), score(id))),
        );
    }
    merges.sort_by(|a, b| b.2.total_cmp(&a.2));
    let merges = merges.into_iter().map(|(l, r, _)| (l, r)).collect();
    let unk = v
        .unknown_token_id
        .map(|i| i as usize)
        .or_else(|| (0..v.tokens.len()).find(|&i| kind(i) == TYPE_UNKNOWN))
        .map(|i| v.tokens[i].to_string());
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab.into_iter().collect::<Vocab>(), merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = unk {
        builder = builder.unk_token(unk);
    }
    let bpe = builder.build().map_err(|e| e.to_string())?;
    let mut t = tokenizers::Tokenizer::new(bpe);
    let space = Replace::new(" ", "\u{2581}").map_err(|e| e.to_string())?;
    let prefix = v.add_space_prefix.unwrap_or(true);
    let normalizer: NormalizerWrapper = if prefix {
        tokenizers::normalizers::Sequence::new(vec![
            Prepend::new("\u{2581}".into()).into(),
            space.into(),
        ])
        .into()
    } else {
        space.into()
    };
    t.with_normalizer(Some(normalizer));
    let mut decoders = vec![
        Replace::new("\u{2581}", " ")
            .map_err(|e| e.to_string())?
            .into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    t.with_decoder(Some(DecoderSequence::new(decoders)));
    let mut special = Vec::new();
    let mut user = Vec::new();
    for (id, tok) in v.tokens.iter().enumerate() {
        match kind(id) {
            TYPE_CONTROL | TYPE_UNKNOWN => special.push(AddedToken::from(tok.to_string(), true)),
            TYPE_USER_DEFINED => {
                user.push(AddedToken::from(tok.to_string(), false).normalized(false))
            }
            _ => {}
        }
    }
    t.add_special_tokens(&special);
    t.add_tokens(&user);
    Ok(t)
}

/// Texts to compare the two on: pieces of the vocabulary run together (with spaces, as text
/// would hold them), added tokens among them, characters without a piece, and edge cases.
pub fn texts(v: &GgufVocab<'_>, count: usize, seed: u64) -> Vec<String> {
    let mut next = xorshift(seed);
    let odd = [
        " ",
        "  ",
        "\n",
        "\t",
        "\r\n",
        "é",
        "日本語",
        "\u{1F600}",
        "\u{0}",
        "\u{FFFD}",
        "▁",
        "<0x41>",
        "ab",
        "a b",
        "123",
        "...",
        "'s",
        "\u{200B}",
        "ǅ",
        "\u{301}",
    ];
    let mut out: Vec<String> = vec![
        String::new(),
        " ".into(),
        "Hello world".into(),
        " leading and trailing ".into(),
        "multiple   spaces\n\nand lines".into(),
    ];
    let n = v.tokens.len().max(1);
    for _ in 0..count {
        let mut s = String::new();
        for _ in 0..(next() % 24) {
            match next() % 8 {
                0..=3 => s.push_str(&v.tokens[next() as usize % n].replace('▁', " ")),
                4 => s.push_str(odd[next() as usize % odd.len()]),
                5 => s.push(' '),
                6 => {
                    if let Some(c) = char::from_u32((next() % 0x3_0000) as u32) {
                        s.push(c);
                    }
                }
                _ => s.push_str(&v.tokens[next() as usize % n]),
            }
        }
        out.push(s);
    }
    out
}

/// `count` runs of 1 to 12 ids below `n`, from `seed`: byte pieces that do and do not make
/// UTF-8, specials, spaces.
pub fn id_runs(n: u32, count: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut next = xorshift(seed);
    (0..count)
        .map(|_| {
            let len = 1 + next() % 12;
            (0..len)
                .map(|_| (next() % u64::from(n.max(1))) as u32)
                .collect()
        })
        .collect()
}

/// Whether `ours` decodes `ids` as `reference` does, with special tokens kept and skipped (the
/// difference, if not; where the reference fails, nothing is compared).
pub fn same_decodes(
    ours: &ferrum_tokenizer::Tokenizer,
    reference: &tokenizers::Tokenizer,
    ids: &[u32],
) -> Result<(), String> {
    for skip in [false, true] {
        let Ok(b) = reference.decode(ids, skip) else {
            continue;
        };
        match ours.decode(ids, skip) {
            Ok(a) if a == b => {}
            Ok(a) => {
                return Err(format!(
                    "decoding {ids:?} (skip special: {skip}): {a:?}, the reference {b:?}"
                ))
            }
            Err(e) => return Err(format!("decoding {ids:?}: {e}; the reference gives {b:?}")),
        }
    }
    Ok(())
}

/// A xorshift64 stream from `seed`.
fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed | 1;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}
