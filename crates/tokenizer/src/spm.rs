//! SentencePiece BPE for GGUF `llama` vocabularies (Llama 2, Mistral, Phi-3, Gemma), over a
//! compact vocabulary: every piece's text in one buffer, a table of ids hashed by text, and one
//! merge rank per piece. Gemma's 262k pieces take about 8 MB here; the same vocabulary as a
//! `tokenizers` BPE model with its derived merges took about 120 MB, more than the weights of a
//! small model beside it.
//!
//! What it computes is exactly what the `tokenizers` pipeline Ferrum built before computed (the
//! fuzz crate's `spm_tokenizer` test checks it against that pipeline on real and edited
//! vocabularies):
//! - **Added tokens** (control, unknown, user-defined; empty ones excepted) are found first in
//!   the raw text, leftmost-longest, and stand for their own id.
//! - **Normalization** of the text between them: `▁` prepended to each non-empty stretch when
//!   the vocabulary adds a space prefix, and every space written `▁`.
//! - **Pieces**: each character is the piece of that text, else its UTF-8 bytes as `<0xNN>`
//!   pieces, else the unknown piece (consecutive unknown characters fused into one).
//! - **Merges**: the adjacent pair whose concatenation is the best-ranked piece merges first
//!   (leftmost on ties), until no pair concatenates to a piece. Pieces rank by score, higher
//!   first, then by id; a pair of the same piece by its halves' ids. Only the texts of pieces
//!   other than control, byte and unknown pieces are formed by merging, and neither half may be
//!   empty.
//! - **Decoding**: `▁` is a space; runs of `<0xNN>` pieces are their bytes (a run that is not
//!   UTF-8 becomes one U+FFFD per byte); one leading space is dropped when the vocabulary adds a
//!   space prefix.
//!
//! Where a vocabulary repeats a piece's text, lookups by text give the first id (as
//! `tokenizers` does), and the merge that forms it ranks as the repeat that ranks last. Unlike
//! the `tokenizers` pipeline, which knew only a text's first id, every repeat keeps its own
//! text, bytes and place in the vocabulary size, and is special (or added) when its text is.
//!
//! Invariants: `ends` is non-decreasing with `ends.len()` = the piece count; every id in the
//! hash table, in `merge_rank`'s index and in the added-token list is below the piece count.

use crate::gguf_vocab::{TYPE_BYTE, TYPE_CONTROL, TYPE_UNKNOWN, TYPE_USER_DEFINED};
use crate::{GgufVocab, Result, TokenizerError};
use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hash::{BuildHasher, RandomState};

/// `merge_rank` of a piece no merge forms.
const NO_MERGE: u32 = u32::MAX;
/// `byte_ids` of a byte without a `<0xNN>` piece.
const NO_ID: u32 = u32::MAX;
/// `flags` bits: a special added token (skipped when decoding for display) ...
const SPECIAL: u8 = 1;
/// ... and an added token (its bytes are its text as written).
const ADDED: u8 = 2;

/// Piece texts by id, and ids by text.
struct Pieces {
    /// Every piece's text, concatenated in id order.
    text: String,
    /// `ends[id]`: where piece `id`'s text ends in `text` (it starts where `id - 1`'s ends).
    ends: Vec<u32>,
    /// Open addressing by the text's hash: `id + 1` of the first piece with a text, 0 empty.
    slots: Vec<u32>,
    /// The hash, keyed per process: a crafted vocabulary cannot pile its texts into one probe
    /// chain.
    hasher: RandomState,
}

