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
