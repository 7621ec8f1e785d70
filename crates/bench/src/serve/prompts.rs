//! Benchmark prompts: distinct, deterministic from `--seed`, about `--input-len` tokens each.
//!
//! Prompt `index` is its number followed by words drawn from a fixed list of common English
//! words (each one token with its leading space in the usual BPE vocabularies), with a random
//! stream of its own derived from the seed and the index. Prompts therefore differ from their
//! second token on, and no server can reuse one prompt's cached prefix for another. Each
//! concurrency level gets its own indices, so a level never hits the cache left by the one
//! before.
//!
//! Without a tokenizer the length is approximate (a digit counts as one token). With one, the
//! prompt is trimmed to exactly `input_len` tokens as that tokenizer counts them, without the
//! special tokens (BOS) a server may add.

use anyhow::Result;
use ferrum_tokenizer::Tokenizer;
use ferrum_types::SplitMix64;

#[rustfmt::skip]
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "time", "people", "year",
    "way", "day", "man", "thing", "woman", "life", "child", "world", "school", "state", "family",
    "student", "group", "country", "problem", "hand", "part", "place", "case", "week", "company",
    "system", "program", "question", "work", "government", "number", "night", "point", "home",
    "water", "room", "mother", "area", "money", "story", "fact", "month", "lot", "right", "study",
    "book", "eye", "job", "word", "business", "issue", "side", "kind", "head", "house", "service",
    "friend", "father", "power", "hour", "game", "line", "end", "member", "law", "car", "city",
    "name", "team", "minute", "idea", "kid", "body", "back", "parent", "face", "others", "level",
    "office", "door", "health", "person", "art", "war", "history", "party", "result", "change",
    "morning", "reason", "research", "girl", "guy", "moment", "air", "teacher", "force",
    "education", "good", "new", "first", "last", "long", "great", "little", "own", "other", "old",
    "big", "high", "different", "small", "large", "next", "early", "young", "important", "few",
    "public", "bad", "same", "able", "make", "know", "take", "see", "come", "think", "look",
    "want", "give", "use", "find", "tell", "ask", "seem", "feel", "try", "leave", "call", "keep",
    "let", "begin", "help", "talk", "turn", "start", "show", "hear", "play", "run", "move", "like",
    "live", "believe", "hold", "bring", "happen", "write", "provide", "sit", "stand", "lose",
    "pay", "meet", "include", "continue", "set", "learn", "lead", "understand", "watch", "follow",
    "stop", "create", "speak", "read", "spend", "grow", "open", "walk", "win", "offer", "remember",
    "love", "consider", "appear", "buy", "wait", "serve", "die", "send", "expect", "build", "stay",
    "fall", "cut", "reach", "kill", "remain", "river", "green", "music",
];

/// A [`SplitMix64`] stream: small, fast and good enough to pick words (and, in `bench soak`,
/// requests).
#[derive(Debug, Clone)]
pub(crate) struct Rng(SplitMix64);

impl Rng {
    /// The stream for item `index` of a run seeded with `seed`.
    pub(crate) fn for_index(seed: u64, index: usize) -> Rng {
        Rng(SplitMix64::new(
            seed ^ (index as u64).wrapping_mul(0xA076_1D64_78BD_642F),
        ))
    }

    fn for_prompt(seed: u64, index: usize) -> Rng {
        let mut r = Rng::for_index(seed, index);
        r.next();
        r
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// Uniform in `[0, 1)`.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn word(&mut self) -> &'static str {
        WORDS[(self.next() % WORDS.len() as u64) as usize]
    }
}

/// One benchmark prompt and its length in tokens (exact with a tokenizer, else estimated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    pub text: String,
    pub num_tokens: usize,
}

/// Prompt `index` for `seed`, about `input_len` tokens long; exactly that with `tokenizer`.
pub fn prompt(
    seed: u64,
    index: usize,
    input_len: usize,
    tokenizer: Option<&Tokenizer>,
) -> Result<Prompt> {
    let mut rng = Rng::for_prompt(seed, index);
    let mut text = index.to_string();
    let Some(tok) = tokenizer else {
        for _ in 0..input_len.saturating_sub(text.len()).max(1) {
            text.push(' ');
            text.push_str(rng.word());
        }
        return Ok(Prompt {
            text,
            num_tokens: input_len,
        });
    };
    let count = |t: &str| -> Result<usize> { Ok(tok.encode(t, false)?.len()) };
    let mut n = count(&text)?;
    while n < input_len {
        for _ in 0..input_len - n {
            text.push(' ');
            text.push_str(rng.word());
        }
        n = count(&text)?;
    }
    if n == input_len {
        return Ok(Prompt {
            text,
            num_tokens: n,
        });
    }
    // Too long: cut the ids and decode; re-encoding a cut may merge differently, so adjust.
    let ids = tok.encode(&text, false)?;
    let mut best = Prompt {
        text: text.clone(),
        num_tokens: n,
    };
    let mut cut = input_len;
    for _ in 0..8 {
        let candidate = tok.decode(&ids[..cut], false)?;
        let got = count(&candidate)?;
        if got.abs_diff(input_len) < best.num_tokens.abs_diff(input_len) {
            best = Prompt {
                text: candidate,
                num_tokens: got,
            };
        }
        if got == input_len {
            break;
        }
        cut = if got > input_len {
            cut.saturating_sub(got - input_len).max(1)
        } else {
            (cut + input_len - got).min(ids.len())
        };
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_distinct() {
        let make = || -> Result<Vec<Prompt>> { (0..8).map(|i| prompt(3, i, 50, None)).collect() };
        let (a, b) = (make().expect("prompts"), make().expect("prompts"));
        assert_eq!(a, b);
        let other = prompt(4, 0, 50, None).ok();
        assert_ne!(Some(&a[0]), other.as_ref());
        for (i, p) in a.iter().enumerate() {
            assert!(p.text.starts_with(&format!("{i} ")));
            assert_eq!(p.text.split(' ').count(), 50);
            for q in &a[i + 1..] {
                let common = p
                    .text
                    .split(' ')
                    .zip(q.text.split(' '))
                    .take_while(|(x, y)| x == y)
                    .count();
                assert!(common < 3, "{:?} / {:?}", p.text, q.text);
            }
        }
        let short = prompt(0, 123, 1, None).ok();
        assert_eq!(short.map(|p| p.text.split(' ').count()), Some(2));
    }

    #[test]
    fn exact_length_with_a_tokenizer() {
        let dir = ferrum_testdata::fixture("tiny-smollm");
        let tok = ferrum_tokenizer::TextAssets::from_folder(&dir)
            .map(|t| t.tokenizer)
            .expect("the tiny fixture has a tokenizer");
        for len in [1, 2, 7, 16, 100, 300] {
            for i in [0, 5, 1234] {
                let p = prompt(0, i, len, Some(&tok)).expect("prompt");
                let ids = tok.encode(&p.text, false).expect("encode");
                assert_eq!(
                    (ids.len(), p.num_tokens),
                    (len, len),
                    "{len} {i} {:?}",
                    p.text
                );
            }
        }
    }
}
