//! A GPU cache's blocks to and from the host (`KvCache::{read_block, write_block,
//! start_block_copy}`), on every device present (`common::gpu`): a copy started before a
//! later write reads the block as it was (the write waits for the copy), a finished copy gives
//! `read_block`'s bytes, and a host cache's copy is ready at once.
#![allow(clippy::unwrap_used)]

mod common;

use common::gpu::devices;
use common::*;
use ferrum_models::{load_model_on_gpu, KvCache, LoadOptions};

#[test]
fn block_copies_read_the_block_as_it_was_when_they_started() {
    for gpu in devices() {
        let dev = gpu.lock().describe();
        let model = load_model_on_gpu(&fixtures().join("tiny-llama"), &LoadOptions::default(), gpu)
            .unwrap();
        let mut kv = model.backend().kv_cache(model.config(), 4, 16).unwrap();
        let n = kv.block_bytes();
        let first: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
        let second: Vec<u8> = (0..n).map(|i| (i * 13 % 253) as u8).collect();
        kv.write_block(1, &first).unwrap();
        kv.write_block(2, &second).unwrap();
        let a = kv.start_block_copy(1).unwrap();
        let b = kv.start_block_copy(2).unwrap();
        // Later writes to both blocks: the copies were ordered before them.
        kv.write_block(1, &second).unwrap();
        kv.write_block(2, &first).unwrap();
        let mut polls = 0;
        while !kv.block_copy_done(&b).unwrap() {
            polls += 1;
            assert!(polls < 1_000_000, "{dev}: a block copy never finished");
        }
        assert_eq!(kv.finish_block_copy(b).unwrap(), second, "{dev}: block 2");
        assert_eq!(kv.finish_block_copy(a).unwrap(), first, "{dev}: block 1");
        // A finished copy's buffer serves the next; the bytes are read_block's.
        let c = kv.start_block_copy(1).unwrap();
        let mut read = Vec::new();
        kv.read_block(1, &mut read).unwrap();
        assert_eq!(
            kv.finish_block_copy(c).unwrap(),
            read,
            "{dev}: against read_block"
        );
        assert_eq!(read, second);
        assert!(
            kv.start_block_copy(4).is_err(),
            "{dev}: a block past the cache"
        );
    }
    // A host cache reads at once.
    let model = load(&fixtures().join("tiny-llama"));
    let mut kv = KvCache::new(model.config(), 2, 16).unwrap();
    let bytes: Vec<u8> = (0..kv.block_bytes()).map(|i| i as u8).collect();
    kv.write_block(0, &bytes).unwrap();
    let copy = kv.start_block_copy(0).unwrap();
    assert!(kv.block_copy_done(&copy).unwrap());
    assert_eq!(kv.finish_block_copy(copy).unwrap(), bytes);
}
