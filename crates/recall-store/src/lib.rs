//! Durable memory behind the in-process working set.
//!
//! Sessions change in memory, under their own lock, and every change is
//! also sent here as a list of `Op`s, in order. A backend's writer applies
//! them in batches (one transaction, one sync, many messages: group
//! commit), so the request path never waits on a disk sync per message.
//! What a client is about to be told waits on the `Ticket` of the change it
//! depends on: a user message is durable before its upstream call, a reply
//! before its `[DONE]` or body is released.

#[cfg(feature = "fault-injection")]
pub mod faults;
mod kept;
mod notes;
mod op;
mod records;
pub mod redis;
mod round;
pub mod sqlite;

pub use kept::{KeptClaim, Taken};
pub use notes::{note_changed, Notes};
pub use op::{Kept, KeptChange, Listed, Loaded, Meta, Op};
pub use records::{Held, Records};
pub(crate) use round::{gather, settle, Batch, Faults, Fences};
pub use round::{Outcome, Refused, Ticket};

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use recall_core::config::{StorageBackend, StorageConfig};

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    /// A Redis command that failed on a known node.
    #[error("Redis node {node} {why}")]
    Node { node: String, why: String },
    #[error("cannot create {path}: {source}")]
    Dir {
        path: String,
        source: std::io::Error,
    },
    #[error("stored data is not valid: {0}")]
    Corrupt(String),
    #[error("the storage writer has stopped")]
    Stopped,
    /// A write the writer could not make durable (its reason).
    #[error("not stored: {0}")]
    NotStored(String),
    /// A write the node took but too few of its replicas did in time.
    #[error("{0}")]
    NotReplicated(String),
    /// A writer's own reason for failing a write (no library error).
    #[error("{0}")]
    Failed(String),
    #[error("storage task failed: {0}")]
    Task(String),
}

pub enum Storage {
    /// Nothing survives a restart.
    Memory,
    Sqlite(sqlite::Sqlite),
    /// Shared by several replicas.
    Redis(redis::Redis),
}

pub use self::redis::Wait;

/// Where the writers report: the server's metrics registry, which this
/// crate does not know.
pub trait StorageMetrics {
    /// The histogram of one backend's group commits, in seconds.
    fn storage_writes(&self, backend: &'static str) -> Histogram;
    /// Writes a Redis node took but too few of its replicas acknowledged.
    fn storage_not_replicated(&self) -> Counter;
}

impl<M: StorageMetrics> StorageMetrics for Arc<M> {
    fn storage_writes(&self, backend: &'static str) -> Histogram {
        (**self).storage_writes(backend)
    }
    fn storage_not_replicated(&self) -> Counter {
        (**self).storage_not_replicated()
    }
}

/// The right to change a session: with shared storage, its lease; with a
/// process of its own, nothing (the session's own lock is enough).
#[derive(Debug)]
pub struct Claim(Option<redis::Lease>);

impl Storage {
    /// Opens the configured backend; its writer reports each group
    /// commit's duration to `metrics`.
    pub async fn open(
        config: &StorageConfig,
        metrics: &impl StorageMetrics,
    ) -> Result<Arc<Self>, StorageError> {
        Ok(Arc::new(match config.backend {
            StorageBackend::Memory => Storage::Memory,
            StorageBackend::Sqlite => Storage::Sqlite(
                sqlite::Sqlite::open(config, metrics.storage_writes("sqlite")).await?,
            ),
            StorageBackend::Redis => Storage::Redis(
                redis::Redis::open(
                    config,
                    metrics.storage_writes("redis"),
                    metrics.storage_not_replicated(),
                )
                .await?,
            ),
        }))
    }

    /// Whether sessions live beyond this process (and so are looked up,
    /// listed and expired through the backend).
    pub fn persistent(&self) -> bool {
        !matches!(self, Storage::Memory)
    }

    /// Whether other processes share these sessions.
    pub fn shared(&self) -> bool {
        matches!(self, Storage::Redis(_))
    }

    /// Queues ops; the ticket resolves when they are durable.
    pub fn submit(&self, ops: Vec<Op>) -> Ticket {
        match self {
            Storage::Memory => Ticket::ready(),
            Storage::Sqlite(s) => s.submit(ops),
            Storage::Redis(r) => r.submit(ops),
        }
    }

    /// Takes the right to change session `id`. `None` when another replica
    /// holds it (after asking it to stop, if `wait` says so).
    pub async fn claim(&self, id: &str, wait: Wait) -> Result<Option<Claim>, StorageError> {
        match self {
            Storage::Redis(r) => Ok(r.claim(id, wait).await?.map(|l| Claim(Some(l)))),
            _ => Ok(Some(Claim(None))),
        }
    }

