//! A GPU cache's blocks to and from the host (`KvCache::{read_block, write_block,
//! start_block_copy, order_block_reuse, finish_block_copy_held, upload_block}`), on every
//! device present (`common::gpu`): a copy started before a later write reads the block as it
//! was (the write is ordered after it by `order_block_reuse`; on the interpreted device, whose
//! copy stream runs as late as it may, the test fails without that call), a finished copy
//! gives `read_block`'s bytes, a held copy goes back into another block by an upload on the
//! main stream, and a host cache's copy is ready at once.
#![allow(clippy::unwrap_used)]

mod common;

use common::gpu::devices;
use common::*;
use ferrum_models::{load_model_on_gpu, KvCache, LoadOptions};
use ferrum_runtime::cpu::KvDtype;

#[test]
fn block_copies_read_the_block_as_it_was_when_they_started() {
    // The fixture's f32 cache, and an fp8 cache (whose blocks carry their rows' scales).
    let fp8 = LoadOptions {
        kv_cache_dtype: Some(KvDtype::Fp8),
        ..Default::default()
    };
    for (gpu, opts) in devices()
        .into_iter()
        .flat_map(|g| [(g.clone(), LoadOptions::default()), (g, fp8.clone())])
    {
        let dev = gpu.lock().describe();
        let model = load_model_on_gpu(&fixtures().join("tiny-llama"), &opts, gpu).unwrap();
        let mut kv = model.backend().kv_cache(model.config(), 4, 16).unwrap();
        let dev = format!("{dev} ({})", kv.layout());
        let n = kv.block_bytes();
        let c = model.config();
        // Keys and values of every layer, and an fp8 cache's f32 scale per slot and KV head.
        let per_row = c.head_dim * kv.dtype().size() + 4 * usize::from(kv.dtype() == KvDtype::Fp8);
        assert_eq!(
            n,
            2 * c.num_hidden_layers * c.num_key_value_heads * 16 * per_row,
            "{dev}"
        );
        let first: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
        let second: Vec<u8> = (0..n).map(|i| (i * 13 % 253) as u8).collect();
        kv.write_block(1, &first).unwrap();
        kv.write_block(2, &second).unwrap();
        let a = kv.start_block_copy(1).unwrap();
        let b = kv.start_block_copy(2).unwrap();
        // Later writes to both blocks, ordered after the copies as the engine orders a step
        // that reuses a block.
        kv.order_block_reuse(&a).unwrap();
        kv.order_block_reuse(&b).unwrap();
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

/// The host tier's round trip: a copy kept as it landed (page-locked) goes back into another
/// block by an asynchronous upload on the main stream, and an upload into a block whose copy
/// is still pending is ordered after that copy.
#[test]
fn held_block_copies_go_back_by_uploads_ordered_after_pending_copies() {
    // The fixture's f32 cache, and an fp8 cache (whose blocks carry their rows' scales).
    let fp8 = LoadOptions {
        kv_cache_dtype: Some(KvDtype::Fp8),
        ..Default::default()
    };
    for (gpu, opts) in devices()
        .into_iter()
        .flat_map(|g| [(g.clone(), LoadOptions::default()), (g, fp8.clone())])
    {
        let dev = gpu.lock().describe();
        let model = load_model_on_gpu(&fixtures().join("tiny-llama"), &opts, gpu).unwrap();
        let mut kv = model.backend().kv_cache(model.config(), 4, 16).unwrap();
        let dev = format!("{dev} ({})", kv.layout());
        let n = kv.block_bytes();
        let c = model.config();
        // Keys and values of every layer, and an fp8 cache's f32 scale per slot and KV head.
        let per_row = c.head_dim * kv.dtype().size() + 4 * usize::from(kv.dtype() == KvDtype::Fp8);
        assert_eq!(
            n,
            2 * c.num_hidden_layers * c.num_key_value_heads * 16 * per_row,
            "{dev}"
        );
        let first: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
        let second: Vec<u8> = (0..n).map(|i| (i * 13 % 253) as u8).collect();
        kv.write_block(1, &second).unwrap();
        let held = kv.start_block_copy(1).unwrap();
        let held = kv.finish_block_copy_held(held).unwrap();
        assert!(held.footprint() >= n, "{dev}: a held block's memory");
        let mut bytes = Vec::new();
        kv.host_block_bytes(&held, &mut bytes).unwrap();
        assert_eq!(bytes, second, "{dev}: a held block's bytes");
        // Block 0 holds `first`; its copy is pending when the upload of `second` is issued.
        kv.write_block(0, &first).unwrap();
        let pending = kv.start_block_copy(0).unwrap();
        kv.order_block_reuse(&pending).unwrap();
        kv.upload_block(0, &held).unwrap();
        kv.read_block(0, &mut bytes).unwrap();
        assert_eq!(bytes, second, "{dev}: the uploaded block");
        assert_eq!(
            kv.finish_block_copy(pending).unwrap(),
            first,
            "{dev}: the copy pending before the upload"
        );
        // The held block's memory serves later copies once given back.
        kv.recycle_host_block(held);
        let again = kv.start_block_copy(0).unwrap();
        assert_eq!(kv.finish_block_copy(again).unwrap(), second, "{dev}: reuse");
        let h = kv_held(&mut kv);
        assert!(kv.upload_block(4, &h).is_err(), "{dev}: past the cache");
        kv.recycle_host_block(h);
    }
    // A host cache's held block is its bytes; uploading one writes them.
    let model = load(&fixtures().join("tiny-llama"));
    let mut kv = KvCache::new(model.config(), 2, 16).unwrap();
    let bytes: Vec<u8> = (0..kv.block_bytes()).map(|i| (i % 199) as u8).collect();
    kv.write_block(0, &bytes).unwrap();
    let copy = kv.start_block_copy(0).unwrap();
    let held = kv.finish_block_copy_held(copy).unwrap();
    kv.upload_block(1, &held).unwrap();
    let mut read = Vec::new();
    kv.read_block(1, &mut read).unwrap();
    assert_eq!(read, bytes);
    let short = ferrum_models::HostBlock::from_bytes(vec![0; 3]);
    assert!(
        kv.upload_block(1, &short).is_err(),
        "a block of the wrong size"
    );
}

/// A held copy of block 0.
fn kv_held(kv: &mut KvCache) -> ferrum_models::HostBlock {
    let c = kv.start_block_copy(0).unwrap();
    kv.finish_block_copy_held(c).unwrap()
}
