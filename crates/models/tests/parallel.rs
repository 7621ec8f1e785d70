//! Tensor and pipeline parallel runs against one process, over MPI (the `mpi` feature; needs
//! `mpirun` on the path). Each test launches `mpirun --oversubscribe -n N` on this test
//! binary's `rank` entry point with a case in `FERRUM_PARALLEL_CASE`; every rank loads its
//! shard, and rank 0 runs the batches and compares with the whole model in this process (or,
//! for SmolLM2, with transformers' greedy tokens), on the f32 reference path.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use ferrum_models::parallel::{check_loaded, Comms, Layout};
use ferrum_models::{load_model_on, load_model_sharded, ForwardBatch, LoadOptions, Model};
use ferrum_runtime::comm::mpi::MpiRuntime;
use ferrum_runtime::cpu::MatmulPrecision;
use ferrum_runtime::{Communicator, Device};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

const CASE: &str = "FERRUM_PARALLEL_CASE";

/// Bound on the sharded run's logits against the whole model's, relative to the largest
/// |logit|: the f32 sums only change order (per-rank partial sums, then the all-reduce).
const TOLERANCE: f32 = 1e-5;

/// A case: a model, the layout, the layers of each stage (empty: even).
struct Case {
    model: &'static str,
    /// Run on the interpreted device (the CUDA backend) instead of the CPU.
    interpreted: bool,
    tp: usize,
    pp: usize,
    split: &'static [usize],
    micro_batches: usize,
}

impl Case {
    fn encode(&self) -> String {
        let split: Vec<String> = self.split.iter().map(usize::to_string).collect();
        format!(
            "{}:{}:{}:{}:{}:{}",
            self.model,
            self.tp,
            self.pp,
            split.join(","),
            self.micro_batches,
            if self.interpreted {
                "interpreted"
            } else {
                "cpu"
            }
        )
    }
}

