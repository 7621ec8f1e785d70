//! The CUDA backend: the forward's fused operations as launches of the embedded Triton kernels
//! on a [`SharedGpu`] (a real GPU, or the interpreted device in CI).
//!
//! Weights are uploaded once, as stored: f32, f16 and bf16, and GGUF's block formats (Q8_0,
//! Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) decoded inside the product and gather kernels.
//! Activations are f32 in device buffers named
//! by role, grown to the largest batch seen and reused. A batch's indices (token ids,
//! positions, slots, block tables, each token's block-table start, the logits rows) go up in
//! one copy per step. The KV cache is [`KvCache::new_on_gpu`]'s, `[slots, kv_heads, head_dim]`
//! per layer. Logits of the selected rows come back to the host for the sampler.
//!
//! Buffer contents between operations follow [`super::Backend`]'s contract; a launch that
//! fails is an error naming the kernel, and nothing is read back from a failed step.
//!
//! CUDA graphs ([`CudaGraphs::On`]): a decode batch (one token per sequence, one logits row
//! each) of `n` tokens is padded to the next of [`GRAPH_BUCKETS`] by repeating its last token
//! (same id, position, slot and block table: the padding writes the same K/V bytes into the
//! same slot and its rows are never read back). The first step of a bucket runs plainly,
//! sizing every buffer; the second captures the whole forward, embedding to logits, into a
//! graph; later ones upload their indices into the same buffer and replay it. A graph holds
//! addresses, so the graphs are dropped whenever a buffer, the rope tables or the scratch area
//! moves, and keyed by the KV cache they write.

use std::collections::{HashMap, HashSet};

use ferrum_runtime::cpu::{AttentionShape, GatedAct, Rope};
use ferrum_runtime::cuda::{DeviceBuffer, DevicePtr, GraphId, KernelArg, SharedGpu};
use ferrum_runtime::{DType, Tensor};
use ferrum_types::ForwardBatch;

mod overlap;
mod sample;
mod vendor;

pub use overlap::Collected;

use super::{stack_runs, Backend, Buf, Dims, GraphStep, MoeWeights, Outs};
use crate::sampling::{RowSampling, SampledRows};
use crate::{CudaGraphs, KvCache, ModelConfig, ModelError, Result};

/// Decode batch sizes that get a graph each: a batch of `n` sequences pads to the first bucket
/// of at least `n`; larger batches launch plainly.
pub const GRAPH_BUCKETS: [usize; 15] =
    [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256];

/// Products with at most this many activation rows take the decode specializations
/// (`DECODE_M` in `kernels/specs.py`).
const DECODE_M: usize = 16;

/// Products of a half-precision weight with more rows than this take the `_large` tiles
/// (`LARGE_M` in `kernels/specs.py`); from [`DECODE_M`] up, the 32 x 64 tiles.
const LARGE_M: usize = 512;

/// Query tokens per tile of the prefill attention kernel (`PREFILL_M` in `kernels/specs.py`).
const PREFILL_M: usize = 64;

/// Keys per range of split-K decode attention (`paged_attention_split`), at least: a decode
/// token whose context is longer attends in ranges, merged by `attention_combine`.
pub const SPLIT_KEYS: usize = 512;

/// Ranges of split-K decode attention, at most (longer contexts take longer ranges): bounds
/// the partials' buffer (`tokens x heads x 16 x (head_dim + 2)` f32) and the grid.
pub const ATTENTION_RANGES: usize = 16;

/// Split-K decode products (`gemm_*_split`, `qgemm_*_split`): a product of at most 16 rows
/// (`DECODE_M`) whose output tiles make fewer than `programs` programs is cut along `k` into
/// enough ranges to make about that many, each at least `min_k` columns deep and of whole
/// blocks of a block format. How many ranges depends on
/// the weight's shape only, never on the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DecodeSplit {
    pub programs: usize,
    pub min_k: usize,
}

/// About 4 programs per SM of an H100 (132 SMs), each range two decode tiles deep.
pub const DECODE_SPLIT: DecodeSplit = DecodeSplit {
    programs: 512,
    min_k: 512,
};

/// Head sizes the attention and KV kernels are compiled for (`kernels/specs.py`).
const HEAD_BLOCKS: [usize; 4] = [32, 64, 128, 256];

/// A linear weight on the device, `[rows, cols]` as stored.
#[derive(Debug)]
pub struct GpuWeight {
    buf: DeviceBuffer,
    dtype: DType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
}

