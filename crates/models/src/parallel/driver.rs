//! The step protocol of a parallel run.
//!
//! Rank 0 owns the engine. Every command it sends is one broadcast over the world, a `u32`
//! message whose first word is the command: a new KV cache (`[NEW_KV, num_blocks,
//! block_size]`), a step (`[FORWARD, batch...]`, the batch as [`ForwardBatch::encode`] lays it
//! out) or the end (`[STOP]`). The other ranks loop on the broadcast ([`run_worker`]) and run
//! the same commands on their shards.
//!
//! A step with several stages splits the batch into micro-batches of about equal token counts
//! (a long prompt's chunk is cut into pieces; see `ForwardBatch::split_into`); each stage runs
//! them in order, receiving each one's residual stream from the stage before and
//! sending its own on, so stage `s` works on micro-batch `i` while stage `s + 1` works on
//! `i - 1`. The last stage's first rank keeps the logits of every micro-batch and sends them
//! to rank 0 in one message once the step is done (sending them earlier could block on rank 0,
//! which is still sending it the next micro-batches).
//!
//! Failure: rank 0 checks a batch before broadcasting it, so a bad batch is an ordinary error.
//! Once a command is out, ranks are in step; an error on any rank then prints the rank and the
//! cause and aborts the whole job, since the others would wait on it forever. A rank that dies
//! ends the job through MPI's own error handling, which names it.

use super::{Comms, Shard};
use crate::{KvCache, ModelError, Result};
use ferrum_runtime::Communicator;
use ferrum_types::ForwardBatch;

const NEW_KV: u32 = 1;
const FORWARD: u32 = 2;
const STOP: u32 = 3;

/// Bytes of a rank's load status in [`check_loaded`]: a flag and the start of the error.
const STATUS_BYTES: usize = 1024;

/// What a rank runs the commands on: its shard of the model.
pub(crate) trait Stage {
    /// A KV cache of `num_blocks` blocks of `block_size` slots for the shard's layers and heads.
    fn new_kv(&self, num_blocks: usize, block_size: usize) -> Result<KvCache>;
    /// A forward of one (micro-)batch over the shard, appending the logits it computed to
    /// `out` (none unless the rank computes logits).
    fn step(&mut self, batch: &ForwardBatch, kv: &mut KvCache, out: &mut Vec<f32>) -> Result<()>;
}

/// One rank's side of the protocol.
#[derive(Debug)]
pub(crate) struct Driver {
    comms: Comms,
    shard: Shard,
    micro_batches: usize,
    vocab: usize,
    /// Layers of the largest stage (what a KV cache is sized by).
    max_stage_layers: usize,
    msg: Vec<u32>,
    parts: Vec<ForwardBatch>,
    logits: Vec<f32>,
    /// Rank 0 has sent `STOP` (or never will: a worker).
    stopped: bool,
}

impl Driver {
    pub(crate) fn new(
        comms: Comms,
        shard: Shard,
        micro_batches: usize,
        vocab: usize,
        max_stage_layers: usize,
    ) -> Driver {
        let stopped = comms.world.rank() != 0;
        Driver {
            comms,
            shard,
            micro_batches: micro_batches.max(1),
            vocab,
            max_stage_layers,
            msg: Vec::new(),
            parts: Vec::new(),
            logits: Vec::new(),
            stopped,
        }
    }

    /// Rank 0 will not send `STOP` when dropped (the other ranks never started their loops:
    /// a failed load).
    pub(crate) fn disarm(&mut self) {
        self.stopped = true;
    }

    pub(crate) fn max_stage_layers(&self) -> usize {
        self.max_stage_layers
    }

    pub(crate) fn shard(&self) -> &Shard {
        &self.shard
    }

    fn rank(&self) -> usize {
        self.comms.world.rank()
    }

    /// Ends the job after an error on this rank while the ranks were in step.
    fn fail(&self, e: &ModelError) -> ! {
        eprintln!("ferrum: rank {}: {e}", self.rank());
        self.comms.world.abort(1)
    }

    /// Rank 0: tells every rank to make its KV cache.
    pub(crate) fn new_kv_cache(&mut self, num_blocks: usize, block_size: usize) -> Result<()> {
        let word = |v: usize| {
            u32::try_from(v).map_err(|_| ModelError::Invalid(format!("{v} KV blocks or slots")))
        };
        self.msg.clear();
        self.msg
            .extend_from_slice(&[NEW_KV, word(num_blocks)?, word(block_size)?]);
        self.comms.world.broadcast(&mut self.msg, 0)?;
        Ok(())
    }