    /// Gives a claim up once the writes queued before it are done.
    pub fn release(&self, claim: Claim) -> Ticket {
        match claim.0 {
            Some(lease) => self.submit(vec![lease.release_op()]),
            None => Ticket::ready(),
        }
    }

    /// Whether a write of session `id` failed: its local copy may hold
    /// changes storage does not, and is reloaded before it is served
    /// again (`session::Store::find`).
    pub fn needs_reload(&self, id: &str) -> bool {
        match self {
            Storage::Memory => false,
            Storage::Sqlite(s) => s.fences.contains(id),
            Storage::Redis(r) => r.fences.contains(id),
        }
    }

    /// The test hooks that make chosen writes fail (none with memory).
    #[cfg(feature = "fault-injection")]
    pub fn faults(&self) -> Option<&faults::Faults> {
        match self {
            Storage::Memory => None,
            Storage::Sqlite(s) => Some(&s.faults),
            Storage::Redis(r) => Some(&r.faults),
        }
    }

    /// Whether the local copy of a session is current. Only shared storage
    /// can change behind this process's back.
    pub async fn is_fresh(&self, id: &str) -> Result<bool, StorageError> {
        match self {
            Storage::Redis(r) => r.is_fresh(id).await,
            _ => Ok(true),
        }
    }

    /// What to do when another replica asks this one to interrupt a reply.
    pub fn on_interrupt(&self, f: redis::OnInterrupt) {
        if let Storage::Redis(r) = self {
            r.on_interrupt(f);
        }
    }

    /// Resolves when everything submitted so far is durable.
    pub async fn flush(&self) -> Result<(), StorageError> {
        self.submit(Vec::new()).durable().await
    }

    /// Reads a session back. Waits for queued writes first, so that a
    /// session ended a moment ago is not read back to life.
    pub async fn load(&self, id: &str) -> Result<Option<Loaded>, StorageError> {
        match self {
            Storage::Memory => Ok(None),
            Storage::Sqlite(s) => {
                self.flush().await?;
                s.load(id).await
            }
            Storage::Redis(r) => {
                // This session's writes only: another node's stall must
                // not hold up a read of a session on this one.
                r.flush_of(id.to_owned()).durable().await?;
                r.load(id).await
            }
        }
    }

    /// Sessions in id order after `after`, at most `limit`, optionally only
    /// those `user` spoke in.
    pub async fn list(
        &self,
        after: Option<&str>,
        limit: usize,
        user: Option<&str>,
    ) -> Result<Vec<Listed>, StorageError> {
        self.flush().await?;
        match self {
            Storage::Memory => Ok(Vec::new()),
            Storage::Sqlite(s) => s.list(after, limit, user).await,
            Storage::Redis(r) => r.list(after, limit, user).await,
        }
    }

    pub async fn count(&self) -> Result<usize, StorageError> {
        self.flush().await?;
        match self {
            Storage::Memory => Ok(0),
            Storage::Sqlite(s) => s.count().await,
            Storage::Redis(r) => r.count().await,
        }
    }

    /// Ids of sessions last active before `cutoff_ms`, oldest first.
    pub async fn idle(&self, cutoff_ms: i64, limit: usize) -> Result<Vec<String>, StorageError> {
        self.flush().await?;
        match self {
            Storage::Memory => Ok(Vec::new()),
            Storage::Sqlite(s) => s.idle(cutoff_ms, limit).await,
            Storage::Redis(r) => r.idle(cutoff_ms, limit).await,
        }
    }

    /// Ids of the `n` least recently active sessions, oldest first.
    pub async fn least_active(&self, n: usize) -> Result<Vec<String>, StorageError> {
        self.flush().await?;
        match self {
            Storage::Memory => Ok(Vec::new()),
            Storage::Sqlite(s) => s.idle(i64::MAX, n).await,
            Storage::Redis(r) => r.idle(i64::MAX, n).await,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use prometheus_client::metrics::histogram::exponential_buckets;

    use super::*;

    /// Metrics that nobody reads, for the crate's own tests.
    #[derive(Default)]
    pub(crate) struct Unmeasured;

    impl StorageMetrics for Unmeasured {
        fn storage_writes(&self, _: &'static str) -> Histogram {
            Histogram::new(exponential_buckets(0.0005, 2.0, 4))
        }
        fn storage_not_replicated(&self) -> Counter {
            Counter::default()
        }
    }
}
