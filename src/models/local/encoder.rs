//! The model itself: texts to token ids, through the BERT encoder, pooled
//! and normalised as sentence-transformers does. Blocking: it runs on the
//! embedder's own thread.

use std::path::Path;

use tokenizers::Tokenizer;

use super::bert::Bert;
use super::folder::{Folder, LoadError, Pooling};
use super::weights::Weights;

/// Tokens run through the model in one pass, at most (a text alone may
/// be longer): what a pass holds at once is a few of its rows of
/// `intermediate_size` floats per token.
const PASS_TOKENS: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("cannot tokenize: {0}")]
    Tokenizer(String),
    #[error("the model panicked")]
    Panicked,
}

pub struct Encoder {
    model: Bert,
    tokenizer: Tokenizer,
    pooling: Pooling,
}

impl Encoder {
    pub fn load(dir: &Path) -> Result<Self, LoadError> {
        let folder = Folder::read(dir)?;
        let file = &folder.weights;
        let bytes = std::fs::read(file).map_err(|source| LoadError::Read {
            file: file.clone(),
            source,
        })?;
        let weights = Weights::read(&bytes).map_err(|e| LoadError::invalid(file, e))?;
        let model =
            Bert::load(&folder.config, &weights).map_err(|e| LoadError::invalid(file, e))?;
        Ok(Self {
            model,
            tokenizer: folder.tokenizer,
            pooling: folder.pooling,
        })
    }

    /// One unit vector per text, in order.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EncodeError> {
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| EncodeError::Tokenizer(e.to_string()))?;
        // The tokenizer cuts at max_seq_length, which the folder bounds by
        // the position embeddings; this bounds it whatever the tokenizer.
        let ids: Vec<&[u32]> = encodings
            .iter()
            .map(|e| &e.get_ids()[..e.len().min(self.model.max_positions)])
            .collect();
        let mut out = Vec::with_capacity(ids.len());
        let mut start = 0;
        while start < ids.len() {
            let mut end = start + 1;
            let mut tokens = ids[start].len();
            while end < ids.len() && tokens + ids[end].len() <= PASS_TOKENS {
                tokens += ids[end].len();
                end += 1;
            }
            out.extend(self.pass(&ids[start..end]));
            start = end;
        }
        Ok(out)
    }

    /// One forward pass over `texts`, each pooled into a unit vector.
    fn pass(&self, texts: &[&[u32]]) -> Vec<Vec<f32>> {
        let h = self.model.hidden();
        let tokens = self.model.forward(texts);
        let mut rows = tokens.chunks_exact(h);
        texts
            .iter()
            .map(|t| {
                let own: Vec<&[f32]> = rows.by_ref().take(t.len()).collect();
                normalised(pooled(self.pooling, &own, h))
            })
            .collect()
    }
}

/// A text's token vectors as one: their mean, or the first's.
fn pooled(pooling: Pooling, rows: &[&[f32]], h: usize) -> Vec<f32> {
    let mut v = vec![0f32; h];
    let taken = match pooling {
        Pooling::Mean => rows,
        Pooling::Cls => &rows[..rows.len().min(1)],
    };
    for row in taken {
        v.iter_mut().zip(*row).for_each(|(s, x)| *s += x);
    }
    let n = taken.len().max(1) as f32;
    v.iter_mut().for_each(|s| *s /= n);
    v
}

/// `v` at unit length (as sentence-transformers' Normalize: a zero vector
/// stays zero).
fn normalised(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    v.iter_mut().for_each(|x| *x /= norm);
    v
}
