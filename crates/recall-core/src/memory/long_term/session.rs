//! What a session holds of its user's long-term memory, as plain data,
//! and what it decides with it: the facts its turns send (the last
//! search's result, or the user's newest records until one comes), how
//! far its messages were extracted, and which search and extraction are
//! due. The session keeps a `LongTermState` under its lock and lends
//! these decisions a `Context` of itself; nothing here calls a model or
//! storage.
//!
//! Both are kept in one process only: a session read back by another
//! replica, or after a restart, starts again from its user's newest
//! records and extracts its messages again (which updates the records it
//! made rather than adding copies: `long_term::merge`).

use std::sync::Arc;

use super::Fact;
use crate::memory::message::{Message, Role};

/// The most messages one extraction reads (the newest), and the most a
/// session keeps for it after they left its history: a model failing for
/// a long time does not make every later extraction longer.
pub const MAX_EXTRACTED: usize = 200;

#[derive(Debug, Clone, Default)]
pub struct LongTermState {
    recalled: Option<Box<Recalled>>,
    /// Messages from this sequence number on are not extracted yet.
    extracted_until: u64,
    /// Messages not extracted yet that left the history (`max_messages`,
    /// `max_bytes`), by sequence number: kept here until extracted.
    held: Vec<(u64, Arc<Message>)>,
    /// An extraction of this session runs in this process.
    extracting: bool,
    /// A search for this session runs in this process; the newest query
    /// asked meanwhile waits for it (older ones are dropped).
    searching: bool,
    next_query: Option<Box<Query>>,
    /// The facts the last turn sent (the console shows them).
    pub sent: Option<Arc<[Fact]>>,
}

#[derive(Debug, Clone)]
struct Recalled {
    /// Whose facts: a session may hear more than one user.
    user: String,
    facts: Arc<[Fact]>,
    /// The user message the search was for (none: the user's newest
    /// records, before any search).
    for_seq: Option<u64>,
}

/// The facts a session's next turn sends, as the session API shows them:
/// `searched` is false for the user's newest records a session starts with.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Recall {
    pub facts: Vec<Fact>,
    pub searched: bool,
}

/// A search of the user's records for the turn after a user message.
#[derive(Debug, Clone)]
pub struct Query {
    pub text: String,
    pub for_seq: u64,
}

/// Messages of a session to extract facts from, for its user.
#[derive(Debug, Clone)]
pub struct Extraction {
    /// The user's key (tenant-scoped), whose records these are.
    pub user: String,
    /// The user and the session as the caller knows them
    /// (`long_term::shown_names`): what namespaces and records show.
    pub user_name: String,
    pub session: String,
    /// When the session began: records forgotten since are not written
    /// back from it.
    pub began_ms: i64,
    pub messages: Vec<Arc<Message>>,
    /// The sequence number after the last of `messages`.
    pub until: u64,
}

/// What a turn leaves to long-term memory: its user, the facts it sends
/// (none known yet: the caller may start from the user's newest), and the
/// jobs now due, for the caller to start.
#[derive(Debug, Default)]
pub struct LongTermDue {
    pub user: Option<String>,
    pub facts: Option<Arc<[Fact]>>,
    pub query: Option<Query>,
    pub extract: Option<Extraction>,
}

/// What asking for an extraction found.
#[derive(Debug)]
pub enum ExtractNow {
    Running,
    Nothing,
    /// Now the session's running one: `extraction_ended` must follow it.
    Start(Extraction),
}

/// The session a decision is about, as it stands under its lock.
pub struct Context<'a> {
    pub id: &'a str,
    pub created_ms: i64,
    /// Its history, the first message at sequence number `first_seq`.
    pub messages: &'a [Arc<Message>],
    pub first_seq: u64,
    /// The user whose memory the session holds, and whether that memory
    /// was deleted.
    pub user: Option<&'a str>,
    pub forgotten: bool,
    /// The names the session's users go by.
    pub users: &'a [String],
}

impl Context<'_> {
    /// Whether `key`'s memory was deleted while this session held it.
    pub fn forgotten(&self, key: &str) -> bool {
        self.forgotten && self.user == Some(key)
    }

    /// The user key whose records this session reads and writes: none
    /// without one, or once the user's memory was deleted.
    fn memory_user(&self) -> Option<String> {
        (!self.forgotten)
            .then(|| self.user.map(str::to_owned))
            .flatten()
    }

    fn unextracted(&self, extracted_until: u64) -> &[Arc<Message>] {
        let from = extracted_until.saturating_sub(self.first_seq);
        let from = usize::try_from(from).unwrap_or(usize::MAX);
        &self.messages[from.min(self.messages.len())..]
    }
}

