//! Chained hashes of full KV blocks: a block's hash covers its parent's hash and its own token
//! ids, so equal hashes mean equal whole prefixes.
//!
//! The hash is specified, so it is the same in every process, build and machine (the disk
//! tier keys its files by it across restarts): the first 16 bytes, big-endian, of
//!
//! ```text
//! SHA-256("ferrum.kv.block.v1" || parent || ids)
//! ```
//!
//! where `parent` is a byte 0 for the first block, else a byte 1 and the parent's 16 bytes,
//! and `ids` the block's token ids as 4-byte little-endian integers. 128 bits of SHA-256 make
//! an accidental collision, which would silently reuse wrong K/V, practically impossible.

use ferrum_types::TokenId;
use sha2::{Digest, Sha256};

/// The identity of a full block together with everything before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u128);

impl BlockHash {
    /// The hash as 32 lowercase hex digits (the disk tier's file names).
    pub fn to_hex(self) -> String {
        format!("{:032x}", self.0)
    }

    /// Reads [`BlockHash::to_hex`]'s form back.
    pub fn from_hex(s: &str) -> Option<BlockHash> {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u128::from_str_radix(s, 16).ok().map(BlockHash)
    }

    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }
}

/// Domain of the hash: changes if the definition ever changes.
const DOMAIN: &[u8] = b"ferrum.kv.block.v1";

/// Hash of a full block of `tokens` following the block hashed `parent` (None for the first).
pub fn hash_block(parent: Option<BlockHash>, tokens: &[TokenId]) -> BlockHash {
    let mut h = Sha256::new();
    h.update(DOMAIN);
    match parent {
        None => h.update([0u8]),
        Some(p) => {
            h.update([1u8]);
            h.update(p.to_bytes());
        }
    }
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    let d = h.finalize();
    let mut first = [0u8; 16];
    first.copy_from_slice(&d[..16]);
    BlockHash(u128::from_be_bytes(first))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, computed independently (coreutils' `sha256sum` and Python's `hashlib`
    /// over the bytes the module docs spell out); a change here orphans every disk tier
    /// written before it.
    #[test]
    fn the_hash_is_as_specified() {
        let first = hash_block(None, &[1, 2]);
        assert_eq!(first.to_hex(), "a61598731e51b934daaa14107099ef09");
        let second = hash_block(Some(first), &[3]);
        assert_eq!(second.to_hex(), "56518d3318987bc2dee14f2a363c93d9");
        assert_eq!(BlockHash::from_hex(&second.to_hex()), Some(second));
        assert_eq!(BlockHash::from_hex("xyz"), None);
        assert_ne!(hash_block(None, &[1, 2]), hash_block(None, &[2, 1]));
    }
}
