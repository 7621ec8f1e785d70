//! The scheduling policy as a seam: which waiting sequence is admitted next and which running
//! one is preempted when blocks run out, behind [`RequestQueue`] (vLLM's `RequestQueue` is the
//! model). [`SchedulingPolicy`] picks one:
//! - `fifo`: arrival order; the victim is the sequence admitted last;
//! - `priority` (the default): lower `priority` values first, then arrival; the victim has
//!   the lowest priority (largest value), admitted last;
//! - `fair`: a weighted fair queue between tenants: the next admission goes to the tenant with
//!   the fewest tokens computed per unit of weight (within a tenant, priority then arrival), so
//!   under contention each tenant's computed tokens follow the weights, and an idle tenant's
//!   share goes to whoever asks. A tenant that starts asking joins at the least-served active
//!   tenant's level (it cannot bank credit while idle). The victim is the running sequence of
//!   the tenant most over its share (by weight), admitted last;
//! - `slo`: priority first, then the least slack: the latest time a request may start and
//!   still get its first token by its deadline (its deadline less its own predicted prefill,
//!   [`Waiting::latest_start`]; requests without a target after those with one), then
//!   arrival. With equal requests this is earliest-deadline-first, which meets every deadline
//!   whenever some order does. The victim has the lowest priority, then the most slack: a
//!   sequence still owing its first token under a deadline goes last, and of the others the
//!   one admitted last.
//!
//! Invariants: a queue holds each waiting sequence once; `first` is a sequence it holds; the
//! policies never look at the clock (the scheduler stays pure).

use ferrum_types::RequestId;
use std::collections::{BTreeSet, HashMap};

/// A waiting sequence as the queue sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting {
    pub id: RequestId,
    pub priority: i32,
    /// Arrival order: unique and increasing.
    pub arrival: u64,
    pub tenant: u32,
    /// The latest start that still meets the first-token deadline, in the caller's clock
    /// (microseconds); [`NO_DEADLINE`] without one.
    pub latest_start: u64,
}

/// [`Waiting::latest_start`] and [`Running::deadline`] of a request without a target.
pub const NO_DEADLINE: u64 = u64::MAX;

/// A running sequence as the victim rule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Running {
    pub id: RequestId,
    pub priority: i32,
    /// Admission order: unique and increasing.
    pub admitted: u64,
    pub tenant: u32,
    /// The first-token deadline it still owes ([`NO_DEADLINE`] when it has none, or its first
    /// token is out).
    pub deadline: u64,
}

/// The waiting order and the victim rule; see the module docs.
pub trait RequestQueue: std::fmt::Debug + Send {
    fn push(&mut self, w: Waiting);
    /// Takes `w` out; `false` when it was not there.
    fn remove(&mut self, w: &Waiting) -> bool;
    /// The sequence to admit next.
    fn first(&self) -> Option<Waiting>;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// `tokens` were computed for a sequence of `tenant` (a step's runs).
    fn charge(&mut self, _tenant: u32, _tokens: usize) {}
    /// The running sequence to preempt (`None` when none may be).
    fn victim(&self, running: &[Running]) -> Option<RequestId> {
        running
            .iter()
            .max_by_key(|r| (r.priority, r.admitted))
            .map(|r| r.id)
    }
    fn clone_box(&self) -> Box<dyn RequestQueue>;
}

impl Clone for Box<dyn RequestQueue> {
    fn clone(&self) -> Self {
        self.clone_box()
    }
}

/// Which [`RequestQueue`] the scheduler runs (`--scheduling`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SchedulingPolicy {
    Fifo,
    #[default]
    Priority,
    /// Tenants' weights (tenant id, weight >= 1); unlisted tenants weigh 1.
    Fair(Vec<(u32, u32)>),
    /// Priority, then least slack to the first-token deadline.
    Slo,
}

impl SchedulingPolicy {
    /// Whether waiting requests go strictly by priority first (`priority`, `slo`): a request
    /// then waits only behind work of its own priority or better.
    pub fn priority_first(&self) -> bool {
        matches!(self, SchedulingPolicy::Priority | SchedulingPolicy::Slo)
    }

    pub fn queue(&self) -> Box<dyn RequestQueue> {
        match self {
            SchedulingPolicy::Fifo => Box::new(FifoQueue::default()),
            SchedulingPolicy::Priority => Box::new(PriorityQueue::default()),
            SchedulingPolicy::Fair(w) => Box::new(FairQueue::new(w)),
            SchedulingPolicy::Slo => Box::new(SloQueue::default()),
        }
    }
}

