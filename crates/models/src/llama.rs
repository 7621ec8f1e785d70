//! The Llama family: Llama (incl. Llama 3 rope scaling), Mistral (sliding window), Qwen2 (q/k/v
//! bias), Qwen3 (per-head q/k RMSNorm, explicit head_dim) and SmolLM2, selected by config flags.
//!
//! Each layer: `x += o(attn(rope(q(n1(x))), rope(k(n1(x))), v(n1(x))))`, then
//! `x += down(silu(gate(n2(x))) * up(n2(x)))`; final RMSNorm and the LM head run only on the
//! rows whose logits are asked for. Weights stay in their stored format; GGUF q/k rows written in
//! llama.cpp's interleaved order are put back in Hugging Face order at load (rows move whole, so
//! block-quantized weights are untouched). Scratch buffers grow to the largest batch seen and are
//! reused.

use crate::source::{ModelFormat, WeightSource};
use crate::{KvCache, ModelConfig, ModelError, Result};
use ferrum_runtime::cpu::ActScratch;
use ferrum_runtime::cpu::{self, AttentionShape, Linear, Rope, Weight};
use ferrum_runtime::{Tensor, ThreadPool};
use ferrum_types::ForwardBatch;
use std::sync::Arc;

#[derive(Debug)]
struct Layer {
    attn_norm: Vec<f32>,
    wq: Weight,
    wk: Weight,
    wv: Weight,
    wo: Weight,
    /// q, k, v biases.
    qkv_bias: Option<[Vec<f32>; 3]>,
    /// Per-head q and k RMSNorm weights.
    qk_norm: Option<[Vec<f32>; 2]>,
    mlp_norm: Vec<f32>,
    w_gate: Weight,
    w_up: Weight,
    w_down: Weight,
    attn: AttentionShape,
}

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
    /// Cosine and sine of every token's rotary angles.
    rope: Vec<f32>,
    /// The current linear input, quantized (int8 path).
    qa: ActScratch,
    /// Attention's per-part softmax states of split decodes.
    attn_partials: Vec<f32>,
}

/// A Llama-family model ready to run.
#[derive(Debug)]
pub struct LlamaModel {
    config: ModelConfig,
    pool: Arc<ThreadPool>,
    linear: Linear,
    embed: Tensor,
    layers: Vec<Layer>,
    final_norm: Vec<f32>,
    lm_head: Weight,
    rope: Rope,
    scratch: Scratch,
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
    };
    match format {
        ModelFormat::HfFolder => format!("model.layers.{i}.{hf}"),
        ModelFormat::Gguf => format!("blk.{i}.{gguf}"),
    }
}

/// Loads tensors and checks their shapes.
struct Loader<'a> {
    src: &'a WeightSource,
}

