//! Matrix products against weights in any stored format.
//!
//! Two settings ([`MatmulPrecision`]). The float setting runs [`matmul`], which decodes weight
//! rows to f32: the reference. The fast setting runs tiled kernels over weights repacked at load:
//! integer dot products for block-quantized weights ([`matmul_q8`]), bf16 dot products with bf16
//! activations for bf16 weights where the CPU has AVX-512 BF16 ([`super::bpack`]), and f32
//! products for other float weights ([`matmul_f`]).
//!
//! `out[m, n] = x[m, k] · w[n, k]ᵀ`. Work is split over weight rows; each task decodes one weight
//! row at a time into a scratch row and dots it with every activation row, so each weight byte is
//! read once per call whatever `m` is, and no matrix is ever expanded. Every output element is
//! one `dot` in a fixed order: results are identical for any batch composition or thread count.

use super::bpack::{self, Bf16Acts, Bf16Packed};
use super::fpack::{self, FloatPacked};
use super::qdot::{self, Isa, Q8Acts};
use super::qpack::PackedWeight;
use super::simd::multiversion;
use super::DisjointMut;
use crate::{DType, Result, RuntimeError, Tensor, ThreadPool};
use std::ops::Range;

/// Weight rows per tile of the tiled kernels.
const TILE: usize = qdot::TILE_ROWS;

/// How products with block-quantized weights treat the activations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MatmulPrecision {
    /// The fast default: activations quantized to 8 bits per block of 32 with integer dot
    /// products for block-quantized weights (llama.cpp's arithmetic); activations rounded to bf16
    /// for bf16 weights where the CPU has AVX-512 BF16 (vLLM's and llama.cpp's arithmetic);
    /// f32 activations for other float weights.
    #[default]
    Int8,
    /// Weights decoded to f32 and multiplied with f32 activations: the reference path.
    Float,
}

/// A linear layer's weight `[n, k]`: the stored tensor and, for block-quantized formats on
/// the int8 path, its repacked form (built once at load).
#[derive(Debug, Clone)]
pub struct Weight {
    tensor: Tensor,
    packed: Option<PackedWeight>,
    /// Float weights in row tiles for the fast float kernel (int8 setting only).
    fpacked: Option<FloatPacked>,
    /// bf16 weights in paired row tiles for the bf16 kernel (int8 setting, CPUs with it).
    bpacked: Option<Bf16Packed>,
}

impl Weight {
    /// Wraps `tensor`, repacking it when `linear` takes the int8 path for its format.
    pub fn new(tensor: Tensor, linear: &Linear, pool: &ThreadPool) -> Result<Weight> {
        let packed = if linear.precision == MatmulPrecision::Int8
            && qdot::supports(tensor.dtype())
            && tensor.cols() > 0
        {
            Some(PackedWeight::pack(&tensor, pool)?)
        } else {
            None
        };
        let fast = linear.precision == MatmulPrecision::Int8 && tensor.cols() > 0;
        let bpacked = if fast && linear.bf16 && tensor.dtype() == DType::BF16 {
            Some(Bf16Packed::pack(&tensor, pool)?)
        } else {
            None
        };
        let fpacked = if fast
            && bpacked.is_none()
            && matches!(tensor.dtype(), DType::F32 | DType::F16 | DType::BF16)
        {
            Some(FloatPacked::pack(&tensor, pool)?)
        } else {
            None
        };
        if packed.is_some() || fpacked.is_some() || bpacked.is_some() {
            // The kernels read only the repacked form: the file's pages need not stay resident
            // beside it (they fault back in if the stored bytes are read again).
            tensor.release_pages();
        }
        Ok(Weight {
            tensor,
            packed,
            fpacked,
            bpacked,
        })
    }

    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    pub fn packed(&self) -> Option<&PackedWeight> {
        self.packed.as_ref()
    }

    pub fn rows(&self) -> usize {
        self.tensor.rows()
    }

    pub fn cols(&self) -> usize {
        self.tensor.cols()
    }

    /// Bytes the kernels read: the repacked form when there is one.
    pub fn num_bytes(&self) -> usize {
        match (&self.packed, &self.fpacked, &self.bpacked) {
            (Some(p), _, _) => p.num_bytes(),
            (_, Some(f), _) => f.num_bytes(),
            (_, _, Some(b)) => b.num_bytes(),
            _ => self.tensor.num_bytes(),
        }
    }
}

