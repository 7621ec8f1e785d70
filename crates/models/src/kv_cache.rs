//! The physical paged KV cache: per layer, one key and one value buffer of the config's
//! `kv_cache_dtype` (f32, f16, bf16 or int8), allocated once. In host memory (the CPU backend)
//! each is `[num_blocks, num_kv_heads, ...]` with keys transposed within a block (see
//! `ferrum_runtime::cpu::paged_attention`); an int8 cache also holds the f16 scales of each
//! row's groups of 32 keys and values, `[num_blocks, num_kv_heads, groups, block_size]` each
//! (host memory only); on a GPU (made by the CUDA backend) each is
//! `[num_blocks * block_size, num_kv_heads, head_dim]`, one row per slot (f32, f16, bf16, or
//! fp8 with each row's f32 scale in `[num_blocks * block_size, num_kv_heads]` buffers beside
//! the keys and values). Block ids in a [`crate::ForwardBatch`] index the first dimension; which block belongs
//! to which sequence is the scheduler's business, not the cache's.

use crate::{ModelConfig, ModelError, Result};
use ferrum_runtime::cpu::{zeroed_vec, KvDtype, KvElem, KvLayerMut, MAX_BLOCK_SIZE};
use ferrum_runtime::cuda::{DeviceBuffer, DevicePtr, SharedGpu};
use half::{bf16, f16};

/// Every layer's key and value buffers, in one element type.
#[derive(Debug)]
enum Layers {
    F32(Vec<(Vec<f32>, Vec<f32>)>),
    F16(Vec<(Vec<f16>, Vec<f16>)>),
    Bf16(Vec<(Vec<bf16>, Vec<bf16>)>),
    Int8(Vec<ScaledLayer>),
    /// In a GPU's memory.
    Device(KvDtype, SharedGpu, Vec<DeviceLayer>),
}

/// One layer of a GPU cache: keys and values, and for an fp8 cache their rows' scales
/// (`[num_slots, num_kv_heads]` f32 each).
#[derive(Debug)]
struct DeviceLayer {
    k: DeviceBuffer,
    v: DeviceBuffer,
    scales: Option<(DeviceBuffer, DeviceBuffer)>,
}

/// A GPU cache layer's device memory, as kernels take it: keys, values, and an fp8 cache's
/// key and value scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceKvLayer {
    pub k: DevicePtr,
    pub v: DevicePtr,
    pub scales: Option<(DevicePtr, DevicePtr)>,
}

/// One layer of an int8 cache: keys and values as the float types hold them, and the scales
/// of each (block, KV head, slot)'s key and value groups.
#[derive(Debug)]
struct ScaledLayer {
    k: Vec<i8>,
    v: Vec<i8>,
    k_scales: Vec<f16>,
    v_scales: Vec<f16>,
}

impl ScaledLayer {
    /// A zeroed (untouched) layer of `len` elements per buffer, rows of `head_dim`.
    fn zeroed(len: usize, head_dim: usize) -> ScaledLayer {
        let scales = len / head_dim.max(1) * KvDtype::Int8.scales_per_row(head_dim);
        ScaledLayer {
            k: zeroed_vec(len),
            v: zeroed_vec(len),
            k_scales: zeroed_vec(scales),
            v_scales: zeroed_vec(scales),
        }
    }

    /// Keys, key scales, values, value scales: the order of a block's bytes.
    fn parts_mut(&mut self) -> [(*mut u8, usize); 4] {
        fn raw<E>(b: &mut [E]) -> (*mut u8, usize) {
            (b.as_mut_ptr() as *mut u8, std::mem::size_of_val(b))
        }
        [
            raw(&mut self.k),
            raw(&mut self.k_scales),
            raw(&mut self.v),
            raw(&mut self.v_scales),
        ]
    }
}

/// `layers` pairs of zeroed (untouched) buffers of `len` elements.
fn zeroed_layers<E: KvElem>(layers: usize, len: usize) -> Vec<(Vec<E>, Vec<E>)> {
    (0..layers)
        .map(|_| (zeroed_vec(len), zeroed_vec(len)))
        .collect()
}

