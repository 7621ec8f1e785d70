//! Reading a family's tensors from a [`WeightSource`] with their shapes checked: a tensor of
//! another shape is an error naming it and both shapes, before anything is built from it.

use crate::backend::{Backend, Dims};
use crate::parallel::Shard;
use crate::source::{ModelFormat, WeightSource};
use crate::{KvCache, ModelConfig, ModelError, Result};
use ferrum_runtime::Tensor;
use ferrum_types::ForwardBatch;
use std::ops::Range;

/// Loads tensors and checks their shapes.
pub(crate) struct Loader<'a> {
    pub(crate) src: &'a WeightSource,
}

impl Loader<'_> {
    pub(crate) fn tensor(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
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

    /// Rows `r` of the tensor `name` of `shape` (a tensor-parallel rank's output rows).
    pub(crate) fn rows(&self, name: &str, shape: &[usize], r: Range<usize>) -> Result<Tensor> {
        take_rows(self.tensor(name, shape)?, r)
    }

    /// Columns `r` of the tensor `name` of `shape` (a tensor-parallel rank's input columns).
    pub(crate) fn cols(&self, name: &str, shape: &[usize], r: Range<usize>) -> Result<Tensor> {
        take_cols(self.tensor(name, shape)?, r, name)
    }

    pub(crate) fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        Ok(self.tensor(name, &[len])?.to_f32_vec())
    }

    /// The token embedding `[vocab, hidden]`, the LM head (the embedding itself when the
    /// config ties them or a GGUF file has no `output.weight`), and the final norm's name.
    pub(crate) fn embed_and_head(&self, c: &ModelConfig) -> Result<(Tensor, Tensor, &'static str)> {
        let fmt = self.src.format();
        let (embed_name, norm_name, head_name) = match fmt {
            ModelFormat::HfFolder => (
                "model.embed_tokens.weight",
                "model.norm.weight",
                "lm_head.weight",
            ),
            ModelFormat::Gguf => ("token_embd.weight", "output_norm.weight", "output.weight"),
        };
        let shape = [c.vocab_size, c.hidden_size];
        let embed = self.tensor(embed_name, &shape)?;
        let tied =
            c.tie_word_embeddings || (fmt == ModelFormat::Gguf && !self.src.contains(head_name));
        let head = if tied {
            embed.clone()
        } else {
            self.tensor(head_name, &shape)?
        };
        Ok((embed, head, norm_name))
    }
}

/// The first stage's embedding table, and the last stage's final norm (`final_norm`, read
/// only there) with its ranks' vocabulary rows of the LM head; `None` for the stages without.
#[allow(clippy::type_complexity)]
pub(crate) fn stage_ends<B: Backend>(
    b: &mut B,
    sh: &Shard,
    vocab: usize,
    embed: Tensor,
    lm_head: Tensor,
    final_norm: impl FnOnce() -> Result<Vec<f32>>,
) -> Result<(Option<B::Table>, Option<(B::Vector, B::Weight)>)> {
    let head = if sh.is_last_stage() {
        let rows = take_rows(lm_head, sh.vocab(vocab))?;
        Some((b.vector(final_norm()?)?, b.weight(rows)?))
    } else {
        None
    };
    let embed = if sh.is_first_stage() {
        Some(b.table(embed)?)
    } else {
        None
    };
    Ok((embed, head))
}

/// Rows `r` of `t` (`t` itself when `r` spans it).
pub(crate) fn take_rows(t: Tensor, r: Range<usize>) -> Result<Tensor> {
    if r == (0..t.rows()) {
        return Ok(t);
    }
    Ok(t.slice_rows(r.start, r.len())?)
}

/// Columns `r` of `t`, the tensor `name` (`t` itself when `r` spans it); block-quantized
/// rows cut only at block boundaries.
pub(crate) fn take_cols(t: Tensor, r: Range<usize>, name: &str) -> Result<Tensor> {
    if t.shape().len() == 2 && r == (0..t.shape()[1]) {
        return Ok(t);
    }
    t.slice_cols(r.start, r.len()).map_err(|e| {
        ModelError::Invalid(format!(
            "{name} does not split over the tensor-parallel ranks: {e}"
        ))
    })
}

/// `v[r]` (a tensor-parallel rank's part of a bias).
pub(crate) fn take_vec(v: Vec<f32>, r: Range<usize>) -> Vec<f32> {
    if r == (0..v.len()) {
        v
    } else {
        v[r].to_vec()
    }
}

/// Checks `batch` against `kv` and `c` before a forward, and gives the activation widths.
pub(crate) fn forward_dims(c: &ModelConfig, batch: &ForwardBatch, kv: &KvCache) -> Result<Dims> {
    if !kv.fits(c) {
        return Err(ModelError::Invalid(
            "the KV cache was built for another model".into(),
        ));
    }
    batch.validate(kv.block_size(), kv.num_blocks(), c.vocab_size)?;
    Ok(Dims {
        hidden: c.hidden_size,
        q: c.num_attention_heads * c.head_dim,
        kv: c.num_key_value_heads * c.head_dim,
        intermediate: c.intermediate_size,
        vocab: c.vocab_size,
    })
}