/// Runs linear layers with a chosen precision and instruction set. Weights without an
/// integer kernel (f32, f16, bf16) always take the float path.
#[derive(Debug, Clone, Copy)]
pub struct Linear {
    pub precision: MatmulPrecision,
    pub isa: Isa,
    /// Whether bf16 weights take the bf16 kernel ([`bpack::supported`] on this CPU).
    pub bf16: bool,
}

/// Buffers for the converted forms of a linear layer's input, reused from call to call.
#[derive(Debug, Clone, Default)]
pub struct ActScratch {
    q8: Q8Acts,
    bf16: Bf16Acts,
}

/// One linear layer input: the f32 rows and, for the fast kernels that want them, their
/// quantized or bf16 forms.
#[derive(Debug, Clone, Copy)]
pub struct LinearInput<'a> {
    x: &'a [f32],
    q: Option<&'a Q8Acts>,
    b: Option<&'a Bf16Acts>,
}

impl Linear {
    pub fn new(precision: MatmulPrecision) -> Linear {
        Linear {
            precision,
            isa: Isa::detect(),
            bf16: bpack::supported(),
        }
    }

    /// Prepares `x` (`[m, k]`) for its products with `weights`: quantizes it once (rows split
    /// over `pool`) when one of them was repacked for the int8 kernel, and rounds it to bf16
    /// once when one of them takes the bf16 kernel.
    pub fn prepare<'a>(
        &self,
        pool: &ThreadPool,
        x: &'a [f32],
        k: usize,
        scratch: &'a mut ActScratch,
        weights: &[&Weight],
    ) -> LinearInput<'a> {
        let (int8, bf16) = forms(x.len(), k, weights);
        if int8 || bf16 {
            convert_rows(pool, x.len(), k, scratch, (int8, bf16), |rows, conv| {
                let span = rows.start * k..rows.end * k;
                conv.put(rows, &x[span]);
            });
        }
        LinearInput {
            x,
            q: int8.then_some(&scratch.q8),
            b: bf16.then_some(&scratch.bf16),
        }
    }

    /// The residual add and RMSNorm in front of a linear layer, fused with its
    /// [`Linear::prepare`] into one pass over the rows: `x += h` (when `add`), then
    /// `h = rms_norm(x) * w`, then `h` prepared for `weights`. Each row's arithmetic is that of
    /// the separate steps (the same bits).
    #[allow(clippy::too_many_arguments)]
    pub fn add_norm_prepare<'a>(
        &self,
        pool: &ThreadPool,
        x: &mut [f32],
        h: &'a mut [f32],
        add: bool,
        w: &[f32],
        eps: f32,
        scratch: &'a mut ActScratch,
        weights: &[&Weight],
    ) -> LinearInput<'a> {
        let k = w.len();
        assert_eq!(x.len(), h.len(), "add_norm_prepare: x and h differ in size");
        let forms = forms(h.len(), k, weights);
        let (xs, hs) = (DisjointMut::new(x), DisjointMut::new(h));
        convert_rows(pool, hs.len, k, scratch, forms, |rows, conv| {
            let span = rows.start * k..rows.end * k;
            // SAFETY: the row ranges of different tasks do not overlap.
            let (x, h) = unsafe {
                (
                    xs.slice(span.start, span.len()),
                    hs.slice(span.start, span.len()),
                )
            };
            if add {
                x.iter_mut().zip(&*h).for_each(|(a, b)| *a += b);
            }
            super::rms_norm(x, w, eps, h);
            conv.put(rows, h);
        });
        LinearInput {
            x: h,
            q: forms.0.then_some(&scratch.q8),
            b: forms.1.then_some(&scratch.bf16),
        }
    }

    /// `gate = silu(gate) * up` ([`super::silu_mul`]) fused with [`Linear::prepare`] for
    /// `weights` (rows of `k`): one pass over the rows, the same bits as the separate steps.
    pub fn silu_mul_prepare<'a>(
        &self,
        pool: &ThreadPool,
        gate: &'a mut [f32],
        up: &[f32],
        k: usize,
        scratch: &'a mut ActScratch,
        weights: &[&Weight],
    ) -> LinearInput<'a> {
        assert_eq!(
            gate.len(),
            up.len(),
            "silu_mul_prepare: gate and up differ in size"
        );
        let forms = forms(gate.len(), k, weights);
        let gs = DisjointMut::new(gate);
        convert_rows(pool, gs.len, k, scratch, forms, |rows, conv| {
            let span = rows.start * k..rows.end * k;
            // SAFETY: the row ranges of different tasks do not overlap.
            let g = unsafe { gs.slice(span.start, span.len()) };
            super::silu_mul(g, &up[span]);
            conv.put(rows, g);
        });
        LinearInput {
            x: gate,
            q: forms.0.then_some(&scratch.q8),
            b: forms.1.then_some(&scratch.bf16),
        }
    }

    /// `out_i[m, n_i] = input[m, k] · w_i[n_i, k]ᵀ` for every `(w_i, out_i)`: one parallel call
    /// over all their rows when they all take the int8 path, else one product at a time.
    pub fn matmul_many(
        &self,
        pool: &ThreadPool,
        input: &LinearInput<'_>,
        products: &mut [(&Weight, &mut [f32])],
    ) -> Result<()> {
        if let Some(q) = input.q {
            let packed = gather(products, |w| {
                w.packed.as_ref().filter(|p| p.cols() == q.cols())
            });
            if let Some((ws, mut outs)) = packed {
                let n = products.len();
                return matmul_q8_many(pool, self.isa, q, &ws[..n], &mut outs[..n]);
            }
        }
        if let Some(b) = input.b {
            let packed = gather(products, |w| {
                w.bpacked.as_ref().filter(|p| p.cols() == b.cols())
            });
            if let Some((ws, mut outs)) = packed {
                let n = products.len();
                return matmul_b16_many(pool, b, &ws[..n], &mut outs[..n]);
            }
        }
        for (w, out) in products.iter_mut() {
            self.matmul(pool, input, w, out)?;
        }
        Ok(())
    }

    /// `out[m, n] = input[m, k] · w[n, k]ᵀ`.
    pub fn matmul(
        &self,
        pool: &ThreadPool,
        input: &LinearInput<'_>,
        w: &Weight,
        out: &mut [f32],
    ) -> Result<()> {
        match (input.q, &w.packed, input.b, &w.bpacked, &w.fpacked) {
            (Some(q), Some(p), ..) if q.cols() == p.cols() => matmul_q8(pool, self.isa, q, p, out),
            (_, _, Some(b), Some(p), _) if b.cols() == p.cols() => {
                matmul_b16_many(pool, b, &[p], &mut [out])
            }
            (.., Some(f)) => matmul_f(pool, self.isa, input.x, f, out),
            _ => matmul(pool, input.x, &w.tensor, out),
        }
    }
}

