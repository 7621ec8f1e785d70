//! The disk KV tier on the tiny fixture: a restarted engine serves a prompt's prefix from the
//! files a previous one left, with the same tokens; a damaged, foreign or missing file is
//! recomputed, never served; a folder that cannot be used, or that vanishes, leaves the engine
//! running without the tier; two engines on one folder do not spoil each other's files; the
//! tier keeps to its size; an int8 cache's blocks (with their scales) restart too, apart from a
//! float cache's.
#![allow(clippy::unwrap_used)]

mod common;

use common::engine;
use ferrum_engine::{EngineConfig, EngineHandle, Event, GenerateRequest, KvDiskConfig, Usage};
use ferrum_scheduler::hash_block;
use ferrum_types::{SamplingParams, TokenId};
use std::path::{Path, PathBuf};

const BS: usize = 4;

fn collect(mut s: ferrum_engine::EventStream) -> (Vec<TokenId>, Usage) {
    let mut ids = Vec::new();
    loop {
        match s.blocking_next() {
            Some(Event::Token { token, .. }) => ids.push(token),
            Some(Event::Finished { .. }) => {}
            Some(Event::Done { usage }) => return (ids, usage),
            Some(Event::Error(e)) => panic!("engine error: {e}"),
            None => panic!("stream ended without Done"),
        }
    }
}

fn prompt(seed: u32) -> Vec<TokenId> {
    (0..60).map(|j| (j * 13 + seed * 7) % 200 + 3).collect()
}

fn ask(e: &EngineHandle, p: &[TokenId]) -> (Vec<TokenId>, Usage) {
    let params = SamplingParams {
        max_tokens: Some(8),
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    collect(
        e.generate(GenerateRequest::new(p.to_vec(), params))
            .unwrap(),
    )
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ferrum-kv-disk-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn cfg(dir: &Path, identity: &str, max_bytes: u64) -> EngineConfig {
    EngineConfig {
        block_size: BS,
        kv_disk: Some(KvDiskConfig {
            dir: dir.to_path_buf(),
            max_bytes,
            model_identity: identity.into(),
        }),
        ..EngineConfig::default()
    }
}

fn start(dir: &Path, identity: &str) -> EngineHandle {
    engine("tiny-qwen2", cfg(dir, identity, 64 << 20))
}

/// The one fingerprint folder under `dir`, and its block files.
fn block_files(dir: &Path) -> (PathBuf, Vec<PathBuf>) {
    let sub: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(sub.len(), 1, "{sub:?}");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&sub[0])
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "kvb"))
        .collect();
    files.sort();
    (sub[0].clone(), files)
}

/// The file of the `i`-th full block of `p`.
fn file_of(folder: &Path, p: &[TokenId], i: usize) -> PathBuf {
    let mut h = None;
    for b in 0..=i {
        h = Some(hash_block(h, &p[b * BS..(b + 1) * BS]));
    }
    folder.join(format!("{}.kvb", h.unwrap().to_hex()))
}

/// Without any tier, for reference.
fn reference(p: &[TokenId]) -> Vec<TokenId> {
    let e = engine(
        "tiny-qwen2",
        EngineConfig {
            block_size: BS,
            ..EngineConfig::default()
        },
    );
    let (ids, _) = ask(&e, p);
    e.shutdown();
    ids
}

