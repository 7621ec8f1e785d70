//! Raw bytes behind a tensor: a range of a shared memory map, or an owned buffer.
//!
//! Weights loaded from safetensors or GGUF stay in the map (the page cache backs them, nothing
//! is copied); owned storage is for tensors Ferrum builds itself, such as rows reordered at load.

use memmap2::Mmap;
use std::fmt;
use std::sync::Arc;

/// Bytes of one tensor. Invariant: for `Mapped`, `offset + len <= map.len()`.
#[derive(Clone)]
pub enum Storage {
    /// A byte range of a memory-mapped file.
    Mapped {
        map: Arc<Mmap>,
        offset: usize,
        len: usize,
    },
    /// Bytes owned by the process.
    Owned(Arc<[u8]>),
}

impl Storage {
    /// A range of a map; `None` when the range does not lie inside the map.
    pub fn mapped(map: Arc<Mmap>, offset: usize, len: usize) -> Option<Storage> {
        let end = offset.checked_add(len)?;
        (end <= map.len()).then_some(Storage::Mapped { map, offset, len })
    }

    /// Owned bytes.
    pub fn owned(bytes: Vec<u8>) -> Storage {
        Storage::Owned(bytes.into())
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped { map, offset, len } => &map[*offset..*offset + *len],
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

    /// Whether the bytes live in a memory map.
    pub fn is_mapped(&self) -> bool {
        matches!(self, Storage::Mapped { .. })
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
