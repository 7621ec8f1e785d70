//! Tensor and pipeline parallelism: a rank's [`Shard`] of the model, the [`Comms`] it talks
//! over, and the step protocol between rank 0 and the other ranks (the `driver` module).
//!
//! Every rank loads only its shard. Rank 0 runs the engine; each step it broadcasts the batch,
//! and every rank runs the same forward over its shard: a tensor-parallel group all-reduces the
//! output of each attention and MLP, a stage receives the residual stream from the stage
//! before it and sends its own to the stage after, and the last stage's first rank sends the
//! logits back to rank 0.

pub(crate) mod driver;
mod shard;

pub use driver::{check_loaded, run_worker};
pub use shard::{Layout, Shard};

use crate::backend::{Backend, Buf};
use crate::Result;
use ferrum_runtime::Communicator;
use std::sync::Arc;

/// The groups a rank of a parallel run talks over.
#[derive(Debug, Clone)]
pub struct Comms {
    /// Every rank: the step broadcast, stage-to-stage sends, the logits' return.
    pub world: Arc<dyn Communicator>,
    /// The ranks of this rank's stage: all-reduces.
    pub tp: Arc<dyn Communicator>,
}

/// A family model's place in a run: its shard, and the groups when there are other ranks.
#[derive(Debug, Clone)]
pub struct Placement {
    pub shard: Shard,
    pub comms: Option<Comms>,
}

impl Placement {
    /// The whole model in one process.
    pub fn whole(c: &crate::ModelConfig) -> Placement {
        Placement {
            shard: Shard::whole(c),
            comms: None,
        }
    }

    fn comms(&self) -> Result<&Comms> {
        self.comms.as_ref().ok_or_else(|| {
            crate::ModelError::Invalid("a sharded model without communicators".into())
        })
    }

    /// Completes the partial sums of `buf` across the tensor-parallel group.
    pub(crate) fn all_reduce<B: Backend>(&self, b: &mut B, buf: Buf) -> Result<()> {
        if self.shard.tp_size == 1 {
            return Ok(());
        }
        let tp = &self.comms()?.tp;
        b.host_rows(buf, &mut |rows| Ok(tp.all_reduce_sum(rows)?))
    }

