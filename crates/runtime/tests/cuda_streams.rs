//! The device layer's streams, events, copies, host buffers and vendor products ([`Gpu`]), on
//! every device present (the interpreted device in CI, CUDA device 0 when there is one; see
//! `common`).
//!
//! The interpreted device runs side streams' work as late as events allow, so the tests that
//! leave a wait out on purpose see the late result there (on a GPU the outcome of a missing
//! wait is a race, and those checks are skipped). Vendor products are checked against an f64
//! host product of the same half-precision operands: f32 accumulation in another order, so
//! within `2e-5` of the largest |reference| for f32 outputs and one bf16 rounding step for
//! bf16 outputs.

#![allow(clippy::unwrap_used)]

mod common;
use common::devices;
use ferrum_runtime::cuda::{
    DevicePtr, Gemm, GemmSupport, GemmType, Gpu, InterpretedGemm, InterpreterConfig, KernelArg,
    Stream,
};
use ferrum_types::splitmix::SplitMix64;
use half::bf16;

fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut r = SplitMix64::new(seed);
    (0..n)
        .map(|_| (r.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        .collect()
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn is_interpreted(gpu: &Gpu) -> bool {
    gpu.describe().starts_with("interpreted")
}

/// `x += y` over `n` f32 on `stream`.
fn add(gpu: &mut Gpu, x: DevicePtr, y: DevicePtr, n: usize, stream: Stream) {
    let block = gpu.constexpr("add_rows", "BLOCK").unwrap() as usize;
    let grid = [1, n.div_ceil(block) as u32, 1];
    let i = KernelArg::I32(n as i32);
    let args = [KernelArg::Ptr(x), KernelArg::Ptr(y), i, i, i];
    gpu.launch_on(stream, "add_rows", grid, &args).unwrap();
}

#[test]
fn a_copy_on_a_side_stream_sees_what_events_order_before_it() {
    for mut gpu in devices() {
        let dev = gpu.describe();
        let n = 200;
        let (x, y) = (values(1, n), values(2, n));
        let (dx, dy) = (gpu.upload_f32(&x).unwrap(), gpu.upload_f32(&y).unwrap());
        let side = gpu.create_stream().unwrap();
        let (ready, done) = (gpu.create_event().unwrap(), gpu.create_event().unwrap());
        let host = gpu.alloc_host(4 * n).unwrap();
        let once: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
        let twice: Vec<f32> = once.iter().zip(&y).map(|(a, b)| a + b).collect();

        // Ordered: the copy after the first add (event), the second add after the copy.
        add(&mut gpu, dx, dy, n, Stream::MAIN);
        gpu.record(&ready, Stream::MAIN).unwrap();
        gpu.wait(side, &ready).unwrap();
        gpu.copy_to_host(&host, 0, dx, 4 * n, side).unwrap();
        gpu.record(&done, side).unwrap();
        gpu.wait(Stream::MAIN, &done).unwrap();
        add(&mut gpu, dx, dy, n, Stream::MAIN);
        assert_eq!(
            floats(gpu.host_bytes(&host).unwrap()),
            once,
            "{dev}: ordered copy"
        );
        assert_eq!(gpu.download_f32(dx, n).unwrap(), twice, "{dev}: after it");

        // Without the main stream's wait, the interpreted device runs the copy only when the
        // host asks for its bytes: after the third add, which it then sees.
        gpu.record(&ready, Stream::MAIN).unwrap();
        gpu.wait(side, &ready).unwrap();
        gpu.copy_to_host(&host, 0, dx, 4 * n, side).unwrap();
        add(&mut gpu, dx, dy, n, Stream::MAIN);
        let late = floats(gpu.host_bytes(&host).unwrap());
        if is_interpreted(&gpu) {
            let thrice: Vec<f32> = twice.iter().zip(&y).map(|(a, b)| a + b).collect();
            assert_eq!(
                late, thrice,
                "{dev}: the unordered copy ran as late as it may"
            );
        }

        // Polling an event gets there; a stale handle is an error naming it.
        gpu.copy_to_host(&host, 0, dx, 4 * n, side).unwrap();
        gpu.record(&done, side).unwrap();
        let mut polls = 0;
        while !gpu.event_done(&done).unwrap() {
            polls += 1;
            assert!(polls < 1_000_000, "{dev}: an event never completed");
        }
        gpu.destroy_stream(side).unwrap();
        let err = gpu.copy(dy, dx, 4, side).unwrap_err().to_string();
        assert!(err.contains("no stream"), "{dev}: {err}");
        assert!(
            gpu.destroy_stream(Stream::MAIN).is_err(),
            "{dev}: main stream destroyed"
        );
        gpu.free_host(host).unwrap();
        gpu.destroy_event(ready).unwrap();
        gpu.destroy_event(done).unwrap();
    }
}

#[test]
fn device_and_host_copies_on_streams_and_their_bounds() {
    for mut gpu in devices() {
        let dev = gpu.describe();
        let n = 64;
        let x = values(3, n);
        let dx = gpu.upload_f32(&x).unwrap();
        let dz = gpu.alloc(4 * n).unwrap();
        let side = gpu.create_stream().unwrap();
        // Device to device on a side stream, then host -> device from a host buffer.
        gpu.copy(dz, dx, 4 * n, side).unwrap();
        gpu.synchronize().unwrap();
        assert_eq!(gpu.download_f32(dz, n).unwrap(), x, "{dev}: device copy");
        let host = gpu.alloc_host(4 * n).unwrap();
        let y = values(4, n);
        let bytes: Vec<u8> = y.iter().flat_map(|v| v.to_le_bytes()).collect();
        gpu.host_bytes(&host).unwrap().copy_from_slice(&bytes);
        gpu.copy_from_host(dz.offset(8), &host, 8, 4 * n - 8, side)
            .unwrap();
        let done = gpu.create_event().unwrap();
        gpu.record(&done, side).unwrap();
        gpu.sync_event(&done).unwrap();
        let mut want = x.clone();
        want[2..].copy_from_slice(&y[2..]);
        assert_eq!(
            gpu.download_f32(dz, n).unwrap(),
            want,
            "{dev}: upload at an offset"
        );

        // Bounds and overlaps are errors that say so.
        let err = gpu.copy_to_host(&host, 8, dx, 4 * n, side).unwrap_err();
        assert!(err.to_string().contains("host buffer"), "{dev}: {err}");
        let err = gpu.copy(dx.offset(4), dx, 8, side).unwrap_err();
        assert!(err.to_string().contains("overlaps"), "{dev}: {err}");
        // A capture records device copies on the main stream and refuses host copies,
        // events and side streams.
        gpu.begin_capture().unwrap();
        gpu.copy(dz, dx, 4 * n, Stream::MAIN).unwrap();
        for (what, refused) in [
            (
                "a host copy",
                gpu.copy_to_host(&host, 0, dx, 4, Stream::MAIN).is_err(),
            ),
            ("an event", gpu.record(&done, Stream::MAIN).is_err()),
            ("a side stream", gpu.copy(dz, dx, 4, side).is_err()),
        ] {
            assert!(refused, "{dev}: {what} inside a capture");
        }
        let graph = gpu.end_capture().unwrap();
        let zeros = vec![0u8; 4 * n];
        gpu.write(dz, &zeros).unwrap();
        if let Some(graph) = graph {
            gpu.replay(graph).unwrap();
        }
        assert_eq!(
            gpu.download_f32(dz, n).unwrap(),
            x,
            "{dev}: a replayed copy"
        );
        gpu.free_host(host).unwrap();
    }
}

/// Row-major `[rows, cols]` bf16 at a row stride, uploaded; returns the values as rounded.
fn upload_bf16(gpu: &mut Gpu, seed: u64, rows: usize, stride: usize) -> (DevicePtr, Vec<f32>) {
    let v = values(seed, rows * stride);
    let rounded: Vec<f32> = v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect();
    let bytes: Vec<u8> = v
        .iter()
        .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
        .collect();
    let ptr = gpu.alloc(bytes.len()).unwrap();
    gpu.write(ptr, &bytes).unwrap();
    (ptr, rounded)
}

#[test]
fn vendor_products_follow_cublaslt_layout_rules() {
    for mut gpu in devices() {
        let dev = gpu.describe();
        match gpu.open_gemm(None) {
            Ok(what) => eprintln!("{dev}: {what}"),
            Err(e) if !is_interpreted(&gpu) => {
                eprintln!("{dev}: skipped, no cuBLASLt ({e})");
                continue;
            }
            Err(e) => panic!("{dev}: the stand-in did not open: {e}"),
        }
        // Strides wider than the rows, as the engine's buffers have them.
        let (m, n, k) = (5, 24, 40);
        let (a_stride, b_stride, d_stride) = (48, 40, 32);
        let (a, av) = upload_bf16(&mut gpu, 5, m, a_stride);
        let (b, bv) = upload_bf16(&mut gpu, 6, n, b_stride);
        let d = gpu.upload_f32(&vec![f32::NAN; m * d_stride]).unwrap();
        let mut call = Gemm {
            m,
            n,
            k,
            a,
            a_stride,
            b,
            b_stride,
            input: GemmType::BF16,
            d,
            d_stride,
            output: GemmType::F32,
        };
        assert_eq!(
            gpu.gemm_support(&call).unwrap(),
            GemmSupport::Supported,
            "{dev}"
        );
        gpu.gemm(&call, Stream::MAIN).unwrap();
        let got = gpu.download_f32(d, m * d_stride).unwrap();
        let mut scale = 0f64;
        let mut want = vec![0f64; m * n];
        for r in 0..m {
            for c in 0..n {
                want[r * n + c] = (0..k)
                    .map(|j| av[r * a_stride + j] as f64 * bv[c * b_stride + j] as f64)
                    .sum();
                scale = scale.max(want[r * n + c].abs());
            }
        }
        for r in 0..m {
            for c in 0..d_stride {
                let g = got[r * d_stride + c];
                if c < n {
                    let err = (g as f64 - want[r * n + c]).abs();
                    assert!(
                        err <= 2e-5 * scale,
                        "{dev}: d[{r}, {c}] = {g}, want {}",
                        want[r * n + c]
                    );
                } else {
                    assert!(g.is_nan(), "{dev}: d[{r}, {c}] past the row was written");
                }
            }
        }
        // bf16 output: each element one rounding of the f32 sum.
        let d16 = gpu.alloc(2 * m * n).unwrap();
        call.d = d16;
        call.d_stride = n;
        call.output = GemmType::BF16;
        gpu.gemm(&call, Stream::MAIN).unwrap();
        let mut raw = vec![0u8; 2 * m * n];
        gpu.read(d16, &mut raw).unwrap();
        for (i, c) in raw.chunks_exact(2).enumerate() {
            let g = bf16::from_le_bytes([c[0], c[1]]).to_f32() as f64;
            assert!(
                (g - want[i]).abs() <= want[i].abs() / 128.0 + 2e-5 * scale,
                "{dev}: bf16 d[{i}]"
            );
        }
        // A capture records the product like a launch.
        call.output = GemmType::F32;
        call.d = d;
        call.d_stride = d_stride;
        let nans: Vec<u8> = std::iter::repeat_n(f32::NAN.to_le_bytes(), m * d_stride)
            .flatten()
            .collect();
        gpu.write(d, &nans).unwrap();
        gpu.begin_capture().unwrap();
        gpu.gemm(&call, Stream::MAIN).unwrap();
        if let Some(graph) = gpu.end_capture().unwrap() {
            gpu.replay(graph).unwrap();
        }
        let again = gpu.download_f32(d, m * d_stride).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&again), bits(&got), "{dev}: replayed product");

        // Checked before any driver sees it; the stand-in refuses what cuBLASLt would.
        let bad = Gemm {
            d_stride: n - 1,
            ..call
        };
        assert!(
            gpu.gemm(&bad, Stream::MAIN).is_err(),
            "{dev}: a short output stride"
        );
        if is_interpreted(&gpu) {
            let odd = Gemm {
                a: a.offset(1),
                ..call
            };
            match gpu.gemm_support(&odd).unwrap() {
                GemmSupport::Unsupported(why) => assert!(why.contains("aligned"), "{why}"),
                GemmSupport::Supported => panic!("{dev}: a misaligned operand was taken"),
            }
            // Rows past the activations' allocation: an error naming the operand (cuBLASLt's
            // B: the row-major activations are its column-major right operand).
            let past = Gemm { m: m + 4, ..call };
            let err = gpu.gemm(&past, Stream::MAIN).unwrap_err().to_string();
            assert!(
                err.contains("B: ") && err.contains("outside every allocation"),
                "{dev}: {err}"
            );
        }
    }
}