/// How the kernels read a weight type: a float element type, or a block format.
#[derive(Debug, Clone, Copy)]
enum Form {
    Float(&'static str),
    Blocks(&'static str),
}

fn form(dtype: DType) -> Result<Form> {
    Ok(match dtype {
        DType::F32 => Form::Float("f32"),
        DType::F16 => Form::Float("f16"),
        DType::BF16 => Form::Float("bf16"),
        DType::Q8_0 => Form::Blocks("q8_0"),
        DType::Q4_0 => Form::Blocks("q4_0"),
        DType::Q4_1 => Form::Blocks("q4_1"),
        DType::Q5_0 => Form::Blocks("q5_0"),
        DType::Q5_1 => Form::Blocks("q5_1"),
        DType::Q4_K => Form::Blocks("q4_k"),
        DType::Q5_K => Form::Blocks("q5_k"),
        DType::Q6_K => Form::Blocks("q6_k"),
    })
}

/// An f32 vector on the device.
#[derive(Debug)]
pub struct GpuVector {
    buf: DeviceBuffer,
    len: usize,
}

/// A buffer that grows and is reused.
#[derive(Debug, Default)]
struct Grown {
    buf: Option<DeviceBuffer>,
}

impl Grown {
    /// At least `bytes`, keeping the buffer when it is big enough (contents undefined).
    fn ensure(&mut self, gpu: &SharedGpu, bytes: usize) -> Result<DevicePtr> {
        match &self.buf {
            Some(b) if b.len() >= bytes => Ok(b.ptr()),
            _ => {
                self.buf = None;
                let b = gpu.alloc(bytes.max(256).next_power_of_two())?;
                let ptr = b.ptr();
                self.buf = Some(b);
                Ok(ptr)
            }
        }
    }

    /// [`Grown::ensure`], zero-filled whenever it is (re)allocated: the split-K products'
    /// per-tile counts, which every launch leaves at zero for the next.
    fn ensure_zeroed(&mut self, gpu: &SharedGpu, bytes: usize) -> Result<DevicePtr> {
        let fits = matches!(&self.buf, Some(b) if b.len() >= bytes);
        let ptr = self.ensure(gpu, bytes)?;
        if !fits {
            let len = self.buf.as_ref().map_or(0, DeviceBuffer::len);
            let zero = |e| ModelError::Invalid(format!("zeroing the split-K counts: {e}"));
            gpu.lock().write(ptr, &vec![0u8; len]).map_err(zero)?;
        }
        Ok(ptr)
    }

    fn ptr(&self) -> Result<DevicePtr> {
        self.buf
            .as_ref()
            .map(DeviceBuffer::ptr)
            .ok_or_else(|| ModelError::Invalid("device buffer used before begin".into()))
    }
}

/// Where one batch's indices sit in the index buffer (element offsets of u32). The
/// per-token sections come first and the block tables (whose length varies step to step) last,
/// so a padded decode batch's sections sit at the same offsets every step.
#[derive(Debug, Default, Clone, Copy)]
struct Indices {
    ids: usize,
    positions: usize,
    slots: usize,
    bt_start: usize,
    rows: usize,
    block_tables: usize,
    /// The prefill attention's tiles `(first token, count, block-table start)`, three u32
    /// each, and how many: present when a sequence has more than one query token.
    tiles: Option<(usize, usize)>,
    /// The tokens that attend one at a time, and how many (see [`Backend::begin`]).
    toks: (usize, usize),
    /// The step's pending inputs ([`CudaBackend::set_pending_inputs`]) and the padding's
    /// copies of them: pairs of a token index and the previous step's row, and how many.
    pending: (usize, usize),
}

/// What a graph was captured for: the padded batch size, each rope's frequency set (LongRoPE's
/// long or short), and the KV cache it reads and writes (every layer's addresses, its block
/// size and type: a cache freed and another allocated in its place must not match unless all
/// of them do).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct GraphKey {
    tokens: usize,
    long: Vec<bool>,
    kv: Vec<DevicePtr>,
    /// The cache's block size and element type (launch arguments and kernel choice).
    block_size: usize,
    kv_dtype: &'static str,
    /// The split-K attention's grid depth (a power of two; 1 without splits), its keys per
    /// range, and how decode products split (launch arguments and grids).
    splits: usize,
    split_keys: usize,
    decode_split: DecodeSplit,
}

/// The decode graphs of one backend.
#[derive(Debug, Default)]
struct Graphs {
    mode: CudaGraphs,
    captured: HashMap<GraphKey, GraphId>,
    /// Keys whose first step ran plainly (the capture comes on the second).
    seen: HashSet<GraphKey>,
    /// Keys the driver could not make a graph of: they run plainly.
    refused: HashSet<GraphKey>,
    /// Every address the graphs hold besides weights and KV; a change drops them all.
    addresses: Vec<DevicePtr>,
    /// This step's padded size, when it is a decode batch that pads to a bucket.
    bucket: Option<usize>,
    /// This step's graph: being captured, or replayed.
    step: Option<(GraphKey, GraphStep)>,
    /// Steps replayed and graphs captured, for tests and the benchmark.
    replays: u64,
    captures: u64,
}

/// The Triton kernels on one GPU.
#[derive(Debug)]
pub struct CudaBackend {
    gpu: SharedGpu,
    dims: Dims,
    tokens: usize,
    /// The activation buffers' slots ([`place`]).
    bufs: [Grown; SLOTS],
    /// The normalized input of the next products, `[t, hidden]`.
    normed: Grown,
    /// The selected rows, `[num_logits, hidden]`, and their logits.
    rows: Grown,
    logits: Grown,
    host_logits: Vec<f32>,
    /// An activation buffer on the host, for [`Backend::host_rows`].
    host_act: Vec<f32>,
    indices: Grown,
    host_indices: Vec<u32>,
    host_bytes: Vec<u8>,
    at: Indices,
    num_logits: usize,
    /// Per rope of the forward: its inverse frequencies on the device, and on the host (to
    /// upload again only when they change).
    inv_freq: Vec<UploadedRope>,
    /// Per rope: the batch's tokens in runs `(first, count, long)` of one frequency set
    /// (LongRoPE picks per token; one run otherwise).
    rope_runs: Vec<Vec<(usize, usize, bool)>>,
    /// Logits rows computed on the device: the batch's, or a padded bucket's.
    device_rows: usize,
    graphs: Graphs,
    /// Sampling on the device ([`Backend::sample_rows`]).
    sampling: sample::DeviceSampling,
    /// Keys per range of split-K decode attention, this step's grid depth (1: the tokens
    /// that attend one at a time all fit one range), and the ranges' partial results.
    split_keys: usize,
    /// The one-pass RMSNorm widths the embedded kernels have, narrowest first
    /// ([`CudaBackend::norm_kernel`]).
    norm_widths: Vec<usize>,
    attn_splits: usize,
    attn_part: Grown,
    /// Split-K decode products, and their partial results.
    decode_split: DecodeSplit,
    gemm_part: Grown,
    /// Per output tile of a split-K product, the ranges done so far (i32, zero between
    /// launches): the last range adds the partials.
    split_counts: Grown,
    /// The batch's tokens before padding.
    num_real_tokens: usize,
    /// Deferred results and the inputs that refer to the previous step's tokens.
    overlap: overlap::Overlap,
    /// Products of more than [`DECODE_M`] rows on the vendor library ([`Self::set_gemm`]).
    vendor: vendor::Vendor,
}

/// One rope's frequencies on the device.
#[derive(Debug)]
struct UploadedRope {
    short: (DeviceBuffer, Vec<f32>),
    long: Option<(DeviceBuffer, Vec<f32>)>,
    head_dim: usize,
    mscale: f32,
}

impl UploadedRope {
    /// The frequencies of a run of tokens: LongRoPE's long set when `long` and there is one.
    fn freq(&self, long: bool) -> DevicePtr {
        match (&self.long, long) {
            (Some(l), true) => l.0.ptr(),
            _ => self.short.0.ptr(),
        }
    }
}

/// Slots of device memory the activation buffers live in ([`place`]).
const SLOTS: usize = 5;

/// Where buffer `b` lives: its slot, its first column in the slot's rows, and the slot's row
/// stride (elements). Q, K and V share one slot, `[t, q + 2 kv]`, and Gate and Up one,
/// `[t, 2 intermediate]`: each is a range of columns of its slot's rows, so one product of
/// their stacked weights ([`stack_runs`]) writes them all, and every kernel that reads or
/// writes one of them takes the slot's stride.
fn place(dims: &Dims, b: Buf) -> (usize, usize, usize) {
    let (qkv, gate_up) = (dims.q + 2 * dims.kv, 2 * dims.intermediate);
    match b {
        Buf::X => (0, 0, dims.hidden),
        Buf::H => (1, 0, dims.hidden),
        Buf::Q => (2, 0, qkv),
        Buf::K => (2, dims.q, qkv),
        Buf::V => (2, dims.q + dims.kv, qkv),
        Buf::Attn => (3, 0, dims.q),
        Buf::Gate => (4, 0, gate_up),
        Buf::Up => (4, dims.intermediate, gate_up),
    }
}

fn i32_arg(v: usize, what: &str) -> Result<KernelArg> {
    i32::try_from(v)
        .map(KernelArg::I32)
        .map_err(|_| ModelError::Invalid(format!("{what} {v} exceeds the kernels' 32-bit range")))
}

fn p(ptr: DevicePtr) -> KernelArg {
    KernelArg::Ptr(ptr)
}

fn cdiv(a: usize, b: i64) -> u32 {
    a.div_ceil(b.max(1) as usize) as u32
}

/// Copies `n` 4-byte little-endian words at `ptr` to the host through `bytes` and puts them,
/// each decoded by `word`, into `out` (cleared first); `what` names the copy in an error.
fn read_words<T>(
    gpu: &SharedGpu,
    ptr: DevicePtr,
    n: usize,
    bytes: &mut Vec<u8>,
    out: &mut Vec<T>,
    word: fn([u8; 4]) -> T,
    what: &str,
) -> Result<()> {
    bytes.resize(4 * n, 0);
    gpu.lock()
        .read(ptr, bytes)
        .map_err(|e| ModelError::Invalid(format!("{what}: {e}")))?;
    out.clear();
    out.extend(
        bytes
            .chunks_exact(4)
            .map(|c| word([c[0], c[1], c[2], c[3]])),
    );
    Ok(())
}

impl CudaBackend {
    /// A backend launching on `gpu`, with decode graphs when `graphs` says so.
    pub fn new(gpu: SharedGpu, graphs: CudaGraphs) -> CudaBackend {
        // The one-pass RMSNorm widths this build embeds, narrowest first (both residual forms
        // are built for each).
        let norm_widths = {
            let g = gpu.lock();
            (8..=14)
                .map(|log| 1usize << log)
                .filter(|w| g.spec(&format!("rms_norm_res0_w{w}")).is_some())
                .collect()
        };
        CudaBackend {
            gpu,
            norm_widths,
            dims: Dims::default(),
            tokens: 0,
            bufs: Default::default(),
            normed: Grown::default(),
            rows: Grown::default(),
            logits: Grown::default(),
            host_logits: Vec::new(),
            host_act: Vec::new(),
            indices: Grown::default(),
            host_indices: Vec::new(),
            host_bytes: Vec::new(),
            at: Indices::default(),
            num_logits: 0,
            inv_freq: Vec::new(),
            rope_runs: Vec::new(),
            device_rows: 0,
            graphs: Graphs {
                mode: graphs,
                ..Graphs::default()
            },
            sampling: sample::DeviceSampling::default(),
            split_keys: SPLIT_KEYS,
            attn_splits: 1,
            attn_part: Grown::default(),
            decode_split: DECODE_SPLIT,
            gemm_part: Grown::default(),
            split_counts: Grown::default(),
            num_real_tokens: 0,
            overlap: overlap::Overlap::default(),
            vendor: vendor::Vendor::default(),
        }
    }

