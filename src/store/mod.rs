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
pub mod redis;
pub mod sqlite;

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::config::{StorageBackend, StorageConfig};
use crate::memory::message::Message;
use crate::metrics::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("redis: {0}")]
    Redis(#[from] ::redis::RedisError),
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
    /// A writer's own reason for failing a write (no library error).
    #[error("{0}")]
    Failed(String),
    #[error("storage task failed: {0}")]
    Task(String),
}

/// Everything about a session but its messages.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub created_ms: i64,
    pub last_active_ms: i64,
    pub turn_id: u64,
    /// Sequence number of the oldest stored message.
    pub first_seq: u64,
    pub users: Vec<String>,
    pub system_messages: Vec<Message>,
}

/// A session as read back from storage.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub meta: Meta,
    pub messages: Vec<Message>,
}

/// A session in a listing, without its messages.
#[derive(Debug, Clone)]
pub struct Listed {
    pub id: String,
    pub meta: Meta,
    pub message_count: usize,
}

/// One change to a session, applied in order.
#[derive(Debug, Clone)]
pub enum Op {
    /// Creates the session or replaces its meta.
    Save { id: String, meta: Meta },
    /// Updates the fields of a session's meta that move with its turns,
    /// leaving its users and system messages as they are. An upsert: a
    /// session it finds missing is created without users or system
    /// messages, so that what is stored can always be loaded.
    Touch {
        id: String,
        created_ms: i64,
        last_active_ms: i64,
        turn_id: u64,
        first_seq: u64,
    },
    /// Stores a new message under its sequence number.
    Push {
        id: String,
        seq: u64,
        message: Arc<Message>,
    },
    /// Replaces a stored message.
    Set {
        id: String,
        seq: u64,
        message: Arc<Message>,
    },
    /// What a drain or a break learnt of an interrupted reply after its
    /// record was written (`original`, `original_complete`,
    /// `original_tool_calls`, `error`): `message` is the reply with them.
    /// By then another replica may hold the session and have changed the
    /// message, so shared storage keeps these fields beside it and merges
    /// them in on load, rather than replace the message.
    SetLate {
        id: String,
        seq: u64,
        message: Arc<Message>,
    },
    /// Drops messages older than `seq` (the oldest was `from`).
    DropBefore { id: String, from: u64, seq: u64 },
    /// Drops every message.
    Clear { id: String },
    /// Forgets the session (and that these users spoke in it).
    Delete { id: String, users: Vec<String> },
    /// Gives up a session's lease (shared storage only), after the writes
    /// queued before it.
    Release { id: String, token: String },
    /// Keeps a webhook event that could not be delivered, to try again
    /// after a restart.
    KeepEvent { id: String, body: String },
    /// Forgets a kept event (delivered at last).
    ForgetEvent { id: String },
    /// The session's memory was just rebuilt from what storage holds (or
    /// started anew): its writes apply again after a failed one (see
    /// `Fences`). Writes nothing.
    Resume { id: String },
}

impl Op {
    /// The session whose stored data this op changes (not a lease or a
    /// webhook event).
    pub fn session(&self) -> Option<&str> {
        match self {
            Op::Save { id, .. }
            | Op::Touch { id, .. }
            | Op::Push { id, .. }
            | Op::Set { id, .. }
            | Op::SetLate { id, .. }
            | Op::DropBefore { id, .. }
            | Op::Clear { id }
            | Op::Delete { id, .. }
            | Op::Resume { id } => Some(id),
            Op::Release { .. } | Op::KeepEvent { .. } | Op::ForgetEvent { .. } => None,
        }
    }
}

/// Resolves when the ops it was issued for are durable (or failed).
#[derive(Debug, Default)]
pub struct Ticket(Vec<oneshot::Receiver<Result<(), String>>>);

impl Ticket {
    pub fn ready() -> Self {
        Ticket(Vec::new())
    }

    pub(crate) fn pending(rx: oneshot::Receiver<Result<(), String>>) -> Self {
        Ticket(vec![rx])
    }

    /// Resolves when both are durable.
    pub fn and(mut self, other: Ticket) -> Self {
        self.0.extend(other.0);
        self
    }

