//! The CPU backend: today's kernels (`ferrum_runtime::cpu`) behind the seam, unchanged.
//!
//! Weights are repacked at load into the int8, bf16 or float tiles [`Linear`] picks; a
//! product's input is prepared once (quantized or rounded) for all the weights that read it,
//! fused with the residual add and norm before it (`add_norm_prepare`) or the gated
//! activation (`gated_prepare`). Buffers grow to the largest batch seen and are reused.

use std::sync::Arc;

use super::{Backend, Buf, Dims, Expert, MoeWeights, Outs};
use crate::moe::{route, Routing};
use crate::{KvCache, ModelError, Result};
use ferrum_runtime::cpu::{self, ActScratch, AttentionShape, GatedAct, Linear, Rope, Weight};
use ferrum_runtime::{Tensor, ThreadPool};
use ferrum_types::ForwardBatch;

#[derive(Debug, Default)]
struct Scratch {
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    rows: Vec<f32>,
    logits: Vec<f32>,
    /// Cosine and sine of every token's rotary angles, one table per rope of the forward.
    rope: Vec<Vec<f32>>,
    /// The current linear input, quantized (int8 path).
    qa: ActScratch,
    /// Attention's per-part softmax states of split decodes.
    attn_partials: Vec<f32>,
    /// Mixture of experts: the normed input `[t, h]`, router logits `[t, experts]`, the
    /// routing, and one expert's gathered rows, products and output.
    moe_in: Vec<f32>,
    router: Vec<f32>,
    routing: Routing,
    moe_x: Vec<f32>,
    moe_gate: Vec<f32>,
    moe_up: Vec<f32>,
    moe_y: Vec<f32>,
}

/// What the mixture-of-experts layers have done since the backend was made: each expert's
/// products run once per layer and step for all the tokens routed to it, so `expert_runs`
/// grows by at most the number of experts per layer and step however many tokens there are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MoeStats {
    /// MoE layers run (layers x steps).
    pub layers: u64,
    /// Expert product runs (each reads that expert's weights once).
    pub expert_runs: u64,
    /// Token-expert pairs served (tokens x top_k per layer).
    pub routed: u64,
}

/// `y[n, h] = down(act(gate x) * up x)` for the `n` rows of `x` (`[n, h]`), on `linear`'s
/// kernels; `gate`, `up` and `y` grow as needed.
#[allow(clippy::too_many_arguments)]
fn run_expert(
    linear: &Linear,
    pool: &ThreadPool,
    e: &Expert<CpuBackend>,
    x: &[f32],
    (n, h): (usize, usize),
    act: GatedAct,
    (gate, up, y): (&mut Vec<f32>, &mut Vec<f32>, &mut Vec<f32>),
    qa: &mut ActScratch,
) -> Result<()> {
    let i = e.intermediate;
    gate.resize(n * i, 0.0);
    up.resize(n * i, 0.0);
    y.resize(n * h, 0.0);
    let input = linear.prepare(pool, &x[..n * h], h, qa, &[&e.gate, &e.up]);
    linear.matmul_many(
        pool,
        &input,
        &mut [(&e.gate, &mut gate[..n * i]), (&e.up, &mut up[..n * i])],
    )?;
    let input = linear.gated_prepare(
        pool,
        act,
        &mut gate[..n * i],
        &up[..n * i],
        i,
        qa,
        &[&e.down],
    );
    Ok(linear.matmul(pool, &input, &e.down, &mut y[..n * h])?)
}

/// The CPU kernels on a compute pool.
#[derive(Debug)]
pub struct CpuBackend {
    pool: Arc<ThreadPool>,
    linear: Linear,
    dims: Dims,
    moe_stats: MoeStats,
    /// The ropes of the current forward ([`Backend::begin`]).
    ropes: Vec<Rope>,
    s: Scratch,
}

impl CpuBackend {
    /// A backend running on `pool` with `linear`'s precision.
    pub fn new(pool: Arc<ThreadPool>, linear: Linear) -> CpuBackend {
        CpuBackend {
            pool,
            linear,
            dims: Dims::default(),
            moe_stats: MoeStats::default(),
            ropes: Vec::new(),
            s: Scratch::default(),
        }
    }

    /// The compute pool.
    pub fn pool(&self) -> &Arc<ThreadPool> {
        &self.pool
    }

    /// Counts of the mixture-of-experts layers run so far.
    pub fn moe_stats(&self) -> MoeStats {
        self.moe_stats
    }

