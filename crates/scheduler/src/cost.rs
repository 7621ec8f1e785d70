//! [`CostModel`]: what a step costs, learned online from the engine's own step timings, so
//! the scheduler and admission can predict when a request's first token can come.
//!
//! A step's seconds are modelled as `c0 + c1 * prefill_tokens + c2 * decode_rows +
//! c3 * kv_blocks` (the blocks attention reads, a proxy for context length), fitted by least
//! squares with exponential forgetting (recent steps weigh more: the machine's speed moves)
//! and a ridge toward the seed worth two typical steps, which keeps the fit defined, and each
//! term near its seed, until the steps have varied enough to tell the terms apart. The model is pure arithmetic: time is an input (the engine
//! measures it), so tests drive it with a fake clock.
//!
//! The model also keeps how far its predictions missed, each made before the step it
//! predicts was learned from (relative errors, forgetting like the fit): [`CostModel::upper`]
//! is a prediction that a step exceeds about one time in six (the mean error plus one
//! deviation), what a step planned within a target must use: planned at the plain prediction,
//! steps would land above the target half the time, and so would a request's mean time per
//! token.
//!
//! Invariants: predictions are never negative; [`CostModel::upper`] is never below
//! [`CostModel::predict`]; [`CostModel::is_ready`] is false until [`MIN_OBSERVATIONS`] steps
//! were seen (callers then do not refuse anything on its word).

/// Steps seen before predictions are trusted.
pub const MIN_OBSERVATIONS: u64 = 8;

/// Weight of an observation relative to the next one's (forgetting).
const DECAY: f64 = 0.99;

/// Pull toward the seed (ridge): as strong as this many steps of a typical shape
/// ([`TYPICAL`]), so a term the steps have not exercised yet (no prefill seen, say) keeps its
/// seed rather than whatever the others leave it.
const PRIOR_STEPS: f64 = 2.0;

/// A typical step's features: one step, 256 prefill tokens, 16 decode rows, 1024 KV blocks.
const TYPICAL: [f64; 4] = [1.0, 256.0, 16.0, 1024.0];

/// Weight of a prediction's error relative to the next one's: the errors are remembered over
/// about the last 50 steps (the machine's speed moves; so does the mix of shapes).
const ERROR_DECAY: f64 = 0.98;

/// The relative error assumed before any was seen, as a deviation (10%).
const ERROR_PRIOR: f64 = 0.1;

/// Largest relative error one step counts for: a step stalled by something else (the
/// machine swapping, a debugger) says little of the next ones.
const ERROR_CLAMP: f64 = 1.0;

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepShape {
    pub prefill_tokens: usize,
    pub decode_rows: usize,
    pub kv_blocks: usize,
}

impl StepShape {
    fn features(&self) -> [f64; 4] {
        [
            1.0,
            self.prefill_tokens as f64,
            self.decode_rows as f64,
            self.kv_blocks as f64,
        ]
    }
}

/// The fitted step cost; see the module docs.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    /// Coefficients: seconds per step, per prefill token, per decode row, per KV block.
    coef: [f64; 4],
    seed: [f64; 4],
    /// Forgetting sums of x x^T and x t.
    xx: [[f64; 4]; 4],
    xt: [f64; 4],
    seen: u64,
    /// Forgetting sums of the weights, the relative errors and their squares.
    err_w: f64,
    err_sum: f64,
    err_sq: f64,
}

impl CostModel {
    /// A model starting from `seed` coefficients (seconds per step, per prefill token, per
    /// decode row, per KV block).
    pub fn new(seed: [f64; 4]) -> CostModel {
        CostModel {
            coef: seed,
            seed,
            xx: [[0.0; 4]; 4],
            xt: [0.0; 4],
            seen: 0,
            err_w: 0.0,
            err_sum: 0.0,
            err_sq: 0.0,
        }
    }

    pub fn coefficients(&self) -> [f64; 4] {
        self.coef
    }

    pub fn observations(&self) -> u64 {
        self.seen
    }

    pub fn is_ready(&self) -> bool {
        self.seen >= MIN_OBSERVATIONS
    }

    /// Learns from a step of `shape` that took `seconds`.
    pub fn observe(&mut self, shape: StepShape, seconds: f64) {
        if !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        // How far the model, as it stood, missed this step (once it is trusted: the seed's
        // misses say nothing of the fit's).
        let predicted = self.predict(shape);
        if self.is_ready() && predicted > 0.0 {
            let e = (seconds / predicted - 1.0).clamp(-ERROR_CLAMP, ERROR_CLAMP);
            self.err_w = self.err_w * ERROR_DECAY + 1.0;
            self.err_sum = self.err_sum * ERROR_DECAY + e;
            self.err_sq = self.err_sq * ERROR_DECAY + e * e;
        }
        let x = shape.features();
        for i in 0..4 {
            for j in 0..4 {
                self.xx[i][j] = self.xx[i][j] * DECAY + x[i] * x[j];
            }
            self.xt[i] = self.xt[i] * DECAY + x[i] * seconds;
        }
        self.seen += 1;
        self.refit();
    }

