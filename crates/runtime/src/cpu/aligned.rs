//! Heap buffers aligned to 64 bytes: one cache line, one AVX-512 register.
//!
//! The tiled weight formats ([`super::qpack`], [`super::fpack`], [`super::bpack`]) lay their
//! data out in groups of 64 bytes that one instruction loads; kept in an [`Aligned`] buffer,
//! no such load ever straddles two cache lines (a plain `Vec` of bytes starts 16 bytes into a
//! line, which split every load in two).

use std::fmt;
use std::ops::{Deref, DerefMut};

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// `len` values of `T` starting on a 64-byte boundary, zeroed when made.
#[derive(Clone)]
pub struct Aligned<T: Copy> {
    lines: Vec<Line>,
    len: usize,
    _t: std::marker::PhantomData<T>,
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
        Aligned {
            lines: vec![Line([0; 64]); (len * size).div_ceil(64)],
            len,
            _t: std::marker::PhantomData,
        }
    }
}

impl<T: Copy> Deref for Aligned<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: the lines hold at least `len` values of `T` (checked in `zeroed`), are
        // aligned for `T`, and were initialized to zeros, a valid `T` for the number types used.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const T, self.len) }
    }
}

impl<T: Copy> DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; the borrow of `self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr() as *mut T, self.len) }
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
}
