//! The built-in embedding model (`embedding_model = "local:<dir>"`): a
//! sentence-transformers BERT folder run in process, so that long-term
//! memory needs no embedding server.
//!
//! The model lives on a thread of its own: inference is seconds of CPU
//! per hundred texts, which must not hold the runtime's worker threads.
//! Calls queue to it; the calls waiting when it takes one are embedded
//! with it, their texts in the same forward passes.

mod bert;
mod encoder;
mod folder;
#[cfg(test)]
mod tests;
mod weights;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::mpsc;

use futures_util::future::BoxFuture;
use tokio::sync::oneshot;

pub use folder::LoadError;

use super::{EmbeddingModel, ModelError};
use encoder::Encoder;

/// Texts of calls gathered into one round of the model, at most (a
/// round's first call is taken whole, however many it has).
const GATHER: usize = 64;

type Vectors = Result<Vec<Vec<f32>>, String>;

/// One call's texts and where its vectors go.
struct Call {
    texts: Vec<String>,
    reply: oneshot::Sender<Vectors>,
}

pub struct LocalEmbedding {
    name: String,
    calls: mpsc::Sender<Call>,
}

impl LocalEmbedding {
    /// Loads the folder at `dir` on the model's thread and answers once it
    /// is ready to embed, or with why it cannot be. `name` is the model as
    /// configured. The thread ends when this is dropped.
    pub async fn start(name: &str, dir: &Path) -> Result<Self, LoadError> {
        let (calls, queue) = mpsc::channel::<Call>();
        let (loaded, ready) = oneshot::channel();
        let owned = dir.to_owned();
        std::thread::Builder::new()
            .name("recall-embedder".into())
            .spawn(move || match Encoder::load(&owned) {
                Ok(encoder) => {
                    let _ = loaded.send(Ok(()));
                    serve(&encoder, &queue);
                }
                Err(e) => {
                    let _ = loaded.send(Err(e));
                }
            })
            .map_err(|e| LoadError::invalid(dir, format!("cannot start its thread: {e}")))?;
        ready
            .await
            .map_err(|_| LoadError::invalid(dir, "stopped while loading"))??;
        tracing::info!(model = name, "local embedding model loaded");
        Ok(Self {
            name: name.to_owned(),
            calls,
        })
    }
}

impl EmbeddingModel for LocalEmbedding {
    fn name(&self) -> &str {
        &self.name
    }

    fn embed(&self, texts: Vec<String>) -> BoxFuture<'_, Result<Vec<Vec<f32>>, ModelError>> {
        Box::pin(async move {
            if texts.is_empty() {
                return Ok(Vec::new());
            }
            let (reply, answer) = oneshot::channel();
            let stopped = || ModelError::Local("the model's thread has stopped".into());
            self.calls
                .send(Call { texts, reply })
                .map_err(|_| stopped())?;
            answer
                .await
                .map_err(|_| stopped())?
                .map_err(ModelError::Local)
        })
    }
}

/// The model's thread: takes the calls waiting, embeds them together and
/// answers each, until the model is dropped.
fn serve(encoder: &Encoder, queue: &mpsc::Receiver<Call>) {
    while let Ok(first) = queue.recv() {
        let mut round = vec![first];
        let mut texts = round[0].texts.len();
        while texts < GATHER {
            let Ok(next) = queue.try_recv() else { break };
            texts += next.texts.len();
            round.push(next);
        }
        // A call that timed out is not waited for any more.
        round.retain(|c| !c.reply.is_closed());
        let all: Vec<&str> = round
            .iter()
            .flat_map(|c| c.texts.iter().map(String::as_str))
            .collect();
        // A panic inside the model fails this round, not every later one.
        let vectors = catch_unwind(AssertUnwindSafe(|| encoder.embed(&all)))
            .unwrap_or(Err(encoder::EncodeError::Panicked));
        match vectors {
            Ok(vectors) => {
                let mut vectors = vectors.into_iter();
                for c in round {
                    let own = vectors.by_ref().take(c.texts.len()).collect();
                    let _ = c.reply.send(Ok(own));
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "the local embedding model failed");
                for c in round {
                    let _ = c.reply.send(Err(e.to_string()));
                }
            }
        }
    }
}