/// (start, bytes) of each buffer, in order: layer by layer, keys then values.
fn buffers_mut<E>(layers: &mut [(Vec<E>, Vec<E>)]) -> Vec<(*mut u8, usize)> {
    layers
        .iter_mut()
        .flat_map(|(k, v)| [k, v])
        .map(|b| {
            (
                b.as_mut_ptr() as *mut u8,
                std::mem::size_of_val(b.as_slice()),
            )
        })
        .collect()
}

/// A device copy's failure, as the model's error.
fn device_err(e: ferrum_runtime::RuntimeError) -> ModelError {
    ModelError::gpu("copying a KV block", e)
}

/// Host block `block` of every layer's keys then values, as bytes, into `chunks`.
fn host_blocks<'a, E: KvElem>(
    layers: &[(Vec<E>, Vec<E>)],
    block: usize,
    chunks: &mut impl Iterator<Item = &'a mut [u8]>,
) {
    for (k, v) in layers {
        for buf in [k, v] {
            let Some(dst) = chunks.next() else {
                return;
            };
            let n = dst.len() / std::mem::size_of::<E>();
            dst.copy_from_slice(bytes_of(&buf[block * n..(block + 1) * n]));
        }
    }
}

/// The reverse of [`host_blocks`].
fn host_blocks_mut<'a, E: KvElem>(
    layers: &mut [(Vec<E>, Vec<E>)],
    block: usize,
    chunks: &mut impl Iterator<Item = &'a [u8]>,
) {
    for (k, v) in layers {
        for buf in [k, v] {
            let Some(src) = chunks.next() else {
                return;
            };
            let n = src.len() / std::mem::size_of::<E>();
            bytes_of_mut(&mut buf[block * n..(block + 1) * n]).copy_from_slice(src);
        }
    }
}

/// A slice of KV elements (or scales) as its bytes.
fn bytes_of<E: KvElem>(s: &[E]) -> &[u8] {
    // SAFETY: KV elements (f32, f16, bf16, i8) are plain data without padding; the byte view
    // covers exactly the slice's memory and lives no longer than it.
    unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, std::mem::size_of_val(s)) }
}

fn bytes_of_mut<E: KvElem>(s: &mut [E]) -> &mut [u8] {
    // SAFETY: as in `bytes_of`; every bit pattern is a valid f32, f16, bf16 or i8.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut u8, std::mem::size_of_val(s)) }
}

/// A GPU cache's device and one block's ranges of device memory (address, bytes), in
/// [`KvCache::read_block`]'s order.
pub(crate) type DeviceBlock = (SharedGpu, Vec<(DevicePtr, usize)>);

/// Key and value storage for every layer.
#[derive(Debug)]
pub struct KvCache {
    num_blocks: usize,
    block_size: usize,
    num_kv_heads: usize,
    head_dim: usize,
    num_layers: usize,
    layers: Layers,
    /// A GPU cache's copies of blocks to the host ([`KvCache::start_block_copy`]), made at
    /// the first.
    pub(crate) copier: Option<crate::kv_copy::Copier>,
}

impl KvCache {
    /// Bytes one block takes across all layers (keys and values).
    pub fn bytes_per_block(config: &ModelConfig, block_size: usize) -> usize {
        2 * config.num_hidden_layers
            * config.num_key_value_heads
            * block_size
            * config.kv_cache_dtype.row_bytes(config.head_dim)
    }

    /// A line for the operator when `config`'s cache costs its model measurably more than the
    /// cache type's rounding suggests, `None` otherwise: an fp8 cache on a model with biased
    /// key projections (the Qwen2 family), whose keys carry large components that e4m3's 3
    /// mantissa bits round by up to 6% (`benchmarks/fp8_kv_emulated.py` measures it).
    pub fn quality_note(config: &ModelConfig) -> Option<String> {
        (config.kv_cache_dtype == KvDtype::Fp8 && config.attention_bias).then(|| {
            "--kv-cache-dtype fp8 on a model with biased key projections (the Qwen2 family): \
             e4m3 rounds its large key components coarsely (Qwen2.5-Coder-1.5B: perplexity +37%, \
             fp8 values alone +0%); bf16 or f16 keeps the model's quality"
                .to_string()
        })
    }

