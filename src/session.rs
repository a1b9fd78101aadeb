//! Sessions: each one's history, its current turn, and the reply in flight.
//!
//! All of a session's state sits behind one short-lived sync lock, held
//! only to read or change the history, never across an await. Turns are
//! serialised by the `active` slot: a request claims it when it appends its
//! messages, and the reply's `InFlight` gives it up when the reply is
//! recorded (complete, interrupted or failed). A request that finds the slot
//! taken interrupts that reply (barge-in) or is rejected, as configured;
//! it never waits for the old reply's upstream to be drained.

use std::sync::{Arc, Mutex, MutexGuard};

use dashmap::DashMap;

use crate::config::{HistoryConfig, OnNewRequest};
use crate::inflight::{InFlight, Recorder};
use crate::interruption::{self, Spoken};
use crate::message::Message;
use crate::metrics::Counters;
use crate::window::{self, Limits};
use crate::{reconcile, turns};

/// Session ids are chosen by clients, so they are checked, never defaulted.
pub fn validate_id(id: &str) -> Result<(), &'static str> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "-_.:@".contains(c);
    if id.is_empty() || id.len() > 128 || !id.chars().all(ok_char) {
        return Err("session id must be 1 to 128 characters of A-Z a-z 0-9 - _ . : @");
    }
    Ok(())
}

/// The parts of the config that govern memory, shared by every session.
#[derive(Debug)]
pub struct Policy {
    pub history: HistoryConfig,
    pub on_new_request: OnNewRequest,
    pub counters: Arc<Counters>,
}

#[derive(Default)]
pub struct Store {
    sessions: DashMap<String, Arc<Session>>,
}

impl Store {
    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.sessions.get(id).map(|s| Arc::clone(&s))
    }

    pub fn get_or_create(&self, id: &str) -> Arc<Session> {
        if let Some(s) = self.get(id) {
            return s;
        }
        Arc::clone(
            &self
                .sessions
                .entry(id.to_owned())
                .or_insert_with(|| Arc::new(Session::new(id))),
        )
    }

    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }
}

pub struct Session {
    pub id: String,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    turn_id: u64,
    messages: Vec<Message>,
    /// Sequence number of `messages[0]`: it grows as old messages are
    /// dropped, so a message keeps its number while it is stored.
    first_seq: u64,
    active: Option<Arc<InFlight>>,
}

/// A copy of a session's memory.
#[derive(Debug, Clone)]
pub struct History {
    pub turn_id: u64,
    pub messages: Vec<Message>,
}

/// What a turn sends upstream, decided when its messages were appended.
#[derive(Debug)]
pub struct Prepared {
    pub turn_id: u64,
    pub window: Vec<Message>,
}

/// The session has a reply in flight and is configured to reject.
#[derive(Debug)]
pub struct Busy;

/// What the interrupt endpoint did.
#[derive(Debug)]
pub enum Interrupted {
    /// The reply in flight was cut off; this is its record.
    InFlight(Message),
    /// The newest stored reply was marked.
    Stored(Message),
    NothingToInterrupt,
}

