//! Scenario tests of the pure scheduler: refusals, prefix reuse and chunking, preemption order,
//! speculative proposals, tenants' weighted shares and the `slo` policy's deadlines, each on a
//! hand-built case whose expected schedule is stated (the random ones are in `properties.rs`).
#![allow(clippy::unwrap_used)]

use ferrum_scheduler::{Scheduler, SchedulerConfig, SchedulingPolicy};
use ferrum_types::{ForwardBatch, RequestId, SplitMix64, TokenId};
use std::collections::HashMap;

#[test]
fn a_prompt_that_can_never_fit_is_refused() {
    let cfg = SchedulerConfig {
        num_blocks: 4,
        block_size: 4,
        max_num_batched_tokens: 64,
        max_num_seqs: 4,
        enable_prefix_caching: true,
        policy: Default::default(),
    };
    let mut s = Scheduler::new(cfg).unwrap();
    let err = s.add(1, &[7; 16], 0).unwrap_err().to_string();
    assert!(err.contains("holds at most 16 tokens"), "{err}");
    assert!(s.add(2, &[], 0).is_err());
    s.add(3, &[7; 15], 0).unwrap();
    assert!(s.add(3, &[7], 0).is_err(), "duplicate ids are refused");
}

#[test]
fn prefix_reuse_skips_cached_blocks_and_long_prompts_are_chunked() {
    let cfg = SchedulerConfig {
        num_blocks: 64,
        block_size: 4,
        max_num_batched_tokens: 8,
        max_num_seqs: 8,
        enable_prefix_caching: true,
        policy: Default::default(),
    };
    let mut s = Scheduler::new(cfg).unwrap();
    let prompt: Vec<TokenId> = (0..18).collect();
    s.add(1, &prompt, 0).unwrap();
    // 18 tokens in chunks of 8, 8, 2 while nothing else runs.
    let mut starts = Vec::new();
    loop {
        let out = s.schedule();
        let x = &out.seqs[0];
        starts.push((x.start, x.num_tokens, x.samples));
        let sample: Vec<_> = if x.samples { vec![(1, 99)] } else { vec![] };
        s.update(&out, &sample);
        if x.samples {
            break;
        }
    }
    assert_eq!(starts, vec![(0, 8, false), (8, 8, false), (16, 2, true)]);
    // A second prompt sharing the first 16 tokens reuses 4 full blocks.
    let mut p2: Vec<TokenId> = (0..16).collect();
    p2.extend([50, 51, 52]);
    s.add(2, &p2, 0).unwrap();
    let out = s.schedule();
    let x = out.seqs.iter().find(|x| x.id == 2).unwrap();
    assert_eq!((x.start, x.num_tokens), (16, 3));
    assert_eq!(s.stats().prefix_hits, 16);
    // Decodes go first: sequence 1 decodes in the same step.
    assert_eq!(out.seqs[0].id, 1);
    assert_eq!(out.seqs[0].num_tokens, 1);
}

#[test]
fn preemption_evicts_the_lowest_priority_latest_admitted() {
    let cfg = SchedulerConfig {
        num_blocks: 4,
        block_size: 2,
        max_num_batched_tokens: 64,
        max_num_seqs: 4,
        enable_prefix_caching: false,
        policy: Default::default(),
    };
    let mut s = Scheduler::new(cfg).unwrap();
    s.add(1, &[1, 2, 3], 0).unwrap();
    s.add(2, &[4, 5, 6], 0).unwrap();
    let out = s.schedule();
    assert_eq!(out.seqs.len(), 2);
    s.update(&out, &[(1, 9), (2, 9)]);
    // Both now hold 4 tokens in 2 blocks each; the pool is empty. Sequence 1 needs a third
    // block for its fifth token: sequence 2 (admitted last) is preempted.
    let out = s.schedule();
    s.update(&out, &[(1, 9)]);
    let out = s.schedule();
    assert_eq!(out.preempted, vec![2]);
    assert_eq!(out.seqs.iter().map(|x| x.id).collect::<Vec<_>>(), vec![1]);
    assert_eq!(s.stats().preemptions, 1);
    assert_eq!(s.num_waiting(), 1);
}

