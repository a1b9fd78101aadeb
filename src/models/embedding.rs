//! The embedding model: `EmbeddingModel`, and its implementation over a
//! configured upstream's embeddings (the request and the answer's vectors
//! as its protocol writes and reads them).

use std::sync::Arc;

use futures_util::future::BoxFuture;

use super::chat::call;
use super::ModelError;
use crate::config::EmbeddingEncoding;
use crate::proxy::upstream::Upstream;

/// A model that turns texts into vectors, one per text, in order.
pub trait EmbeddingModel: Send + Sync {
    fn name(&self) -> &str;
    fn embed(&self, texts: Vec<String>) -> BoxFuture<'_, Result<Vec<Vec<f32>>, ModelError>>;
}

pub struct UpstreamEmbedding {
    pub upstream: Arc<Upstream>,
    pub model: String,
    pub encoding: EmbeddingEncoding,
}

impl EmbeddingModel for UpstreamEmbedding {
    fn name(&self) -> &str {
        &self.model
    }

    fn embed(&self, texts: Vec<String>) -> BoxFuture<'_, Result<Vec<Vec<f32>>, ModelError>> {
        Box::pin(async move {
            let protocol = self.upstream.protocol;
            let body = protocol.embeddings_body(&self.model, &texts, self.encoding.as_str());
            let bytes = call(&self.upstream, Some(protocol.embeddings_path()), body).await?;
            protocol
                .read_embeddings(&bytes, texts.len())
                .map_err(ModelError::NotEmbeddings)
        })
    }
}