    /// Rank 0: one step over every rank; returns the logits of `batch.logits_indices`.
    pub(crate) fn forward(
        &mut self,
        batch: &ForwardBatch,
        kv: &mut KvCache,
        stage: &mut dyn Stage,
    ) -> Result<&[f32]> {
        batch.validate(kv.block_size(), kv.num_blocks(), self.vocab)?;
        self.msg.clear();
        self.msg.push(FORWARD);
        batch.encode(&mut self.msg)?;
        self.comms.world.broadcast(&mut self.msg, 0)?;
        if let Err(e) = self.run_step(batch, kv, stage) {
            self.fail(&e)
        }
        Ok(&self.logits)
    }

    /// `stage.step`, with a panic turned into an error (so the job ends, not hangs).
    fn step_once(
        stage: &mut dyn Stage,
        batch: &ForwardBatch,
        kv: &mut KvCache,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| stage.step(batch, kv, out)))
            .unwrap_or_else(|p| {
                let what = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into());
                Err(ModelError::Invalid(format!("panic in a step: {what}")))
            })
    }

    /// This rank's part of one step.
    fn run_step(
        &mut self,
        batch: &ForwardBatch,
        kv: &mut KvCache,
        stage: &mut dyn Stage,
    ) -> Result<()> {
        self.logits.clear();
        if self.shard.pp_size == 1 {
            return Self::step_once(stage, batch, kv, &mut self.logits);
        }
        if self.micro_batches == 1 {
            Self::step_once(stage, batch, kv, &mut self.logits)?;
        } else {
            let mut parts = std::mem::take(&mut self.parts);
            batch.split_into(self.micro_batches, &mut parts);
            let ran = parts
                .iter()
                .try_for_each(|p| Self::step_once(stage, p, kv, &mut self.logits));
            self.parts = parts;
            ran?;
        }
        let last = self.shard.world_rank(self.shard.pp_size - 1, 0);
        if last == 0 {
            return Ok(());
        }
        let world = &self.comms.world;
        if world.rank() == 0 {
            self.logits
                .resize(batch.logits_indices.len() * self.vocab, 0.0);
            world.recv(&mut self.logits, last)?;
        } else if self.shard.computes_logits() {
            world.send(&self.logits, 0)?;
        }
        Ok(())
    }

    /// A worker's loop: runs rank 0's commands on `stage` until `STOP`.
    pub(crate) fn serve(&mut self, stage: &mut dyn Stage) -> Result<()> {
        let mut kv: Option<KvCache> = None;
        let mut batch = ForwardBatch::new();
        loop {
            self.msg.clear();
            self.comms.world.broadcast(&mut self.msg, 0)?;
            let done = match self.msg.first().copied() {
                Some(STOP) => return Ok(()),
                Some(NEW_KV) => match self.msg[..] {
                    [_, blocks, size] => stage.new_kv(blocks as usize, size as usize).map(|c| {
                        kv = Some(c);
                    }),
                    _ => Err(ModelError::Invalid("a malformed KV command".into())),
                },
                Some(FORWARD) => match kv.as_mut() {
                    None => Err(ModelError::Invalid("a step before the KV cache".into())),
                    Some(kv) => batch
                        .decode_into(&self.msg[1..])
                        .map_err(ModelError::from)
                        .and_then(|()| self.run_step(&batch, kv, stage)),
                },
                other => Err(ModelError::Invalid(format!("an unknown command {other:?}"))),
            };
            if let Err(e) = done {
                self.fail(&e)
            }
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if !self.stopped {
            self.stopped = true;
            self.msg.clear();
            self.msg.push(STOP);
            let _ = self.comms.world.broadcast(&mut self.msg, 0);
        }
    }
}

/// Every rank's load result, exchanged: `Ok` when all loaded, else an error naming each rank
/// that failed and why (on every rank, so all of them stop).
pub fn check_loaded(world: &dyn Communicator, node: &str, loaded: Result<()>) -> Result<()> {
    let mut status = vec![0u8; STATUS_BYTES];
    if let Err(e) = &loaded {
        let text = format!("rank {} on {node}: {e}", world.rank());
        let mut end = text.len().min(STATUS_BYTES - 1);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        status[0] = 1;
        status[1..=end].copy_from_slice(&text.as_bytes()[..end]);
    }
    let all = world.all_gather_bytes(&status)?;
    let failed: Vec<String> = all
        .chunks_exact(STATUS_BYTES)
        .filter(|s| s[0] == 1)
        .map(|s| {
            let text = &s[1..];
            let len = text.iter().position(|&b| b == 0).unwrap_or(text.len());
            String::from_utf8_lossy(&text[..len]).into_owned()
        })
        .collect();
    match (loaded, failed.is_empty()) {
        (Err(e), _) if world.size() == 1 => Err(e),
        (_, true) => Ok(()),
        (_, false) => Err(ModelError::Invalid(format!(
            "the parallel run could not load the model: {}",
            failed.join("; ")
        ))),
    }
}

/// A worker rank's life after loading: runs rank 0's commands until it stops.
pub fn run_worker(model: crate::Model) -> Result<()> {
    model.run_worker()
}
