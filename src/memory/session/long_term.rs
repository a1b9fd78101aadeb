//! What a session holds of its user's long-term memory: the facts its
//! turns send (the last search's result, or the user's newest records
//! until one comes), and how far its messages were extracted. Both are
//! kept in this process only: a session read back by another replica, or
//! after a restart, starts again from its user's newest records and
//! extracts its messages again (which updates the records it made rather
//! than adding copies: `long_term::merge`).

use std::sync::Arc;

use super::facts::{Query, Recalled, MAX_EXTRACTED};
use super::state::State;
use super::{Refused, Session};
use crate::memory::long_term::{self, Fact};
use crate::memory::message::{Message, Role};

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
    /// Now the session's running one: `Session::extraction_ended` must
    /// follow it.
    Start(Extraction),
}

impl Session {
    /// After a turn appended its messages (`new_from` is where they begin
    /// in `st.messages`): what long-term memory does with it.
    pub(super) fn long_term_due(
        &self,
        st: &mut State,
        every_turns: usize,
        new_from: usize,
        speaking: Option<&str>,
    ) -> LongTermDue {
        // The user who sent this turn, else the session's.
        let user = match speaking {
            Some(key) if !self.forgotten(st, key) => Some(key.to_owned()),
            Some(_) => None,
            None => self.memory_user(st),
        };
        let Some(user) = user else {
            return LongTermDue::default();
        };
        let asked = st.messages[new_from.min(st.messages.len())..]
            .iter()
            .rposition(|m| m.role == Role::User)
            .map(|i| new_from + i);
        let query = asked.map(|i| {
            let reply = st.messages[..i]
                .iter()
                .rev()
                .find(|m| m.role == Role::Assistant && crate::memory::summary::read(m));
            Query {
                text: long_term::query_text(reply.map(|m| &**m), &st.messages[i]),
                for_seq: st.first_seq + i as u64,
            }
        });
        let said = st
            .long_term
            .held
            .iter()
            .map(|(_, m)| m)
            .chain(self.unextracted(st))
            .filter(|m| m.role == Role::User && crate::memory::summary::read(m))
            .count();
        let extract = (!st.long_term.extracting && said >= every_turns.max(1))
            .then(|| self.extraction(st, &user));
        LongTermDue {
            facts: st
                .long_term
                .recalled
                .as_ref()
                .filter(|r| r.user == user)
                .map(|r| Arc::clone(&r.facts)),
            user: Some(user),
            query,
            extract,
        }
    }

    fn forgotten(&self, st: &State, key: &str) -> bool {
        st.remembered.forgotten && st.remembered.user.as_deref() == Some(key)
    }

    /// The user key whose records this session reads and writes: none
    /// without one, or once the user's memory was deleted.
    fn memory_user(&self, st: &State) -> Option<String> {
        (!st.remembered.forgotten)
            .then(|| st.remembered.user.clone())
            .flatten()
    }

    fn unextracted<'s>(&self, st: &'s State) -> &'s [Arc<Message>] {
        let from = st.long_term.extracted_until.saturating_sub(st.first_seq);
        &st.messages[usize::try_from(from)
            .unwrap_or(usize::MAX)
            .min(st.messages.len())..]
    }

    /// Everything not extracted yet (the newest `MAX_EXTRACTED` messages
    /// of it), marked as being extracted.
    fn extraction(&self, st: &mut State, user: &str) -> Extraction {
        st.long_term.extracting = true;
        let mut messages: Vec<Arc<Message>> = st
            .long_term
            .held
            .iter()
            .map(|(_, m)| Arc::clone(m))
            .chain(self.unextracted(st).iter().cloned())
            .collect();
        let over = messages.len().saturating_sub(MAX_EXTRACTED);
        messages.drain(..over);
        let (user_name, session) = long_term::shown_names(user, &self.id, &st.users);
        Extraction {
            user: user.to_owned(),
            user_name,
            session,
            began_ms: self.created_ms,
            messages,
            until: st.first_seq + st.messages.len() as u64,
        }
    }

    /// An extraction of every message not extracted yet, now (the session
    /// API's `memory/extract`).
    pub fn extract_now(&self) -> Result<ExtractNow, Refused> {
        let mut st = self.state();
        if st.ended {
            return Err(Refused::Ended);
        }
        if st.long_term.extracting {
            return Ok(ExtractNow::Running);
        }
        let Some(user) = self.memory_user(&st) else {
            return Ok(ExtractNow::Nothing);
        };
        let held = st.long_term.held.iter().map(|(_, m)| Arc::clone(m));
        let left: Vec<Arc<Message>> = held.chain(self.unextracted(&st).iter().cloned()).collect();
        if !long_term::worth_extracting(&left) {
            return Ok(ExtractNow::Nothing);
        }
        Ok(ExtractNow::Start(self.extraction(&mut st, &user)))
    }

    /// The running extraction ended; with `until`, what it read is done.
    pub fn extraction_ended(&self, until: Option<u64>) {
        let mut st = self.state();
        st.long_term.extracting = false;
        if let Some(until) = until {
            st.long_term.extracted_until = st.long_term.extracted_until.max(until);
            st.long_term.held.retain(|(seq, _)| *seq >= until);
        }
    }

    /// A search's result for the turn after message `for_seq`: kept unless
    /// a search for a later message was kept first.
    pub fn recalled(&self, user: &str, for_seq: u64, facts: Vec<Fact>) {
        let mut st = self.state();
        if self.forgotten(&st, user) {
            return;
        }
        let newer = |r: &Recalled| r.user == user && r.for_seq.is_some_and(|s| s > for_seq);
        if st.long_term.recalled.as_deref().is_some_and(newer) {
            return;
        }
        st.long_term.recalled = Some(Box::new(Recalled {
            user: user.to_owned(),
            facts: facts.into(),
            for_seq: Some(for_seq),
        }));
    }

    /// A session's first facts: its user's newest records, unless a
    /// search's result came first.
    pub fn start_recalled(&self, user: &str, facts: Vec<Fact>) {
        let mut st = self.state();
        let held = st
            .long_term
            .recalled
            .as_ref()
            .is_some_and(|r| r.user == user);
        if !held && !self.forgotten(&st, user) {
            st.long_term.recalled = Some(Box::new(Recalled {
                user: user.to_owned(),
                facts: facts.into(),
                for_seq: None,
            }));
        }
    }

    /// The search to run now for `query`: none while one runs (`query`
    /// then waits for it, in place of any older one).
    pub fn search_for(&self, query: Query) -> Option<Query> {
        let mut st = self.state();
        if st.long_term.searching {
            st.long_term.next_query = Some(Box::new(query));
            return None;
        }
        st.long_term.searching = true;
        Some(query)
    }

    /// The running search ended: the query that waited for it, if any,
    /// runs next.
    pub fn search_ended(&self) -> Option<Query> {
        let mut st = self.state();
        let next = st.long_term.next_query.take();
        st.long_term.searching = next.is_some() && !st.ended;
        next.filter(|_| !st.ended).map(|query| *query)
    }

    /// The facts the next turn of `user` sends.
    pub fn recalled_facts(&self, user: &str) -> Option<Arc<[Fact]>> {
        let st = self.state();
        let r = st.long_term.recalled.as_ref().filter(|r| r.user == user)?;
        Some(Arc::clone(&r.facts))
    }
}
