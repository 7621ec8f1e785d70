//! Overlapped steps on a GPU: step N+1 is scheduled, built and enqueued while step N runs on
//! the device, and step N's tokens are processed on the host while step N+1 runs.
//!
//! How it holds together:
//! - a step left in flight ([`InFlight`]) has appended a [`PLACEHOLDER`] token to each of its
//!   sampled sequences in the scheduler, so the next step schedules them as decodes; the
//!   placeholder is the sequence's last final token until the step's own token replaces it
//!   (`Scheduler::set_last_token`), which happens before the next step's results are recorded,
//!   so only real tokens are ever hashed into the prefix cache;
//! - the next step's batch holds the placeholder at those inputs; the model takes the real
//!   tokens there on the device, from where the step in flight left them
//!   ([`pending_inputs`] names them by the previous step's logits row);
//! - stop conditions are seen one step late: a sequence that ended in step N by a stop (an
//!   EOS, a stop id or string) has a row in step N+1, whose token is dropped (its sequence is
//!   gone) and whose K/V lands in blocks that are not reused before step N+1 has finished on
//!   the device (one stream, in order). A sequence whose token in step N is its last by length
//!   is held out of later steps (`Scheduler::hold`) until it is removed, so it costs no row and
//!   never makes the scheduler preempt a live sequence for one;
//! - overlap needs every request's next row to be independent of its last token on the host:
//!   no speculation, no constraint masks, no penalties. When a request that needs those
//!   arrives, the step in flight is finished before the next is scheduled.

use crate::{EngineError, Result};
use ferrum_models::ForwardBatch;
use ferrum_scheduler::SchedulerOutput;
use ferrum_types::{RequestId, TokenId};
use std::collections::HashMap;

/// The token that stands for one a step in flight has not returned yet. Any valid id would
/// do: the device replaces it before it is read, and padding that repeats it reads a real row.
pub(crate) const PLACEHOLDER: TokenId = 0;

/// A sampled sequence's logits row in a step in flight, and the index of its placeholder
/// among its tokens.
pub(crate) type RowOf = (u32, usize);

/// A step whose results are still on their way from the device.
#[derive(Debug)]
pub(crate) struct InFlight {
    pub(crate) out: SchedulerOutput,
    /// Per sampled sequence: its logits row in the step, and the index of the placeholder
    /// among its tokens.
    pub(crate) rows: HashMap<RequestId, RowOf>,
}

/// The inputs of the step `out` (its batch `batch`) that are placeholders of the step in
/// flight (`pending`'s rows), into `inputs`: `(token index in the batch, the pending step's
/// logits row)`.
pub(crate) fn pending_inputs(
    out: &SchedulerOutput,
    batch: &ForwardBatch,
    pending: Option<&HashMap<RequestId, RowOf>>,
    inputs: &mut Vec<(u32, u32)>,
) -> Result<()> {
    inputs.clear();
    let Some(pending) = pending else {
        return Ok(());
    };
    for (s, slice) in out.seqs.iter().zip(&batch.seqs) {
        let Some(&(row, at)) = pending.get(&s.id) else {
            continue;
        };
        let end = s.start + s.num_tokens - s.num_proposed;
        if at + 1 == end {
            inputs.push(((slice.query_start + end - 1 - s.start) as u32, row));
        } else if (s.start..end).contains(&at) {
            // A placeholder is its sequence's last final token, so only a run's last.
            return Err(EngineError::Internal(format!(
                "sequence {}: its token in flight (position {at}) is inside a run ending at {end}",
                s.id
            )));
        }
    }
    Ok(())
}
