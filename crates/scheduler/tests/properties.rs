//! Property tests of the pure scheduler: random arrivals, prompt lengths (with shared prefixes),
//! output lengths, priorities, aborts, tiny block pools and token budgets. A simulated KV
//! cache records which (token, position) every slot holds, so each step also proves that a
//! sequence's computed prefix (reused blocks included) holds exactly its own tokens.
#![allow(clippy::unwrap_used)]

use ferrum_scheduler::{BlockHash, Scheduler, SchedulerConfig, SchedulingPolicy, TierIndex};
use ferrum_types::{ForwardBatch, RequestId, SplitMix64, TokenId};
use proptest::prelude::*;
use std::collections::HashMap;

#[derive(Debug, Clone)]
struct Req {
    arrive_at: usize,
    prefix: usize,
    tail: Vec<TokenId>,
    max_out: usize,
    priority: i32,
    abort_at: Option<usize>,
}

fn req() -> impl Strategy<Value = Req> {
    (
        0..40usize,
        0..24usize,
        prop::collection::vec(0..50u32, 1..16),
        1..16usize,
        0..2i32,
        prop::option::weighted(0.15, 0..60usize),
    )
        .prop_map(
            |(arrive_at, prefix, tail, max_out, priority, abort_at)| Req {
                arrive_at,
                prefix,
                tail,
                max_out,
                priority,
                abort_at,
            },
        )
}

fn config() -> impl Strategy<Value = SchedulerConfig> {
    (
        prop::sample::select(vec![1usize, 2, 4, 8]),
        0..12usize,
        1..48usize,
        1..6usize,
        any::<bool>(),
        prop::sample::select(vec![
            SchedulingPolicy::Priority,
            SchedulingPolicy::Fifo,
            SchedulingPolicy::Fair(vec![(1, 3), (2, 1)]),
            SchedulingPolicy::Slo,
        ]),
    )
        .prop_map(|(bs, extra, budget, seqs, cache, policy)| SchedulerConfig {
            // The longest sequence (39 prompt + 15 output tokens) must fit alone.
            num_blocks: 54usize.div_ceil(bs) + extra,
            block_size: bs,
            max_num_batched_tokens: budget,
            max_num_seqs: seqs,
            enable_prefix_caching: cache,
            policy,
        })
}

/// The simulated requests' tenants: three, by id.
fn tenant(id: RequestId) -> u32 {
    (id % 3) as u32
}

/// The simulated requests' latest starts (the `slo` policy's order): a few values, by id.
fn latest_start(id: RequestId) -> u64 {
    id * 37 % 11
}

/// Token a simulated model samples: depends only on the sequence and position.
fn sampled(id: RequestId, pos: usize) -> TokenId {
    ((id as usize * 31 + pos * 7) % 1000) as TokenId + 100
}

/// Speculative decoding in the simulation: before each step every unfinished sequence gets
/// up to `max_proposals` proposed tokens, each right (what the model will sample there) with
/// probability `hit_rate`, from a generator seeded with `seed`.
#[derive(Debug, Clone, Copy)]
struct Speculation {
    max_proposals: usize,
    hit_rate: f64,
    seed: u64,
}

fn speculation() -> impl Strategy<Value = Option<Speculation>> {
    prop::option::of((1..5usize, 0.0..1.0f64, any::<u64>()).prop_map(
        |(max_proposals, hit_rate, seed)| Speculation {
            max_proposals,
            hit_rate,
            seed,
        },
    ))
}

/// Adds the requests that arrive at `step`.
fn arrive(
    s: &mut Scheduler,
    reqs: &[Req],
    step: usize,
    done: &mut HashMap<RequestId, bool>,
    prompt_len: &mut HashMap<RequestId, usize>,
) {
    for (i, r) in reqs.iter().enumerate().filter(|(_, r)| r.arrive_at == step) {
        let mut prompt: Vec<TokenId> = (1..=r.prefix as TokenId).collect();
        prompt.extend(&r.tail);
        let id = i as RequestId;
        s.add_with(id, &prompt, r.priority, tenant(id), latest_start(id))
            .unwrap();
        done.insert(i as RequestId, false);
        prompt_len.insert(i as RequestId, prompt.len());
    }
}

/// The simulated model computes `x`'s run (its tokens `run`): every earlier position of the
/// sequence holds its own token's K/V, and the run writes only blocks no one else holds.
fn run_step(
    s: &Scheduler,
    kv: &mut [Option<(TokenId, usize)>],
    x: &ferrum_scheduler::ScheduledSeq,
    run: &[TokenId],
) -> Result<(), TestCaseError> {
    let bs = s.config().block_size;
    let toks = s.tokens(x.id).unwrap();
    let table = s.block_table(x.id).unwrap();
    for p in 0..x.start + x.num_tokens {
        let slot = table[p / bs] as usize * bs + p % bs;
        if p < x.start {
            prop_assert_eq!(
                kv[slot],
                Some((toks[p], p)),
                "seq {} pos {}: stale K/V",
                x.id,
                p
            );
        } else {
            prop_assert_eq!(
                s.pool().ref_count(table[p / bs]),
                1,
                "write into a shared block"
            );
            kv[slot] = Some((run[p - x.start], p));
        }
    }
    Ok(())
}

