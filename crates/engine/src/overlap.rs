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
//! - stop conditions are seen one step late: a sequence that ended in step N has a row in step
//!   N+1, whose token is dropped (its sequence is gone) and whose K/V lands in blocks that are
//!   not reused before step N+1 has finished on the device (one stream, in order). Its
//!   placeholder never passes the context limit: a sequence's output limit is at most
//!   `max_model_len - prompt`, and the placeholder stands for a token within that limit;
//! - overlap needs every request's next row to be independent of its last token on the host:
//!   no speculation, no constraint masks, no penalties. When a request that needs those
//!   arrives, the step in flight is finished before the next is scheduled.

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
/// flight (`pending`'s rows): `(token index in the batch, the pending step's logits row)`.
pub(crate) fn pending_inputs(
    out: &SchedulerOutput,
    batch: &ForwardBatch,
    pending: Option<&HashMap<RequestId, RowOf>>,
) -> Vec<(u32, u32)> {
    let Some(pending) = pending else {
        return Vec::new();
    };
    let mut inputs = Vec::with_capacity(pending.len());
    for (s, slice) in out.seqs.iter().zip(&batch.seqs) {
        let Some(&(row, at)) = pending.get(&s.id) else {
            continue;
        };
        // A placeholder is its sequence's last final token, so it can only end a run.
        if s.num_tokens > 0 && s.start + s.num_tokens - 1 - s.num_proposed == at {
            let last = slice.query_start + slice.query_len - 1 - s.num_proposed;
            inputs.push((last as u32, row));
        }
    }
    inputs
}