    /// Sets the keys per range of split-K decode attention (default [`SPLIT_KEYS`]; at least
    /// 1): a tuning knob, and how tests reach the split path with short contexts.
    pub fn set_attention_split(&mut self, keys: usize) {
        self.split_keys = keys.max(1);
    }

    /// Sets how decode products split along `k` (default [`DECODE_SPLIT`]; `min_k` at least
    /// 1): a tuning knob, and how tests reach the split path with small weights.
    pub fn set_decode_split(&mut self, split: DecodeSplit) {
        self.decode_split = DecodeSplit {
            min_k: split.min_k.max(1),
            ..split
        };
    }

    /// Decode steps replayed from a graph, and graphs captured, so far.
    pub fn graph_counts(&self) -> (u64, u64) {
        (self.graphs.replays, self.graphs.captures)
    }

    /// Every address a captured graph holds besides the weights and the KV cache.
    fn graph_addresses(&self) -> Vec<DevicePtr> {
        let grown = self
            .bufs
            .iter()
            .chain([
                &self.normed,
                &self.rows,
                &self.logits,
                &self.indices,
                &self.attn_part,
                &self.gemm_part,
                &self.split_counts,
            ])
            .map(|g| g.buf.as_ref().map_or(DevicePtr::NULL, DeviceBuffer::ptr));
        let ropes = self.inv_freq.iter().flat_map(|u| {
            [
                u.short.0.ptr(),
                u.long.as_ref().map_or(DevicePtr::NULL, |l| l.0.ptr()),
            ]
        });
        let scratch = self.gpu.lock().scratch_ptr();
        grown.chain(ropes).chain([scratch]).collect()
    }

    /// Drops every captured graph (each one, even after a failure; the first error is
    /// returned) and forgets which keys were seen or refused.
    fn drop_graphs(&mut self) -> Result<()> {
        let mut gpu = self.gpu.lock();
        let mut first = Ok(());
        for (_, g) in self.graphs.captured.drain() {
            if let (Err(e), Ok(())) = (gpu.drop_graph(g), &first) {
                first = Err(e.into());
            }
        }
        self.graphs.seen.clear();
        self.graphs.refused.clear();
        first
    }

    /// The padded size of `batch` when it is a decode batch that fits a bucket.
    fn bucket(&self, batch: &ForwardBatch) -> Option<usize> {
        let t = batch.num_tokens();
        let decode = t > 0
            && batch.seqs.len() == t
            && batch.seqs.iter().all(|s| s.query_len == 1)
            && batch.logits_indices.len() == t
            && batch
                .logits_indices
                .iter()
                .enumerate()
                .all(|(i, &r)| r as usize == i);
        if self.graphs.mode == CudaGraphs::Off || !decode {
            return None;
        }
        GRAPH_BUCKETS.iter().copied().find(|&b| b >= t)
    }

    /// The step's logits on the device, `[device_rows, vocab]` (the first `n` rows the
    /// batch's): the captured graph ended and replayed, the graph replayed, or the head's
    /// launches issued.
    fn step_logits(
        &mut self,
        norm: &GpuVector,
        eps: f32,
        head: &GpuWeight,
        n: usize,
    ) -> Result<()> {
        match self.graphs.step.take() {
            Some((key, GraphStep::Capture)) => {
                let captured = self.device_logits(norm, eps, head, self.device_rows);
                let graph = match captured {
                    Ok(()) => self.gpu.lock().end_capture()?,
                    Err(e) => {
                        self.gpu.lock().abort_capture();
                        return Err(e);
                    }
                };
                match graph {
                    Some(graph) => {
                        self.graphs.captured.insert(key, graph);
                        self.graphs.captures += 1;
                        self.gpu.lock().replay(graph)?;
                    }
                    // No graph could be made: the launches ran plainly; so will this key's.
                    None => {
                        self.graphs.refused.insert(key);
                    }
                }
            }
            Some((key, GraphStep::Replay)) => {
                let graph = self.graphs.captured.get(&key).copied().ok_or_else(|| {
                    ModelError::Invalid("the step's graph was dropped before its replay".into())
                })?;
                self.gpu.lock().replay(graph)?;
                self.graphs.replays += 1;
            }
            _ if n == 0 => {}
            // A padded bucket's first step computes every row its capture will, so the
            // capture finds every buffer and scratch area sized.
            _ => self.device_logits(norm, eps, head, self.device_rows.max(n))?,
        }
        Ok(())
    }

    /// The logits of the first `n` rows of the rows index: gather, norm, head product.
    fn device_logits(
        &mut self,
        norm: &GpuVector,
        eps: f32,
        head: &GpuWeight,
        n: usize,
    ) -> Result<()> {
        let h = self.dims.hidden;
        let r = self.rows.ptr()?;
        let grid = [
            n as u32,
            cdiv(h, self.block("gather_rows_f32", "BLOCK")?),
            1,
        ];
        let args = [
            p(self.buf(Buf::X)?),
            p(self.index(self.at.rows)?),
            p(r),
            i32_arg(h, "hidden size")?,
            i32_arg(h, "row stride")?,
            i32_arg(h, "row stride")?,
            KernelArg::F32(1.0),
        ];
        self.launch("gather_rows_f32", grid, &args)?;
        self.rms_norm(r, None, r, norm, n, 1, h, eps)?;
        self.gemm((r, h), head, (self.logits.ptr()?, head.rows), n)
    }

    /// The device.
    pub fn gpu(&self) -> &SharedGpu {
        &self.gpu
    }

