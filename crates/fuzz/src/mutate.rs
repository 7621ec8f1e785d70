//! Seeded byte mutation: the moves a fuzzer needs to get past length fields and counts.
//!
//! Every choice comes from one [`Rng`], so a seed and a corpus reproduce a run. Mutations
//! land in the "hot" prefix of an input (where headers live) most of the time; large files
//! are mostly payload that parsers never look inside.

use ferrum_types::SplitMix64;

/// The mutations' choices: a [`SplitMix64`] stream, small, fast and good enough here.
#[derive(Debug, Clone)]
pub struct Rng(SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(SplitMix64::new(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// True with probability `num/den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.next_u64() % den < num
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Integers that break length and count checks: zero, one, sign boundaries, all-ones and
/// "huge but not all-ones" values.
pub const INTERESTING: &[u64] = &[
    0,
    1,
    2,
    3,
    4,
    7,
    8,
    16,
    31,
    32,
    64,
    127,
    128,
    255,
    256,
    4096,
    65535,
    65536,
    0x7FFF_FFFF,
    0x8000_0000,
    0xFFFF_FFFF,
    0x1_0000_0000,
    1 << 40,
    1 << 60,
    0x7FFF_FFFF_FFFF_FFFF,
    0x8000_0000_0000_0000,
    u64::MAX,
    u64::MAX - 1,
];

/// How to mutate one target's inputs.
#[derive(Debug, Clone)]
pub struct Mutator {
    /// Bytes at the start where most mutations land.
    pub hot: usize,
    /// Words spliced into text inputs (JSON keys, template syntax).
    pub dictionary: Vec<Vec<u8>>,
    /// Inputs are never grown past this many bytes.
    pub max_len: usize,
}

impl Default for Mutator {
    fn default() -> Self {
        Mutator {
            hot: 4096,
            dictionary: Vec::new(),
            max_len: 16 << 20,
        }
    }
}

impl Mutator {
    /// Writes a mutant of `input` into `out`: 1 to 4 stacked mutations, sometimes after
    /// splicing with another corpus entry.
    pub fn mutate(&self, rng: &mut Rng, input: &[u8], corpus: &[Vec<u8>], out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(input);
        let rounds = 1 + rng.below(4);
        for _ in 0..rounds {
            self.once(rng, corpus, out);
        }
        out.truncate(self.max_len);
    }

    /// A position, in the hot prefix 7 times in 8.
    fn pos(&self, rng: &mut Rng, len: usize) -> usize {
        if len == 0 {
            return 0;
        }
        if rng.chance(7, 8) {
            rng.below(len.min(self.hot.max(1)))
        } else {
            rng.below(len)
        }
    }

    fn once(&self, rng: &mut Rng, corpus: &[Vec<u8>], out: &mut Vec<u8>) {
        let len = out.len();
        match rng.below(11) {
            // Flip one bit.
            0 if len > 0 => {
                let i = self.pos(rng, len);
                out[i] ^= 1 << rng.below(8);
            }
            // One byte to an edge value or a random one.
            1 if len > 0 => {
                let i = self.pos(rng, len);
                out[i] = *rng.pick(&[0u8, 1, 0x7F, 0x80, 0xFF, b'"', b'{', b'[', b'\\']);
                if rng.chance(1, 2) {
                    out[i] = rng.next_u64() as u8;
                }
            }
            // An interesting integer over 2, 4 or 8 bytes (little-endian), aligned or not.
            2 | 3 if len >= 8 => {
                let width = *rng.pick(&[2usize, 4, 8, 8]);
                let i = self.pos(rng, len - width + 1).min(len - width);
                let mut v = *rng.pick(INTERESTING);
                if rng.chance(1, 4) {
                    v = v.wrapping_add(rng.below(3) as u64).wrapping_sub(1);
                }
                out[i..i + width].copy_from_slice(&v.to_le_bytes()[..width]);
            }
            // Add or subtract a little from a 4- or 8-byte field (lengths off by a few).
            4 if len >= 8 => {
                let i = self.pos(rng, len - 7).min(len - 8);
                let mut b = [0u8; 8];
                b.copy_from_slice(&out[i..i + 8]);
                let delta = rng.below(33) as u64;
                let v = if rng.chance(1, 2) {
                    u64::from_le_bytes(b).wrapping_add(delta)
                } else {
                    u64::from_le_bytes(b).wrapping_sub(delta)
                };
                out[i..i + 8].copy_from_slice(&v.to_le_bytes());
            }
            // Cut the end off.
            5 if len > 0 => {
                let at = if rng.chance(1, 2) {
                    self.pos(rng, len)
                } else {
                    rng.below(len)
                };
                out.truncate(at);
            }
            // Delete a range.
            6 if len > 1 => {
                let a = self.pos(rng, len);
                let n = 1 + rng.below((len - a).min(64));
                out.drain(a..a + n);
            }
            // Duplicate a range somewhere else.
            7 if len > 1 => {
                let a = self.pos(rng, len);
                let n = 1 + rng.below((len - a).min(256));
                let chunk = out[a..a + n].to_vec();
                let at = self.pos(rng, out.len() + 1);
                splice_in(out, at, &chunk);
            }
            // A dictionary word, inserted or written over.
            8 if !self.dictionary.is_empty() => {
                let word = rng.pick(&self.dictionary).clone();
                let at = self.pos(rng, len + 1);
                if rng.chance(1, 2) || at + word.len() > len {
                    splice_in(out, at, &word);
                } else {
                    out[at..at + word.len()].copy_from_slice(&word);
                }
            }
            // This input's head, another's tail.
            9 if !corpus.is_empty() => {
                let other = rng.pick(corpus);
                let a = self.pos(rng, len + 1);
                let b = self.pos(rng, other.len() + 1);
                out.truncate(a);
                out.extend_from_slice(&other[b..]);
            }
            // A few random bytes inserted.
            _ => {
                let n = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                let at = self.pos(rng, len + 1);
                splice_in(out, at, &bytes);
            }
        }
    }
}

fn splice_in(out: &mut Vec<u8>, at: usize, bytes: &[u8]) {
    let at = at.min(out.len());
    out.splice(at..at, bytes.iter().copied());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_mutants_and_they_differ_from_the_input() {
        let m = Mutator {
            dictionary: vec![b"{{".to_vec()],
            ..Mutator::default()
        };
        let input: Vec<u8> = (0..200u8).collect();
        let corpus = vec![b"other input".to_vec()];
        let run = |seed| {
            let mut rng = Rng::new(seed);
            let mut out = Vec::new();
            (0..100)
                .map(|_| {
                    m.mutate(&mut rng, &input, &corpus, &mut out);
                    out.clone()
                })
                .collect::<Vec<_>>()
        };
        let a = run(7);
        assert_eq!(a, run(7));
        assert_ne!(a, run(8));
        assert!(a.iter().filter(|x| **x != input).count() > 90);
        assert!(a.iter().any(|x| x.len() < input.len()));
        assert!(a.iter().any(|x| x.len() > input.len()));
    }

    #[test]
    fn empty_inputs_and_tiny_limits_are_fine() {
        let m = Mutator {
            max_len: 4,
            ..Mutator::default()
        };
        let mut rng = Rng::new(1);
        let mut out = Vec::new();
        for _ in 0..1000 {
            m.mutate(&mut rng, &[], &[], &mut out);
            assert!(out.len() <= 4);
        }
    }
}
