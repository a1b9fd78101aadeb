//! A session's state behind its lock, and the one way each of its fields
//! changes (so that `bytes` and `saved` stay true).

use std::sync::Arc;

use super::{next_incarnation, shared};
use crate::memory::inflight::InFlight;
use crate::memory::interruption;
use crate::memory::message::Message;
use crate::memory::summary::{Folded, Remembered};
use crate::store::{Claim, Loaded, Meta};

use crate::memory::long_term::session::LongTermState;

/// What a session's state holds of this process's work, not stored.
pub(super) struct Unstored {
    folding: bool,
    fold_after_ms: i64,
    pending: Option<Box<Folded>>,
    long_term: LongTermState,
}

pub(super) struct State {
    pub(super) turn_id: u64,
    /// Shared, so that a window or a storage op is a pointer copy and
    /// dropping old messages moves pointers, not messages.
    pub(super) messages: Vec<Arc<Message>>,
    /// Sequence number of `messages[0]`: it grows as old messages are
    /// dropped, so a message keeps its number while it is stored.
    pub(super) first_seq: u64,
    pub(super) active: Option<Arc<InFlight>>,
    /// The session's lease with shared storage, held while `active` is
    /// and given up right after the reply's record.
    pub(super) lease: Option<Box<Claim>>,
    /// Per-session instructions, sent after the configured ones.
    pub(super) system_messages: Vec<Message>,
    /// Users seen speaking in this session (the user header).
    pub(super) users: Vec<String>,
    /// The conversation's metadata (`Meta::metadata`).
    pub(super) metadata: serde_json::Map<String, serde_json::Value>,
    /// The running summary and the carried note (`Meta::remembered`).
    pub(super) remembered: Remembered,
    /// A fold of this session runs in this process.
    pub(super) folding: bool,
    /// No fold starts before this (after one gave up).
    pub(super) fold_after_ms: i64,
    /// A fold's answer waiting for a turn's lease to be stored.
    pub(super) pending: Option<Box<Folded>>,
    /// The user's long-term facts this session sends, and its extraction.
    pub(super) long_term: LongTermState,
    /// Set when the session ends; a request still holding it starts anew.
    pub(super) ended: bool,
    pub(super) incarnation: u64,
    /// Where the last window sent upstream began (by sequence number), so
    /// that a trim event is sent when it moves, not on every turn.
    pub(super) window_from: u64,
    /// What the messages hold, by `Message::byte_cost`, kept up to date
    /// with every change so that `max_bytes` never sums a whole history.
    pub(super) bytes: usize,
    /// What storage holds of the meta, so that a turn writes only what it
    /// changed.
    pub(super) saved: Saved,
    /// The last turn's `Idempotency-Key`: the same key again is a retry.
    /// Kept in memory only; an SDK's retry also says so in its headers.
    pub(super) last_key: Option<String>,
    /// Moves on every change of the messages and the meta, so that a
    /// reader (the console's live page) sees a change without comparing.
    pub(super) changes: u64,
}

/// The meta as last sent to storage. Users and system messages can be
/// kilobytes (a long system prompt) and rarely change, so they are written
/// only when they do; the turn number, the first sequence number and the
/// last activity (`Op::Touch`, a small row) once per turn.
///
/// This is what was sent, not what is durable: a write that fails fences
/// the session in storage (`store::Fences`), every later write of this
/// state is refused, and the session is reloaded from storage before it
/// is served again (`Store::find`), which rebuilds this from what storage
/// holds. So nothing here is trusted past a failed write.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Saved {
    /// Users and system messages are stored as they are here.
    pub(super) whole: bool,
    pub(super) turn_id: u64,
    pub(super) first_seq: u64,
    pub(super) last_active_ms: i64,
    /// What this state starts from, which its first write says first.
    pub(super) origin: Origin,
    /// Batches this session has sent to storage: a reload checks that
    /// none was sent while it read.
    pub(super) batches: u64,
    /// The version shared storage holds of the session once those batches
    /// are applied, which the next one expects (`Op::Expect`).
    pub(super) version: u64,
    /// When the stored session this state was read from was created.
    pub(super) created_ms: Option<i64>,
}

/// Where a session's state came from, until its first write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Origin {
    /// Nothing: it has written since.
    #[default]
    Written,
    /// Read from storage: its writes resume (`Op::Resume`).
    Loaded,
    /// Started anew, with nothing loadable in storage: its writes resume,
    /// and messages left there by an earlier session of the same id (a
    /// reply recorded after that session ended) are cleared.
    New,
}

impl State {
    pub(super) fn new(meta: Meta) -> Self {
        Self {
            turn_id: meta.turn_id,
            messages: Vec::new(),
            first_seq: meta.first_seq,
            active: None,
            lease: None,
            system_messages: meta.system_messages,
            users: meta.users,
            metadata: meta.metadata,
            remembered: meta.remembered,
            folding: false,
            fold_after_ms: 0,
            pending: None,
            long_term: LongTermState::default(),
            ended: false,
            incarnation: next_incarnation(),
            window_from: meta.first_seq,
            bytes: 0,
            saved: Saved {
                origin: Origin::New,
                ..Saved::default()
            },
            last_key: None,
            changes: 0,
        }
    }