impl Pieces {
    fn new(tokens: &[Cow<'_, str>]) -> Result<Pieces> {
        let total: usize = tokens.iter().map(|t| t.len()).sum();
        if total > u32::MAX as usize || tokens.len() >= u32::MAX as usize {
            return Err(TokenizerError::Gguf(format!(
                "tokenizer.ggml.tokens: {} tokens of {total} bytes are more than a vocabulary \
                 can hold",
                tokens.len()
            )));
        }
        let mut text = String::with_capacity(total);
        let mut ends = Vec::with_capacity(tokens.len());
        for t in tokens {
            text.push_str(t);
            ends.push(text.len() as u32);
        }
        let mut pieces = Pieces {
            text,
            ends,
            slots: vec![0; (tokens.len() * 2).next_power_of_two().max(2)],
            hasher: RandomState::new(),
        };
        let mask = pieces.slots.len() - 1;
        for id in 0..tokens.len() {
            let key = pieces.get(id as u32);
            let mut at = pieces.hash(key) & mask;
            loop {
                match pieces.slots[at] {
                    0 => {
                        pieces.slots[at] = id as u32 + 1;
                        break;
                    }
                    s if pieces.get(s - 1) == key => break,
                    _ => at = (at + 1) & mask,
                }
            }
        }
        Ok(pieces)
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    fn hash(&self, s: &str) -> usize {
        self.hasher.hash_one(s) as usize
    }

    /// The text of `id` (which must be below [`Pieces::len`]).
    fn get(&self, id: u32) -> &str {
        let id = id as usize;
        let start = if id == 0 {
            0
        } else {
            self.ends[id - 1] as usize
        };
        &self.text[start..self.ends[id] as usize]
    }

    /// The first id whose text is `s`.
    fn find(&self, s: &str) -> Option<u32> {
        let mask = self.slots.len() - 1;
        let mut at = self.hash(s) & mask;
        loop {
            match self.slots[at] {
                0 => return None,
                id if self.get(id - 1) == s => return Some(id - 1),
                _ => at = (at + 1) & mask,
            }
        }
    }
}

/// A SentencePiece BPE tokenizer; see the module docs.
pub(crate) struct SentencePiece {
    pieces: Pieces,
    /// By the first id of a text: the rank of the merge forming it (lower merges first).
    merge_rank: Vec<u32>,
    /// The id of each byte's `<0xNN>` piece.
    byte_ids: [u32; 256],
    unk: Option<u32>,
    add_prefix: bool,
    /// Added tokens, matched leftmost-longest, and each pattern's id.
    added: Option<(AhoCorasick, Vec<u32>)>,
    /// [`SPECIAL`] and [`ADDED`] by id.
    flags: Vec<u8>,
}

/// One symbol of a word being merged (a doubly linked list over a vector).
#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    prev: isize,
    next: isize,
    /// Bytes of input covered; 0 once merged into its left neighbour.
    len: usize,
}

impl SentencePiece {
    pub(crate) fn new(v: &GgufVocab<'_>) -> Result<SentencePiece> {
        let pieces = Pieces::new(&v.tokens)?;
        let n = pieces.len();
        let kind = |id: usize| v.token_types.get(id).copied().unwrap_or(1);
        let score = |id: usize| v.scores.get(id).copied().unwrap_or(0.0);
        // Merges form the pieces that are not control, byte or unknown pieces, ranked by score
        // (higher first), then id; a text's rank is that of its last-ranked piece.
        let mut order: Vec<u32> = (0..n as u32)
            .filter(|&id| !matches!(kind(id as usize), TYPE_CONTROL | TYPE_BYTE | TYPE_UNKNOWN))
            .collect();
        order.sort_by(|&a, &b| {
            score(b as usize)
                .total_cmp(&score(a as usize))
                .then(a.cmp(&b))
        });
        let mut merge_rank = vec![NO_MERGE; n];
        for (rank, &id) in order.iter().enumerate() {
            if let Some(first) = pieces.find(pieces.get(id)) {
                merge_rank[first as usize] = rank as u32;
            }
        }
        let mut byte_ids = [NO_ID; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            if let Some(id) = pieces.find(&format!("<{b:#04X}>")) {
                *slot = id;
            }
        }
        let unk = v
            .unknown_token_id
            .map(|id| id as usize)
            .or_else(|| (0..n).find(|&id| kind(id) == TYPE_UNKNOWN))
            .filter(|&id| id < n)
            .and_then(|id| pieces.find(pieces.get(id as u32)));
        // Special tokens (control, unknown) match before user-defined ones; a text is added once.
        let mut flags = vec![0u8; n];
        let mut patterns: Vec<&str> = Vec::new();
        let mut ids = Vec::new();
        for special in [true, false] {
            for id in 0..n {
                let is_special = matches!(kind(id), TYPE_CONTROL | TYPE_UNKNOWN);
                if is_special != special || !(is_special || kind(id) == TYPE_USER_DEFINED) {
                    continue;
                }
                let text = pieces.get(id as u32);
                let Some(first) = pieces.find(text).filter(|_| !text.is_empty()) else {
                    continue;
                };
                let f = &mut flags[first as usize];
                if special {
                    *f |= SPECIAL;
                }
                if *f & ADDED == 0 {
                    *f |= ADDED;
                    patterns.push(text);
                    ids.push(first);
                }
            }
        }
        // A repeat of an added token's text is special (and added) as the text is.
        for id in 0..n {
            if let Some(first) = pieces.find(pieces.get(id as u32)) {
                flags[id] |= flags[first as usize];
            }
        }
        let added = if patterns.is_empty() {
            None
        } else {
            let matcher = AhoCorasickBuilder::new()
                .match_kind(MatchKind::LeftmostLongest)
                .build(&patterns)
                .map_err(|e| TokenizerError::Gguf(format!("cannot index the added tokens: {e}")))?;
            Some((matcher, ids))
        };
        Ok(SentencePiece {
            merge_rank,
            byte_ids,
            unk,
            add_prefix: v.add_space_prefix.unwrap_or(true),
            added,
            flags,
            pieces,
        })
    }

