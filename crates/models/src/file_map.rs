//! A model file's bytes in memory: a read-only map of the file, or (for tests and fuzzing) an
//! anonymous map holding a copy. Tensors are views of it ([`FileMap::storage`]); only a file's
//! pages may be given back once a tensor is repacked (they fault in again from the file), so
//! the copy's views say they are a copy.

use crate::{ModelError, Result};
use ferrum_runtime::Storage;
use memmap2::Mmap;
use std::path::Path;
use std::sync::Arc;

/// A model file's bytes: a map of the file, or an anonymous map holding a copy of them (for
/// tests and fuzzing), whose pages must never be given back. Invariant: `file` is true exactly
/// when `map` maps a file (made by [`FileMap::open`]).
#[derive(Debug)]
pub(crate) struct FileMap {
    map: Arc<Mmap>,
    file: bool,
}

impl FileMap {
    /// Maps `path` read-only.
    pub(crate) fn open(path: &Path) -> Result<FileMap> {
        let file = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
        // SAFETY: the map is read-only; a file truncated underneath us by another process is
        // outside what any mmap-based loader can defend against.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
        Ok(FileMap {
            map: Arc::new(map),
            file: true,
        })
    }

    /// A read-only anonymous map holding a copy of `bytes` (an empty input is an error: a map
    /// cannot be empty, and no model file is).
    pub(crate) fn copy(name: &Path, bytes: &[u8]) -> Result<FileMap> {
        if bytes.is_empty() {
            return Err(ModelError::format(name, "file is empty"));
        }
        let mut m = memmap2::MmapMut::map_anon(bytes.len()).map_err(|e| ModelError::io(name, e))?;
        m.copy_from_slice(bytes);
        Ok(FileMap {
            map: Arc::new(m.make_read_only().map_err(|e| ModelError::io(name, e))?),
            file: false,
        })
    }

    /// Bytes `offset..offset + len` as tensor storage; `None` outside the map.
    pub(crate) fn storage(&self, offset: usize, len: usize) -> Option<Storage> {
        let map = Arc::clone(&self.map);
        if self.file {
            // SAFETY: `file` is set only by `FileMap::open`, whose map is of a file.
            unsafe { Storage::mapped(map, offset, len) }
        } else {
            Storage::mapped_copy(map, offset, len)
        }
    }
}

impl std::ops::Deref for FileMap {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_keeps_its_bytes_when_pages_are_given_back() {
        let bytes: Vec<u8> = (0..3 * 4096 + 10).map(|i| (i % 251) as u8).collect();
        let m = FileMap::copy(Path::new("t.gguf"), &bytes).expect("maps");
        let s = m.storage(0, bytes.len()).expect("in range");
        s.release_pages();
        assert_eq!(s.bytes(), &bytes[..]);
        assert!(m.storage(1, bytes.len()).is_none());
        assert!(FileMap::copy(Path::new("t.gguf"), &[]).is_err());
    }
}
