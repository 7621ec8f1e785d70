//! Every embedded GPU kernel, launched through the backend's device layer ([`Gpu`]) with the
//! grids and arguments a caller computes, against a host reference in f64.
//!
//! Each test runs on every device present: the interpreted device (the Triton interpreter in
//! a worker; `scripts/test-cuda-interpret.sh` makes its venv; skipped when absent, a failure
//! under CI) and CUDA device 0 ("skipped: no GPU" without one; a failure when
//! `FERRUM_REQUIRE_GPU` is set, as `scripts/test-gpu.sh` does). Outputs are poisoned with NaN
//! before each launch, so an unwritten element fails.
//!
//! Bound: every element within `TOL` x max |reference| (f32 arithmetic in another order; the
//! f16/bf16 operands are rounded on the host exactly as the kernels round them).

// The references index like the kernels' math does.
#![allow(clippy::needless_range_loop)]

mod common;
use common::devices;
use common::host::*;
use ferrum_runtime::cuda::{DevicePtr, KernelArg};

#[test]
fn rms_norm_with_and_without_residual_and_per_head() {
    for mut gpu in devices() {
        let dev = gpu.describe();
        let mut rng = Rng::new(1);
        // Rows longer than the kernel's block (1024) with a partial last block.
        let (rows, n, stride) = (3usize, 1100usize, 1104usize);
        let x = rng.vec(rows * stride);
        let res = rng.vec(rows * stride);
        let w = rng.vec(n);
        for has_res in [false, true] {
            let name = format!("rms_norm_res{}", has_res as u8);
            let (dx, dr, dw) = (
                gpu.upload_f32(&x).unwrap(),
                gpu.upload_f32(&res).unwrap(),
                gpu.upload_f32(&w).unwrap(),
            );
            let out = poisoned(&mut gpu, rows * n);
            let args = [
                p(dx),
                p(dr),
                p(out),
                p(dw),
                i(n),
                i(stride),
                i(stride),
                i(n),
                KernelArg::F32(1e-5),
            ];
            gpu.launch(&name, [rows as u32, 1, 1], &args).unwrap();
            let got = gpu.download_f32(out, rows * n).unwrap();
            let got_res = gpu.download_f32(dr, rows * stride).unwrap();
            let mut want = Vec::new();
            let mut want_res = res.iter().map(|&v| v as f64).collect::<Vec<_>>();
            for r in 0..rows {
                let row: Vec<f64> = (0..n)
                    .map(|c| {
                        let v = x[r * stride + c] as f64;
                        if has_res {
                            v + res[r * stride + c] as f64
                        } else {
                            v
                        }
                    })
                    .collect();
                if has_res {
                    want_res[r * stride..r * stride + n].copy_from_slice(&row);
                }
                let ms = row.iter().map(|v| v * v).sum::<f64>() / n as f64;
                let rstd = 1.0 / (ms + 1e-5).sqrt();
                want.extend(row.iter().zip(&w).map(|(v, &w)| v * rstd * w as f64));
            }
            assert_close(&format!("{dev} {name}"), &got, &want);
            assert_close(&format!("{dev} {name} residual"), &got_res, &want_res);
        }
        // Per-head norm of the q heads inside fused qkv rows, in place.
        let (t, heads, hd, stride) = (4usize, 3usize, 32usize, 160usize);
        let qkv = rng.vec(t * stride);
        let w = rng.vec(hd);
        let (dq, dw) = (gpu.upload_f32(&qkv).unwrap(), gpu.upload_f32(&w).unwrap());
        let args = [
            p(dq),
            p(dq),
            p(dq),
            p(dw),
            i(hd),
            i(stride),
            i(stride),
            i(stride),
            KernelArg::F32(1e-6),
        ];
        gpu.launch("rms_norm_res0", [t as u32, heads as u32, 1], &args)
            .unwrap();
        let got = gpu.download_f32(dq, t * stride).unwrap();
        let mut want: Vec<f64> = qkv.iter().map(|&v| v as f64).collect();
        for r in 0..t {
            for h in 0..heads {
                let o = r * stride + h * hd;
                let ms = (0..hd).map(|c| (qkv[o + c] as f64).powi(2)).sum::<f64>() / hd as f64;
                let rstd = 1.0 / (ms + 1e-6).sqrt();
                for c in 0..hd {
                    want[o + c] = qkv[o + c] as f64 * rstd * w[c] as f64;
                }
            }
        }
        assert_close(&format!("{dev} per-head rms_norm"), &got, &want);
    }
}

