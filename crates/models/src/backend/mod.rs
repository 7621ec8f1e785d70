//! The backend seam: a model family's forward pass is written once, over [`Backend`], and each
//! device implements the fused operations it uses.
//!
//! A backend owns its form of the weights ([`Backend::Weight`]: the CPU's repacked integer and
//! bf16 tiles, a GPU's device copies), its activation buffers (named by role, [`Buf`]) and
//! workspaces, sized by [`Backend::begin`] for each batch and reused: the step loop allocates
//! nothing once warm. The forward only sequences operations on named buffers, so it never
//! touches device memory itself. The KV cache is the backend's too; the scheduler's block
//! tables and slot mappings mean the same on every device.
//!
//! A backend may replay a decode step's whole forward as one captured graph
//! ([`Backend::graph_step`]): the forward asks once per step, after [`Backend::begin`], and on
//! [`GraphStep::Replay`] skips every operation up to [`Backend::logits`].
//!
//! Invariants every implementation keeps:
//! - after [`Backend::begin`], every [`Buf`] holds `rows x width` f32 values (row-major) for
//!   the batch's tokens, with the widths of [`Dims`];
//! - an operation reads only what earlier operations of the same forward wrote, in order;
//! - [`Backend::logits`] returns `[rows.len(), vocab]` f32 on the host, the rows in the order
//!   asked for.

mod cpu;
mod cuda;

pub use cpu::{CpuBackend, MoeStats};
pub use cuda::{
    Collected, CudaBackend, DecodeSplit, GpuVector, GpuWeight, ATTENTION_RANGES, DECODE_SPLIT,
    GRAPH_BUCKETS, SPLIT_KEYS,
};

use crate::sampling::{RowSampling, SampledRows};
use crate::{KvCache, ModelError, Result};
use ferrum_runtime::cpu::{AttentionShape, GatedAct, Rope};
use ferrum_runtime::Tensor;
use ferrum_types::ForwardBatch;

/// An activation buffer of the forward pass, by role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buf {
    /// `[t, hidden]`: the residual stream.
    X,
    /// `[t, hidden]`: a sublayer's output, added to `X` by the next norm.
    H,
    /// `[t, heads * head_dim]`: queries.
    Q,
    /// `[t, kv_heads * head_dim]`: keys.
    K,
    /// `[t, kv_heads * head_dim]`: values.
    V,
    /// `[t, heads * head_dim]`: attention output.
    Attn,
    /// `[t, intermediate]`: the MLP's gate product.
    Gate,
    /// `[t, intermediate]`: the MLP's up product.
    Up,
}

/// Widths of the activation buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dims {
    pub hidden: usize,
    pub q: usize,
    pub kv: usize,
    pub intermediate: usize,
    pub vocab: usize,
}

impl Dims {
    /// Elements per row of `buf`.
    pub fn width(&self, buf: Buf) -> usize {
        match buf {
            Buf::X | Buf::H => self.hidden,
            Buf::Q | Buf::Attn => self.q,
            Buf::K | Buf::V => self.kv,
            Buf::Gate | Buf::Up => self.intermediate,
        }
    }
}

/// The buffers one product's output goes to, in order: its weight's rows are their widths
/// ([`Dims::width`]) one after another. One buffer for a weight of its own; two or three for
/// weights stacked at load ([`Backend::products`]: `[q; k; v]`, `[gate; up]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outs {
    bufs: [Buf; 3],
    len: usize,
}

impl Outs {
    /// One buffer.
    pub fn one(b: Buf) -> Outs {
        Outs {
            bufs: [b; 3],
            len: 1,
        }
    }

    /// The buffers, in the order of the weight's rows.
    pub fn bufs(&self) -> &[Buf] {
        &self.bufs[..self.len]
    }

    /// The first buffer: where the product's output starts.
    pub fn first(&self) -> Buf {
        self.bufs[0]
    }

    /// The weight rows these buffers take: their widths summed.
    pub fn rows(&self, dims: &Dims) -> usize {
        self.bufs().iter().map(|&b| dims.width(b)).sum()
    }

    /// `self` then `b`; `None` when three buffers are there already.
    fn then(self, b: Buf) -> Option<Outs> {
        let mut o = self;
        *o.bufs.get_mut(o.len)? = b;
        o.len += 1;
        Some(o)
    }
}

