//! Token embedding lookup from a table in any stored format.

use crate::{Result, RuntimeError, Tensor};

/// `out[t, :] = table[ids[t], :]`, decoding only the rows asked for.
pub fn embedding(table: &Tensor, ids: &[u32], out: &mut [f32]) -> Result<()> {
    let dim = table.cols();
    if out.len() != ids.len() * dim {
        return Err(RuntimeError::Shape(format!(
            "embedding: output of {} values for {} ids of width {dim}",
            out.len(),
            ids.len()
        )));
    }
    for (&id, row) in ids.iter().zip(out.chunks_exact_mut(dim)) {
        if id as usize >= table.rows() {
            return Err(RuntimeError::Shape(format!(
                "token id {id} is outside the vocabulary of {} tokens",
                table.rows()
            )));
        }
        table.dequantize_row(id as usize, row);
    }
    Ok(())
}