#[test]
fn rope_rotates_q_and_k_heads_in_place_and_leaves_the_rest() {
    for mut gpu in devices() {
        let dev = gpu.describe();
        let mut rng = Rng::new(2);
        // (head_dim, rot_half, scale): full rotary, and partial rotary with LongRoPE's
        // attention factor (Phi-3 style).
        for (hd, rot_half, scale) in [(64usize, 32usize, 1.0f32), (32, 8, 1.2247)] {
            let (t, heads) = (5usize, 6usize);
            let stride = heads * hd + 2 * hd; // q+k heads, then v heads the kernel must not touch
            let x = rng.vec(t * stride);
            let pos: Vec<u32> = (0..t).map(|_| rng.below(5000) as u32).collect();
            let inv_freq: Vec<f32> = (0..rot_half)
                .map(|j| 1.0 / 10000f32.powf(2.0 * j as f32 / (2 * rot_half) as f32))
                .collect();
            let dx = gpu.upload_f32(&x).unwrap();
            let dpos = gpu.upload_u32(&pos).unwrap();
            let dfreq = gpu.upload_f32(&inv_freq).unwrap();
            let args = [
                p(dx),
                p(dpos),
                p(dfreq),
                i(stride),
                i(hd),
                i(rot_half),
                KernelArg::F32(scale),
            ];
            gpu.launch("rope", [t as u32, heads as u32, 1], &args)
                .unwrap();
            let got = gpu.download_f32(dx, t * stride).unwrap();
            let mut want: Vec<f64> = x.iter().map(|&v| v as f64).collect();
            for r in 0..t {
                for h in 0..heads {
                    let o = r * stride + h * hd;
                    for j in 0..rot_half {
                        // The angle in f32, as the kernel and transformers compute it.
                        let a = (pos[r] as f32 * inv_freq[j]) as f64;
                        let (x1, x2) = (x[o + j] as f64, x[o + rot_half + j] as f64);
                        let (c, sn) = (a.cos() * scale as f64, a.sin() * scale as f64);
                        want[o + j] = x1 * c - x2 * sn;
                        want[o + rot_half + j] = x2 * c + x1 * sn;
                    }
                }
            }
            assert_close(&format!("{dev} rope hd {hd} rot {rot_half}"), &got, &want);
        }
    }
}

#[test]
fn gated_activations() {
    for mut gpu in devices() {
        let dev = gpu.describe();
        let mut rng = Rng::new(3);
        let (t, n) = (3usize, 1500usize);
        // One fused [gate | up] row per token, as a gate/up product writes it.
        let gu: Vec<f32> = rng.vec(t * 2 * n).iter().map(|v| v * 4.0).collect();
        for (name, gelu) in [("gated_silu", false), ("gated_gelu_tanh", true)] {
            let dgu = gpu.upload_f32(&gu).unwrap();
            let out = poisoned(&mut gpu, t * n);
            let args = [
                p(dgu),
                p(dgu.offset(n * 4)),
                p(out),
                i(n),
                i(2 * n),
                i(2 * n),
                i(n),
            ];
            let grid = [t as u32, cdiv(n, gpu.constexpr(name, "BLOCK").unwrap()), 1];
            gpu.launch(name, grid, &args).unwrap();
            let got = gpu.download_f32(out, t * n).unwrap();
            let mut want = Vec::new();
            for r in 0..t {
                for c in 0..n {
                    let g = gu[r * 2 * n + c] as f64;
                    let u = gu[r * 2 * n + n + c] as f64;
                    let a = if gelu {
                        0.5 * g
                            * (1.0
                                + ((2.0 / std::f64::consts::PI).sqrt()
                                    * (g + 0.044715 * g.powi(3)))
                                .tanh())
                    } else {
                        g / (1.0 + (-g).exp())
                    };
                    want.push(a * u);
                }
            }
            assert_close(&format!("{dev} {name}"), &got, &want);
        }
    }
}

