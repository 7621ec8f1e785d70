//! Overlapped steps on the device ([`CudaBackend::set_deferred`]): a step's sampled tokens
//! come back by an asynchronous copy collected later ([`CudaBackend::collect`]), and the next
//! step, enqueued before the host has seen them, takes them as inputs where they lie on the
//! device ([`CudaBackend::set_pending_inputs`]).
//!
//! Invariants:
//! - every step that samples on the device (argmax or [`super::sample`]) leaves its tokens,
//!   one u32 per logits row, at [`Overlap::last_ids`] until the next step's
//!   [`Backend::begin`](crate::backend::Backend::begin) has taken the pending inputs from
//!   them; a step that hands logits to the host leaves none, and a pending input then is an
//!   error, never a stale token;
//! - deferred results are collected in the order their steps were issued, each exactly once;
//! - the copies run on a stream of their own (a [`Copier`]), each after an event recorded on the
//!   main stream behind its step's kernels, into a page-locked host buffer whose event the
//!   collection waits for: the host waits for the copy only, never for later steps' work;
//! - before the main stream writes the tokens' buffers again (the next argmax, sampling or
//!   upload of host-decided tokens), it waits for the latest copy ([`CudaBackend::guard_tokens`]),
//!   so a later step never changes what an earlier step's copy reads.

use std::collections::VecDeque;

use ferrum_runtime::cuda::{DevicePtr, Stream};

use super::{args, cdiv, i32_arg, p, CudaBackend, Grown};
use crate::kv_copy::Copier;
use crate::sampling::{SampledRow, SampledRows};
use crate::BlockCopy;

use crate::{ModelError, Result};

/// What a collected step returned ([`CudaBackend::collect`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collected {
    /// Each row's greedy token, in the ids given to `collect`.
    Tokens,
    /// Each row sampled under its spec, in the rows given to `collect`.
    Sampled,
}

/// A deferred step's results: on their way to the host, or decided there already.
#[derive(Debug)]
enum InFlight {
    Ids {
        read: BlockCopy,
    },
    Sampled {
        read: BlockCopy,
        /// The top logprobs each row asked for, and the most any did (the results' stride).
        logprobs: Vec<Option<usize>>,
        max_n: usize,
        vocab: usize,
    },
    ReadyIds(Vec<u32>),
    ReadySampled(Vec<SampledRow>),
}

/// The overlap state of one backend.
#[derive(Debug, Default)]
pub(super) struct Overlap {
    /// Whether this step's results are left in flight.
    pub(super) defer: bool,
    /// This step's pending inputs: `(token index, previous step's row)` pairs, flattened.
    pub(super) pending: Vec<u32>,
    /// Where the last step's sampled tokens lie on the device, and how many rows.
    pub(super) last_ids: Option<(DevicePtr, usize)>,
    /// Greedy tokens of the last step (argmax writes here, not into the index buffer, which
    /// the next step's upload overwrites before its pending inputs are taken).
    pub(super) ids_out: Grown,
    in_flight: VecDeque<InFlight>,
    /// The copies' stream and buffers ([`Copier`]), made at the first deferred copy.
    copier: Option<Copier>,
    /// Host staging of a collected read: its bytes, and its words.
    bytes: Vec<u8>,
    words: Vec<u32>,
}

impl InFlight {
    fn landing(&self) -> Option<&BlockCopy> {
        match self {
            InFlight::Ids { read } | InFlight::Sampled { read, .. } => Some(read),
            InFlight::ReadyIds(_) | InFlight::ReadySampled(_) => None,
        }
    }
}

impl Overlap {
    /// Drops the results still in flight and the copy stream with its buffers. The caller
    /// holds no lock on the device (the copier takes it).
    pub(super) fn release(&mut self) {
        for step in self.in_flight.drain(..) {
            if let (InFlight::Ids { read } | InFlight::Sampled { read, .. }, Some(c)) =
                (step, self.copier.as_mut())
            {
                // Back to the copier's buffers, freed with it.
                let _ = c.finish_into(read, &mut self.bytes);
            }
        }
        self.copier = None;
    }
}