    pub async fn durable(self) -> Result<(), StorageError> {
        for rx in self.0 {
            match rx.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(StorageError::NotStored(e)),
                Err(_) => return Err(StorageError::Stopped),
            }
        }
        Ok(())
    }

    /// The same, as a boxed future a hand-written `Stream` can poll.
    pub fn boxed(self) -> Pin<Box<dyn Future<Output = Result<(), StorageError>> + Send>> {
        Box::pin(self.durable())
    }
}

/// A batch of ops and whom to tell when it is durable. A batch is one
/// change of one session (`Session::persist`), a lease's release, or a
/// webhook event's: the writers apply it whole or not at all.
pub(crate) struct Batch {
    pub ops: Vec<Op>,
    pub done: Option<oneshot::Sender<Result<(), String>>>,
}

impl Batch {
    /// The session whose data it changes, if any.
    pub fn session(&self) -> Option<&str> {
        self.ops.iter().find_map(Op::session)
    }

    /// Whether it may be applied to a fenced session: it starts over from
    /// what storage holds (`Resume`) or forgets the session (`Delete`).
    fn lifts_fence(&self) -> bool {
        matches!(
            self.ops.iter().find(|op| op.session().is_some()),
            Some(Op::Resume { .. } | Op::Delete { .. })
        )
    }
}

/// Sessions a write failed for, kept by the backend's writer.
///
/// Storage must hold a prefix of each session's changes, in order: after
/// one of them fails, the later ones (queued meanwhile from a memory that
/// already holds the failed change) are refused too, or storage would hold
/// a reply without its user message, or messages without the session's
/// row. The session store sees the fence (`Storage::needs_reload`),
/// reloads the session from storage before it serves it again, and the
/// session's next write begins with `Op::Resume`, which lifts the fence.
#[derive(Default)]
pub(crate) struct Fences {
    /// `ids.len()`, read without the lock on the request path.
    count: AtomicUsize,
    ids: Mutex<HashSet<String>>,
}

impl Fences {
    fn ids(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.ids.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn contains(&self, id: &str) -> bool {
        self.count.load(Ordering::Acquire) > 0 && self.ids().contains(id)
    }

    pub fn insert(&self, id: &str) {
        let mut ids = self.ids();
        if ids.insert(id.to_owned()) {
            self.count.store(ids.len(), Ordering::Release);
        }
    }

    pub fn remove(&self, id: &str) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut ids = self.ids();
        if ids.remove(id) {
            self.count.store(ids.len(), Ordering::Release);
        }
    }

    /// Whether a batch may be applied now: refused, with the reason, when
    /// its session is fenced and it does not lift the fence.
    pub fn admits(&self, batch: &Batch) -> Result<(), String> {
        match batch.session() {
            Some(id) if !batch.lifts_fence() && self.contains(id) => Err(format!(
                "an earlier write of session `{id}` failed, and this later change was \
                 refused with it; the session is reloaded from storage before its next request"
            )),
            _ => Ok(()),
        }
    }

    /// After a batch is applied (or failed): a failure fences its
    /// session, a `Resume` or `Delete` that went through lifts the fence.
    pub fn settled(&self, batch: &Batch, result: &Result<(), String>) {
        if let Some(id) = batch.session() {
            match result {
                Err(_) => self.insert(id),
                Ok(()) if batch.lifts_fence() => self.remove(id),
                Ok(()) => {}
            }
        }
    }
}

/// The faults tests inject; without the `fault-injection` feature, none.
#[cfg(not(feature = "fault-injection"))]
#[derive(Default)]
pub(crate) struct Faults;

#[cfg(not(feature = "fault-injection"))]
impl Faults {
    #[inline]
    pub fn round_fails(&self, _: usize) -> bool {
        false
    }

    #[inline]
    pub fn is_paused(&self) -> bool {
        false
    }

    #[inline]
    pub fn batch_fails(&self, _: &Batch) -> bool {
        false
    }
}

#[cfg(feature = "fault-injection")]
pub(crate) use faults::Faults;

