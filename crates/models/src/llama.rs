//! The Llama family: Llama (incl. Llama 3 rope scaling), Mistral (sliding window), Qwen2 (q/k/v
//! bias), Qwen3 (per-head q/k RMSNorm, explicit head_dim), SmolLM2 and Phi-3 (fused `qkv_proj`
//! and `gate_up_proj`, split by rows at load; partial rotary; LongRoPE), selected by config
//! flags; and the mixture-of-experts members (Mixtral, Qwen2-MoE with its shared expert,
//! Qwen3-MoE with dense layers where `mlp_only_layers` says, OLMoE with q/k norms over the
//! whole projection), whose expert MLPs run through [`Backend::moe`] (GGUF's stacked experts are
//! cut into per-expert matrices at load, in their block format).
//!
//! Each layer: `x += o(attn(rope(q(n1(x))), rope(k(n1(x))), v(n1(x))))`, then
//! `x += down(silu(gate(n2(x))) * up(n2(x)))`; final RMSNorm and the LM head run only on the
//! rows whose logits are asked for. GGUF q/k rows written in llama.cpp's interleaved order are
//! put back in Hugging Face order at load (rows move whole, so block-quantized weights are
//! untouched). The forward is written once over [`Backend`]: the backend holds the weights in its
//! own form and runs each fused operation on its device.

use crate::backend::{Backend, Buf, CpuBackend, Expert, GraphStep, MoeWeights, Outs};
use crate::parallel::{LogitsGather, Placement, Shard};
use crate::registry::MoeStyle;
use crate::sampling::{RowSampling, SampledRow, SampledRows};
use crate::source::{ModelFormat, WeightSource};
use crate::weights::{forward_dims, stage_ends, take_cols, take_rows, take_vec, Loader};
use crate::{KvCache, ModelConfig, ModelError, Result};
use ferrum_runtime::cpu::{AttentionShape, Rope};
use ferrum_runtime::Tensor;
use ferrum_types::ForwardBatch;

#[derive(Debug)]
struct Layer<B: Backend> {
    attn_norm: B::Vector,
    /// The q, k and v projections as the backend runs them ([`Backend::products`]).
    qkv: Vec<(B::Weight, Outs)>,
    wo: B::Weight,
    /// q, k, v biases.
    qkv_bias: Option<[B::Vector; 3]>,
    /// Per-head q and k RMSNorm weights.
    qk_norm: Option<[B::Vector; 2]>,
    mlp_norm: B::Vector,
    mlp: Mlp<B>,
    attn: AttentionShape,
}

/// A layer's MLP: dense, or a mixture of experts (Mixtral, Qwen2/3-MoE, OLMoE).
#[derive(Debug)]
enum Mlp<B: Backend> {
    Dense {
        /// The gate and up projections as the backend runs them ([`Backend::products`]).
        gate_up: Vec<(B::Weight, Outs)>,
        down: B::Weight,
    },
    Moe(MoeWeights<B>),
}

/// A Llama-family model ready to run on backend `B` (the CPU unless said otherwise).
#[derive(Debug)]
pub struct LlamaModel<B: Backend = CpuBackend> {
    config: ModelConfig,
    /// The config as this rank runs it ([`Shard::local_config`]).
    local: ModelConfig,
    place: Placement,
    backend: B,
    /// On the first stage.
    embed: Option<B::Table>,
    /// This stage's layers.
    layers: Vec<Layer<B>>,
    /// The final norm and this rank's vocabulary rows of the LM head, on the last stage.
    head: Option<(B::Vector, B::Weight)>,
    /// The logits gathered from the stage's ranks.
    gathered: LogitsGather,
    /// Each row's argmax ([`Self::forward_argmax`]).
    argmax: Vec<u32>,
    /// Each row's sample ([`Self::forward_sample`]).
    sampled: SampledRows,
    /// One rope for every layer (index 0 of the backend's).
    ropes: [Rope; 1],
}

