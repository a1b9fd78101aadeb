//! The models recall calls for itself, off the hot path: a chat model
//! (summaries, notes, fact extraction) and an embedding model (long-term
//! memory), each behind a small trait with an implementation over a
//! configured upstream; how an answer of a shape is asked for
//! (`structured`); and the `Runner` their jobs share: a global limit,
//! a timeout per call, attempts with a doubling pause, and each call in
//! the background class under its upstream's `max_concurrent`. With
//! the `local-embedder` feature, `local` is an embedding model run in
//! process.

mod background;
mod chat;
mod embedding;
#[cfg(feature = "local-embedder")]
pub mod local;
mod runner;
pub mod structured;

pub use chat::{Answer, Ask, ChatModel, ModelError, UpstreamChat};
pub use embedding::{EmbeddingModel, UpstreamEmbedding};
pub use runner::{Runner, RunnerLimits};
