//! Sessions: each one's history, its current turn, and the reply in flight.
//!
//! All of a session's state sits behind one short-lived sync lock, held
//! only to read or change the history, never across an await. Turns are
//! serialised by the `active` slot: a request claims it when it appends its
//! messages, and the reply's `InFlight` gives it up when the reply is
//! recorded (complete, interrupted or failed). A request that finds the slot
//! taken interrupts that reply (barge-in) or is rejected, as configured;
//! it never waits for the old reply's upstream to be drained.
//!
//! Every change to a session is made here, under its lock: a reply's
//! record too. The reply in flight decides what its record is
//! (`InFlight::settle` returns a `Record`); `settle_reply` applies it.
//!
//! Here: the `Session` and its `Policy`. `state` is what sits behind the
//! lock; `turn` opens a turn (settle, reconcile, append, trim, window);
//! `record` writes a reply's record; `persist` sends changes to storage
//! and recovers from a failed write; `reply` is the relay's handle on the
//! reply in flight; `admin` is what the session API does; `store` is the
//! map of sessions.

mod admin;
mod console;
mod items;
mod long_term;
mod persist;
mod record;
mod remember;
mod reply;
mod state;
mod store;
mod turn;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub use crate::memory::long_term::session::{ExtractNow, Extraction, LongTermDue, Query, Recall};
pub use admin::{Appended, EndWhen, Ended, Overview};
pub use console::{Glance, Seen};
pub use record::Interrupted;
pub use remember::{Applied, FoldNow};
pub use reply::Reply;
pub use store::Store;
pub use turn::{Joins, Prepared, Refused, TurnRequest};

use state::State;

use crate::clock::Clock;
use crate::config::{HistoryConfig, LongTermConfig, MemoryConfig, OnNewRequest};
use crate::memory::message::Message;
use crate::metrics::Metrics;
use crate::store::{Loaded, Meta, Storage};
use crate::webhook::Notifier;

pub use recall_core::memory::session_id::{validate_id, MAX_ID_LEN};

/// The parts of the config that govern memory, shared by every session.
pub struct Policy {
    pub history: HistoryConfig,
    /// The running summary and carry-over (`[memory]`).
    pub memory: MemoryConfig,
    /// Long-term memory (`[long_term]`).
    pub long_term: LongTermConfig,
    pub on_new_request: OnNewRequest,
    /// `[interruption] barge_in_after_close_ms`: how soon after its client
    /// closed a reply's stream a new request makes that cut a barge-in.
    pub barge_in_after_close_ms: u64,
    pub metrics: Arc<Metrics>,
    pub notifier: Arc<dyn Notifier>,
    pub storage: Arc<Storage>,
    /// What sessions and records read the time from.
    pub clock: Clock,
}

pub struct Session {
    pub id: String,
    pub created_ms: i64,
    last_active_ms: AtomicI64,
    /// The sequence number of a reply its client closed whose cause is not
    /// counted yet (`record::UNCOUNTED` when none): the session's next
    /// request says whether it was a barge-in. Beside the state, so that a
    /// reload from shared storage keeps it.
    uncounted_close: AtomicU64,
    state: Mutex<State>,
}

/// A copy of a session's memory.
#[derive(Debug, Clone)]
pub struct History {
    pub turn_id: u64,
    pub messages: Vec<Arc<Message>>,
    /// The sequence number of `messages[0]`.
    pub first_seq: u64,
    /// A reply is in flight.
    pub in_flight: bool,
}

/// Messages as a session holds them. Not `collect()`: that reuses the
/// `Vec<Message>`'s buffer in place, and a session would keep 14 times the
/// capacity it needs (2 KiB for 20 messages) for as long as it lives.
pub(crate) fn shared(messages: Vec<Message>) -> Vec<Arc<Message>> {
    let mut out = Vec::with_capacity(messages.len());
    out.extend(messages.into_iter().map(Arc::new));
    out
}

/// A number no other session history in this process has had: what the
/// answer cache keys a session's answers by, so that a reset or a reused
/// id never serves answers from an earlier conversation.
fn next_incarnation() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Session {
    fn new(id: &str, now_ms: i64) -> Self {
        Self {
            id: id.to_owned(),
            created_ms: now_ms,
            last_active_ms: AtomicI64::new(now_ms),
            uncounted_close: AtomicU64::new(record::UNCOUNTED),
            state: Mutex::new(State::new(Meta::default())),
        }
    }

    /// A session read back from storage.
    fn from_loaded(id: &str, loaded: Loaded) -> Self {
        Self {
            id: id.to_owned(),
            created_ms: loaded.meta.created_ms,
            last_active_ms: AtomicI64::new(loaded.meta.last_active_ms),
            uncounted_close: AtomicU64::new(record::UNCOUNTED),
            state: Mutex::new(State::loaded(loaded)),
        }
    }

    /// Messages held in memory (for the metrics).
    pub fn message_count(&self) -> usize {
        self.state().messages.len()
    }

    pub fn touch(&self, now_ms: i64) {
        self.last_active_ms.fetch_max(now_ms, Ordering::Relaxed);
    }

    pub fn last_active_ms(&self) -> i64 {
        self.last_active_ms.load(Ordering::Relaxed)
    }

    /// A reply is in flight: the session is not idle whatever the clock says.
    pub fn is_busy(&self) -> bool {
        self.state().active.is_some()
    }

    /// The place under `max_concurrent_upstream` of the reply in flight
    /// here, if any: a request that will cut the reply claims it.
    pub fn reply_place(&self) -> Option<Arc<crate::proxy::gate::Place>> {
        self.state().active.as_ref()?.place().cloned()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every change under this lock is a push, a drain or a field
        // update, so a panic elsewhere cannot leave it half done: go on.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn snapshot(&self) -> History {
        let st = self.state();
        History {
            turn_id: st.turn_id,
            messages: st.messages.clone(),
            first_seq: st.first_seq,
            in_flight: st.active.is_some(),
        }
    }

    /// A session outside the store, whose changes go where its policy's
    /// storage sends them: a turn that records nothing runs in one.
    pub fn unstored(id: &str, now_ms: i64) -> Arc<Self> {
        Arc::new(Self::new(id, now_ms))
    }

    /// What a response continuing from `after` (else from the newest
    /// message) would see, read without changing anything; `None` if
    /// there is no such response here.
    pub fn branch(&self, after: Option<&str>) -> Option<Vec<Arc<Message>>> {
        let st = self.state();
        let end = match after {
            None => st.messages.len(),
            Some(id) => crate::memory::chain::find(&st.messages, id)?.output.end,
        };
        Some(st.messages[..end].to_vec())
    }

    /// Replaces the local copy with what shared storage holds, unless a
    /// reply is in flight here (then this process holds the session and
    /// its copy is the newest). `batches` is `Session::batches` from before `loaded` was read: if
    /// this session wrote anything since, what was read may be older than
    /// memory, and nothing is replaced (returns false: read again).
    pub fn reload(&self, loaded: Loaded, batches: u64) -> bool {
        let mut st = self.state();
        if st.active.is_some() || st.ended {
            return true;
        }
        if st.saved.batches != batches {
            return false;
        }
        self.last_active_ms
            .fetch_max(loaded.meta.last_active_ms, Ordering::Relaxed);
        let folds = st.folds();
        *st = State::loaded(loaded);
        st.saved.batches = batches;
        // A fold under way, or its answer, survives: whether it still
        // holds is checked against what was loaded when it is stored.
        st.resume_folds(folds);
        true
    }
}

#[cfg(test)]
mod tests;
