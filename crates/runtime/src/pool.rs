//! The persistent compute pool.
//!
//! `num_threads - 1` workers live as long as the pool; the calling thread is the last worker.
//! A call publishes one job, a borrowed closure run once for every slot index `0..num_threads`
//! (the caller takes slot 0). Workers claim the other slots as they arrive; when the caller is
//! done with its own, it claims and runs every slot still unclaimed, and then waits only for the
//! slots workers claimed. So a job never waits for a worker that is not running (a busy machine
//! deschedules threads: each of a forward pass's hundreds of jobs waited for a park and
//! wake-up, and single-stream decode beside one CPU hog ran 7-9x slower than alone). A worker
//! touches the closure only under a claimed slot, and the caller returns only after every
//! claimed slot is done: that is what makes lending a stack closure to other threads sound. A
//! panic in any slot is re-raised in the caller after the wait.
//!
//! Two ways to share work out:
//! - [`ThreadPool::parallel_for`] (and [`ThreadPool::parallel_ranges`]): every thread claims task
//!   indices from one shared counter until none are left.
//! - [`ThreadPool::parallel_segments`]: each thread owns a contiguous segment of units and takes
//!   them front to back, then steals from the back of the others' segments. A thread's work so
//!   stays one contiguous stream (what its prefetches run ahead along) while the load still
//!   balances to a unit. Every unit runs exactly once either way.
//!
//! No threads are spawned per call. Between jobs, workers and the caller first spin briefly
//! (a forward pass publishes jobs microseconds apart, far less than a park and wake-up cost),
//! then park on a condition variable, so an idle pool costs nothing.

use std::any::Any;
use std::cell::UnsafeCell;
use std::fmt;
use std::ops::Range;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type TaskFn<'a> = dyn Fn(usize) + Sync + 'a;

#[derive(Clone, Copy)]
struct Job {
    /// Erased borrow of the caller's closure, run once per thread with the thread's index;
    /// valid until the caller's wait ends.
    f: *const TaskFn<'static>,
}

/// How long a thread spins for the next job (or for the workers to finish) before parking.
const SPIN: Duration = Duration::from_micros(200);
/// After this long, a spinning thread yields its core between checks, so a thread waiting for
/// one on a busy machine (the one it waits for, often) can run.
const SPIN_ALONE: Duration = Duration::from_micros(20);

/// Spins until `done()` or [`SPIN`] has passed; returns whether `done()` became true.
fn spin_until(done: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    loop {
        for _ in 0..64 {
            if done() {
                return true;
            }
            std::hint::spin_loop();
        }
        let spent = start.elapsed();
        if spent > SPIN {
            return done();
        }
        if spent > SPIN_ALONE {
            std::thread::yield_now();
        }
    }
}

/// Bits of [`Shared::claim`] that count claimed slots (the rest is the job's epoch).
const SLOT_BITS: u32 = 24;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
const EPOCH_MASK: u64 = (1 << (64 - SLOT_BITS)) - 1;

/// What the caller and the workers share. The hot path is lock-free: the caller writes the job,
/// then publishes it by storing a new epoch into `claim` with one slot taken (its own); a
/// thread claims slot `i` by moving `claim` from `i` to `i + 1` within that epoch, and counts
/// `remaining` down when the slot is done. The mutex and condition variables are touched only
/// by threads that stopped spinning (`sleepers`, `caller_parked`) and by whoever must wake
/// them; every such check is `SeqCst` on both sides, so a thread about to park either sees the
/// change it waits for or is seen (and woken) by the thread making it.
struct Shared {
    /// The current job: written by the caller only while no slot of a job is claimed and
    /// unfinished (`remaining == 0`), read by workers only under a slot they claimed.
    job: UnsafeCell<Option<Job>>,
    /// `epoch << SLOT_BITS | next unclaimed slot` of the current job.
    claim: AtomicU64,
    /// Slots of the current job not yet done.
    remaining: AtomicUsize,
    /// Slots per job: the pool's threads.
    slots: usize,
    /// Tests: workers claim nothing while set (as if descheduled).
    #[cfg(test)]
    hold: AtomicBool,
    shutdown: AtomicBool,
    /// Workers parked (or about to park) on `work_ready`.
    sleepers: AtomicUsize,
    /// The caller parked (or about to park) on `work_done`.
    caller_parked: AtomicBool,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    lock: Mutex<()>,
    work_ready: Condvar,
    work_done: Condvar,
}