    /// The newest message that is not superseded.
    pub(super) fn last_visible(&self) -> Option<&Message> {
        self.messages
            .iter()
            .rev()
            .map(|m| &**m)
            .find(|m| !interruption::is_superseded(m))
    }

    /// A session as storage holds it.
    pub(super) fn loaded(loaded: Loaded) -> Self {
        let Loaded {
            meta,
            messages,
            version,
        } = loaded;
        let (last_active_ms, created_ms) = (meta.last_active_ms, meta.created_ms);
        let mut st = Self::new(meta);
        st.replace_messages(shared(messages));
        st.saved = Saved {
            whole: true,
            turn_id: st.turn_id,
            first_seq: st.first_seq,
            last_active_ms,
            origin: Origin::Loaded,
            batches: 0,
            version,
            created_ms: Some(created_ms),
        };
        st
    }

    /// What this process is doing about the running summary: kept across
    /// a reload from storage (`resume_folds`).
    /// And so is what it holds of long-term memory.
    pub(super) fn folds(&mut self) -> Unstored {
        Unstored {
            folding: self.folding,
            fold_after_ms: self.fold_after_ms,
            pending: self.pending.take(),
            long_term: std::mem::take(&mut self.long_term),
        }
    }

    pub(super) fn resume_folds(&mut self, kept: Unstored) {
        self.folding = kept.folding;
        self.fold_after_ms = kept.fold_after_ms;
        self.pending = kept.pending;
        self.long_term = kept.long_term;
        if self.remembered.forgotten {
            // Deleted on another replica meanwhile.
            self.long_term.forget();
        }
    }

    /// Makes user `key` the one the session is carried into when it ends,
    /// unless it has one, or its user's memory was deleted meanwhile.
    pub(super) fn carried_into(&mut self, key: &str) {
        if self.remembered.user.is_none() && !self.remembered.forgotten {
            self.remembered.user = Some(key.to_owned());
            self.meta_changed();
        }
    }

    /// Users or system messages changed: the next write carries them.
    pub(super) fn meta_changed(&mut self) {
        self.changes += 1;
        self.saved.whole = false;
    }

    // Every change to `messages` goes through these, which keep `bytes`.

    pub(super) fn replace_messages(&mut self, messages: Vec<Arc<Message>>) -> Vec<Arc<Message>> {
        self.changes += 1;
        self.bytes = messages.iter().map(|m| m.byte_cost()).sum();
        std::mem::replace(&mut self.messages, messages)
    }

    pub(super) fn push_message(&mut self, m: Arc<Message>) {
        self.changes += 1;
        self.bytes += m.byte_cost();
        self.messages.push(m);
    }

    pub(super) fn extend_messages(&mut self, new: impl IntoIterator<Item = Message>) {
        for m in new {
            self.push_message(Arc::new(m));
        }
    }

    pub(super) fn drop_oldest(&mut self, n: usize) {
        self.changes += 1;
        let gone: usize = self.messages[..n].iter().map(|m| m.byte_cost()).sum();
        self.bytes = self.bytes.saturating_sub(gone);
        self.messages.drain(..n);
    }

    pub(super) fn clear_messages(&mut self) {
        self.changes += 1;
        self.bytes = 0;
        self.messages.clear();
    }

    /// Changes the message at `index` (copied first if a window or a
    /// storage op still shares it).
    pub(super) fn edit_message<T>(
        &mut self,
        index: usize,
        change: impl FnOnce(&mut Message) -> T,
    ) -> T {
        self.changes += 1;
        let m = Message::edit(&mut self.messages[index]);
        let before = m.byte_cost();
        let out = change(m);
        let after = m.byte_cost();
        self.bytes = (self.bytes + after).saturating_sub(before);
        out
    }
}

/// A Touch is written at most this long after the last one, besides once
/// per turn: the end of a long reply is activity too.
pub(super) const TOUCH_AFTER_MS: i64 = 1000;

#[cfg(test)]
mod layout {
    /// Every session in memory is an `Arc<Session>`: at 464 bytes (480
    /// with the Arc's counts) it takes mimalloc's 512-byte class. The
    /// fields few sessions use (a fold's pending answer, a lease, the
    /// running summary, long-term recall) are boxed to keep it there: at
    /// 848 bytes it took the 896-byte class, and 100,000 sessions went over
    /// the memory budget in BENCHMARKS.md.
    #[test]
    fn a_session_fits_a_512_byte_allocation() {
        let size = std::mem::size_of::<crate::memory::session::Session>();
        assert!(size + 16 <= 512, "Session is {size} bytes");
    }
}
