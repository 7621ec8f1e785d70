//! Time-per-output-token targets on a simulated clock: with a known step cost, every step
//! whose decodes carry a target (or planned under a step limit) is predicted within the
//! tightest one unless its decodes alone (with one block of prefill) already exceed it;
//! prefills still progress, so every request finishes; without targets or a limit the plan is
//! the plain one. And the pending prefill work by
//! priority that first-token predictions read.
#![allow(clippy::unwrap_used)]

use ferrum_scheduler::{CostModel, Scheduler, SchedulerConfig, SchedulingPolicy};
use ferrum_types::{ForwardBatch, RequestId, TokenId};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Req {
    arrive_at: usize,
    prompt: usize,
    max_out: usize,
    /// Milliseconds.
    tpot: Option<u32>,
}

fn req() -> impl Strategy<Value = Req> {
    (
        0..30usize,
        2..300usize,
        1..24usize,
        prop::option::weighted(0.6, 5..60u32),
    )
        .prop_map(|(arrive_at, prompt, max_out, tpot)| Req {
            arrive_at,
            prompt,
            max_out,
            tpot,
        })
}

/// Seconds a step costs: 4 ms, 0.2 ms a prefill token, 1 ms a decode row, 2 us a KV block.
const COST: [f64; 4] = [0.004, 0.0002, 0.001, 0.000002];

/// Each step's plan: (sequence, tokens) of its runs.
type Plans = Vec<Vec<(RequestId, usize)>>;

/// Runs `reqs` to the end, checking each step against its decodes' targets and the step
/// limit (seconds); returns the steps taken and each step's plan.
fn simulate(
    cfg: &SchedulerConfig,
    reqs: &[Req],
    cost: Option<&CostModel>,
    targets: bool,
    limit: Option<f64>,
) -> Result<(usize, Plans), TestCaseError> {
    let mut s = Scheduler::new(cfg.clone()).unwrap();
    s.set_step_limit(limit).unwrap();
    let mut outs: Vec<Vec<TokenId>> = vec![Vec::new(); reqs.len()];
    let mut arrived = vec![false; reqs.len()];
    let mut seen = vec![false; reqs.len()];
    let mut batch = ForwardBatch::new();
    let mut plans = Vec::new();
    for step in 0..20_000 {
        for (i, r) in reqs.iter().enumerate() {
            if r.arrive_at == step && !arrived[i] {
                arrived[i] = true;
                let prompt: Vec<TokenId> = (0..r.prompt).map(|j| (i * 31 + j) as TokenId).collect();
                s.add(i as RequestId, &prompt, 0).unwrap();
                if let (Some(ms), true) = (r.tpot, targets) {
                    s.set_tpot(i as RequestId, ms as f64 / 1e3).unwrap();
                }
            }
        }
        if step > 30 && !s.has_unfinished() {
            return Ok((step, plans));
        }
        let out = s.schedule_with(cost);
        plans.push(out.seqs.iter().map(|x| (x.id, x.num_tokens)).collect());
        // The decodes: one-token runs of sequences scheduled before (admissions come after
        // the cap).
        let decodes: Vec<_> = out
            .seqs
            .iter()
            .filter(|x| x.num_tokens == 1 && x.samples && seen[x.id as usize])
            .collect();
        let prefill: usize = out.seqs.iter().map(|x| x.num_tokens).sum::<usize>() - decodes.len();
        let tightest = decodes
            .iter()
            .filter_map(|x| reqs[x.id as usize].tpot.filter(|_| targets))
            .map(|ms| ms as f64 / 1e3)
            .reduce(f64::min);
        match (cost, tightest.is_some() || limit.is_some()) {
            (Some(c), true) => {
                let cap = out.prefill_cap;
                prop_assert!(cap.is_some_and(|c| prefill <= c), "{prefill} over {cap:?}");
                let kv: usize = decodes
                    .iter()
                    .map(|x| s.block_table(x.id).unwrap().len())
                    .sum();
                let predicted = COST[0]
                    + COST[1] * prefill as f64
                    + COST[2] * decodes.len() as f64
                    + COST[3] * kv as f64;
                let small = prefill <= cfg.block_size;
                if let Some(t) = tightest {
                    prop_assert!(
                        predicted <= t + 1e-12 || small,
                        "step {}: predicted {} s over the target {} s with {} prefill tokens",
                        step,
                        predicted,
                        t,
                        prefill
                    );
                }
                if let Some(l) = limit {
                    // Over the limit only with decodes that leave less than half of it, and
                    // then a prefill of at most half of it.
                    let half = c.margin() * COST[1] * prefill as f64 <= l / 2.0 + 1e-12;
                    prop_assert!(
                        predicted <= l + 1e-12 || small || half,
                        "step {}: predicted {} s over the limit {} s with {} prefill tokens",
                        step,
                        predicted,
                        l,
                        prefill
                    );
                }
            }
            _ => prop_assert!(out.prefill_cap.is_none()),
        }
        for x in &out.seqs {
            seen[x.id as usize] = true;
        }
        s.fill_batch(&out, &mut batch).unwrap();
        let mut samples = Vec::new();
        for x in &out.seqs {
            if x.samples {
                samples.push((x.id, 7 as TokenId));
            }
        }
        s.update(&out, &samples);
        for &(id, _) in &samples {
            let i = id as usize;
            outs[i].push(7);
            if outs[i].len() == reqs[i].max_out {
                s.remove(id);
            }
        }
        s.check().map_err(TestCaseError::fail)?;
    }
    Err(TestCaseError::fail("the requests never finished"))
}

