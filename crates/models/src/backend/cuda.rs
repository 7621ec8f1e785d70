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
//!
//! By concept, one file each: `buffers.rs` (activation buffers and their slots), `step.rs` (a
//! step's start: sizing, the indices' upload, attention planning, ropes), `graphs.rs` (decode
//! graphs), `products.rs` (the Triton products, split-K), `vendor.rs` (products on cuBLASLt),
//! `attention.rs` (RoPE, KV writes, attention), `sample.rs` (sampling on the device) and
//! `overlap.rs` (overlapped steps); this file holds the backend's state and the
//! [`Backend`] operations, which delegate to them. Device failures are
//! [`ModelError::Gpu`], naming the kernel or call.

use std::collections::{HashMap, HashSet};

use ferrum_runtime::cpu::{AttentionShape, GatedAct, Rope};
use ferrum_runtime::cuda::{DeviceBuffer, DevicePtr, Dispatch, GraphId, KernelArg, SharedGpu};
use ferrum_runtime::{DType, Tensor};
use ferrum_types::ForwardBatch;

mod attention;
mod buffers;
mod graphs;
mod overlap;
mod products;
mod sample;
mod step;
mod vendor;

use buffers::{place, read_words, Grown, UploadedRope, SLOTS};
use graphs::Graphs;
use products::{form, Form};
use step::Indices;

pub use overlap::Collected;

use super::{stack_runs, Backend, Buf, Dims, GraphStep, MoeWeights, Outs};
use crate::sampling::{RowSampling, SampledRows};
use crate::{CudaGraphs, KvCache, ModelConfig, ModelError, Result};

/// Decode batch sizes that get a graph each: a batch of `n` sequences pads to the first bucket
/// of at least `n`; larger batches launch plainly.
pub const GRAPH_BUCKETS: [usize; 15] =
    [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256];

/// Keys per range of split-K decode attention (`paged_attention_split`), at least: a decode
/// token whose context is longer attends in ranges, merged by `attention_combine`.
pub const SPLIT_KEYS: usize = 512;

/// Ranges of split-K decode attention, at most (longer contexts take longer ranges): bounds
/// the partials' buffer (`tokens x heads x 16 x (head_dim + 2)` f32) and the grid.
pub const ATTENTION_RANGES: usize = 16;

/// Split-K decode products (`gemm_*_split`, `qgemm_*_split`): a product of at most
/// `decode_m` rows (the manifest's [`Dispatch`]) whose output tiles make fewer than `programs` programs is cut along `k` into
/// enough ranges to make about that many, each at least `min_k` columns deep and of whole
/// blocks of a block format. How many ranges depends on
/// the weight's shape only, never on the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DecodeSplit {
    pub programs: usize,
    pub min_k: usize,
}

/// About 4 programs per SM of an H100 (132 SMs), each range two decode tiles deep: tuned there,
/// and scaled by the device's own SM count ([`DecodeSplit::for_device`]).
pub const DECODE_SPLIT: DecodeSplit = DecodeSplit {
    programs: 512,
    min_k: 512,
};

/// The SM count [`DECODE_SPLIT`] was tuned on (an H100's, an H200's).
const TUNED_SMS: usize = 132;

impl DecodeSplit {
    /// [`DECODE_SPLIT`] for a device of `sms` streaming multiprocessors: the same programs per
    /// SM (512 on 132), the same depth per range.
    pub fn for_device(sms: usize) -> DecodeSplit {
        DecodeSplit {
            programs: (DECODE_SPLIT.programs * sms.max(1)).div_ceil(TUNED_SMS),
            ..DECODE_SPLIT
        }
    }
}

/// A linear weight on the device, `[rows, cols]` as stored.
#[derive(Debug)]
pub struct GpuWeight {
    buf: DeviceBuffer,
    dtype: DType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
}

/// An f32 vector on the device.
#[derive(Debug)]
pub struct GpuVector {
    buf: DeviceBuffer,
    len: usize,
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
    /// Products of more than `decode_m` rows on the vendor library ([`Self::set_gemm`]).
    vendor: vendor::Vendor,
    /// How launches pick among the kernels (`kernels/specs.py`'s values, from the manifest):
    /// products of at most `decode_m` rows take the decode tiles, of more than `large_m` the
    /// large ones (from `decode_m` up, 32 x 64 tiles); prefill attention tiles of `prefill_m`
    /// query tokens; attention and KV kernels for the `head_blocks`.
    dispatch: Dispatch,
}

/// A launch's arguments, each named as the kernel's parameter in the manifest
/// (`args![x_ptr: p(x), n_cols: i32_arg(n, "width")?]`): [`CudaBackend::launch`] refuses a
/// launch whose names are not the build's, in its order.
macro_rules! args {
    ($($name:ident : $value:expr),* $(,)?) => {
        [$((stringify!($name), $value)),*]
    };
}
pub(crate) use args;

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