/// `parts` (weights with their output buffers, in order) with each run of consecutive weights
/// of one dtype and column count stacked by rows ([`Tensor::stack_rows`]): a GPU's
/// [`Backend::products`]. Q4_K_M-style files whose v projection has a type of its own give
/// `[q; k]` and `v`.
pub fn stack_runs(parts: Vec<(Tensor, Buf)>) -> Result<Vec<(Tensor, Outs)>> {
    let mut runs: Vec<(Vec<Tensor>, Outs)> = Vec::new();
    for (t, b) in parts {
        let joined = runs.last_mut().and_then(|(ts, outs)| {
            let last = ts.last()?;
            let same = last.dtype() == t.dtype() && last.cols() == t.cols();
            let more = outs.then(b).filter(|_| same)?;
            *outs = more;
            Some(ts)
        });
        match joined {
            Some(ts) => ts.push(t),
            None => runs.push((vec![t], Outs::one(b))),
        }
    }
    runs.into_iter()
        .map(|(mut ts, outs)| {
            let t = match ts.len() {
                1 => ts
                    .pop()
                    .ok_or_else(|| ModelError::Invalid("an empty run".into()))?,
                _ => Tensor::stack_rows(&ts.iter().collect::<Vec<_>>())?,
            };
            Ok((t, outs))
        })
        .collect()
}

/// How this step's operations reach the device ([`Backend::graph_step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphStep {
    /// The operations run as they are called.
    Plain,
    /// The operations are recorded into a graph, which [`Backend::logits`] ends and replays.
    Capture,
    /// A graph captured earlier for this shape replays at [`Backend::logits`]: the forward
    /// skips every operation before it.
    Replay,
}

/// One expert (or a shared expert): `down(act(gate x) * up x)`, weights `[i, h]`, `[i, h]`,
/// `[h, i]`.
#[derive(Debug)]
pub struct Expert<B: Backend> {
    pub gate: B::Weight,
    pub up: B::Weight,
    pub down: B::Weight,
    /// `i`.
    pub intermediate: usize,
}

/// A mixture-of-experts MLP's weights on backend `B` (see [`crate::moe`] for the routing).
#[derive(Debug)]
pub struct MoeWeights<B: Backend> {
    /// `[num_experts, h]`.
    pub router: B::Weight,
    pub experts: Vec<Expert<B>>,
    pub top_k: usize,
    pub norm_topk_prob: bool,
    /// Qwen2-MoE's shared expert and its gate's weight (`[h]`): its output, scaled by
    /// `sigmoid(gate . x)`, joins every token's.
    pub shared: Option<(Expert<B>, B::Vector)>,
}

/// The fused operations of a decoder-only transformer's forward pass on one device.
pub trait Backend: std::fmt::Debug + Sized {
    /// A linear layer's weight, `[out, in]`, in the backend's form.
    type Weight: std::fmt::Debug;
    /// An f32 vector: a norm's weight or a bias.
    type Vector: std::fmt::Debug;
    /// A token embedding table, `[vocab, hidden]`.
    type Table: std::fmt::Debug;

    /// Takes a linear weight as stored (any float or block-quantized type).
    fn weight(&mut self, t: Tensor) -> Result<Self::Weight>;
    /// Bytes one use of `w` reads.
    fn weight_bytes(w: &Self::Weight) -> usize;
    /// Takes an f32 vector.
    fn vector(&mut self, v: Vec<f32>) -> Result<Self::Vector>;
    /// Bytes of `v`.
    fn vector_bytes(v: &Self::Vector) -> usize;
    /// Takes an embedding table as stored.
    fn table(&mut self, t: Tensor) -> Result<Self::Table>;
    /// Bytes of one row of `t`.
    fn table_row_bytes(t: &Self::Table) -> usize;

