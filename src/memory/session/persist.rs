//! What a session's changes send to storage: only what changed of its
//! meta, its message ops in order, and the recovery after a failed write.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::state::{Origin, Saved, State, TOUCH_AFTER_MS};
use super::{Policy, Session};
use crate::store::{Loaded, Meta, Op, Storage, Ticket};

impl Session {
    /// When the stored session was created: the one read, if this state
    /// was read (a reload may bring in a session another replica started
    /// under this id), else this one's.
    pub(super) fn born(&self, st: &State) -> i64 {
        st.saved.created_ms.unwrap_or(self.created_ms)
    }

    pub(super) fn meta(&self, st: &State) -> Meta {
        Meta {
            created_ms: self.born(st),
            last_active_ms: self.last_active_ms(),
            turn_id: st.turn_id,
            first_seq: st.first_seq,
            users: st.users.clone(),
            system_messages: st.system_messages.clone(),
            metadata: st.metadata.clone(),
            remembered: st.remembered.clone(),
        }
    }

    /// Sends the changes made under `st` to storage, in the order they
    /// were made, preceded by what changed of the session's meta (the
    /// caller still holds the lock).
    pub(super) fn persist(&self, st: &mut State, policy: &Policy, ops: Vec<Op>) -> Ticket {
        self.write(st, &policy.storage, ops)
    }

    pub(super) fn write(&self, st: &mut State, storage: &Storage, mut ops: Vec<Op>) -> Ticket {
        if !storage.persistent() {
            return Ticket::ready();
        }
        let last_active_ms = self.last_active_ms();
        let since = last_active_ms - st.saved.last_active_ms;
        // A client's message (a user's, a tool result) is a turn: its
        // activity is stored, so that no sweeper (another replica's, or
        // this one's after a restart) takes a session busy in a tool loop
        // for idle.
        let said = ops
            .iter()
            .any(|op| matches!(op, Op::Push { message, .. } if message.role != "assistant"));
        let moved = st.turn_id != st.saved.turn_id
            || st.first_seq != st.saved.first_seq
            || (since > 0 && said)
            || since >= TOUCH_AFTER_MS;
        let mut head = Vec::with_capacity(3);
        if st.saved.origin != Origin::Written {
            head.push(Op::Resume {
                id: self.id.clone(),
            });
        }
        if st.saved.origin == Origin::New {
            head.push(Op::Clear {
                id: self.id.clone(),
            });
        }
        if !st.saved.whole {
            head.push(Op::Save {
                id: self.id.clone(),
                meta: Box::new(self.meta(st)),
            });
        } else if moved {
            head.push(Op::Touch {
                id: self.id.clone(),
                created_ms: self.born(st),
                last_active_ms,
                turn_id: st.turn_id,
                first_seq: st.first_seq,
            });
        }
        if head.is_empty() && ops.is_empty() {
            return Ticket::ready();
        }
        let bumps = head.iter().chain(&ops).any(Op::bumps);
        if bumps {
            // After the Resume, which lifts a fence whatever follows.
            let at = usize::from(matches!(head.first(), Some(Op::Resume { .. })));
            head.insert(at, self.expect(st));
        }
        ops.splice(0..0, head);
        st.saved = Saved {
            whole: true,
            turn_id: st.turn_id,
            first_seq: st.first_seq,
            last_active_ms: if moved || !st.saved.whole {
                last_active_ms
            } else {
                st.saved.last_active_ms
            },
            origin: Origin::Written,
            batches: st.saved.batches + 1,
            version: st.saved.version + u64::from(bumps),
            created_ms: st.saved.created_ms,
        };
        storage.submit(ops)
    }

    /// What the next batch expects of shared storage: the version it
    /// holds if nobody but this session wrote since it was read.
    pub(super) fn expect(&self, st: &State) -> Op {
        Op::Expect {
            id: self.id.clone(),
            version: st.saved.version,
            created_ms: self.born(st),
        }
    }

    /// Batches sent to storage so far (see `recover`).
    pub(crate) fn batches(&self) -> u64 {
        self.state().saved.batches
    }

    /// After a failed write: replaces the local copy with what storage
    /// holds, `loaded`, read after every write queued before it was done.
    /// Not while a reply is in flight, nor if the session wrote anything
    /// since `batches` was read (what was read may be older than that).
    /// With nothing loadable in storage the session ends, so that it is
    /// started anew. Returns whether it did either.
    pub(crate) fn recover(&self, loaded: Option<Loaded>, batches: u64, storage: &Storage) -> bool {
        let mut st = self.state();
        if st.active.is_some() || st.ended || st.saved.batches != batches {
            return false;
        }
        let Some(loaded) = loaded else {
            st.ended = true;
            return true;
        };
        self.last_active_ms
            .fetch_max(loaded.meta.last_active_ms, Ordering::Relaxed);
        let folds = st.folds();
        *st = State::loaded(loaded);
        st.saved.batches = batches;
        st.resume_folds(folds);
        tracing::info!(session = %self.id, "session reloaded from storage after a failed write");
        // Lifts the fence now, not at the next turn's write.
        drop(self.write(&mut st, storage, Vec::new()));
        true
    }

    pub(super) fn push_op(&self, st: &State, index: usize) -> Op {
        Op::Push {
            id: self.id.clone(),
            seq: st.first_seq + index as u64,
            message: Arc::clone(&st.messages[index]),
        }
    }

    pub(super) fn late_op(&self, st: &State, index: usize) -> Op {
        Op::SetLate {
            id: self.id.clone(),
            seq: st.first_seq + index as u64,
            message: Arc::clone(&st.messages[index]),
        }
    }

    pub(super) fn set_op(&self, st: &State, index: usize) -> Op {
        Op::Set {
            id: self.id.clone(),
            seq: st.first_seq + index as u64,
            message: Arc::clone(&st.messages[index]),
        }
    }
}