    /// A KV cache for `config` on this backend's GPU.
    pub fn kv_cache(
        &self,
        config: &ModelConfig,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<KvCache> {
        KvCache::new_on_gpu(config, num_blocks, block_size, &self.gpu)
    }

    fn width(&self, buf: Buf) -> usize {
        self.dims.width(buf)
    }

    fn buf(&self, b: Buf) -> Result<DevicePtr> {
        let (slot, column, _) = place(&self.dims, b);
        Ok(self.bufs[slot].ptr()?.offset(4 * column))
    }

    /// Elements from one row of `b` to the next: its slot's ([`place`]).
    fn stride(&self, b: Buf) -> usize {
        place(&self.dims, b).2
    }

    fn index(&self, offset: usize) -> Result<DevicePtr> {
        Ok(self.indices.ptr()?.offset(4 * offset))
    }

    fn launch(&self, name: &str, grid: [u32; 3], args: &[KernelArg]) -> Result<()> {
        self.gpu
            .lock()
            .launch(name, grid, args)
            .map_err(|e| ModelError::Invalid(format!("GPU kernel {name}: {e}")))
    }

    fn block(&self, name: &str, key: &str) -> Result<i64> {
        Ok(self.gpu.lock().constexpr(name, key)?)
    }

    /// The columns per range of a split-K decode product of `w` ([`DecodeSplit`]), when it
    /// splits into two ranges or more.
    fn split_columns(&self, name: &str, w: &GpuWeight) -> Result<Option<usize>> {
        let tiles = w
            .rows
            .div_ceil(self.block(name, "BLOCK_N")?.max(1) as usize);
        let s = self.decode_split;
        let splits = (s.programs / tiles.max(1)).min(w.cols / s.min_k);
        if splits < 2 {
            return Ok(None);
        }
        // Ranges of whole decode tiles (256 columns) where `min_k` allows, and always of whole
        // blocks of a block format.
        let align = s.min_k.min(256).max(w.dtype.block_size());
        let per = w.cols.div_ceil(splits).next_multiple_of(align);
        Ok((w.cols.div_ceil(per) >= 2).then_some(per))
    }

    /// The split-K product kernel of `w`'s type (without the gated suffix).
    fn split_name(w: &GpuWeight) -> Result<String> {
        Ok(match form(w.dtype)? {
            Form::Float(f) => format!("gemm_{f}_split"),
            Form::Blocks(q) => format!("qgemm_{q}_split"),
        })
    }

    /// `y[m, w.rows] = x[m, w.cols] @ w^T` in ranges of `per` columns, one launch: each
    /// range's partial, added in range order into `y` by the last range of its output tile
    /// to finish (one range writes `y` itself). With `gated`, the left operand is
    /// `act(x) * up` (the MLP's down product, from `Gate` and `Up`, `up` at `x`'s stride).
    /// Float and block-format weights alike; a block format's ranges are whole blocks
    /// ([`Self::split_columns`]). `x` and `y` are pointers with their row strides (elements).
    fn gemm_split(
        &mut self,
        ((x, x_stride), (y, y_stride)): ((DevicePtr, usize), (DevicePtr, usize)),
        w: &GpuWeight,
        m: usize,
        per: usize,
        gated: Option<(DevicePtr, GatedAct)>,
    ) -> Result<()> {
        let (n, k) = (w.rows, w.cols);
        let splits = k.div_ceil(per.max(1));
        let (up, suffix) = match gated {
            None => (x, ""),
            Some((up, GatedAct::Silu)) => (up, "_silu"),
            Some((up, GatedAct::GeluTanh)) => (up, "_gelu"),
        };
        let name = format!("{}{suffix}", Self::split_name(w)?);
        let grid = [
            cdiv(m, self.block(&name, "BLOCK_M")?),
            cdiv(n, self.block(&name, "BLOCK_N")?),
            splits as u32,
        ];
        // One range writes `y` and reads neither buffer: `y` stands in for both.
        let (part, counts) = if splits == 1 {
            (y, y)
        } else {
            let tiles = grid[0] as usize * grid[1] as usize;
            (
                self.gemm_part.ensure(&self.gpu, 4 * splits * m * n)?,
                self.split_counts.ensure_zeroed(&self.gpu, 4 * tiles)?,
            )
        };
        let (mm, nn) = (i32_arg(m, "rows")?, i32_arg(n, "weight rows")?);
        let kk = i32_arg(k, "weight columns")?;
        let mut args = vec![
            p(x),
            p(up),
            p(w.buf.ptr()),
            p(part),
            p(y),
            p(counts),
            mm,
            nn,
            kk,
        ];
        if let Form::Blocks(_) = form(w.dtype)? {
            args.push(i32_arg(w.row_bytes, "row bytes")?);
        }
        args.extend([
            i32_arg(x_stride, "row stride")?,
            i32_arg(per, "columns per range")?,
            i32_arg(y_stride, "row stride")?,
            i32_arg(splits, "ranges")?,
        ]);
        let launched = self.launch(&name, grid, &args);
        if launched.is_err() && splits > 1 {
            // Some ranges may have counted and none zeroed: the counts start afresh.
            self.split_counts = Grown::default();
        }
        launched
    }

    /// `y[m, w.rows] = x[m, w.cols] @ w^T`; `x` and `y` are pointers with their row strides
    /// (elements).
    fn gemm(
        &mut self,
        (x, x_stride): (DevicePtr, usize),
        w: &GpuWeight,
        (y, y_stride): (DevicePtr, usize),
        m: usize,
    ) -> Result<()> {
        if m <= DECODE_M {
            if let Some(per) = self.split_columns(&Self::split_name(w)?, w)? {
                return self.gemm_split(((x, x_stride), (y, y_stride)), w, m, per, None);
            }
        } else if self.vendor_gemm((x, x_stride), w, (y, y_stride), m, None)? {
            return Ok(());
        }
        let (xs, ys) = (
            i32_arg(x_stride, "row stride")?,
            i32_arg(y_stride, "row stride")?,
        );
        let (mm, n, k) = (
            i32_arg(m, "rows")?,
            i32_arg(w.rows, "weight rows")?,
            i32_arg(w.cols, "weight columns")?,
        );
        // Decode-shaped products (few rows) take the narrow, deep tiles made for reading the
        // weights at bandwidth with one activation row (kernels/specs.py).
        // Long prefill chunks of a half-precision weight take wide, pipelined tiles.
        let decode = if m <= DECODE_M { "_decode" } else { "" };
        let (name, args) = match form(w.dtype)? {
            Form::Float(f) => (
                match (m, f) {
                    (m, _) if m <= DECODE_M => format!("gemm_{f}_decode"),
                    (m, "f16" | "bf16") if m > LARGE_M => format!("gemm_{f}_large"),
                    _ => format!("gemm_{f}_bias0"),
                },
                vec![
                    p(x),
                    p(w.buf.ptr()),
                    p(DevicePtr::NULL),
                    p(y),
                    mm,
                    n,
                    k,
                    xs,
                    ys,
                ],
            ),
            Form::Blocks(q) => (
                format!("qgemm_{q}{decode}"),
                vec![
                    p(x),
                    p(w.buf.ptr()),
                    p(y),
                    mm,
                    n,
                    k,
                    i32_arg(w.row_bytes, "row bytes")?,
                    xs,
                    ys,
                ],
            ),
        };
        let grid = [
            cdiv(m, self.block(&name, "BLOCK_M")?),
            cdiv(w.rows, self.block(&name, "BLOCK_N")?),
            1,
        ];
        self.launch(&name, grid, &args)
    }

    /// RMSNorm of `groups` groups of `n` per row (out may alias x); with `res`, `res += x`
    /// first and the sum is normalized.
    #[allow(clippy::too_many_arguments)]
    fn rms_norm(
        &self,
        x: DevicePtr,
        res: Option<DevicePtr>,
        out: DevicePtr,
        w: &GpuVector,
        rows: usize,
        groups: usize,
        stride: usize,
        eps: f32,
    ) -> Result<()> {
        let n = w.len;
        let name = self.norm_kernel(n, res.is_some());
        let args = [
            p(x),
            p(res.unwrap_or(DevicePtr::NULL)),
            p(out),
            p(w.buf.ptr()),
            i32_arg(n, "norm width")?,
            i32_arg(stride, "row stride")?,
            i32_arg(stride, "row stride")?,
            i32_arg(stride, "row stride")?,
            KernelArg::F32(eps),
        ];
        self.launch(&name, [rows as u32, groups as u32, 1], &args)
    }

    /// The RMSNorm kernel for rows of `n`: the narrowest one-pass build that holds a row
    /// (`rms_norm_res{r}_w{width}`, the widths `kernels/specs.py` builds), else the two-pass
    /// one. Depends on `n` alone, never on the batch.
    fn norm_kernel(&self, n: usize, residual: bool) -> String {
        let base = format!("rms_norm_res{}", residual as u8);
        match self.norm_widths.iter().find(|&&w| w >= n) {
            Some(w) => format!("{base}_w{w}"),
            None => base,
        }
    }

    /// Split-K decode attention of the tokens that attend one at a time: ranges of
    /// `split_keys` keys in parallel (`paged_attention_split`), then the merge of the tokens
    /// that took several (`attention_combine`). A token's result depends on its context only.
    fn attend_split(
        &mut self,
        (kc, vc): (DevicePtr, DevicePtr),
        kind: &str,
        shape: &AttentionShape,
        d: usize,
        group: usize,
    ) -> Result<()> {
        let (toks, singles) = self.at.toks;
        let splits = self.attn_splits;
        let part_bytes = 4 * singles * shape.num_heads * splits * (d + 2);
        let part = self.attn_part.ensure(&self.gpu, part_bytes)?;
        let window = i32_arg(shape.sliding_window.unwrap_or(0), "sliding window")?;
        let keys = i32_arg(self.split_keys, "split keys")?;
        let depth = i32_arg(splits, "attention splits")?;
        let ranges = i32_arg(ATTENTION_RANGES, "attention ranges")?;
        let args = [
            p(self.buf(Buf::Q)?),
            p(kc),
            p(vc),
            p(self.index(self.at.block_tables)?),
            p(self.index(self.at.bt_start)?),
            p(self.index(self.at.positions)?),
            p(self.index(toks)?),
            p(self.buf(Buf::Attn)?),
            p(part),
            i32_arg(self.stride(Buf::Q), "row stride")?,
            i32_arg(self.stride(Buf::Attn), "row stride")?,
            i32_arg(group, "GQA group")?,
            i32_arg(shape.num_kv_heads, "kv heads")?,
            i32_arg(shape.head_dim, "head_dim")?,
            i32_arg(shape.block_size, "block size")?,
            window,
            KernelArg::F32(shape.scale),
            KernelArg::F32(shape.softcap.unwrap_or(0.0)),
            keys,
            ranges,
            depth,
        ];
        let name = format!("paged_attention_split_{kind}_d{d}");
        let heads = self.head_programs(&name, shape.num_kv_heads, group)?;
        self.launch(&name, [singles as u32, heads, splits as u32], &args)?;
        let args = [
            p(part),
            p(self.index(self.at.positions)?),
            p(self.index(toks)?),
            p(self.buf(Buf::Attn)?),
            i32_arg(self.stride(Buf::Attn), "row stride")?,
            i32_arg(shape.head_dim, "head_dim")?,
            window,
            keys,
            ranges,
            depth,
        ];
        let grid = [singles as u32, shape.num_heads as u32, 1];
        self.launch(&format!("attention_combine_d{d}"), grid, &args)
    }

    /// Rope `rope`'s frequencies on the device and the batch's runs of tokens under it.
    #[allow(clippy::type_complexity)]
    fn rope_of(&self, rope: usize) -> Result<(&UploadedRope, &[(usize, usize, bool)])> {
        match (self.inv_freq.get(rope), self.rope_runs.get(rope)) {
            (Some(u), Some(r)) => Ok((u, r)),
            _ => Err(ModelError::Invalid(format!(
                "rope {rope} was not given to begin"
            ))),
        }
    }

    /// Programs per token of decode attention (`paged_attention[_split]`): one per KV head
    /// and chunk of `G_BLOCK` of its `group` query heads.
    fn head_programs(&self, name: &str, num_kv_heads: usize, group: usize) -> Result<u32> {
        let g_block = usize::try_from(self.block(name, "G_BLOCK")?)
            .ok()
            .filter(|&g| g > 0)
            .ok_or_else(|| ModelError::Invalid(format!("kernel {name}: bad G_BLOCK")))?;
        u32::try_from(num_kv_heads * group.div_ceil(g_block))
            .map_err(|_| ModelError::Invalid(format!("{num_kv_heads} KV heads are too many")))
    }

    fn head_block(head_dim: usize) -> Result<usize> {
        HEAD_BLOCKS
            .iter()
            .copied()
            .find(|&b| b >= head_dim)
            .ok_or_else(|| {
                ModelError::NotOnDevice(format!(
                    "head_dim {head_dim} is larger than the GPU kernels' largest ({})",
                    HEAD_BLOCKS[HEAD_BLOCKS.len() - 1]
                ))
            })
    }
}

impl Backend for CudaBackend {
    type Weight = GpuWeight;
    type Vector = GpuVector;
    type Table = GpuWeight;

