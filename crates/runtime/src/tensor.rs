//! A weight tensor: dtype, shape and storage, with row access in the stored format.
//!
//! Invariants checked at construction: the storage holds exactly the bytes the shape and dtype
//! need, and the last dimension (a row) is a whole number of blocks. Shapes are row-major
//! (`[rows, cols]` for a matrix: `cols` is the contiguous, innermost dimension).

use crate::{quant, DType, Result, RuntimeError, Storage};

/// An immutable tensor in its stored format.
#[derive(Debug, Clone)]
pub struct Tensor {
    dtype: DType,
    shape: Vec<usize>,
    storage: Storage,
}

impl Tensor {
    /// Wraps storage after checking its size against `shape` and `dtype`.
    pub fn new(dtype: DType, shape: Vec<usize>, storage: Storage) -> Result<Tensor> {
        let expected = Self::bytes_for(dtype, &shape)?;
        if storage.len() != expected {
            return Err(RuntimeError::StorageSize {
                dtype,
                shape,
                expected,
                actual: storage.len(),
            });
        }
        Ok(Tensor {
            dtype,
            shape,
            storage,
        })
    }

    /// A float32 tensor from values.
    pub fn from_f32(shape: Vec<usize>, values: &[f32]) -> Result<Tensor> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new(DType::F32, shape, Storage::owned(bytes))
    }

    /// Bytes needed to store `shape` as `dtype`, checking block alignment and overflow.
    pub fn bytes_for(dtype: DType, shape: &[usize]) -> Result<usize> {
        let cols = shape.last().copied().unwrap_or(1);
        let rows = shape[..shape.len().saturating_sub(1)]
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| RuntimeError::TooLarge(shape.to_vec()))?;
        if cols % dtype.block_size() != 0 {
            return Err(RuntimeError::PartialBlock {
                dtype,
                cols,
                block: dtype.block_size(),
            });
        }
        dtype
            .row_bytes(cols)
            .and_then(|rb| rb.checked_mul(rows))
            .filter(|&n| n <= isize::MAX as usize)
            .ok_or_else(|| RuntimeError::TooLarge(shape.to_vec()))
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Gives the resident pages of mapped bytes back ([`Storage::release_pages`]): for a tensor
    /// the kernels read in another form. Its bytes stay readable (from the file, on demand).
    pub fn release_pages(&self) {
        self.storage.release_pages();
    }

    /// [`Tensor::release_pages`] for rows `first..first + count` only (clamped to the tensor).
    pub fn release_row_pages(&self, first: usize, count: usize) {
        if !self.storage.is_mapped() {
            return;
        }
        let rb = self.row_bytes();
        let first = first.min(self.rows());
        let count = count.min(self.rows() - first);
        if let Some(part) = self.storage.slice(first * rb, count * rb) {
            part.release_pages();
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Size in bytes as stored.
    pub fn num_bytes(&self) -> usize {
        self.storage.len()
    }

    /// Elements per row (the last dimension; 1 for a scalar).
    pub fn cols(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Number of rows (the product of all but the last dimension).
    pub fn rows(&self) -> usize {
        self.shape[..self.shape.len().saturating_sub(1)]
            .iter()
            .product()
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.storage.len() / self.rows().max(1)
    }

    /// The stored bytes of row `i`. Panics if `i >= rows()`.
    pub fn row(&self, i: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.storage.bytes()[i * rb..(i + 1) * rb]
    }

    /// Decodes row `i` into `out` (`out.len() == cols()`). Panics if `i >= rows()`.
    pub fn dequantize_row(&self, i: usize, out: &mut [f32]) {
        quant::dequantize_row(self.dtype, self.row(i), out);
    }

    /// The whole tensor decoded to f32. For small tensors (norm weights, biases) only.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.numel()];
        quant::dequantize_row(self.dtype, self.storage.bytes(), &mut out);
        out
    }

    /// Rows `start..start + n` (of a 2-D tensor) as a tensor of their own, in the same dtype:
    /// block-quantized rows are whole blocks, so any row range is (the fused projections of
    /// Phi-3 are split this way at load). A mapped tensor's rows stay mapped.
    pub fn slice_rows(&self, start: usize, n: usize) -> Result<Tensor> {
        if self.shape.len() != 2 || start.checked_add(n).is_none_or(|end| end > self.rows()) {
            return Err(RuntimeError::Shape(format!(
                "rows {start}..{} of a tensor of shape {:?}",
                start.saturating_add(n),
                self.shape
            )));
        }
        let rb = self.row_bytes();
        let storage = self
            .storage
            .slice(start * rb, n * rb)
            .ok_or_else(|| RuntimeError::Shape("row range outside the storage".into()))?;
        Tensor::new(self.dtype, vec![n, self.shape[1]], storage)
    }

    /// The rows of `parts` one after another, copied into one tensor: the weights of products
    /// that read one input (q, k and v; gate and up), stacked so that one product computes
    /// them all. Every part is 2-D with one dtype and one column count; block-quantized rows
    /// are whole blocks, so they stack as bytes.
    pub fn stack_rows(parts: &[&Tensor]) -> Result<Tensor> {
        let first = parts
            .first()
            .ok_or_else(|| RuntimeError::Shape("stacking the rows of no tensors".into()))?;
        let (dtype, cols) = (first.dtype, first.cols());
        let mut rows = 0usize;
        for t in parts {
            if t.shape.len() != 2 || t.dtype != dtype || t.cols() != cols {
                return Err(RuntimeError::Shape(format!(
                    "stacking rows of a {} tensor of shape {:?} under a {dtype} one of \
                     {cols} columns",
                    t.dtype, t.shape
                )));
            }
            rows += t.rows();
        }
        let mut bytes = Vec::with_capacity(parts.iter().map(|t| t.num_bytes()).sum());
        for t in parts {
            bytes.extend_from_slice(t.storage.bytes());
        }
        Tensor::new(dtype, vec![rows, cols], Storage::owned(bytes))
    }

    /// Columns `start..start + n` of every row, copied (a tensor-parallel rank's share of a
    /// product split by its input). Block-quantized rows split only at block boundaries: a
    /// range that cuts a block is an error naming the block size.
    pub fn slice_cols(&self, start: usize, n: usize) -> Result<Tensor> {
        let cols = self.shape.get(1).copied().unwrap_or(0);
        if self.shape.len() != 2 || start.checked_add(n).is_none_or(|end| end > cols) {
            return Err(RuntimeError::Shape(format!(
                "columns {start}..{} of a tensor of shape {:?}",
                start.saturating_add(n),
                self.shape
            )));
        }
        let block = self.dtype.block_size();
        if !start.is_multiple_of(block) || !n.is_multiple_of(block) {
            return Err(RuntimeError::Shape(format!(
                "columns {start}..{} of a {} tensor: its blocks of {block} columns cannot be cut",
                start + n,
                self.dtype
            )));
        }
        let bb = self.dtype.block_bytes();
        let (from, len) = (start / block * bb, n / block * bb);
        let mut bytes = Vec::with_capacity(self.rows() * len);
        for r in 0..self.rows() {
            bytes.extend_from_slice(&self.row(r)[from..from + len]);
        }
        Tensor::new(self.dtype, vec![self.rows(), n], Storage::owned(bytes))
    }

    /// Matrix `i` of a 3-D tensor `[n, rows, cols]` (GGUF's stacked experts) as a 2-D tensor
    /// of its own, in the same dtype (mapped rows stay mapped).
    pub fn index_first(&self, i: usize) -> Result<Tensor> {
        if self.shape.len() != 3 || i >= self.shape[0] {
            return Err(RuntimeError::Shape(format!(
                "matrix {i} of a tensor of shape {:?}",
                self.shape
            )));
        }
        let (r, c) = (self.shape[1], self.shape[2]);
        let flat = Tensor::new(self.dtype, vec![self.shape[0] * r, c], self.storage.clone())?;
        flat.slice_rows(i * r, r)
    }

    /// A copy whose rows are reordered: row `i` of the result is row `order[i]` of `self`.
    /// Blocks are moved whole, so the dtype is kept.
    pub fn permute_rows(&self, order: &[usize]) -> Result<Tensor> {
        if order.len() != self.rows() || order.iter().any(|&r| r >= self.rows()) {
            return Err(RuntimeError::Shape(format!(
                "row order of {} entries for a tensor of {} rows",
                order.len(),
                self.rows()
            )));
        }
        let mut bytes = Vec::with_capacity(self.num_bytes());
        for &r in order {
            bytes.extend_from_slice(self.row(r));
        }
        Tensor::new(self.dtype, self.shape.clone(), Storage::owned(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_rows_read_back_the_same_bytes() {
        let path = std::env::temp_dir().join(format!("ferrum-tensor-rows-{}", std::process::id()));
        let bytes: Vec<u8> = (0..8 * 4096).map(|i| (i * 13 % 251) as u8).collect();
        std::fs::write(&path, &bytes).expect("write");
        let file = std::fs::File::open(&path).expect("open");
        // SAFETY: the test's own file, not changed while mapped.
        let map = std::sync::Arc::new(unsafe { memmap2::Mmap::map(&file) }.expect("map"));
        // SAFETY: a map of the test's file.
        let storage = unsafe { Storage::mapped(map, 0, bytes.len()) }.expect("range");
        // Eight rows of one page each.
        let t = Tensor::new(DType::F32, vec![8, 1024], storage).expect("tensor");
        t.release_row_pages(2, 3);
        t.release_row_pages(7, 100);
        t.release_row_pages(100, 1);
        assert_eq!(t.storage().bytes(), &bytes[..]);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn stacked_rows_are_the_parts_in_order_and_mismatches_are_refused() {
        let a = Tensor::from_f32(vec![2, 3], &[1., 2., 3., 4., 5., 6.]).expect("a");
        let b = Tensor::from_f32(vec![1, 3], &[7., 8., 9.]).expect("b");
        let whole = Tensor::from_f32(vec![3, 3], &[0.; 9]).expect("whole");
        // A sliced (view) part contributes its own rows only.
        let c = whole.slice_rows(1, 1).expect("slice");
        let s = Tensor::stack_rows(&[&a, &b, &c]).expect("stack");
        assert_eq!(s.shape(), &[4, 3]);
        assert_eq!(
            s.to_f32_vec(),
            vec![1., 2., 3., 4., 5., 6., 7., 8., 9., 0., 0., 0.]
        );
        // Block-quantized rows stack as bytes.
        let q =
            Tensor::new(DType::Q8_0, vec![2, 32], Storage::owned((0..68).collect())).expect("q8_0");
        let qs = Tensor::stack_rows(&[&q, &q.slice_rows(1, 1).expect("row")]).expect("stack");
        assert_eq!(qs.shape(), &[3, 32]);
        assert_eq!(qs.row(2), q.row(1));
        let wide = Tensor::from_f32(vec![1, 4], &[0.; 4]).expect("wide");
        let err = Tensor::stack_rows(&[&a, &wide]).unwrap_err();
        assert!(err.to_string().contains("3 columns"), "{err}");
        let err = Tensor::stack_rows(&[&a, &q]).unwrap_err();
        assert!(
            err.to_string().contains("q8_0") || err.to_string().contains("Q8_0"),
            "{err}"
        );
        assert!(Tensor::stack_rows(&[]).is_err());
    }

    #[test]
    fn storage_size_is_checked() {
        let err = Tensor::new(DType::F32, vec![2, 3], Storage::owned(vec![0; 20])).unwrap_err();
        assert!(err.to_string().contains("needs 24 bytes"), "{err}");
        let err = Tensor::new(DType::Q8_0, vec![2, 40], Storage::owned(vec![])).unwrap_err();
        assert!(err.to_string().contains("whole number of blocks"), "{err}");
        let err = Tensor::bytes_for(DType::F32, &[1 << 40, 1 << 40]).unwrap_err();
        assert!(matches!(err, RuntimeError::TooLarge(_)));
    }

    #[test]
    fn cols_slice() {
        let t = Tensor::from_f32(vec![2, 3], &[0., 1., 2., 3., 4., 5.]).unwrap();
        let s = t.slice_cols(1, 2).unwrap();
        assert_eq!(
            (s.shape(), s.to_f32_vec()),
            (&[2, 2][..], vec![1., 2., 4., 5.])
        );
        assert!(t.slice_cols(2, 2).is_err());
        // Q8_0 rows of 64: two blocks of 32 (34 bytes each).
        let bytes: Vec<u8> = (0..2 * 68).map(|i| i as u8).collect();
        let q = Tensor::new(DType::Q8_0, vec![2, 64], Storage::owned(bytes.clone())).unwrap();
        let right = q.slice_cols(32, 32).unwrap();
        assert_eq!(right.row(1), &bytes[68 + 34..136]);
        let err = q.slice_cols(16, 32).unwrap_err();
        assert!(err.to_string().contains("blocks of 32"), "{err}");
    }

    #[test]
    fn rows_slice() {
        let t = Tensor::from_f32(vec![3, 2], &[0., 1., 2., 3., 4., 5.]).unwrap();
        let s = t.slice_rows(1, 2).unwrap();
        assert_eq!(
            (s.shape(), s.to_f32_vec()),
            (&[2, 2][..], vec![2., 3., 4., 5.])
        );
        assert!(t.slice_rows(2, 2).is_err());
        assert!(t.slice_rows(usize::MAX, 2).is_err());
    }

    #[test]
    fn stacked_matrices_index() {
        let v: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let t = Tensor::from_f32(vec![3, 2, 2], &v).unwrap();
        let m = t.index_first(1).unwrap();
        assert_eq!(
            (m.shape(), m.to_f32_vec()),
            (&[2, 2][..], vec![4., 5., 6., 7.])
        );
        assert!(t.index_first(3).is_err());
        assert!(m.index_first(0).is_err());
    }

    #[test]
    fn rows_permute() {
        let t = Tensor::from_f32(vec![3, 2], &[0., 1., 2., 3., 4., 5.]).unwrap();
        let p = t.permute_rows(&[2, 0, 1]).unwrap();
        assert_eq!(p.to_f32_vec(), vec![4., 5., 0., 1., 2., 3.]);
        assert!(t.permute_rows(&[0, 0]).is_err());
    }
}
