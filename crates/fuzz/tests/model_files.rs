//! Damaged model files, swept deterministically: real GGUF and safetensors files cut at many
//! lengths and with bytes flipped at many offsets of their headers. Every case loads or fails
//! with an error naming the file; none panics, and none allocates out of proportion to the
//! file (the counting allocator checks the heap peak of every load).
//!
//! Files: the tiny SmolLM (Q8_0 GGUF, with its vocabulary), the tiny Llama (safetensors
//! folder), and SmolLM2-135M's Q4_1 GGUF when `scripts/fetch-smollm2.sh` has fetched it
//! (always under CI).

mod common;

use ferrum_fuzz::alloc;
use ferrum_models::{load_model, load_text_assets, GgufFile, LoadOptions, ModelConfig};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

#[global_allocator]
static ALLOC: ferrum_fuzz::alloc::Counting = ferrum_fuzz::alloc::Counting;

/// The allocation counters are process-wide: one test at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ferrum-model-files-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// Cut points: every length in the first 64 bytes, `n` more spread evenly over the file.
fn cuts(len: usize, n: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..64.min(len)).collect();
    v.extend((1..=n).map(|i| len * i / (n + 1)));
    v.push(len - 1);
    v.sort_unstable();
    v.dedup();
    v
}

/// `n` offsets spread over `0..end`, each with the byte change to make there.
fn flips(end: usize, n: usize) -> Vec<(usize, u8)> {
    let vals = [0x00, 0xFF, 0x7F, 0x80, 0x01];
    (0..n)
        .map(|i| {
            // An odd stride walks every residue, so length and count fields' bytes get hit.
            let at = (i * 7919 + i / 3) % end;
            (at, vals[i % vals.len()])
        })
        .collect()
}

/// Runs `load` with the allocation counters on; fails on a panic or a heap peak above
/// `limit`. Returns the error message, if loading failed.
fn checked(case: &str, limit: usize, load: impl FnOnce() -> Result<(), String>) -> Option<String> {
    let start = alloc::reset();
    let r = catch_unwind(AssertUnwindSafe(load));
    let used = alloc::usage(start);
    let r = r.unwrap_or_else(|_| panic!("{case}: panicked"));
    assert!(
        used.peak_above_start <= limit,
        "{case}: heap peak {} bytes (largest allocation {}), over the limit of {limit}",
        used.peak_above_start,
        used.largest
    );
    r.err()
}

fn opts() -> LoadOptions {
    LoadOptions {
        num_threads: Some(1),
        ..LoadOptions::default()
    }
}

/// Loads the GGUF at `path` the way `ferrum run` does: weights, then tokenizer and template.
fn load_gguf(path: &Path) -> Result<(), String> {
    load_model(path, &opts()).map_err(|e| e.to_string())?;
    load_text_assets(path).map_err(|e| e.to_string())?;
    Ok(())
}

fn data_start(bytes: &[u8]) -> usize {
    let g = GgufFile::from_bytes(Path::new("x.gguf"), bytes).expect("fixture parses");
    g.tensor_infos()
        .iter()
        .map(|t| t.offset)
        .min()
        .expect("tensors")
}