#[test]
fn add_rows_and_bias() {
    for mut gpu in devices() {
        let dev = gpu.describe();
        let mut rng = Rng::new(7);
        let (rows, n, stride) = (3usize, 1100usize, 1104usize);
        let x = rng.vec(rows * stride);
        let y = rng.vec(rows * n);
        let bias = rng.vec(n);
        let dx = gpu.upload_f32(&x).unwrap();
        let dy = gpu.upload_f32(&y).unwrap();
        let db = gpu.upload_f32(&bias).unwrap();
        let grid = [
            rows as u32,
            cdiv(n, gpu.constexpr("add_rows", "BLOCK").unwrap()),
            1,
        ];
        gpu.launch("add_rows", grid, &[p(dx), p(dy), i(n), i(stride), i(n)])
            .unwrap();
        // y_stride 0: the same row (a bias) for every row.
        gpu.launch("add_rows", grid, &[p(dx), p(db), i(n), i(stride), i(0)])
            .unwrap();
        let got = gpu.download_f32(dx, rows * stride).unwrap();
        let mut want: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        for r in 0..rows {
            for c in 0..n {
                want[r * stride + c] += y[r * n + c] as f64 + bias[c] as f64;
            }
        }
        assert_close(&format!("{dev} add_rows"), &got, &want);
    }
}

/// A captured graph holds launches, not results: nothing runs until it is replayed, each replay
/// runs every launch again with the addresses it was captured with (so new contents written
/// there before a replay are what it reads), and only launches are allowed inside a capture.
#[test]
fn graphs_replay_their_launches_and_refuse_other_work_inside_a_capture() {
    for mut gpu in devices() {
        let dev = gpu.describe();
        let mut rng = Rng::new(11);
        let n = 300usize;
        let (x, y) = (rng.vec(n), rng.vec(n));
        let (dx, dy) = (gpu.upload_f32(&x).unwrap(), gpu.upload_f32(&y).unwrap());
        let grid = [1, cdiv(n, gpu.constexpr("add_rows", "BLOCK").unwrap()), 1];
        let args = [p(dx), p(dy), i(n), i(n), i(n)];
        gpu.begin_capture().unwrap();
        assert!(gpu.is_capturing());
        gpu.launch("add_rows", grid, &args).unwrap();
        for (what, refused) in [
            ("alloc", gpu.alloc(64).is_err()),
            ("write", gpu.write(dx, &[0; 4]).is_err()),
            ("read", gpu.read(dx, &mut [0; 4]).is_err()),
            ("synchronize", gpu.synchronize().is_err()),
            ("nested capture", gpu.begin_capture().is_err()),
        ] {
            assert!(refused, "{dev}: {what} inside a capture must be refused");
        }
        let graph = gpu.end_capture().unwrap().expect("the driver made a graph");
        let untouched = gpu.download_f32(dx, n).unwrap();
        assert_eq!(untouched, x, "{dev}: a capture ran its launches");
        gpu.replay(graph).unwrap();
        gpu.replay(graph).unwrap();
        let want: Vec<f64> = x
            .iter()
            .zip(&y)
            .map(|(&a, &b)| a as f64 + 2.0 * b as f64)
            .collect();
        assert_close(
            &format!("{dev} two replays"),
            &gpu.download_f32(dx, n).unwrap(),
            &want,
        );
        // New contents at the captured address are what the next replay reads.
        let y2 = rng.vec(n);
        let bytes: Vec<u8> = y2.iter().flat_map(|v| v.to_le_bytes()).collect();
        gpu.write(dy, &bytes).unwrap();
        gpu.replay(graph).unwrap();
        let want: Vec<f64> = want.iter().zip(&y2).map(|(&a, &b)| a + b as f64).collect();
        assert_close(
            &format!("{dev} replay after an update"),
            &gpu.download_f32(dx, n).unwrap(),
            &want,
        );
        gpu.drop_graph(graph).unwrap();
        assert!(
            gpu.replay(graph).is_err(),
            "{dev}: a dropped graph replayed"
        );
        // An abandoned capture keeps nothing and leaves the device usable.
        gpu.begin_capture().unwrap();
        gpu.launch("add_rows", grid, &args).unwrap();
        gpu.abort_capture();
        assert!(!gpu.is_capturing());
        assert_close(
            &format!("{dev} after an abort"),
            &gpu.download_f32(dx, n).unwrap(),
            &want,
        );
    }
}