#[test]
fn a_restart_serves_the_prefix_from_disk_with_the_same_tokens() {
    let dir = temp_dir("restart");
    let p = prompt(1);
    let want = reference(&p);
    let e = start(&dir, "tiny");
    let (first, u) = ask(&e, &p);
    assert_eq!((first.clone(), u.cached_tokens), (want.clone(), 0));
    e.shutdown();
    // 60 prompt and 7 computed output tokens: 16 full blocks kept.
    let (folder, files) = block_files(&dir);
    assert_eq!(files.len(), 16, "{files:?}");
    // A new engine: the 14 full blocks before the last prompt token come from disk.
    let e = start(&dir, "tiny");
    let m = e.metrics();
    assert_eq!((m.kv_disk.blocks, m.kv_disk.enabled), (16, true));
    let (again, u) = ask(&e, &p);
    assert_eq!(again, want);
    assert_eq!(u.cached_tokens, 56);
    let m = e.metrics();
    assert_eq!(m.kv_disk.hits, 14);
    assert_eq!(m.kv_disk.bad_files, 0);
    assert!(m.kv_disk.bytes_read > 0);
    e.shutdown();

    // A byte flipped in the third block's file: the first two are served, the rest
    // recomputed, the same tokens; the bad file is dropped (and written anew once computed).
    let bad = file_of(&folder, &p, 2);
    let mut bytes = std::fs::read(&bad).unwrap();
    let at = bytes.len() - 3;
    bytes[at] ^= 0x40;
    std::fs::write(&bad, &bytes).unwrap();
    let e = start(&dir, "tiny");
    let (again, u) = ask(&e, &p);
    assert_eq!(again, want);
    assert_eq!(u.cached_tokens, 8);
    let m = e.metrics();
    assert_eq!((m.kv_disk.hits, m.kv_disk.bad_files), (2, 1));
    e.shutdown();
    assert_ne!(
        std::fs::read(&bad).unwrap(),
        bytes,
        "the damaged file is gone"
    );

    // A file of another model copied in under a block's name: its fingerprint differs.
    let other = temp_dir("restart-other");
    let e = start(&other, "another model");
    ask(&e, &p);
    e.shutdown();
    let (other_folder, _) = block_files(&other);
    std::fs::copy(file_of(&other_folder, &p, 0), file_of(&folder, &p, 0)).unwrap();
    let e = start(&dir, "tiny");
    let (again, u) = ask(&e, &p);
    assert_eq!((again, u.cached_tokens), (want.clone(), 0));
    assert_eq!(e.metrics().kv_disk.bad_files, 1);
    e.shutdown();
    // Truncated, and missing: recomputed.
    let f = file_of(&folder, &p, 0);
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
    std::fs::remove_file(file_of(&folder, &p, 5)).unwrap();
    let e = start(&dir, "tiny");
    let (again, u) = ask(&e, &p);
    assert_eq!((again, u.cached_tokens), (want.clone(), 0));
    e.shutdown();
    let e = start(&dir, "tiny");
    let (again, u) = ask(&e, &p);
    assert_eq!((again, u.cached_tokens), (want, 56), "all written anew");
    e.shutdown();
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&other).unwrap();
}

#[test]
fn an_unusable_or_vanishing_folder_leaves_the_engine_running() {
    let p = prompt(2);
    let want = reference(&p);
    // A folder that cannot be made (its parent is a file).
    let file = temp_dir("not-a-folder");
    std::fs::write(&file, "x").unwrap();
    let e = start(&file.join("kv"), "tiny");
    assert!(!e.metrics().kv_disk.enabled);
    assert_eq!(ask(&e, &p).0, want);
    e.shutdown();
    std::fs::remove_file(&file).unwrap();
    // A folder removed while the engine runs: writes fail, and stop; the engine goes on.
    let dir = temp_dir("vanishing");
    let e = start(&dir, "tiny");
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(ask(&e, &p).0, want);
    assert_eq!(ask(&e, &prompt(3)).0.len(), 8);
    common::wait_for_idle(&e);
    e.shutdown();
    assert!(e.metrics().kv_disk.write_failures >= 1);
    assert!(!dir.exists());
}