#[test]
fn damaged_gguf_files_are_refused_cleanly() {
    let _serial = serial();
    let bytes = common::read("tiny-smollm/model-q8_0.gguf");
    let dir = scratch("gguf");
    let path = dir.join("model.gguf");
    let limit = 2 * bytes.len() + (64 << 20);
    let header = data_start(&bytes);
    let mut failed = 0;
    for cut in cuts(bytes.len(), 120) {
        std::fs::write(&path, &bytes[..cut]).expect("write");
        let err = checked(&format!("cut at {cut}"), limit, || load_gguf(&path));
        let err = err.unwrap_or_else(|| panic!("a file cut at {cut} of {} loaded", bytes.len()));
        assert!(
            err.contains("model.gguf"),
            "cut at {cut}: the error does not name the file: {err}"
        );
        failed += 1;
    }
    let mut refused = 0;
    let cases = flips(header, 400);
    for &(at, v) in &cases {
        let mut b = bytes.clone();
        if b[at] == v {
            b[at] ^= 0x55;
        } else {
            b[at] = v;
        }
        std::fs::write(&path, &b).expect("write");
        if let Some(err) = checked(&format!("byte {at} set to {v:#x}"), limit, || {
            load_gguf(&path)
        }) {
            assert!(!err.is_empty());
            refused += 1;
        }
    }
    eprintln!(
        "tiny-smollm Q8_0 GGUF ({} bytes, header {header}): {failed} cuts refused; {} header byte changes, {refused} refused, the rest loaded",
        bytes.len(),
        cases.len()
    );
    assert!(refused > 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn damaged_safetensors_folders_are_refused_cleanly() {
    let _serial = serial();
    let src = common::fixtures().join("tiny-llama");
    let bytes = std::fs::read(src.join("model.safetensors")).expect("fixture");
    let dir = scratch("safetensors");
    std::fs::copy(src.join("config.json"), dir.join("config.json")).expect("copy");
    let path = dir.join("model.safetensors");
    let limit = 4 * bytes.len() + (64 << 20);
    let header = 8 + u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    for cut in cuts(bytes.len(), 100) {
        std::fs::write(&path, &bytes[..cut]).expect("write");
        let err = checked(&format!("cut at {cut}"), limit, || {
            load_model(&dir, &opts())
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        let err = err.unwrap_or_else(|| panic!("a file cut at {cut} of {} loaded", bytes.len()));
        assert!(
            err.contains("model.safetensors"),
            "cut at {cut}: the error does not name the file: {err}"
        );
    }
    let mut refused = 0;
    let cases = flips(header, 400);
    for &(at, v) in &cases {
        let mut b = bytes.clone();
        b[at] = if b[at] == v { v ^ 0x55 } else { v };
        std::fs::write(&path, &b).expect("write");
        let err = checked(&format!("byte {at} set to {v:#x}"), limit, || {
            load_model(&dir, &opts())
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        refused += usize::from(err.is_some());
    }
    eprintln!(
        "tiny-llama safetensors ({} bytes, header {header}): {} header byte changes, {refused} refused",
        bytes.len(),
        cases.len()
    );
    assert!(refused > 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// SmolLM2-135M's real Q4_1 file: header damage through the parser, the config and the
/// tokenizer build (loading its weights 200 times would take minutes), and cuts through the
/// whole loader.
#[test]
fn damaged_smollm2_gguf_is_refused_cleanly() {
    let _serial = serial();
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !model.exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{} is missing under CI: run scripts/fetch-smollm2.sh",
            model.display()
        );
        eprintln!(
            "skipped: {} is absent (scripts/fetch-smollm2.sh)",
            model.display()
        );
        return;
    }
    let bytes = std::fs::read(&model).expect("model");
    let header = data_start(&bytes);
    let limit = bytes.len() + (128 << 20);
    let name = Path::new("SmolLM2.gguf");
    let mut refused = 0;
    let cases = flips(header, 100);
    for &(at, v) in &cases {
        let mut b = bytes[..header].to_vec();
        b[at] = if b[at] == v { v ^ 0x55 } else { v };
        // The header alone, padded with zeros for the tensor data.
        b.resize(bytes.len(), 0);
        let err = checked(&format!("byte {at} set to {v:#x}"), limit, || {
            let g = GgufFile::from_bytes(name, &b).map_err(|e| e.to_string())?;
            ModelConfig::from_gguf(&g).map_err(|e| e.to_string())?;
            let vocab = ferrum_models::gguf_vocab(&g).map_err(|e| e.to_string())?;
            vocab.build().map_err(|e| e.to_string())?;
            Ok(())
        });
        refused += usize::from(err.is_some());
    }
    let dir = scratch("smollm2");
    let path = dir.join("model.gguf");
    let mut cut_cases = cuts(header, 8);
    cut_cases.retain(|&c| c % 8 == 0 || c > 64);
    cut_cases.extend([header + 1000, bytes.len() / 2, bytes.len() - 1]);
    for &cut in &cut_cases {
        std::fs::write(&path, &bytes[..cut]).expect("write");
        let err = checked(&format!("cut at {cut}"), limit, || load_gguf(&path));
        let err = err.unwrap_or_else(|| panic!("a file cut at {cut} loaded"));
        assert!(err.contains("model.gguf"), "cut at {cut}: {err}");
    }
    eprintln!(
        "SmolLM2 Q4_1 GGUF ({} bytes, header {header}): {} cuts refused; {} header byte changes, {refused} refused",
        bytes.len(),
        cut_cases.len(),
        cases.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