// SAFETY: `job` is written only by the submitting thread (serialized by `ThreadPool::submit`)
// while no worker reads it (between jobs, `remaining == 0`), and read by workers only under a
// slot claimed after its publication (the `claim` store and CAS, SeqCst) and before that slot's
// `remaining` decrement; the pointers in it are valid for that whole window (the caller waits
// for `remaining == 0`).
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointers are only dereferenced inside the window.
unsafe impl Send for Shared {}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A fixed set of compute threads shared by all kernels of a model.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    submit: Mutex<()>,
    /// Per thread, the units left of its segment in [`ThreadPool::parallel_segments`]
    /// (`front << 32 | back`); used only under `submit`.
    segments: Box<[AtomicU64]>,
}

impl fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThreadPool")
            .field("num_threads", &self.num_threads())
            .finish()
    }
}

impl ThreadPool {
    /// A pool of `num_threads` threads in all (the caller counts as one); at least one.
    pub fn new(num_threads: usize) -> std::io::Result<ThreadPool> {
        let shared = Arc::new(Shared {
            job: UnsafeCell::new(None),
            claim: AtomicU64::new(SLOT_MASK),
            remaining: AtomicUsize::new(0),
            slots: num_threads.clamp(1, SLOT_MASK as usize),
            #[cfg(test)]
            hold: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            caller_parked: AtomicBool::new(false),
            panic: Mutex::new(None),
            lock: Mutex::new(()),
            work_ready: Condvar::new(),
            work_done: Condvar::new(),
        });
        let mut workers = Vec::new();
        for i in 1..shared.slots {
            let shared = Arc::clone(&shared);
            let handle = std::thread::Builder::new()
                .name(format!("ferrum-compute-{i}"))
                .spawn(move || worker_loop(&shared))?;
            workers.push(handle);
        }
        Ok(ThreadPool {
            shared,
            workers,
            submit: Mutex::new(()),
            segments: (0..num_threads.clamp(1, SLOT_MASK as usize))
                .map(|_| AtomicU64::new(0))
                .collect(),
        })
    }

    /// A pool sized to the machine's available parallelism.
    pub fn with_available_parallelism() -> std::io::Result<ThreadPool> {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        ThreadPool::new(n)
    }

