//! The step limit under `--scheduling slo`: how long one step may be planned, so a prompt with
//! a first-token deadline that arrives while a step runs does not wait for a long one.
//!
//! A step cannot be interrupted: a request arriving during it waits for the rest of it before
//! its own prefill can start. Without a limit, a step of prefill for requests without targets
//! takes the whole token budget (2048 tokens are seconds on a CPU), and an interactive prompt
//! arriving meanwhile misses a one-second target before it is even looked at. So the engine
//! keeps the first-token targets of the requests that arrived in the last [`IN_PLAY`], and
//! plans each step to at most [`STEP_SHARE`] of the tightest one
//! ([`ferrum_scheduler::Scheduler::set_step_limit`]; the scheduler turns it into a prefill cap
//! with the step cost model, as it does for a TPOT target). Work without targets is then
//! prefilled in shorter chunks (their fixed cost is the price: a few percent of throughput on
//! a CPU, `docs/benchmarks.md`); with no target seen for [`IN_PLAY`], steps are unlimited again.
//!
//! Invariants: the limit is never below [`MIN_STEPS_FIXED_COST`] times the step's fixed cost
//! (a client's tiny target cannot make the engine run steps that are mostly overhead) nor
//! [`MIN_LIMIT`]; a best-effort request whose target admission predicted lost does not count
//! (before the cost model is trusted nothing is predicted, and every target counts); the
//! window's minimum is kept in a monotonic queue (targets strictly increasing from the front),
//! so it holds at most one entry per distinct target seen in the window.

use ferrum_scheduler::{CostModel, Scheduler};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Share of the tightest first-token target in play that one step may last: a request waits
/// at most this for the step in flight, leaving the rest for the work ahead of it and its own.
pub(crate) const STEP_SHARE: f64 = 0.25;

/// The least limit, whatever the targets and the fitted cost.
pub(crate) const MIN_LIMIT: f64 = 0.001;

/// How long a first-token target stays in play after the last request that carried it.
pub(crate) const IN_PLAY: Duration = Duration::from_secs(60);

/// The limit is at least this many times the step's fixed cost (the cost model's per-step
/// term): steps shorter than that would be mostly overhead.
pub(crate) const MIN_STEPS_FIXED_COST: f64 = 4.0;

/// The first-token targets in play and the step limit they set; see the module docs.
#[derive(Debug, Default, Clone)]
pub(crate) struct StepLimit {
    /// (when seen, target), oldest first, targets strictly increasing: the front is the
    /// tightest target seen in the window (a target seen after a tighter one outlives it, so
    /// only later, looser ones need be kept behind it).
    window: VecDeque<(Instant, Duration)>,
}

impl StepLimit {
    /// A request with first-token target `ttft` arrived at `now` (calls in time order).
    fn observe(&mut self, ttft: Duration, now: Instant) {
        while self.window.back().is_some_and(|&(_, t)| t >= ttft) {
            self.window.pop_back();
        }
        self.window.push_back((now, ttft));
    }

    /// A request was admitted: its first-token target, if it has one, is in play unless
    /// admission already predicted it lost (`predicted`: admission's (prediction, target)
    /// seconds, for a best-effort request that may exceed the target).
    pub(crate) fn observe_request(
        &mut self,
        slo: Option<crate::request::Slo>,
        predicted: Option<(f64, f64)>,
        now: Instant,
    ) {
        let Some(ttft) = slo.and_then(|s| s.ttft) else {
            return;
        };
        if predicted.is_none_or(|(p, t)| p <= t) {
            self.observe(ttft, now);
        }
    }

    /// The tightest target seen within [`IN_PLAY`] of `now`, if any.
    fn tightest(&mut self, now: Instant) -> Option<Duration> {
        while self
            .window
            .front()
            .is_some_and(|&(at, _)| now.saturating_duration_since(at) > IN_PLAY)
        {
            self.window.pop_front();
        }
        self.window.front().map(|&(_, t)| t)
    }

    /// The longest a step may be planned at `now`, in seconds: [`STEP_SHARE`] of the
    /// tightest target in play, at least [`MIN_STEPS_FIXED_COST`] times `cost`'s fixed term and
    /// [`MIN_LIMIT`]; `None` with no target in play.
    pub(crate) fn limit(&mut self, now: Instant, cost: &CostModel) -> Option<f64> {
        let t = self.tightest(now)?;
        let floor = MIN_STEPS_FIXED_COST * cost.coefficients()[0];
        Some((t.as_secs_f64() * STEP_SHARE).max(floor).max(MIN_LIMIT))
    }

    /// Sets the scheduler's step limit for the step planned at `now`.
    pub(crate) fn apply(
        &mut self,
        sched: &mut Scheduler,
        now: Instant,
        cost: &CostModel,
    ) -> crate::Result<()> {
        // Finite and at least `MIN_LIMIT` unless the fitted fixed cost is not finite.
        let limit = self.limit(now, cost).filter(|l| l.is_finite());
        sched
            .set_step_limit(limit)
            .map_err(|e| crate::EngineError::Internal(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The limit follows the tightest target seen within the window, forgets it after
    /// [`IN_PLAY`] (a looser one seen later then rules), and never goes below the floor.
    #[test]
    fn the_limit_follows_the_tightest_target_in_play() {
        let cost = CostModel::new([0.02, 0.002, 0.0005, 0.0]);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = StepLimit::default();
        assert_eq!(s.limit(t0, &cost), None);
        s.observe(ms(2000), t0);
        s.observe(ms(1000), t0 + ms(10));
        s.observe(ms(4000), t0 + ms(20));
        s.observe(ms(1000), t0 + ms(30_000));
        let at = |s: &mut StepLimit, after: u64| s.limit(t0 + ms(after), &cost);
        assert_eq!(at(&mut s, 100), Some(0.25));
        // The first 1000 ms target has left the window; the second (seen at 30 s) has not.
        assert_eq!(at(&mut s, 61_000), Some(0.25));
        // Both 1000s gone: the 4000 seen at 20 ms is gone too, nothing left.
        assert_eq!(at(&mut s, 90_100), None);
        assert!(s.window.is_empty());
        // A looser target seen after a tighter one rules once the tighter one has gone.
        s.observe(ms(500), t0 + ms(100_000));
        s.observe(ms(3000), t0 + ms(150_000));
        assert_eq!(at(&mut s, 150_001), Some(0.125));
        assert_eq!(at(&mut s, 161_000), Some(0.75));
        assert_eq!(s.window.len(), 1);
        // A tiny target: the limit stays at four steps' fixed cost, and at `MIN_LIMIT` when
        // the fit gives no fixed cost.
        s.observe(ms(1), t0 + ms(170_000));
        assert_eq!(at(&mut s, 170_001), Some(0.08));
        let free = CostModel::new([0.0, 0.002, 0.0005, 0.0]);
        assert_eq!(s.limit(t0 + ms(170_001), &free), Some(MIN_LIMIT));
    }

    /// Many arrivals of one target keep one entry; of a run of looser ones after it, only
    /// the last stays.
    #[test]
    fn the_window_holds_one_entry_per_distinct_target_at_most() {
        let t0 = Instant::now();
        let mut s = StepLimit::default();
        for i in 0..10_000u64 {
            s.observe(Duration::from_millis(1000), t0 + Duration::from_millis(i));
        }
        assert_eq!(s.window.len(), 1);
        // Looser ones after it: only the last of a decreasing run stays behind it.
        for i in 0..100u64 {
            s.observe(
                Duration::from_millis(2000 - i),
                t0 + Duration::from_secs(20),
            );
        }
        assert_eq!(s.window.len(), 2);
    }
}
