//! One block's K/V as a file of the disk tier, and the checks that keep a bad file from ever
//! being served.
//!
//! A file is a header, then the block's bytes ([`ferrum_models::KvCache::read_block`]):
//!
//! ```text
//! magic "FRMKVBLK" | version u32 = 1 | fingerprint [32] | block hash [16] |
//! payload length u64 | payload SHA-256 [32] | payload
//! ```
//!
//! (integers little-endian). It is named `<block hash hex>.kvb`, in its fingerprint's folder,
//! and written to a name of its own then renamed into place, so a reader sees a whole file or
//! none; two servers writing the same block write the same bytes.
//!
//! Invariant: [`decode`] accepts a file only when every field checks: the magic and version,
//! the fingerprint and block hash it is looked up under, the payload's length (the cache's
//! block size) and its SHA-256. A truncated, corrupted, foreign or half-written file is an
//! error that names what failed.

use ferrum_scheduler::BlockHash;
use sha2::{Digest, Sha256};

pub const MAGIC: &[u8; 8] = b"FRMKVBLK";
pub const VERSION: u32 = 1;
/// Bytes before the payload.
pub const HEADER: usize = 8 + 4 + 32 + 16 + 8 + 32;
/// The file name's extension.
pub const EXT: &str = "kvb";

/// A file's bytes for block `hash` of the cache `fingerprint`.
pub fn encode(fingerprint: &[u8; 32], hash: BlockHash, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(fingerprint);
    out.extend_from_slice(&hash.to_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(payload));
    out.extend_from_slice(payload);
    out
}

/// Checks a file read back for block `hash` of the cache `fingerprint`, whose blocks are
/// `block_bytes` long; returns its payload.
pub fn decode(
    file: Vec<u8>,
    fingerprint: &[u8; 32],
    hash: BlockHash,
    block_bytes: usize,
) -> Result<Vec<u8>, String> {
    if file.len() < HEADER {
        return Err(format!(
            "truncated: {} bytes, shorter than the header",
            file.len()
        ));
    }
    let (header, payload) = file.split_at(HEADER);
    if &header[..8] != MAGIC {
        return Err("not a Ferrum KV block file (bad magic)".into());
    }
    let version = u32::from_le_bytes(header[8..12].try_into().unwrap_or_default());
    if version != VERSION {
        return Err(format!("format version {version}, not {VERSION}"));
    }
    if &header[12..44] != fingerprint {
        return Err("written for another model or cache layout (fingerprint differs)".into());
    }
    if header[44..60] != hash.to_bytes() {
        return Err("holds another block (hash differs from its name)".into());
    }
    let len = u64::from_le_bytes(header[60..68].try_into().unwrap_or_default());
    if len != block_bytes as u64 || payload.len() != block_bytes {
        return Err(format!(
            "payload of {} bytes (header says {len}), the cache's blocks are {block_bytes}",
            payload.len()
        ));
    }
    if Sha256::digest(payload).as_slice() != &header[68..100] {
        return Err("checksum mismatch (the payload is corrupt)".into());
    }
    let mut file = file;
    file.drain(..HEADER);
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_damage_is_caught_and_named() {
        let fp = [7u8; 32];
        let h = BlockHash(0xabc);
        let payload: Vec<u8> = (0..64u8).collect();
        let file = encode(&fp, h, &payload);
        assert_eq!(file.len(), HEADER + 64);
        assert_eq!(decode(file.clone(), &fp, h, 64), Ok(payload.clone()));
        let err = |f: Vec<u8>, fp: &[u8; 32], h, n| decode(f, fp, h, n).unwrap_err();
        assert!(err(file[..50].to_vec(), &fp, h, 64).contains("truncated"));
        assert!(err(file[..HEADER + 10].to_vec(), &fp, h, 64).contains("payload of 10"));
        assert!(err(file.clone(), &[8u8; 32], h, 64).contains("fingerprint"));
        assert!(err(file.clone(), &fp, BlockHash(1), 64).contains("another block"));
        assert!(err(file.clone(), &fp, h, 32).contains("the cache's blocks are 32"));
        let mut flipped = file.clone();
        flipped[HEADER + 5] ^= 1;
        assert!(err(flipped, &fp, h, 64).contains("checksum"));
        let mut magic = file.clone();
        magic[0] = b'X';
        assert!(err(magic, &fp, h, 64).contains("magic"));
        let mut version = file;
        version[8] = 9;
        assert!(err(version, &fp, h, 64).contains("version 9"));
    }
}
