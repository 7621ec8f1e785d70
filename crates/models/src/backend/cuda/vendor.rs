//! Float products of more than `decode_m` rows on the device's vendor library (cuBLASLt):
//! prefill chunks, batched decode, the LM head at batch ([`GemmChoice`]).
//!
//! A product's f32 input is first rounded to the weight's half type into a buffer of its own
//! (`cast_rows_*`, or `gated_*_{bf16,f16}` for the MLP's down product, which takes
//! `act(gate) * up`), to nearest even as the Triton product kernels round their input tiles;
//! the library then multiplies with f32 accumulation into the f32 output. Products of at most
//! `decode_m` rows, f32 and block-format weights, and any shape the library does not take
//! stay on the Triton kernels, which give the same bits as before.
//!
//! Invariants: whether the library takes a shape is asked once per shape and remembered (a
//! graph capture never asks: the step before it, run plainly with the same shapes, did); a
//! product goes to the library only after it said it takes it, so a refusal falls back before
//! anything was launched.

use std::collections::HashMap;
use std::path::Path;

use ferrum_runtime::cpu::GatedAct;
use ferrum_runtime::cuda::{DevicePtr, Gemm, GemmSupport, GemmType, Stream};
use ferrum_runtime::DType;

use super::{args, cdiv, i32_arg, p, CudaBackend, GpuWeight, Grown};
use crate::{GemmChoice, ModelError, Result};

/// What decides whether the library takes a product: sizes, the output's stride, the type,
/// and the alignment (up to 16 bytes) of the weight's and the output's addresses.
type Shape = (usize, usize, usize, usize, DType, u32, u32);

/// The vendor path's state.
#[derive(Debug, Default)]
pub(super) struct Vendor {
    /// Whether products may go to the library: chosen, and it opened.
    on: bool,
    /// What products of more than `decode_m` rows run on, in words (the line at start).
    note: String,
    /// Per shape, whether the library takes it.
    takes: HashMap<Shape, bool>,
    /// The half-precision copy of a product's input (a graph holds its address).
    pub(super) half: Grown,
    /// Products run on the library, for tests and reports.
    products: u64,
}

fn align(ptr: DevicePtr) -> u32 {
    if ptr.0 == 0 {
        16
    } else {
        (1u32 << ptr.0.trailing_zeros().min(4)).min(16)
    }
}

impl CudaBackend {
    /// Chooses what products of more than `decode_m` rows run on, opening the vendor
    /// library (at `library` when given) unless `choice` is Triton. `Auto` falls back to the
    /// Triton products when no library opens; `CublasLt` makes that an error. Returns the
    /// choice in words, the line a server prints at start.
    pub fn set_gemm(&mut self, choice: GemmChoice, library: Option<&Path>) -> Result<String> {
        let opened = match choice {
            GemmChoice::Triton => Err("--gemm triton".to_string()),
            GemmChoice::Auto | GemmChoice::CublasLt => self
                .gpu
                .lock()
                .open_gemm(library)
                .map_err(|e| e.to_string()),
        };
        let v = &mut self.vendor;
        v.takes.clear();
        (v.on, v.note) = match (opened, choice) {
            (Ok(lib), _) => (
                true,
                format!(
                    "products of more than {} rows (bf16/f16 weights): {lib}",
                    self.dispatch.decode_m
                ),
            ),
            (Err(e), GemmChoice::CublasLt) => {
                return Err(ModelError::Invalid(format!(
                    "--gemm cublaslt: cuBLASLt did not open: {e}"
                )))
            }
            (Err(why), _) => (
                false,
                format!(
                    "products of more than {} rows: the Triton kernels ({why})",
                    self.dispatch.decode_m
                ),
            ),
        };
        Ok(self.vendor.note.clone())
    }

    /// What products of more than `decode_m` rows run on, in words.
    pub fn gemm_note(&self) -> &str {
        &self.vendor.note
    }

    /// Products run on the vendor library so far.
    pub fn vendor_products(&self) -> u64 {
        self.vendor.products
    }

    /// `y[m, w.rows] = in[m, w.cols] @ w^T` on the vendor library, where `in` is `x` (f32, row
    /// stride `x.1`), or with `gated` (`up` and its stride, the activation) `act(x) * up`.
    /// `false`: not taken (few rows, a weight type it does not read, a shape it refuses);
    /// nothing was launched and the caller runs the Triton product.
    pub(super) fn vendor_gemm(
        &mut self,
        (x, x_stride): (DevicePtr, usize),
        w: &GpuWeight,
        (y, y_stride): (DevicePtr, usize),
        m: usize,
        gated: Option<(DevicePtr, usize, GatedAct)>,
    ) -> Result<bool> {
        let input = match w.dtype {
            DType::BF16 => GemmType::BF16,
            DType::F16 => GemmType::F16,
            _ => return Ok(false),
        };
        if !self.vendor.on || m <= self.dispatch.decode_m {
            return Ok(false);
        }
        let (n, k) = (w.rows, w.cols);
        let half = self.vendor.half.ensure(&self.gpu, 2 * m * k)?;
        let call = Gemm {
            m,
            n,
            k,
            a: half,
            a_stride: k,
            b: w.buf.ptr(),
            b_stride: k,
            input,
            d: y,
            d_stride: y_stride,
            output: GemmType::F32,
        };
        let shape = (m, n, k, y_stride, w.dtype, align(w.buf.ptr()), align(y));
        let takes = match self.vendor.takes.get(&shape) {
            Some(&t) => t,
            // A capture asks nothing; the plain step before it asked for the same shapes.
            None if self.gpu.lock().is_capturing() => false,
            None => {
                let support = self.gpu.lock().gemm_support(&call);
                let t = matches!(support, Ok(GemmSupport::Supported));
                self.vendor.takes.insert(shape, t);
                t
            }
        };
        if !takes {
            return Ok(false);
        }
        let short = if input == GemmType::BF16 {
            "bf16"
        } else {
            "f16"
        };
        let (kx, kk) = (i32_arg(x_stride, "row stride")?, i32_arg(k, "columns")?);
        match gated {
            None => {
                let name = format!("cast_rows_{short}");
                let grid = [m as u32, cdiv(k, self.block(&name, "BLOCK")?), 1];
                let args =
                    args![x_ptr: p(x), y_ptr: p(half), n_cols: kk, x_stride: kx, y_stride: kk];
                self.launch(&name, grid, &args)?;
            }
            Some((up, up_stride, act)) => {
                let name = match act {
                    GatedAct::Silu => format!("gated_silu_{short}"),
                    GatedAct::GeluTanh => format!("gated_gelu_tanh_{short}"),
                };
                let grid = [m as u32, cdiv(k, self.block(&name, "BLOCK")?), 1];
                let ku = i32_arg(up_stride, "row stride")?;
                let args = args![
                    gate_ptr: p(x),
                    up_ptr: p(up),
                    out_ptr: p(half),
                    n: kk,
                    gate_stride: kx,
                    up_stride: ku,
                    out_stride: kk,
                ];
                self.launch(&name, grid, &args)?;
            }
        }
        self.gpu
            .lock()
            .gemm(&call, Stream::MAIN)
            .map_err(|e| ModelError::gpu(format!("vendor product {m} x {n} x {k}"), e))?;
        self.vendor.products += 1;
        Ok(true)
    }
}
