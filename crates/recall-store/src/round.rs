//! A writer's round: the batches it takes (group commit), the `Ticket`s
//! that tell their waiters how it went, and the fences that keep a
//! session's later writes out after one of its writes failed.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use tokio::sync::oneshot;

use super::*;

/// Why a writer did not take a batch durably.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Nothing of it was written: why.
    NotStored(String),
    /// Written on the node, but fewer of its replicas than required have
    /// it: a failover may lose it.
    NotReplicated(String),
}

impl From<String> for Refused {
    fn from(why: String) -> Self {
        Refused::NotStored(why)
    }
}

impl From<&str> for Refused {
    fn from(why: &str) -> Self {
        Refused::NotStored(why.to_owned())
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::NotStored(why) | Refused::NotReplicated(why) => f.write_str(why),
        }
    }
}

/// How a writer took one batch.
pub type Outcome = Result<(), Refused>;

/// Resolves when the ops it was issued for are durable (or failed).
#[derive(Debug, Default)]
pub struct Ticket(Vec<oneshot::Receiver<Outcome>>);

impl Ticket {
    pub fn ready() -> Self {
        Ticket(Vec::new())
    }

    /// Already refused, for `why`.
    pub(crate) fn failed(why: &str) -> Self {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(Err(why.into()));
        Ticket(vec![rx])
    }

    pub(crate) fn pending(rx: oneshot::Receiver<Outcome>) -> Self {
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
                Ok(Err(Refused::NotStored(e))) => return Err(StorageError::NotStored(e)),
                Ok(Err(Refused::NotReplicated(e))) => return Err(StorageError::NotReplicated(e)),
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
    pub done: Option<oneshot::Sender<Outcome>>,
    /// For a flush (no ops): the one key whose earlier writes it waits for
    /// (a session's id, or a key of its own), where the writer can tell;
    /// `None` waits for every earlier write.
    pub after: Option<String>,
}

impl Batch {
    /// The session whose data it changes, if any.
    pub fn session(&self) -> Option<&str> {
        self.ops.iter().find_map(Op::session)
    }

    /// Whether it may be applied to a fenced session: it starts over from
    /// what storage holds (`Resume`) or forgets the session (`Delete`),
    /// whatever it expects first.
    pub(crate) fn lifts_fence(&self) -> bool {
        matches!(
            self.ops
                .iter()
                .find(|op| op.session().is_some() && !matches!(op, Op::Expect { .. })),
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
    pub fn admits(&self, batch: &Batch) -> Outcome {
        match batch.session() {
            Some(id) if !batch.lifts_fence() && self.contains(id) => Err(format!(
                "an earlier write of session `{id}` failed, and this later change was \
                 refused with it; the session is reloaded from storage before its next request"
            )
            .into()),
            _ => Ok(()),
        }
    }

    /// After a batch is applied (or failed): a failure fences its
    /// session, a `Resume` or `Delete` that went through lifts the fence.
    pub fn settled(&self, batch: &Batch, result: &Outcome) {
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

/// The end of a writer's round of `ops` ops: failures are logged, the
/// failed sessions fenced (and the others' fences lifted where their
/// write says so), and each waiter told how its batch went.
pub(crate) fn settle(
    backend: &str,
    ops: usize,
    fences: &Fences,
    batches: Vec<Batch>,
    results: Vec<Outcome>,
) {
    let failed = results.iter().filter(|r| r.is_err()).count();
    if failed > 0 {
        tracing::error!(
            backend,
            ops,
            batches = batches.len(),
            failed,
            "storage writes failed"
        );
    }
    for (b, r) in batches.iter().zip(&results) {
        fences.settled(b, r);
    }
    for (b, result) in batches.into_iter().zip(results) {
        if let Some(done) = b.done {
            let _ = done.send(result);
        }
    }
}