    fn width(&self, buf: Buf) -> usize {
        self.dims.width(buf)
    }
}

/// The activation buffers by role, borrowed apart, and the input-preparation scratch.
type Slots<'a> = [(Buf, Option<&'a mut Vec<f32>>); 8];

fn slots(s: &mut Scratch) -> (Slots<'_>, &mut ActScratch) {
    let Scratch {
        x,
        h,
        q,
        k,
        v,
        attn,
        gate,
        up,
        qa,
        ..
    } = s;
    let slots = [
        (Buf::X, Some(x)),
        (Buf::H, Some(h)),
        (Buf::Q, Some(q)),
        (Buf::K, Some(k)),
        (Buf::V, Some(v)),
        (Buf::Attn, Some(attn)),
        (Buf::Gate, Some(gate)),
        (Buf::Up, Some(up)),
    ];
    (slots, qa)
}

/// Takes buffer `b` out of `slots`; asking twice for one buffer is a caller's error.
fn take<'a>(slots: &mut Slots<'a>, b: Buf) -> Result<&'a mut Vec<f32>> {
    slots
        .iter_mut()
        .find(|(r, _)| *r == b)
        .and_then(|(_, v)| v.take())
        .ok_or_else(|| ModelError::Invalid(format!("buffer {b:?} used twice in one operation")))
}

fn buf_mut(s: &mut Scratch, which: Buf) -> &mut Vec<f32> {
    match which {
        Buf::X => &mut s.x,
        Buf::H => &mut s.h,
        Buf::Q => &mut s.q,
        Buf::K => &mut s.k,
        Buf::V => &mut s.v,
        Buf::Attn => &mut s.attn,
        Buf::Gate => &mut s.gate,
        Buf::Up => &mut s.up,
    }
}

impl Backend for CpuBackend {
    type Weight = Weight;
    type Vector = Vec<f32>;
    type Table = Tensor;

    fn weight(&mut self, t: Tensor) -> Result<Weight> {
        Ok(Weight::new(t, &self.linear, &self.pool)?)
    }

    fn weight_bytes(w: &Weight) -> usize {
        w.num_bytes()
    }

    fn vector(&mut self, v: Vec<f32>) -> Result<Vec<f32>> {
        Ok(v)
    }

    fn vector_bytes(v: &Vec<f32>) -> usize {
        4 * v.len()
    }

    fn table(&mut self, t: Tensor) -> Result<Tensor> {
        Ok(t)
    }

    fn table_row_bytes(t: &Tensor) -> usize {
        t.num_bytes() / t.rows().max(1)
    }

    fn begin(
        &mut self,
        dims: Dims,
        batch: &ForwardBatch,
        ropes: &[Rope],
        _graphs: bool,
    ) -> Result<()> {
        self.dims = dims;
        let t = batch.num_tokens();
        let num_logits = batch.logits_indices.len();
        let s = &mut self.s;
        for (buf, len) in [
            (&mut s.x, t * dims.hidden),
            (&mut s.h, t * dims.hidden),
            (&mut s.q, t * dims.q),
            (&mut s.k, t * dims.kv),
            (&mut s.v, t * dims.kv),
            (&mut s.attn, t * dims.q),
            (&mut s.gate, t * dims.intermediate),
            (&mut s.up, t * dims.intermediate),
            (&mut s.rows, num_logits * dims.hidden),
            (&mut s.logits, num_logits * dims.vocab),
        ] {
            buf.resize(len, 0.0);
        }
        // Per rope: [t, head_dim / 2, 2]
        s.rope.resize_with(ropes.len(), Vec::new);
        for (rope, table) in ropes.iter().zip(&mut s.rope) {
            rope.angles_for(batch, table);
        }
        // The model's ropes are the same every step: kept, not cloned again.
        let same = self.ropes.len() == ropes.len()
            && self.ropes.iter().zip(ropes).all(|(a, b)| {
                a.inv_freq() == b.inv_freq()
                    && a.long_inv_freq() == b.long_inv_freq()
                    && a.head_dim() == b.head_dim()
                    && a.mscale() == b.mscale()
            });
        if !same {
            self.ropes = ropes.to_vec();
        }
        Ok(())
    }

    fn embed(&mut self, table: &Tensor, batch: &ForwardBatch, scale: f32) -> Result<()> {
        cpu::embedding(table, &batch.token_ids, &mut self.s.x)?;
        if scale != 1.0 {
            self.s.x.iter_mut().for_each(|v| *v *= scale);
        }
        Ok(())
    }