#[test]
fn proposals_are_verified_in_one_run_and_rejected_ones_roll_back() {
    let cfg = SchedulerConfig {
        num_blocks: 8,
        block_size: 4,
        max_num_batched_tokens: 64,
        max_num_seqs: 4,
        enable_prefix_caching: true,
        policy: Default::default(),
    };
    let mut s = Scheduler::new(cfg).unwrap();
    s.add(1, &[1, 2, 3, 4, 5, 6], 0).unwrap();
    let out = s.schedule();
    s.update(&out, &[(1, 7)]);
    // Seven final tokens, six computed: propose four more (positions 7..=10).
    assert_eq!(s.propose(1, &[8, 9, 10, 11]).unwrap(), 4);
    assert_eq!(s.tokens(1).unwrap().len(), 7, "proposals are not final");
    let out = s.schedule();
    let x = &out.seqs[0];
    assert_eq!((x.start, x.num_tokens, x.num_proposed), (6, 5, 4));
    assert_eq!(x.num_logits(), 5);
    let mut batch = ForwardBatch::new();
    s.fill_batch(&out, &mut batch).unwrap();
    assert_eq!(batch.token_ids, vec![7, 8, 9, 10, 11]);
    assert_eq!(batch.logits_indices, vec![0, 1, 2, 3, 4]);
    assert_eq!(s.block_table(1).unwrap().len(), 3, "room for 11 tokens");
    // The model agrees with 8 and 9, then samples 20 instead of 10.
    s.update(&out, &[(1, 8), (1, 9), (1, 20)]);
    assert_eq!(s.tokens(1).unwrap(), &[1, 2, 3, 4, 5, 6, 7, 8, 9, 20]);
    assert_eq!(s.num_computed(1), Some(9), "positions 9 and 10 rolled back");
    assert_eq!(s.block_table(1).unwrap().len(), 3);
    // Only the first two blocks (8 final, computed tokens) are in the prefix cache.
    assert_eq!(s.stats().blocks_cached, 2);
    s.check().unwrap();
    // A rejection of everything frees the block that only proposals used.
    assert_eq!(s.propose(1, &[30, 31, 32]).unwrap(), 3);
    let out = s.schedule();
    assert_eq!(s.block_table(1).unwrap().len(), 4);
    s.update(&out, &[(1, 40)]);
    assert_eq!(s.num_computed(1), Some(10));
    assert_eq!(s.block_table(1).unwrap().len(), 3);
    s.check().unwrap();
    s.remove(1);
    assert_eq!(s.pool().num_free(), 8);
    assert!(s.propose(1, &[1]).is_err(), "an unknown sequence");
}

#[test]
fn proposals_never_cost_a_preemption() {
    let cfg = SchedulerConfig {
        num_blocks: 3,
        block_size: 4,
        max_num_batched_tokens: 64,
        max_num_seqs: 4,
        enable_prefix_caching: false,
        policy: Default::default(),
    };
    let mut s = Scheduler::new(cfg).unwrap();
    s.add(1, &[1, 2, 3, 4, 5, 6], 0).unwrap();
    s.add(2, &[1, 2, 3], 0).unwrap();
    let out = s.schedule();
    s.update(&out, &[(1, 7), (2, 7)]);
    // Sequence 1 holds two blocks (7 tokens), sequence 2 the third (4 tokens): room for each
    // one's next token, not for four proposals of sequence 1.
    assert_eq!(s.propose(1, &[8, 9, 10, 11]).unwrap(), 4);
    let out = s.schedule();
    assert!(out.preempted.is_empty(), "{out:?}");
    let x = &out.seqs[0];
    assert_eq!(
        (x.id, x.start, x.num_tokens, x.num_proposed, x.samples),
        (1, 6, 1, 0, true)
    );
    s.update(&out, &[(1, 8), (2, 9)]);
    assert_eq!(s.num_computed(1), Some(7));
    s.check().unwrap();
}