impl Loader<'_> {
    fn tensor(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self.src.tensor(name)?;
        if t.shape() != shape {
            return Err(ModelError::TensorShape {
                path: self.src.path().to_path_buf(),
                name: name.to_string(),
                expected: shape.to_vec(),
                actual: t.shape().to_vec(),
            });
        }
        Ok(t)
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        Ok(self.tensor(name, &[len])?.to_f32_vec())
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

impl LlamaModel {
    /// Builds the model from `src`, checking every tensor against `config`.
    pub fn load(
        config: ModelConfig,
        src: &WeightSource,
        pool: Arc<ThreadPool>,
        linear: Linear,
    ) -> Result<LlamaModel> {
        let c = &config;
        let fmt = src.format();
        let ld = Loader { src };
        let (h, hd, nh, nkv) = (
            c.hidden_size,
            c.head_dim,
            c.num_attention_heads,
            c.num_key_value_heads,
        );
        let (qd, kvd, inter) = (nh * hd, nkv * hd, c.intermediate_size);
        let (embed_name, norm_name, head_name) = match fmt {
            ModelFormat::HfFolder => (
                "model.embed_tokens.weight",
                "model.norm.weight",
                "lm_head.weight",
            ),
            ModelFormat::Gguf => ("token_embd.weight", "output_norm.weight", "output.weight"),
        };
        let embed = ld.tensor(embed_name, &[c.vocab_size, h])?;
        let lm_head =
            if c.tie_word_embeddings || (fmt == ModelFormat::Gguf && !src.contains(head_name)) {
                embed.clone()
            } else {
                ld.tensor(head_name, &[c.vocab_size, h])?
            };
        let permuted = fmt == ModelFormat::Gguf && c.spec.gguf_qk_permuted;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let name = |p: Part| layer_name(fmt, i, p);
            let mut wq = ld.tensor(&name(Part::Q), &[qd, h])?;
            let mut wk = ld.tensor(&name(Part::K), &[kvd, h])?;
            let mut qkv_bias = if c.attention_bias {
                Some([
                    ld.vector(&name(Part::QBias), qd)?,
                    ld.vector(&name(Part::KBias), kvd)?,
                    ld.vector(&name(Part::VBias), kvd)?,
                ])
            } else {
                None
            };
            if permuted {
                let (oq, ok) = (unpermute_order(nh, hd), unpermute_order(nkv, hd));
                wq = wq.permute_rows(&oq)?;
                wk = wk.permute_rows(&ok)?;
                if let Some([bq, bk, _]) = qkv_bias.as_mut() {
                    *bq = oq.iter().map(|&r| bq[r]).collect();
                    *bk = ok.iter().map(|&r| bk[r]).collect();
                }
            }
            let weight = |t: Tensor| Weight::new(t, &linear, &pool).map_err(ModelError::from);
            layers.push(Layer {
                attn_norm: ld.vector(&name(Part::AttnNorm), h)?,
                wq: weight(wq)?,
                wk: weight(wk)?,
                wv: weight(ld.tensor(&name(Part::V), &[kvd, h])?)?,
                wo: weight(ld.tensor(&name(Part::O), &[h, qd])?)?,
                qkv_bias,
                qk_norm: if c.spec.qk_norm {
                    Some([
                        ld.vector(&name(Part::QNorm), hd)?,
                        ld.vector(&name(Part::KNorm), hd)?,
                    ])
                } else {
                    None
                },
                mlp_norm: ld.vector(&name(Part::MlpNorm), h)?,
                w_gate: weight(ld.tensor(&name(Part::Gate), &[inter, h])?)?,
                w_up: weight(ld.tensor(&name(Part::Up), &[inter, h])?)?,
                w_down: weight(ld.tensor(&name(Part::Down), &[h, inter])?)?,
                attn: AttentionShape {
                    num_heads: nh,
                    num_kv_heads: nkv,
                    head_dim: hd,
                    block_size: 0,
                    scale: 1.0 / (hd as f32).sqrt(),
                    sliding_window: c.layer_sliding_window[i],
                },
            });
        }
        // GGUF stores Llama 3 frequency scaling as per-pair divisors.
        let freq_factors = if fmt == ModelFormat::Gguf && src.contains("rope_freqs.weight") {
            Some(ld.vector("rope_freqs.weight", hd / 2)?)
        } else {
            None
        };
        let rope = Rope::new(
            hd,
            c.rope_theta,
            &c.rope_scaling,
            freq_factors.as_deref(),
            c.rope_table_dtype,
        );
        Ok(LlamaModel {
            final_norm: ld.vector(norm_name, h)?,
            embed,
            lm_head: Weight::new(lm_head, &linear, &pool)?,
            layers,
            rope,
            pool,
            linear,
            scratch: Scratch::default(),
            config,
        })
    }

    /// The compute pool this model runs on (possibly shared with other models).
    pub fn compute_pool(&self) -> &Arc<ThreadPool> {
        &self.pool
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Bytes of weights one decode step of one sequence reads: every linear layer as its kernel
    /// holds it, the norms and biases, and one row of the embedding table. The KV cache's
    /// reads come on top (they grow with the context).
    pub fn weight_bytes_per_token(&self) -> usize {
        let f32s = |v: &[f32]| 4 * v.len();
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                let linear = [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]
                    .iter()
                    .map(|w| w.num_bytes())
                    .sum::<usize>();
                let bias = l.qkv_bias.iter().flatten().map(|b| f32s(b)).sum::<usize>();
                let qk = l.qk_norm.iter().flatten().map(|n| f32s(n)).sum::<usize>();
                linear + bias + qk + f32s(&l.attn_norm) + f32s(&l.mlp_norm)
            })
            .sum();
        let embed_row = self.embed.num_bytes() / self.embed.rows().max(1);
        layers + f32s(&self.final_norm) + self.lm_head.num_bytes() + embed_row
    }

    /// Runs every token of `batch`, writing their K/V into `kv`, and returns the logits of the
    /// rows in `batch.logits_indices`: `[logits_indices.len(), vocab_size]`.
    pub fn forward(&mut self, batch: &ForwardBatch, kv: &mut KvCache) -> Result<&[f32]> {
        let c = &self.config;
        if !kv.fits(c) {
            return Err(ModelError::Invalid(
                "the KV cache was built for another model".into(),
            ));
        }
        batch.validate(kv.block_size(), kv.num_blocks(), c.vocab_size)?;
        let t = batch.num_tokens();
        let (h, inter, vocab) = (c.hidden_size, c.intermediate_size, c.vocab_size);
        let (qd, kvd) = (
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
        );
        let num_logits = batch.logits_indices.len();
        let s = &mut self.scratch;
        for (buf, len) in [
            (&mut s.x, t * h),
            (&mut s.h, t * h),
            (&mut s.q, t * qd),
            (&mut s.k, t * kvd),
            (&mut s.v, t * kvd),
            (&mut s.attn, t * qd),
            (&mut s.gate, t * inter),
            (&mut s.up, t * inter),
            (&mut s.rows, num_logits * h),
            (&mut s.logits, num_logits * vocab),
        ] {
            buf.resize(len, 0.0);
        }
        let pool = &*self.pool;
        let lin = self.linear;
        // [t, h]
        cpu::embedding(&self.embed, &batch.token_ids, &mut s.x)?;
        // [t, head_dim / 2, 2]
        self.rope.angles(&batch.positions, &mut s.rope);
        for (li, layer) in self.layers.iter().enumerate() {
            let shape = AttentionShape {
                block_size: kv.block_size(),
                ..layer.attn
            };
            // The previous layer's MLP output joins the residual stream here, fused with the
            // norm and the input's quantization. q: [t, nh*hd], k and v: [t, nkv*hd]; the
            // input is quantized once for all three.
            let input = lin.add_norm_prepare(
                pool,
                &mut s.x,
                &mut s.h,
                li > 0,
                &layer.attn_norm,
                c.rms_norm_eps,
                &mut s.qa,
                &[&layer.wq, &layer.wk, &layer.wv],
            );
            lin.matmul_many(
                pool,
                &input,
                &mut [
                    (&layer.wq, &mut s.q[..]),
                    (&layer.wk, &mut s.k[..]),
                    (&layer.wv, &mut s.v[..]),
                ],
            )?;
            if let Some([bq, bk, bv]) = &layer.qkv_bias {
                cpu::add_bias(&mut s.q, bq);
                cpu::add_bias(&mut s.k, bk);
                cpu::add_bias(&mut s.v, bv);
            }
            if let Some([nq, nk]) = &layer.qk_norm {
                // Per head: rows of head_dim.
                cpu::rms_norm_in_place(&mut s.q, nq, c.rms_norm_eps);
                cpu::rms_norm_in_place(&mut s.k, nk, c.rms_norm_eps);
            }
            self.rope.apply_with(&mut s.q, &s.rope);
            self.rope.apply_with(&mut s.k, &s.rope);
            let mut cache = kv.layer_mut(li);
            cache.write(pool, &s.k, &s.v, &batch.slot_mapping, &shape);
            // [t, nh*hd]
            cache.attend(
                pool,
                &s.q,
                &batch.seqs,
                &batch.block_tables,
                &shape,
                &mut s.attn,
                &mut s.attn_partials,
            );
            // [t, h]
            let input = lin.prepare(pool, &s.attn, qd, &mut s.qa, &[&layer.wo]);
            lin.matmul(pool, &input, &layer.wo, &mut s.h)?;
            // [t, inter]
            let input = lin.add_norm_prepare(
                pool,
                &mut s.x,
                &mut s.h,
                true,
                &layer.mlp_norm,
                c.rms_norm_eps,
                &mut s.qa,
                &[&layer.w_gate, &layer.w_up],
            );
            lin.matmul_many(
                pool,
                &input,
                &mut [
                    (&layer.w_gate, &mut s.gate[..]),
                    (&layer.w_up, &mut s.up[..]),
                ],
            )?;
            // [t, h]
            let input =
                lin.silu_mul_prepare(pool, &mut s.gate, &s.up, inter, &mut s.qa, &[&layer.w_down]);
            lin.matmul(pool, &input, &layer.w_down, &mut s.h)?;
        }
        // The last layer's MLP output (the others' joined at the next layer's norm).
        if !self.layers.is_empty() {
            cpu::add_par(pool, &mut s.x, &s.h);
        }
        // [num_logits, h]
        for (dst, &row) in s.h[..num_logits * h]
            .chunks_exact_mut(h)
            .zip(&batch.logits_indices)
        {
            let row = row as usize;
            dst.copy_from_slice(&s.x[row * h..(row + 1) * h]);
        }
        cpu::rms_norm(
            &s.h[..num_logits * h],
            &self.final_norm,
            c.rms_norm_eps,
            &mut s.rows,
        );
        // [num_logits, vocab]
        let input = lin.prepare(pool, &s.rows, h, &mut s.qa, &[&self.lm_head]);
        lin.matmul(pool, &input, &self.lm_head, &mut s.logits)?;
        Ok(&s.logits)
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
