//! The sampling chain against analytic distributions (chi-square goodness of fit over many
//! seeded draws, one test per processor and one for the whole chain) and penalties against
//! hand-computed values.
#![allow(clippy::unwrap_used)]

use ferrum_engine::Sampler;
use ferrum_types::SamplingParams;

const LOGITS: [f32; 8] = [2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0];
const DRAWS: usize = 40_000;

fn softmax(l: &[f64]) -> Vec<f64> {
    let m = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = l
        .iter()
        .map(|&x| if x.is_finite() { (x - m).exp() } else { 0.0 })
        .collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

/// The distribution the chain should produce, computed independently of the sampler.
fn analytic(p: &SamplingParams) -> Vec<f64> {
    let mut l: Vec<f64> = LOGITS.iter().map(|&x| x as f64).collect();
    for &(t, b) in &p.logit_bias {
        l[t as usize] += b as f64;
    }
    let l: Vec<f64> = l.iter().map(|x| x / p.temperature as f64).collect();
    let mut probs = softmax(&l);
    let pmax = probs.iter().copied().fold(0.0, f64::max);
    for q in probs.iter_mut() {
        if *q < p.min_p as f64 * pmax {
            *q = 0.0;
        }
    }
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
    if let Some(k) = p.top_k {
        for &i in &order[k.min(order.len())..] {
            probs[i] = 0.0;
        }
    }
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|q| *q /= total);
    let mut cum = 0.0;
    for &i in &order {
        if cum >= p.top_p as f64 {
            probs[i] = 0.0;
        }
        cum += probs[i];
    }
    let total: f64 = probs.iter().sum();
    probs.iter().map(|q| q / total).collect()
}

/// Chi-square critical values at p = 0.001 for 1..=9 degrees of freedom.
const CRITICAL: [f64; 9] = [
    10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88,
];

fn check(name: &str, p: SamplingParams) {
    check_draws(name, &p, None);
}

/// Draws `DRAWS` tokens (with `proposal`: through `Sampler::verify`, whatever it accepts) and
/// tests them against the analytic distribution.
fn check_draws(name: &str, p: &SamplingParams, proposal: Option<u32>) {
    let want = analytic(p);
    let mut s = Sampler::new(p, &[], LOGITS.len(), 12345);
    let mut counts = [0usize; 8];
    let mut accepted = 0usize;
    for _ in 0..DRAWS {
        let token = match proposal {
            None => s.sample(&LOGITS, None).token,
            Some(x) => {
                let (out, ok) = s.verify(&LOGITS, x, None);
                assert_eq!(ok, out.token == x, "{name}: accepted means the proposal");
                accepted += usize::from(ok);
                out.token
            }
        };
        counts[token as usize] += 1;
    }
    if let Some(x) = proposal {
        // The proposal is accepted exactly as often as the target draws it.
        assert_eq!(accepted, counts[x as usize], "{name}");
    }
    let mut chi2 = 0.0;
    let mut cells = 0;
    for (i, &w) in want.iter().enumerate() {
        if w == 0.0 {
            assert_eq!(counts[i], 0, "{name}: token {i} was filtered out but drawn");
            continue;
        }
        let e = w * DRAWS as f64;
        chi2 += (counts[i] as f64 - e).powi(2) / e;
        cells += 1;
    }
    assert!(
        cells >= 2,
        "{name}: the test needs at least two possible tokens"
    );
    let crit = CRITICAL[cells - 2];
    assert!(
        chi2 < crit,
        "{name}: chi2 {chi2:.2} >= {crit} (counts {counts:?}, want {want:?})"
    );
}

fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
    let mut p = SamplingParams::default();
    f(&mut p);
    p
}

#[test]
fn verified_proposals_keep_the_target_distribution() {
    let chain = params(|p| {
        p.temperature = 0.8;
        p.top_k = Some(6);
        p.top_p = 0.9;
        p.logit_bias = vec![(5, 1.0)];
    });
    // A likely proposal, an unlikely one, and one the filters drop (rank 8 of 8).
    for x in [0, 4, 7] {
        check_draws(&format!("proposal {x}, t=1"), &params(|_| {}), Some(x));
        check_draws(&format!("proposal {x}, chain"), &chain, Some(x));
    }
}

#[test]
fn greedy_verification_accepts_exactly_the_argmax() {
    let mut s = Sampler::new(&SamplingParams::greedy(), &[], LOGITS.len(), 0);
    assert_eq!(
        s.verify(&LOGITS, 0, None),
        (s.clone().sample(&LOGITS, None), true)
    );
    let (out, ok) = s.verify(&LOGITS, 3, None);
    assert_eq!((out.token, ok), (0, false));
}

#[test]
fn temperature_one_is_the_softmax() {
    check("t=1", params(|_| {}));
}

#[test]
fn temperature_sharpens_and_flattens() {
    check("t=0.5", params(|p| p.temperature = 0.5));
    check("t=2", params(|p| p.temperature = 2.0));
}

#[test]
fn top_k_keeps_the_k_most_likely() {
    check("top_k=3", params(|p| p.top_k = Some(3)));
}

#[test]
fn top_p_keeps_the_nucleus() {
    check("top_p=0.8", params(|p| p.top_p = 0.8));
    check("top_p=0.5", params(|p| p.top_p = 0.5));
}

#[test]
fn min_p_drops_unlikely_tokens() {
    check("min_p=0.2", params(|p| p.min_p = 0.2));
}