    /// The end of a forward on this rank: the residual stream on to the next stage, or on
    /// the last stage the logits of `batch.logits_indices` (`[rows, vocab]`, softcapped when
    /// `softcap` says) from `head` (the final norm and this rank's vocabulary rows), gathered
    /// to the stage's first rank. Ranks that hold no logits return none.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn finish<'a, B: Backend>(
        &self,
        b: &'a mut B,
        head: Option<&(B::Vector, B::Weight)>,
        gather: &'a mut LogitsGather,
        eps: f32,
        batch: &ferrum_types::ForwardBatch,
        vocab: usize,
        softcap: Option<f32>,
    ) -> Result<&'a [f32]> {
        if !self.shard.is_last_stage() {
            self.send_residual(b)?;
            return Ok(&[]);
        }
        let Some((norm, w)) = head else {
            return Ok(&[]);
        };
        let rows = &batch.logits_indices;
        // [num_logits, this rank's vocabulary], gathered to [num_logits, vocab].
        let local = b.logits(norm, eps, w, rows, softcap)?;
        gather.gather(self, local, rows.len(), vocab)
    }

    /// An error naming `what` unless this is the whole model in one process.
    pub(crate) fn check_whole(&self, what: &str) -> Result<()> {
        match self.comms {
            None => Ok(()),
            Some(_) => Err(crate::ModelError::Invalid(format!(
                "{what} runs a whole model in one process"
            ))),
        }
    }

    /// The end of a whole model's forward as greedy choices: each row of
    /// `batch.logits_indices`' argmax into `out`, decided by the backend ([`Backend::argmax_rows`]).
    pub(crate) fn finish_argmax<B: Backend>(
        &self,
        b: &mut B,
        head: Option<&(B::Vector, B::Weight)>,
        eps: f32,
        batch: &ferrum_types::ForwardBatch,
        softcap: Option<f32>,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        self.check_whole("an argmax of the logits")?;
        let (norm, w) =
            head.ok_or_else(|| crate::ModelError::Invalid("this model has no LM head".into()))?;
        b.argmax_rows(norm, eps, w, &batch.logits_indices, softcap, out)
    }

    /// The end of a whole model's forward as sampled rows: each row of
    /// `batch.logits_indices` sampled under its spec ([`Backend::sample_rows`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn finish_sample<B: Backend>(
        &self,
        b: &mut B,
        head: Option<&(B::Vector, B::Weight)>,
        eps: f32,
        batch: &ferrum_types::ForwardBatch,
        softcap: Option<f32>,
        specs: &[crate::sampling::RowSampling<'_>],
        out: &mut crate::sampling::SampledRows,
    ) -> Result<()> {
        self.check_whole("sampling on the model's device")?;
        let rows = &batch.logits_indices;
        if specs.len() != rows.len() {
            return Err(crate::ModelError::Invalid(format!(
                "{} sampling specs for {} logits rows",
                specs.len(),
                rows.len()
            )));
        }
        let (norm, w) =
            head.ok_or_else(|| crate::ModelError::Invalid("this model has no LM head".into()))?;
        b.sample_rows(norm, eps, w, rows, softcap, specs, out)
    }

    /// `X` from the previous stage (the same tensor-parallel rank there).
    pub(crate) fn recv_residual<B: Backend>(&self, b: &mut B) -> Result<()> {
        let s = &self.shard;
        let src = s.world_rank(s.pp_rank - 1, s.tp_rank);
        let world = &self.comms()?.world;
        b.host_rows(Buf::X, &mut |rows| Ok(world.recv(rows, src)?))
    }

    /// `X` to the next stage.
    pub(crate) fn send_residual<B: Backend>(&self, b: &mut B) -> Result<()> {
        let s = &self.shard;
        let dest = s.world_rank(s.pp_rank + 1, s.tp_rank);
        let world = &self.comms()?.world;
        b.host_rows(Buf::X, &mut |rows| Ok(world.send(rows, dest)?))
    }
}

/// Gathers the last stage's vocabulary slices of the logits into whole rows; its buffers are
/// kept, so a warm step allocates nothing.
#[derive(Debug, Default)]
pub(crate) struct LogitsGather {
    /// This rank's slice, padded to `ceil(vocab / T)` columns.
    padded: Vec<f32>,
    /// Every rank's padded slice, in rank order.
    all: Vec<f32>,
    /// `[rows, vocab]`, on the group's first rank.
    out: Vec<f32>,
}

impl LogitsGather {
    /// The whole logits `[rows, vocab]` from each tensor-parallel rank's slice of the
    /// vocabulary (`local`, `[rows, its slice]`), on the group's first rank; other ranks get
    /// none. One rank: `local` itself.
    pub(crate) fn gather<'a>(
        &'a mut self,
        place: &Placement,
        local: &'a [f32],
        rows: usize,
        vocab: usize,
    ) -> Result<&'a [f32]> {
        let s = &place.shard;
        if s.tp_size == 1 {
            return Ok(local);
        }
        let chunk = vocab.div_ceil(s.tp_size);
        let mine = s.vocab(vocab).len();
        self.padded.clear();
        self.padded.resize(rows * chunk, 0.0);
        if mine > 0 {
            for (dst, src) in self
                .padded
                .chunks_exact_mut(chunk)
                .zip(local.chunks_exact(mine))
            {
                dst[..mine].copy_from_slice(src);
            }
        }
        self.all.resize(s.tp_size * rows * chunk, 0.0);
        place.comms()?.tp.all_gather(&self.padded, &mut self.all)?;
        if s.tp_rank != 0 {
            return Ok(&[]);
        }
        self.out.resize(rows * vocab, 0.0);
        for r in 0..s.tp_size {
            let cols = Shard {
                tp_rank: r,
                ..s.clone()
            }
            .vocab(vocab);
            let part = &self.all[r * rows * chunk..(r + 1) * rows * chunk];
            for (i, src) in part.chunks_exact(chunk).enumerate() {
                self.out[i * vocab + cols.start..i * vocab + cols.end]
                    .copy_from_slice(&src[..cols.len()]);
            }
        }
        Ok(&self.out)
    }
}