    fn products(&mut self, parts: Vec<(Tensor, Buf)>) -> Result<Vec<(GpuWeight, Outs)>> {
        stack_runs(parts)?
            .into_iter()
            .map(|(t, outs)| Ok((self.weight(t)?, outs)))
            .collect()
    }

    fn weight(&mut self, t: Tensor) -> Result<GpuWeight> {
        form(t.dtype())?;
        let buf = self.gpu.upload(t.storage().bytes())?;
        Ok(GpuWeight {
            buf,
            dtype: t.dtype(),
            rows: t.rows(),
            cols: t.cols(),
            row_bytes: t.row_bytes(),
        })
    }

    fn weight_bytes(w: &GpuWeight) -> usize {
        w.buf.len()
    }

    fn vector(&mut self, v: Vec<f32>) -> Result<GpuVector> {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        Ok(GpuVector {
            buf: self.gpu.upload(&bytes)?,
            len: v.len(),
        })
    }

    fn vector_bytes(v: &GpuVector) -> usize {
        4 * v.len
    }

    fn table(&mut self, t: Tensor) -> Result<GpuWeight> {
        self.weight(t)
    }

    fn table_row_bytes(t: &GpuWeight) -> usize {
        t.buf.len() / t.rows.max(1)
    }

    fn begin(
        &mut self,
        dims: Dims,
        batch: &ForwardBatch,
        ropes: &[Rope],
        graphs: bool,
    ) -> Result<()> {
        // A capture left open by a failed step is abandoned; its graph never existed.
        if matches!(self.graphs.step.take(), Some((_, GraphStep::Capture))) {
            self.gpu.lock().abort_capture();
        }
        self.dims = dims;
        let real = batch.num_tokens();
        self.num_real_tokens = real;
        self.graphs.bucket = self.bucket(batch).filter(|_| graphs);
        // Padded decode batches repeat their last token.
        let t = self.graphs.bucket.unwrap_or(real);
        let pad = t - real;
        self.tokens = t;
        self.num_logits = batch.logits_indices.len();
        self.device_rows = if self.graphs.bucket.is_some() {
            t
        } else {
            self.num_logits
        };
        for b in [Buf::X, Buf::H, Buf::Q, Buf::Attn, Buf::Gate] {
            let (slot, _, stride) = place(&dims, b);
            self.bufs[slot].ensure(&self.gpu, 4 * t * stride)?;
        }
        self.normed.ensure(&self.gpu, 4 * t * dims.hidden)?;
        self.rows
            .ensure(&self.gpu, 4 * self.device_rows * dims.hidden)?;
        self.logits
            .ensure(&self.gpu, 4 * self.device_rows * dims.vocab)?;
        // Indices: ids, positions, slots, block-table start per token, rows, block tables.
        // Each section starts on a 16-byte boundary, so the kernels that read one take their
        // aligned binaries (a hinted pointer must be a multiple of 16 bytes).
        fn align(h: &mut Vec<u32>) -> usize {
            h.resize(h.len().next_multiple_of(4), 0);
            h.len()
        }
        fn put(h: &mut Vec<u32>, xs: &[u32], pad: usize) -> usize {
            let at = align(h);
            h.extend_from_slice(xs);
            if let Some(&last) = xs.last() {
                h.extend(std::iter::repeat_n(last, pad));
            }
            at
        }
        let h = &mut self.host_indices;
        h.clear();
        let ids = put(h, &batch.token_ids, pad);
        let positions = put(h, &batch.positions, pad);
        let slots = put(h, &batch.slot_mapping, pad);
        let bt_start = align(h);
        for s in &batch.seqs {
            h.extend(std::iter::repeat_n(s.block_table_start as u32, s.query_len));
        }
        if let Some(&last) = h.last() {
            h.extend(std::iter::repeat_n(last, pad));
        }
        // The tokens that attend one at a time (`paged_attention`): every token of a batch
        // of decodes (padding included), else the one-token sequences beside prompt chunks,
        // which take the tiles (so a decode's arithmetic never depends on its batch mates).
        let prefill = batch.seqs.iter().any(|s| s.query_len > 1);
        let toks = align(h);
        if prefill {
            for s in batch.seqs.iter().filter(|s| s.query_len == 1) {
                h.push(s.query_start as u32);
            }
        } else {
            h.extend(0..t as u32);
        }
        let singles = h.len() - toks;
        // Split-K for the single tokens when the longest context spans several ranges; the
        // grid depth rounds up to a power of two, so graphs are captured again rarely.
        let longest = h[toks..]
            .iter()
            .map(|&i| {
                batch
                    .positions
                    .get(i as usize)
                    .map_or(0, |&p| p as usize + 1)
            })
            .max()
            .unwrap_or(0);
        self.attn_splits = longest
            .div_ceil(self.split_keys)
            .clamp(1, ATTENTION_RANGES)
            .next_power_of_two();
        let rows = align(h);
        h.extend_from_slice(&batch.logits_indices);
        // A padded bucket computes a row per token; the padding's are never read.
        h.extend((self.num_logits..self.device_rows).map(|i| i as u32));
        let block_tables = put(h, &batch.block_tables, 0);
        // Chunks of query tokens attend in tiles on the tensor cores.
        let tiles = if prefill {
            let at = align(h);
            for s in batch.seqs.iter().filter(|s| s.query_len > 1) {
                for first in (0..s.query_len).step_by(PREFILL_M) {
                    h.extend([
                        (s.query_start + first) as u32,
                        (s.query_len - first).min(PREFILL_M) as u32,
                        s.block_table_start as u32,
                    ]);
                }
            }
            Some((at, (h.len() - at) / 3))
        } else {
            None
        };
        // Pending inputs, and the padding's copies of a pending last token: the padding
        // writes its K/V into the last token's slot, so it must be the same token.
        let pending = align(h);
        for pair in self.overlap.pending.chunks_exact(2) {
            h.extend_from_slice(pair);
            if pair[0] as usize + 1 == real {
                h.extend((real..t).flat_map(|j| [j as u32, pair[1]]));
            }
        }
        let pending = (pending, (h.len() - pending) / 2);
        self.at = Indices {
            ids,
            positions,
            slots,
            bt_start,
            rows,
            block_tables,
            tiles,
            toks: (toks, singles),
            pending,
        };
        let bytes = &mut self.host_bytes;
        bytes.clear();
        bytes.extend(h.iter().flat_map(|v| v.to_le_bytes()));
        let ptr = self.indices.ensure(&self.gpu, bytes.len())?;
        self.gpu.lock().write(ptr, bytes)?;
        self.resolve_pending()?;
        self.inv_freq.truncate(ropes.len());
        for (i, rope) in ropes.iter().enumerate() {
            let same = self.inv_freq.get(i).is_some_and(|u| {
                u.short.1 == rope.inv_freq()
                    && u.long.as_ref().map(|l| l.1.as_slice()) == rope.long_inv_freq().map(|l| l.0)
                    && u.head_dim == rope.head_dim()
                    && u.mscale == rope.mscale()
            });
            if same {
                continue;
            }
            let upload = |v: &[f32]| -> Result<(DeviceBuffer, Vec<f32>)> {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Ok((self.gpu.upload(&bytes)?, v.to_vec()))
            };
            let uploaded = UploadedRope {
                short: upload(rope.inv_freq())?,
                long: rope.long_inv_freq().map(|(l, _)| upload(l)).transpose()?,
                head_dim: rope.head_dim(),
                mscale: rope.mscale(),
            };
            if i < self.inv_freq.len() {
                self.inv_freq[i] = uploaded;
            } else {
                self.inv_freq.push(uploaded);
            }
        }
        // Runs of tokens taking one frequency set, per rope (the padding continues the last).
        self.rope_runs.resize_with(ropes.len(), Vec::new);
        for (rope, runs) in ropes.iter().zip(&mut self.rope_runs) {
            runs.clear();
            for sq in &batch.seqs {
                for j in 0..sq.query_len {
                    let t = sq.query_start + j;
                    let pos = batch.positions.get(t).copied().unwrap_or(0) as usize;
                    let long = rope.uses_long(sq.prompt_len, pos);
                    match runs.last_mut() {
                        Some((first, n, l)) if *l == long && *first + *n == t => *n += 1,
                        _ => runs.push((t, 1, long)),
                    }
                }
            }
            if let Some((_, n, _)) = runs.last_mut() {
                *n += pad;
            }
        }
        Ok(())
    }

