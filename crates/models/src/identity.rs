//! [`weights_identity`]: a digest that tells one model's files from another's, across runs and
//! machines, without reading gigabytes: the disk KV tier keys its files under it.
//!
//! The files are the model file itself, or in a folder its `*.safetensors`, `*.gguf`,
//! `config.json`, `tokenizer.json`, `tokenizer_config.json` and `generation_config.json`, by
//! name. Each contributes its name (in a folder), its length, and its bytes: whole when
//! [`WHOLE`] or smaller (configs, tokenizers), else the first [`WHOLE`] bytes (a GGUF's
//! metadata and vocabulary), [`SAMPLES`] pieces of [`PIECE`] bytes spread evenly over the rest,
//! and the last piece. Two fine-tunes of one shape differ in every sampled piece of weights;
//! the digest is SHA-256, written as hex.

use crate::{ModelError, Result};
use sha2::{Digest, Sha256};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Files up to this size are read whole; larger ones from the start up to it.
pub const WHOLE: u64 = 4 << 20;
/// Pieces sampled from the rest of a large file.
pub const SAMPLES: u64 = 64;
pub const PIECE: u64 = 64 << 10;

fn files_of(path: &Path) -> Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let read = std::fs::read_dir(path)
        .map_err(|e| ModelError::Invalid(format!("cannot list {}: {e}", path.display())))?;
    let mut files: Vec<PathBuf> = read
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.ends_with(".safetensors")
                || name.ends_with(".gguf")
                || matches!(
                    name,
                    "config.json"
                        | "tokenizer.json"
                        | "tokenizer_config.json"
                        | "generation_config.json"
                )
        })
        .collect();
    files.sort();
    Ok(files)
}

/// The identity of the model at `path` (a file, or a folder of one); see the module docs.
pub fn weights_identity(path: &Path) -> Result<String> {
    let io = |p: &Path, e: std::io::Error| {
        ModelError::Invalid(format!("reading {} for its identity: {e}", p.display()))
    };
    let mut h = Sha256::new();
    h.update(b"ferrum.weights.v1");
    let in_folder = !path.is_file();
    for p in files_of(path)? {
        let mut f = std::fs::File::open(&p).map_err(|e| io(&p, e))?;
        let len = f.metadata().map_err(|e| io(&p, e))?.len();
        if in_folder {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            h.update((name.len() as u64).to_le_bytes());
            h.update(name.as_bytes());
        }
        h.update(len.to_le_bytes());
        let mut buf = vec![0u8; WHOLE.min(len) as usize];
        f.read_exact(&mut buf).map_err(|e| io(&p, e))?;
        h.update(&buf);
        if len > WHOLE {
            let rest = len - WHOLE;
            let mut piece = vec![0u8; PIECE.min(rest) as usize];
            let stride = rest / SAMPLES;
            let offsets = (0..SAMPLES)
                .map(|i| WHOLE + i * stride)
                .chain([len - piece.len() as u64]);
            for at in offsets {
                let n = PIECE.min(len - at) as usize;
                f.seek(SeekFrom::Start(at)).map_err(|e| io(&p, e))?;
                f.read_exact(&mut piece[..n]).map_err(|e| io(&p, e))?;
                h.update(&piece[..n]);
            }
        }
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_byte_anywhere_sampled_changes_the_identity() {
        let dir = std::env::temp_dir().join(format!("ferrum-identity-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("m.gguf");
        let mut bytes: Vec<u8> = (0..(WHOLE + 3 * PIECE * SAMPLES) as usize)
            .map(|i| (i % 251) as u8)
            .collect();
        std::fs::write(&file, &bytes).unwrap();
        let a = weights_identity(&file).unwrap();
        assert_eq!(a.len(), 64);
        assert_eq!(weights_identity(&file).unwrap(), a, "stable");
        // In the head, in a sampled piece, and in the last piece.
        for at in [10, (WHOLE + 3 * PIECE) as usize, bytes.len() - 1] {
            bytes[at] ^= 1;
            std::fs::write(&file, &bytes).unwrap();
            assert_ne!(weights_identity(&file).unwrap(), a, "byte {at}");
            bytes[at] ^= 1;
        }
        std::fs::write(&file, &bytes).unwrap();
        // A folder names its files; other files do not count.
        std::fs::write(dir.join("notes.txt"), "x").unwrap();
        let folder = weights_identity(&dir).unwrap();
        assert_ne!(folder, a);
        std::fs::write(dir.join("notes.txt"), "y").unwrap();
        assert_eq!(weights_identity(&dir).unwrap(), folder);
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        assert_ne!(weights_identity(&dir).unwrap(), folder);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(weights_identity(&dir).is_err());
    }
}
