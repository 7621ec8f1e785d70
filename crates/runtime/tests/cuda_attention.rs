//! KV writes and paged attention, launched through the device layer (`Gpu`) with the grids
//! and arguments the backend computes, against a host reference in f64, on every device
//! present (see `cuda_kernels.rs` for the devices and the bound).
#![allow(clippy::needless_range_loop)]

mod common;
use common::devices;
use common::host::*;
use ferrum_runtime::cuda::KernelArg;

/// One sequence of an attention batch.
struct Seq {
    /// Positions of its query tokens in this step.
    positions: std::ops::Range<usize>,
    /// Its blocks, scattered over the cache.
    blocks: Vec<u32>,
}

#[test]
fn kv_write_then_paged_attention_over_scattered_blocks() {
    let block_size = 16usize;
    let num_blocks = 24usize;
    for mut gpu in devices() {
        let dev = gpu.describe();
        let mut rng = Rng::new(6);
        // head_dim 64 uses its own block; 48 exercises a partial head block (d64 spec);
        // 32 is the tiny fixtures' size.
        for (hd, spec_d) in [(64usize, 64usize), (48, 64), (32, 32)] {
            for ty in Float::ALL {
                for (window, softcap) in [(0usize, 0f32), (7, 0.0), (0, 5.0)] {
                    let (nh, nkv) = (4usize, 2usize);
                    // A prefill chunk with prior context, a decode, and a fresh prefill.
                    let seqs = [
                        Seq {
                            positions: 20..27,
                            blocks: vec![5, 17, 2],
                        },
                        Seq {
                            positions: 40..41,
                            blocks: vec![9, 0, 23],
                        },
                        Seq {
                            positions: 0..5,
                            blocks: vec![11],
                        },
                    ];
                    let slots = num_blocks * block_size;
                    // The cache already holds every earlier position of every sequence.
                    let mut k_cache = rng.vec(slots * nkv * hd);
                    let mut v_cache = rng.vec(slots * nkv * hd);
                    let mut tokens = Vec::new(); // (seq, pos)
                    let mut block_tables = Vec::new();
                    let mut bt_start = Vec::new();
                    let mut slot_mapping = Vec::new();
                    for (s, seq) in seqs.iter().enumerate() {
                        let start = block_tables.len() as u32;
                        block_tables.extend(&seq.blocks);
                        for pos in seq.positions.clone() {
                            tokens.push((s, pos));
                            bt_start.push(start);
                            let slot = seq.blocks[pos / block_size] as usize * block_size
                                + pos % block_size;
                            slot_mapping.push(slot as u32);
                        }
                    }
                    let t = tokens.len();
                    let q_stride = (nh + 2 * nkv) * hd; // fused qkv rows
                    let qkv = rng.vec(t * q_stride);
                    let write = format!("kv_write_{}_d{spec_d}", ty.short());
                    let attn = format!("paged_attention_{}_d{spec_d}", ty.short());
                    let dk = upload_as(&mut gpu, ty, &k_cache);
                    let dv = upload_as(&mut gpu, ty, &v_cache);
                    let dqkv = gpu.upload_f32(&qkv).unwrap();
                    let dslots = gpu.upload_u32(&slot_mapping).unwrap();
                    let dbt = gpu.upload_u32(&block_tables).unwrap();
                    let dbts = gpu.upload_u32(&bt_start).unwrap();
                    let pos: Vec<u32> = tokens.iter().map(|&(_, p)| p as u32).collect();
                    let dpos = gpu.upload_u32(&pos).unwrap();
                    let kq = dqkv.offset(nh * hd * 4);
                    let vq = dqkv.offset((nh + nkv) * hd * 4);
                    let args = [
                        p(kq),
                        p(vq),
                        p(dk),
                        p(dv),
                        p(dslots),
                        i(q_stride),
                        i(nkv),
                        i(hd),
                    ];
                    gpu.launch(&write, [t as u32, nkv as u32, 1], &args)
                        .unwrap();
                    // The host's cache after the write.
                    for (r, &slot) in slot_mapping.iter().enumerate() {
                        for h in 0..nkv {
                            for d in 0..hd {
                                let dst = (slot as usize * nkv + h) * hd + d;
                                k_cache[dst] = qkv[r * q_stride + (nh + h) * hd + d];
                                v_cache[dst] = qkv[r * q_stride + (nh + nkv + h) * hd + d];
                            }
                        }
                    }
                    let k_round: Vec<f32> = k_cache.iter().map(|&v| ty.round(v)).collect();
                    let v_round: Vec<f32> = v_cache.iter().map(|&v| ty.round(v)).collect();
                    let mut kb = vec![0u8; k_cache.len() * ty.size()];
                    gpu.read(dk, &mut kb).unwrap();
                    let what = format!("{dev} {write} hd {hd}");
                    let want: Vec<f64> = k_round.iter().map(|&v| v as f64).collect();
                    assert_close(&what, &ty.decode(&kb), &want);
                    gpu.read(dv, &mut kb).unwrap();
                    let want: Vec<f64> = v_round.iter().map(|&v| v as f64).collect();
                    assert_close(&what, &ty.decode(&kb), &want);

                    let out = poisoned(&mut gpu, t * nh * hd);
                    let scale = 1.0 / (hd as f32).sqrt();
                    // Every token, listed in reverse: a program's token comes from the list.
                    let toks: Vec<u32> = (0..t as u32).rev().collect();
                    let dtoks = gpu.upload_u32(&toks).unwrap();
                    let args = [
                        p(dqkv),
                        p(dk),
                        p(dv),
                        p(dbt),
                        p(dbts),
                        p(dpos),
                        p(dtoks),
                        p(out),
                        i(q_stride),
                        i(nh * hd),
                        i(nh / nkv),
                        i(nkv),
                        i(hd),
                        i(block_size),
                        i(window),
                        KernelArg::F32(scale),
                        KernelArg::F32(softcap),
                    ];
                    // One program per token and KV head (and chunk of G_BLOCK query heads).
                    let g_block = gpu.constexpr(&attn, "G_BLOCK").unwrap() as usize;
                    let heads = nkv * (nh / nkv).div_ceil(g_block);
                    gpu.launch(&attn, [t as u32, heads as u32, 1], &args)
                        .unwrap();
                    let got = gpu.download_f32(out, t * nh * hd).unwrap();
                    let mut want = Vec::new();
                    for (r, &(s, pos)) in tokens.iter().enumerate() {
                        let lo = if window > 0 {
                            (pos + 1).saturating_sub(window)
                        } else {
                            0
                        };
                        for h in 0..nh {
                            let kvh = h / (nh / nkv);
                            let q = &qkv[r * q_stride + h * hd..r * q_stride + (h + 1) * hd];
                            let keys: Vec<usize> = (lo..=pos)
                                .map(|kp| {
                                    seqs[s].blocks[kp / block_size] as usize * block_size
                                        + kp % block_size
                                })
                                .collect();
                            let scores: Vec<f64> = keys
                                .iter()
                                .map(|&slot| {
                                    let o = (slot * nkv + kvh) * hd;
                                    let dot: f64 =
                                        (0..hd).map(|d| q[d] as f64 * k_round[o + d] as f64).sum();
                                    let sc = dot * scale as f64;
                                    if softcap > 0.0 {
                                        softcap as f64 * (sc / softcap as f64).tanh()
                                    } else {
                                        sc
                                    }
                                })
                                .collect();
                            let mx = scores.iter().cloned().fold(f64::MIN, f64::max);
                            let e: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
                            let sum: f64 = e.iter().sum();
                            for d in 0..hd {
                                let o: f64 = keys
                                    .iter()
                                    .zip(&e)
                                    .map(|(&slot, p)| {
                                        p * v_round[(slot * nkv + kvh) * hd + d] as f64
                                    })
                                    .sum();
                                want.push(o / sum);
                            }
                        }
                    }
                    let what = format!("{dev} {attn} hd {hd} window {window} softcap {softcap}");
                    assert_close(&what, &got, &want);
                }
            }
        }
    }
}