/// Tensor names of one source format.
enum Part {
    AttnNorm,
    Q,
    K,
    V,
    O,
    QBias,
    KBias,
    VBias,
    QNorm,
    KNorm,
    MlpNorm,
    Gate,
    Up,
    Down,
    /// Phi-3's fused q, k, v rows.
    Qkv,
    /// Phi-3's fused gate, up rows.
    GateUp,
}

fn layer_name(format: ModelFormat, i: usize, part: Part) -> String {
    let hf = match part {
        Part::AttnNorm => "input_layernorm.weight",
        Part::Q => "self_attn.q_proj.weight",
        Part::K => "self_attn.k_proj.weight",
        Part::V => "self_attn.v_proj.weight",
        Part::O => "self_attn.o_proj.weight",
        Part::QBias => "self_attn.q_proj.bias",
        Part::KBias => "self_attn.k_proj.bias",
        Part::VBias => "self_attn.v_proj.bias",
        Part::QNorm => "self_attn.q_norm.weight",
        Part::KNorm => "self_attn.k_norm.weight",
        Part::MlpNorm => "post_attention_layernorm.weight",
        Part::Gate => "mlp.gate_proj.weight",
        Part::Up => "mlp.up_proj.weight",
        Part::Down => "mlp.down_proj.weight",
        Part::Qkv => "self_attn.qkv_proj.weight",
        Part::GateUp => "mlp.gate_up_proj.weight",
    };
    let gguf = match part {
        Part::AttnNorm => "attn_norm.weight",
        Part::Q => "attn_q.weight",
        Part::K => "attn_k.weight",
        Part::V => "attn_v.weight",
        Part::O => "attn_output.weight",
        Part::QBias => "attn_q.bias",
        Part::KBias => "attn_k.bias",
        Part::VBias => "attn_v.bias",
        Part::QNorm => "attn_q_norm.weight",
        Part::KNorm => "attn_k_norm.weight",
        Part::MlpNorm => "ffn_norm.weight",
        Part::Gate => "ffn_gate.weight",
        Part::Up => "ffn_up.weight",
        Part::Down => "ffn_down.weight",
        Part::Qkv => "attn_qkv.weight",
        Part::GateUp => "ffn_up.weight",
    };
    match format {
        ModelFormat::HfFolder => format!("model.layers.{i}.{hf}"),
        ModelFormat::Gguf => format!("blk.{i}.{gguf}"),
    }
}

/// Row order that undoes llama.cpp's q/k permutation: in each head, GGUF row `2i + p` holds
/// Hugging Face row `p * head_dim/2 + i`.
fn unpermute_order(num_heads: usize, head_dim: usize) -> Vec<usize> {
    let half = head_dim / 2;
    (0..num_heads * head_dim)
        .map(|r| {
            let (h, within) = (r / head_dim, r % head_dim);
            let (p, i) = (within / half, within % half);
            h * head_dim + 2 * i + p
        })
        .collect()
}

