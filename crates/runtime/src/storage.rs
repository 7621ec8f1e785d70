//! Raw bytes behind a tensor: a range of a shared memory map, or an owned buffer.
//!
//! Weights loaded from safetensors or GGUF stay in the map (the page cache backs them, nothing
//! is copied); owned storage is for tensors Ferrum builds itself, such as rows reordered at load.
//! A mapped tensor whose bytes were rewritten into another form (the kernels' repacked tiles)
//! gives its pages back ([`Storage::release_pages`]), so the file is not resident beside its
//! copy; a later read faults the bytes back in from the file, unchanged.

use memmap2::Mmap;
use std::fmt;
use std::sync::Arc;

/// Bytes of one tensor. Invariant: for `Mapped`, `offset + len <= map.len()`.
#[derive(Clone)]
pub enum Storage {
    /// A byte range of a memory map.
    Mapped {
        map: Arc<Mmap>,
        offset: usize,
        len: usize,
        /// Whether the map is of a file, whose pages can be given back and fault in again
        /// (false: an anonymous map holding a copy, whose pages are its only copy).
        file: bool,
    },
    /// Bytes owned by the process.
    Owned(Arc<[u8]>),
}

impl Storage {
    /// A range of a map of a file; `None` when the range does not lie inside the map.
    ///
    /// # Safety
    /// `map` is a read-only map of a file (not an anonymous map): [`Storage::release_pages`]
    /// gives its pages back, which only a file can fault in again unchanged.
    pub unsafe fn mapped(map: Arc<Mmap>, offset: usize, len: usize) -> Option<Storage> {
        Storage::mapped_range(map, offset, len, true)
    }

    /// A range of an anonymous map holding a copy of some bytes (never given back); `None`
    /// when the range does not lie inside the map.
    pub fn mapped_copy(map: Arc<Mmap>, offset: usize, len: usize) -> Option<Storage> {
        Storage::mapped_range(map, offset, len, false)
    }

    fn mapped_range(map: Arc<Mmap>, offset: usize, len: usize, file: bool) -> Option<Storage> {
        let end = offset.checked_add(len)?;
        (end <= map.len()).then_some(Storage::Mapped {
            map,
            offset,
            len,
            file,
        })
    }

    /// Owned bytes.
    pub fn owned(bytes: Vec<u8>) -> Storage {
        Storage::Owned(bytes.into())
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped {
                map, offset, len, ..
            } => &map[*offset..*offset + *len],
            Storage::Owned(b) => b,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Storage::Mapped { len, .. } => *len,
            Storage::Owned(b) => b.len(),
        }
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops the resident pages that lie wholly inside a range of a mapped file from this
    /// process's memory (`madvise(MADV_DONTNEED)`); nothing for owned bytes, an anonymous
    /// map's copy, or where the system does not offer it. The bytes stay readable: a later read faults them back in from the file.
    /// Pages shared with a neighbouring range are kept.
    pub fn release_pages(&self) {
        #[cfg(unix)]
        if let Storage::Mapped {
            map,
            offset,
            len,
            file: true,
        } = self
        {
            const PAGE: usize = 4096;
            let base = map.as_ptr() as usize;
            let start = (base + offset).next_multiple_of(PAGE) - base;
            let end = (base + offset + len) / PAGE * PAGE - base;
            if end > start {
                // SAFETY: the map is a read-only map of a file (`file: true`: the contract of
                // `Storage::mapped`), and nothing writes through it, so dropping pages discards
                // no data: a read after this one faults the same file bytes back in, and
                // borrows of the map stay valid. The range lies
                // inside the map (the `Mapped` invariant). A failure only leaves pages resident.
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        start,
                        end - start,
                    )
                };
            }
        }
    }

    /// Whether the bytes live in a memory map.
    pub fn is_mapped(&self) -> bool {
        matches!(self, Storage::Mapped { .. })
    }

    /// Bytes `start..start + len` as storage of their own: the same mapping for a mapped
    /// range (no copy), a copy of owned bytes. `None` when the range is out of bounds.
    pub fn slice(&self, start: usize, len: usize) -> Option<Storage> {
        let end = start.checked_add(len)?;
        if end > self.len() {
            return None;
        }
        Some(match self {
            Storage::Mapped {
                map, offset, file, ..
            } => Storage::Mapped {
                map: Arc::clone(map),
                offset: offset + start,
                len,
                file: *file,
            },
            Storage::Owned(b) => Storage::owned(b[start..end].to_vec()),
        })
    }
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Storage::Mapped { offset, len, .. } => {
                write!(f, "Mapped {{ offset: {offset}, len: {len} }}")
            }
            Storage::Owned(b) => write!(f, "Owned {{ len: {} }}", b.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_pages_read_back_the_same_bytes() {
        // Three pages and a bit of a file, mapped; a range that starts and ends inside pages.
        let path = std::env::temp_dir().join(format!("ferrum-storage-{}", std::process::id()));
        let bytes: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &bytes).expect("write");
        let file = std::fs::File::open(&path).expect("open");
        // SAFETY: the test's own file, not changed while mapped.
        let map = Arc::new(unsafe { Mmap::map(&file) }.expect("map"));
        // SAFETY: a map of the test's file.
        let s = unsafe { Storage::mapped(map.clone(), 1000, 2 * 4096 + 500) }.expect("range");
        assert_eq!(s.bytes(), &bytes[1000..1000 + 2 * 4096 + 500]);
        s.release_pages();
        assert_eq!(s.bytes(), &bytes[1000..1000 + 2 * 4096 + 500]);
        // The whole map, and an owned buffer (nothing to give back).
        // SAFETY: as above.
        unsafe { Storage::mapped(map.clone(), 0, bytes.len()) }
            .expect("all")
            .release_pages();
        assert_eq!(&map[..], &bytes[..]);
        Storage::owned(vec![1, 2, 3]).release_pages();
        std::fs::remove_file(&path).expect("remove");
    }
}