    /// Solves (XX + R) c = Xt + R seed, with R the prior's diagonal (see [`PRIOR_STEPS`]).
    fn refit(&mut self) {
        let mut a = self.xx;
        let mut b = self.xt;
        for i in 0..4 {
            let r = PRIOR_STEPS * TYPICAL[i] * TYPICAL[i];
            a[i][i] += r;
            b[i] += r * self.seed[i];
        }
        if let Some(c) = solve(a, b) {
            // Costs are not negative: a term the data cannot support falls to zero.
            self.coef = c.map(|v| if v.is_finite() { v.max(0.0) } else { 0.0 });
        }
    }

    /// Seconds a step of `shape` is predicted to take.
    pub fn predict(&self, shape: StepShape) -> f64 {
        let x = shape.features();
        (0..4).map(|i| self.coef[i] * x[i]).sum::<f64>().max(0.0)
    }

    /// The factor [`CostModel::upper`] puts on a prediction: 1 plus the predictions' mean
    /// relative error plus its deviation (a prior worth two steps of a 10% error keeps it
    /// cautious while few errors are known), never below 1.
    pub fn margin(&self) -> f64 {
        let w = self.err_w + 2.0;
        let mean = self.err_sum / w;
        let var = ((self.err_sq + 2.0 * ERROR_PRIOR * ERROR_PRIOR) / w - mean * mean).max(0.0);
        (1.0 + mean + var.sqrt()).max(1.0)
    }

    /// Seconds a step of `shape` takes at most, but about one time in six ([`CostModel::margin`]
    /// times the prediction): what a step planned within a target is held to.
    pub fn upper(&self, shape: StepShape) -> f64 {
        self.margin() * self.predict(shape)
    }
}

/// Gaussian elimination with partial pivoting; `None` when singular.
#[allow(clippy::needless_range_loop)] // a 4x4 system reads best indexed
fn solve(mut a: [[f64; 4]; 4], mut b: [f64; 4]) -> Option<[f64; 4]> {
    for col in 0..4 {
        let pivot = (col..4).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-300 {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        for row in col + 1..4 {
            let f = a[row][col] / a[col][col];
            for k in col..4 {
                a[row][k] -= f * a[col][k];
            }
            b[row] -= f * b[col];
        }
    }
    let mut x = [0.0; 4];
    for row in (0..4).rev() {
        let s: f64 = (row + 1..4).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - s) / a[row][row];
    }
    Some(x)
}

