//! Portable CPU kernels. Every kernel is one function over plain slices (activations in f32,
//! weights as [`crate::Tensor`]s in their stored format), so a SIMD or CUDA version replaces a
//! single function. Parallel kernels split their output over the [`crate::ThreadPool`] by rows or
//! (token, head) pairs; results never depend on the number of threads or on batch-mates.

mod activation;
mod ahead;
mod aligned;
mod attention;
pub mod bpack;
mod dst;
mod embedding;
pub mod fpack;
mod kv_dtype;
mod linear;
mod matmul;
mod norm;
mod qacts;
pub mod qdot;
pub mod qpack;
mod rope;
pub mod simd;
pub mod stream;

pub use activation::{gated_mul, gelu_tanh_mul, silu_mul, GatedAct};
pub use attention::{
    paged_attention, paged_attention_scaled, write_kv, write_kv_par, write_kv_scaled,
    AttentionShape, KvLayerMut, RowScales, MAX_BLOCK_SIZE, MAX_HEAD_DIM,
};
pub use embedding::embedding;
pub use kv_dtype::{zeroed_vec, KvDtype, KvElem, SCALE_GROUP};
pub use linear::{ActScratch, Linear, LinearInput, MatmulPrecision, Weight};
pub use matmul::{add_bias, dot, matmul, matmul_b16_many, matmul_f, matmul_q8};
pub use norm::{rms_norm, rms_norm_in_place};
pub use rope::{Rope, RopeScaling};

/// A mutable slice shared by parallel tasks that write disjoint parts of it.
struct DisjointMut<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: tasks only create non-overlapping sub-slices (each kernel documents its partition),
// and the pool joins all tasks before the borrow of the underlying slice ends.
unsafe impl<T: Send> Sync for DisjointMut<T> {}

impl<T> DisjointMut<T> {
    fn new(s: &mut [T]) -> Self {
        DisjointMut {
            ptr: s.as_mut_ptr(),
            len: s.len(),
        }
    }

    /// # Safety
    /// No two live slices obtained from `self` may overlap.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        assert!(start <= self.len && len <= self.len - start);
        // SAFETY: in bounds (checked above); disjointness is the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}

/// Elements below which the elementwise wrappers below run on the calling thread (a pool
/// hand-off costs about as much as this much work).
const PAR_MIN: usize = 1 << 15;

/// `x += y`, split over `pool` for large inputs.
pub fn add_par(pool: &crate::ThreadPool, x: &mut [f32], y: &[f32]) {
    let n = x.len().min(y.len());
    let add = |x: &mut [f32], y: &[f32]| x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
    if n < PAR_MIN || pool.num_threads() == 1 {
        return add(x, y);
    }
    let xs = DisjointMut::new(x);
    pool.parallel_ranges(n.div_ceil(64), 64, |r| {
        let (lo, hi) = (r.start * 64, (r.end * 64).min(n));
        // SAFETY: the ranges of different tasks do not overlap.
        add(unsafe { xs.slice(lo, hi - lo) }, &y[lo..hi]);
    });
}
