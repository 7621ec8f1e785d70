//! Which binary a launch takes: every kernel ships a generic binary and an aligned one that
//! assumes its hinted parameters divisible by 16 (`kernels/specs.py` `aligned_hints`). The
//! launcher takes the aligned one only when every hinted pointer (offsets into buffers
//! included) and integer qualifies, and the generic one otherwise; both give the reference's
//! result. On the interpreted device the worker also refuses an aligned launch whose hints
//! do not hold, so a wrong choice could not pass unseen.
//!
//! Runs on the interpreted device (skipped without its venv, a failure under CI) and on CUDA
//! device 0 when there is one.
// The helper's device calls fail the test when they fail.
#![allow(clippy::unwrap_used)]

mod common;
use common::devices;
use ferrum_runtime::cuda::{DevicePtr, Gpu, KernelArg, VariantLaunches};

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| {
            let h = (i ^ seed).wrapping_mul(2_654_435_761).rotate_left(13);
            (h % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// One `gemm_f32_decode` launch: `y[m, n] = x[m, k] @ w[n, k].T`, `x` read at byte offset
/// `x_offset` of its buffer with row stride `x_stride`. Returns the variant counts it added
/// and checks the result against the host.
fn gemm(
    gpu: &mut Gpu,
    m: usize,
    n: usize,
    k: usize,
    x_stride: usize,
    x_offset: usize,
) -> VariantLaunches {
    let name = "gemm_f32_decode";
    let x = values(m * x_stride, 1);
    let w = values(n * k, 2);
    let mut bytes = vec![0u8; x_offset];
    bytes.extend(x.iter().flat_map(|v| v.to_le_bytes()));
    let dx = gpu.alloc(bytes.len()).unwrap();
    gpu.write(dx, &bytes).unwrap();
    let dw = gpu.upload_f32(&w).unwrap();
    let dy = gpu.upload_f32(&vec![f32::NAN; m * n]).unwrap();
    let args = [
        KernelArg::Ptr(dx.offset(x_offset)),
        KernelArg::Ptr(dw),
        KernelArg::Ptr(DevicePtr::NULL),
        KernelArg::Ptr(dy),
        KernelArg::I32(m as i32),
        KernelArg::I32(n as i32),
        KernelArg::I32(k as i32),
        KernelArg::I32(x_stride as i32),
        KernelArg::I32(n as i32),
    ];
    let block_n = gpu.constexpr(name, "BLOCK_N").unwrap() as usize;
    let block_m = gpu.constexpr(name, "BLOCK_M").unwrap() as usize;
    let before = gpu.variant_launches(name).expect("kernel");
    let grid = [m.div_ceil(block_m) as u32, n.div_ceil(block_n) as u32, 1];
    gpu.launch(name, grid, &args).unwrap();
    let after = gpu.variant_launches(name).expect("kernel");
    let got = gpu.download_f32(dy, m * n).unwrap();
    for r in 0..m {
        for c in 0..n {
            let want: f64 = (0..k)
                .map(|j| x[r * x_stride + j] as f64 * w[c * k + j] as f64)
                .sum();
            let err = (got[r * n + c] as f64 - want).abs();
            assert!(
                err <= 1e-4 * (1.0 + want.abs()),
                "y[{r}, {c}] = {} for {want}",
                got[r * n + c]
            );
        }
    }
    for p in [dx, dw, dy] {
        gpu.free(p).unwrap();
    }
    VariantLaunches {
        generic: after.generic - before.generic,
        aligned: after.aligned - before.aligned,
    }
}

const ALIGNED: VariantLaunches = VariantLaunches {
    generic: 0,
    aligned: 1,
};
const GENERIC: VariantLaunches = VariantLaunches {
    generic: 1,
    aligned: 0,
};

#[test]
fn every_kernel_has_both_binaries_and_its_hints_name_its_parameters() {
    for gpu in devices() {
        let spec = gpu.spec("gemm_bf16_decode").expect("kernel");
        let hints = &spec.aligned.as_ref().expect("aligned variant").hints;
        for want in ["x_ptr", "w_ptr", "y_ptr", "k", "x_stride"] {
            assert!(hints.iter().any(|h| h == want), "{want} not in {hints:?}");
        }
        assert!(
            !hints.iter().any(|h| h == "m"),
            "the row count is not hinted"
        );
    }
}

#[test]
fn aligned_arguments_take_the_aligned_binary() {
    for mut gpu in devices() {
        assert_eq!(
            gemm(&mut gpu, 3, 48, 64, 80, 0),
            ALIGNED,
            "{}",
            gpu.describe()
        );
        // An offset into a buffer that keeps 16-byte alignment qualifies too.
        assert_eq!(
            gemm(&mut gpu, 3, 48, 64, 80, 64),
            ALIGNED,
            "{}",
            gpu.describe()
        );
    }
}

#[test]
fn a_misaligned_offset_takes_the_generic_binary() {
    for mut gpu in devices() {
        // x starts one f32 into its buffer: 4-byte aligned, not 16.
        assert_eq!(
            gemm(&mut gpu, 3, 48, 64, 80, 4),
            GENERIC,
            "{}",
            gpu.describe()
        );
        assert_eq!(
            gemm(&mut gpu, 2, 48, 64, 80, 8),
            GENERIC,
            "{}",
            gpu.describe()
        );
    }
}

#[test]
fn a_hinted_size_or_stride_off_16_takes_the_generic_binary() {
    for mut gpu in devices() {
        // k not a multiple of 16.
        assert_eq!(
            gemm(&mut gpu, 3, 48, 100, 112, 0),
            GENERIC,
            "{}",
            gpu.describe()
        );
        // The row stride not a multiple of 16 (so row 1 of x is misaligned).
        assert_eq!(
            gemm(&mut gpu, 3, 48, 64, 70, 0),
            GENERIC,
            "{}",
            gpu.describe()
        );
        // n not a multiple of 16.
        assert_eq!(
            gemm(&mut gpu, 3, 40, 64, 80, 0),
            GENERIC,
            "{}",
            gpu.describe()
        );
        // The row count is not hinted: any m keeps the aligned binary.
        assert_eq!(
            gemm(&mut gpu, 5, 48, 64, 80, 0),
            ALIGNED,
            "{}",
            gpu.describe()
        );
    }
}

/// The profile names each launch's kernel and the binary it took, and counts a graph replay
/// as one entry (`graph replay`), as the engine's `--profile-kernels` reports them: on the
/// interpreted device too (host-clock times), so a GPU round's script runs end to end in CI.
#[test]
fn the_profile_counts_launches_by_binary_and_replays_as_one() {
    use ferrum_runtime::cuda::Variant;
    for mut gpu in devices() {
        gpu.set_profiling(true).unwrap();
        gemm(&mut gpu, 3, 48, 64, 80, 0);
        gemm(&mut gpu, 3, 48, 64, 80, 4);
        gemm(&mut gpu, 2, 48, 64, 80, 0);
        // One launch captured, replayed twice.
        let (x, y) = (
            gpu.upload_f32(&values(64, 3)).unwrap(),
            gpu.upload_f32(&[0.0; 16]).unwrap(),
        );
        let w = gpu.upload_f32(&values(16 * 64, 4)).unwrap();
        let args = [
            KernelArg::Ptr(x),
            KernelArg::Ptr(w),
            KernelArg::Ptr(DevicePtr::NULL),
            KernelArg::Ptr(y),
            KernelArg::I32(1),
            KernelArg::I32(16),
            KernelArg::I32(64),
            KernelArg::I32(64),
            KernelArg::I32(16),
        ];
        gpu.begin_capture().unwrap();
        gpu.launch("gemm_f32_decode", [1, 1, 1], &args).unwrap();
        let graph = gpu.end_capture().unwrap().expect("a graph");
        gpu.replay(graph).unwrap();
        gpu.replay(graph).unwrap();
        let profile = gpu.profile().unwrap();
        let count = |name: &str, variant: Variant| -> u64 {
            let rows = profile
                .iter()
                .filter(|t| t.name == name && t.variant == variant);
            rows.map(|t| t.launches).sum()
        };
        let dev = gpu.describe();
        assert_eq!(count("gemm_f32_decode", Variant::Aligned), 2, "{dev}");
        assert_eq!(count("gemm_f32_decode", Variant::Generic), 1, "{dev}");
        assert_eq!(count("graph replay", Variant::Generic), 2, "{dev}");
        assert!(profile.iter().all(|t| t.total_ms >= 0.0), "{dev}");
        // Each call starts a new tally; off, there is none.
        gpu.set_profiling(true).unwrap();
        assert!(gpu.profile().unwrap().is_empty(), "{dev}");
        gpu.set_profiling(false).unwrap();
        assert!(gpu.profile().is_err(), "{dev}");
        gpu.drop_graph(graph).unwrap();
        for p in [x, y, w] {
            gpu.free(p).unwrap();
        }
    }
}
