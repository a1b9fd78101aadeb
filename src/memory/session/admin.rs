//! What the session API does to a session: read a summary, replace, append
//! to or clear the history, set its system messages, and end it.

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use super::state::State;
use super::{Policy, Refused, Session};
use crate::config::OnNewRequest;
use crate::memory::long_term::session::Recall;
use crate::memory::message::Message;
use crate::memory::summary::Remembered;
use crate::memory::turns;
use crate::store::{Listed, Op, Ticket};

/// A session as listings and `GET /v1/sessions/{id}` show it.
#[derive(Debug, Clone, Serialize)]
pub struct Overview {
    pub id: String,
    pub message_count: usize,
    pub turn_id: u64,
    pub created_at: i64,
    pub last_active_at: i64,
    pub users: Vec<String>,
    pub in_flight: bool,
    /// The running summary (`summary::View`), if there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<Value>,
    /// The note carried in from the user's last session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub carried_note: Option<String>,
    /// The user's long-term facts its next turn sends (`Recall`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recalled: Option<Recall>,
}

/// A summary as the session API shows it.
fn shown(r: &Remembered) -> Option<Value> {
    r.summary
        .as_ref()
        .and_then(|s| serde_json::to_value(s.view()).ok())
}

impl Overview {
    /// A stored session that is not in the working set.
    pub fn from_listed(l: Listed) -> Self {
        Overview {
            summary: shown(&l.meta.remembered),
            carried_note: l.meta.remembered.carried.clone(),
            recalled: None,
            id: l.id,
            message_count: l.message_count,
            turn_id: l.meta.turn_id,
            created_at: l.meta.created_ms,
            last_active_at: l.meta.last_active_ms,
            users: l.meta.users,
            in_flight: false,
        }
    }
}

/// When a session may end.
#[derive(Debug, Clone, Copy)]
pub enum EndWhen {
    /// Now; a reply in flight is recorded as interrupted first.
    Always,
    /// If it has been idle since before this time and has no reply in flight.
    IdleBefore(i64),
    /// If it has no reply in flight.
    NotBusy,
}

/// A session's memory when it ends, for the webhook.
#[derive(Debug, Clone)]
pub struct Ended {
    pub turn_id: u64,
    pub users: Vec<String>,
    pub system_messages: Vec<Message>,
    pub contents: Vec<Arc<Message>>,
    /// Its running summary and carried note.
    pub remembered: Remembered,
    /// The sequence number of `contents[0]`.
    pub first_seq: u64,
    /// Messages from this sequence number on were not extracted into its
    /// user's long-term memory, nor `held_back` (older ones, no longer in
    /// `contents`).
    pub extracted_until: u64,
    pub held_back: Vec<Arc<Message>>,
}

/// Messages appended through an API, as stored, and the sequence number
/// of the first.
#[derive(Debug, Clone)]
pub struct Appended {
    pub messages: Vec<Message>,
    pub first_seq: u64,
}

impl Session {
    pub fn overview(&self) -> Overview {
        let st = self.state();
        Overview {
            summary: shown(&st.remembered),
            carried_note: st.remembered.carried.clone(),
            recalled: st.long_term.shown(),
            id: self.id.clone(),
            message_count: st.messages.len(),
            turn_id: st.turn_id,
            created_at: self.created_ms,
            last_active_at: self.last_active_ms(),
            users: st.users.clone(),
            in_flight: st.active.is_some(),
        }
    }

    pub fn has_user(&self, user: &str) -> bool {
        self.state().users.iter().any(|u| u == user)
    }

    /// Replaces the history (a session's initial memory). An operator's
    /// write wins over a reply in flight, which is recorded first and then
    /// replaced with everything else.
    pub fn replace_history(
        &self,
        policy: &Policy,
        mut messages: Vec<Message>,
        now_ms: i64,
    ) -> Result<(usize, Ticket), Refused> {
        let mut st = self.settled(policy, OnNewRequest::Interrupt)?;
        self.touch(now_ms);
        let turn = turns::stamp_client_messages(&mut messages, 0, None, now_ms);
        let messages = super::shared(messages);
        let old = st.replace_messages(messages);
        st.first_seq += old.len() as u64;
        st.turn_id = turn;
        st.incarnation = super::next_incarnation();
        st.remembered.reset();
        st.meta_changed();
        let mut ops = vec![Op::Clear {
            id: self.id.clone(),
        }];
        ops.extend((0..st.messages.len()).map(|i| self.push_op(&st, i)));
        self.trim(&mut st, policy, &mut ops);
        Ok((st.messages.len(), self.persist(&mut st, policy, ops)))
    }