/// Layer `i`'s experts: the router, each expert's gate, up and down (HF: one tensor each;
/// GGUF: cut from the stacked `ffn_*_exps`), and Qwen2-MoE's shared expert.
fn load_moe<B: Backend>(
    ld: &Loader<'_>,
    b: &mut B,
    c: &ModelConfig,
    m: &crate::MoeConfig,
    i: usize,
    sh: &Shard,
) -> Result<MoeWeights<B>> {
    let (h, ne, ei) = (c.hidden_size, m.num_experts, m.expert_intermediate_size);
    // This rank's rows of every expert's intermediate.
    let er = sh.intermediate(ei);
    let gguf = ld.src.format() == ModelFormat::Gguf;
    let style = c.spec.moe.unwrap_or(MoeStyle::Qwen);
    let hf = |rest: &str| format!("model.layers.{i}.{rest}");
    let router = if gguf {
        ld.tensor(&format!("blk.{i}.ffn_gate_inp.weight"), &[ne, h])?
    } else {
        match style {
            MoeStyle::Mixtral => ld.tensor(&hf("block_sparse_moe.gate.weight"), &[ne, h])?,
            MoeStyle::Qwen => ld.tensor(&hf("mlp.gate.weight"), &[ne, h])?,
        }
    };
    let mut experts = Vec::with_capacity(ne);
    if gguf {
        let stacked = |part: &str, shape: [usize; 2]| {
            ld.tensor(
                &format!("blk.{i}.ffn_{part}_exps.weight"),
                &[ne, shape[0], shape[1]],
            )
        };
        let (gate, up, down) = (
            stacked("gate", [ei, h])?,
            stacked("up", [ei, h])?,
            stacked("down", [h, ei])?,
        );
        let down_name = format!("blk.{i}.ffn_down_exps.weight");
        for e in 0..ne {
            experts.push(Expert {
                gate: b.weight(take_rows(gate.index_first(e)?, er.clone())?)?,
                up: b.weight(take_rows(up.index_first(e)?, er.clone())?)?,
                down: b.weight(take_cols(down.index_first(e)?, er.clone(), &down_name)?)?,
                intermediate: er.len(),
            });
        }
    } else {
        for e in 0..ne {
            let (g, u, d) = match style {
                MoeStyle::Mixtral => {
                    let base = hf(&format!("block_sparse_moe.experts.{e}"));
                    (
                        format!("{base}.w1.weight"),
                        format!("{base}.w3.weight"),
                        format!("{base}.w2.weight"),
                    )
                }
                MoeStyle::Qwen => {
                    let base = hf(&format!("mlp.experts.{e}"));
                    (
                        format!("{base}.gate_proj.weight"),
                        format!("{base}.up_proj.weight"),
                        format!("{base}.down_proj.weight"),
                    )
                }
            };
            experts.push(Expert {
                gate: b.weight(ld.rows(&g, &[ei, h], er.clone())?)?,
                up: b.weight(ld.rows(&u, &[ei, h], er.clone())?)?,
                down: b.weight(ld.cols(&d, &[h, ei], er.clone())?)?,
                intermediate: er.len(),
            });
        }
    }
    let shared = match m.shared_expert_intermediate_size {
        None => None,
        Some(si) if !gguf => {
            let base = hf("mlp.shared_expert");
            let sr = sh.intermediate(si);
            let expert = Expert {
                gate: b.weight(ld.rows(
                    &format!("{base}.gate_proj.weight"),
                    &[si, h],
                    sr.clone(),
                )?)?,
                up: b.weight(ld.rows(
                    &format!("{base}.up_proj.weight"),
                    &[si, h],
                    sr.clone(),
                )?)?,
                down: b.weight(ld.cols(
                    &format!("{base}.down_proj.weight"),
                    &[h, si],
                    sr.clone(),
                )?)?,
                intermediate: sr.len(),
            };
            let gate = ld
                .tensor(&hf("mlp.shared_expert_gate.weight"), &[1, h])?
                .to_f32_vec();
            Some((expert, b.vector(gate)?))
        }
        Some(_) => {
            return Err(ModelError::Invalid(
                "a shared expert in a GGUF file is not supported".into(),
            ))
        }
    };
    Ok(MoeWeights {
        router: b.weight(router)?,
        experts,
        top_k: m.top_k,
        norm_topk_prob: m.norm_topk_prob,
        shared,
    })
}