#[test]
fn the_interpreted_device_can_have_no_vendor_library_or_take_no_product() {
    let base = InterpreterConfig::from_env();
    if !base.is_available() {
        eprintln!("skipped: no interpreter venv");
        return;
    }
    let missing = InterpreterConfig {
        gemm: InterpretedGemm::Missing,
        ..base.clone()
    };
    let mut gpu = Gpu::interpreted(&missing).unwrap();
    let err = gpu.open_gemm(None).unwrap_err().to_string();
    assert!(err.contains("FERRUM_INTERPRETED_GEMM=none"), "{err}");
    assert!(gpu.gemm_library().is_none());
    let unsupported = InterpreterConfig {
        gemm: InterpretedGemm::Unsupported,
        ..base
    };
    let mut gpu = Gpu::interpreted(&unsupported).unwrap();
    gpu.open_gemm(None).unwrap();
    let (a, _) = upload_bf16(&mut gpu, 1, 2, 16);
    let d = gpu.alloc(4 * 2 * 2).unwrap();
    let call = Gemm {
        m: 2,
        n: 2,
        k: 16,
        a,
        a_stride: 16,
        b: a,
        b_stride: 16,
        input: GemmType::BF16,
        d,
        d_stride: 2,
        output: GemmType::F32,
    };
    assert!(matches!(
        gpu.gemm_support(&call).unwrap(),
        GemmSupport::Unsupported(_)
    ));
}