    /// Number of ids.
    pub(crate) fn len(&self) -> usize {
        self.pieces.len()
    }

    /// The first id whose text is `s`.
    pub(crate) fn token_to_id(&self, s: &str) -> Option<u32> {
        self.pieces.find(s)
    }

    /// The text of `id`, if it is one.
    pub(crate) fn id_to_token(&self, id: u32) -> Option<&str> {
        ((id as usize) < self.len()).then(|| self.pieces.get(id))
    }

    /// Whether `id` is a special added token (control or unknown).
    pub(crate) fn is_special(&self, id: u32) -> bool {
        self.flags
            .get(id as usize)
            .is_some_and(|f| f & SPECIAL != 0)
    }

    /// The ids of `text`.
    pub(crate) fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        let mut start = 0;
        if let Some((matcher, ids)) = &self.added {
            for m in matcher.find_iter(text) {
                self.encode_stretch(&text[start..m.start()], &mut out);
                out.push(ids[m.pattern().as_usize()]);
                start = m.end();
            }
        }
        self.encode_stretch(&text[start..], &mut out);
        out
    }

    /// Text without added tokens: normalized, split into pieces, merged.
    fn encode_stretch(&self, text: &str, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let mut norm = String::with_capacity(text.len() + 3);
        if self.add_prefix {
            norm.push('▁');
        }
        for c in text.chars() {
            norm.push(if c == ' ' { '▁' } else { c });
        }
        let mut symbols: Vec<Symbol> = Vec::with_capacity(norm.len());
        let push = |symbols: &mut Vec<Symbol>, id: u32, len: usize| {
            let at = symbols.len() as isize;
            if let Some(last) = symbols.last_mut() {
                last.next = at;
            }
            symbols.push(Symbol {
                id,
                prev: at - 1,
                next: -1,
                len,
            });
        };
        // A pending run of unknown characters: the unknown id and the bytes it covers.
        let mut unk: Option<(u32, usize)> = None;
        for (i, c) in norm.char_indices() {
            let s = &norm[i..i + c.len_utf8()];
            if let Some(id) = self.pieces.find(s) {
                if let Some((u, len)) = unk.take() {
                    push(&mut symbols, u, len);
                }
                push(&mut symbols, id, s.len());
            } else if s.bytes().all(|b| self.byte_ids[b as usize] != NO_ID) {
                // (A pending unknown run stays pending across byte pieces, as `tokenizers`
                // does.)
                for b in s.bytes() {
                    push(&mut symbols, self.byte_ids[b as usize], 1);
                }
            } else if let Some(u) = self.unk {
                unk = Some(unk.map_or((u, s.len()), |(u, len)| (u, len + s.len())));
            }
        }
        if let Some((u, len)) = unk {
            push(&mut symbols, u, len);
        }
        self.merge(&mut symbols);
        out.extend(symbols.iter().filter(|s| s.len != 0).map(|s| s.id));
    }

