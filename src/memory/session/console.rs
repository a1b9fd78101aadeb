//! What the console reads of a session: everything it shows, taken under
//! one short lock, and a cheap signature that moves whenever what it shows
//! does (the live page reloads on a move). Nothing here changes a session.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use super::Session;
use crate::memory::long_term::session::Recall;
use crate::memory::long_term::Fact;
use crate::memory::message::Message;
use crate::memory::summary::Remembered;

/// A session as the console's session page shows it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub turn_id: u64,
    pub messages: Vec<Arc<Message>>,
    /// The sequence number of `messages[0]`.
    pub first_seq: u64,
    /// Where the window the upstream received on the last turn began.
    pub window_from: u64,
    pub system_messages: Vec<Message>,
    pub remembered: Remembered,
    pub users: Vec<String>,
    /// The long-term facts the last turn sent, and the ones the next sends.
    pub facts_sent: Option<Arc<[Fact]>>,
    pub facts_next: Option<Recall>,
    /// The reply in flight, as far as its client has received it.
    pub streaming: Option<String>,
    pub created_ms: i64,
    pub last_active_ms: i64,
    pub signature: u64,
}

/// What the live page polls: the signature and the reply in flight.
#[derive(Debug, Clone, PartialEq)]
pub struct Glance {
    pub signature: u64,
    pub streaming: Option<String>,
}

impl Session {
    pub fn seen(&self) -> Seen {
        let st = self.state();
        Seen {
            turn_id: st.turn_id,
            messages: st.messages.clone(),
            first_seq: st.first_seq,
            window_from: st.window_from,
            system_messages: st.system_messages.clone(),
            remembered: st.remembered.clone(),
            users: st.users.clone(),
            facts_sent: st.long_term.sent.clone(),
            facts_next: st.long_term.shown(),
            streaming: st.active.as_ref().map(|a| a.relayed_text()),
            created_ms: self.created_ms,
            last_active_ms: self.last_active_ms(),
            signature: signature(&st),
        }
    }

    pub fn glance(&self) -> Glance {
        let st = self.state();
        Glance {
            signature: signature(&st),
            streaming: st.active.as_ref().map(|a| a.relayed_text()),
        }
    }

    /// The long-term facts a turn sent (`None`: none).
    pub fn facts_sent(&self, facts: Option<Arc<[Fact]>>) {
        self.state().long_term.sent = facts;
    }
}

/// Moves when anything the session page shows moves: a message pushed,
/// edited (a drain's later `original`) or dropped, the meta (users, system
/// messages), a summary, the carried note, the window, a reply starting or
/// ending, the facts a turn sent.
fn signature(st: &super::state::State) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (st.changes, st.turn_id, st.first_seq, st.window_from).hash(&mut h);
    st.active.is_some().hash(&mut h);
    let summary = st.remembered.summary.as_ref();
    summary.map(|s| (s.until, s.at_ms)).hash(&mut h);
    st.remembered.carried.hash(&mut h);
    st.long_term.sent.as_ref().map(Arc::as_ptr).hash(&mut h);
    h.finish()
}
