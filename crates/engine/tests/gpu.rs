//! The whole engine (scheduler, paged KV cache on the device, chunked prefill, batching, prefix
//! reuse, sampling) on the CUDA backend, run on the interpreted device: every commit runs the
//! GPU path end to end without a GPU. Skipped without the Triton venv
//! (`scripts/test-cuda-interpret.sh` makes it), a failure under CI.
#![allow(clippy::unwrap_used)]

mod common;

use common::{fixture, wait_for_idle};
use ferrum_engine::{EngineConfig, EngineHandle, Event, GenerateRequest, KvCacheSize};
use ferrum_models::{load_model_on, LoadOptions};
use ferrum_runtime::cuda::InterpreterConfig;
use ferrum_runtime::Device;
use ferrum_types::{SamplingParams, StructuredOutput};
use serde_json::Value;

fn interpreted_available() -> bool {
    if InterpreterConfig::from_env().is_available() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI: the Triton venv is missing (scripts/test-cuda-interpret.sh)"
    );
    eprintln!("skipped: the interpreted device needs scripts/test-cuda-interpret.sh");
    false
}

fn collect(e: &EngineHandle, prompt: Vec<u32>, max_tokens: usize) -> Vec<u32> {
    let params = SamplingParams {
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    collect_with(e, prompt, params)
        .into_iter()
        .map(|t| t.0)
        .collect()
}

/// Each token with its logprob, when asked for.
fn collect_with(
    e: &EngineHandle,
    prompt: Vec<u32>,
    params: SamplingParams,
) -> Vec<(u32, Option<f32>)> {
    let mut s = e.generate(GenerateRequest::new(prompt, params)).unwrap();
    let mut out = Vec::new();
    loop {
        match s.blocking_next() {
            Some(Event::Token { token, logprob, .. }) => out.push((token, logprob)),
            Some(Event::Finished { .. }) => {}
            Some(Event::Done { .. }) | None => return out,
            Some(Event::Error(e)) => panic!("{e}"),
        }
    }
}

/// A fixture's reference cases: prompt ids and transformers' greedy ids.
fn reference_cases(dir: &std::path::Path) -> Vec<(Vec<u32>, Vec<u32>)> {
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    reference["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (ids(&c["prompt_ids"]), ids(&c["greedy_ids"])))
        .collect()
}

/// Every case's first `n` greedy ids, the cases submitted at once (batched).
fn greedy_batched(e: &EngineHandle, cases: &[(Vec<u32>, Vec<u32>)], n: usize) {
    std::thread::scope(|s| {
        let handles: Vec<_> = cases
            .iter()
            .map(|(prompt, _)| s.spawn(|| collect(e, prompt.clone(), n)))
            .collect();
        for (h, (_, want)) in handles.into_iter().zip(cases) {
            assert_eq!(h.join().unwrap(), want[..n], "batched greedy ids");
        }
    });
}

#[test]
fn fixtures_greedy_through_the_engine_on_the_interpreted_device() {
    if !interpreted_available() {
        return;
    }
    let dir = fixture("tiny-llama");
    let model = load_model_on(&dir, &LoadOptions::default(), Device::Interpreted).unwrap();
    assert!(model.device_name().starts_with("interpreted"));
    // Small steps: long prompts prefill in several chunks beside other sequences' decodes.
    let cfg = EngineConfig {
        max_num_batched_tokens: 24,
        kv_cache: KvCacheSize::Bytes(4 << 20),
        ..EngineConfig::default()
    };
    let e = EngineHandle::start(model, None, &cfg).unwrap();
    assert!(e.metrics().device.starts_with("interpreted"));
    let cases = reference_cases(&dir);
    // All at once: one batch of mixed prefill chunks and decodes.
    greedy_batched(&e, &cases, 16);
    wait_for_idle(&e);
    // Again, alone: the prompts' full blocks now come from the prefix cache.
    let (prompt, want) = &cases[cases.len() - 1];
    assert_eq!(&collect(&e, prompt.clone(), 16), want, "with prefix reuse");
    assert!(
        e.metrics().prefix_cache_hits > 0,
        "the prefix cache was used"
    );
    wait_for_idle(&e);
    e.shutdown();
}

/// Seeded sampling with every processor (penalties, bias, temperature, min-p, top-k, top-p,
/// logprobs), several requests batched: the tokens the rows sampled on the interpreted device
/// give are those of the CPU engine's host sampler, logprobs within 1e-4. Each output
/// position's draw is a function of the seed and the position alone, so the two engines draw
/// alike whatever their batching.
#[test]
fn seeded_sampling_on_the_device_matches_the_cpu() {
    if !interpreted_available() {
        return;
    }
    let dir = fixture("tiny-llama");
    let cfg = EngineConfig {
        max_num_batched_tokens: 24,
        kv_cache: KvCacheSize::Bytes(4 << 20),
        ..EngineConfig::default()
    };
    let params = |i: u64| SamplingParams {
        max_tokens: Some(10),
        ignore_eos: true,
        temperature: 0.9,
        top_k: Some(40 + i as usize),
        top_p: 0.92,
        min_p: 0.01,
        repetition_penalty: 1.1,
        frequency_penalty: 0.2,
        presence_penalty: 0.1,
        logit_bias: vec![(11, 2.0)],
        logprobs: Some(2),
        seed: Some(100 + i),
        ..SamplingParams::default()
    };
    let prompts: Vec<Vec<u32>> = vec![vec![1, 5, 9, 200], vec![7; 19], vec![3, 300, 40, 5, 6]];
    let run = |device| {
        let model = load_model_on(&dir, &LoadOptions::default(), device).unwrap();
        let e = EngineHandle::start(model, None, &cfg).unwrap();
        let outs: Vec<Vec<(u32, Option<f32>)>> = std::thread::scope(|s| {
            let handles: Vec<_> = prompts
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let e = &e;
                    s.spawn(move || collect_with(e, p.clone(), params(i as u64)))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        wait_for_idle(&e);
        e.shutdown();
        outs
    };
    let cpu = run(Device::Cpu);
    let gpu = run(Device::Interpreted);
    for (i, (c, g)) in cpu.iter().zip(&gpu).enumerate() {
        let ids = |v: &[(u32, Option<f32>)]| v.iter().map(|t| t.0).collect::<Vec<_>>();
        assert_eq!(ids(g), ids(c), "request {i}: seeded tokens");
        for (a, b) in c.iter().zip(g) {
            let (a, b) = (a.1.unwrap(), b.1.unwrap());
            assert!((a - b).abs() < 1e-4, "request {i}: logprob {b} against {a}");
        }
    }
}

/// Constrained requests with a GPU model: each guide's mask (computed while the device runs the
/// forward pass) is uploaded and applied there, and the tokens are the CPU's, greedy and seeded,
/// batched with an unconstrained request (which makes the step's rows go through the device's
/// sampling with the masks).
#[test]
fn constrained_sampling_on_the_device_matches_the_cpu() {
    if !interpreted_available() {
        return;
    }
    let dir = fixture("tiny-smollm");
    let tok = ferrum_models::load_text_assets(&dir).unwrap().tokenizer;
    let cfg = EngineConfig {
        max_num_batched_tokens: 24,
        kv_cache: KvCacheSize::Bytes(4 << 20),
        ..EngineConfig::default()
    };
    let choices = vec!["yes".to_string(), "no".into(), "maybe later".into()];
    let params = [
        SamplingParams {
            max_tokens: Some(10),
            structured: Some(StructuredOutput::Regex("[a-z]{2,4} [0-9]{1,2}".into())),
            ..SamplingParams::greedy()
        },
        SamplingParams {
            max_tokens: Some(12),
            temperature: 0.8,
            seed: Some(7),
            structured: Some(StructuredOutput::Choice(choices.clone())),
            ..SamplingParams::default()
        },
        // (Greedy: seeded draws over this random model's near-flat 49k-token rows land within
        // rounding of a boundary between two tokens' mass too often to compare.)
        SamplingParams {
            max_tokens: Some(4),
            ignore_eos: true,
            ..SamplingParams::greedy()
        },
    ];
    let prompt = tok.encode("The answer is", false).unwrap();
    let run = |device| {
        let model = load_model_on(&dir, &LoadOptions::default(), device).unwrap();
        let e = EngineHandle::start(model, Some(tok.clone()), &cfg).unwrap();
        let outs: Vec<Vec<u32>> = std::thread::scope(|s| {
            let handles: Vec<_> = params
                .iter()
                .map(|p| {
                    let (e, prompt) = (&e, prompt.clone());
                    s.spawn(move || collect_with(e, prompt, p.clone()))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap().into_iter().map(|t| t.0).collect())
                .collect()
        });
        wait_for_idle(&e);
        e.shutdown();
        outs
    };
    let cpu = run(Device::Cpu);
    let gpu = run(Device::Interpreted);
    assert_eq!(gpu, cpu, "constrained and seeded tokens");
    let text = |ids: &[u32]| tok.decode(ids, true).unwrap();
    let regex_out = text(&cpu[0]);
    let (word, num) = regex_out.split_once(' ').unwrap();
    assert!(
        (2..=4).contains(&word.len()) && word.chars().all(|c| c.is_ascii_lowercase()),
        "{regex_out:?}"
    );
    assert!(
        !num.is_empty() && num.chars().all(|c| c.is_ascii_digit()),
        "{regex_out:?}"
    );
    assert!(choices.contains(&text(&cpu[1])), "{:?}", text(&cpu[1]));
}

/// One request's events: `(sample index, token, logprob)` in arrival order, grouped by sample.
fn collect_samples(
    e: &EngineHandle,
    prompt: Vec<u32>,
    params: SamplingParams,
) -> Vec<(usize, u32, Option<f32>)> {
    let mut s = e.generate(GenerateRequest::new(prompt, params)).unwrap();
    let mut out = Vec::new();
    loop {
        match s.blocking_next() {
            Some(Event::Token {
                index,
                token,
                logprob,
                ..
            }) => out.push((index, token, logprob)),
            Some(Event::Finished { .. }) => {}
            Some(Event::Done { .. }) | None => break,
            Some(Event::Error(e)) => panic!("{e}"),
        }
    }
    out.sort_by_key(|t| t.0);
    out
}

/// Overlapped steps (each step scheduled and enqueued while the previous one runs, its inputs
/// taken from that step's tokens on the device, stop conditions seen a step late) give the
/// tokens of steps finished one at a time and of the CPU engine: greedy requests that end at
/// different steps (after one token, at a stop id met mid-run, at their length), a prompt
/// prefilled in chunks beside decodes, seeded sampling with logprobs, and two samples of one
/// request, all batched; the pool is whole afterwards and steps did overlap.
#[test]
fn overlapped_steps_give_the_tokens_of_steps_finished_one_at_a_time() {
    if !interpreted_available() {
        return;
    }
    let dir = fixture("tiny-llama");
    let cfg = |overlap_steps| EngineConfig {
        max_num_batched_tokens: 24,
        kv_cache: KvCacheSize::Bytes(4 << 20),
        overlap_steps,
        ..EngineConfig::default()
    };
    let greedy = |max_tokens| SamplingParams {
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    let prompt = vec![1, 5, 9, 200];
    // A stop id the greedy run meets at its fourth token or later, not before.
    let cpu_model = load_model_on(&dir, &LoadOptions::default(), Device::Cpu).unwrap();
    let e = EngineHandle::start(cpu_model, None, &cfg(false)).unwrap();
    let plain = collect(&e, prompt.clone(), 9);
    e.shutdown();
    let stop_at = (3..plain.len())
        .find(|&i| !plain[..i].contains(&plain[i]))
        .unwrap();
    let requests = [
        (prompt.clone(), greedy(1)),
        (
            prompt.clone(),
            SamplingParams {
                stop_token_ids: vec![plain[stop_at]],
                ..greedy(9)
            },
        ),
        (vec![7; 19], greedy(9)),
        (
            vec![3, 300, 40, 5, 6],
            SamplingParams {
                max_tokens: Some(8),
                ignore_eos: true,
                temperature: 0.8,
                top_k: Some(30),
                top_p: 0.9,
                logprobs: Some(2),
                seed: Some(11),
                ..SamplingParams::default()
            },
        ),
        (
            vec![2, 4, 8],
            SamplingParams {
                n: 2,
                max_tokens: Some(6),
                ignore_eos: true,
                temperature: 1.0,
                seed: Some(5),
                ..SamplingParams::default()
            },
        ),
    ];
    type Out = Vec<Vec<(usize, u32, Option<f32>)>>;
    let run = |device, overlap| -> (Out, u64) {
        let model = load_model_on(&dir, &LoadOptions::default(), device).unwrap();
        let e = EngineHandle::start(model, None, &cfg(overlap)).unwrap();
        let outs = std::thread::scope(|s| {
            let handles: Vec<_> = requests
                .iter()
                .map(|(p, params)| {
                    let e = &e;
                    s.spawn(move || collect_samples(e, p.clone(), params.clone()))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        wait_for_idle(&e);
        let m = e.metrics();
        assert!(m.steps > 0 && m.step_seconds > 0.0, "steps counted");
        assert!(
            m.device_wait_seconds <= m.step_seconds,
            "waits are part of steps"
        );
        e.shutdown();
        (outs, m.steps_overlapped)
    };
    let (cpu, _) = run(Device::Cpu, true);
    let (one_at_a_time, none) = run(Device::Interpreted, false);
    let (overlapped, steps) = run(Device::Interpreted, true);
    assert_eq!(none, 0, "no step overlaps with overlap off");
    assert!(steps > 0, "steps overlapped");
    let ids = |v: &[(usize, u32, Option<f32>)]| v.iter().map(|t| (t.0, t.1)).collect::<Vec<_>>();
    assert_eq!(cpu[0].len(), 1, "one token");
    assert_eq!(cpu[1].len(), stop_at + 1, "ends at its stop id");
    assert_eq!(cpu[4].len(), 12, "two samples of six");
    for (i, ((c, a), o)) in cpu.iter().zip(&one_at_a_time).zip(&overlapped).enumerate() {
        assert_eq!(
            ids(a),
            ids(c),
            "request {i}: the device's tokens, one step at a time"
        );
        assert_eq!(ids(o), ids(a), "request {i}: overlapped steps");
        for (x, y) in a.iter().zip(o) {
            if let (Some(x), Some(y)) = (x.2, y.2) {
                assert!((x - y).abs() < 1e-4, "request {i}: logprob {y} against {x}");
            }
        }
    }
}

/// A soft-capped model (Gemma 2) decides its tokens on the host over the capped rows, so its
/// steps do not overlap (they would gain nothing); the fixture's greedy references hold, all
/// cases batched.
#[test]
fn a_soft_capped_model_decides_on_the_host_without_overlapping() {
    if !interpreted_available() {
        return;
    }
    let dir = fixture("tiny-gemma2");
    let model = load_model_on(&dir, &LoadOptions::default(), Device::Interpreted).unwrap();
    let cfg = EngineConfig {
        max_num_batched_tokens: 48,
        kv_cache: KvCacheSize::Bytes(4 << 20),
        ..EngineConfig::default()
    };
    let e = EngineHandle::start(model, None, &cfg).unwrap();
    greedy_batched(&e, &reference_cases(&dir), 8);
    wait_for_idle(&e);
    assert_eq!(e.metrics().steps_overlapped, 0, "no step overlaps");
    e.shutdown();
}

/// The disk tier under a GPU model's cache: each newly cached block goes to the host by an
/// asynchronous copy behind the steps that wrote it (the next steps do not wait on the host
/// for it), and a restarted engine serves the prompt's prefix from the files with the tokens
/// of an engine without the tier.
#[test]
fn the_disk_tier_takes_a_gpu_caches_blocks_by_asynchronous_copies() {
    use ferrum_engine::KvDiskConfig;
    if !interpreted_available() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ferrum-gpu-kv-disk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let start = |kv_disk: Option<KvDiskConfig>| {
        let model = load_model_on(
            &fixture("tiny-qwen2"),
            &LoadOptions::default(),
            Device::Interpreted,
        )
        .unwrap();
        let cfg = EngineConfig {
            block_size: 8,
            kv_cache: KvCacheSize::Bytes(4 << 20),
            kv_disk,
            ..EngineConfig::default()
        };
        EngineHandle::start(model, None, &cfg).unwrap()
    };
    let tier = || KvDiskConfig {
        dir: dir.clone(),
        max_bytes: 64 << 20,
        model_identity: "tiny-qwen2".into(),
    };
    let prompt: Vec<u32> = (0..40).map(|j| (j * 13 + 7) % 200 + 3).collect();
    let e = start(None);
    let want = collect(&e, prompt.clone(), 6);
    e.shutdown();
    let e = start(Some(tier()));
    assert_eq!(collect(&e, prompt.clone(), 6), want);
    e.shutdown();
    let e = start(Some(tier()));
    // 40 prompt and 5 computed output tokens: 5 full blocks of 8 were stored.
    assert_eq!(e.metrics().kv_disk.blocks, 5);
    assert_eq!(collect(&e, prompt, 6), want);
    let m = e.metrics();
    assert_eq!((m.kv_disk.hits, m.kv_disk.bad_files), (4, 0));
    e.shutdown();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The host tier under a GPU model's cache (`--kv-offload-memory`): a prompt's blocks, evicted
/// from a small pool by other prompts' blocks, come back from page-locked host memory by
/// uploads instead of a prefill, with the tokens of an engine without the tier, also when the
/// requests come at once. Beside the disk tier it answers first (the disk has every block too,
/// written through), and after a restart (the host tier empty) the disk answers.
#[test]
fn the_host_tier_brings_a_gpu_caches_evicted_blocks_back() {
    use ferrum_engine::KvDiskConfig;
    if !interpreted_available() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ferrum-gpu-kv-host-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let start = |host: Option<u64>, disk: bool| {
        let model = load_model_on(
            &fixture("tiny-qwen2"),
            &LoadOptions::default(),
            Device::Interpreted,
        )
        .unwrap();
        let cfg = EngineConfig {
            block_size: 8,
            // Room for one prompt and a bit: each prompt evicts the one before.
            kv_cache: KvCacheSize::Blocks(5),
            kv_offload_memory: host,
            kv_disk: disk.then(|| KvDiskConfig {
                dir: dir.clone(),
                max_bytes: 64 << 20,
                model_identity: "tiny-qwen2".into(),
            }),
            ..EngineConfig::default()
        };
        EngineHandle::start(model, None, &cfg).unwrap()
    };
    let prompt = |seed: u32| -> Vec<u32> {
        (0..24)
            .map(|j| (j * 13 + seed * 31 + 7) % 200 + 3)
            .collect()
    };
    let e = start(None, false);
    let want: Vec<Vec<u32>> = (0..3).map(|s| collect(&e, prompt(s), 3)).collect();
    e.shutdown();
    for disk in [false, true] {
        let e = start(Some(64 << 20), disk);
        for s in 0..3 {
            assert_eq!(collect(&e, prompt(s), 3), want[s as usize], "prompt {s}");
        }
        // Prompt 0's blocks left the pool for prompts 1 and 2's: its 2 reusable blocks (of
        // 24 tokens, the last one's row recomputed) come back from the host.
        assert_eq!(collect(&e, prompt(0), 3), want[0], "disk {disk}");
        let m = e.metrics();
        assert!(m.kv_host.enabled);
        assert_eq!(
            (m.kv_host.hits, m.kv_host.write_failures),
            (2, 0),
            "disk {disk}: {:?}",
            m.kv_host
        );
        // 3 prompts of 24 and 2 computed output tokens: 9 full blocks, each written once.
        assert_eq!(m.kv_host.blocks, 9);
        assert!(
            m.kv_host.bytes_read > 0 && m.kv_host.bytes_read * 9 <= m.kv_host.bytes_written * 2
        );
        assert_eq!(m.kv_disk.hits, 0);
        if disk {
            e.shutdown();
            continue;
        }
        // All at once: each prompt's prefix comes from the pool or the host, even where the
        // pool held it at submission and evicted it before the request's turn.
        let params = SamplingParams {
            max_tokens: Some(3),
            ignore_eos: true,
            ..SamplingParams::greedy()
        };
        let streams: Vec<_> = [1, 2, 0]
            .map(|s| {
                e.generate(GenerateRequest::new(prompt(s), params.clone()))
                    .unwrap()
            })
            .into_iter()
            .collect();
        for (mut st, s) in streams.into_iter().zip([1, 2, 0]) {
            let mut ids = Vec::new();
            loop {
                match st.blocking_next() {
                    Some(Event::Token { token, .. }) => ids.push(token),
                    Some(Event::Done { usage }) => {
                        assert_eq!(usage.cached_tokens, 16, "prompt {s}");
                        break;
                    }
                    Some(Event::Error(e)) => panic!("{e}"),
                    Some(_) => {}
                    None => panic!("no Done"),
                }
            }
            assert_eq!(ids, want[s as usize], "prompt {s} at once");
        }
        e.shutdown();
    }
    // Restarted: the host tier is empty; the disk has prompt 0.
    let e = start(Some(64 << 20), true);
    assert_eq!(collect(&e, prompt(0), 3), want[0]);
    let m = e.metrics();
    assert_eq!((m.kv_host.hits, m.kv_disk.hits), (0, 2));
    e.shutdown();
    std::fs::remove_dir_all(&dir).unwrap();
}
