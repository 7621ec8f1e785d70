//! Reading a family's tensors from a [`WeightSource`] with their shapes checked: a tensor of
//! another shape is an error naming it and both shapes, before anything is built from it.

use crate::backend::Dims;
use crate::source::{ModelFormat, WeightSource};
use crate::{KvCache, ModelConfig, ModelError, Result};
use ferrum_runtime::Tensor;
use ferrum_types::ForwardBatch;

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