    fn add_norm_linear(
        &mut self,
        add: bool,
        norm: &Vec<f32>,
        eps: f32,
        outs: &[(Weight, Outs)],
    ) -> Result<()> {
        let pool = &*self.pool;
        let (mut slots, qa) = slots(&mut self.s);
        let x = take(&mut slots, Buf::X)?;
        let h = take(&mut slots, Buf::H)?;
        let n = outs.len();
        if n == 0 || n > 3 {
            return Err(ModelError::Invalid(format!(
                "add_norm_linear takes 1 to 3 products, got {n}"
            )));
        }
        // The CPU keeps each weight apart (the default `products`): one buffer each.
        if let Some((_, o)) = outs.iter().find(|(_, o)| o.bufs().len() != 1) {
            return Err(ModelError::Invalid(format!(
                "the CPU backend runs weights of their own, not one stacked for {:?}",
                o.bufs()
            )));
        }
        // Up to three products share one prepared input; arrays keep the step allocation-free.
        let w = |i: usize| outs.get(i).map_or(&outs[0].0, |o| &o.0);
        let mut out = |i: usize| -> Result<&mut [f32]> {
            match outs.get(i) {
                Some((_, o)) => Ok(&mut take(&mut slots, o.first())?[..]),
                None => Ok(&mut []),
            }
        };
        let weights = [w(0), w(1), w(2)];
        let mut products = [(w(0), out(0)?), (w(1), out(1)?), (w(2), out(2)?)];
        let input = self
            .linear
            .add_norm_prepare(pool, x, h, add, norm, eps, qa, &weights[..n]);
        Ok(self.linear.matmul_many(pool, &input, &mut products[..n])?)
    }

    fn add_bias(&mut self, buf: Buf, bias: &Vec<f32>) -> Result<()> {
        cpu::add_bias(buf_mut(&mut self.s, buf), bias);
        Ok(())
    }

    fn head_norm(&mut self, buf: Buf, w: &Vec<f32>, eps: f32) -> Result<()> {
        // Rows of head_dim.
        cpu::rms_norm_in_place(buf_mut(&mut self.s, buf), w, eps);
        Ok(())
    }

    fn rope(&mut self, rope: usize, buf: Buf) -> Result<()> {
        let s = &mut self.s;
        let (Some(r), Some(table)) = (self.ropes.get(rope), s.rope.get_mut(rope)) else {
            return Err(ModelError::Invalid(format!(
                "rope {rope} was not given to begin"
            )));
        };
        let table = std::mem::take(table);
        r.apply_with(buf_mut(s, buf), &table);
        s.rope[rope] = table;
        Ok(())
    }

    fn write_kv(
        &mut self,
        kv: &mut KvCache,
        layer: usize,
        shape: &AttentionShape,
        batch: &ForwardBatch,
    ) -> Result<()> {
        let s = &self.s;
        kv.layer_mut(layer)?
            .write(&self.pool, &s.k, &s.v, &batch.slot_mapping, shape);
        Ok(())
    }

    fn attend(
        &mut self,
        kv: &mut KvCache,
        layer: usize,
        shape: &AttentionShape,
        batch: &ForwardBatch,
    ) -> Result<()> {
        let s = &mut self.s;
        // [t, nh*hd]
        kv.layer_mut(layer)?.attend(
            &self.pool,
            &s.q,
            &batch.seqs,
            &batch.block_tables,
            shape,
            &mut s.attn,
            &mut s.attn_partials,
        );
        Ok(())
    }

    fn linear(&mut self, input: Buf, w: &Weight, out: Buf) -> Result<()> {
        let pool = &*self.pool;
        let k = self.width(input);
        let (mut slots, qa) = slots(&mut self.s);
        let x = take(&mut slots, input)?;
        let y = take(&mut slots, out)?;
        let prepared = self.linear.prepare(pool, x, k, qa, &[w]);
        Ok(self.linear.matmul(pool, &prepared, w, y)?)
    }

    fn gated_linear(&mut self, w: &Weight, act: GatedAct, out: Buf) -> Result<()> {
        let pool = &*self.pool;
        let inter = self.dims.intermediate;
        let (mut slots, qa) = slots(&mut self.s);
        let gate = take(&mut slots, Buf::Gate)?;
        let up = take(&mut slots, Buf::Up)?;
        let y = take(&mut slots, out)?;
        let input = self
            .linear
            .gated_prepare(pool, act, gate, up, inter, qa, &[w]);
        Ok(self.linear.matmul(pool, &input, w, y)?)
    }