impl CudaBackend {
    /// A backend launching on `gpu`, with decode graphs when `graphs` says so.
    pub fn new(gpu: SharedGpu, graphs: CudaGraphs) -> CudaBackend {
        let (sms, dispatch) = {
            let g = gpu.lock();
            (g.multiprocessors(), g.dispatch().clone())
        };
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
            decode_split: DecodeSplit::for_device(sms),
            gemm_part: Grown::default(),
            split_counts: Grown::default(),
            num_real_tokens: 0,
            overlap: overlap::Overlap::default(),
            vendor: vendor::Vendor::default(),
            dispatch,
        }
    }

    /// Sets the keys per range of split-K decode attention (default [`SPLIT_KEYS`]; at least
    /// 1): a tuning knob, and how tests reach the split path with short contexts.
    pub fn set_attention_split(&mut self, keys: usize) {
        self.split_keys = keys.max(1);
    }

    /// Sets how decode products split along `k` (default [`DECODE_SPLIT`] scaled to the device's
    /// SM count; `min_k` at least
    /// 1): a tuning knob, and how tests reach the split path with small weights.
    pub fn set_decode_split(&mut self, split: DecodeSplit) {
        self.decode_split = DecodeSplit {
            min_k: split.min_k.max(1),
            ..split
        };
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

    /// Launches kernel `name` with its arguments named as its parameters ([`args!`]); the
    /// device checks the names, kinds and count against the manifest.
    fn launch(&self, name: &str, grid: [u32; 3], args: &[(&str, KernelArg)]) -> Result<()> {
        self.gpu
            .lock()
            .launch_named(name, grid, args)
            .map_err(|e| ModelError::gpu(format!("kernel {name}"), e))
    }

    fn block(&self, name: &str, key: &str) -> Result<i64> {
        Ok(self.gpu.lock().constexpr(name, key)?)
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
        let args = args![
            x_ptr: p(x),
            res_ptr: p(res.unwrap_or(DevicePtr::NULL)),
            out_ptr: p(out),
            w_ptr: p(w.buf.ptr()),
            n_cols: i32_arg(n, "norm width")?,
            row_stride: i32_arg(stride, "row stride")?,
            res_stride: i32_arg(stride, "row stride")?,
            out_stride: i32_arg(stride, "row stride")?,
            eps: KernelArg::F32(eps),
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
        self.begin_impl(dims, batch, ropes, graphs)
    }

    fn graph_step(&mut self, kv: &KvCache) -> Result<GraphStep> {
        self.graph_step_impl(kv)
    }

    fn embed(&mut self, table: &GpuWeight, _batch: &ForwardBatch, scale: f32) -> Result<()> {
        let n = table.cols;
        // Float tables take their row stride in elements, block tables in bytes.
        let (name, stride_param, stride) = match form(table.dtype)? {
            Form::Float(f) => (format!("gather_rows_{f}"), "table_stride", n),
            Form::Blocks(q) => (format!("qgather_rows_{q}"), "row_bytes", table.row_bytes),
        };
        let grid = [self.tokens as u32, cdiv(n, self.block(&name, "BLOCK")?), 1];
        let args = [
            ("table_ptr", p(table.buf.ptr())),
            ("ids_ptr", p(self.index(self.at.ids)?)),
            ("out_ptr", p(self.buf(Buf::X)?)),
            ("n_cols", i32_arg(n, "hidden size")?),
            (stride_param, i32_arg(stride, "row stride")?),
            ("out_stride", i32_arg(n, "row stride")?),
            ("scale", KernelArg::F32(scale)),
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
        let args = args![
            x_ptr: p(self.buf(buf)?),
            y_ptr: p(bias.buf.ptr()),
            n_cols: i32_arg(n, "bias length")?,
            x_stride: i32_arg(self.stride(buf), "row stride")?,
            // One bias row for every row of x.
            y_stride: KernelArg::I32(0),
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
        self.rope_impl(rope, buf)
    }

    fn rope_write_kv(
        &mut self,
        rope: usize,
        kv: &mut KvCache,
        layer: usize,
        shape: &AttentionShape,
        _batch: &ForwardBatch,
    ) -> Result<()> {
        self.rope_write_kv_impl(rope, kv, layer, shape, _batch)
    }

    fn write_kv(
        &mut self,
        kv: &mut KvCache,
        layer: usize,
        shape: &AttentionShape,
        _batch: &ForwardBatch,
    ) -> Result<()> {
        self.write_kv_impl(kv, layer, shape, _batch)
    }

    fn attend(
        &mut self,
        kv: &mut KvCache,
        layer: usize,
        shape: &AttentionShape,
        _batch: &ForwardBatch,
    ) -> Result<()> {
        self.attend_impl(kv, layer, shape, _batch)
    }

    fn linear(&mut self, input: Buf, w: &GpuWeight, out: Buf) -> Result<()> {
        let x = (self.buf(input)?, self.stride(input));
        let y = (self.buf(out)?, self.stride(out));
        self.gemm(x, w, y, self.tokens)
    }

    fn gated_linear(&mut self, w: &GpuWeight, act: GatedAct, out: Buf) -> Result<()> {
        self.gated_linear_impl(w, act, out)
    }

    fn add_residual(&mut self) -> Result<()> {
        let n = self.dims.hidden;
        let grid = [
            self.tokens as u32,
            cdiv(n, self.block("add_rows", "BLOCK")?),
            1,
        ];
        let args = args![
            x_ptr: p(self.buf(Buf::X)?),
            y_ptr: p(self.buf(Buf::H)?),
            n_cols: i32_arg(n, "hidden size")?,
            x_stride: i32_arg(n, "row stride")?,
            y_stride: i32_arg(n, "row stride")?,
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
        let write = |e| ModelError::gpu(format!("copying {buf:?} back to the GPU"), e);
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
        let args = args![
            logits_ptr: p(self.logits.ptr()?),
            out_ptr: p(ids),
            n_cols: i32_arg(head.rows, "vocabulary")?,
            row_stride: i32_arg(head.rows, "row stride")?,
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
        self.overlap.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_splits_scale_with_the_devices_multiprocessors() {
        assert_eq!(DecodeSplit::for_device(132), DECODE_SPLIT);
        assert_eq!(DecodeSplit::for_device(66).programs, 256);
        assert_eq!(DecodeSplit::for_device(114).programs, 443);
        assert_eq!(DecodeSplit::for_device(0).programs, 4);
        assert_eq!(DecodeSplit::for_device(108).min_k, DECODE_SPLIT.min_k);
    }
}