    /// The merge of the pair `left`, `right`: its rank key and the id it forms.
    fn pair(&self, left: u32, right: u32, buf: &mut String) -> Option<((u32, u32, u32), u32)> {
        let (l, r) = (self.pieces.get(left), self.pieces.get(right));
        if l.is_empty() || r.is_empty() {
            return None;
        }
        buf.clear();
        buf.push_str(l);
        buf.push_str(r);
        let id = self.pieces.find(buf)?;
        let rank = self.merge_rank[id as usize];
        (rank != NO_MERGE).then_some(((rank, left, right), id))
    }

    /// Merges pairs best rank first, leftmost on ties, until none forms a piece.
    fn merge(&self, symbols: &mut [Symbol]) {
        let mut buf = String::new();
        // Min-heap of (rank key, position, id formed).
        let mut queue = BinaryHeap::with_capacity(symbols.len());
        for pos in 0..symbols.len().saturating_sub(1) {
            if let Some((key, id)) = self.pair(symbols[pos].id, symbols[pos + 1].id, &mut buf) {
                queue.push(Reverse((key, pos, id)));
            }
        }
        while let Some(Reverse((_, pos, id))) = queue.pop() {
            let here = symbols[pos];
            if here.len == 0 || here.next < 0 {
                continue;
            }
            let next = here.next as usize;
            let right = symbols[next];
            // A stale entry: the pair at `pos` changed since it was queued.
            if self.pair(here.id, right.id, &mut buf).map(|(_, i)| i) != Some(id) {
                continue;
            }
            symbols[pos].id = id;
            symbols[pos].len += right.len;
            symbols[pos].next = right.next;
            symbols[next].len = 0;
            if right.next >= 0 {
                symbols[right.next as usize].prev = pos as isize;
            }
            let here = symbols[pos];
            if here.prev >= 0 {
                let prev = here.prev as usize;
                if let Some((key, id)) = self.pair(symbols[prev].id, here.id, &mut buf) {
                    queue.push(Reverse((key, prev, id)));
                }
            }
            if here.next >= 0 {
                let next = here.next as usize;
                if let Some((key, id)) = self.pair(here.id, symbols[next].id, &mut buf) {
                    queue.push(Reverse((key, pos, id)));
                }
            }
        }
    }

    /// The text of `ids` (each below [`SentencePiece::len`]); special tokens left out with
    /// `skip_special`.
    pub(crate) fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let mut out = String::new();
        let mut bytes: Vec<u8> = Vec::new();
        let flush = |bytes: &mut Vec<u8>, out: &mut String| {
            if bytes.is_empty() {
                return;
            }
            match std::str::from_utf8(bytes) {
                Ok(s) => out.push_str(s),
                Err(_) => out.extend(std::iter::repeat_n('\u{FFFD}', bytes.len())),
            }
            bytes.clear();
        };
        for &id in ids {
            if id as usize >= self.len() || skip_special && self.is_special(id) {
                continue;
            }
            let text = self.pieces.get(id);
            let text: Cow<'_, str> = if text.contains('▁') {
                Cow::Owned(text.replace('▁', " "))
            } else {
                Cow::Borrowed(text)
            };
            if let Some(b) = byte_piece(&text) {
                bytes.push(b);
            } else {
                flush(&mut bytes, &mut out);
                out.push_str(&text);
            }
        }
        flush(&mut bytes, &mut out);
        if self.add_prefix && out.starts_with(' ') {
            out.remove(0);
        }
        out
    }

    /// The bytes every id stands for: added tokens as written, `<0xNN>` pieces as their byte,
    /// other pieces with `▁` as a space.
    pub(crate) fn token_bytes(&self) -> Vec<Vec<u8>> {
        (0..self.len() as u32)
            .map(|id| {
                let text = self.pieces.get(id);
                if self.flags[id as usize] & ADDED != 0 {
                    text.as_bytes().to_vec()
                } else {
                    crate::token_bytes::sentencepiece_bytes('▁', text)
                }
            })
            .collect()
    }
}