/// A writer's round: `first` and whatever else has queued up behind it,
/// up to about `max_ops` ops (group commit).
pub(crate) fn gather(
    first: Batch,
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Batch>,
    max_ops: usize,
) -> (Vec<Batch>, usize) {
    let mut ops = first.ops.len();
    let mut batches = vec![first];
    while ops < max_ops {
        match rx.try_recv() {
            Ok(b) => {
                ops += b.ops.len();
                batches.push(b);
            }
            Err(_) => break,
        }
    }
    (batches, ops)
}

/// Tells each waiter of a round how its batch went.
pub(crate) fn settle(batches: Vec<Batch>, results: Vec<Result<(), String>>) {
    for (b, result) in batches.into_iter().zip(results) {
        if let Some(done) = b.done {
            let _ = done.send(result);
        }
    }
}

pub enum Storage {
    /// Nothing survives a restart.
    Memory,
    Sqlite(sqlite::Sqlite),
    /// Shared by several replicas.
    Redis(redis::Redis),
}

pub use self::redis::Wait;

/// The right to change a session: with shared storage, its lease; with a
/// process of its own, nothing (the session's own lock is enough).
#[derive(Debug)]
pub struct Claim(Option<redis::Lease>);

/// The right to send a kept webhook event: with shared storage, a lease on
/// it, renewed while held, that lapses if this process dies; with a process
/// of its own, nothing.
#[derive(Debug)]
pub struct EventClaim(Option<redis::Lease>);

impl EventClaim {
    /// Whether the claim lapsed and another replica may be sending the
    /// event now.
    pub fn lost(&self) -> bool {
        self.0.as_ref().is_some_and(redis::Lease::lost)
    }
}

/// What claiming a kept event found.
#[derive(Debug)]
pub enum KeptClaim {
    /// This process may send it.
    Ours(EventClaim),
    /// Another replica is sending it; its claim lapses in about this long
    /// unless renewed.
    Theirs(std::time::Duration),
}

impl Storage {
    /// Opens the configured backend; its writer reports each group
    /// commit's duration to `metrics`.
    pub async fn open(
        config: &StorageConfig,
        metrics: &Metrics,
    ) -> Result<Arc<Self>, StorageError> {
        Ok(Arc::new(match config.backend {
            StorageBackend::Memory => Storage::Memory,
            StorageBackend::Sqlite => Storage::Sqlite(
                sqlite::Sqlite::open(config, metrics.storage_writes("sqlite")).await?,
            ),
            StorageBackend::Redis => {
                Storage::Redis(redis::Redis::open(config, metrics.storage_writes("redis")).await?)
            }
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
                self.flush().await?;
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

    /// Webhook events kept undelivered: their ids and bodies.
    pub async fn kept_events(&self) -> Result<Vec<(String, String)>, StorageError> {
        self.flush().await?;
        match self {
            Storage::Memory => Ok(Vec::new()),
            Storage::Sqlite(s) => s.kept_events().await,
            Storage::Redis(r) => r.kept_events().await,
        }
    }

    /// One kept event's body, if it is still kept (not delivered by now).
    /// Waits for queued writes first, so that an event kept a moment ago
    /// is found.
    pub async fn kept_event(&self, id: &str) -> Result<Option<String>, StorageError> {
        self.flush().await?;
        match self {
            Storage::Memory => Ok(None),
            Storage::Sqlite(s) => s.kept_event(id).await,
            Storage::Redis(r) => r.kept_event(id).await,
        }
    }

    /// Claims a kept event for sending, so that one replica at a time
    /// sends it.
    pub async fn claim_kept_event(&self, id: &str) -> Result<KeptClaim, StorageError> {
        match self {
            Storage::Redis(r) => Ok(match r.claim_event(id).await? {
                Ok(lease) => KeptClaim::Ours(EventClaim(Some(lease))),
                Err(left) => KeptClaim::Theirs(left),
            }),
            // One process per store: the webhook's own bookkeeping keeps
            // it from sending an event twice at once.
            _ => Ok(KeptClaim::Ours(EventClaim(None))),
        }
    }

    /// Gives up a kept event's claim (after the event was forgotten, if it
    /// was delivered, so that nobody who claims it next finds it kept).
    pub async fn release_kept_event(&self, claim: EventClaim) -> Result<(), StorageError> {
        match (self, claim.0) {
            (Storage::Redis(r), Some(lease)) => r.release_event(lease).await,
            _ => Ok(()),
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
