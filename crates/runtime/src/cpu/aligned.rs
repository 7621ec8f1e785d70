//! Heap buffers aligned to 64 bytes: one cache line, one AVX-512 register.
//!
//! The tiled weight formats ([`super::qpack`], [`super::fpack`], [`super::bpack`]) lay their
//! data out in groups of 64 bytes that one instruction loads; kept in an [`Aligned`] buffer,
//! no such load ever straddles two cache lines (a plain `Vec` of bytes starts 16 bytes into a
//! line, which split every load in two).
//!
//! Buffers of [`HUGE`] bytes or more (weight matrices) are anonymous maps that ask the kernel for
//! transparent huge pages (`MADV_HUGEPAGE`, where the system is set to `madvise`): a stream
//! over a weight then walks one page table entry per 2 MiB instead of per 4 KiB, which on this
//! project's machines raised a core's streaming read bandwidth by about a third. Where the
//! kernel declines, the map holds ordinary pages and nothing else changes.

use memmap2::MmapMut;
use std::fmt;
use std::ops::{Deref, DerefMut};

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Bytes from which a buffer is mapped on its own, with huge pages asked for.
pub const HUGE: usize = 2 << 20;

/// `len` values of `T` starting on a 64-byte boundary, zeroed when made.
pub struct Aligned<T: Copy> {
    mem: Mem,
    len: usize,
    _t: std::marker::PhantomData<T>,
}

/// Where the bytes live: both start on a 64-byte boundary (a map on a page).
enum Mem {
    Lines(Vec<Line>),
    Map(MmapMut),
}

impl Mem {
    /// `bytes` zero bytes.
    fn zeroed(bytes: usize) -> Mem {
        if bytes >= HUGE {
            if let Ok(map) = MmapMut::map_anon(bytes) {
                #[cfg(target_os = "linux")]
                {
                    // A hint: without huge pages the map works the same, only slower.
                    let _ = map.advise(memmap2::Advice::HugePage);
                }
                return Mem::Map(map);
            }
        }
        Mem::Lines(vec![Line([0; 64]); bytes.div_ceil(64)])
    }

    fn ptr(&self) -> *const u8 {
        match self {
            Mem::Lines(v) => v.as_ptr() as *const u8,
            Mem::Map(m) => m.as_ptr(),
        }
    }

    fn ptr_mut(&mut self) -> *mut u8 {
        match self {
            Mem::Lines(v) => v.as_mut_ptr() as *mut u8,
            Mem::Map(m) => m.as_mut_ptr(),
        }
    }
}

impl<T: Copy> Aligned<T> {
    /// `len` zero values. `T` must be a plain number type (all-zero bytes are a valid value),
    /// at most 64 bytes in size and alignment.
    pub fn zeroed(len: usize) -> Aligned<T> {
        let size = std::mem::size_of::<T>();
        assert!(
            size > 0 && 64 % size == 0 && std::mem::align_of::<T>() <= 64,
            "Aligned: no 64-byte lines of a type of {size} bytes"
        );
        let bytes = len.checked_mul(size).expect("Aligned: size overflows");
        Aligned {
            mem: Mem::zeroed(bytes),
            len,
            _t: std::marker::PhantomData,
        }
    }
}

impl<T: Copy> Clone for Aligned<T> {
    fn clone(&self) -> Aligned<T> {
        let mut a = Aligned::zeroed(self.len);
        a.copy_from_slice(self);
        a
    }
}

impl<T: Copy> Deref for Aligned<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: the memory holds at least `len` values of `T` (sized in `zeroed`), starts on a
        // 64-byte boundary (so aligned for `T`, checked in `zeroed`), and was initialized to
        // zeros, a valid `T` for the number types used.
        unsafe { std::slice::from_raw_parts(self.mem.ptr() as *const T, self.len) }
    }
}

impl<T: Copy> DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; the borrow of `self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.mem.ptr_mut() as *mut T, self.len) }
    }
}

impl<T: Copy> fmt::Debug for Aligned<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Aligned({} values)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_on_a_line_and_holds_len_zeros() {
        for len in [0usize, 1, 15, 16, 17, 1000] {
            let mut a = Aligned::<u32>::zeroed(len);
            assert_eq!(a.len(), len);
            assert_eq!(a.as_ptr() as usize % 64, 0);
            assert!(a.iter().all(|&v| v == 0));
            if len > 0 {
                a[len - 1] = 7;
                assert_eq!(a[len - 1], 7);
            }
        }
        assert_eq!(Aligned::<u8>::zeroed(65).len(), 65);
    }

    #[test]
    fn large_buffers_are_maps_on_a_line_and_clone() {
        let n = HUGE / 4 + 3;
        let mut a = Aligned::<u32>::zeroed(n);
        assert!(matches!(a.mem, Mem::Map(_)));
        assert_eq!(a.as_ptr() as usize % 64, 0);
        assert!(a.iter().all(|&v| v == 0));
        a[n - 1] = 9;
        let b = a.clone();
        assert_eq!((b.len(), b[n - 1], b[0]), (n, 9, 0));
    }
}