impl<B: Backend> LlamaModel<B> {
    /// Builds `place`'s shard of the model (its stage's layers, its heads and intermediate
    /// rows; see [`crate::parallel`]; the whole model with [`Placement::whole`]) on `backend`
    /// from `src`, checking every tensor against `config`.
    pub fn load_placed(
        config: ModelConfig,
        src: &WeightSource,
        mut backend: B,
        place: Placement,
    ) -> Result<Self> {
        let c = &config;
        let sh = &place.shard;
        let fmt = src.format();
        let ld = Loader { src };
        let b = &mut backend;
        let (h, hd, nh, nkv) = (
            c.hidden_size,
            c.head_dim,
            c.num_attention_heads,
            c.num_key_value_heads,
        );
        let (qd, kvd, inter) = (nh * hd, nkv * hd, c.intermediate_size);
        // This rank's rows of q, of k and v, and of the MLP's intermediate.
        let (qh, kh, ir) = (sh.q_heads(nh), sh.kv_heads(nkv), sh.intermediate(inter));
        let (qr, kr) = (qh.start * hd..qh.end * hd, kh.start * hd..kh.end * hd);
        let (embed, lm_head, norm_name) = ld.embed_and_head(c)?;
        let permuted = fmt == ModelFormat::Gguf && c.spec.gguf_qk_permuted;
        let mut layers = Vec::with_capacity(sh.layers.len());
        for i in sh.layers.clone() {
            let name = |p: Part| layer_name(fmt, i, p);
            let split = |t: Tensor, parts: &[usize]| -> Result<Vec<Tensor>> {
                let mut start = 0;
                parts
                    .iter()
                    .map(|&n| {
                        let part = t.slice_rows(start, n)?;
                        start += n;
                        Ok(part)
                    })
                    .collect()
            };
            // [q; k; v] and [gate; up] rows of the fused projections, or the separate ones.
            let (mut wq, mut wk, wv) = if c.spec.fused_projections {
                let qkv = ld.tensor(&name(Part::Qkv), &[qd + 2 * kvd, h])?;
                let mut p = split(qkv, &[qd, kvd, kvd])?.into_iter();
                match (p.next(), p.next(), p.next()) {
                    (Some(q), Some(k), Some(v)) => (
                        take_rows(q, qr.clone())?,
                        take_rows(k, kr.clone())?,
                        take_rows(v, kr.clone())?,
                    ),
                    _ => return Err(ModelError::Invalid("qkv split".into())),
                }
            } else {
                (
                    ld.rows(&name(Part::Q), &[qd, h], qr.clone())?,
                    ld.rows(&name(Part::K), &[kvd, h], kr.clone())?,
                    ld.rows(&name(Part::V), &[kvd, h], kr.clone())?,
                )
            };
            let is_moe = c.moe.as_ref().is_some_and(|m| m.layer_is_moe[i]);
            let (w_gate, w_up) = if is_moe {
                (None, None)
            } else if c.spec.fused_projections {
                let gate_up = ld.tensor(&name(Part::GateUp), &[2 * inter, h])?;
                let mut p = split(gate_up, &[inter, inter])?.into_iter();
                match (p.next(), p.next()) {
                    (Some(g), Some(u)) => (
                        Some(take_rows(g, ir.clone())?),
                        Some(take_rows(u, ir.clone())?),
                    ),
                    _ => return Err(ModelError::Invalid("gate_up split".into())),
                }
            } else {
                (
                    Some(ld.rows(&name(Part::Gate), &[inter, h], ir.clone())?),
                    Some(ld.rows(&name(Part::Up), &[inter, h], ir.clone())?),
                )
            };
            let mlp = match (c.moe.as_ref(), w_gate, w_up) {
                (Some(m), _, _) if is_moe => Mlp::Moe(load_moe(&ld, b, c, m, i, sh)?),
                (_, Some(gate), Some(up)) => Mlp::Dense {
                    gate_up: b.products(vec![(gate, Buf::Gate), (up, Buf::Up)])?,
                    down: b.weight(ld.cols(&name(Part::Down), &[h, inter], ir.clone())?)?,
                },
                _ => return Err(ModelError::Invalid("an MLP without weights".into())),
            };
            let mut qkv_bias = if c.attention_bias {
                Some([
                    take_vec(ld.vector(&name(Part::QBias), qd)?, qr.clone()),
                    take_vec(ld.vector(&name(Part::KBias), kvd)?, kr.clone()),
                    take_vec(ld.vector(&name(Part::VBias), kvd)?, kr.clone()),
                ])
            } else {
                None
            };
            if permuted {
                // Within each head: the rank's heads are whole.
                let (oq, ok) = (unpermute_order(qh.len(), hd), unpermute_order(kh.len(), hd));
                wq = wq.permute_rows(&oq)?;
                wk = wk.permute_rows(&ok)?;
                if let Some([bq, bk, _]) = qkv_bias.as_mut() {
                    *bq = oq.iter().map(|&r| bq[r]).collect();
                    *bk = ok.iter().map(|&r| bk[r]).collect();
                }
            }
            let qkv_bias = match qkv_bias {
                Some([q, k, v]) => Some([b.vector(q)?, b.vector(k)?, b.vector(v)?]),
                None => None,
            };
            // Per head, or (OLMoE) over the whole q and k projections.
            let (qn, kn) = if c.spec.qk_norm_full {
                (qd, kvd)
            } else {
                (hd, hd)
            };
            let qk_norm = if c.spec.qk_norm || c.spec.qk_norm_full {
                Some([
                    b.vector(ld.vector(&name(Part::QNorm), qn)?)?,
                    b.vector(ld.vector(&name(Part::KNorm), kn)?)?,
                ])
            } else {
                None
            };
            layers.push(Layer {
                attn_norm: b.vector(ld.vector(&name(Part::AttnNorm), h)?)?,
                qkv: b.products(vec![(wq, Buf::Q), (wk, Buf::K), (wv, Buf::V)])?,
                wo: b.weight(ld.cols(&name(Part::O), &[h, qd], qr.clone())?)?,
                qkv_bias,
                qk_norm,
                mlp_norm: b.vector(ld.vector(&name(Part::MlpNorm), h)?)?,
                mlp,
                attn: AttentionShape {
                    num_heads: qh.len(),
                    num_kv_heads: kh.len(),
                    head_dim: hd,
                    block_size: 0,
                    scale: 1.0 / (hd as f32).sqrt(),
                    sliding_window: c.layer_sliding_window[i],
                    softcap: None,
                },
            });
        }
        // GGUF stores Llama 3 frequency scaling as per-pair divisors.
        let freq_factors = if fmt == ModelFormat::Gguf && src.contains("rope_freqs.weight") {
            Some(ld.vector("rope_freqs.weight", c.rotary_dim / 2)?)
        } else {
            None
        };
        let rope = Rope::partial(
            hd,
            c.rotary_dim,
            c.rope_theta,
            &c.rope_scaling,
            freq_factors.as_deref(),
            c.rope_table_dtype,
        );
        let (embed, head) =
            stage_ends(b, sh, sh.logits_vocab(c.vocab_size), embed, lm_head, || {
                ld.vector(norm_name, h)
            })?;
        Ok(LlamaModel {
            local: sh.local_config(&config),
            head,
            embed,
            layers,
            ropes: [rope],
            backend,
            config,
            place,
            gathered: LogitsGather::default(),
            argmax: Vec::new(),
            sampled: SampledRows::default(),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The config as this rank runs it: its heads, intermediate rows and layers (what its
    /// KV cache holds).
    pub fn local_config(&self) -> &ModelConfig {
        &self.local
    }

    /// Columns of a logits row (see [`crate::FamilyModel::logits_vocab`]).
    pub fn logits_vocab(&self) -> usize {
        self.place.shard.logits_vocab(self.config.vocab_size)
    }

    /// The backend the model runs on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, to tune it (say [`crate::backend::CudaBackend::set_attention_split`]).
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// Bytes of weights one decode step of one sequence reads: every linear layer as its kernel
    /// holds it, the norms and biases, and one row of the embedding table. The KV cache's
    /// reads come on top (they grow with the context).
    pub fn weight_bytes_per_token(&self) -> usize {
        let vec = |v: &B::Vector| B::vector_bytes(v);
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                let linear = l.qkv.iter().map(|(w, _)| B::weight_bytes(w)).sum::<usize>()
                    + B::weight_bytes(&l.wo);
                let expert = |e: &Expert<B>| {
                    B::weight_bytes(&e.gate) + B::weight_bytes(&e.up) + B::weight_bytes(&e.down)
                };
                // A token reads its top_k experts (and the router and shared expert).
                let mlp = match &l.mlp {
                    Mlp::Dense { gate_up, down } => {
                        gate_up
                            .iter()
                            .map(|(w, _)| B::weight_bytes(w))
                            .sum::<usize>()
                            + B::weight_bytes(down)
                    }
                    Mlp::Moe(m) => {
                        B::weight_bytes(&m.router)
                            + m.top_k * m.experts.first().map_or(0, expert)
                            + m.shared.as_ref().map_or(0, |(e, g)| expert(e) + vec(g))
                    }
                };
                let linear = linear + mlp;
                let bias = l.qkv_bias.iter().flatten().map(vec).sum::<usize>();
                let qk = l.qk_norm.iter().flatten().map(vec).sum::<usize>();
                linear + bias + qk + vec(&l.attn_norm) + vec(&l.mlp_norm)
            })
            .sum();
        layers
            + self
                .head
                .as_ref()
                .map_or(0, |(n, w)| vec(n) + B::weight_bytes(w))
            + self.embed.as_ref().map_or(0, B::table_row_bytes)
    }

    /// Runs every token of `batch`, writing their K/V into `kv`, and returns the logits of the
    /// rows in `batch.logits_indices`: `[logits_indices.len(), vocab_size]`. In a parallel
    /// run, this rank's part: the rank that computes no logits returns none.
    pub fn forward(&mut self, batch: &ForwardBatch, kv: &mut KvCache) -> Result<&[f32]> {
        self.run(batch, kv)?;
        let c = &self.config;
        let (b, place) = (&mut self.backend, &self.place);
        let (head, gather) = (self.head.as_ref(), &mut self.gathered);
        let vocab = place.shard.logits_vocab(c.vocab_size);
        place.finish(b, head, gather, c.rms_norm_eps, batch, vocab, None)
    }

    /// [`Self::forward`] with each logits row's argmax instead of the row: `[rows]` token ids,
    /// decided where the logits are (on a GPU, only the ids come back). A whole model in one
    /// process only.
    pub fn forward_argmax(&mut self, batch: &ForwardBatch, kv: &mut KvCache) -> Result<&[u32]> {
        self.place.check_whole("forward_argmax")?;
        self.run(batch, kv)?;
        let (b, head, softcap) = (&mut self.backend, self.head.as_ref(), None);
        let eps = self.config.rms_norm_eps;
        self.place
            .finish_argmax(b, head, eps, batch, softcap, &mut self.argmax)?;
        Ok(&self.argmax)
    }

    /// [`Self::forward`] with each logits row sampled under its spec instead of the row
    /// ([`crate::sampling`]): on a GPU, only the tokens (and requested logprobs) come back. A
    /// whole model in one process only. `specs` makes the specs, one per logits row; it is
    /// called once the pass is under way (on a GPU, enqueued), so the host's work in it (a
    /// constrained request's mask) overlaps the device's.
    pub fn forward_sample<'s>(
        &mut self,
        batch: &ForwardBatch,
        kv: &mut KvCache,
        specs: impl FnOnce() -> Vec<RowSampling<'s>>,
    ) -> Result<&[SampledRow]> {
        self.place.check_whole("forward_sample")?;
        self.run(batch, kv)?;
        let specs = specs();
        let (b, head, softcap) = (&mut self.backend, self.head.as_ref(), None);
        let eps = self.config.rms_norm_eps;
        let out = &mut self.sampled;
        self.place
            .finish_sample(b, head, eps, batch, softcap, &specs, out)?;
        Ok(&self.sampled.rows)
    }

    /// Everything up to the logits: the batch's tokens through every layer (or, on a
    /// replayed step, nothing: the backend's graph holds it).
    fn run(&mut self, batch: &ForwardBatch, kv: &mut KvCache) -> Result<()> {
        let c = &self.config;
        let mut dims = forward_dims(&self.local, batch, kv)?;
        dims.vocab = self.head.as_ref().map_or(0, |_| {
            let s = &self.place.shard;
            s.vocab(s.logits_vocab(c.vocab_size)).len()
        });
        let eps = c.rms_norm_eps;
        let (b, place) = (&mut self.backend, &self.place);
        // A decode step may replay its whole forward, embedding to logits, as one graph
        // captured before (the backend's; never with other ranks to talk to).
        let whole = place.comms.is_none() && self.head.is_some();
        b.begin(dims, batch, &self.ropes, whole)?;
        if b.graph_step(kv)? != GraphStep::Replay {
            // X: [t, h], embedded or the previous stage's.
            match &self.embed {
                Some(table) => b.embed(table, batch, 1.0)?,
                None => place.recv_residual(b)?,
            }
            for (li, layer) in self.layers.iter().enumerate() {
                let shape = AttentionShape {
                    block_size: kv.block_size(),
                    ..layer.attn
                };
                // The previous layer's MLP output joins the residual stream here, fused with the
                // norm and the products' input preparation. Q: [t, nh*hd], K and V: [t, nkv*hd].
                b.add_norm_linear(li > 0, &layer.attn_norm, eps, &layer.qkv)?;
                if let Some([bq, bk, bv]) = &layer.qkv_bias {
                    b.add_bias(Buf::Q, bq)?;
                    b.add_bias(Buf::K, bk)?;
                    b.add_bias(Buf::V, bv)?;
                }
                if let Some([nq, nk]) = &layer.qk_norm {
                    b.head_norm(Buf::Q, nq, eps)?;
                    b.head_norm(Buf::K, nk, eps)?;
                }
                b.rope(0, Buf::Q)?;
                b.rope_write_kv(0, kv, li, &shape, batch)?;
                // Attn: [t, nh*hd]
                b.attend(kv, li, &shape, batch)?;
                // H: [t, h] (this rank's heads' share, summed over the group)
                b.linear(Buf::Attn, &layer.wo, Buf::H)?;
                place.all_reduce(b, Buf::H)?;
                match &layer.mlp {
                    Mlp::Dense { gate_up, down } => {
                        // Gate, Up: [t, inter]
                        b.add_norm_linear(true, &layer.mlp_norm, eps, gate_up)?;
                        // H: [t, h]
                        b.gated_linear(down, c.hidden_act, Buf::H)?;
                    }
                    // H: [t, h], each token's routed experts (grouped by expert).
                    Mlp::Moe(m) => b.moe(&layer.mlp_norm, eps, m, c.hidden_act)?,
                }
                place.all_reduce(b, Buf::H)?;
            }
            // The last layer's MLP output (the others' joined at the next layer's norm).
            if !self.layers.is_empty() {
                b.add_residual()?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::unpermute_order;

    #[test]
    fn unpermute_inverts_llama_cpp_permutation() {
        // llama.cpp: reshape(n_head, 2, hd/2).swapaxes(1, 2): gguf[h, i, p] = hf[h, p, i].
        let (nh, hd) = (2, 8);
        let hf: Vec<usize> = (0..nh * hd).collect();
        let mut gguf = vec![0; nh * hd];
        for h in 0..nh {
            for i in 0..hd / 2 {
                for p in 0..2 {
                    gguf[h * hd + 2 * i + p] = hf[h * hd + p * hd / 2 + i];
                }
            }
        }
        let order = unpermute_order(nh, hd);
        let back: Vec<usize> = order.iter().map(|&r| gguf[r]).collect();
        assert_eq!(back, hf);
    }
}