/// Runs `case` on `tp * pp` ranks under mpirun and checks every rank ended well.
fn launch(case: Case) {
    let n = case.tp * case.pp;
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("mpirun")
        .args(["--oversubscribe", "-n", &n.to_string()])
        .arg(&exe)
        .args([
            "--exact",
            "rank",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CASE, case.encode())
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .unwrap_or_else(|e| panic!("cannot run mpirun (install openmpi-bin): {e}"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "{}: {stdout}\n{stderr}",
        case.encode()
    );
    assert!(
        stdout.contains("rank 0: parallel case passed"),
        "{}: {stdout}",
        case.encode()
    );
}

fn model_path(name: &str) -> Option<PathBuf> {
    match name {
        "smollm2" => real_model(
            "FERRUM_SMOLLM2_GGUF",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "scripts/fetch-smollm2.sh",
        ),
        _ => Some(fixtures().join(name)),
    }
}

/// One rank of a case (launched by the tests above; does nothing on its own).
#[test]
#[ignore = "a rank of the parallel tests: they launch it under mpirun"]
fn rank() {
    let Ok(case) = std::env::var(CASE) else {
        return;
    };
    let f: Vec<&str> = case.split(':').collect();
    let (name, tp, pp): (&str, usize, usize) = (f[0], f[1].parse().unwrap(), f[2].parse().unwrap());
    let split: Vec<usize> = f[3]
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    let layout = Layout {
        tensor_parallel: tp,
        pipeline_parallel: pp,
        layer_split: (!split.is_empty()).then_some(split),
        micro_batches: f[4].parse().unwrap(),
    };
    let rt = MpiRuntime::init().unwrap();
    let world = Arc::new(rt.world());
    let rank = world.rank();
    let tp_group = Arc::new(world.split(rank / tp).unwrap());
    let comms = Comms {
        world: world.clone(),
        tp: tp_group,
    };
    // A rank that cannot read the model: every rank hears of it, naming that rank.
    let unreadable = name == "unreadable-on-rank-1";
    let path = match (unreadable, rank) {
        (true, 1) => PathBuf::from("/nonexistent/ferrum-model"),
        (true, _) => fixtures().join("tiny-llama"),
        _ => model_path(name).unwrap(),
    };
    // A sixth field "interpreted": the CUDA backend on the interpreted device, whose
    // ranks exchange through host memory.
    let device = if f.get(5) == Some(&"interpreted") {
        Device::Interpreted
    } else {
        Device::Cpu
    };
    let opts = LoadOptions {
        // Threads are the CPU's only.
        num_threads: (device == Device::Cpu).then_some(1),
        precision: MatmulPrecision::Float,
        kv_cache_dtype: None,
        pool: None,
        output_vocab: None,
        cuda_graphs: Default::default(),
        kernels: None,
        ..Default::default()
    };
    let loaded = load_model_sharded(&path, &opts, device, &layout, comms);
    let status = loaded
        .as_ref()
        .map(|_| ())
        .map_err(|e| ferrum_models::ModelError::Invalid(e.to_string()));
    let checked = check_loaded(world.as_ref(), "test", status);
    if unreadable {
        let err = checked.unwrap_err().to_string();
        assert!(
            err.contains("rank 1 on test") && err.contains("/nonexistent/ferrum-model"),
            "{err}"
        );
        assert!(!err.contains("rank 0"), "{err}");
        if rank == 0 {
            println!("rank 0: parallel case passed");
        }
        return;
    }
    checked.unwrap();
    let mut model = loaded.unwrap();
    if rank != 0 {
        model.run_worker().unwrap();
        return;
    }
    if name == "smollm2" {
        let reference = reference_json(&fixtures().join("smollm2-135m"));
        let case = &reference["cases"][0];
        let got = greedy(&mut model, &ids(&case["prompt_ids"]), 32);
        assert_eq!(got, ids(&case["generated_ids"]));
    } else if device == Device::Interpreted {
        let mut whole = load_model_on(&path, &opts, Device::Interpreted).unwrap();
        compare_with_whole(&mut model, &mut whole);
    } else {
        compare_with_whole(&mut model, &mut load(&path));
    }
    drop(model);
    println!("rank 0: parallel case passed");
}

/// Mixed prefill, chunked prefill with prior context and decodes of three sequences through
/// `sharded` and the whole model: greedy ids equal, logits within [`TOLERANCE`].
fn compare_with_whole(sharded: &mut Model, whole: &mut Model) {
    let vocab = whole.config().vocab_size;
    let bs = 16;
    let mut kv_s = sharded.new_kv_cache(12, bs).unwrap();
    let mut kv_w = whole.new_kv_cache(12, bs).unwrap();
    let prompts: [Vec<u32>; 3] = [
        (0..7).map(|i| (i * 37 + 5) % vocab as u32).collect(),
        (0..20).map(|i| (i * 11 + 3) % vocab as u32).collect(),
        vec![1, 2, 3],
    ];
    let tables: Vec<Vec<u32>> = (0..3).map(|s| (4 * s..4 * s + 4).rev().collect()).collect();
    // Tokens in the cache, and the next token to feed, per sequence.
    let mut done = [0usize; 3];
    let mut next: [Vec<u32>; 3] = [
        prompts[0].clone(),
        prompts[1][..12].to_vec(),
        prompts[2].clone(),
    ];
    for step in 0..8 {
        let mut batch = ForwardBatch::new();
        for s in 0..3 {
            batch
                .push_seq(&next[s], done[s], &tables[s], bs, next[s].len())
                .unwrap();
        }
        let got = sharded.forward(&batch, &mut kv_s).unwrap().to_vec();
        let want = whole.forward(&batch, &mut kv_w).unwrap().to_vec();
        let (err, scale) = max_err(&got, &want);
        eprintln!("step {step}: max |logit err| {err:.3e} of {scale:.3}");
        assert!(err <= TOLERANCE * scale, "step {step}: {err} vs {scale}");
        let mut row = 0;
        for s in 0..3 {
            row += next[s].len();
            let last = &want[(row - 1) * vocab..row * vocab];
            assert_eq!(
                argmax(&got[(row - 1) * vocab..row * vocab]),
                argmax(last),
                "step {step}, sequence {s}"
            );
            done[s] += next[s].len();
            // Sequence 1 finishes its prompt in the second step, then decodes.
            next[s] = if s == 1 && done[s] < prompts[1].len() {
                prompts[1][done[s]..].to_vec()
            } else {
                vec![argmax(last)]
            };
        }
    }
}

#[test]
fn tensor_parallel_2_matches_one_process() {
    for model in [
        "tiny-llama",
        "tiny-qwen2",
        "tiny-gemma3",
        "tiny-phi3",
        "tiny-mixtral",
    ] {
        launch(Case {
            interpreted: false,
            model,
            tp: 2,
            pp: 1,
            split: &[],
            micro_batches: 1,
        });
    }
}

/// Four ranks over two KV heads: each KV head is replicated on two ranks.
#[test]
fn tensor_parallel_beyond_the_kv_heads_replicates_them() {
    launch(Case {
        interpreted: false,
        model: "tiny-qwen3",
        tp: 4,
        pp: 1,
        split: &[],
        micro_batches: 1,
    });
}

#[test]
fn pipeline_parallel_2_matches_one_process() {
    for (model, split) in [("tiny-llama", &[][..]), ("tiny-gemma3", &[3, 1][..])] {
        for micro_batches in [1, 2, 3] {
            launch(Case {
                interpreted: false,
                model,
                tp: 1,
                pp: 2,
                split,
                micro_batches,
            });
        }
    }
}

#[test]
fn tensor_and_pipeline_parallel_2x2_match_one_process() {
    for model in ["tiny-llama", "tiny-gemma3", "tiny-qwen2-moe"] {
        launch(Case {
            interpreted: false,
            model,
            tp: 2,
            pp: 2,
            split: &[],
            micro_batches: 2,
        });
    }
}

/// SmolLM2 (9 heads, 3 KV heads) split three ways by heads, and in two stages, gives
/// transformers' 32 greedy tokens.
#[test]
fn smollm2_tp3_and_pp2_give_the_reference_tokens() {
    if model_path("smollm2").is_none() {
        return;
    }
    for (tp, pp) in [(3, 1), (1, 2)] {
        launch(Case {
            interpreted: false,
            model: "smollm2",
            tp,
            pp,
            split: &[],
            micro_batches: 2,
        });
    }
}

/// A rank that cannot read the model file: the load fails on every rank, and the error names
/// that rank and the file.
#[test]
fn a_rank_that_cannot_read_the_model_fails_the_load_everywhere() {
    launch(Case {
        interpreted: false,
        model: "unreadable-on-rank-1",
        tp: 2,
        pp: 1,
        split: &[],
        micro_batches: 1,
    });
}

/// The CUDA backend's ranks (here on the interpreted device) exchange activations through host
/// memory: TP=2 x PP=2 on tiny-llama matches the whole model on the same device.
#[test]
fn cuda_backend_ranks_on_the_interpreted_device_match_one_process() {
    let config = ferrum_runtime::cuda::InterpreterConfig::from_env();
    if !config.is_available() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI: the Triton venv is missing ({})",
            config.python.display()
        );
        eprintln!("interpreted device skipped: run scripts/test-cuda-interpret.sh");
        return;
    }
    launch(Case {
        interpreted: true,
        model: "tiny-llama",
        tp: 2,
        pp: 2,
        split: &[],
        micro_batches: 2,
    });
}