#[test]
fn two_engines_share_a_folder_and_the_tier_keeps_to_its_size() {
    let dir = temp_dir("shared");
    let prompts: Vec<Vec<TokenId>> = (10..16).map(prompt).collect();
    let wants: Vec<Vec<TokenId>> = prompts.iter().map(|p| reference(p)).collect();
    let engines = [start(&dir, "tiny"), start(&dir, "tiny")];
    std::thread::scope(|s| {
        for (k, e) in engines.iter().enumerate() {
            let (prompts, wants) = (&prompts, &wants);
            s.spawn(move || {
                for i in 0..prompts.len() {
                    let j = (i + k * 3) % prompts.len();
                    assert_eq!(ask(e, &prompts[j]).0, wants[j]);
                }
            });
        }
    });
    for e in &engines {
        e.shutdown();
    }
    // Every file both wrote is whole: a third engine serves every prompt from them.
    let e = start(&dir, "tiny");
    for (p, want) in prompts.iter().zip(&wants) {
        let (ids, u) = ask(&e, p);
        assert_eq!((&ids, u.cached_tokens), (want, 56));
    }
    assert_eq!(e.metrics().kv_disk.bad_files, 0);
    let block = e.metrics().kv_disk.bytes / e.metrics().kv_disk.blocks;
    e.shutdown();
    // Room for 10 blocks: older ones go, and a restart keeps to the size too.
    let small = 10 * block;
    let e = engine("tiny-qwen2", cfg(&dir, "tiny", small));
    assert!(e.metrics().kv_disk.bytes <= small);
    assert_eq!(block_files(&dir).1.len(), 10);
    let (ids, _) = ask(&e, &prompt(20));
    assert_eq!(ids.len(), 8);
    common::wait_for_idle(&e);
    e.shutdown();
    let m = e.metrics();
    assert!(
        m.kv_disk.bytes <= small && m.kv_disk.evictions > 0,
        "{:?}",
        m.kv_disk
    );
    assert!(block_files(&dir).1.len() <= 10);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An int8 cache's blocks (values and their scales) go to disk and come back: a restart serves
/// the prefix with the tokens of an int8 engine without the tier. A float cache on the same
/// folder keeps to its own fingerprint (the layout differs) and never reads them.
#[test]
fn an_int8_cache_restarts_from_disk_apart_from_a_float_cache() {
    use ferrum_models::{load_model, LoadOptions};
    use ferrum_runtime::cpu::KvDtype;
    let int8 = |cfg: &EngineConfig| {
        let model = load_model(
            &common::fixture("tiny-qwen2"),
            &LoadOptions {
                num_threads: Some(2),
                kv_cache_dtype: Some(KvDtype::Int8),
                ..LoadOptions::default()
            },
        )
        .unwrap();
        EngineHandle::start(model, None, cfg).unwrap()
    };
    let dir = temp_dir("int8");
    let p = prompt(3);
    let plain = int8(&EngineConfig {
        block_size: BS,
        ..EngineConfig::default()
    });
    let want = ask(&plain, &p).0;
    plain.shutdown();
    let e = int8(&cfg(&dir, "tiny", 64 << 20));
    assert_eq!(ask(&e, &p).0, want);
    e.shutdown();
    let e = int8(&cfg(&dir, "tiny", 64 << 20));
    let (again, u) = ask(&e, &p);
    assert_eq!((again, u.cached_tokens), (want, 56));
    assert_eq!(e.metrics().kv_disk.bad_files, 0);
    e.shutdown();
    // The f32 engine: its own folder beside the int8 one, nothing read from it.
    let e = start(&dir, "tiny");
    let (ids, u) = ask(&e, &p);
    assert_eq!((ids, u.cached_tokens), (reference(&p), 0));
    assert_eq!(e.metrics().kv_disk.hits, 0);
    e.shutdown();
    let folders = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(folders, 2, "one fingerprint folder per cache layout");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--kv-offload-memory` for a model on the CPU: the pool is host memory already, so the
/// bytes join it (more blocks, no host tier), and the disk tier beside it is unchanged.
#[test]
fn offload_memory_joins_a_cpu_models_pool() {
    let dir = temp_dir("offload");
    let plain = engine("tiny-qwen2", cfg(&dir, "offload", 64 << 20));
    let (want, _) = ask(&plain, &prompt(5));
    let blocks = plain.metrics().kv_blocks_total;
    plain.shutdown();
    let per_block = (2u64 << 30) / blocks as u64;
    let e = engine(
        "tiny-qwen2",
        EngineConfig {
            kv_offload_memory: Some(10 * per_block),
            ..cfg(&dir, "offload", 64 << 20)
        },
    );
    let m = e.metrics();
    assert_eq!(m.kv_blocks_total, blocks + 10);
    assert!(!m.kv_host.enabled && m.kv_disk.enabled);
    // The disk has the prompt from the first engine.
    assert_eq!(ask(&e, &prompt(5)).0, want);
    assert!(e.metrics().kv_disk.hits > 0);
    e.shutdown();
    std::fs::remove_dir_all(&dir).unwrap();
}
