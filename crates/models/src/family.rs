//! One model of any family on backend `B`: the dispatch from [`crate::Family`] to its file.
//! Every family offers the same four things (config, backend, bytes per token, forward), so
//! the engine never learns which family it runs.

use crate::backend::Backend;
use crate::parallel::Placement;
use crate::registry::Family;
use crate::source::WeightSource;
use crate::{GemmaModel, KvCache, LlamaModel, ModelConfig, Result};
use ferrum_types::ForwardBatch;

/// A loaded model of one family on backend `B`.
#[derive(Debug)]
pub enum FamilyModel<B: Backend> {
    Llama(LlamaModel<B>),
    Gemma(GemmaModel<B>),
}

impl<B: Backend> FamilyModel<B> {
    /// Builds `config`'s family on `backend` from `src`.
    pub fn load_with(config: ModelConfig, src: &WeightSource, backend: B) -> Result<Self> {
        Self::load_whole(config, src, backend, None)
    }

    /// Builds the whole model, with logits for the first `output_vocab` tokens only when
    /// given (see [`crate::LoadOptions::output_vocab`]).
    pub fn load_whole(
        config: ModelConfig,
        src: &WeightSource,
        backend: B,
        output_vocab: Option<usize>,
    ) -> Result<Self> {
        if output_vocab == Some(0) {
            return Err(crate::ModelError::Invalid(
                "an output vocabulary of 0 tokens".into(),
            ));
        }
        let mut place = Placement::whole(&config);
        place.shard.output_vocab = output_vocab;
        Self::load_placed(config, src, backend, place)
    }

    /// Builds `place`'s shard of `config`'s family on `backend` from `src`.
    pub fn load_placed(
        config: ModelConfig,
        src: &WeightSource,
        backend: B,
        place: Placement,
    ) -> Result<Self> {
        Ok(match config.spec.family {
            Family::Llama => {
                FamilyModel::Llama(LlamaModel::load_placed(config, src, backend, place)?)
            }
            Family::Gemma => {
                FamilyModel::Gemma(GemmaModel::load_placed(config, src, backend, place)?)
            }
        })
    }

    /// Columns of a logits row: the vocabulary, or the output vocabulary the model was loaded
    /// with ([`crate::LoadOptions::output_vocab`]).
    pub fn logits_vocab(&self) -> usize {
        match self {
            FamilyModel::Llama(m) => m.logits_vocab(),
            FamilyModel::Gemma(m) => m.logits_vocab(),
        }
    }

    /// The config as this rank runs it (the whole config in one process).
    pub fn local_config(&self) -> &ModelConfig {
        match self {
            FamilyModel::Llama(m) => m.local_config(),
            FamilyModel::Gemma(m) => m.local_config(),
        }
    }

    pub fn config(&self) -> &ModelConfig {
        match self {
            FamilyModel::Llama(m) => m.config(),
            FamilyModel::Gemma(m) => m.config(),
        }
    }

    /// The backend the model runs on.
    pub fn backend(&self) -> &B {
        match self {
            FamilyModel::Llama(m) => m.backend(),
            FamilyModel::Gemma(m) => m.backend(),
        }
    }

    /// The backend, to tune it (say [`crate::backend::CudaBackend::set_attention_split`]).
    pub fn backend_mut(&mut self) -> &mut B {
        match self {
            FamilyModel::Llama(m) => m.backend_mut(),
            FamilyModel::Gemma(m) => m.backend_mut(),
        }
    }

    /// See [`LlamaModel::weight_bytes_per_token`].
    pub fn weight_bytes_per_token(&self) -> usize {
        match self {
            FamilyModel::Llama(m) => m.weight_bytes_per_token(),
            FamilyModel::Gemma(m) => m.weight_bytes_per_token(),
        }
    }

    /// See [`LlamaModel::forward`].
    pub fn forward(&mut self, batch: &ForwardBatch, kv: &mut KvCache) -> Result<&[f32]> {
        match self {
            FamilyModel::Llama(m) => m.forward(batch, kv),
            FamilyModel::Gemma(m) => m.forward(batch, kv),
        }
    }

    /// See [`LlamaModel::forward_sample`].
    pub fn forward_sample<'s>(
        &mut self,
        batch: &ForwardBatch,
        kv: &mut KvCache,
        specs: impl FnOnce() -> Vec<crate::sampling::RowSampling<'s>>,
    ) -> Result<&[crate::sampling::SampledRow]> {
        match self {
            FamilyModel::Llama(m) => m.forward_sample(batch, kv, specs),
            FamilyModel::Gemma(m) => m.forward_sample(batch, kv, specs),
        }
    }

    /// See [`LlamaModel::forward_argmax`].
    pub fn forward_argmax(&mut self, batch: &ForwardBatch, kv: &mut KvCache) -> Result<&[u32]> {
        match self {
            FamilyModel::Llama(m) => m.forward_argmax(batch, kv),
            FamilyModel::Gemma(m) => m.forward_argmax(batch, kv),
        }
    }
}