    /// Appends messages without calling the model: a greeting, an
    /// operator's command, a silence reminder. An assistant message with
    /// no `metadata.source` is a `command`: a message made
    /// through an API call.
    pub fn append_messages(
        &self,
        policy: &Policy,
        mut messages: Vec<Message>,
        now_ms: i64,
    ) -> Result<(Appended, Ticket), Refused> {
        let mut st = self.settled(policy, policy.on_new_request)?;
        self.touch(now_ms);
        for m in messages.iter_mut().filter(|m| m.role == "assistant") {
            m.metadata_mut()
                .insert_default("source", || Value::String("command".into()));
        }
        let last = st.messages.last().map(|m| &**m);
        st.turn_id = turns::stamp_client_messages(&mut messages, st.turn_id, last, now_ms);
        let from = st.messages.len();
        st.extend_messages(messages.iter().cloned());
        let mut ops: Vec<Op> = (from..st.messages.len())
            .map(|i| self.push_op(&st, i))
            .collect();
        let first_seq = st.first_seq + from as u64;
        self.trim(&mut st, policy, &mut ops);
        let ticket = self.persist(&mut st, policy, ops);
        Ok((
            Appended {
                messages,
                first_seq,
            },
            ticket,
        ))
    }

    /// Clears the history; the session and its system messages stay.
    pub fn clear_history(&self, policy: &Policy, now_ms: i64) -> Result<(usize, Ticket), Refused> {
        let mut st = self.settled(policy, OnNewRequest::Interrupt)?;
        self.touch(now_ms);
        let cleared = st.messages.len();
        st.first_seq += cleared as u64;
        st.clear_messages();
        st.turn_id = 0;
        st.incarnation = super::next_incarnation();
        st.remembered.reset();
        st.meta_changed();
        let ops = vec![Op::Clear {
            id: self.id.clone(),
        }];
        Ok((cleared, self.persist(&mut st, policy, ops)))
    }

    pub fn system_messages(&self) -> Vec<Message> {
        self.state().system_messages.clone()
    }

    pub fn set_system_messages(
        &self,
        policy: &Policy,
        messages: Vec<Message>,
        now_ms: i64,
    ) -> Result<Ticket, Refused> {
        let ((), ticket) = self.change_meta(policy, now_ms, |st| st.system_messages = messages)?;
        Ok(ticket)
    }

    /// Changes what the meta holds (written whole with the next batch),
    /// and answers what the change returned.
    pub(super) fn change_meta<T>(
        &self,
        policy: &Policy,
        now_ms: i64,
        change: impl FnOnce(&mut State) -> T,
    ) -> Result<(T, Ticket), Refused> {
        let mut st = self.state();
        if st.ended {
            return Err(Refused::Ended);
        }
        self.touch(now_ms);
        let out = change(&mut st);
        st.meta_changed();
        Ok((out, self.persist(&mut st, policy, Vec::new())))
    }

    /// Ends the session: a reply in flight is recorded as interrupted, and
    /// later requests holding this session start a new one. `None` if it
    /// had already ended.
    /// `also` gives ops to write in the same batch as the deletion (the
    /// webhook event that must not be lost with it).
    pub fn end(
        self: &Arc<Self>,
        policy: &Policy,
        when: EndWhen,
        also: impl FnOnce(&Ended) -> Vec<Op>,
    ) -> Option<(Ended, Ticket)> {
        let mut st = match when {
            EndWhen::Always => self.settled(policy, OnNewRequest::Interrupt).ok()?,
            EndWhen::IdleBefore(_) | EndWhen::NotBusy => {
                let st = self.state();
                if st.ended || st.active.is_some() {
                    return None;
                }
                st
            }
        };
        if let EndWhen::IdleBefore(cutoff) = when {
            if self.last_active_ms() >= cutoff {
                return None;
            }
        }
        st.ended = true;
        let (extracted_until, held_back) = st.long_term.left();
        let ended = Ended {
            turn_id: st.turn_id,
            users: std::mem::take(&mut st.users),
            system_messages: std::mem::take(&mut st.system_messages),
            contents: st.replace_messages(Vec::new()),
            remembered: st.remembered.clone(),
            first_seq: st.first_seq,
            extracted_until,
            held_back,
        };
        let ticket = if policy.storage.persistent() {
            // Expected: a session another replica went on with is not
            // ended on this one's stale copy (its sweeper's, say).
            let mut ops = vec![
                self.expect(&st),
                Op::Delete {
                    id: self.id.clone(),
                    users: ended.users.clone(),
                },
            ];
            ops.extend(also(&ended));
            policy.storage.submit(ops)
        } else {
            Ticket::ready()
        };
        Some((ended, ticket))
    }
}