impl Session {
    fn new(id: &str) -> Self {
        Self {
            id: id.to_owned(),
            state: Mutex::new(State::default()),
        }
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
        }
    }

    /// Opens a turn: settles the reply still in flight (if any), merges the
    /// client's conversation into the history, and decides the window.
    pub fn begin(
        self: &Arc<Self>,
        policy: &Arc<Policy>,
        incoming: &[Message],
        now_ms: i64,
    ) -> Result<(Prepared, Arc<InFlight>), Busy> {
        loop {
            let active = {
                let mut st = self.state();
                match &st.active {
                    Some(active) => Arc::clone(active),
                    None => {
                        let prepared = self.append(&mut st, policy, incoming, now_ms);
                        let recorder = Recorder::new(Arc::clone(self), Arc::clone(policy));
                        let flight = Arc::new(InFlight::new(Some(recorder), prepared.turn_id));
                        st.active = Some(Arc::clone(&flight));
                        return Ok((prepared, flight));
                    }
                }
            };
            // The reply's own lock is taken before the session's, never
            // the other way round: the session lock is released above.
            match policy.on_new_request {
                OnNewRequest::Interrupt => {
                    active.interrupt(None);
                }
                OnNewRequest::Reject => {
                    if !active.settle_if_delivered() {
                        return Err(Busy);
                    }
                }
            }
            self.release(&active);
        }
    }

    fn append(
        &self,
        st: &mut State,
        policy: &Policy,
        incoming: &[Message],
        now_ms: i64,
    ) -> Prepared {
        let found = reconcile::reconcile(&st.messages, incoming);
        for (i, heard) in found.shortened {
            if let Some(m) = st.messages.get_mut(i) {
                interruption::mark_stored(m, Some(&Spoken::Text(heard)), now_ms);
            }
        }
        let mut new = incoming[found.overlap..].to_vec();
        st.turn_id = turns::stamp_client_messages(&mut new, st.turn_id, st.messages.last(), now_ms);
        st.messages.extend(new);
        self.trim(st, policy);

        let limits = Limits {
            messages: policy.history.window_messages,
            chars: policy.history.window_chars,
        };
        let start = window::window_start(&st.messages, limits);
        if start > 0 {
            policy.counters.add_trimmed_sent(start);
            tracing::debug!(session = %self.id, trimmed = start, "window leaves out older messages");
        }
        Prepared {
            turn_id: st.turn_id,
            window: st.messages[start..].to_vec(),
        }
    }

    fn trim(&self, st: &mut State, policy: &Policy) {
        let drop = window::keep_start(&st.messages, policy.history.max_messages);
        if drop > 0 {
            st.messages.drain(..drop);
            st.first_seq += drop as u64;
            policy.counters.add_trimmed_kept(drop);
            tracing::debug!(session = %self.id, dropped = drop, "history over max_messages: oldest dropped");
        }
    }

    /// Stores a reply (if any) and frees the turn slot held by `flight`.
    /// Returns the reply's sequence number.
    pub(crate) fn finish(
        &self,
        flight: &InFlight,
        reply: Option<Message>,
        policy: &Policy,
    ) -> Option<u64> {
        let mut st = self.state();
        let seq = reply.map(|m| {
            st.messages.push(m);
            st.first_seq + st.messages.len() as u64 - 1
        });
        self.trim(&mut st, policy);
        if st
            .active
            .as_deref()
            .is_some_and(|a| std::ptr::eq(a, flight))
        {
            st.active = None;
        }
        seq
    }

    /// Changes a stored message, if it is still stored.
    pub(crate) fn update(&self, seq: u64, change: impl FnOnce(&mut Message)) {
        let mut st = self.state();
        let Some(index) = seq.checked_sub(st.first_seq) else {
            return;
        };
        if let Some(m) = usize::try_from(index)
            .ok()
            .and_then(|i| st.messages.get_mut(i))
        {
            change(m);
        }
    }

    /// Frees the turn slot if `flight` still holds it (it always gives it up
    /// when it records; this guards the loop in `begin` all the same).
    fn release(&self, flight: &Arc<InFlight>) {
        let mut st = self.state();
        if st.active.as_ref().is_some_and(|a| Arc::ptr_eq(a, flight)) {
            st.active = None;
        }
    }

    /// The agent says its user interrupted the bot: cut off the reply in
    /// flight, or mark the newest stored reply.
    pub fn interrupt(&self, spoken: Option<&Spoken>, now_ms: i64) -> Interrupted {
        let active = self.state().active.clone();
        if let Some(active) = active {
            if let Some(record) = active.interrupt(spoken) {
                return Interrupted::InFlight(record);
            }
        }
        let mut st = self.state();
        let Some(m) = st.messages.iter_mut().rev().find(|m| m.role == "assistant") else {
            return Interrupted::NothingToInterrupt;
        };
        interruption::mark_stored(m, spoken, now_ms);
        Interrupted::Stored(m.clone())
    }
}
