//! Chained hashes of full KV blocks: a block's hash covers its parent's hash and its own token
//! ids, so equal hashes mean equal whole prefixes. 128 bits (two independent 64-bit hashes)
//! make an accidental collision, which would silently reuse wrong K/V, practically impossible.

use ferrum_types::TokenId;
use std::hash::{DefaultHasher, Hash, Hasher};

/// The identity of a full block together with everything before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u128);

/// Hash of a full block of `tokens` following the block hashed `parent` (None for the first).
pub fn hash_block(parent: Option<BlockHash>, tokens: &[TokenId]) -> BlockHash {
    let half = |salt: u64| {
        // `DefaultHasher::new()` has fixed keys: the same input hashes the same in every run.
        let mut h = DefaultHasher::new();
        salt.hash(&mut h);
        parent.hash(&mut h);
        tokens.hash(&mut h);
        h.finish()
    };
    BlockHash(
        (u128::from(half(0x9E37_79B9_7F4A_7C15)) << 64) | u128::from(half(0xC2B2_AE3D_27D4_EB4F)),
    )
}