    fn graph_step(&mut self, kv: &KvCache) -> Result<GraphStep> {
        let Some(tokens) = self.graphs.bucket else {
            return Ok(GraphStep::Plain);
        };
        // Each rope must take one frequency set for the whole batch (LongRoPE can split one).
        let mut long = Vec::with_capacity(self.rope_runs.len());
        for runs in &self.rope_runs {
            match runs.as_slice() {
                [(_, _, l)] => long.push(*l),
                _ => return Ok(GraphStep::Plain),
            }
        }
        let mut layers = Vec::with_capacity(2 * kv.num_layers());
        for l in 0..kv.num_layers() {
            let (k, v) = kv.device_layer(l)?;
            layers.extend([k, v]);
        }
        let key = GraphKey {
            tokens,
            long,
            kv: layers,
            block_size: kv.block_size(),
            kv_dtype: kv.dtype().name(),
            splits: self.attn_splits,
            split_keys: self.split_keys,
            decode_split: self.decode_split,
        };
        if self.graphs.refused.contains(&key) {
            return Ok(GraphStep::Plain);
        }
        let addresses = self.graph_addresses();
        if addresses != self.graphs.addresses {
            self.drop_graphs()?;
            self.graphs.addresses = addresses;
        }
        if self.graphs.captured.contains_key(&key) {
            self.graphs.step = Some((key, GraphStep::Replay));
            return Ok(GraphStep::Replay);
        }
        // The first step of a shape runs plainly: it sizes every buffer and scratch area the
        // capture will hold.
        if self.graphs.seen.insert(key.clone()) {
            return Ok(GraphStep::Plain);
        }
        self.gpu.lock().begin_capture()?;
        self.graphs.step = Some((key, GraphStep::Capture));
        Ok(GraphStep::Capture)
    }

    fn embed(&mut self, table: &GpuWeight, _batch: &ForwardBatch, scale: f32) -> Result<()> {
        let n = table.cols;
        let (name, stride) = match form(table.dtype)? {
            Form::Float(f) => (format!("gather_rows_{f}"), n),
            Form::Blocks(q) => (format!("qgather_rows_{q}"), table.row_bytes),
        };
        let grid = [self.tokens as u32, cdiv(n, self.block(&name, "BLOCK")?), 1];
        // Float tables take their row stride in elements, block tables in bytes.
        let args = [
            p(table.buf.ptr()),
            p(self.index(self.at.ids)?),
            p(self.buf(Buf::X)?),
            i32_arg(n, "hidden size")?,
            i32_arg(stride, "row stride")?,
            i32_arg(n, "row stride")?,
            KernelArg::F32(scale),
        ];
        self.launch(&name, grid, &args)
    }

