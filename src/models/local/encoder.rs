//! The model itself: texts to token ids, through candle's BERT, pooled
//! and normalised as sentence-transformers does. Blocking: it runs on the
//! embedder's own thread.

use std::path::Path;

use candle_core::{DType, Device, IndexOp, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::BertModel;
use tokenizers::{Encoding, Tokenizer};

use super::folder::{Folder, LoadError, Pooling};

/// Texts run through the model in one pass, at most. A call's texts are
/// sorted by length first, so that each pass pads its texts to about
/// their own length rather than to the longest of the call.
const PASS: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("cannot tokenize: {0}")]
    Tokenizer(String),
    #[error(transparent)]
    Model(#[from] candle_core::Error),
    #[error("the model panicked")]
    Panicked,
}

pub struct Encoder {
    model: BertModel,
    tokenizer: Tokenizer,
    pooling: Pooling,
    pad_id: u32,
    device: Device,
}

impl Encoder {
    pub fn load(dir: &Path) -> Result<Self, LoadError> {
        let folder = Folder::read(dir)?;
        let file = &folder.weights;
        // Read rather than mapped: the tensors are copied out of it, and a
        // mapping would be unsafe against the file changing underneath.
        let bytes = std::fs::read(file).map_err(|source| LoadError::Read {
            file: file.clone(),
            source,
        })?;
        let device = Device::Cpu;
        let weights = VarBuilder::from_slice_safetensors(&bytes, DType::F32, &device)
            .map_err(|e| LoadError::invalid(file, e))?;
        let model =
            BertModel::load(weights, &folder.config).map_err(|e| LoadError::invalid(file, e))?;
        Ok(Self {
            model,
            tokenizer: folder.tokenizer,
            pooling: folder.pooling,
            pad_id: folder.config.pad_token_id as u32,
            device,
        })
    }

    /// One unit vector per text, in order.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EncodeError> {
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| EncodeError::Tokenizer(e.to_string()))?;
        let mut order: Vec<usize> = (0..encodings.len()).collect();
        order.sort_by_key(|&i| encodings[i].len());
        let mut out = vec![Vec::new(); encodings.len()];
        for pass in order.chunks(PASS) {
            let batch: Vec<&Encoding> = pass.iter().map(|&i| &encodings[i]).collect();
            for (&i, v) in pass.iter().zip(self.pass(&batch)?) {
                out[i] = v;
            }
        }
        Ok(out)
    }

    /// One forward pass over `batch`, padded to its longest.
    fn pass(&self, batch: &[&Encoding]) -> Result<Vec<Vec<f32>>, EncodeError> {
        let width = batch.iter().map(|e| e.len()).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(batch.len() * width);
        let mut mask = Vec::with_capacity(batch.len() * width);
        for e in batch {
            ids.extend_from_slice(e.get_ids());
            ids.resize(ids.len() + width - e.len(), self.pad_id);
            mask.extend_from_slice(e.get_attention_mask());
            mask.resize(mask.len() + width - e.len(), 0);
        }
        let shape = (batch.len(), width);
        let ids = Tensor::from_vec(ids, shape, &self.device)?;
        let mask = Tensor::from_vec(mask, shape, &self.device)?;
        let kinds = ids.zeros_like()?;
        let hidden = self.model.forward(&ids, &kinds, Some(&mask))?;
        let pooled = match self.pooling {
            Pooling::Mean => {
                let kept = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
                let sum = hidden.broadcast_mul(&kept)?.sum(1)?;
                sum.broadcast_div(&kept.sum(1)?)?
            }
            Pooling::Cls => hidden.i((.., 0))?,
        };
        let rows: Vec<Vec<f32>> = pooled.to_vec2()?;
        Ok(rows.into_iter().map(normalised).collect())
    }
}

/// `v` at unit length (as sentence-transformers' Normalize: a zero vector
/// stays zero).
fn normalised(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    v.iter_mut().for_each(|x| *x /= norm);
    v
}