fn config() -> impl Strategy<Value = SchedulerConfig> {
    (
        prop::sample::select(vec![4usize, 16]),
        prop::sample::select(vec![64usize, 256, 1024]),
        1..8usize,
    )
        .prop_map(|(bs, budget, seqs)| SchedulerConfig {
            num_blocks: 400usize.div_ceil(bs) * 3,
            block_size: bs,
            max_num_batched_tokens: budget,
            max_num_seqs: seqs,
            enable_prefix_caching: false,
            policy: SchedulingPolicy::Priority,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn steps_keep_to_the_tightest_target_and_everything_finishes(
        cfg in config(),
        reqs in prop::collection::vec(req(), 1..16),
    ) {
        let cost = CostModel::new(COST);
        simulate(&cfg, &reqs, Some(&cost), true, None)?;
    }

    #[test]
    fn steps_keep_to_the_step_limit_and_everything_finishes(
        cfg in config(),
        reqs in prop::collection::vec(req(), 1..16),
        limit_ms in 1..40u32,
        targets in any::<bool>(),
    ) {
        let cost = CostModel::new(COST);
        simulate(&cfg, &reqs, Some(&cost), targets, Some(limit_ms as f64 / 1e3))?;
    }

    #[test]
    fn without_targets_the_plan_is_the_plain_one(
        cfg in config(),
        reqs in prop::collection::vec(req(), 1..16),
    ) {
        let cost = CostModel::new(COST);
        let (_, with_cost) = simulate(&cfg, &reqs, Some(&cost), false, None)?;
        let (_, plain) = simulate(&cfg, &reqs, None, false, None)?;
        prop_assert_eq!(with_cost, plain);
    }
}

/// A long prompt arriving beside a decode with a 10 ms target: its prefill goes in chunks the
/// target allows (with the cost above, 4 ms + 1 ms for the decode leaves 25 tokens), and the
/// decode's steps stay within it; without the target the prompt takes the whole budget.
#[test]
fn a_long_prompt_is_chunked_to_keep_a_decode_within_its_target() {
    let cost = CostModel::new(COST);
    for target in [Some(0.010), None] {
        let mut s = sized(200, 512, SchedulingPolicy::Priority);
        s.add(0, &[1, 2, 3], 0).unwrap();
        if let Some(t) = target {
            s.set_tpot(0, t).unwrap();
        }
        let out = s.schedule_with(Some(&cost));
        s.update(&out, &[(0, 9)]);
        s.add(1, &(0..400).collect::<Vec<TokenId>>(), 0).unwrap();
        let out = s.schedule_with(Some(&cost));
        let chunk = out.seqs.iter().find(|x| x.id == 1).unwrap().num_tokens;
        match target {
            Some(t) => {
                assert_eq!(out.prefill_cap, Some(chunk));
                assert!((4..30).contains(&chunk), "{chunk}");
                assert!(
                    cost.predict(s.step_shape(&out)) <= t,
                    "{:?}",
                    s.step_shape(&out)
                );
            }
            None => assert_eq!((chunk, out.prefill_cap), (400, None)),
        }
    }
    let mut s = sized(200, 512, SchedulingPolicy::Priority);
    s.add(0, &[1], 0).unwrap();
    assert!(s.set_tpot(0, 0.0).is_err() && s.set_tpot(0, f64::NAN).is_err());
    assert!(s.set_tpot(5, 0.01).is_err(), "an unknown sequence");
}

/// A step limit caps a prompt's chunks with no decode running (4 ms a step, 0.2 ms a token,
/// planned at 1.1x for the cost model's prior error: 20 ms leaves 70 tokens), and is lifted
/// again; a limit that is not a positive time is refused.
#[test]
fn a_step_limit_caps_prefill_chunks() {
    let cost = CostModel::new(COST);
    let mut s = sized(200, 512, SchedulingPolicy::Slo);
    s.add(0, &(0..400).collect::<Vec<TokenId>>(), 1).unwrap();
    s.set_step_limit(Some(0.020)).unwrap();
    assert_eq!(s.step_limit(), Some(0.020));
    // Without a cost model the limit cannot be turned into tokens: the plain plan.
    assert_eq!(s.clone().schedule().seqs[0].num_tokens, 400);
    let out = s.schedule_with(Some(&cost));
    assert_eq!(out.prefill_cap, Some(70));
    assert_eq!(out.seqs[0].num_tokens, 70);
    assert!(cost.predict(s.step_shape(&out)) <= 0.020);
    s.update(&out, &[]);
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert!(s.set_step_limit(Some(bad)).is_err(), "{bad}");
    }
    assert_eq!(
        s.step_limit(),
        Some(0.020),
        "a refused limit changes nothing"
    );
    s.set_step_limit(None).unwrap();
    let out = s.schedule_with(Some(&cost));
    assert_eq!((out.seqs[0].num_tokens, out.prefill_cap), (330, None));
    s.check().unwrap();
}

/// What first-token predictions see: pending prefill by priority, running work under its own
/// (a running prefill of a worse priority yields to a better waiting one).
#[test]
fn pending_prefill_is_reported_by_priority() {
    let cfg = SchedulerConfig {
        num_blocks: 100,
        block_size: 4,
        max_num_batched_tokens: 10,
        max_num_seqs: 1,
        enable_prefix_caching: false,
        policy: SchedulingPolicy::Priority,
    };
    let mut s = Scheduler::new(cfg).unwrap();
    s.add(0, &[1; 30], 1).unwrap();
    let out = s.schedule();
    s.update(&out, &[]);
    s.add(1, &[2; 20], 0).unwrap();
    s.add(2, &[3; 8], 2).unwrap();
    s.add(3, &[4; 5], 0).unwrap();
    // Running at priority 1: 30 - 10 computed - 1; waiting: priority 0: 19 + 4, priority 2: 7.
    assert_eq!(
        s.pending_prefill_by_priority(),
        vec![(0, 23), (1, 19), (2, 7)]
    );
    assert_eq!(s.pending_prefill_tokens(), 49);
}

/// A scheduler of `num_blocks` blocks of 4, `budget` tokens a step and 4 sequences, under
/// `policy`.
fn sized(num_blocks: usize, budget: usize, policy: SchedulingPolicy) -> Scheduler {
    Scheduler::new(SchedulerConfig {
        num_blocks,
        block_size: 4,
        max_num_batched_tokens: budget,
        max_num_seqs: 4,
        enable_prefix_caching: false,
        policy,
    })
    .unwrap()
}

/// Under a priority-first policy a waiting prompt of a better priority takes the step's prefill
/// budget before a running prefill of a worse one continues (one of the same priority waits
/// behind it), and once admitted with a first chunk it continues before that prefill too
/// (running prefills go by priority, not admission); under fifo the running prefill always
/// goes first.
#[test]
fn better_priorities_prefill_first() {
    let runs = |out: &ferrum_scheduler::SchedulerOutput| -> Vec<(RequestId, usize)> {
        out.seqs.iter().map(|q| (q.id, q.num_tokens)).collect()
    };
    for policy in [
        SchedulingPolicy::Priority,
        SchedulingPolicy::Slo,
        SchedulingPolicy::Fifo,
    ] {
        let fifo = policy == SchedulingPolicy::Fifo;
        let mut s = sized(100, 8, policy.clone());
        s.add(0, &[1; 40], 1).unwrap();
        let out = s.schedule();
        s.update(&out, &[]);
        // A prompt of the same priority and one of a better one arrive while 0 prefills.
        s.add(1, &[2; 6], 1).unwrap();
        s.add(2, &[3; 14], 0).unwrap();
        let out = s.schedule();
        let want = if fifo { vec![(0, 8)] } else { vec![(2, 8)] };
        assert_eq!(runs(&out), want, "{policy:?}");
        s.update(&out, &[]);
        // 2, running behind 0 in admission order, still goes first; then 0 takes the rest.
        let out = s.schedule();
        let want = if fifo {
            vec![(0, 8)]
        } else {
            vec![(2, 6), (0, 2)]
        };
        assert_eq!(runs(&out), want, "{policy:?}");
        s.update(&out, &[(2, 9)]);
        s.check().unwrap();
    }
}