/// Launches with named arguments (`Gpu::launch_named`, how the backend launches): the names
/// must be the manifest's in its order; a swapped, misnamed or missing argument is an error
/// naming it, and nothing runs.
#[test]
fn named_launches_check_the_names_against_the_build() {
    for mut gpu in devices() {
        let dev = gpu.describe();
        let (x, y) = (values(1, 8), values(2, 8));
        let (dx, dy) = (gpu.upload_f32(&x).unwrap(), gpu.upload_f32(&y).unwrap());
        let i = KernelArg::I32;
        let named = |a: &'static str, b: &'static str| {
            [
                (a, KernelArg::Ptr(dx)),
                (b, KernelArg::Ptr(dy)),
                ("n_cols", i(8)),
                ("x_stride", i(8)),
                ("y_stride", i(8)),
            ]
        };
        gpu.launch_named("add_rows", [1, 1, 1], &named("x_ptr", "y_ptr"))
            .unwrap();
        let got = gpu.download_f32(dx, 8).unwrap();
        let want: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
        assert_eq!(got, want, "{dev}");
        let err = gpu
            .launch_named("add_rows", [1, 1, 1], &named("y_ptr", "x_ptr"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("argument 0 is y_ptr in the launch and x_ptr in the build"),
            "{dev}: {err}"
        );
        let err = gpu
            .launch_named("add_rows", [1, 1, 1], &named("x_ptr", "y_ptr")[..4])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("argument 4 is missing in the launch and y_stride"),
            "{dev}: {err}"
        );
        // Nothing ran: x is as the first launch left it.
        assert_eq!(gpu.download_f32(dx, 8).unwrap(), want, "{dev}");
    }
}