    /// Sizes every buffer for `batch` and takes its positions' rotary angles under each of
    /// `ropes` (a family with local and global layers has two; [`Backend::rope`] names one by
    /// its index here). `graphs`: whether this step may run as a graph, false where the
    /// forward does more than device operations (a parallel run's communication).
    fn begin(
        &mut self,
        dims: Dims,
        batch: &ForwardBatch,
        ropes: &[Rope],
        graphs: bool,
    ) -> Result<()>;
    /// Whether this step (sized by [`Backend::begin`], writing into `kv`) runs its operations
    /// plainly, captures them, or replays a graph captured before. Backends without graphs run
    /// plainly.
    fn graph_step(&mut self, _kv: &KvCache) -> Result<GraphStep> {
        Ok(GraphStep::Plain)
    }
    /// `X = table[batch.token_ids] * scale` (Gemma scales by `sqrt(hidden)`; others by 1).
    fn embed(&mut self, table: &Self::Table, batch: &ForwardBatch, scale: f32) -> Result<()>;
    /// Takes the weights of the products that read one input (q, k and v; gate and up), in
    /// order, each with the buffer its output goes to, as [`Backend::add_norm_linear`] runs
    /// them. By default each stays a weight of its own (the CPU runs them in one pass over one
    /// prepared input); a GPU stacks them ([`stack_runs`]) so that one launch computes them.
    fn products(&mut self, parts: Vec<(Tensor, Buf)>) -> Result<Vec<(Self::Weight, Outs)>> {
        parts
            .into_iter()
            .map(|(t, b)| Ok((self.weight(t)?, Outs::one(b))))
            .collect()
    }
    /// `X += H` when `add` (the previous sublayer's output joins the residual stream), then
    /// for each `(w, outs)` of [`Backend::products`]: `outs = rms_norm(X) * norm @ w^T`, the
    /// product's columns going to the buffers of `outs` in order.
    fn add_norm_linear(
        &mut self,
        add: bool,
        norm: &Self::Vector,
        eps: f32,
        outs: &[(Self::Weight, Outs)],
    ) -> Result<()>;
    /// `buf += bias`, per row.
    fn add_bias(&mut self, buf: Buf, bias: &Self::Vector) -> Result<()>;
    /// RMSNorm of every `w.len()`-wide group of `buf`, in place: a head (per-head q/k norm)
    /// or the whole row (Gemma's post-attention and post-MLP norms of `H`).
    fn head_norm(&mut self, buf: Buf, w: &Self::Vector, eps: f32) -> Result<()>;
    /// Rotates every head of `buf` by its token's angles under `ropes[rope]` of
    /// [`Backend::begin`].
    fn rope(&mut self, rope: usize, buf: Buf) -> Result<()>;
    /// Writes `K` and `V` into layer `layer` of `kv` at the batch's slots.
    fn write_kv(
        &mut self,
        kv: &mut KvCache,
        layer: usize,
        shape: &AttentionShape,
        batch: &ForwardBatch,
    ) -> Result<()>;
    /// `K` rotated under `ropes[rope]` ([`Backend::rope`]), then written with `V` into layer
    /// `layer` of `kv` ([`Backend::write_kv`]); `K` itself is consumed (a backend may leave it
    /// unrotated). By default the two operations one after the other; a GPU fuses them.
    fn rope_write_kv(
        &mut self,
        rope: usize,
        kv: &mut KvCache,
        layer: usize,
        shape: &AttentionShape,
        batch: &ForwardBatch,
    ) -> Result<()> {
        self.rope(rope, Buf::K)?;
        self.write_kv(kv, layer, shape, batch)
    }
    /// `Attn = attention(Q, layer's keys and values)` over the batch's block tables.
    fn attend(
        &mut self,
        kv: &mut KvCache,
        layer: usize,
        shape: &AttentionShape,
        batch: &ForwardBatch,
    ) -> Result<()>;
    /// `out = input @ w^T`.
    fn linear(&mut self, input: Buf, w: &Self::Weight, out: Buf) -> Result<()>;
    /// `out = (act(Gate) * Up) @ w^T`.
    fn gated_linear(&mut self, w: &Self::Weight, act: GatedAct, out: Buf) -> Result<()>;
    /// `X += H`.
    fn add_residual(&mut self) -> Result<()>;
    /// The MLP of a mixture-of-experts layer: `X += H`, `n = rms_norm(X) * norm`, then
    /// `H = sum over each token's routed experts of w_e * expert_e(n)` (plus the shared
    /// expert), with `act` in every expert. Tokens are grouped by expert so each expert's
    /// weights are read once for all its tokens.
    fn moe(
        &mut self,
        norm: &Self::Vector,
        eps: f32,
        moe: &MoeWeights<Self>,
        act: GatedAct,
    ) -> Result<()>;
    /// Hands `buf`'s `[t, width]` values to `f` as host memory and keeps what `f` leaves
    /// there: how a parallel run's communicators (over host buffers) reach the activations.
    /// The CPU's buffers are host memory already; a GPU copies them out and back (an NCCL
    /// communicator would work on the device buffer instead).
    fn host_rows(&mut self, buf: Buf, f: &mut dyn FnMut(&mut [f32]) -> Result<()>) -> Result<()>;
    /// `rms_norm(X[rows]) * norm @ head^T` on the host: `[rows.len(), vocab]` (ending and
    /// replaying the step's graph first, when [`Backend::graph_step`] said so); with
    /// `softcap`, each logit `l` becomes `cap * tanh(l / cap)` (Gemma's final soft-capping).
    fn logits(
        &mut self,
        norm: &Self::Vector,
        eps: f32,
        head: &Self::Weight,
        rows: &[u32],
        softcap: Option<f32>,
    ) -> Result<&[f32]>;
    /// The argmax of each row [`Backend::logits`] would return, into `out` (`rows.len()` token
    /// ids): the greedy choice without handing the logits over. Soft-capping keeps the order,
    /// so it changes no choice. By default the host decides over [`Backend::logits`]'s rows.
    fn argmax_rows(
        &mut self,
        norm: &Self::Vector,
        eps: f32,
        head: &Self::Weight,
        rows: &[u32],
        softcap: Option<f32>,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        let logits = self.logits(norm, eps, head, rows, softcap)?;
        host_argmax(logits, rows.len(), out);
        Ok(())
    }