impl LongTermState {
    /// After a turn appended its messages (`new_from` is where they begin
    /// in the history): what long-term memory does with it. `speaking`:
    /// the user who sent this turn, else the session's.
    pub fn due(
        &mut self,
        at: &Context,
        every_turns: usize,
        new_from: usize,
        speaking: Option<&str>,
    ) -> LongTermDue {
        let user = match speaking {
            Some(key) if !at.forgotten(key) => Some(key.to_owned()),
            Some(_) => None,
            None => at.memory_user(),
        };
        let Some(user) = user else {
            return LongTermDue::default();
        };
        let messages = at.messages;
        let asked = messages[new_from.min(messages.len())..]
            .iter()
            .rposition(|m| m.role == Role::User)
            .map(|i| new_from + i);
        let query = asked.map(|i| {
            let reply = messages[..i]
                .iter()
                .rev()
                .find(|m| m.role == Role::Assistant && crate::memory::summary::read(m));
            Query {
                text: super::query_text(reply.map(|m| &**m), &messages[i]),
                for_seq: at.first_seq + i as u64,
            }
        });
        let said = self
            .held
            .iter()
            .map(|(_, m)| m)
            .chain(at.unextracted(self.extracted_until))
            .filter(|m| m.role == Role::User && crate::memory::summary::read(m))
            .count();
        let extract =
            (!self.extracting && said >= every_turns.max(1)).then(|| self.extraction(at, &user));
        LongTermDue {
            facts: self.recalled_facts(&user),
            user: Some(user),
            query,
            extract,
        }
    }

    /// Everything not extracted yet (the newest `MAX_EXTRACTED` messages
    /// of it), marked as being extracted.
    fn extraction(&mut self, at: &Context, user: &str) -> Extraction {
        self.extracting = true;
        let mut messages: Vec<Arc<Message>> = self
            .held
            .iter()
            .map(|(_, m)| Arc::clone(m))
            .chain(at.unextracted(self.extracted_until).iter().cloned())
            .collect();
        let over = messages.len().saturating_sub(MAX_EXTRACTED);
        messages.drain(..over);
        let (user_name, session) = super::shown_names(user, at.id, at.users);
        Extraction {
            user: user.to_owned(),
            user_name,
            session,
            began_ms: at.created_ms,
            messages,
            until: at.first_seq + at.messages.len() as u64,
        }
    }

    /// An extraction of every message not extracted yet, now.
    pub fn extract_now(&mut self, at: &Context) -> ExtractNow {
        if self.extracting {
            return ExtractNow::Running;
        }
        let Some(user) = at.memory_user() else {
            return ExtractNow::Nothing;
        };
        let held = self.held.iter().map(|(_, m)| Arc::clone(m));
        let unextracted = at.unextracted(self.extracted_until).iter().cloned();
        let left: Vec<Arc<Message>> = held.chain(unextracted).collect();
        if !super::worth_extracting(&left) {
            return ExtractNow::Nothing;
        }
        ExtractNow::Start(self.extraction(at, &user))
    }

    /// The running extraction ended; with `until`, what it read is done.
    pub fn extraction_ended(&mut self, until: Option<u64>) {
        self.extracting = false;
        if let Some(until) = until {
            self.extracted_until = self.extracted_until.max(until);
            self.held.retain(|(seq, _)| *seq >= until);
        }
    }

    /// A search's result for the turn after message `for_seq`: kept unless
    /// a search for a later message was kept first, or `forgotten`.
    pub fn recalled(&mut self, forgotten: bool, user: &str, for_seq: u64, facts: Vec<Fact>) {
        if forgotten {
            return;
        }
        let newer = |r: &Recalled| r.user == user && r.for_seq.is_some_and(|s| s > for_seq);
        if self.recalled.as_deref().is_some_and(newer) {
            return;
        }
        self.recalled = Some(Box::new(Recalled {
            user: user.to_owned(),
            facts: facts.into(),
            for_seq: Some(for_seq),
        }));
    }

    /// A session's first facts: its user's newest records, unless a
    /// search's result came first, or `forgotten`.
    pub fn start_recalled(&mut self, forgotten: bool, user: &str, facts: Vec<Fact>) {
        let held = self.recalled.as_ref().is_some_and(|r| r.user == user);
        if !held && !forgotten {
            self.recalled = Some(Box::new(Recalled {
                user: user.to_owned(),
                facts: facts.into(),
                for_seq: None,
            }));
        }
    }

    /// The search to run now for `query`: none while one runs (`query`
    /// then waits for it, in place of any older one).
    pub fn search_for(&mut self, query: Query) -> Option<Query> {
        if self.searching {
            self.next_query = Some(Box::new(query));
            return None;
        }
        self.searching = true;
        Some(query)
    }

    /// The running search ended: the query that waited for it, if any,
    /// runs next (none once the session `ended`).
    pub fn search_ended(&mut self, ended: bool) -> Option<Query> {
        let next = self.next_query.take();
        self.searching = next.is_some() && !ended;
        next.filter(|_| !ended).map(|query| *query)
    }

    /// The facts the next turn of `user` sends.
    pub fn recalled_facts(&self, user: &str) -> Option<Arc<[Fact]>> {
        let r = self.recalled.as_ref().filter(|r| r.user == user)?;
        Some(Arc::clone(&r.facts))
    }

    pub fn shown(&self) -> Option<Recall> {
        self.recalled.as_ref().map(|r| Recall {
            facts: r.facts.to_vec(),
            searched: r.for_seq.is_some(),
        })
    }

    /// The facts held no longer hold (the user's memory was deleted).
    pub fn forget(&mut self) {
        self.recalled = None;
    }

    /// What is left to extract of an ended session: from this sequence
    /// number on, and what left its history before.
    pub fn left(&self) -> (u64, Vec<Arc<Message>>) {
        let held = self.held.iter().map(|(_, m)| Arc::clone(m)).collect();
        (self.extracted_until, held)
    }

    /// `messages` (from sequence number `first_seq`) leave the history:
    /// those not extracted yet are kept until they are.
    pub fn hold_back(&mut self, messages: &[Arc<Message>], first_seq: u64) {
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
