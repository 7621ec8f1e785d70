//! The per-request random generator: xoshiro256++ seeded through SplitMix64. Small, fast and
//! fully determined by its seed, so a request's draws never depend on what else runs.

use ferrum_types::splitmix::mix64;
use ferrum_types::SplitMix64;

/// A request's draws, one uniform per output position: SplitMix64's stream from a key mixed out
/// of the seed, read at that position. A pure function of (seed, position), so a token's draw
/// does not depend on how many draws came before it or where its row was sampled.
#[derive(Debug, Clone, Copy)]
pub struct Draws {
    key: u64,
}

impl Draws {
    pub fn new(seed: u64) -> Draws {
        Draws { key: mix64(seed) }
    }

    /// The uniform in [0, 1) (53 random bits) of output position `index`.
    pub fn uniform(&self, index: u64) -> f64 {
        // SplitMix64 at state `key + index * gamma` gives its `index`-th output next.
        let gamma = 0x9E37_79B9_7F4A_7C15u64;
        let mut x = SplitMix64::new(self.key.wrapping_add(index.wrapping_mul(gamma)));
        (x.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A seeded pseudo-random generator.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut x = SplitMix64::new(seed);
        Rng {
            s: std::array::from_fn(|_| x.next_u64()),
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let out = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        out
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_uniform_mean() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let mut c = Rng::new(8);
        let xs: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        assert_eq!(xs, (0..4).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_ne!(xs, (0..4).map(|_| c.next_u64()).collect::<Vec<_>>());
        let n = 100_000;
        let mean = (0..n).map(|_| a.next_f64()).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.005, "{mean}");
    }

    #[test]
    fn draws_are_a_function_of_seed_and_position() {
        let (a, b) = (Draws::new(7), Draws::new(8));
        assert_eq!(a.uniform(3), Draws::new(7).uniform(3));
        assert_ne!(a.uniform(3), b.uniform(3));
        assert_ne!(a.uniform(3), a.uniform(4));
        let n = 100_000u64;
        let mean = (0..n).map(|i| a.uniform(i)).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.005, "{mean}");
        // Buckets of tenths, roughly even.
        let mut tenths = [0u32; 10];
        (0..n).for_each(|i| tenths[(b.uniform(i) * 10.0) as usize] += 1);
        assert!(
            tenths.iter().all(|&c| (9_500..10_500).contains(&c)),
            "{tenths:?}"
        );
    }
}
