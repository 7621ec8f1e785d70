//! The Gemma family: Gemma 2 and Gemma 3 (text), from Hugging Face folders and GGUF files.
//!
//! Each layer, with every RMSNorm scaling by `(1 + w)`:
//! `x += post_attn_norm(o(attn(rope(qn(q(n1(x)))), rope(kn(k(n1(x)))), v(n1(x)))))`, then
//! `x += post_mlp_norm(down(gelu_tanh(gate(n2(x))) * up(n2(x))))`. The embedding is scaled
//! by `sqrt(hidden)`; the final logits may be soft-capped (`cap * tanh(l / cap)`).
//!
//! Differences between the two, all read from the config:
//! - Gemma 3 has per-head q/k RMSNorm and a separate RoPE for its sliding-window (local)
//!   layers (`rope_local_base_freq`, unscaled); global layers use `rope_theta` with the
//!   config's scaling. Gemma 2 has neither, but soft-caps attention scores.
//! - Which layers slide: `layer_types`, else every `sliding_window_pattern`-th layer is
//!   global (Gemma 2 alternates, Gemma 3 has 5 local to 1 global).
//! - Scores are scaled by `query_pre_attn_scalar^-1/2` (HF), `head_dim^-1/2` when absent.
//!
//! Hugging Face stores norm weights as `w` (the model computes `1 + w`); llama.cpp's converter
//! stores `1 + w`. The `+1` is folded in at load for HF folders, so the forward runs plain
//! RMSNorms. GGUF q/k rows are in Hugging Face order for this family (not permuted).

use crate::backend::{Backend, Buf, CpuBackend, GraphStep, Outs};
use crate::parallel::{LogitsGather, Placement};
use crate::sampling::{RowSampling, SampledRow, SampledRows};
use crate::source::{ModelFormat, WeightSource};
use crate::weights::{forward_dims, stage_ends, Loader};
use crate::{KvCache, ModelConfig, ModelError, Result};
use ferrum_runtime::cpu::{AttentionShape, Rope, RopeScaling};
use ferrum_types::ForwardBatch;

#[derive(Debug)]
struct Layer<B: Backend> {
    attn_norm: B::Vector,
    /// The q, k and v projections as the backend runs them ([`Backend::products`]).
    qkv: Vec<(B::Weight, Outs)>,
    wo: B::Weight,
    /// Per-head q and k RMSNorm weights (Gemma 3).
    qk_norm: Option<[B::Vector; 2]>,
    post_attn_norm: B::Vector,
    pre_mlp_norm: B::Vector,
    post_mlp_norm: B::Vector,
    /// The gate and up projections as the backend runs them ([`Backend::products`]).
    gate_up: Vec<(B::Weight, Outs)>,
    w_down: B::Weight,
    attn: AttentionShape,
    /// Index of this layer's rope in [`GemmaModel::ropes`].
    rope: usize,
}

/// A Gemma 2 or 3 model ready to run on backend `B` (the CPU unless said otherwise).
#[derive(Debug)]
pub struct GemmaModel<B: Backend = CpuBackend> {
    config: ModelConfig,
    /// The config as this rank runs it.
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
    /// The global layers' rope, then (Gemma 3) the local layers'.
    ropes: Vec<Rope>,
}

#[derive(Clone, Copy)]
enum Part {
    AttnNorm,
    Q,
    K,
    V,
    O,
    QNorm,
    KNorm,
    PostAttnNorm,
    PreMlpNorm,
    PostMlpNorm,
    Gate,
    Up,
    Down,
}

