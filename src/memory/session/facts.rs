//! The data a session keeps of its user's long-term memory, apart from
//! what it does with it (`long_term.rs`): the facts its next turn sends,
//! and the messages not extracted yet.

use std::sync::Arc;

use crate::memory::long_term::Fact;
use crate::memory::message::Message;

/// The most messages one extraction reads (the newest), and the most a
/// session keeps for it after they left its history: a model failing for
/// a long time does not make every later extraction longer.
pub(super) const MAX_EXTRACTED: usize = 200;

#[derive(Debug, Clone, Default)]
pub(super) struct LongTermState {
    pub(super) recalled: Option<Box<Recalled>>,
    /// Messages from this sequence number on are not extracted yet.
    pub(super) extracted_until: u64,
    /// Messages not extracted yet that left the history (`max_messages`,
    /// `max_bytes`), by sequence number: kept here until extracted.
    pub(super) held: Vec<(u64, Arc<Message>)>,
    /// An extraction of this session runs in this process.
    pub(super) extracting: bool,
    /// A search for this session runs in this process; the newest query
    /// asked meanwhile waits for it (older ones are dropped).
    pub(super) searching: bool,
    pub(super) next_query: Option<Box<Query>>,
    /// The facts the last turn sent (the console shows them).
    pub(super) sent: Option<Arc<[Fact]>>,
}

#[derive(Debug, Clone)]
pub(super) struct Recalled {
    /// Whose facts: a session may hear more than one user.
    pub(super) user: String,
    pub(super) facts: Arc<[Fact]>,
    /// The user message the search was for (none: the user's newest
    /// records, before any search).
    pub(super) for_seq: Option<u64>,
}

/// The facts a session's next turn sends, as the session API shows them:
/// `searched` is false for the user's newest records a session starts with.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Recall {
    pub facts: Vec<Fact>,
    pub searched: bool,
}

impl LongTermState {
    pub(super) fn shown(&self) -> Option<Recall> {
        self.recalled.as_ref().map(|r| Recall {
            facts: r.facts.to_vec(),
            searched: r.for_seq.is_some(),
        })
    }

    /// The facts held no longer hold (the user's memory was deleted).
    pub(super) fn forget(&mut self) {
        self.recalled = None;
    }

    /// What is left to extract of an ended session: from this sequence
    /// number on, and what left its history before.
    pub(super) fn left(&self) -> (u64, Vec<Arc<Message>>) {
        let held = self.held.iter().map(|(_, m)| Arc::clone(m)).collect();
        (self.extracted_until, held)
    }

    /// `messages` (from sequence number `first_seq`) leave the history:
    /// those not extracted yet are kept until they are.
    pub(super) fn hold_back(&mut self, messages: &[Arc<Message>], first_seq: u64) {
        for (i, m) in messages.iter().enumerate() {
            let seq = first_seq + i as u64;
            if seq >= self.extracted_until {
                self.held.push((seq, Arc::clone(m)));
            }
        }
        let over = self.held.len().saturating_sub(MAX_EXTRACTED);
        self.held.drain(..over);
    }
}

/// A search of the user's records for the turn after a user message.
#[derive(Debug, Clone)]
pub struct Query {
    pub text: String,
    pub for_seq: u64,
}