/// Arrival order.
#[derive(Debug, Clone, Default)]
pub struct FifoQueue {
    set: BTreeSet<(u64, RequestId, i32, u32)>,
}

impl RequestQueue for FifoQueue {
    fn push(&mut self, w: Waiting) {
        self.set.insert((w.arrival, w.id, w.priority, w.tenant));
    }
    fn remove(&mut self, w: &Waiting) -> bool {
        self.set.remove(&(w.arrival, w.id, w.priority, w.tenant))
    }
    fn first(&self) -> Option<Waiting> {
        self.set
            .first()
            .map(|&(arrival, id, priority, tenant)| Waiting {
                id,
                priority,
                arrival,
                tenant,
                latest_start: NO_DEADLINE,
            })
    }
    fn len(&self) -> usize {
        self.set.len()
    }
    fn victim(&self, running: &[Running]) -> Option<RequestId> {
        running.iter().max_by_key(|r| r.admitted).map(|r| r.id)
    }
    fn clone_box(&self) -> Box<dyn RequestQueue> {
        Box::new(self.clone())
    }
}

/// (priority, arrival) order.
#[derive(Debug, Clone, Default)]
pub struct PriorityQueue {
    set: BTreeSet<(i32, u64, RequestId, u32)>,
}

impl RequestQueue for PriorityQueue {
    fn push(&mut self, w: Waiting) {
        self.set.insert((w.priority, w.arrival, w.id, w.tenant));
    }
    fn remove(&mut self, w: &Waiting) -> bool {
        self.set.remove(&(w.priority, w.arrival, w.id, w.tenant))
    }
    fn first(&self) -> Option<Waiting> {
        self.set
            .first()
            .map(|&(priority, arrival, id, tenant)| Waiting {
                id,
                priority,
                arrival,
                tenant,
                latest_start: NO_DEADLINE,
            })
    }
    fn len(&self) -> usize {
        self.set.len()
    }
    fn clone_box(&self) -> Box<dyn RequestQueue> {
        Box::new(self.clone())
    }
}

/// (priority, latest start, arrival) order; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct SloQueue {
    set: BTreeSet<(i32, u64, u64, RequestId, u32)>,
}

impl RequestQueue for SloQueue {
    fn push(&mut self, w: Waiting) {
        self.set
            .insert((w.priority, w.latest_start, w.arrival, w.id, w.tenant));
    }
    fn remove(&mut self, w: &Waiting) -> bool {
        self.set
            .remove(&(w.priority, w.latest_start, w.arrival, w.id, w.tenant))
    }
    fn first(&self) -> Option<Waiting> {
        self.set
            .first()
            .map(|&(priority, latest_start, arrival, id, tenant)| Waiting {
                id,
                priority,
                arrival,
                tenant,
                latest_start,
            })
    }
    fn len(&self) -> usize {
        self.set.len()
    }
    fn victim(&self, running: &[Running]) -> Option<RequestId> {
        running
            .iter()
            .max_by_key(|r| (r.priority, r.deadline, r.admitted))
            .map(|r| r.id)
    }
    fn clone_box(&self) -> Box<dyn RequestQueue> {
        Box::new(self.clone())
    }
}

/// A weighted fair queue between tenants; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct FairQueue {
    weights: HashMap<u32, u32>,
    /// Tokens computed per unit of weight, by tenant.
    served: HashMap<u32, f64>,
    /// Each tenant's waiting sequences in (priority, arrival) order.
    tenants: HashMap<u32, PriorityQueue>,
    len: usize,
}

impl FairQueue {
    pub fn new(weights: &[(u32, u32)]) -> FairQueue {
        FairQueue {
            weights: weights.iter().map(|&(t, w)| (t, w.max(1))).collect(),
            ..FairQueue::default()
        }
    }

    fn weight(&self, tenant: u32) -> f64 {
        f64::from(self.weights.get(&tenant).copied().unwrap_or(1))
    }

    fn served(&self, tenant: u32) -> f64 {
        self.served.get(&tenant).copied().unwrap_or(0.0)
    }

    /// Tokens computed per unit of weight so far, by tenant (for tests and reports).
    pub fn served_per_weight(&self, tenant: u32) -> f64 {
        self.served(tenant)
    }
}

