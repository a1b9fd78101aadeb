//! The embedding model: `EmbeddingModel`, and its implementation over a
//! configured upstream's `/v1/embeddings` (OpenAI's shape, floats).

use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde_json::{json, Value};

use super::chat::call;
use super::ModelError;
use crate::proxy::upstream::Upstream;

/// A model that turns texts into vectors, one per text, in order.
pub trait EmbeddingModel: Send + Sync {
    fn name(&self) -> &str;
    fn embed(&self, texts: Vec<String>) -> BoxFuture<'_, Result<Vec<Vec<f32>>, ModelError>>;
}

pub struct UpstreamEmbedding {
    pub upstream: Arc<Upstream>,
    pub model: String,
}

impl EmbeddingModel for UpstreamEmbedding {
    fn name(&self) -> &str {
        &self.model
    }

    fn embed(&self, texts: Vec<String>) -> BoxFuture<'_, Result<Vec<Vec<f32>>, ModelError>> {
        Box::pin(async move {
            let n = texts.len();
            let body = json!({"model": self.model, "input": texts, "encoding_format": "float"});
            let bytes = call(&self.upstream, Some("/embeddings"), &body).await?;
            vectors(&bytes, n)
        })
    }
}

/// The `n` vectors of an embeddings answer, in input order.
pub(crate) fn vectors(body: &[u8], n: usize) -> Result<Vec<Vec<f32>>, ModelError> {
    let bad = |why: String| ModelError::NotEmbeddings(why);
    let v: Value = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
    let data = v["data"]
        .as_array()
        .ok_or_else(|| bad("no `data` list".into()))?;
    if data.len() != n {
        return Err(bad(format!("{} vectors for {n} texts", data.len())));
    }
    let mut out: Vec<Option<Vec<f32>>> = vec![None; n];
    for (i, item) in data.iter().enumerate() {
        let index = item["index"].as_u64().map_or(i, |x| x as usize);
        let vector = item["embedding"]
            .as_array()
            .ok_or_else(|| bad(format!("item {i} has no `embedding` list")))?
            .iter()
            .map(|x| x.as_f64().map(|f| f as f32))
            .collect::<Option<Vec<f32>>>()
            .ok_or_else(|| bad(format!("item {i} holds something other than numbers")))?;
        if vector.is_empty() {
            return Err(bad(format!("item {i} is empty")));
        }
        match out.get_mut(index) {
            Some(slot @ None) => *slot = Some(vector),
            _ => return Err(bad(format!("item {i} has index {index}, out of place"))),
        }
    }
    out.into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| bad("a text has no vector".into()))
}
