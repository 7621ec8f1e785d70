//! The linear-layer API the forward passes use: a [`Weight`] in the form its kernel reads
//! (repacked at load on the fast setting), [`Linear`] (precision and instruction set), and the
//! preparation of a layer's input ([`Linear::prepare`] and its fused forms with the residual
//! add and RMSNorm or the SiLU-gated product), converted once into what its kernels take
//! (8-bit codes, bf16 rows). Products go to the drivers in [`super::matmul`].
//!
//! Invariant: a weight has exactly one kernel form ([`Form`]); every input conversion is
//! row by row, so results never depend on the batch or the thread count.

use super::bpack::{self, Bf16Acts, Bf16Packed};
use super::fpack::FloatPacked;
use super::matmul::{matmul, matmul_b16_many, matmul_f, matmul_q8, matmul_q8_many, MAX_PRODUCTS};
use super::qdot::{self, Isa, Q8Acts};
use super::qpack::PackedWeight;
use super::DisjointMut;
use crate::{DType, Result, Tensor, ThreadPool};
use std::ops::Range;

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

/// The form the kernels read a weight in, built once at load.
#[derive(Debug, Clone)]
enum Form {
    /// The stored tensor itself (the float setting, or a format without a fast kernel).
    Stored,
    /// Block-quantized weights repacked for the int8 kernel.
    Quant(PackedWeight),
    /// Float weights in row tiles for the fast float kernel.
    Float(FloatPacked),
    /// bf16 weights in paired row tiles for the bf16 kernel (CPUs with AVX-512 BF16).
    Bf16(Bf16Packed),
}

/// A linear layer's weight `[n, k]`: the stored tensor and the form the kernels read (on the
/// int8 setting, a repacked one, built once at load).
#[derive(Debug, Clone)]
pub struct Weight {
    tensor: Tensor,
    form: Form,
}

impl Weight {
    /// Wraps `tensor`, repacking it when `linear` takes a fast kernel for its format.
    pub fn new(tensor: Tensor, linear: &Linear, pool: &ThreadPool) -> Result<Weight> {
        let fast = linear.precision == MatmulPrecision::Int8 && tensor.cols() > 0;
        let dtype = tensor.dtype();
        let form = if fast && qdot::supports(dtype) {
            Form::Quant(PackedWeight::pack(&tensor, pool)?)
        } else if fast && linear.bf16 && dtype == DType::BF16 {
            Form::Bf16(Bf16Packed::pack(&tensor, pool)?)
        } else if fast && matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            Form::Float(FloatPacked::pack(&tensor, pool)?)
        } else {
            Form::Stored
        };
        if !matches!(form, Form::Stored) {
            // The kernels read only the repacked form: the file's pages need not stay resident
            // beside it (they fault back in if the stored bytes are read again).
            tensor.release_pages();
        }
        Ok(Weight { tensor, form })
    }

    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// The form repacked for the int8 kernel, if this weight takes it.
    pub fn packed(&self) -> Option<&PackedWeight> {
        match &self.form {
            Form::Quant(p) => Some(p),
            _ => None,
        }
    }

    fn bf16_packed(&self) -> Option<&Bf16Packed> {
        match &self.form {
            Form::Bf16(p) => Some(p),
            _ => None,
        }
    }

    pub fn rows(&self) -> usize {
        self.tensor.rows()
    }

    pub fn cols(&self) -> usize {
        self.tensor.cols()
    }

    /// Bytes the kernels read: the repacked form when there is one.
    pub fn num_bytes(&self) -> usize {
        match &self.form {
            Form::Quant(p) => p.num_bytes(),
            Form::Float(f) => f.num_bytes(),
            Form::Bf16(b) => b.num_bytes(),
            Form::Stored => self.tensor.num_bytes(),
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

    /// `gate = act(gate) * up` ([`super::gated_mul`]) fused with [`Linear::prepare`] for
    /// `weights` (rows of `k`): one pass over the rows, the same bits as the separate steps.
    #[allow(clippy::too_many_arguments)]
    pub fn gated_prepare<'a>(
        &self,
        pool: &ThreadPool,
        act: super::GatedAct,
        gate: &'a mut [f32],
        up: &[f32],
        k: usize,
        scratch: &'a mut ActScratch,
        weights: &[&Weight],
    ) -> LinearInput<'a> {
        assert_eq!(
            gate.len(),
            up.len(),
            "gated_prepare: gate and up differ in size"
        );
        let forms = forms(gate.len(), k, weights);
        let gs = DisjointMut::new(gate);
        convert_rows(pool, gs.len, k, scratch, forms, |rows, conv| {
            let span = rows.start * k..rows.end * k;
            // SAFETY: the row ranges of different tasks do not overlap.
            let g = unsafe { gs.slice(span.start, span.len()) };
            super::gated_mul(act, g, &up[span]);
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
            let packed = gather(products, |w| w.packed().filter(|p| p.cols() == q.cols()));
            if let Some((ws, mut outs)) = packed {
                let n = products.len();
                return matmul_q8_many(pool, self.isa, q, &ws[..n], &mut outs[..n]);
            }
        }
        if let Some(b) = input.b {
            let packed = gather(products, |w| {
                w.bf16_packed().filter(|p| p.cols() == b.cols())
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
        match (&w.form, input.q, input.b) {
            (Form::Quant(p), Some(q), _) if q.cols() == p.cols() => {
                matmul_q8(pool, self.isa, q, p, out)
            }
            (Form::Bf16(p), _, Some(b)) if b.cols() == p.cols() => {
                matmul_b16_many(pool, b, &[p], &mut [out])
            }
            // A bf16 weight met by an input without its bf16 rows takes the plain product, as
            // one the CPU has no bf16 kernel for.
            (Form::Float(f), ..) => matmul_f(pool, self.isa, input.x, f, out),
            _ => matmul(pool, input.x, &w.tensor, out),
        }
    }
}

/// Which converted forms of a `[len / k, k]` input `weights` take: (int8 codes, bf16).
fn forms(len: usize, k: usize, weights: &[&Weight]) -> (bool, bool) {
    let rows = k > 0 && len.is_multiple_of(k) && len > 0;
    let int8 = rows
        && k.is_multiple_of(qdot::QK)
        && weights
            .iter()
            .any(|w| w.packed().is_some() && w.cols() == k);
    let bf16 = rows
        && weights
            .iter()
            .any(|w| w.bf16_packed().is_some() && w.cols() == k);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Tensor};

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
        super::super::matmul(&pool, &x, &w, &mut reference).unwrap();
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
                let b = int8.gated_prepare(
                    &pool,
                    super::super::GatedAct::Silu,
                    &mut gb,
                    &up,
                    k,
                    &mut sb,
                    &[w],
                );
                let mut outb = vec![0f32; m * 32];
                int8.matmul(&pool, &b, w, &mut outb).unwrap();
                assert_eq!(b.x, &ga[..]);
                assert_eq!(outb, outa, "silu m {m}");
            }
        }
    }
}