fn layer_name(format: ModelFormat, i: usize, part: Part) -> String {
    let (hf, gguf) = match part {
        Part::AttnNorm => ("input_layernorm.weight", "attn_norm.weight"),
        Part::Q => ("self_attn.q_proj.weight", "attn_q.weight"),
        Part::K => ("self_attn.k_proj.weight", "attn_k.weight"),
        Part::V => ("self_attn.v_proj.weight", "attn_v.weight"),
        Part::O => ("self_attn.o_proj.weight", "attn_output.weight"),
        Part::QNorm => ("self_attn.q_norm.weight", "attn_q_norm.weight"),
        Part::KNorm => ("self_attn.k_norm.weight", "attn_k_norm.weight"),
        Part::PostAttnNorm => (
            "post_attention_layernorm.weight",
            "post_attention_norm.weight",
        ),
        Part::PreMlpNorm => ("pre_feedforward_layernorm.weight", "ffn_norm.weight"),
        Part::PostMlpNorm => ("post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
        Part::Gate => ("mlp.gate_proj.weight", "ffn_gate.weight"),
        Part::Up => ("mlp.up_proj.weight", "ffn_up.weight"),
        Part::Down => ("mlp.down_proj.weight", "ffn_down.weight"),
    };
    match format {
        ModelFormat::HfFolder => format!("model.layers.{i}.{hf}"),
        ModelFormat::Gguf => format!("blk.{i}.{gguf}"),
    }
}

impl<B: Backend> GemmaModel<B> {
    /// Builds `place`'s shard of the model on `backend` from `src` (see
    /// [`crate::LlamaModel::load_placed`]).
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
        let (qh, kh, ir) = (sh.q_heads(nh), sh.kv_heads(nkv), sh.intermediate(inter));
        let (qr, kr) = (qh.start * hd..qh.end * hd, kh.start * hd..kh.end * hd);
        if c.rotary_dim != hd {
            return Err(ModelError::Invalid(format!(
                "Gemma rotates whole heads; this config rotates {} of {hd}",
                c.rotary_dim
            )));
        }
        // HF stores `w` of `(1 + w)`; llama.cpp's converter stores `1 + w`.
        let norm = |name: &str, len: usize| -> Result<Vec<f32>> {
            let mut w = ld.vector(name, len)?;
            if fmt == ModelFormat::HfFolder {
                w.iter_mut().for_each(|v| *v += 1.0);
            }
            Ok(w)
        };
        let (embed, lm_head, norm_name) = ld.embed_and_head(c)?;
        // The registry keeps Gemma's frequencies in f32 even for a bf16 checkpoint, as its
        // reference does (the bf16 fixtures agree to 3e-6 so, to 3e-3 with rounded ones).
        let global = Rope::new(hd, c.rope_theta, &c.rope_scaling, None, c.rope_table_dtype);
        let mut ropes = vec![global];
        if let Some(theta) = c.rope_local_theta {
            ropes.push(Rope::new(
                hd,
                theta,
                &RopeScaling::None,
                None,
                c.rope_table_dtype,
            ));
        }
        let scale = c.attention_scale.unwrap_or(1.0 / (hd as f32).sqrt());
        let mut layers = Vec::with_capacity(sh.layers.len());
        for i in sh.layers.clone() {
            let name = |p: Part| layer_name(fmt, i, p);
            let window = c.layer_sliding_window[i];
            let qk_norm = if c.spec.qk_norm {
                Some([
                    b.vector(norm(&name(Part::QNorm), hd)?)?,
                    b.vector(norm(&name(Part::KNorm), hd)?)?,
                ])
            } else {
                None
            };
            layers.push(Layer {
                attn_norm: b.vector(norm(&name(Part::AttnNorm), h)?)?,
                qkv: b.products(vec![
                    (ld.rows(&name(Part::Q), &[qd, h], qr.clone())?, Buf::Q),
                    (ld.rows(&name(Part::K), &[kvd, h], kr.clone())?, Buf::K),
                    (ld.rows(&name(Part::V), &[kvd, h], kr.clone())?, Buf::V),
                ])?,
                wo: b.weight(ld.cols(&name(Part::O), &[h, qd], qr.clone())?)?,
                qk_norm,
                post_attn_norm: b.vector(norm(&name(Part::PostAttnNorm), h)?)?,
                pre_mlp_norm: b.vector(norm(&name(Part::PreMlpNorm), h)?)?,
                post_mlp_norm: b.vector(norm(&name(Part::PostMlpNorm), h)?)?,
                gate_up: b.products(vec![
                    (
                        ld.rows(&name(Part::Gate), &[inter, h], ir.clone())?,
                        Buf::Gate,
                    ),
                    (ld.rows(&name(Part::Up), &[inter, h], ir.clone())?, Buf::Up),
                ])?,
                w_down: b.weight(ld.cols(&name(Part::Down), &[h, inter], ir.clone())?)?,
                attn: AttentionShape {
                    num_heads: qh.len(),
                    num_kv_heads: kh.len(),
                    head_dim: hd,
                    block_size: 0,
                    scale,
                    sliding_window: window,
                    softcap: c.attn_logit_softcap,
                },
                rope: if window.is_some() && ropes.len() > 1 {
                    1
                } else {
                    0
                },
            });
        }
        let (embed, head) =
            stage_ends(b, sh, sh.logits_vocab(c.vocab_size), embed, lm_head, || {
                norm(norm_name, h)
            })?;
        Ok(GemmaModel {
            local: sh.local_config(&config),
            config,
            place,
            backend,
            embed,
            layers,
            head,
            gathered: LogitsGather::default(),
            argmax: Vec::new(),
            sampled: SampledRows::default(),
            ropes,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The config as this rank runs it (see [`crate::LlamaModel::local_config`]).
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

    /// Bytes of weights one decode step of one sequence reads (see
    /// [`crate::LlamaModel::weight_bytes_per_token`]).
    pub fn weight_bytes_per_token(&self) -> usize {
        let vec = |v: &B::Vector| B::vector_bytes(v);
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                let linear = l
                    .qkv
                    .iter()
                    .chain(&l.gate_up)
                    .map(|(w, _)| B::weight_bytes(w))
                    .sum::<usize>()
                    + B::weight_bytes(&l.wo)
                    + B::weight_bytes(&l.w_down);
                let norms = [
                    &l.attn_norm,
                    &l.post_attn_norm,
                    &l.pre_mlp_norm,
                    &l.post_mlp_norm,
                ]
                .into_iter()
                .chain(l.qk_norm.iter().flatten())
                .map(vec)
                .sum::<usize>();
                linear + norms
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
    /// rows in `batch.logits_indices`: `[logits_indices.len(), vocab_size]`.
    pub fn forward(&mut self, batch: &ForwardBatch, kv: &mut KvCache) -> Result<&[f32]> {
        self.run(batch, kv)?;
        let c = &self.config;
        let (b, place) = (&mut self.backend, &self.place);
        let (head, gather) = (self.head.as_ref(), &mut self.gathered);
        let vocab = place.shard.logits_vocab(c.vocab_size);
        place.finish(
            b,
            head,
            gather,
            c.rms_norm_eps,
            batch,
            vocab,
            c.final_logit_softcap,
        )
    }

    /// [`Self::forward`] with each logits row's argmax instead of the row: `[rows]` token ids,
    /// decided where the logits are (on a GPU, only the ids come back). A whole model in one
    /// process only.
    pub fn forward_argmax(&mut self, batch: &ForwardBatch, kv: &mut KvCache) -> Result<&[u32]> {
        self.place.check_whole("forward_argmax")?;
        self.run(batch, kv)?;
        let (b, head, softcap) = (
            &mut self.backend,
            self.head.as_ref(),
            self.config.final_logit_softcap,
        );
        let eps = self.config.rms_norm_eps;
        self.place
            .finish_argmax(b, head, eps, batch, softcap, &mut self.argmax)?;
        Ok(&self.argmax)
    }

    /// [`Self::forward`] with each logits row sampled under its spec instead of the row
    /// ([`crate::sampling`]): on a GPU, only the tokens (and requested logprobs) come back. A
    /// whole model in one process only.
    pub fn forward_sample<'s>(
        &mut self,
        batch: &ForwardBatch,
        kv: &mut KvCache,
        specs: impl FnOnce() -> Vec<RowSampling<'s>>,
    ) -> Result<&[SampledRow]> {
        self.place.check_whole("forward_sample")?;
        self.run(batch, kv)?;
        let specs = specs();
        let (b, head, softcap) = (
            &mut self.backend,
            self.head.as_ref(),
            self.config.final_logit_softcap,
        );
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
            // X: [t, h], scaled by sqrt(h) as the reference does in f32; or the previous stage's.
            match &self.embed {
                Some(table) => b.embed(table, batch, (c.hidden_size as f32).sqrt())?,
                None => place.recv_residual(b)?,
            }
            for (li, layer) in self.layers.iter().enumerate() {
                let shape = AttentionShape {
                    block_size: kv.block_size(),
                    ..layer.attn
                };
                // The previous layer's normed MLP output joins the residual stream here.
                // Q: [t, nh*hd], K and V: [t, nkv*hd].
                b.add_norm_linear(li > 0, &layer.attn_norm, eps, &layer.qkv)?;
                if let Some([nq, nk]) = &layer.qk_norm {
                    b.head_norm(Buf::Q, nq, eps)?;
                    b.head_norm(Buf::K, nk, eps)?;
                }
                b.rope(layer.rope, Buf::Q)?;
                b.rope_write_kv(layer.rope, kv, li, &shape, batch)?;
                // Attn: [t, nh*hd]
                b.attend(kv, li, &shape, batch)?;
                // H: [t, h], normed over the whole row before it joins the stream.
                b.linear(Buf::Attn, &layer.wo, Buf::H)?;
                place.all_reduce(b, Buf::H)?;
                b.head_norm(Buf::H, &layer.post_attn_norm, eps)?;
                // Gate, Up: [t, inter]
                b.add_norm_linear(true, &layer.pre_mlp_norm, eps, &layer.gate_up)?;
                // H: [t, h]
                b.gated_linear(&layer.w_down, c.hidden_act, Buf::H)?;
                place.all_reduce(b, Buf::H)?;
                b.head_norm(Buf::H, &layer.post_mlp_norm, eps)?;
            }
            if !self.layers.is_empty() {
                b.add_residual()?;
            }
        }
        Ok(())
    }
}
