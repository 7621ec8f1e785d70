//! The physical paged KV cache: per layer, one key and one value buffer of
//! `[num_blocks, num_kv_heads, ...]` elements of the config's `kv_cache_dtype` (f32, f16 or
//! bf16; keys transposed within a block, see `ferrum_runtime::cpu::paged_attention`), allocated
//! once. Block ids in a [`crate::ForwardBatch`] index the first dimension; which block belongs
//! to which sequence is the scheduler's business, not the cache's.

use crate::{ModelConfig, ModelError, Result};
use ferrum_runtime::cpu::{zeroed_vec, KvDtype, KvElem, KvLayerMut, MAX_BLOCK_SIZE};
use half::{bf16, f16};

/// Every layer's key and value buffers, in one element type.
#[derive(Debug)]
enum Layers {
    F32(Vec<(Vec<f32>, Vec<f32>)>),
    F16(Vec<(Vec<f16>, Vec<f16>)>),
    Bf16(Vec<(Vec<bf16>, Vec<bf16>)>),
}

/// `layers` pairs of zeroed (untouched) buffers of `len` elements.
fn zeroed_layers<E: KvElem>(layers: usize, len: usize) -> Vec<(Vec<E>, Vec<E>)> {
    (0..layers)
        .map(|_| (zeroed_vec(len), zeroed_vec(len)))
        .collect()
}

/// (address, bytes) of each buffer.
fn spans<E>(layers: &[(Vec<E>, Vec<E>)]) -> Vec<(usize, usize)> {
    layers
        .iter()
        .flat_map(|(k, v)| [k, v])
        .map(|b| (b.as_ptr() as usize, std::mem::size_of_val(b.as_slice())))
        .collect()
}

/// Key and value storage for every layer.
#[derive(Debug)]
pub struct KvCache {
    num_blocks: usize,
    block_size: usize,
    num_kv_heads: usize,
    head_dim: usize,
    num_layers: usize,
    layers: Layers,
}

impl KvCache {
    /// Bytes one block takes across all layers (keys and values).
    pub fn bytes_per_block(config: &ModelConfig, block_size: usize) -> usize {
        2 * config.num_hidden_layers
            * config.num_key_value_heads
            * block_size
            * config.head_dim
            * config.kv_cache_dtype.size()
    }

    /// A cache of `num_blocks` blocks of `block_size` token slots for `config`'s layers.
    pub fn new(config: &ModelConfig, num_blocks: usize, block_size: usize) -> Result<KvCache> {
        if block_size == 0 || block_size > MAX_BLOCK_SIZE {
            return Err(ModelError::Invalid(format!(
                "block size {block_size} must be between 1 and {MAX_BLOCK_SIZE}"
            )));
        }
        if num_blocks == 0 {
            return Err(ModelError::Invalid(
                "the KV cache needs at least one block".into(),
            ));
        }
        let per_layer = num_blocks
            .checked_mul(block_size * config.num_key_value_heads * config.head_dim)
            .filter(|n| n.checked_mul(8 * config.num_hidden_layers).is_some())
            .ok_or_else(|| {
                ModelError::Invalid(format!("a KV cache of {num_blocks} blocks is too large"))
            })?;
        let n = config.num_hidden_layers;
        let layers = match config.kv_cache_dtype {
            KvDtype::F32 => Layers::F32(zeroed_layers(n, per_layer)),
            KvDtype::F16 => Layers::F16(zeroed_layers(n, per_layer)),
            KvDtype::Bf16 => Layers::Bf16(zeroed_layers(n, per_layer)),
        };
        Ok(KvCache {
            num_blocks,
            block_size,
            num_kv_heads: config.num_key_value_heads,
            head_dim: config.head_dim,
            num_layers: n,
            layers,
        })
    }

    /// The element type of the keys and values.
    pub fn dtype(&self) -> KvDtype {
        match self.layers {
            Layers::F32(_) => KvDtype::F32,
            Layers::F16(_) => KvDtype::F16,
            Layers::Bf16(_) => KvDtype::Bf16,
        }
    }

    /// Makes the whole cache resident, on a background thread (Linux: `madvise` with
    /// `MADV_POPULATE_WRITE`, which faults pages in without touching their contents, so the
    /// engine may use the cache meanwhile). A server's resident size then stays flat while
    /// requests cycle through the blocks, and reaches its full size seconds after start
    /// instead of hours into traffic. Elsewhere, or on kernels without it, pages stay lazy.
    pub fn populate_in_background(&self) {
        #[cfg(target_os = "linux")]
        {
            let ranges = match &self.layers {
                Layers::F32(l) => spans(l),
                Layers::F16(l) => spans(l),
                Layers::Bf16(l) => spans(l),
            };
            let _ = std::thread::Builder::new()
                .name("ferrum-kv-populate".into())
                .spawn(move || {
                    // Idle priority: the kernel's page zeroing must not take a core from the
                    // first requests (it did: 1.3 s TTFT right after start). If the policy
                    // cannot be set, the thread runs at normal priority.
                    let param = libc::sched_param { sched_priority: 0 };
                    // SAFETY: sets the calling thread's own policy from a valid parameter.
                    let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
                    const PAGE: usize = 4096;
                    /// Bytes per call, so the scheduler can step in between: one call is
                    /// not preempted, and with 16 MiB calls the first request's TTFT right
                    /// after start reached 1.5-2.8 s on a memory-starved day (p50 100 ms);
                    /// with 256 KiB it stayed at 150-370 ms. The 2 GiB still fill in ~2 s.
                    const CHUNK: usize = 256 << 10;
                    for (addr, len) in ranges {
                        // Whole pages inside the buffer only.
                        let start = addr.next_multiple_of(PAGE);
                        let end = (addr + len) / PAGE * PAGE;
                        let mut at = start;
                        while at < end {
                            let n = CHUNK.min(end - at);
                            // SAFETY: madvise only changes page tables of a range inside a
                            // live allocation (or fails harmlessly with ENOMEM if the cache
                            // was freed meanwhile); it reads and writes no memory.
                            let r = unsafe {
                                libc::madvise(at as *mut libc::c_void, n, libc::MADV_POPULATE_WRITE)
                            };
                            if r != 0 {
                                return;
                            }
                            at += n;
                        }
                    }
                });
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_layers(&self) -> usize {
        self.num_layers
    }

    /// Whether the cache was built for a model with these attention sizes and element type.
    pub fn fits(&self, config: &ModelConfig) -> bool {
        self.num_layers == config.num_hidden_layers
            && self.num_kv_heads == config.num_key_value_heads
            && self.head_dim == config.head_dim
            && self.dtype() == config.kv_cache_dtype
    }

    /// Key and value buffers of one layer.
    pub fn layer_mut(&mut self, layer: usize) -> KvLayerMut<'_> {
        match &mut self.layers {
            Layers::F32(l) => {
                let (k, v) = &mut l[layer];
                KvLayerMut::F32(k, v)
            }
            Layers::F16(l) => {
                let (k, v) = &mut l[layer];
                KvLayerMut::F16(k, v)
            }
            Layers::Bf16(l) => {
                let (k, v) = &mut l[layer];
                KvLayerMut::Bf16(k, v)
            }
        }
    }
}