    /// Threads in the pool, the caller included.
    pub fn num_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(i)` for every `i` in `0..num_tasks`, spread over the pool; returns when all are
    /// done. Tasks run in no particular order and must not call back into the same pool.
    pub fn parallel_for<F: Fn(usize) + Sync>(&self, num_tasks: usize, f: F) {
        if num_tasks == 0 {
            return;
        }
        if self.workers.is_empty() || num_tasks == 1 {
            (0..num_tasks).for_each(f);
            return;
        }
        let submit = self.submit.lock().unwrap_or_else(PoisonError::into_inner);
        let next = AtomicUsize::new(0);
        self.broadcast(&submit, &|_| run_tasks(&f, &next, num_tasks));
    }

    /// Runs `f` on ranges of `0..len` that together cover it once. Thread `i` of `n` owns the
    /// `i`-th of `n` contiguous runs of items and takes them front to back, `unit` items at a
    /// time (a run's last range may be shorter); a thread out of its own items takes the others'
    /// from their backs, one item at a time, so the threads finish within about an item of each
    /// other. `f` must not call back into the same pool.
    pub fn parallel_segments<F: Fn(Range<usize>) + Sync>(&self, len: usize, unit: usize, f: F) {
        let unit = unit.max(1);
        let n = self.num_threads();
        if len == 0 {
            return;
        }
        if self.workers.is_empty() || len <= unit || len > u32::MAX as usize {
            return f(0..len);
        }
        let submit = self.submit.lock().unwrap_or_else(PoisonError::into_inner);
        let segs = &self.segments;
        for (i, s) in segs.iter().enumerate() {
            let (lo, hi) = (i * len / n, (i + 1) * len / n);
            s.store(((lo as u64) << 32) | hi as u64, Ordering::Relaxed);
        }
        self.broadcast(&submit, &|me| {
            while let Some(r) = take(&segs[me], Some(unit)) {
                f(r);
            }
            for d in 1..n {
                let other = &segs[(me + d) % n];
                while let Some(r) = take(other, None) {
                    f(r);
                }
            }
        });
    }

    /// Runs `f(i)` once for every slot `i` in `0..num_threads`: the caller runs slot 0, workers
    /// claim the others as they arrive, and the caller runs every slot still unclaimed when it
    /// is done, then waits for the claimed ones; `_submit` is the held submission lock. A panic
    /// in any slot is re-raised here after the wait.
    fn broadcast(&self, _submit: &MutexGuard<'_, ()>, f: &TaskFn<'_>) {
        let sh = &*self.shared;
        // SAFETY: only the lifetime is erased; the wait for `remaining == 0` below outlives
        // every use.
        let f_static: *const TaskFn<'static> = unsafe { std::mem::transmute(f) };
        // SAFETY: no slot of a job is claimed and unfinished (the previous call waited for
        // `remaining == 0`), so no worker reads the job; `submit` keeps other callers out.
        unsafe { *sh.job.get() = Some(Job { f: f_static }) };
        sh.remaining.store(sh.slots, Ordering::SeqCst);
        let epoch = ((sh.claim.load(Ordering::SeqCst) >> SLOT_BITS) + 1) & EPOCH_MASK;
        sh.claim.store(epoch << SLOT_BITS | 1, Ordering::SeqCst);
        if sh.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = sh.lock();
            sh.work_ready.notify_all();
        }
        let mut mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        sh.remaining.fetch_sub(1, Ordering::SeqCst);
        // The slots no worker claimed yet: ours now, whatever keeps their workers away.
        while let Some(slot) = claim_slot(sh, epoch) {
            let r = catch_unwind(AssertUnwindSafe(|| f(slot)));
            if mine.is_ok() {
                mine = r;
            }
            sh.remaining.fetch_sub(1, Ordering::SeqCst);
        }
        if !spin_until(|| sh.remaining.load(Ordering::Acquire) == 0) {
            let mut g = sh.lock();
            sh.caller_parked.store(true, Ordering::SeqCst);
            while sh.remaining.load(Ordering::SeqCst) > 0 {
                g = sh.work_done.wait(g).unwrap_or_else(PoisonError::into_inner);
            }
            sh.caller_parked.store(false, Ordering::SeqCst);
        }
        // SAFETY: every slot is done, and no worker can claim one of this job any more.
        unsafe { *sh.job.get() = None };
        let worker_panic = sh
            .panic
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if let Some(p) = worker_panic {
            resume_unwind(p);
        }
    }

    /// Tests: while `on`, workers claim no slot, as if the machine had descheduled them.
    #[cfg(test)]
    fn hold_workers(&self, on: bool) {
        self.shared.hold.store(on, Ordering::SeqCst);
    }

    /// Splits `0..len` into contiguous ranges of at least `min_chunk` items, about four per
    /// thread for balance, and runs `f` on each range in parallel.
    pub fn parallel_ranges<F: Fn(Range<usize>) + Sync>(&self, len: usize, min_chunk: usize, f: F) {
        if len == 0 {
            return;
        }
        let target = (self.num_threads() * 4).max(1);
        let chunk = len.div_ceil(target).max(min_chunk.max(1));
        let num_chunks = len.div_ceil(chunk);
        self.parallel_for(num_chunks, |c| {
            let start = c * chunk;
            f(start..(start + chunk).min(len));
        });
    }
}

/// Takes items of a segment (`front << 32 | back`): up to `Some(k)` from its front, or the one
/// at its back (`None`).
fn take(seg: &AtomicU64, front: Option<usize>) -> Option<Range<usize>> {
    let mut v = seg.load(Ordering::Relaxed);
    loop {
        let (lo, hi) = (v >> 32, v & u64::from(u32::MAX));
        if lo >= hi {
            return None;
        }
        let (next, items) = match front {
            Some(k) => {
                let end = hi.min(lo + k as u64);
                ((end << 32) | hi, lo..end)
            }
            None => ((lo << 32) | (hi - 1), hi - 1..hi),
        };
        match seg.compare_exchange_weak(v, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Some(items.start as usize..items.end as usize),
            Err(now) => v = now,
        }
    }
}

fn run_tasks(f: &(impl Fn(usize) + ?Sized), next: &AtomicUsize, num_tasks: usize) {
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= num_tasks {
            break;
        }
        f(i);
    }
}

/// Claims the next unclaimed slot of job `epoch`, if any.
fn claim_slot(sh: &Shared, epoch: u64) -> Option<usize> {
    let mut g = sh.claim.load(Ordering::SeqCst);
    loop {
        let slot = (g & SLOT_MASK) as usize;
        if g >> SLOT_BITS != epoch || slot >= sh.slots {
            return None;
        }
        match sh
            .claim
            .compare_exchange_weak(g, g + 1, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => return Some(slot),
            Err(now) => g = now,
        }
    }
}

fn worker_loop(sh: &Shared) {
    let mut seen = sh.claim.load(Ordering::SeqCst) >> SLOT_BITS;
    loop {
        let fresh = |sh: &Shared| sh.claim.load(Ordering::SeqCst) >> SLOT_BITS != seen;
        if !spin_until(|| fresh(sh)) {
            let mut g = sh.lock();
            sh.sleepers.fetch_add(1, Ordering::SeqCst);
            while !fresh(sh) && !sh.shutdown.load(Ordering::SeqCst) {
                g = sh
                    .work_ready
                    .wait(g)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            sh.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        if sh.shutdown.load(Ordering::SeqCst) {
            return;
        }
        seen = sh.claim.load(Ordering::SeqCst) >> SLOT_BITS;
        #[cfg(test)]
        if sh.hold.load(Ordering::SeqCst) {
            continue;
        }
        while let Some(slot) = claim_slot(sh, seen) {
            // SAFETY: the job was written before its epoch was published, and the caller keeps
            // it and what it points to alive until every claimed slot is done, after this one.
            let Some(job) = (unsafe { *sh.job.get() }) else {
                unreachable!("a claimed slot without a job");
            };
            // SAFETY: as above.
            let result = catch_unwind(AssertUnwindSafe(|| unsafe { (*job.f)(slot) }));
            if let Err(p) = result {
                sh.panic
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get_or_insert(p);
            }
            if sh.remaining.fetch_sub(1, Ordering::SeqCst) == 1
                && sh.caller_parked.load(Ordering::SeqCst)
            {
                let _g = sh.lock();
                sh.work_done.notify_all();
            }
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.lock();
            self.shared.work_ready.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once() {
        let pool = ThreadPool::new(3).unwrap();
        for n in [0usize, 1, 2, 7, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.parallel_for(n, |i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn ranges_cover_everything() {
        let pool = ThreadPool::new(2).unwrap();
        let sum = AtomicUsize::new(0);
        pool.parallel_ranges(1001, 10, |r| {
            sum.fetch_add(r.sum::<usize>(), Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 1000 * 1001 / 2);
    }

    #[test]
    fn segments_cover_everything_once_and_each_thread_starts_on_its_own() {
        for threads in [1, 2, 3, 5] {
            let pool = ThreadPool::new(threads).unwrap();
            for (len, unit) in [(0, 4), (1, 4), (7, 4), (96, 4), (1001, 10), (5, 1), (3, 0)] {
                let hits: Vec<AtomicUsize> = (0..len).map(|_| AtomicUsize::new(0)).collect();
                let calls = AtomicUsize::new(0);
                pool.parallel_segments(len, unit, |r| {
                    assert!(
                        !r.is_empty() && r.len() <= unit.max(1).max(len * (threads == 1) as usize)
                    );
                    calls.fetch_add(1, Ordering::Relaxed);
                    for i in r {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    }
                });
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "{threads} {len} {unit}"
                );
                assert_eq!(calls.load(Ordering::Relaxed) > 0, len > 0);
            }
        }
    }

    #[test]
    fn a_thread_takes_its_own_segment_front_to_back_then_steals_from_the_back() {
        // Per thread, the ranges it ran: consecutive ranges of at most `unit` items from the
        // front of some segment, then stolen single items in falling order. One slow item
        // makes stealing likely.
        let pool = ThreadPool::new(2).unwrap();
        for unit in [1, 3] {
            let log = Mutex::new(Vec::new());
            pool.parallel_segments(16, unit, |r| {
                if r.contains(&8) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                log.lock().unwrap().push((std::thread::current().id(), r));
            });
            let log = log.into_inner().unwrap();
            let mut all: Vec<usize> = log.iter().flat_map(|(_, r)| r.clone()).collect();
            all.sort();
            assert_eq!(all, (0..16).collect::<Vec<_>>());
            let mut ids: Vec<_> = log.iter().map(|(t, _)| *t).collect();
            ids.dedup();
            for id in ids {
                let mine: Vec<Range<usize>> = log
                    .iter()
                    .filter(|(t, _)| *t == id)
                    .map(|(_, r)| r.clone())
                    .collect();
                assert!(mine[0].start == 0 || mine[0].start == 8, "{mine:?}");
                let own = mine
                    .windows(2)
                    .take_while(|w| w[1].start == w[0].end)
                    .count()
                    + 1;
                assert!(mine[..own].iter().all(|r| r.len() <= unit), "{mine:?}");
                let stolen = &mine[own..];
                assert!(stolen.iter().all(|r| r.len() == 1), "{mine:?}");
                assert!(
                    stolen.windows(2).all(|w| w[1].start < w[0].start),
                    "{mine:?}"
                );
            }
        }
    }

    #[test]
    fn jobs_finish_without_workers_that_do_not_arrive() {
        // Workers held off (a busy machine deschedules them): every job still runs each task
        // and each slot once, on the caller, without waiting for them; then they come back.
        let pool = ThreadPool::new(3).unwrap();
        pool.hold_workers(true);
        for _ in 0..50 {
            let hits: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
            let me = std::thread::current().id();
            let others = AtomicUsize::new(0);
            pool.parallel_for(100, |i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
                if std::thread::current().id() != me {
                    others.fetch_add(1, Ordering::Relaxed);
                }
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            assert_eq!(
                others.load(Ordering::Relaxed),
                0,
                "a held worker ran a task"
            );
            let slots: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
            pool.parallel_segments(64, 4, |r| {
                slots[r.start * 3 / 64].fetch_add(1, Ordering::Relaxed);
            });
            assert!(slots.iter().all(|s| s.load(Ordering::Relaxed) > 0));
        }
        pool.hold_workers(false);
        // Back: the workers take part again (tasks long enough for them to arrive).
        // Jobs until a worker is seen (a loaded machine may take a while to schedule one).
        let threads = Mutex::new(std::collections::HashSet::new());
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while threads.lock().unwrap().len() <= 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "workers never came back"
            );
            pool.parallel_for(8, |_| {
                std::thread::sleep(Duration::from_millis(2));
                threads.lock().unwrap().insert(std::thread::current().id());
            });
        }
    }

    #[test]
    fn every_slot_runs_once_per_job_whoever_runs_it() {
        let pool = ThreadPool::new(4).unwrap();
        let submit = pool.submit.lock().unwrap();
        for round in 0..200 {
            let hits: Vec<AtomicUsize> = (0..4).map(|_| AtomicUsize::new(0)).collect();
            pool.hold_workers(round % 3 == 0);
            pool.broadcast(&submit, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "round {round}"
            );
        }
        pool.hold_workers(false);
    }

    #[test]
    fn a_panicking_task_reaches_the_caller_and_the_pool_survives() {
        let pool = ThreadPool::new(2).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.parallel_for(64, |i| assert!(i != 33, "task 33"));
        }));
        assert!(r.is_err());
        let count = AtomicUsize::new(0);
        pool.parallel_for(10, |_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 10);
    }
}