/// A simulated tier below the pool: the slots of the blocks it stores, and its index.
struct SimTier {
    index: TierIndex,
    blocks: HashMap<BlockHash, Vec<Option<(TokenId, usize)>>>,
}

fn simulate(
    cfg: SchedulerConfig,
    reqs: Vec<Req>,
    spec: Option<Speculation>,
    tier_blocks: Option<u64>,
) -> Result<(), TestCaseError> {
    let bs = cfg.block_size;
    let mut rng = SplitMix64::new(spec.map_or(0, |p| p.seed));
    let mut prompt_len: HashMap<RequestId, usize> = HashMap::new();
    let mut s = Scheduler::new(cfg.clone()).unwrap();
    let mut kv: Vec<Option<(TokenId, usize)>> = vec![None; cfg.num_blocks * bs];
    let mut out_count: HashMap<RequestId, usize> = HashMap::new();
    let mut done: HashMap<RequestId, bool> = HashMap::new();
    let mut admitted: Vec<RequestId> = Vec::new();
    let mut batch = ForwardBatch::new();
    let mut tier = tier_blocks.map(|n| SimTier {
        index: TierIndex::new(n),
        blocks: HashMap::new(),
    });
    s.set_report_stores(tier.is_some());
    let mut step = 0;
    while step < 5000 {
        arrive(&mut s, &reqs, step, &mut done, &mut prompt_len);
        if step > 40 && !s.has_unfinished() {
            break;
        }
        if let Some(p) = spec {
            for (&id, _) in done.iter().filter(|(_, &d)| !d) {
                let len = s.tokens(id).unwrap().len();
                let k = (rng.next_u64() % (p.max_proposals as u64 + 1)) as usize;
                let proposals: Vec<TokenId> = (0..k)
                    .map(|i| {
                        let hit = (rng.next_u64() % 1000) as f64 / 1000.0 < p.hit_rate;
                        if hit {
                            sampled(id, len + i)
                        } else {
                            7
                        }
                    })
                    .collect();
                let kept = s.propose(id, &proposals).unwrap();
                prop_assert!(kept <= k);
            }
        }
        let out = s.schedule();
        // Loads fill their blocks before the forward pass (which `run_step` checks reads
        // every computed position's own K/V).
        if let Some(t) = tier.as_mut() {
            for &(b, h) in &out.kv_loads {
                let data = t.blocks.get(&h);
                prop_assert!(data.is_some(), "a load names a block the tier holds");
                let b = b as usize;
                kv[b * bs..(b + 1) * bs].clone_from_slice(data.unwrap());
                t.index.touch(h);
            }
        } else {
            prop_assert!(out.kv_loads.is_empty());
        }
        prop_assert!(out.num_batched_tokens <= cfg.max_num_batched_tokens);
        prop_assert!(out.seqs.len() <= cfg.max_num_seqs);
        prop_assert!(s.num_running() <= cfg.max_num_seqs);
        prop_assert_eq!(
            out.num_batched_tokens,
            out.seqs.iter().map(|x| x.num_tokens).sum::<usize>()
        );
        s.check().map_err(TestCaseError::fail)?;
        s.fill_batch(&out, &mut batch).unwrap();
        prop_assert_eq!(batch.num_tokens(), out.num_batched_tokens);
        prop_assert_eq!(
            batch.logits_indices.len(),
            out.seqs.iter().map(|x| x.num_logits()).sum::<usize>()
        );
        let mut samples = Vec::new();
        let mut finishing = Vec::new();
        for (x, slice) in out.seqs.iter().zip(&batch.seqs) {
            prop_assert!(x.num_tokens > 0);
            prop_assert!(x.num_proposed == 0 || x.samples);
            if !admitted.contains(&x.id) {
                admitted.push(x.id);
            }
            let run = &batch.token_ids[slice.query_start..slice.query_start + slice.query_len];
            run_step(&s, &mut kv, x, run)?;
            if x.samples {
                // Accept proposals while they are what the model samples, then add its own.
                let final_end = x.start + x.num_tokens - x.num_proposed;
                let proposals = &run[x.num_tokens - x.num_proposed..];
                let mut new: Vec<TokenId> = Vec::new();
                for (i, &p) in proposals.iter().enumerate() {
                    if p != sampled(x.id, final_end + i) {
                        break;
                    }
                    new.push(p);
                }
                new.push(sampled(x.id, final_end + new.len()));
                let c = out_count.entry(x.id).or_insert(0);
                new.truncate(reqs[x.id as usize].max_out - *c);
                *c += new.len();
                if *c == reqs[x.id as usize].max_out {
                    finishing.push(x.id);
                }
                samples.extend(new.into_iter().map(|t| (x.id, t)));
            }
        }
        s.update(&out, &samples);
        // Newly cached blocks go down to the tier (which may evict others), and what it holds
        // is loadable.
        if let Some(t) = tier.as_mut() {
            for (b, h) in s.take_kv_stores() {
                let b = b as usize;
                let data = kv[b * bs..(b + 1) * bs].to_vec();
                prop_assert!(
                    data.iter().all(Option::is_some),
                    "a stored block is computed"
                );
                for evicted in t.index.insert(h, 1) {
                    t.blocks.remove(&evicted);
                    s.remove_loadable(evicted);
                }
                if t.index.contains(h) {
                    t.blocks.insert(h, data);
                    s.add_loadable(h);
                }
                t.index.check().map_err(TestCaseError::fail)?;
            }
        }
        for x in &out.seqs {
            let toks = s.tokens(x.id).unwrap();
            prop_assert!(s.num_computed(x.id).unwrap() < toks.len() || !x.samples);
            // The output is what the model samples, proposals or not.
            for (p, &t) in toks.iter().enumerate().skip(prompt_len[&x.id]) {
                prop_assert_eq!(t, sampled(x.id, p), "seq {} pos {}", x.id, p);
            }
        }
        s.check().map_err(TestCaseError::fail)?;
        for id in finishing {
            s.remove(id);
            done.insert(id, true);
        }
        for (i, r) in reqs.iter().enumerate() {
            if r.abort_at == Some(step) && done.get(&(i as RequestId)) == Some(&false) {
                s.remove(i as RequestId);
                s.remove(i as RequestId); // twice is harmless
                done.insert(i as RequestId, true);
            }
        }
        step += 1;
    }
    prop_assert!(!s.has_unfinished(), "requests left after {} steps", step);
    prop_assert!(done.values().all(|&d| d));
    s.check().map_err(TestCaseError::fail)?;
    prop_assert_eq!(s.pool().num_free(), cfg.num_blocks, "blocks leaked");
    // First come, first served: among equal priorities (`priority`), among all (`fifo`),
    // within a tenant among equal priorities (`fair`).
    let arrival = |id: RequestId| (reqs[id as usize].arrive_at, id);
    for (a_pos, &a) in admitted.iter().enumerate() {
        for &b in &admitted[a_pos + 1..] {
            let (ra, rb) = (&reqs[a as usize], &reqs[b as usize]);
            let ordered = match cfg.policy {
                SchedulingPolicy::Fifo => true,
                SchedulingPolicy::Priority => ra.priority == rb.priority,
                SchedulingPolicy::Fair(_) => ra.priority == rb.priority && tenant(a) == tenant(b),
                SchedulingPolicy::Slo => {
                    ra.priority == rb.priority && latest_start(a) == latest_start(b)
                }
            };
            if ordered {
                prop_assert!(
                    arrival(a) < arrival(b),
                    "{} admitted before {} against FCFS",
                    a,
                    b
                );
            }
        }
    }
    Ok(())
}