/// The byte a decoded `<0xNN>` piece stands for (as `tokenizers`' byte-fallback decoder reads
/// it).
fn byte_piece(text: &str) -> Option<u8> {
    if text.len() == 6 && text.starts_with("<0x") && text.ends_with('>') {
        u8::from_str_radix(text.get(3..5)?, 16).ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small vocabulary: bytes, unknown, control and user-defined tokens, scored pieces.
    fn vocab(add_prefix: bool) -> GgufVocab<'static> {
        let mut tokens: Vec<Cow<'static, str>> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        let mut types = vec![TYPE_UNKNOWN, TYPE_CONTROL, TYPE_CONTROL];
        for b in 0..=255u8 {
            tokens.push(format!("<{b:#04X}>").into());
            types.push(TYPE_BYTE);
        }
        for (t, ty) in [
            ("▁", 1),
            ("h", 1),
            ("e", 1),
            ("l", 1),
            ("o", 1),
            ("he", 1),
            ("ll", 1),
            ("llo", 1),
            ("hello", 1),
            ("▁hello", 1),
            ("<tool>", TYPE_USER_DEFINED),
            ("w", 1),
            ("r", 1),
            ("d", 1),
            ("or", 1),
            ("wor", 1),
            ("ld", 1),
            ("world", 1),
            ("▁world", 1),
        ] {
            tokens.push(t.into());
            types.push(ty);
        }
        let scores = (0..tokens.len()).map(|i| -(i as f32)).collect();
        GgufVocab {
            model: "llama".into(),
            tokens,
            scores,
            token_types: types,
            unknown_token_id: Some(0),
            add_space_prefix: Some(add_prefix),
            ..GgufVocab::default()
        }
    }

    fn id(s: &SentencePiece, t: &str) -> u32 {
        s.token_to_id(t).expect("in the vocabulary")
    }

    #[test]
    fn merges_follow_scores_and_added_tokens_split_the_text() {
        let s = SentencePiece::new(&vocab(true)).expect("builds");
        assert_eq!(
            s.encode("hello world"),
            vec![id(&s, "▁hello"), id(&s, "▁world")]
        );
        // Added tokens are matched raw; each stretch around them gets its own prefix.
        assert_eq!(
            s.encode("<s>hello<tool>world"),
            vec![
                id(&s, "<s>"),
                id(&s, "▁hello"),
                id(&s, "<tool>"),
                id(&s, "▁world")
            ]
        );
        // Characters without a piece fall back to their bytes.
        assert_eq!(
            s.encode("h\u{e9}"),
            vec![id(&s, "▁"), id(&s, "h"), id(&s, "<0xC3>"), id(&s, "<0xA9>")]
        );
        assert_eq!(s.encode(""), Vec::<u32>::new());
    }

    #[test]
    fn unknown_characters_fuse_without_byte_pieces() {
        let mut v = vocab(false);
        for t in v.tokens.iter_mut().filter(|t| t.starts_with("<0x")) {
            t.to_mut().push('!');
        }
        let s = SentencePiece::new(&v).expect("builds");
        assert_eq!(
            s.encode("h\u{e9}\u{e8}o"),
            vec![id(&s, "h"), 0, id(&s, "o")]
        );
    }

    #[test]
    fn decoding_spaces_bytes_and_specials() {
        let s = SentencePiece::new(&vocab(true)).expect("builds");
        let ids = s.encode("<s>hello world \u{e9}");
        assert_eq!(s.decode(&ids, true), "hello world \u{e9}");
        assert_eq!(s.decode(&ids, false), "<s> hello world \u{e9}");
        // A byte run that is not UTF-8: one replacement character per byte.
        assert_eq!(
            s.decode(&[id(&s, "<0xC3>"), id(&s, "h")], false),
            "\u{FFFD}h"
        );
        let bytes = s.token_bytes();
        assert_eq!(bytes[id(&s, "▁hello") as usize], b" hello");
        assert_eq!(bytes[id(&s, "<0x0A>") as usize], b"\n");
        assert_eq!(bytes[id(&s, "<tool>") as usize], b"<tool>");
        assert!(s.is_special(id(&s, "<s>")) && !s.is_special(id(&s, "<tool>")));
    }

    #[test]
    fn repeated_texts_resolve_to_the_first_id() {
        let mut v = vocab(true);
        v.tokens.push("hello".into());
        v.token_types.push(1);
        v.scores.push(100.0);
        let s = SentencePiece::new(&v).expect("builds");
        let first = v.tokens.iter().position(|t| t == "hello").expect("there") as u32;
        assert_eq!(s.token_to_id("hello"), Some(first));
        assert_eq!(s.encode("hello"), vec![id(&s, "▁hello")]);
    }
}