/// Which converted forms of a `[len / k, k]` input `weights` take: (int8 codes, bf16).
fn forms(len: usize, k: usize, weights: &[&Weight]) -> (bool, bool) {
    let rows = k > 0 && len.is_multiple_of(k) && len > 0;
    let int8 = rows
        && k.is_multiple_of(qdot::QK)
        && weights.iter().any(|w| w.packed.is_some() && w.cols() == k);
    let bf16 = rows && weights.iter().any(|w| w.bpacked.is_some() && w.cols() == k);
    (int8, bf16)
}

/// Where [`convert_rows`]' tasks put their finished f32 rows: converted into the forms asked
/// for.
struct RowForms<'s> {
    q8: Option<super::qacts::Q8Rows<'s>>,
    bf16: Option<bpack::Bf16Rows<'s>>,
}

impl RowForms<'_> {
    /// Converts rows `rows` (`x`: their values) into every form asked for.
    fn put(&self, rows: Range<usize>, x: &[f32]) {
        // SAFETY: `convert_rows` gives each task its own rows, and a task puts only those.
        unsafe {
            if let Some(q) = &self.q8 {
                q.quantize(rows.clone(), x);
            }
            if let Some(b) = &self.bf16 {
                b.fill(rows, x);
            }
        }
    }
}