impl RequestQueue for FairQueue {
    fn push(&mut self, w: Waiting) {
        let starts = self.tenants.get(&w.tenant).is_none_or(|q| q.is_empty());
        if starts {
            // No credit banked while idle: join at the least-served waiting tenant's level.
            let floor = self
                .tenants
                .iter()
                .filter(|(t, q)| **t != w.tenant && !q.is_empty())
                .map(|(t, _)| self.served(*t))
                .fold(f64::INFINITY, f64::min);
            if floor.is_finite() && self.served(w.tenant) < floor {
                self.served.insert(w.tenant, floor);
            }
        }
        self.tenants.entry(w.tenant).or_default().push(w);
        self.len += 1;
    }

    fn remove(&mut self, w: &Waiting) -> bool {
        let removed = self.tenants.get_mut(&w.tenant).is_some_and(|q| q.remove(w));
        if removed {
            self.len -= 1;
        }
        removed
    }

    fn first(&self) -> Option<Waiting> {
        self.tenants
            .iter()
            .filter_map(|(&t, q)| q.first().map(|w| (self.served(t), w)))
            .min_by(|(sa, wa), (sb, wb)| sa.total_cmp(sb).then(wa.arrival.cmp(&wb.arrival)))
            .map(|(_, w)| w)
    }

    fn len(&self) -> usize {
        self.len
    }

    fn charge(&mut self, tenant: u32, tokens: usize) {
        let per_weight = tokens as f64 / self.weight(tenant);
        *self.served.entry(tenant).or_insert(0.0) += per_weight;
    }

    fn victim(&self, running: &[Running]) -> Option<RequestId> {
        running
            .iter()
            .max_by(|a, b| {
                self.served(a.tenant)
                    .total_cmp(&self.served(b.tenant))
                    .then(a.priority.cmp(&b.priority))
                    .then(a.admitted.cmp(&b.admitted))
            })
            .map(|r| r.id)
    }

    fn clone_box(&self) -> Box<dyn RequestQueue> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(id: RequestId, priority: i32, tenant: u32) -> Waiting {
        Waiting {
            id,
            priority,
            arrival: id,
            tenant,
            latest_start: NO_DEADLINE,
        }
    }

    fn order(q: &mut dyn RequestQueue) -> Vec<RequestId> {
        let mut out = Vec::new();
        while let Some(x) = q.first() {
            assert!(q.remove(&x));
            out.push(x.id);
        }
        out
    }

    #[test]
    fn each_policy_orders_and_picks_victims_as_documented() {
        let items = [w(0, 1, 0), w(1, 0, 0), w(2, 1, 1), w(3, 0, 1)];
        let mut fifo = SchedulingPolicy::Fifo.queue();
        let mut prio = SchedulingPolicy::Priority.queue();
        for x in items {
            fifo.push(x);
            prio.push(x);
        }
        assert_eq!(order(fifo.as_mut()), vec![0, 1, 2, 3]);
        assert_eq!(order(prio.as_mut()), vec![1, 3, 0, 2]);
        let running = [
            Running {
                id: 7,
                priority: 5,
                admitted: 0,
                tenant: 0,
                deadline: NO_DEADLINE,
            },
            Running {
                id: 8,
                priority: 0,
                admitted: 1,
                tenant: 1,
                deadline: NO_DEADLINE,
            },
        ];
        assert_eq!(fifo.victim(&running), Some(8));
        assert_eq!(prio.victim(&running), Some(7));
        // Fair, 3:1: tenant 0 is admitted three times for each of tenant 1's (equal runs).
        let mut fair = FairQueue::new(&[(0, 3), (1, 1)]);
        for i in 0..8 {
            fair.push(w(i, 0, 0));
            fair.push(w(100 + i, 0, 1));
        }
        let mut admitted = Vec::new();
        for _ in 0..8 {
            let x = fair.first().unwrap();
            fair.remove(&x);
            fair.charge(x.tenant, 30);
            admitted.push(x.tenant);
        }
        assert_eq!(
            admitted.iter().filter(|&&t| t == 0).count(),
            6,
            "{admitted:?}"
        );
        // The tenant most over its share gives up a running sequence.
        let running = [
            Running {
                id: 1,
                priority: 0,
                admitted: 0,
                tenant: 0,
                deadline: NO_DEADLINE,
            },
            Running {
                id: 2,
                priority: 0,
                admitted: 1,
                tenant: 1,
                deadline: NO_DEADLINE,
            },
        ];
        fair.charge(1, 1000);
        assert_eq!(fair.victim(&running), Some(2));
        // A tenant that starts asking late joins at the others' level, not at zero.
        let mut fair = FairQueue::new(&[]);
        fair.push(w(0, 0, 0));
        fair.charge(0, 500);
        fair.push(w(1, 0, 1));
        assert_eq!(fair.served_per_weight(1), 500.0);
    }
}