    fn add_norm_linear(
        &mut self,
        add: bool,
        norm: &GpuVector,
        eps: f32,
        outs: &[(GpuWeight, Outs)],
    ) -> Result<()> {
        let (t, hidden) = (self.tokens, self.dims.hidden);
        let normed = self.normed.ptr()?;
        if add {
            // X += H; normed = norm(X).
            let (x, h) = (self.buf(Buf::X)?, self.buf(Buf::H)?);
            self.rms_norm(h, Some(x), normed, norm, t, 1, hidden, eps)?;
        } else {
            self.rms_norm(self.buf(Buf::X)?, None, normed, norm, t, 1, hidden, eps)?;
        }
        for (w, out) in outs {
            // A stacked weight's columns run on into the buffers after the first ([`place`]).
            if w.rows != out.rows(&self.dims) {
                return Err(ModelError::Invalid(format!(
                    "a weight of {} rows for {:?} ({} columns)",
                    w.rows,
                    out.bufs(),
                    out.rows(&self.dims)
                )));
            }
            let y = (self.buf(out.first())?, self.stride(out.first()));
            self.gemm((normed, hidden), w, y, t)?;
        }
        Ok(())
    }

    fn add_bias(&mut self, buf: Buf, bias: &GpuVector) -> Result<()> {
        let n = bias.len;
        let grid = [
            self.tokens as u32,
            cdiv(n, self.block("add_rows", "BLOCK")?),
            1,
        ];
        let args = [
            p(self.buf(buf)?),
            p(bias.buf.ptr()),
            i32_arg(n, "bias length")?,
            i32_arg(self.stride(buf), "row stride")?,
            KernelArg::I32(0),
        ];
        self.launch("add_rows", grid, &args)
    }

    fn head_norm(&mut self, buf: Buf, w: &GpuVector, eps: f32) -> Result<()> {
        let (width, stride) = (self.width(buf), self.stride(buf));
        let x = self.buf(buf)?;
        self.rms_norm(
            x,
            None,
            x,
            w,
            self.tokens,
            width / w.len.max(1),
            stride,
            eps,
        )
    }

    fn rope(&mut self, rope: usize, buf: Buf) -> Result<()> {
        let (width, stride) = (self.width(buf), self.stride(buf));
        let (u, runs) = self.rope_of(rope)?;
        let (half, hd) = (u.short.1.len(), u.head_dim);
        if half > self.block("rope", "HALF_BLOCK")? as usize {
            return Err(ModelError::Invalid(format!(
                "rotary dimension {} is larger than the GPU kernel's",
                2 * half
            )));
        }
        let x = self.buf(buf)?;
        let positions = self.index(self.at.positions)?;
        for &(first, n, long) in runs {
            let freq = u.freq(long);
            let args = [
                p(x.offset(4 * first * stride)),
                p(positions.offset(4 * first)),
                p(freq),
                i32_arg(stride, "row stride")?,
                i32_arg(hd, "head_dim")?,
                i32_arg(half, "rotary half")?,
                KernelArg::F32(u.mscale),
            ];
            self.launch("rope", [n as u32, (width / hd) as u32, 1], &args)?;
        }
        Ok(())
    }

    fn rope_write_kv(
        &mut self,
        rope: usize,
        kv: &mut KvCache,
        layer: usize,
        shape: &AttentionShape,
        _batch: &ForwardBatch,
    ) -> Result<()> {
        let (kc, vc) = kv.device_layer(layer)?;
        let d = Self::head_block(shape.head_dim)?;
        let name = format!("rope_kv_write_{}_d{d}", kv.dtype().name());
        let (u, runs) = self.rope_of(rope)?;
        let (half, hd) = (u.short.1.len(), u.head_dim);
        if hd != shape.head_dim || 2 * half > d {
            return Err(ModelError::Invalid(format!(
                "rope {rope} (head_dim {hd}, rotary {}) does not fit the keys' heads of {}",
                2 * half,
                shape.head_dim
            )));
        }
        // K and V share their slot's stride ([`place`]).
        let width = self.stride(Buf::K);
        let (k, v) = (self.buf(Buf::K)?, self.buf(Buf::V)?);
        let (slots, positions) = (self.index(self.at.slots)?, self.index(self.at.positions)?);
        for &(first, n, long) in runs {
            let freq = u.freq(long);
            let args = [
                p(k.offset(4 * first * width)),
                p(v.offset(4 * first * width)),
                p(kc),
                p(vc),
                p(slots.offset(4 * first)),
                p(positions.offset(4 * first)),
                p(freq),
                i32_arg(width, "row stride")?,
                i32_arg(shape.num_kv_heads, "kv heads")?,
                i32_arg(hd, "head_dim")?,
                i32_arg(half, "rotary half")?,
                KernelArg::F32(u.mscale),
            ];
            self.launch(&name, [n as u32, shape.num_kv_heads as u32, 1], &args)?;
        }
        Ok(())
    }

    fn write_kv(
        &mut self,
        kv: &mut KvCache,
        layer: usize,
        shape: &AttentionShape,
        _batch: &ForwardBatch,
    ) -> Result<()> {
        let (kc, vc) = kv.device_layer(layer)?;
        let d = Self::head_block(shape.head_dim)?;
        let name = format!("kv_write_{}_d{d}", kv.dtype().name());
        let args = [
            p(self.buf(Buf::K)?),
            p(self.buf(Buf::V)?),
            p(kc),
            p(vc),
            p(self.index(self.at.slots)?),
            i32_arg(self.stride(Buf::K), "row stride")?,
            i32_arg(shape.num_kv_heads, "kv heads")?,
            i32_arg(shape.head_dim, "head_dim")?,
        ];
        let grid = [self.tokens as u32, shape.num_kv_heads as u32, 1];
        self.launch(&name, grid, &args)
    }

    fn attend(
        &mut self,
        kv: &mut KvCache,
        layer: usize,
        shape: &AttentionShape,
        _batch: &ForwardBatch,
    ) -> Result<()> {
        let (kc, vc) = kv.device_layer(layer)?;
        let d = Self::head_block(shape.head_dim)?;
        let group = shape.num_heads / shape.num_kv_heads.max(1);
        let kind = kv.dtype().name();
        // Prompt chunks: tiles of query tokens (prefill_attention); the tokens that attend
        // alone: one program per token and head (paged_attention, through the token list).
        let (toks, singles) = self.at.toks;
        let mut launches = Vec::with_capacity(2);
        if let Some((at, n)) = self.at.tiles {
            let name = format!("prefill_attention_{kind}_d{d}");
            if self.block(&name, "BLOCK_M")? != PREFILL_M as i64 {
                return Err(ModelError::Invalid(format!(
                    "kernel {name} was built for another tile height than {PREFILL_M}"
                )));
            }
            // tiles, positions
            let indices = vec![p(self.index(at)?), p(self.index(self.at.positions)?)];
            launches.push((name, indices, [n as u32, shape.num_heads as u32, 1]));
        }
        let split = singles > 0 && self.attn_splits > 1;
        if singles > 0 && !split {
            let name = format!("paged_attention_{kind}_d{d}");
            // block-table starts, positions, the token list
            let indices = vec![
                p(self.index(self.at.bt_start)?),
                p(self.index(self.at.positions)?),
                p(self.index(toks)?),
            ];
            let heads = self.head_programs(&name, shape.num_kv_heads, group)?;
            launches.push((name, indices, [singles as u32, heads, 1]));
        }
        if split {
            self.attend_split((kc, vc), kind, shape, d, group)?;
        }
        for (name, indices, grid) in launches {
            let mut args = vec![
                p(self.buf(Buf::Q)?),
                p(kc),
                p(vc),
                p(self.index(self.at.block_tables)?),
            ];
            args.extend(indices);
            args.extend([
                p(self.buf(Buf::Attn)?),
                i32_arg(self.stride(Buf::Q), "row stride")?,
                i32_arg(self.stride(Buf::Attn), "row stride")?,
                i32_arg(group, "GQA group")?,
                i32_arg(shape.num_kv_heads, "kv heads")?,
                i32_arg(shape.head_dim, "head_dim")?,
                i32_arg(shape.block_size, "block size")?,
                i32_arg(shape.sliding_window.unwrap_or(0), "sliding window")?,
                KernelArg::F32(shape.scale),
                KernelArg::F32(shape.softcap.unwrap_or(0.0)),
            ]);
            self.launch(&name, grid, &args)?;
        }
        Ok(())
    }