/// Runs `task(rows, forms)` for every one of the `len / k` rows of an input (`rows` one row
/// long; split over `pool` from eight rows on), each producing its row's f32 values and putting
/// them into `forms`.
fn convert_rows(
    pool: &ThreadPool,
    len: usize,
    k: usize,
    scratch: &mut ActScratch,
    (int8, bf16): (bool, bool),
    task: impl Fn(Range<usize>, &RowForms<'_>) + Sync,
) {
    let m = len.checked_div(k).unwrap_or(0);
    if m == 0 {
        return;
    }
    let forms = RowForms {
        q8: int8.then(|| scratch.q8.rows_mut(m, k)),
        bf16: bf16.then(|| scratch.bf16.rows_mut(m, k)),
    };
    // A row at a time: its f32 values are still in L1 when they are converted.
    let rows = |r: Range<usize>| r.for_each(|i| task(i..i + 1, &forms));
    if m < 8 || pool.num_threads() == 1 {
        return rows(0..m);
    }
    pool.parallel_ranges(m, 2, rows);
}

/// The kernel forms `form` picks out of every weight of `products`, with their outputs taken
/// out of `products`, when every weight has one and there are at most [`MAX_PRODUCTS`].
#[allow(clippy::type_complexity)]
fn gather<'w, 'o, T>(
    products: &mut [(&'w Weight, &'o mut [f32])],
    form: impl Fn(&'w Weight) -> Option<&'w T>,
) -> Option<([&'w T; MAX_PRODUCTS], [&'o mut [f32]; MAX_PRODUCTS])> {
    if products.len() > MAX_PRODUCTS || !products.iter().all(|(w, _)| form(w).is_some()) {
        return None;
    }
    let first = form(products.first()?.0)?;
    let mut ws = [first; MAX_PRODUCTS];
    let mut outs: [&mut [f32]; MAX_PRODUCTS] = Default::default();
    for (i, (w, out)) in products.iter_mut().enumerate() {
        ws[i] = form(w)?;
        outs[i] = std::mem::take(out);
    }
    Some((ws, outs))
}

/// `out[m, n] = acts[m, k] · w[n, k]ᵀ` with integer dot products over repacked weights. Tiles
/// of sixteen weight rows are split over the pool; each task walks its tiles one at a time,
/// every tile staying in L1 while the activation rows pass it four at a time.
pub fn matmul_q8(
    pool: &ThreadPool,
    isa: Isa,
    acts: &Q8Acts,
    w: &PackedWeight,
    out: &mut [f32],
) -> Result<()> {
    matmul_q8_many(pool, isa, acts, &[w], &mut [out])
}

/// Most products [`matmul_q8_many`] takes at once.
pub const MAX_PRODUCTS: usize = 4;

/// [`matmul_q8`] for several weights of one input at once (q, k and v; gate and up): one
/// parallel call over all their tiles.
pub fn matmul_q8_many(
    pool: &ThreadPool,
    isa: Isa,
    acts: &Q8Acts,
    weights: &[&PackedWeight],
    outs: &mut [&mut [f32]],
) -> Result<()> {
    let (m, k) = (acts.rows(), acts.cols());
    over_tiles(pool, "matmul_q8", m, k, weights, outs, |w, tiles, out| {
        run_tiles(isa, acts, w, tiles, out)
    })
}

/// Several bf16 weights of one input (rounded to bf16) at once, in one parallel call over all
/// their tiles (as `matmul_q8_many` does for block-quantized weights).
pub fn matmul_b16_many(
    pool: &ThreadPool,
    acts: &Bf16Acts,
    weights: &[&Bf16Packed],
    outs: &mut [&mut [f32]],
) -> Result<()> {
    let (m, k) = (acts.rows(), acts.cols());
    over_tiles(pool, "matmul_b16", m, k, weights, outs, |w, tiles, out| {
        // SAFETY: these tiles' columns belong to this task (`over_tiles` splits the tiles).
        unsafe { bpack::dot_rows(w, tiles, acts, 0..m, GROUP, out) }
    })
}

/// A weight repacked into tiles of 16 rows, as [`over_tiles`] sees it.
trait Tiled: Sync {
    fn shape(&self) -> (usize, usize, usize, DType);
}

impl Tiled for PackedWeight {
    fn shape(&self) -> (usize, usize, usize, DType) {
        (self.rows(), self.cols(), self.tiles(), self.dtype())
    }
}

impl Tiled for Bf16Packed {
    fn shape(&self) -> (usize, usize, usize, DType) {
        (self.rows(), self.cols(), self.tiles(), DType::BF16)
    }
}

/// Checks `outs[i]` is `[m, n_i]` for weights `[n_i, k]`, then splits all their tiles over
/// `pool` in one call, `run(w_i, tiles, out_i)` for each weight's share. `op` names the product
/// in errors.
fn over_tiles<W: Tiled>(
    pool: &ThreadPool,
    op: &str,
    m: usize,
    k: usize,
    weights: &[&W],
    outs: &mut [&mut [f32]],
    run: impl Fn(&W, Range<usize>, &DisjointMut<f32>) + Sync,
) -> Result<()> {
    if weights.len() != outs.len() || weights.len() > MAX_PRODUCTS {
        return Err(RuntimeError::Shape(format!(
            "{op}: {} weights for {} outputs (at most {MAX_PRODUCTS})",
            weights.len(),
            outs.len()
        )));
    }
    for (w, out) in weights.iter().zip(outs.iter()) {
        let (n, cols, _, format) = w.shape();
        if cols != k {
            return Err(RuntimeError::Shape(format!(
                "{op}: {format} weights [{n}, {cols}] against activation rows of {k}"
            )));
        }
        if out.len() != m * n {
            return Err(RuntimeError::Shape(format!(
                "{op}: output of {} values for [{m}, {n}]",
                out.len()
            )));
        }
    }
    if m == 0 {
        return Ok(());
    }
    let mut dst: [Option<DisjointMut<f32>>; MAX_PRODUCTS] = Default::default();
    for (d, out) in dst.iter_mut().zip(outs.iter_mut()) {
        *d = Some(DisjointMut::new(out));
    }
    let total: usize = weights.iter().map(|w| w.shape().2).sum();
    // Each thread walks its own contiguous run of tiles (the next group is what its kernels
    // prefetch), a group at a time, and the last groups balance the threads.
    pool.parallel_segments(total, GROUP, |range| {
        // Map the global tile range onto each weight's own tiles.
        let mut first = 0;
        for (w, out) in weights.iter().zip(dst.iter().flatten()) {
            let t = w.shape().2;
            let (lo, hi) = (range.start.max(first), range.end.min(first + t));
            if lo < hi {
                run(w, lo - first..hi - first, out);
            }
            first += t;
        }
    });
    Ok(())
}

/// Tiles that stay in cache together while the activation rows pass them (and the unit of work
/// the pool balances).
const GROUP: usize = 4;

/// Walks `tiles` of a float weight ([`fpack`], tiled by 16 rows, `n` rows in all) against `m`
/// activation rows, storing into `out` (`[m, n]`). `kernel(tiles, rows, res)` fills
/// `res[j * rows.len() + i]` with tile `tiles.start + j` against activation row
/// `rows.start + i`, taking at most [`fpack::MAX_ROWS`] rows. With that many rows or fewer
/// (decode) one call covers a run of tiles; otherwise each group of four tiles stays in cache
/// while the rows pass it four at a time. (The int8 and bf16 products store straight from
/// their kernels: [`qdot::dot_rows`], [`bpack::dot_rows`].)
fn drive_tiles(
    n: usize,
    m: usize,
    tiles: Range<usize>,
    out: &DisjointMut<f32>,
    kernel: impl Fn(Range<usize>, Range<usize>, &mut [[f32; TILE]]),
) {
    /// Tiles per kernel call in decode; the result buffer stays small, as it is zeroed on
    /// every call.
    const CHUNK: usize = 8;
    const PER_CALL: usize = fpack::MAX_ROWS;
    let mut res = [[0f32; TILE]; CHUNK * PER_CALL];
    if m <= PER_CALL {
        let mut t = tiles.start;
        while t < tiles.end {
            let chunk = t..(t + CHUNK).min(tiles.end);
            let res = &mut res[..chunk.len() * m];
            kernel(chunk.clone(), 0..m, res);
            // SAFETY: these tiles' columns belong to this task.
            unsafe { store_results(res, n, chunk.clone(), 0..m, out) };
            t = chunk.end;
        }
        return;
    }
    // A few tiles at a time stay in cache while all rows pass them, four rows per call: one
    // call (and one build of its row views) per group of tiles, not per tile.
    let mut t = tiles.start;
    while t < tiles.end {
        let group = t..(t + GROUP).min(tiles.end);
        let mut i = 0;
        while i < m {
            let na = (m - i).min(PER_CALL);
            let res = &mut res[..group.len() * na];
            kernel(group.clone(), i..i + na, res);
            // SAFETY: these tiles' columns belong to this task.
            unsafe { store_results(res, n, group.clone(), i..i + na, out) };
            i += na;
        }
        t = group.end;
    }
}

multiversion! {
    /// Copies a kernel call's results (`res[j * rows.len() + i]`: tile `tiles.start + j`
    /// against row `rows.start + i`) into `out` (`[m, n]`), a whole tile as one 64-byte copy
    /// (one register store in the AVX-512 build; the baseline build took four).
    fn store_results_impl_mv(
        res: &[[f32; TILE]],
        n: usize,
        tiles: Range<usize>,
        rows: Range<usize>,
        out: &DisjointMut<f32>
    ) = store_results_impl;
}

/// [`store_results_impl_mv`].
///
/// # Safety
/// Columns `TILE * tiles.start .. TILE * tiles.end` (within `n`) of `rows` of `out` belong to
/// the caller's task alone.
unsafe fn store_results(
    res: &[[f32; TILE]],
    n: usize,
    tiles: Range<usize>,
    rows: Range<usize>,
    out: &DisjointMut<f32>,
) {
    store_results_impl_mv(res, n, tiles, rows, out)
}

#[inline(always)]
fn store_results_impl(
    res: &[[f32; TILE]],
    n: usize,
    tiles: Range<usize>,
    rows: Range<usize>,
    out: &DisjointMut<f32>,
) {
    let na = rows.len();
    for (j, tile) in tiles.enumerate() {
        let r0 = tile * TILE;
        let live = (n - r0).min(TILE);
        for (d, i) in rows.clone().enumerate() {
            let res = &res[j * na + d];
            // SAFETY: the caller of `store_results` owns these columns of these rows.
            let dst = unsafe { out.slice(i * n + r0, live) };
            match <&mut [f32; TILE]>::try_from(&mut *dst) {
                Ok(whole) => *whole = *res,
                Err(_) => dst.copy_from_slice(&res[..live]),
            }
        }
    }
}

/// Tiles `tiles` of `w` against every activation row, into `out` (`[m, n]`).
fn run_tiles(
    isa: Isa,
    acts: &Q8Acts,
    w: &PackedWeight,
    tiles: Range<usize>,
    out: &DisjointMut<f32>,
) {
    // SAFETY: these tiles' columns belong to this task (`over_tiles` splits the tiles), and
    // `isa` is the detected one.
    unsafe { qdot::dot_rows(isa, w, tiles, acts, 0..acts.rows(), GROUP, out) }
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ` with float weights in row tiles ([`fpack`]): f32
/// activations, tiles split over the pool, each tile staying in cache while the activation rows
/// pass it four at a time.
pub fn matmul_f(
    pool: &ThreadPool,
    isa: Isa,
    x: &[f32],
    w: &FloatPacked,
    out: &mut [f32],
) -> Result<()> {
    let (n, k) = (w.rows(), w.cols());
    if k == 0 || !x.len().is_multiple_of(k) || out.len() != x.len() / k * n {
        return Err(RuntimeError::Shape(format!(
            "matmul_f: [{n}, {k}] weights against {} activations into {} outputs",
            x.len(),
            out.len()
        )));
    }
    let m = x.len() / k;
    if m == 0 {
        return Ok(());
    }
    let out = DisjointMut::new(out);
    pool.parallel_ranges(w.tiles(), 1, |tiles| {
        drive_tiles(n, m, tiles, &out, |tiles, rows, res| {
            let xs: [&[f32]; fpack::MAX_ROWS] = std::array::from_fn(|d| {
                let r = (rows.start + d).min(rows.end - 1);
                &x[r * k..(r + 1) * k]
            });
            fpack::dot_tiles(isa, w, tiles, &xs[..rows.len()], res);
        });
    });
    Ok(())
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ` with `w` of shape `[n, k]` in any supported dtype.
pub fn matmul(pool: &ThreadPool, x: &[f32], w: &Tensor, out: &mut [f32]) -> Result<()> {
    let (n, k) = (w.rows(), w.cols());
    if k == 0 || !x.len().is_multiple_of(k) {
        return Err(RuntimeError::Shape(format!(
            "matmul: activations of {} values are not rows of {k}",
            x.len()
        )));
    }
    let m = x.len() / k;
    if out.len() != m * n {
        return Err(RuntimeError::Shape(format!(
            "matmul: output of {} values for [{m}, {n}]",
            out.len()
        )));
    }
    if m == 0 {
        return Ok(());
    }
    let out_shared = DisjointMut::new(out);
    pool.parallel_ranges(n, 4, |rows| {
        let mut wrow = vec![0f32; k];
        for r in rows {
            w.dequantize_row(r, &mut wrow);
            for (i, xrow) in x.chunks_exact(k).enumerate() {
                // SAFETY: element (i, r) belongs to the task owning weight row r alone.
                unsafe { out_shared.slice(i * n + r, 1)[0] = dot(xrow, &wrow) };
            }
        }
    });
    Ok(())
}

/// Adds `bias[n]` to every row of `out[m, n]`.
pub fn add_bias(out: &mut [f32], bias: &[f32]) {
    for row in out.chunks_exact_mut(bias.len()) {
        for (o, b) in row.iter_mut().zip(bias) {
            *o += b;
        }
    }
}

/// Dot product with 16 independent partial sums (vectorizes; fixed summation order). Always
/// inlined, so callers built for wider vectors (RMSNorm's) get it in their width.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; 16];
    let (ac, bc) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for j in 0..16 {
            acc[j] += x[j] * y[j];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ar.iter().zip(br) {
        tail += x * y;
    }
    for w in [8, 4, 2, 1] {
        for j in 0..w {
            acc[j] += acc[j + w];
        }
    }
    acc[0] + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    #[test]
    fn matches_naive_product() {
        let pool = ThreadPool::new(2).unwrap();
        let (m, n, k) = (3, 37, 40);
        let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let wv: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let w = Tensor::from_f32(vec![n, k], &wv).unwrap();
        let mut out = vec![0f32; m * n];
        matmul(&pool, &x, &w, &mut out).unwrap();
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k)
                    .map(|t| x[i * k + t] as f64 * wv[j * k + t] as f64)
                    .sum();
                assert!((out[i * n + j] as f64 - want).abs() < 1e-4);
            }
        }
        assert_eq!(w.dtype(), DType::F32);
        assert!(matmul(&pool, &x[..5], &w, &mut out).is_err());
    }

    /// Q8_0 weights built from `wv` (per block: scale max|w|/127, codes rounded).
    fn q8_0(n: usize, k: usize, wv: &[f32]) -> Tensor {
        let mut bytes = Vec::new();
        for blk in wv.chunks_exact(32) {
            let d = blk.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
            bytes.extend_from_slice(&half::f16::from_f32(d).to_bits().to_le_bytes());
            let d = half::f16::from_f32(d).to_f32();
            bytes.extend(blk.iter().map(|v| ((v / d).round() as i8) as u8));
        }
        Tensor::new(DType::Q8_0, vec![n, k], crate::Storage::owned(bytes)).unwrap()
    }

    #[test]
    fn int8_path_is_close_to_float_and_batch_invariant() {
        let pool = ThreadPool::new(2).unwrap();
        // 10 tiles (groups of 4, 4 and 2, the last tile partial) against 9 rows (4 + 4 + 1).
        let (m, n, k) = (9, 150, 96);
        let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let wv: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let w = q8_0(n, k, &wv);
        let (mut fast, mut reference) = (vec![0f32; m * n], vec![0f32; m * n]);
        let int8 = Linear::new(MatmulPrecision::Int8);
        let mut q = ActScratch::default();
        let wi = Weight::new(w.clone(), &int8, &pool).unwrap();
        assert!(wi.packed().is_some());
        let input = int8.prepare(&pool, &x, k, &mut q, &[&wi]);
        int8.matmul(&pool, &input, &wi, &mut fast).unwrap();
        matmul(&pool, &x, &w, &mut reference).unwrap();
        for (a, b) in fast.iter().zip(&reference) {
            assert!((a - b).abs() < 0.02 * k as f32 * 0.05 + 1e-3, "{a} vs {b}");
        }
        // Every row alone gives the same bits as inside the batch.
        for r in 0..m {
            let mut alone = vec![0f32; n];
            let mut q1 = ActScratch::default();
            let input = int8.prepare(&pool, &x[r * k..(r + 1) * k], k, &mut q1, &[&wi]);
            int8.matmul(&pool, &input, &wi, &mut alone).unwrap();
            assert_eq!(alone, fast[r * n..(r + 1) * n], "row {r}");
        }
        // The float setting never quantizes.
        let float = Linear::new(MatmulPrecision::Float);
        let mut q2 = ActScratch::default();
        let wf = Weight::new(w, &float, &pool).unwrap();
        assert!(wf.packed().is_none());
        let input = float.prepare(&pool, &x, k, &mut q2, &[&wf]);
        float.matmul(&pool, &input, &wf, &mut fast).unwrap();
        assert_eq!(fast, reference);
    }

    #[test]
    fn fused_norm_and_silu_preparation_equals_the_separate_steps() {
        use crate::Storage;
        let pool = ThreadPool::new(2).unwrap();
        let int8 = Linear::new(MatmulPrecision::Int8);
        let k = 96;
        let wv: Vec<f32> = (0..32 * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let bf16_bytes: Vec<u8> = wv
            .iter()
            .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
            .collect();
        let bf16 = Tensor::new(DType::BF16, vec![32, k], Storage::owned(bf16_bytes)).unwrap();
        let weights = [
            Weight::new(q8_0(32, k, &wv), &int8, &pool).unwrap(),
            Weight::new(bf16, &int8, &pool).unwrap(),
        ];
        let norm: Vec<f32> = (0..k).map(|i| 0.5 + (i as f32 * 0.3).sin().abs()).collect();
        // One row (the serial path) and 13 (split over the pool).
        for m in [1, 13] {
            let x0: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
            let h0: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.23).cos()).collect();
            for w in &weights {
                for add in [false, true] {
                    // Separate: add, norm, prepare.
                    let (mut xa, mut ha) = (x0.clone(), vec![0f32; m * k]);
                    if add {
                        xa.iter_mut().zip(&h0).for_each(|(a, b)| *a += b);
                    }
                    super::super::rms_norm(&xa, &norm, 1e-5, &mut ha);
                    let mut sa = ActScratch::default();
                    let a = int8.prepare(&pool, &ha, k, &mut sa, &[w]);
                    let mut outa = vec![0f32; m * 32];
                    int8.matmul(&pool, &a, w, &mut outa).unwrap();
                    // Fused.
                    let (mut xb, mut hb) = (x0.clone(), h0.clone());
                    let mut sb = ActScratch::default();
                    let b = int8.add_norm_prepare(
                        &pool,
                        &mut xb,
                        &mut hb,
                        add,
                        &norm,
                        1e-5,
                        &mut sb,
                        &[w],
                    );
                    let mut outb = vec![0f32; m * 32];
                    int8.matmul(&pool, &b, w, &mut outb).unwrap();
                    assert_eq!(b.x, &ha[..]);
                    assert_eq!(xb, xa);
                    assert_eq!(outb, outa, "m {m} add {add}");
                }
                // SiLU-gated product.
                let (mut ga, up) = (x0.clone(), h0.clone());
                super::super::silu_mul(&mut ga, &up);
                let mut sa = ActScratch::default();
                let a = int8.prepare(&pool, &ga, k, &mut sa, &[w]);
                let mut outa = vec![0f32; m * 32];
                int8.matmul(&pool, &a, w, &mut outa).unwrap();
                let mut gb = x0.clone();
                let mut sb = ActScratch::default();
                let b = int8.silu_mul_prepare(&pool, &mut gb, &up, k, &mut sb, &[w]);
                let mut outb = vec![0f32; m * 32];
                int8.matmul(&pool, &b, w, &mut outb).unwrap();
                assert_eq!(b.x, &ga[..]);
                assert_eq!(outb, outa, "silu m {m}");
            }
        }
    }
}