#[test]
fn resolve_ids_takes_the_previous_steps_tokens() {
    for mut gpu in devices() {
        let dev = gpu.describe();
        let block = gpu.constexpr("resolve_ids", "BLOCK").unwrap() as usize;
        let mut rng = Rng::new(13);
        for n in [1usize, 3, block + 2] {
            let size = n + 5;
            let ids: Vec<u32> = (0..size as u32).map(|t| 1000 + t).collect();
            let prev: Vec<u32> = (0..n + 2).map(|_| rng.below(50_000) as u32).collect();
            // Every other token, then the rest, is pending: distinct indices.
            let mut at: Vec<usize> = (0..size).step_by(2).chain((1..size).step_by(2)).collect();
            at.truncate(n);
            let pairs: Vec<u32> = at
                .iter()
                .flat_map(|&t| [t as u32, rng.below(n as u64 + 2) as u32])
                .collect();
            let (dids, dpairs, dprev) = (
                gpu.upload_u32(&ids).unwrap(),
                gpu.upload_u32(&pairs).unwrap(),
                gpu.upload_u32(&prev).unwrap(),
            );
            let grid = [cdiv(n, block as i64), 1, 1];
            gpu.launch("resolve_ids", grid, &[p(dids), p(dpairs), p(dprev), i(n)])
                .unwrap();
            let mut want = ids.clone();
            for pair in pairs.chunks_exact(2) {
                want[pair[0] as usize] = prev[pair[1] as usize];
            }
            let mut bytes = vec![0u8; 4 * size];
            gpu.read(dids, &mut bytes).unwrap();
            let got: Vec<u32> = bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            assert_eq!(got, want, "{dev}: resolve_ids with {n} pending inputs");
        }
    }
}

#[test]
fn gather_rows_of_every_float_type() {
    for mut gpu in devices() {
        let dev = gpu.describe();
        let mut rng = Rng::new(4);
        let (vocab, n, t) = (50usize, 1030usize, 4usize);
        let table = rng.vec(vocab * n);
        let ids: Vec<u32> = (0..t).map(|_| rng.below(vocab as u64) as u32).collect();
        for ty in Float::ALL {
            let name = format!("gather_rows_{}", ty.short());
            let dt = upload_as(&mut gpu, ty, &table);
            let dids = gpu.upload_u32(&ids).unwrap();
            let out = poisoned(&mut gpu, t * n);
            let args = [
                p(dt),
                p(dids),
                p(out),
                i(n),
                i(n),
                i(n),
                KernelArg::F32(8.0),
            ];
            let grid = [t as u32, cdiv(n, gpu.constexpr(&name, "BLOCK").unwrap()), 1];
            gpu.launch(&name, grid, &args).unwrap();
            let got = gpu.download_f32(out, t * n).unwrap();
            let want: Vec<f64> = ids
                .iter()
                .flat_map(|&id| {
                    let row = &table[id as usize * n..(id as usize + 1) * n];
                    row.iter().map(move |&v| ty.round(v) as f64 * 8.0)
                })
                .collect();
            assert_close(&format!("{dev} {name}"), &got, &want);
        }
    }
}