    /// Each row [`Backend::logits`] would return, sampled under its [`RowSampling`] (one per
    /// row) into `out.rows`: the token and the raw logprobs it asked for, by the rules of
    /// [`crate::sampling`]. By default the host samples [`Backend::logits`]'s rows.
    #[allow(clippy::too_many_arguments)]
    fn sample_rows(
        &mut self,
        norm: &Self::Vector,
        eps: f32,
        head: &Self::Weight,
        rows: &[u32],
        softcap: Option<f32>,
        specs: &[RowSampling<'_>],
        out: &mut SampledRows,
    ) -> Result<()> {
        let logits = self.logits(norm, eps, head, rows, softcap)?;
        out.sample_logits(logits, specs)
    }
}

/// Each row's argmax ([`crate::argmax`]) of `rows.len()` rows of `vocab` logits, into `out`.
pub(crate) fn host_argmax(logits: &[f32], rows: usize, out: &mut Vec<u32>) {
    out.clear();
    if let Some(vocab) = logits.len().checked_div(rows).filter(|&v| v > 0) {
        out.extend(logits.chunks_exact(vocab).map(crate::argmax));
    }
}

/// `cap * tanh(l / cap)` of every logit (final logit soft-capping), on the host.
pub(crate) fn softcap_logits(logits: &mut [f32], cap: f32) {
    logits.iter_mut().for_each(|l| *l = cap * (*l / cap).tanh());
}

#[cfg(test)]
mod tests {
    use super::{stack_runs, Buf, Dims};
    use ferrum_runtime::Tensor;

    #[test]
    fn runs_of_one_type_stack_and_a_type_change_starts_a_new_run() {
        let f32_rows = |rows: usize, v: f32| Tensor::from_f32(vec![rows, 4], &vec![v; rows * 4]);
        let (q, k) = (f32_rows(4, 1.0).unwrap(), f32_rows(2, 2.0).unwrap());
        // v in another type (f16), as Q4_K_M files give it one.
        let v = Tensor::new(
            ferrum_runtime::DType::F16,
            vec![2, 4],
            ferrum_runtime::Storage::owned(vec![0; 16]),
        )
        .unwrap();
        let runs = stack_runs(vec![(q, Buf::Q), (k, Buf::K), (v, Buf::V)]).unwrap();
        let dims = Dims {
            q: 4,
            kv: 2,
            ..Dims::default()
        };
        let got: Vec<_> = runs
            .iter()
            .map(|(t, o)| (t.rows(), o.bufs().to_vec(), o.rows(&dims)))
            .collect();
        assert_eq!(
            got,
            vec![(6, vec![Buf::Q, Buf::K], 6), (2, vec![Buf::V], 2)]
        );
        assert_eq!(runs[0].0.to_f32_vec()[..16], [1.0; 16]);
        assert_eq!(runs[0].0.to_f32_vec()[16..], [2.0; 8]);
        // One type throughout: one product.
        let (g, u) = (f32_rows(3, 0.0).unwrap(), f32_rows(3, 0.0).unwrap());
        let runs = stack_runs(vec![(g, Buf::Gate), (u, Buf::Up)]).unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].1.bufs(), [Buf::Gate, Buf::Up]);
    }
}
