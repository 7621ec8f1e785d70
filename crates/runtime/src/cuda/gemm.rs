//! Vendor matrix products as device operations: [`Gemm`], the engine's `x @ wᵀ` in its own
//! row-major terms, and [`LtMatmul`], the same product in cuBLASLt's column-major ones, which
//! both drivers run (cuBLASLt on a GPU, numpy under cuBLASLt's layout rules on the interpreted
//! device), so the translation between the two is tested in CI.
//!
//! Invariants: a [`Gemm`] is checked ([`Gemm::check`]) before it reaches a driver: sizes are
//! non-zero, every row stride covers its row, the inputs share one half-precision type and the
//! output is f32 or that type. The product accumulates in f32 and adds nothing (no bias, beta
//! 0); each output element is written once.

use serde::Serialize;

use super::gpu::DevicePtr;
use crate::{Result, RuntimeError};

/// Element types a vendor product reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GemmType {
    F32,
    F16,
    BF16,
}

impl GemmType {
    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            GemmType::F32 => 4,
            GemmType::F16 | GemmType::BF16 => 2,
        }
    }

    /// The type's name (`f32`, `f16`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            GemmType::F32 => "f32",
            GemmType::F16 => "f16",
            GemmType::BF16 => "bf16",
        }
    }
}

/// `d[m, n] = a[m, k] · b[n, k]ᵀ`, row-major: `m` rows of activations `a` (row stride
/// `a_stride` elements) times a weight `b` stored as `n` rows of `k` (row stride `b_stride`),
/// into `d` (row stride `d_stride`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: DevicePtr,
    pub a_stride: usize,
    pub b: DevicePtr,
    pub b_stride: usize,
    /// The type of `a` and `b`.
    pub input: GemmType,
    pub d: DevicePtr,
    pub d_stride: usize,
    pub output: GemmType,
}

/// The product in cuBLASLt's terms: column-major `D (m x n, ldd) = op(A) · op(B)` with
/// `op(A)` of `m x k` and `op(B)` of `k x n`; `trans_a` means A is stored `k x m` (lda >= k)
/// and read transposed, otherwise `m x k` (lda >= m); likewise B. Pointers are device
/// addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub(crate) struct LtMatmul {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub a: u64,
    pub lda: u64,
    pub b: u64,
    pub ldb: u64,
    pub input: GemmType,
    pub d: u64,
    pub ldd: u64,
    pub output: GemmType,
}

impl LtMatmul {
    /// What decides whether the library runs it and with which algorithm: everything but
    /// the addresses, whose alignment (the largest power of two up to 16 dividing each)
    /// stands in for them.
    pub(crate) fn key(&self) -> LtMatmul {
        let align = |p: u64| {
            if p == 0 {
                16
            } else {
                (1 << p.trailing_zeros()).min(16)
            }
        };
        LtMatmul {
            a: align(self.a),
            b: align(self.b),
            d: align(self.d),
            ..*self
        }
    }
}

/// Whether a device runs a vendor product.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GemmSupport {
    Supported,
    /// Not this product (no library, or none of its algorithms takes the shape), and why.
    Unsupported(String),
}

impl Gemm {
    /// Refuses a product no driver should be given, naming what is wrong.
    pub fn check(&self) -> Result<()> {
        let bad = |what: String| Err(RuntimeError::Kernels(format!("vendor product: {what}")));
        if self.m == 0 || self.n == 0 || self.k == 0 {
            return bad(format!("empty shape {} x {} x {}", self.m, self.n, self.k));
        }
        if self.input == GemmType::F32 {
            return bad("f32 inputs (the vendor path takes f16 or bf16)".into());
        }
        if self.output != GemmType::F32 && self.output != self.input {
            return bad(format!(
                "{} output from {} inputs",
                self.output.name(),
                self.input.name()
            ));
        }
        for (name, stride, row) in [
            ("a", self.a_stride, self.k),
            ("b", self.b_stride, self.k),
            ("d", self.d_stride, self.n),
        ] {
            if stride < row {
                return bad(format!(
                    "{name}'s row stride {stride} is shorter than its row {row}"
                ));
            }
        }
        if [self.a, self.b, self.d].contains(&DevicePtr::NULL) {
            return bad("a null operand".into());
        }
        Ok(())
    }

    /// The same product in cuBLASLt's column-major terms. A row-major `[rows, cols]` matrix
    /// with row stride `s` is a column-major `cols x rows` one with leading dimension `s`, so
    /// `dᵀ (n x m) = b (k x n, read transposed) · aᵀ (k x m)`: A is the weight, transposed;
    /// B the activations; D the output.
    pub(crate) fn lt(&self) -> LtMatmul {
        LtMatmul {
            trans_a: true,
            trans_b: false,
            m: self.n as u64,
            n: self.m as u64,
            k: self.k as u64,
            a: self.b.0,
            lda: self.b_stride as u64,
            b: self.a.0,
            ldb: self.a_stride as u64,
            input: self.input,
            d: self.d.0,
            ldd: self.d_stride as u64,
            output: self.output,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn product() -> Gemm {
        Gemm {
            m: 3,
            n: 5,
            k: 7,
            a: DevicePtr(0x1000),
            a_stride: 8,
            b: DevicePtr(0x2000),
            b_stride: 7,
            input: GemmType::BF16,
            d: DevicePtr(0x3008),
            d_stride: 6,
            output: GemmType::F32,
        }
    }

    #[test]
    fn row_major_products_become_transposed_column_major_ones() {
        let lt = product().lt();
        assert!(lt.trans_a && !lt.trans_b);
        assert_eq!((lt.m, lt.n, lt.k), (5, 3, 7));
        assert_eq!((lt.a, lt.lda, lt.b, lt.ldb), (0x2000, 7, 0x1000, 8));
        assert_eq!((lt.d, lt.ldd), (0x3008, 6));
        // The key keeps the shape and the alignments only.
        let key = lt.key();
        assert_eq!((key.a, key.b, key.d), (16, 16, 8));
        assert_eq!(key.m, 5);
    }

    #[test]
    fn bad_products_are_refused_by_name() {
        type Spoil = fn(&mut Gemm);
        let cases: [(Spoil, &str); 5] = [
            (|g| g.k = 0, "empty shape"),
            (|g| g.input = GemmType::F32, "f32 inputs"),
            (|g| g.output = GemmType::F16, "f16 output from bf16"),
            (|g| g.d_stride = 4, "d's row stride 4"),
            (|g| g.b = DevicePtr::NULL, "null operand"),
        ];
        for (spoil, want) in cases {
            let mut g = product();
            spoil(&mut g);
            let err = g.check().unwrap_err().to_string();
            assert!(err.contains(want), "{err} should name {want}");
        }
        assert!(product().check().is_ok());
    }
}
