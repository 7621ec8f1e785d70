//! `ferrum bench comm`: what the operations of a parallel forward cost between the ranks of
//! a run (launched by `mpirun`): the tensor-parallel all-reduce of `rows x hidden` f32 values and
//! the stage-to-stage send of the same, for each size asked.
//!
//! Every rank runs the same sequence. An all-reduce is timed on rank 0 from a synchronised
//! start (a one-value all-reduce first); a send is a ping-pong between ranks 0 and 1, half the
//! round trip. Medians over the iterations.

use anyhow::{bail, Result};
use ferrum_runtime::Communicator;
use std::time::Instant;

/// One measured operation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CommResult {
    /// `all_reduce` or `send`.
    pub op: &'static str,
    pub rows: usize,
    pub hidden: usize,
    /// Bytes of the buffer (`rows * hidden * 4`).
    pub bytes: usize,
    /// Median microseconds per operation.
    pub median_us: f64,
}

/// Measures every `(rows, hidden)` pair over `world` (at least two ranks), `iters` times
/// each after a few warm-up rounds. Every rank must call it with the same arguments; the
/// results are rank 0's.
pub fn comm(
    world: &dyn Communicator,
    hiddens: &[usize],
    rows: &[usize],
    iters: usize,
) -> Result<Vec<CommResult>> {
    if world.size() < 2 {
        bail!("bench comm measures between ranks: launch it with mpirun -n 2 or more");
    }
    if iters == 0 || hiddens.contains(&0) || rows.contains(&0) {
        bail!("--num-iters, --hidden-sizes and --rows must be at least 1");
    }
    let mut out = Vec::new();
    let mut sync = [0.0f32];
    for &h in hiddens {
        for &r in rows {
            let mut buf = vec![1.0f32; r * h];
            let mut times = Vec::with_capacity(iters);
            for i in 0..iters + 3 {
                // Summed again each time, the values would grow without bound.
                buf.fill(1.0);
                world.all_reduce_sum(&mut sync)?;
                let t = Instant::now();
                world.all_reduce_sum(&mut buf)?;
                if i >= 3 {
                    times.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            out.push(CommResult {
                op: "all_reduce",
                rows: r,
                hidden: h,
                bytes: 4 * r * h,
                median_us: crate::median(times),
            });
            let mut times = Vec::with_capacity(iters);
            for i in 0..iters + 3 {
                world.all_reduce_sum(&mut sync)?;
                let t = Instant::now();
                match world.rank() {
                    0 => {
                        world.send(&buf, 1)?;
                        world.recv(&mut buf, 1)?;
                    }
                    1 => {
                        world.recv(&mut buf, 0)?;
                        world.send(&buf, 0)?;
                    }
                    _ => {}
                }
                if i >= 3 {
                    times.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
                }
            }
            out.push(CommResult {
                op: "send",
                rows: r,
                hidden: h,
                bytes: 4 * r * h,
                median_us: crate::median(times),
            });
        }
    }
    Ok(out)
}