    /// A cache of `num_blocks` blocks of `block_size` token slots for `config`'s layers.
    pub fn new(config: &ModelConfig, num_blocks: usize, block_size: usize) -> Result<KvCache> {
        let per_layer = Self::check(config, num_blocks, block_size)?;
        let n = config.num_hidden_layers;
        let layers = match config.kv_cache_dtype {
            KvDtype::Fp8 => {
                return Err(ModelError::Invalid(
                    "--kv-cache-dtype fp8 is a GPU cache (its attention runs in the GPU \
                     kernels); a CPU model's quantized cache is int8"
                        .into(),
                ))
            }
            KvDtype::F32 => Layers::F32(zeroed_layers(n, per_layer)),
            KvDtype::F16 => Layers::F16(zeroed_layers(n, per_layer)),
            KvDtype::Bf16 => Layers::Bf16(zeroed_layers(n, per_layer)),
            KvDtype::Int8 => Layers::Int8(
                (0..n)
                    .map(|_| ScaledLayer::zeroed(per_layer, config.head_dim))
                    .collect(),
            ),
        };
        Ok(Self::with_layers(config, num_blocks, block_size, layers))
    }

    /// The same cache in `gpu`'s memory, for a model on that GPU. Its contents start
    /// undefined: attention reads a slot only after the step that writes it.
    pub fn new_on_gpu(
        config: &ModelConfig,
        num_blocks: usize,
        block_size: usize,
        gpu: &SharedGpu,
    ) -> Result<KvCache> {
        let per_layer = Self::check(config, num_blocks, block_size)?;
        if config.kv_cache_dtype == KvDtype::Int8 {
            return Err(ModelError::Invalid(
                "--kv-cache-dtype int8 is a CPU cache (its attention runs on the CPU); a GPU \
                 model's cache is f32, f16, bf16 or fp8"
                    .into(),
            ));
        }
        let dtype = config.kv_cache_dtype;
        let bytes = per_layer * dtype.size();
        let scale_bytes = per_layer / config.head_dim.max(1)
            * dtype.scales_per_row(config.head_dim)
            * dtype.scale_bytes();
        let mut buffers = Vec::with_capacity(config.num_hidden_layers);
        for layer in 0..config.num_hidden_layers {
            let alloc = |bytes: usize| {
                gpu.alloc(bytes).map_err(|e| {
                    ModelError::Invalid(format!(
                        "allocating the KV cache ({num_blocks} blocks of {block_size}, \
                         {bytes} bytes per buffer) at layer {layer}: {e}"
                    ))
                })
            };
            let scales = if scale_bytes > 0 {
                Some((alloc(scale_bytes)?, alloc(scale_bytes)?))
            } else {
                None
            };
            buffers.push(DeviceLayer {
                k: alloc(bytes)?,
                v: alloc(bytes)?,
                scales,
            });
        }
        let layers = Layers::Device(config.kv_cache_dtype, gpu.clone(), buffers);
        Ok(Self::with_layers(config, num_blocks, block_size, layers))
    }

    fn with_layers(
        config: &ModelConfig,
        num_blocks: usize,
        block_size: usize,
        layers: Layers,
    ) -> KvCache {
        KvCache {
            num_blocks,
            block_size,
            num_kv_heads: config.num_key_value_heads,
            head_dim: config.head_dim,
            num_layers: config.num_hidden_layers,
            layers,
            copier: None,
        }
    }

    /// Checks the sizes; returns the elements of one layer's key (or value) buffer.
    fn check(config: &ModelConfig, num_blocks: usize, block_size: usize) -> Result<usize> {
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
        Ok(per_layer)
    }