#[test]
fn gemm_of_every_float_type_with_and_without_bias() {
    for mut gpu in devices() {
        let dev = gpu.describe();
        let mut rng = Rng::new(5);
        // Partial tiles in every dimension; x rows strided.
        let (m, n, k, x_stride) = (37usize, 70usize, 100usize, 104usize);
        let x = rng.vec(m * x_stride);
        let w = rng.vec(n * k);
        let bias = rng.vec(n);
        for ty in Float::ALL {
            let mut variants = vec![
                (false, format!("gemm_{}_bias0", ty.short())),
                (true, format!("gemm_{}_bias1", ty.short())),
                (false, format!("gemm_{}_decode", ty.short())),
            ];
            // The wide tiles of half-precision weights (long prefill chunks).
            let large = format!("gemm_{}_large", ty.short());
            if gpu.spec(&large).is_some() {
                variants.push((false, large));
            }
            for (has_bias, name) in variants {
                let dx = gpu.upload_f32(&x).unwrap();
                let dw = upload_as(&mut gpu, ty, &w);
                let db = gpu.upload_f32(&bias).unwrap();
                let y = poisoned(&mut gpu, m * n);
                let bias_arg = if has_bias { db } else { DevicePtr::NULL };
                let args = [
                    p(dx),
                    p(dw),
                    p(bias_arg),
                    p(y),
                    i(m),
                    i(n),
                    i(k),
                    i(x_stride),
                    i(n),
                ];
                let grid = [
                    cdiv(m, gpu.constexpr(&name, "BLOCK_M").unwrap()),
                    cdiv(n, gpu.constexpr(&name, "BLOCK_N").unwrap()),
                    1,
                ];
                gpu.launch(&name, grid, &args).unwrap();
                let got = gpu.download_f32(y, m * n).unwrap();
                let mut want = Vec::with_capacity(m * n);
                for r in 0..m {
                    for c in 0..n {
                        let mut acc: f64 = (0..k)
                            .map(|j| {
                                ty.round(x[r * x_stride + j]) as f64 * ty.round(w[c * k + j]) as f64
                            })
                            .sum();
                        if has_bias {
                            acc += bias[c] as f64;
                        }
                        want.push(acc);
                    }
                }
                assert_close(&format!("{dev} {name}"), &got, &want);
            }
        }
    }
}

#[test]
fn bad_launches_and_allocations_are_errors() {
    for mut gpu in devices() {
        let dev = gpu.describe();
        let e = gpu.launch("no_such_kernel", [1, 1, 1], &[]).unwrap_err();
        assert!(
            e.to_string().contains("no kernel named no_such_kernel"),
            "{dev}: {e}"
        );
        let e = gpu
            .launch("rope", [1, 1, 1], &[KernelArg::I32(1)])
            .unwrap_err();
        assert!(
            e.to_string().contains("takes 7 arguments, got 1"),
            "{dev}: {e}"
        );
        let args = [KernelArg::I32(0); 7];
        let e = gpu.launch("rope", [1, 1, 1], &args).unwrap_err();
        assert!(e.to_string().contains("x_ptr"), "{dev}: {e}");
        let buf = gpu.alloc(64).unwrap();
        let args = [
            KernelArg::Ptr(buf),
            KernelArg::Ptr(buf),
            KernelArg::Ptr(buf),
            KernelArg::I32(4),
            KernelArg::I32(4),
            KernelArg::I32(2),
            KernelArg::F32(1.0),
        ];
        let e = gpu.launch("rope", [0, 1, 1], &args).unwrap_err();
        assert!(e.to_string().contains("grid"), "{dev}: {e}");
        // A stride past the buffer: the interpreted device checks every access (a GPU would
        // read or corrupt whatever lies beyond).
        if dev.starts_with("interpreted") {
            let (x, w) = (gpu.alloc(2 * 64 * 4).unwrap(), gpu.alloc(64 * 4).unwrap());
            let args = [
                KernelArg::Ptr(x),
                KernelArg::Ptr(x),
                KernelArg::Ptr(x),
                KernelArg::Ptr(w),
                KernelArg::I32(64),
                KernelArg::I32(100),
                KernelArg::I32(100),
                KernelArg::I32(64),
                KernelArg::F32(1e-6),
            ];
            let e = gpu.launch("rms_norm_res0", [2, 1, 1], &args).unwrap_err();
            assert!(e.to_string().contains("outside every buffer"), "{dev}: {e}");
        }
        // Far more memory than any device has.
        let e = gpu.alloc(1 << 52).unwrap_err();
        assert!(
            e.to_string().contains("allocating 4503599627370496 bytes"),
            "{dev}: {e}"
        );
        // The device still works after the failures.
        let x = gpu.upload_f32(&[1.0, 2.0]).unwrap();
        assert_eq!(gpu.download_f32(x, 2).unwrap(), vec![1.0, 2.0]);
    }
}
