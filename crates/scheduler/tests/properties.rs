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