    /// The element type of the keys and values.
    pub fn dtype(&self) -> KvDtype {
        match self.layers {
            Layers::F32(_) => KvDtype::F32,
            Layers::F16(_) => KvDtype::F16,
            Layers::Bf16(_) => KvDtype::Bf16,
            Layers::Int8(_) => KvDtype::Int8,
            Layers::Device(dtype, ..) => dtype,
        }
    }

    /// Whether the cache lives in a GPU's memory.
    pub fn is_on_gpu(&self) -> bool {
        matches!(self.layers, Layers::Device(..))
    }

    /// Makes the next part of the cache resident: `max_bytes` (rounded up to whole pages) from
    /// position `from` of its buffers' whole pages taken in order (layer by layer, keys then
    /// values), by writing back the first byte of each page: the write fault gives the page its
    /// memory, and contents stay as they are. Returns where the next call starts, `None`
    /// once everything is resident.
    ///
    /// A server's engine calls it while idle, a slice at a time between checks for requests,
    /// so the cache is resident seconds after start and the resident size stays flat under
    /// load. Page faults leave the address-space lock alone. (`madvise(MADV_POPULATE_WRITE)`
    /// holds that lock for a whole call: first on a background thread at idle priority, then
    /// from this loop, the first request after start waited 170-270 ms for its first token
    /// behind it, against 7-30 ms without; its HTTP thread sat in the lock's write path.)
    pub fn populate(&mut self, from: usize, max_bytes: usize) -> Option<usize> {
        const PAGE: usize = 4096;
        let ranges = match &mut self.layers {
            Layers::F32(l) => buffers_mut(l),
            Layers::F16(l) => buffers_mut(l),
            Layers::Bf16(l) => buffers_mut(l),
            Layers::Int8(l) => l.iter_mut().flat_map(ScaledLayer::parts_mut).collect(),
            // Device memory is resident from its allocation.
            Layers::Device(..) => return None,
        };
        let mut left = max_bytes.max(1).next_multiple_of(PAGE);
        let (mut at, mut skip) = (from, from);
        for (ptr, len) in ranges {
            // Whole pages inside the buffer only: their count is a multiple of the page.
            let first = ptr.align_offset(PAGE).min(len);
            let pages = (len - first) / PAGE * PAGE;
            if skip >= pages {
                skip -= pages;
                continue;
            }
            let n = (pages - skip).min(left);
            for off in (first + skip..first + skip + n).step_by(PAGE) {
                // SAFETY: `off < len` (whole pages of the buffer), and `&mut self` excludes
                // every other access meanwhile. Volatile: the compiler must keep the store.
                unsafe {
                    let p = ptr.add(off);
                    p.write_volatile(p.read_volatile());
                }
            }
            (at, left, skip) = (at + n, left - n, 0);
            if left == 0 {
                return Some(at);
            }
        }
        None
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// How a block's bytes are laid out ([`KvCache::read_block`]): the element type and the
    /// in-block order, which differs between the host (keys transposed) and a GPU (one row
    /// per slot). K/V written in one layout means nothing in another.
    pub fn layout(&self) -> String {
        let order = if self.is_on_gpu() {
            "slot-rows"
        } else {
            "host-blocks"
        };
        format!("{order}/{}", self.dtype().name())
    }

    /// Bytes of one block across layers: what [`KvCache::read_block`] gives.
    pub fn block_bytes(&self) -> usize {
        2 * self.num_layers * (self.block_region() + self.scale_region())
    }

    /// Bytes of one block in one key (or value) buffer.
    fn block_region(&self) -> usize {
        self.block_size * self.num_kv_heads * self.head_dim * self.dtype().size()
    }

    /// Bytes of one block's key (or value) scales (int8: f16, fp8: f32): none for the float
    /// types.
    fn scale_region(&self) -> usize {
        let dtype = self.dtype();
        self.block_size
            * self.num_kv_heads
            * dtype.scales_per_row(self.head_dim)
            * dtype.scale_bytes()
    }

    /// A GPU cache's block `block` as device ranges (address, bytes), in
    /// [`KvCache::read_block`]'s order: per layer, keys, (key scales,) values, (value scales).
    fn device_ranges(&self, l: &[DeviceLayer], block: usize) -> Result<Vec<(DevicePtr, usize)>> {
        let (region, scales) = (self.block_region(), self.scale_region());
        let mut parts = Vec::with_capacity(4 * l.len());
        for layer in l {
            let (ks, vs) = layer
                .scales
                .as_ref()
                .map_or((None, None), |s| (Some(&s.0), Some(&s.1)));
            for (buf, scale) in [(&layer.k, ks), (&layer.v, vs)] {
                parts.push((buf.at(block * region).map_err(device_err)?, region));
                if let Some(s) = scale {
                    parts.push((s.at(block * scales).map_err(device_err)?, scales));
                }
            }
        }
        Ok(parts)
    }

    /// One block's byte ranges in an int8 layer's buffers, in block order: keys, key scales,
    /// values, value scales.
    fn scaled_ranges(&self, block: usize) -> [std::ops::Range<usize>; 4] {
        let (r, s) = (self.block_region(), self.scale_region());
        [
            block * r..(block + 1) * r,
            block * s..(block + 1) * s,
            block * r..(block + 1) * r,
            block * s..(block + 1) * s,
        ]
    }

    fn check_block(&self, block: usize) -> Result<()> {
        if block >= self.num_blocks {
            return Err(ModelError::Invalid(format!(
                "block {block} is outside the KV cache's {} blocks",
                self.num_blocks
            )));
        }
        Ok(())
    }

    /// Block `block`'s K/V, every layer's keys then values in turn (an int8 or fp8 layer's
    /// keys, key scales, values, value scales), into `out` (replacing its contents):
    /// [`KvCache::block_bytes`] bytes, in [`KvCache::layout`]. On a GPU the copy waits for the
    /// work already issued.
    pub fn read_block(&self, block: usize, out: &mut Vec<u8>) -> Result<()> {
        self.check_block(block)?;
        let region = self.block_region();
        out.clear();
        out.resize(self.block_bytes(), 0);
        if let Layers::Int8(l) = &self.layers {
            let ranges = self.scaled_ranges(block);
            let mut at = 0;
            for layer in l {
                let parts = [
                    bytes_of(&layer.k),
                    bytes_of(&layer.k_scales),
                    bytes_of(&layer.v),
                    bytes_of(&layer.v_scales),
                ];
                for (part, r) in parts.into_iter().zip(ranges.clone()) {
                    out[at..at + r.len()].copy_from_slice(&part[r.clone()]);
                    at += r.len();
                }
            }
            return Ok(());
        }
        if let Layers::Device(_, gpu, l) = &self.layers {
            let ranges = self.device_ranges(l, block)?;
            let mut g = gpu.lock();
            let mut at = 0;
            for (ptr, len) in ranges {
                g.read(ptr, &mut out[at..at + len]).map_err(device_err)?;
                at += len;
            }
            return Ok(());
        }
        let mut chunks = out.chunks_exact_mut(region);
        match &self.layers {
            Layers::F32(l) => host_blocks(l, block, &mut chunks),
            Layers::F16(l) => host_blocks(l, block, &mut chunks),
            Layers::Bf16(l) => host_blocks(l, block, &mut chunks),
            // Copied above.
            Layers::Int8(_) => {}
            // Copied above.
            Layers::Device(..) => {}
        }
        Ok(())
    }

    /// A GPU cache's device, and block `block`'s ranges in [`KvCache::read_block`]'s order;
    /// `None` for a host cache.
    pub(crate) fn device_block_parts(&self, block: usize) -> Result<Option<DeviceBlock>> {
        self.check_block(block)?;
        let Layers::Device(_, gpu, l) = &self.layers else {
            return Ok(None);
        };
        Ok(Some((gpu.clone(), self.device_ranges(l, block)?)))
    }

    /// Writes a block's K/V as [`KvCache::read_block`] gave it. The length must match.
    pub fn write_block(&mut self, block: usize, data: &[u8]) -> Result<()> {
        self.check_block(block)?;
        if data.len() != self.block_bytes() {
            return Err(ModelError::Invalid(format!(
                "a KV block of {} bytes for a cache whose blocks are {} bytes",
                data.len(),
                self.block_bytes()
            )));
        }
        let region = self.block_region();
        let ranges = self.scaled_ranges(block);
        if let Layers::Int8(l) = &mut self.layers {
            let mut at = 0;
            for layer in l {
                let parts = [
                    bytes_of_mut(&mut layer.k),
                    bytes_of_mut(&mut layer.k_scales),
                    bytes_of_mut(&mut layer.v),
                    bytes_of_mut(&mut layer.v_scales),
                ];
                for (part, r) in parts.into_iter().zip(ranges.clone()) {
                    part[r.clone()].copy_from_slice(&data[at..at + r.len()]);
                    at += r.len();
                }
            }
            return Ok(());
        }
        if let Layers::Device(_, gpu, l) = &self.layers {
            let ranges = self.device_ranges(l, block)?;
            let mut g = gpu.lock();
            let mut at = 0;
            for (ptr, len) in ranges {
                g.write(ptr, &data[at..at + len]).map_err(device_err)?;
                at += len;
            }
            return Ok(());
        }
        let mut chunks = data.chunks_exact(region);
        match &mut self.layers {
            Layers::F32(l) => host_blocks_mut(l, block, &mut chunks),
            Layers::F16(l) => host_blocks_mut(l, block, &mut chunks),
            Layers::Bf16(l) => host_blocks_mut(l, block, &mut chunks),
            // Copied above.
            Layers::Int8(_) => {}
            // Copied above.
            Layers::Device(..) => {}
        }
        Ok(())
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

    /// Key and value buffers of one layer, in host memory.
    pub fn layer_mut(&mut self, layer: usize) -> Result<KvLayerMut<'_>> {
        Ok(match &mut self.layers {
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
            Layers::Int8(l) => {
                let s = &mut l[layer];
                KvLayerMut::Int8(&mut s.k, &mut s.v, &mut s.k_scales, &mut s.v_scales)
            }
            Layers::Device(..) => {
                return Err(ModelError::Invalid(
                    "this KV cache is in a GPU's memory; the model runs on the CPU".into(),
                ))
            }
        })
    }

    /// Key and value buffers of one layer (and an fp8 cache's scales), in a GPU's memory.
    pub fn device_layer(&self, layer: usize) -> Result<DeviceKvLayer> {
        match &self.layers {
            Layers::Device(_, _, l) => l
                .get(layer)
                .map(|d| DeviceKvLayer {
                    k: d.k.ptr(),
                    v: d.v.ptr(),
                    scales: d.scales.as_ref().map(|(k, v)| (k.ptr(), v.ptr())),
                })
                .ok_or_else(|| ModelError::Invalid(format!("no KV cache layer {layer}"))),
            _ => Err(ModelError::Invalid(
                "this KV cache is in host memory; the model runs on a GPU".into(),
            )),
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Whether every whole page of each buffer is resident, per buffer (`mincore`).
    fn resident(kv: &mut KvCache) -> Vec<bool> {
        const PAGE: usize = 4096;
        let ranges: Vec<(usize, usize)> = match &mut kv.layers {
            Layers::F32(l) => buffers_mut(l),
            Layers::F16(l) => buffers_mut(l),
            Layers::Bf16(l) => buffers_mut(l),
            Layers::Int8(l) => l.iter_mut().flat_map(ScaledLayer::parts_mut).collect(),
            Layers::Device(..) => unreachable!("a host cache"),
        }
        .into_iter()
        .map(|(p, n)| (p as usize, n))
        .collect();
        ranges
            .into_iter()
            .map(|(addr, len)| {
                let start = addr.next_multiple_of(PAGE);
                let n = ((addr + len) / PAGE * PAGE).saturating_sub(start);
                let mut vec = vec![0u8; n / PAGE];
                // SAFETY: the range is whole pages inside a live buffer; `vec` has a byte per
                // page.
                let r = unsafe { libc::mincore(start as *mut libc::c_void, n, vec.as_mut_ptr()) };
                assert_eq!(r, 0, "mincore");
                vec.iter().all(|v| v & 1 == 1)
            })
            .collect()
    }

    #[test]
    fn populate_makes_every_page_resident_slice_by_slice_and_keeps_contents() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/tiny-llama/config.json");
        let config = ModelConfig::from_hf_file(&dir).expect("config");
        // 64 blocks of 16: each buffer is hundreds of KiB, fresh pages from the system.
        let mut kv = KvCache::new(&config, 64, 16).expect("cache");
        // Fresh buffers are normally not resident yet (unless the allocator reused memory).
        let fresh = resident(&mut kv).iter().filter(|&&r| !r).count();
        match kv.layer_mut(0).expect("host cache") {
            KvLayerMut::F32(k, _) => k[12345] = 1.5,
            KvLayerMut::F16(k, _) => k[12345] = f16::from_f32(1.5),
            KvLayerMut::Bf16(k, _) => k[12345] = bf16::from_f32(1.5),
            KvLayerMut::Int8(..) => unreachable!("the fixture's f32 cache"),
        }
        let slice = 64 << 10;
        let (mut at, mut calls) = (Some(0), 0);
        while let Some(from) = at {
            at = kv.populate(from, slice);
            calls += 1;
            if let Some(next) = at {
                assert_eq!(next, from + slice, "a whole slice per call");
            }
            assert!(calls < 100_000, "populate must end");
        }
        assert!(calls > 2, "several slices: {calls}");
        assert!(
            resident(&mut kv).iter().all(|&r| r),
            "every whole page resident ({fresh} buffers were not before)"
        );
        let kept = match kv.layer_mut(0).expect("host cache") {
            KvLayerMut::F32(k, _) => (k[12345], k.iter().filter(|v| **v != 0.0).count()),
            KvLayerMut::F16(k, _) => (
                k[12345].to_f32(),
                k.iter().filter(|v| v.to_f32() != 0.0).count(),
            ),
            KvLayerMut::Bf16(k, _) => (
                k[12345].to_f32(),
                k.iter().filter(|v| v.to_f32() != 0.0).count(),
            ),
            KvLayerMut::Int8(..) => unreachable!("the fixture's f32 cache"),
        } == (1.5, 1);
        assert!(kept, "contents untouched");
    }
}

#[cfg(test)]
mod block_tests {
    use super::*;

    fn config() -> ModelConfig {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/tiny-llama/config.json");
        ModelConfig::from_hf_file(&path).expect("config")
    }

    /// A block's bytes go out and come back exactly, into the right block only; bad blocks
    /// and lengths are errors.
    #[test]
    fn blocks_round_trip_through_bytes() {
        let mut config = config();
        for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Bf16, KvDtype::Int8] {
            config.kv_cache_dtype = dtype;
            let mut kv = KvCache::new(&config, 4, 8).expect("cache");
            assert_eq!(kv.block_bytes(), KvCache::bytes_per_block(&config, 8));
            assert_eq!(kv.layout(), format!("host-blocks/{}", dtype.name()));
            let data: Vec<u8> = (0..kv.block_bytes()).map(|i| (i * 7 % 251) as u8).collect();
            kv.write_block(2, &data).unwrap();
            let mut out = Vec::new();
            kv.read_block(2, &mut out).unwrap();
            assert_eq!(out, data);
            for other in [0, 1, 3] {
                kv.read_block(other, &mut out).unwrap();
                assert!(out.iter().all(|&b| b == 0), "block {other} untouched");
            }
            assert!(kv.read_block(4, &mut out).is_err());
            assert!(kv.write_block(1, &data[1..]).is_err());
        }
    }
}
