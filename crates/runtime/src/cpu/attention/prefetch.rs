//! Prefetch hints for the blocks attention reads next: no effect on results, none at all off
//! x86-64.

/// Asks for every cache line of `data` to be brought towards the core (a hint: no effect on
/// results, none at all off x86-64).
#[inline(always)]
pub(super) fn prefetch<E>(data: &[E]) {
    #[cfg(target_arch = "x86_64")]
    prefetch_with::<{ std::arch::x86_64::_MM_HINT_T0 }, E>(data);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// [`prefetch`] into L2 only.
#[inline(always)]
pub(super) fn prefetch_l2<E>(data: &[E]) {
    #[cfg(target_arch = "x86_64")]
    prefetch_with::<{ std::arch::x86_64::_MM_HINT_T1 }, E>(data);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// Prefetches every cache line of `data` with hint `HINT`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn prefetch_with<const HINT: i32, E>(data: &[E]) {
    for line in data.chunks(64 / std::mem::size_of::<E>()) {
        // SAFETY: a prefetch reads nothing architecturally, and the address is inside `data`.
        unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(line.as_ptr() as *const i8) };
    }
}