impl CudaBackend {
    /// Leaves the results of the steps that follow in flight (`on`) for
    /// [`CudaBackend::collect`], or reads them back before the step returns (the default).
    pub fn set_deferred(&mut self, on: bool) {
        self.overlap.defer = on;
    }

    /// The next step's decode inputs whose tokens the previous step sampled on the device:
    /// `(token index in the batch, the previous step's logits row)`; taken once, by the next
    /// [`Backend::begin`](crate::backend::Backend::begin).
    pub fn set_pending_inputs(&mut self, pending: &[(u32, u32)]) {
        self.overlap.pending.clear();
        self.overlap
            .pending
            .extend(pending.iter().flat_map(|&(t, r)| [t, r]));
    }

    /// Steps issued with deferred results and not yet collected.
    pub fn in_flight(&self) -> usize {
        self.overlap.in_flight.len()
    }

    /// Waits for the oldest deferred step's results and puts them into `ids` (greedy steps)
    /// or `sampled` (sampled steps), saying which.
    pub fn collect(&mut self, ids: &mut Vec<u32>, sampled: &mut SampledRows) -> Result<Collected> {
        let o = &mut self.overlap;
        let step = o
            .in_flight
            .pop_front()
            .ok_or_else(|| ModelError::Invalid("no step's results are in flight".into()))?;
        let read = |read: BlockCopy, bytes: &mut Vec<u8>, copier: &mut Option<Copier>| {
            let c = copier.as_mut().ok_or_else(|| {
                ModelError::Invalid("a step's copy in flight without its copier".into())
            })?;
            c.finish_into(read, bytes)
        };
        let words = |bytes: &[u8], out: &mut Vec<u32>| {
            out.clear();
            out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            );
        };
        match step {
            InFlight::Ids { read: r } => {
                read(r, &mut o.bytes, &mut o.copier)?;
                words(&o.bytes, ids);
                Ok(Collected::Tokens)
            }
            InFlight::ReadyIds(v) => {
                *ids = v;
                Ok(Collected::Tokens)
            }
            InFlight::ReadySampled(rows) => {
                sampled.rows = rows;
                Ok(Collected::Sampled)
            }
            InFlight::Sampled {
                read: r,
                logprobs,
                max_n,
                vocab,
            } => {
                read(r, &mut o.bytes, &mut o.copier)?;
                words(&o.bytes, &mut o.words);
                super::sample::decode_rows(&o.words, &logprobs, max_n, vocab, &mut sampled.rows);
                Ok(Collected::Sampled)
            }
        }
    }

    /// Takes this step's pending inputs from the last step's tokens on the device (after the
    /// step's indices were uploaded), then forgets those tokens: the step samples anew.
    pub(super) fn resolve_pending(&mut self) -> Result<()> {
        let last = self.overlap.last_ids.take();
        let pending = std::mem::take(&mut self.overlap.pending);
        let (at, n) = self.at.pending;
        if n == 0 {
            return Ok(());
        }
        let (prev, rows) = last.ok_or_else(|| {
            ModelError::Invalid(
                "a decode input refers to the previous step's token, but that step left no \
                 tokens on the device"
                    .into(),
            )
        })?;
        let real = self.num_real_tokens;
        for pair in pending.chunks_exact(2) {
            if pair[0] as usize >= real || pair[1] as usize >= rows {
                return Err(ModelError::Invalid(format!(
                    "a pending decode input ({}, row {}) is outside the batch's {real} tokens \
                     or the previous step's {rows} rows",
                    pair[0], pair[1]
                )));
            }
        }
        let block = self.block("resolve_ids", "BLOCK")?;
        let args = args![
            ids_ptr: p(self.index(self.at.ids)?),
            pending_ptr: p(self.index(at)?),
            prev_ptr: p(prev),
            n: i32_arg(n, "pending inputs")?,
        ];
        self.launch("resolve_ids", [cdiv(n, block), 1, 1], &args)
    }

    /// Records where this step's greedy tokens lie on the device (`rows` of them at `ids`),
    /// and defers or reads them into `out`.
    pub(super) fn finish_ids(
        &mut self,
        ids: DevicePtr,
        rows: usize,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        self.overlap.last_ids = Some((ids, rows));
        if self.overlap.defer {
            let read = self.start_read(ids, 4 * rows)?;
            self.overlap.in_flight.push_back(InFlight::Ids { read });
            out.clear();
            return Ok(());
        }
        let what = "reading the greedy tokens back";
        super::read_words(
            &self.gpu,
            ids,
            rows,
            &mut self.host_bytes,
            out,
            u32::from_le_bytes,
            what,
        )
    }

    /// Tokens decided on the host (a soft-capped model's): copied to the device for the next
    /// step's pending inputs, and deferred as they are when the step's results are.
    pub(super) fn host_ids(&mut self, ids: &[u32]) -> Result<()> {
        self.upload_last(ids.iter().copied())?;
        if self.overlap.defer {
            self.overlap
                .in_flight
                .push_back(InFlight::ReadyIds(ids.to_vec()));
        }
        Ok(())
    }

    /// Rows sampled on the host (a soft-capped model's); see [`Self::host_ids`].
    pub(super) fn host_sampled(&mut self, rows: &[SampledRow]) -> Result<()> {
        self.upload_last(rows.iter().map(|r| r.token))?;
        if self.overlap.defer {
            self.overlap
                .in_flight
                .push_back(InFlight::ReadySampled(rows.to_vec()));
        }
        Ok(())
    }

    /// Defers the sampled rows' results (`words` u32 at `results`: tokens, logprobs, top ids,
    /// top values), whose tokens are the next step's pending inputs. `false`: not deferred.
    pub(super) fn defer_sampled(
        &mut self,
        results: DevicePtr,
        words: usize,
        logprobs: &[Option<usize>],
        max_n: usize,
        vocab: usize,
    ) -> Result<bool> {
        let rows = logprobs.len();
        self.overlap.last_ids = Some((results, rows));
        if !self.overlap.defer {
            return Ok(false);
        }
        let read = self.start_read(results, 4 * words)?;
        self.overlap.in_flight.push_back(InFlight::Sampled {
            read,
            logprobs: logprobs.to_vec(),
            max_n,
            vocab,
        });
        Ok(true)
    }

    /// Copies `bytes` at `src` to the host on the copy stream, behind everything issued on
    /// the main stream so far; the host goes on.
    fn start_read(&mut self, src: DevicePtr, bytes: usize) -> Result<BlockCopy> {
        let copier = match self.overlap.copier.take() {
            Some(c) => c,
            None => Copier::new(&self.gpu, false)?,
        };
        // The main stream waits for it only before the tokens' buffers are written again
        // (`guard_tokens`), not at once.
        self.overlap
            .copier
            .insert(copier)
            .start(&[(src, bytes)], bytes, false)
    }

    /// Makes the main stream wait for the latest copy of a step's results before it writes
    /// the tokens' buffers again.
    pub(super) fn guard_tokens(&mut self) -> Result<()> {
        if let Some(done) = self
            .overlap
            .in_flight
            .iter()
            .rev()
            .find_map(InFlight::landing)
            .and_then(BlockCopy::done)
        {
            self.gpu
                .lock()
                .wait(Stream::MAIN, done)
                .map_err(|e| ModelError::gpu("ordering a step's copy", e))?;
        }
        Ok(())
    }

    fn upload_last(&mut self, ids: impl Iterator<Item = u32>) -> Result<()> {
        let bytes: Vec<u8> = ids.flat_map(u32::to_le_bytes).collect();
        let rows = bytes.len() / 4;
        let ptr = self.overlap.ids_out.ensure(&self.gpu, bytes.len())?;
        self.guard_tokens()?;
        if !bytes.is_empty() {
            let write = |e| ModelError::gpu("copying the tokens to the GPU", e);
            self.gpu.lock().write(ptr, &bytes).map_err(write)?;
        }
        self.overlap.last_ids = Some((ptr, rows));
        Ok(())
    }
}