/// Two tenants weighted 3:1, both with more requests than the engine runs at once: the
/// tokens computed for each follow the weights (within 10%) for as long as both wait; a tenant
/// alone gets every running slot.
#[test]
fn weighted_tenants_share_the_engine_by_their_weights() {
    let cfg = SchedulerConfig {
        num_blocks: 256,
        block_size: 4,
        max_num_batched_tokens: 48,
        max_num_seqs: 4,
        enable_prefix_caching: false,
        policy: SchedulingPolicy::Fair(vec![(1, 3), (2, 1)]),
    };
    let mut s = Scheduler::new(cfg).unwrap();
    let mut next = 0;
    let mut owner: HashMap<RequestId, u32> = HashMap::new();
    let mut add = |s: &mut Scheduler, t: u32, next: &mut RequestId| {
        let prompt: Vec<TokenId> = (0..12).map(|j| j + 1000 * *next as TokenId).collect();
        s.add_for(*next, &prompt, 0, t).unwrap();
        owner.insert(*next, t);
        *next += 1;
    };
    for _ in 0..60 {
        add(&mut s, 1, &mut next);
        add(&mut s, 2, &mut next);
    }
    let mut computed = [0usize; 3];
    let mut outputs: HashMap<RequestId, usize> = HashMap::new();
    let mut batch = ForwardBatch::new();
    for _ in 0..400 {
        let waiting = |t: u32| {
            owner
                .iter()
                .any(|(id, &o)| o == t && s.num_computed(*id) == Some(0) && s.tokens(*id).is_some())
        };
        if !(waiting(1) && waiting(2)) {
            break;
        }
        let out = s.schedule();
        s.fill_batch(&out, &mut batch).unwrap();
        let mut samples = Vec::new();
        let mut finished = Vec::new();
        for x in &out.seqs {
            computed[owner[&x.id] as usize] += x.num_tokens;
            if x.samples {
                let n = outputs.entry(x.id).or_insert(0);
                *n += 1;
                samples.push((x.id, 7));
                if *n == 12 {
                    finished.push(x.id);
                }
            }
        }
        s.update(&out, &samples);
        for id in finished {
            s.remove(id);
            owner.remove(&id);
        }
    }
    let ratio = computed[1] as f64 / computed[2] as f64;
    assert!(
        (2.7..=3.3).contains(&ratio),
        "tenants computed {} and {} tokens: {ratio:.2}, not 3:1",
        computed[1],
        computed[2]
    );
    // Alone, a tenant fills every running slot.
    let mut s = Scheduler::new(SchedulerConfig {
        num_blocks: 256,
        block_size: 4,
        max_num_batched_tokens: 48,
        max_num_seqs: 4,
        enable_prefix_caching: false,
        policy: SchedulingPolicy::Fair(vec![(1, 3), (2, 1)]),
    })
    .unwrap();
    for i in 0..8 {
        s.add_for(i, &[1, 2, 3], 0, 2).unwrap();
    }
    s.schedule();
    assert_eq!(s.num_running(), 4);
}

/// Equal requests, one at a time (each a one-step prefill then decodes), with first-token
/// deadlines on a simulated clock of steps: whenever some order meets every deadline (checked
/// by trying them all), the `slo` policy's order meets them.
#[test]
fn the_slo_policy_meets_every_deadline_some_order_meets() {
    const LEN: usize = 4; // steps per request: its prefill (first token), then 3 decodes
    let mut rng = SplitMix64::new(11);
    let mut feasible_cases = 0;
    for _ in 0..300 {
        let n = 2 + (rng.next_u64() % 3) as usize;
        let deadlines: Vec<u64> = (0..n)
            .map(|_| 1 + rng.next_u64() % (LEN * n) as u64)
            .collect();
        // Feasible: some order gives the k-th request its first token at step k*LEN + 1.
        let mut order: Vec<usize> = (0..n).collect();
        let mut feasible = false;
        permute(&mut order, 0, &mut |o| {
            feasible |= o
                .iter()
                .enumerate()
                .all(|(k, &r)| (k * LEN + 1) as u64 <= deadlines[r]);
        });
        if !feasible {
            continue;
        }
        feasible_cases += 1;
        let mut s = Scheduler::new(SchedulerConfig {
            num_blocks: 64,
            block_size: 4,
            max_num_batched_tokens: 64,
            max_num_seqs: 1,
            enable_prefix_caching: false,
            policy: SchedulingPolicy::Slo,
        })
        .unwrap();
        for (i, &d) in deadlines.iter().enumerate() {
            let prompt: Vec<TokenId> = (0..6).map(|j| 100 * i as TokenId + j).collect();
            // The prefill takes one step: the latest start is a step before the deadline.
            s.add_with(i as RequestId, &prompt, 0, 0, d - 1).unwrap();
        }
        let mut batch = ForwardBatch::new();
        let mut outs: HashMap<RequestId, usize> = HashMap::new();
        for step in 1..=(n * LEN) as u64 {
            let out = s.schedule();
            s.fill_batch(&out, &mut batch).unwrap();
            let mut samples = Vec::new();
            let mut done = Vec::new();
            for x in out.seqs.iter().filter(|x| x.samples) {
                let c = outs.entry(x.id).or_insert(0);
                if *c == 0 {
                    assert!(
                        step <= deadlines[x.id as usize],
                        "request {} got its first token at step {step}, deadline {} ({deadlines:?})",
                        x.id,
                        deadlines[x.id as usize]
                    );
                }
                *c += 1;
                samples.push((x.id, 1));
                if *c == LEN {
                    done.push(x.id);
                }
            }
            s.update(&out, &samples);
            for id in done {
                s.remove(id);
            }
        }
        assert!(!s.has_unfinished());
    }
    assert!(feasible_cases > 50, "{feasible_cases}");
}

fn permute(v: &mut Vec<usize>, k: usize, f: &mut impl FnMut(&[usize])) {
    if k == v.len() {
        f(v);
        return;
    }
    for i in k..v.len() {
        v.swap(k, i);
        permute(v, k + 1, f);
        v.swap(k, i);
    }
}
