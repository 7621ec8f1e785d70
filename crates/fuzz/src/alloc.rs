//! A global allocator that counts: install it in a test binary with
//! `#[global_allocator] static A: ferrum_fuzz::alloc::Counting = ferrum_fuzz::alloc::Counting;`.
//!
//! It forwards to the system allocator and records, since the last [`reset`], the largest
//! single request and the peak of live bytes. Counters are process-wide (an allocator has no
//! other place to keep them); the harness runs one input at a time, and the test harness's own
//! threads allocate little, so the figures belong to the input being run.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Forwards to [`System`], counting.
#[derive(Debug)]
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicUsize = AtomicUsize::new(0);

fn grew(size: usize) {
    INSTALLED.store(1, Relaxed);
    let live = LIVE.fetch_add(size, Relaxed) + size;
    PEAK.fetch_max(live, Relaxed);
    LARGEST.fetch_max(size, Relaxed);
}

// SAFETY: every call is forwarded unchanged to `System`; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Relaxed);
            grew(new_size);
        }
        p
    }
}

/// What was allocated since the last [`reset`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// The largest single allocation, in bytes.
    pub largest: usize,
    /// The most bytes live at once, above what was live at the reset.
    pub peak_above_start: usize,
}

/// Whether [`Counting`] is the global allocator (it has seen an allocation).
pub fn installed() -> bool {
    INSTALLED.load(Relaxed) == 1
}

/// Starts a new measurement; returns the live bytes now.
pub fn reset() -> usize {
    let live = LIVE.load(Relaxed);
    PEAK.store(live, Relaxed);
    LARGEST.store(0, Relaxed);
    live
}

/// The usage since the [`reset`] that returned `start`.
pub fn usage(start: usize) -> Usage {
    Usage {
        largest: LARGEST.load(Relaxed),
        peak_above_start: PEAK.load(Relaxed).saturating_sub(start),
    }
}
