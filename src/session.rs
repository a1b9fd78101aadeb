//! Sessions: each one's history and current turn, in process.
//!
//! A session has two locks. The turn lock (async) serialises whole turns,
//! from appending the client's messages to recording the reply, so that the
//! history stays in turn order. The state lock (sync) is held only for the
//! few microseconds it takes to read or change the history, so that reading
//! a session never waits on a reply that is still streaming.

use std::sync::{Arc, Mutex, MutexGuard};

use dashmap::DashMap;
use serde::Serialize;
use tokio::sync::OwnedMutexGuard;

use crate::config::HistoryConfig;
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
    turn_lock: Arc<tokio::sync::Mutex<()>>,
    state: Mutex<State>,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct State {
    pub turn_id: u64,
    pub messages: Vec<Message>,
}

/// What a turn sends upstream, decided when its messages were appended.
#[derive(Debug)]
pub struct Prepared {
    pub turn_id: u64,
    pub window: Vec<Message>,
}

impl Session {
    fn new(id: &str) -> Self {
        Self {
            id: id.to_owned(),
            turn_lock: Arc::new(tokio::sync::Mutex::new(())),
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the history half
        // written (every change is a single push or drain), so go on.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn snapshot(&self) -> State {
        self.state().clone()
    }

    /// Waits for the session's previous turn to finish, then opens a new one.
    pub async fn begin_turn(self: &Arc<Self>) -> Turn {
        let guard = Arc::clone(&self.turn_lock).lock_owned().await;
        Turn {
            session: Arc::clone(self),
            _guard: guard,
        }
    }
}

/// An open turn: holding it is holding the session's turn lock.
pub struct Turn {
    session: Arc<Session>,
    _guard: OwnedMutexGuard<()>,
}

impl Turn {
    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// Merges the client's conversation into the history and decides the
    /// window to send.
    pub fn append(
        &self,
        incoming: &[Message],
        history: &HistoryConfig,
        counters: &Counters,
        now_ms: i64,
    ) -> Prepared {
        let mut state = self.session.state();
        let mut new = reconcile::to_append(&state.messages, incoming).to_vec();
        state.turn_id =
            turns::stamp_client_messages(&mut new, state.turn_id, state.messages.last(), now_ms);
        state.messages.extend(new);
        trim_kept(&mut state, history.max_messages, counters, &self.session.id);

        let limits = Limits {
            messages: history.window_messages,
            chars: history.window_chars,
        };
        let start = window::window_start(&state.messages, limits);
        if start > 0 {
            counters.add_trimmed_sent(start);
            tracing::debug!(session = %self.session.id, trimmed = start, "window leaves out older messages");
        }
        Prepared {
            turn_id: state.turn_id,
            window: state.messages[start..].to_vec(),
        }
    }

    /// Stores the upstream's reply; it belongs to the turn it answers.
    pub fn record_reply(
        self,
        mut reply: Message,
        history: &HistoryConfig,
        counters: &Counters,
        now_ms: i64,
    ) {
        let mut state = self.session.state();
        turns::stamp_reply(&mut reply, state.turn_id, now_ms);
        state.messages.push(reply);
        trim_kept(&mut state, history.max_messages, counters, &self.session.id);
    }
}

fn trim_kept(state: &mut State, max: usize, counters: &Counters, id: &str) {
    let drop = window::keep_start(&state.messages, max);
    if drop > 0 {
        state.messages.drain(..drop);
        counters.add_trimmed_kept(drop);
        tracing::debug!(session = %id, dropped = drop, "history over max_messages: oldest dropped");
    }
}