#[test]
fn logit_bias_shifts_the_distribution() {
    check("bias", params(|p| p.logit_bias = vec![(7, 4.0), (0, -1.0)]));
}

#[test]
fn the_whole_chain_composes() {
    check(
        "chain",
        params(|p| {
            p.temperature = 0.7;
            p.min_p = 0.05;
            p.top_k = Some(5);
            p.top_p = 0.9;
        }),
    );
}

#[test]
fn penalties_match_hand_computed_values() {
    let p = params(|p| {
        p.repetition_penalty = 2.0;
        p.frequency_penalty = 0.5;
        p.presence_penalty = 0.25;
        p.logit_bias = vec![(4, 1.5)];
    });
    let logits = [2.0, -1.0, 0.5, 1.0, 0.0];
    let mut s = Sampler::new(&p, &[0, 1], logits.len(), 0);
    for t in [2, 2, 3] {
        s.observe(t);
    }
    let mut out = Vec::new();
    s.processed_logits(&logits, &mut out);
    // 0: prompt, positive: 2/2.  1: prompt, negative: -1*2.
    // 2: output twice: 0.5/2 - 0.5*2 - 0.25.  3: output once: 1/2 - 0.5 - 0.25.  4: bias only.
    assert_eq!(out, vec![1.0, -2.0, -1.0, -0.25, 1.5]);
}

#[test]
fn taken_back_tokens_leave_the_penalties() {
    let p = params(|p| {
        p.repetition_penalty = 2.0;
        p.frequency_penalty = 0.5;
        p.presence_penalty = 0.25;
    });
    let logits = [2.0, -1.0, 0.5, 1.0, 0.0];
    let mut s = Sampler::new(&p, &[0, 1], logits.len(), 0);
    let mut before = Vec::new();
    s.observe(2);
    s.processed_logits(&logits, &mut before);
    // Proposals 3 and 0 are recorded, then rejected.
    s.observe(3);
    s.observe(0);
    s.take_back(0);
    s.take_back(3);
    s.take_back(4); // never recorded: no change
    let mut after = Vec::new();
    s.processed_logits(&logits, &mut after);
    assert_eq!(after, before);
    // A token in the prompt keeps its repetition penalty after its output copy is taken back.
    assert_eq!(after[0], 1.0);
    s.take_back(2);
    s.processed_logits(&logits, &mut after);
    assert_eq!(after, vec![1.0, -2.0, 0.5, 1.0, 0.0]);
}

#[test]
fn greedy_takes_the_argmax_after_penalties() {
    let logits = [1.0, 0.9, 0.0];
    let mut plain = Sampler::new(&SamplingParams::greedy(), &[], 3, 0);
    assert_eq!(plain.sample(&logits, None).token, 0);
    let p = SamplingParams {
        presence_penalty: 0.5,
        ..SamplingParams::greedy()
    };
    let mut s = Sampler::new(&p, &[], 3, 0);
    assert_eq!(s.sample(&logits, None).token, 0);
    // Token 0 is now penalized below token 1.
    assert_eq!(s.sample(&logits, None).token, 1);
}

#[test]
fn same_seed_same_draws_whatever_the_default_seed() {
    let p = params(|p| {
        p.seed = Some(42);
        p.temperature = 1.5;
    });
    let draw = |default_seed| {
        let mut s = Sampler::new(&p, &[], 8, default_seed);
        (0..64)
            .map(|_| s.sample(&LOGITS, None).token)
            .collect::<Vec<_>>()
    };
    assert_eq!(draw(1), draw(2));
    let q = params(|p| p.temperature = 1.5);
    let mut a = Sampler::new(&q, &[], 8, 1);
    let mut b = Sampler::new(&q, &[], 8, 2);
    let xa: Vec<_> = (0..64).map(|_| a.sample(&LOGITS, None).token).collect();
    let xb: Vec<_> = (0..64).map(|_| b.sample(&LOGITS, None).token).collect();
    assert_ne!(xa, xb);
}

#[test]
fn logprobs_are_raw_log_softmax_with_sorted_alternatives() {
    let p = params(|p| {
        p.logprobs = Some(3);
        p.temperature = 0.0;
    });
    let mut s = Sampler::new(&p, &[], 8, 0);
    let out = s.sample(&LOGITS, None);
    let want = softmax(&LOGITS.map(|x| x as f64));
    assert_eq!(out.token, 0);
    assert!((out.logprob.unwrap() as f64 - want[0].ln()).abs() < 1e-5);
    let ids: Vec<u32> = out.top_logprobs.iter().map(|x| x.0).collect();
    assert_eq!(ids, vec![0, 1, 2]);
    for (t, lp) in out.top_logprobs {
        assert!((lp as f64 - want[t as usize].ln()).abs() < 1e-5);
    }
}

#[test]
fn large_vocabularies_use_the_partial_top_p_path() {
    // 50k tokens with a flat tail: the nucleus spans more than the first 256 candidates.
    let mut logits = vec![0.0f32; 50_000];
    logits[0] = 5.0;
    let p = params(|p| p.top_p = 0.5);
    let mut s = Sampler::new(&p, &[], logits.len(), 3);
    let mut hits0 = 0;
    for _ in 0..2000 {
        if s.sample(&logits, None).token == 0 {
            hits0 += 1;
        }
    }
    // p(0) = e^5 / (e^5 + 49999) ~ 0.0029 < 0.5, so the nucleus is token 0 plus ~24.8k others
    // and token 0 keeps about 0.0059 of the mass: 2000 draws give it rarely, but never always.
    assert!(hits0 < 100, "{hits0}");
}
