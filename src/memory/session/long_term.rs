//! The session's part of its user's long-term memory: the state and the
//! decisions are the core's (`memory::long_term::session`); the session
//! keeps a `LongTermState` under its lock and lends it a `Context` of
//! itself.

use std::sync::Arc;

use super::state::State;
use super::{Refused, Session};
use crate::memory::long_term::session::{Context, ExtractNow, LongTermDue, LongTermState, Query};
use crate::memory::long_term::Fact;

impl Session {
    /// The session's long-term state, and the rest of it as long-term
    /// memory's decisions read it.
    fn long_term<'s>(&'s self, st: &'s mut State) -> (&'s mut LongTermState, Context<'s>) {
        let State {
            long_term,
            messages,
            first_seq,
            remembered,
            users,
            ..
        } = st;
        let at = Context {
            id: &self.id,
            created_ms: self.created_ms,
            messages,
            first_seq: *first_seq,
            user: remembered.user.as_deref(),
            forgotten: remembered.forgotten,
            users,
        };
        (long_term, at)
    }

    /// After a turn appended its messages (`new_from` is where they begin
    /// in `st.messages`): what long-term memory does with it.
    pub(super) fn long_term_due(
        &self,
        st: &mut State,
        every_turns: usize,
        new_from: usize,
        speaking: Option<&str>,
    ) -> LongTermDue {
        let (part, at) = self.long_term(st);
        part.due(&at, every_turns, new_from, speaking)
    }

    /// An extraction of every message not extracted yet, now (the session
    /// API's `memory/extract`).
    pub fn extract_now(&self) -> Result<ExtractNow, Refused> {
        let mut st = self.state();
        if st.ended {
            return Err(Refused::Ended);
        }
        let (part, at) = self.long_term(&mut st);
        Ok(part.extract_now(&at))
    }

    /// The running extraction ended; with `until`, what it read is done.
    pub fn extraction_ended(&self, until: Option<u64>) {
        self.state().long_term.extraction_ended(until);
    }

    /// A search's result for the turn after message `for_seq`: kept unless
    /// a search for a later message was kept first.
    pub fn recalled(&self, user: &str, for_seq: u64, facts: Vec<Fact>) {
        let mut st = self.state();
        let (part, at) = self.long_term(&mut st);
        part.recalled(at.forgotten(user), user, for_seq, facts);
    }

    /// A session's first facts: its user's newest records, unless a
    /// search's result came first.
    pub fn start_recalled(&self, user: &str, facts: Vec<Fact>) {
        let mut st = self.state();
        let (part, at) = self.long_term(&mut st);
        part.start_recalled(at.forgotten(user), user, facts);
    }

    /// The search to run now for `query`: none while one runs (`query`
    /// then waits for it, in place of any older one).
    pub fn search_for(&self, query: Query) -> Option<Query> {
        self.state().long_term.search_for(query)
    }

    /// The running search ended: the query that waited for it, if any,
    /// runs next.
    pub fn search_ended(&self) -> Option<Query> {
        let mut st = self.state();
        let ended = st.ended;
        st.long_term.search_ended(ended)
    }

    /// The facts the next turn of `user` sends.
    pub fn recalled_facts(&self, user: &str) -> Option<Arc<[Fact]>> {
        self.state().long_term.recalled_facts(user)
    }
}