    fn linear(&mut self, input: Buf, w: &GpuWeight, out: Buf) -> Result<()> {
        let x = (self.buf(input)?, self.stride(input));
        let y = (self.buf(out)?, self.stride(out));
        self.gemm(x, w, y, self.tokens)
    }

    fn gated_linear(&mut self, w: &GpuWeight, act: GatedAct, out: Buf) -> Result<()> {
        let n = self.dims.intermediate;
        let kernel = match act {
            GatedAct::Silu => "gated_silu",
            GatedAct::GeluTanh => "gated_gelu_tanh",
        };
        let (gate, up) = (self.buf(Buf::Gate)?, self.buf(Buf::Up)?);
        // Gate and Up share their slot's stride ([`place`]).
        let stride = self.stride(Buf::Gate);
        let y = (self.buf(out)?, self.stride(out));
        // Few rows: the activation inside the (split-K) down product.
        if self.tokens <= DECODE_M {
            let per = self
                .split_columns(&Self::split_name(w)?, w)?
                .unwrap_or(w.cols);
            let t = self.tokens;
            return self.gemm_split(((gate, stride), y), w, t, per, Some((up, act)));
        }
        // Many rows of a half weight: act(Gate) * Up rounded into the vendor product's input.
        if self.vendor_gemm((gate, stride), w, y, self.tokens, Some((up, stride, act)))? {
            return Ok(());
        }
        let grid = [self.tokens as u32, cdiv(n, self.block(kernel, "BLOCK")?), 1];
        // In place: Gate = act(Gate) * Up.
        let args = [
            p(gate),
            p(up),
            p(gate),
            i32_arg(n, "intermediate size")?,
            i32_arg(stride, "row stride")?,
            i32_arg(stride, "row stride")?,
            i32_arg(stride, "row stride")?,
        ];
        self.launch(kernel, grid, &args)?;
        self.gemm((gate, stride), w, y, self.tokens)
    }

    fn add_residual(&mut self) -> Result<()> {
        let n = self.dims.hidden;
        let grid = [
            self.tokens as u32,
            cdiv(n, self.block("add_rows", "BLOCK")?),
            1,
        ];
        let args = [
            p(self.buf(Buf::X)?),
            p(self.buf(Buf::H)?),
            i32_arg(n, "hidden size")?,
            i32_arg(n, "row stride")?,
            i32_arg(n, "row stride")?,
        ];
        self.launch("add_rows", grid, &args)
    }

    fn moe(
        &mut self,
        _norm: &GpuVector,
        _eps: f32,
        _moe: &MoeWeights<Self>,
        _act: GatedAct,
    ) -> Result<()> {
        // The loader refuses mixture-of-experts models on a GPU before uploading anything
        // (`load_model_on_gpu`); this is the backstop.
        Err(ModelError::NotOnDevice(
            "mixture-of-experts layers run on the CPU only so far".into(),
        ))
    }

    fn host_rows(&mut self, buf: Buf, f: &mut dyn FnMut(&mut [f32]) -> Result<()>) -> Result<()> {
        // Whole rows only: a buffer that shares its slot ([`place`]) is not contiguous.
        if self.stride(buf) != self.width(buf) {
            return Err(ModelError::Invalid(format!(
                "{buf:?} shares its rows with other buffers on the GPU; only X, H and Attn \
                 go to the host"
            )));
        }
        let n = self.tokens * self.width(buf);
        let ptr = self.buf(buf)?;
        let (bytes, rows) = (&mut self.host_bytes, &mut self.host_act);
        let what = format!("copying {buf:?} to the host");
        read_words(&self.gpu, ptr, n, bytes, rows, f32::from_le_bytes, &what)?;
        f(rows)?;
        for (c, v) in bytes.chunks_exact_mut(4).zip(rows.iter()) {
            c.copy_from_slice(&v.to_le_bytes());
        }
        let write = |e| ModelError::Invalid(format!("copying {buf:?} back to the GPU: {e}"));
        self.gpu.lock().write(ptr, bytes).map_err(write)
    }

    fn logits(
        &mut self,
        norm: &GpuVector,
        eps: f32,
        head: &GpuWeight,
        rows: &[u32],
        softcap: Option<f32>,
    ) -> Result<&[f32]> {
        let n = rows.len();
        // The host decides this step's tokens: none lie on the device.
        self.overlap.last_ids = None;
        self.step_logits(norm, eps, head, n)?;
        if n == 0 {
            self.host_logits.clear();
            return Ok(&self.host_logits);
        }
        // [n, vocab]: the first n rows (a padded bucket's others are the padding's).
        let (ptr, words) = (self.logits.ptr()?, n * head.rows);
        let (bytes, logits) = (&mut self.host_bytes, &mut self.host_logits);
        let what = "reading the logits back";
        read_words(
            &self.gpu,
            ptr,
            words,
            bytes,
            logits,
            f32::from_le_bytes,
            what,
        )?;
        if let Some(cap) = softcap {
            super::softcap_logits(&mut self.host_logits, cap);
        }
        Ok(&self.host_logits)
    }

    fn argmax_rows(
        &mut self,
        norm: &GpuVector,
        eps: f32,
        head: &GpuWeight,
        rows: &[u32],
        softcap: Option<f32>,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        let n = rows.len();
        if softcap.is_some() {
            // Soft-capping keeps the order but can round distinct logits to equal ones; the
            // host decides over the capped rows, as the sampler would.
            let logits = self.logits(norm, eps, head, rows, softcap)?;
            super::host_argmax(logits, n, out);
            return self.host_ids(out);
        }
        self.step_logits(norm, eps, head, n)?;
        out.clear();
        if n == 0 {
            return self.host_ids(&[]);
        }
        // [n]: each row's argmax, decided on the device; 4 bytes a row come back.
        let ids = self.overlap.ids_out.ensure(&self.gpu, 4 * n)?;
        self.guard_tokens()?;
        let args = [
            p(self.logits.ptr()?),
            p(ids),
            i32_arg(head.rows, "vocabulary")?,
            i32_arg(head.rows, "row stride")?,
        ];
        self.launch("argmax_rows", [n as u32, 1, 1], &args)?;
        self.finish_ids(ids, n, out)
    }

    fn sample_rows(
        &mut self,
        norm: &GpuVector,
        eps: f32,
        head: &GpuWeight,
        rows: &[u32],
        softcap: Option<f32>,
        specs: &[RowSampling<'_>],
        out: &mut SampledRows,
    ) -> Result<()> {
        self.device_sample(norm, eps, head, rows, softcap, specs, out)
    }
}

impl Drop for CudaBackend {
    /// Abandons a capture a failed step left open and frees the graphs (the device may be
    /// shared and outlive this backend).
    fn drop(&mut self) {
        if matches!(self.graphs.step.take(), Some((_, GraphStep::Capture))) {
            self.gpu.lock().abort_capture();
        }
        let _ = self.drop_graphs();
        self.overlap.release(&mut self.gpu.lock());
    }
}