/// When a request's first token can come, predicted: the prefill tokens ahead of it (and its
/// own) go through steps of `budget` tokens, each shared with `decode_rows` running decodes
/// reading `kv_blocks`. Seconds.
pub fn predict_first_token(
    model: &CostModel,
    tokens_ahead: usize,
    prompt: usize,
    budget: usize,
    decode_rows: usize,
    kv_blocks: usize,
) -> f64 {
    let per_step = budget.saturating_sub(decode_rows).max(1);
    let total = tokens_ahead + prompt;
    let full = total / per_step;
    let rest = total % per_step;
    let step = |p| {
        model.predict(StepShape {
            prefill_tokens: p,
            decode_rows,
            kv_blocks,
        })
    };
    full as f64 * step(per_step) + if rest > 0 { step(rest) } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a simulated clock with a known cost (plus noise), the fit finds the terms and the
    /// prediction follows them; a change of speed is followed.
    #[test]
    fn the_fit_recovers_a_known_cost_and_follows_changes() {
        let truth = |s: StepShape, k: f64| {
            k * (0.004
                + 0.0005 * s.prefill_tokens as f64
                + 0.002 * s.decode_rows as f64
                + 0.00001 * s.kv_blocks as f64)
        };
        let mut m = CostModel::new([0.01, 0.001, 0.001, 0.0]);
        assert!(!m.is_ready());
        let mut rng = ferrum_types::SplitMix64::new(3);
        for i in 0..400 {
            let s = StepShape {
                prefill_tokens: (rng.next_u64() % 512) as usize * (i % 2),
                decode_rows: (rng.next_u64() % 32) as usize,
                kv_blocks: (rng.next_u64() % 2000) as usize,
            };
            let noise = 1.0 + ((rng.next_u64() % 100) as f64 - 50.0) / 5000.0;
            m.observe(s, truth(s, 1.0) * noise);
        }
        assert!(m.is_ready());
        let c = m.coefficients();
        // Each term within 10% (the per-step one, small beside the others' noise, within 2 ms).
        let tolerance = [2e-3, 5e-5, 2e-4, 1e-6];
        for ((got, want), tol) in c.iter().zip([0.004, 0.0005, 0.002, 0.00001]).zip(tolerance) {
            assert!((got - want).abs() <= tol, "{c:?}");
        }
        let s = StepShape {
            prefill_tokens: 256,
            decode_rows: 8,
            kv_blocks: 500,
        };
        assert!((m.predict(s) / truth(s, 1.0) - 1.0).abs() < 0.05);
        // The machine gets twice as slow: a few hundred steps later the model says so.
        for i in 0..400 {
            let s = StepShape {
                prefill_tokens: (rng.next_u64() % 512) as usize * (i % 2),
                decode_rows: (rng.next_u64() % 32) as usize,
                kv_blocks: (rng.next_u64() % 2000) as usize,
            };
            m.observe(s, truth(s, 2.0));
        }
        assert!((m.predict(s) / truth(s, 2.0) - 1.0).abs() < 0.05);
        // Bad timings are ignored.
        let before = m.clone();
        m.observe(s, f64::NAN);
        m.observe(s, -1.0);
        assert_eq!(m, before);
    }

    /// Steps that never prefill say nothing of the prefill cost: it stays near its seed.
    #[test]
    fn an_unexercised_term_keeps_its_seed() {
        let mut m = CostModel::new([0.01, 0.001, 0.001, 0.0]);
        for i in 0..50 {
            let s = StepShape {
                decode_rows: 1 + i % 8,
                ..StepShape::default()
            };
            m.observe(s, 0.003 + 0.0005 * s.decode_rows as f64);
        }
        let c = m.coefficients();
        assert!((c[1] - 0.001).abs() < 1e-4, "{c:?}");
        // The decode cost moves from its seed towards the steps' (the prior is worth two steps
        // of 16 rows, more than these steps of 1 to 8).
        assert!(c[2] < 0.001 && c[2] > 0.0005, "{c:?}");
        let s = StepShape {
            decode_rows: 4,
            ..StepShape::default()
        };
        assert!((m.predict(s) / 0.005 - 1.0).abs() < 0.1, "{}", m.predict(s));
    }

    /// The margin follows how far the predictions miss: steps 20% slower than predicted
    /// (after the fit has settled, a change of speed) raise it, noisy steps raise it, exact
    /// ones bring it back toward 1; it is never below 1.
    #[test]
    fn the_margin_follows_the_prediction_errors() {
        let cost = |s: StepShape| 0.01 + 0.001 * s.prefill_tokens as f64;
        let mut m = CostModel::new([0.01, 0.001, 0.0, 0.0]);
        let shape = |i: usize| StepShape {
            prefill_tokens: 16 * (i % 5),
            ..StepShape::default()
        };
        // Exact steps: the margin falls from the prior's toward 1.
        let start = m.margin();
        assert!((start - 1.1).abs() < 1e-9, "{start}");
        for i in 0..200 {
            m.observe(shape(i), cost(shape(i)));
        }
        assert!(m.margin() < 1.03, "{}", m.margin());
        // Alternately 30% fast and 30% slow: unbiased but noisy, about one deviation.
        for i in 0..200 {
            let k = if i % 2 == 0 { 0.7 } else { 1.3 };
            m.observe(shape(i), k * cost(shape(i)));
        }
        assert!(m.margin() > 1.2 && m.margin() < 1.4, "{}", m.margin());
        let s = shape(3);
        assert!((m.upper(s) - m.margin() * m.predict(s)).abs() < 1e-12);
        // Steps faster than predicted never make the margin less than 1.
        let mut fast = CostModel::new([0.01, 0.001, 0.0, 0.0]);
        for i in 0..100 {
            fast.observe(shape(i), 0.5 * cost(shape(i)));
        }
        assert!(fast.margin() >= 1.0);
    }

    #[test]
    fn first_token_goes_through_the_queue_in_budget_sized_steps() {
        let m = CostModel::new([0.01, 0.001, 0.002, 0.0]);
        // 1000 tokens ahead and 500 own, 250 per step beside 6 decodes at budget 256.
        let t = predict_first_token(&m, 1000, 500, 256, 6, 0);
        assert!((t - 6.0 * (0.01 + 0.25 + 0.012)).abs() < 1e-9, "{t}");
        assert_eq!(predict_first_token(&m, 0, 0, 256, 0, 0), 0.0);
    }
}
