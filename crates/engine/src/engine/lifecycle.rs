//! How requests leave the engine other than by finishing: aborted by their client, failed
//! alone (an output error), or all failed with the engine (a step error); and the counter and
//! histogram every leaving request goes through.

use super::EngineCore;
use crate::request::Event;
use ferrum_types::RequestId;
use std::sync::atomic::Ordering;
use std::time::Instant;

impl EngineCore {
    /// Ends the engine after a failed step: every request gets the error.
    pub(super) fn fail_all(&mut self, msg: &str) {
        // Unhealthy before any client hears of the failure: one that reads its error and
        // then asks `/health` must not be told all is well.
        if let Ok(mut m) = self.metrics.lock() {
            m.healthy = false;
        }
        for (_, r) in self.st.reqs.drain() {
            let _ = r.tx.send(Event::Error(msg.to_owned()));
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        self.fail_parked(msg);
    }

    pub(super) fn abort(&mut self, id: RequestId) {
        if self.abort_parked(id) {
            return;
        }
        let Some(r) = self.st.reqs.remove(&id) else {
            return;
        };
        let tok = self.st.tokenizer.clone();
        for seq in &r.seqs {
            self.st.sched.remove(*seq);
            if let Some(mut s) = self.st.seqs.remove(seq) {
                if let Ok(o) = s.output.abort(tok.as_deref()) {
                    let _ = r.tx.send(Event::Finished {
                        index: s.index,
                        reason: o.finish.unwrap_or(ferrum_types::FinishReason::Abort),
                        text: o.text,
                    });
                }
            }
        }
        self.count_finished(r.arrived, Instant::now());
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        let _ = r.tx.send(Event::Done { usage: r.usage });
    }

    /// A request left the engine (done, aborted or failed): the counter and the end-to-end
    /// histogram see every one, as their help says.
    pub(super) fn count_finished(&self, arrived: Instant, now: Instant) {
        if let Ok(mut m) = self.metrics.lock() {
            m.e2e_latency.observe((now - arrived).as_secs_f64());
            m.requests_finished += 1;
        }
    }

    /// Ends a request with an error: its sequences and blocks are released.
    pub(super) fn fail(&mut self, id: RequestId, msg: &str) {
        let Some(r) = self.st.reqs.remove(&id) else {
            return;
        };
        for seq in &r.seqs {
            self.st.sched.remove(*seq);
            self.st.seqs.remove(seq);
        }
        self.count_finished(r.arrived, Instant::now());
        let _ = r.tx.send(Event::Error(msg.to_owned()));
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}
