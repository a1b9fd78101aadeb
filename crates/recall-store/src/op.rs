//! What storage holds of a session (`Meta`, `Loaded`, `Listed`) and the
//! changes it applies (`Op`).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use recall_core::memory::message::Message;
use recall_core::memory::summary::Remembered;

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
    /// A conversation's `metadata` (the Conversations API): up to 16
    /// string pairs, kept as the client set them.
    #[serde(default)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// The running summary and the carried note.
    #[serde(default)]
    pub remembered: Remembered,
}

/// A session as read back from storage.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub meta: Meta,
    pub messages: Vec<Message>,
    /// How many changes shared storage has applied to the session (0
    /// elsewhere): the session's writes say it back (`Op::Expect`).
    pub version: u64,
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
    Save { id: String, meta: Box<Meta> },
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
    /// Keeps a job of recall's own (a carry-over) until it is done, so
    /// that a stop in the middle of it does not lose it.
    KeepJob { id: String, body: String },
    /// Forgets a kept job (done).
    ForgetJob { id: String },
    /// Stores a user's carried note (`Note` as JSON, a deleted one too)
    /// under its key.
    SaveNote {
        user: String,
        body: String,
        /// Compare-and-set: the note's body as read before (`""` for none);
        /// another body stored meanwhile refuses the write. `None` writes
        /// whatever is there (the memory API's own writes).
        expect: Option<String>,
    },
    /// The session's data must be at `version` (shared storage only): the
    /// version it was read at, plus one for each batch of this replica's
    /// since. Found otherwise, another replica changed the session (this
    /// one's lease lapsed while it worked): the batch is refused, and with
    /// it the session's later batches (see `Fences`). A stored session
    /// must also have been created at `created_ms`: a session ended and
    /// started anew under the same id counts its versions from 0 again,
    /// and is not the one this replica read.
    Expect {
        id: String,
        version: u64,
        created_ms: i64,
    },
    /// The session's memory was just rebuilt from what storage holds (or
    /// started anew): its writes apply again after a failed one (see
    /// `Fences`). Writes nothing.
    Resume { id: String },
}

/// What storage keeps until it is done with: webhook events until they
/// are delivered, recall's own jobs until they have run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    Event,
    Job,
}

/// A kept event's or job's change: kept with this body, or forgotten.
pub struct KeptChange<'a> {
    pub what: Kept,
    pub id: &'a str,
    pub body: Option<&'a str>,
}

impl Op {
    /// What it keeps or forgets, for an op that does.
    pub fn kept(&self) -> Option<KeptChange<'_>> {
        let (what, id, body) = match self {
            Op::KeepEvent { id, body } => (Kept::Event, id, Some(body.as_str())),
            Op::ForgetEvent { id } => (Kept::Event, id, None),
            Op::KeepJob { id, body } => (Kept::Job, id, Some(body.as_str())),
            Op::ForgetJob { id } => (Kept::Job, id, None),
            _ => return None,
        };
        Some(KeptChange {
            what,
            id: id.as_str(),
            body,
        })
    }

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
            | Op::Expect { id, .. }
            | Op::Resume { id } => Some(id),
            Op::Release { .. }
            | Op::KeepEvent { .. }
            | Op::ForgetEvent { .. }
            | Op::KeepJob { .. }
            | Op::ForgetJob { .. }
            | Op::SaveNote { .. } => None,
        }
    }

    /// Whether it changes the session's data, and so moves its version.
    /// A drain's late fields do not: they merge into whatever the record
    /// has become, and must not refuse the writes of the replica that
    /// holds the session by then.
    pub fn bumps(&self) -> bool {
        match self {
            Op::Save { .. }
            | Op::Touch { .. }
            | Op::Push { .. }
            | Op::Set { .. }
            | Op::DropBefore { .. }
            | Op::Clear { .. }
            | Op::Delete { .. } => true,
            Op::SetLate { .. }
            | Op::Expect { .. }
            | Op::Release { .. }
            | Op::KeepEvent { .. }
            | Op::ForgetEvent { .. }
            | Op::KeepJob { .. }
            | Op::ForgetJob { .. }
            | Op::SaveNote { .. }
            | Op::Resume { .. } => false,
        }
    }
}