/// The engine's overlapped steps on a GPU, simulated: each step is scheduled while the
/// previous one is still in flight; the previous step's sampled tokens stand in the scheduler
/// as placeholders, the simulated device writes the real tokens' K/V where a run ends at one,
/// and the host then replaces them (`set_last_token`) and sees stop conditions a step late
/// before recording the new step with placeholders of its own. Every K/V a sequence's computed
/// prefix holds (reused blocks included) is its own real token's; outputs are what the model
/// sampled; nothing leaks; everything finishes.
fn simulate_overlapped(cfg: SchedulerConfig, reqs: Vec<Req>) -> Result<(), TestCaseError> {
    const PLACEHOLDER: TokenId = 0;
    let bs = cfg.block_size;
    let mut prompt_len: HashMap<RequestId, usize> = HashMap::new();
    let mut s = Scheduler::new(cfg.clone()).unwrap();
    let mut kv: Vec<Option<(TokenId, usize)>> = vec![None; cfg.num_blocks * bs];
    let mut out_count: HashMap<RequestId, usize> = HashMap::new();
    let mut done: HashMap<RequestId, bool> = HashMap::new();
    let mut batch = ForwardBatch::new();
    // The step in flight: per sampled sequence, the placeholder's position and its token.
    let mut in_flight: HashMap<RequestId, (usize, TokenId)> = HashMap::new();
    // Sequences whose last token is in flight (held until removed).
    let mut held: Vec<RequestId> = Vec::new();
    let mut step = 0;
    while step < 5000 {
        arrive(&mut s, &reqs, step, &mut done, &mut prompt_len);
        if step > 40 && !s.has_unfinished() && in_flight.is_empty() {
            break;
        }
        let out = s.schedule();
        s.check().map_err(TestCaseError::fail)?;
        for x in &out.seqs {
            prop_assert!(!held.contains(&x.id), "seq {} held but scheduled", x.id);
        }
        s.fill_batch(&out, &mut batch).unwrap();
        // The device runs the step: a run ending at a placeholder takes the token in flight.
        for (x, slice) in out.seqs.iter().zip(&batch.seqs) {
            let mut run =
                batch.token_ids[slice.query_start..slice.query_start + slice.query_len].to_vec();
            let end = x.start + x.num_tokens;
            if let Some(&(at, t)) = in_flight.get(&x.id) {
                if at + 1 == end {
                    prop_assert_eq!(run[run.len() - 1], PLACEHOLDER);
                    *run.last_mut().unwrap() = t;
                }
            }
            for (p, &t) in run.iter().enumerate() {
                prop_assert!(t != PLACEHOLDER || x.start + p < prompt_len[&x.id]);
            }
            run_step(&s, &mut kv, x, &run)?;
        }
        // The host processes the step in flight: its tokens replace the placeholders, and a
        // sequence that reached its length ends (its row in this step is dropped).
        for (id, (_, t)) in std::mem::take(&mut in_flight) {
            if done[&id] {
                continue;
            }
            s.set_last_token(id, t).unwrap();
            let c = out_count.entry(id).or_insert(0);
            *c += 1;
            if *c == reqs[id as usize].max_out {
                s.remove(id);
                done.insert(id, true);
                held.retain(|&h| h != id);
            }
        }
        for (i, r) in reqs.iter().enumerate() {
            if r.abort_at == Some(step) && done.get(&(i as RequestId)) == Some(&false) {
                s.remove(i as RequestId);
                done.insert(i as RequestId, true);
                held.retain(|&h| h != i as RequestId);
            }
        }
        // This step goes in flight: a placeholder for each sampling sequence still running.
        let mut samples = Vec::new();
        let mut hold = Vec::new();
        for x in out.seqs.iter().filter(|x| x.samples && !done[&x.id]) {
            let at = x.start + x.num_tokens;
            samples.push((x.id, PLACEHOLDER));
            in_flight.insert(x.id, (at, sampled(x.id, at)));
            // Its last token: no later step may compute a row for it.
            if out_count.get(&x.id).copied().unwrap_or(0) + 1 == reqs[x.id as usize].max_out {
                hold.push(x.id);
            }
        }
        s.update(&out, &samples);
        for id in hold {
            s.hold(id).unwrap();
            held.push(id);
        }
        for x in out.seqs.iter().filter(|x| !done[&x.id]) {
            let toks = s.tokens(x.id).unwrap();
            let pending = in_flight.get(&x.id).map(|&(at, _)| at);
            for (p, &t) in toks.iter().enumerate().skip(prompt_len[&x.id]) {
                if Some(p) != pending {
                    prop_assert_eq!(t, sampled(x.id, p), "seq {} pos {}", x.id, p);
                }
            }
        }
        s.check().map_err(TestCaseError::fail)?;
        step += 1;
    }
    prop_assert!(!s.has_unfinished(), "requests left after {} steps", step);
    prop_assert!(done.values().all(|&d| d));
    prop_assert_eq!(s.pool().num_free(), cfg.num_blocks, "blocks leaked");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn overlapped_steps_keep_every_sequence_its_own_tokens(
        cfg in config(),
        reqs in prop::collection::vec(req(), 1..24),
    ) {
        simulate_overlapped(cfg, reqs)?;
    }

    #[test]
    fn budgets_hold_nothing_leaks_everything_finishes(cfg in config(), reqs in prop::collection::vec(req(), 1..24)) {
        simulate(cfg, reqs, None, None)?;
    }

    #[test]
    fn speculation_rolls_back_exactly_and_changes_no_output(
        cfg in config(),
        reqs in prop::collection::vec(req(), 1..24),
        spec in speculation(),
    ) {
        simulate(cfg, reqs, spec, None)?;
    }

    #[test]
    fn a_tier_below_the_pool_serves_each_sequence_its_own_kv(
        cfg in config(),
        reqs in prop::collection::vec(req(), 1..24),
        spec in speculation(),
        tier_blocks in 1..24u64,
    ) {
        simulate(cfg, reqs, spec, Some(tier_blocks))?;
    }
}

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
