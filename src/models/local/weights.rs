//! model.safetensors read into the encoder's f32 matrices, by name and
//! checked shape.

use safetensors::{Dtype, SafeTensors};

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct WeightsError(String);

pub struct Weights<'a> {
    tensors: SafeTensors<'a>,
    /// `bert.` when the checkpoint is a whole BertFor... model's.
    prefix: &'static str,
}

impl<'a> Weights<'a> {
    pub fn read(bytes: &'a [u8]) -> Result<Self, WeightsError> {
        let tensors = SafeTensors::deserialize(bytes)
            .map_err(|e| WeightsError(format!("not safetensors: {e}")))?;
        let bare = tensors.tensor("embeddings.word_embeddings.weight").is_ok();
        let prefix = if bare { "" } else { "bert." };
        Ok(Self { tensors, prefix })
    }

    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, WeightsError> {
        self.tensor(name, &[len])
    }

    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Vec<f32>, WeightsError> {
        self.tensor(name, &[rows, cols])
    }

    fn tensor(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, WeightsError> {
        let full = format!("{}{name}", self.prefix);
        let t = self
            .tensors
            .tensor(&full)
            .map_err(|_| WeightsError(format!("has no tensor {full:?}")))?;
        if t.dtype() != Dtype::F32 {
            return Err(WeightsError(format!(
                "{full} is {:?}; recall reads F32 weights",
                t.dtype()
            )));
        }
        if t.shape() != shape {
            return Err(WeightsError(format!(
                "{full} has shape {:?}, config.json says {shape:?}",
                t.shape()
            )));
        }
        let floats = t.data().chunks_exact(4);
        Ok(floats
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }
}
