//! Reading a family's tensors from a [`WeightSource`] with their shapes checked: a tensor of
//! another shape is an error naming it and both shapes, before anything is built from it.

use crate::source::WeightSource;
use crate::{ModelError, Result};
use ferrum_runtime::Tensor;

/// Loads tensors and checks their shapes.
pub(crate) struct Loader<'a> {
    pub(crate) src: &'a WeightSource,
}

impl Loader<'_> {
    pub(crate) fn tensor(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self.src.tensor(name)?;
        if t.shape() != shape {
            return Err(ModelError::TensorShape {
                path: self.src.path().to_path_buf(),
                name: name.to_string(),
                expected: shape.to_vec(),
                actual: t.shape().to_vec(),
            });
        }
        Ok(t)
    }

    pub(crate) fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        Ok(self.tensor(name, &[len])?.to_f32_vec())
    }
}