    fn add_residual(&mut self) -> Result<()> {
        cpu::add_par(&self.pool, &mut self.s.x, &self.s.h);
        Ok(())
    }

    fn moe(
        &mut self,
        norm: &Vec<f32>,
        eps: f32,
        moe: &MoeWeights<Self>,
        act: GatedAct,
    ) -> Result<()> {
        let pool = &*self.pool;
        let linear = &self.linear;
        let h = self.dims.hidden;
        let s = &mut self.s;
        let t = s.x.len() / h.max(1);
        // X += H; the experts' input n = rms_norm(X) * norm: [t, h].
        cpu::add_par(pool, &mut s.x, &s.h);
        s.moe_in.resize(t * h, 0.0);
        cpu::rms_norm(&s.x, norm, eps, &mut s.moe_in);
        // Router logits: [t, experts].
        let ne = moe.experts.len();
        s.router.resize(t * ne, 0.0);
        let input = linear.prepare(pool, &s.moe_in, h, &mut s.qa, &[&moe.router]);
        linear.matmul(pool, &input, &moe.router, &mut s.router)?;
        route(&s.router, ne, moe.top_k, moe.norm_topk_prob, &mut s.routing);
        self.moe_stats.layers += 1;
        // H = sum of each token's experts, expert by expert (ascending), each expert's
        // weights read once for its gathered rows.
        s.h.fill(0.0);
        for (expert, toks) in moe.experts.iter().zip(&s.routing.experts) {
            if toks.is_empty() {
                continue;
            }
            s.moe_x.clear();
            for &(tok, _) in toks {
                let tok = tok as usize;
                s.moe_x.extend_from_slice(&s.moe_in[tok * h..(tok + 1) * h]);
            }
            self.moe_stats.expert_runs += 1;
            self.moe_stats.routed += toks.len() as u64;
            run_expert(
                linear,
                pool,
                expert,
                &s.moe_x,
                (toks.len(), h),
                act,
                (&mut s.moe_gate, &mut s.moe_up, &mut s.moe_y),
                &mut s.qa,
            )?;
            for (y, &(tok, w)) in s.moe_y.chunks_exact(h).zip(toks) {
                let tok = tok as usize;
                for (d, v) in s.h[tok * h..(tok + 1) * h].iter_mut().zip(y) {
                    *d += w * v;
                }
            }
        }
        // Qwen2-MoE: the shared expert on every token, scaled by sigmoid(gate . n).
        if let Some((shared, gate_w)) = &moe.shared {
            run_expert(
                linear,
                pool,
                shared,
                &s.moe_in,
                (t, h),
                act,
                (&mut s.moe_gate, &mut s.moe_up, &mut s.moe_y),
                &mut s.qa,
            )?;
            for (tok, y) in s.moe_y.chunks_exact(h).enumerate().take(t) {
                let x = &s.moe_in[tok * h..(tok + 1) * h];
                let g: f32 = x.iter().zip(gate_w).map(|(a, b)| a * b).sum();
                let g = 1.0 / (1.0 + (-g).exp());
                for (d, v) in s.h[tok * h..(tok + 1) * h].iter_mut().zip(y) {
                    *d += g * v;
                }
            }
        }
        Ok(())
    }

    fn host_rows(&mut self, buf: Buf, f: &mut dyn FnMut(&mut [f32]) -> Result<()>) -> Result<()> {
        f(buf_mut(&mut self.s, buf))
    }

    fn logits(
        &mut self,
        norm: &Vec<f32>,
        eps: f32,
        head: &Weight,
        rows: &[u32],
        softcap: Option<f32>,
    ) -> Result<&[f32]> {
        let pool = &*self.pool;
        let h = self.dims.hidden;
        let s = &mut self.s;
        // [num_logits, h]
        for (dst, &row) in s.h[..rows.len() * h].chunks_exact_mut(h).zip(rows) {
            let row = row as usize;
            dst.copy_from_slice(&s.x[row * h..(row + 1) * h]);
        }
        cpu::rms_norm(&s.h[..rows.len() * h], norm, eps, &mut s.rows);
        // [num_logits, vocab]
        let input = self.linear.prepare(pool, &s.rows, h, &mut s.qa, &[head]);
        self.linear.matmul(pool, &input, head, &mut s.logits)?;
        if let Some(cap) = softcap {
            super::softcap_logits(&mut s.logits, cap);
        }
        Ok(&s.logits)
    }
}
