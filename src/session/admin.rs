//! What the session API does to a session: read a summary, replace, append
//! to or clear the history, set its system messages, and end it.

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use super::{Policy, Refused, Session};
use crate::config::OnNewRequest;
use crate::message::Message;
use crate::turns;

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub id: String,
    pub message_count: usize,
    pub turn_id: u64,
    pub created_at: i64,
    pub last_active_at: i64,
    pub users: Vec<String>,
    pub in_flight: bool,
}

/// A session's memory when it ends, for the webhook.
#[derive(Debug, Clone)]
pub struct Ended {
    pub turn_id: u64,
    pub users: Vec<String>,
    pub system_messages: Vec<Message>,
    pub contents: Vec<Message>,
}

impl Session {
    pub fn summary(&self) -> Summary {
        let st = self.state();
        Summary {
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
    ) -> Result<usize, Refused> {
        let mut st = self.settled(OnNewRequest::Interrupt)?;
        let turn = turns::stamp_client_messages(&mut messages, 0, None, now_ms);
        let old = std::mem::replace(&mut st.messages, messages);
        st.first_seq += old.len() as u64;
        st.turn_id = turn;
        self.trim(&mut st, policy);
        self.touch(now_ms);
        Ok(st.messages.len())
    }

    /// Appends messages without calling the model: a greeting, an
    /// operator's command, a silence reminder. An assistant message with
    /// no `metadata.source` is a `command`, as seed 000 names messages
    /// made through an API call.
    pub fn append_messages(
        &self,
        policy: &Policy,
        mut messages: Vec<Message>,
        now_ms: i64,
    ) -> Result<Vec<Message>, Refused> {
        let mut st = self.settled(policy.on_new_request)?;
        for m in messages.iter_mut().filter(|m| m.role == "assistant") {
            m.metadata_mut()
                .entry("source")
                .or_insert_with(|| Value::String("command".into()));
        }
        st.turn_id =
            turns::stamp_client_messages(&mut messages, st.turn_id, st.messages.last(), now_ms);
        st.messages.extend(messages.iter().cloned());
        self.trim(&mut st, policy);
        self.touch(now_ms);
        Ok(messages)
    }

    /// Clears the history; the session and its system messages stay.
    pub fn clear_history(&self, now_ms: i64) -> Result<usize, Refused> {
        let mut st = self.settled(OnNewRequest::Interrupt)?;
        let cleared = st.messages.len();
        st.first_seq += cleared as u64;
        st.messages.clear();
        st.turn_id = 0;
        self.touch(now_ms);
        Ok(cleared)
    }

    pub fn system_messages(&self) -> Vec<Message> {
        self.state().system_messages.clone()
    }

    pub fn set_system_messages(&self, messages: Vec<Message>, now_ms: i64) {
        self.state().system_messages = messages;
        self.touch(now_ms);
    }

    /// Ends the session: a reply in flight is recorded as interrupted, and
    /// later requests holding this session start a new one. `None` if it
    /// had already ended.
    pub fn end(self: &Arc<Self>) -> Option<Ended> {
        let mut st = self.settled(OnNewRequest::Interrupt).ok()?;
        st.ended = true;
        Some(Ended {
            turn_id: st.turn_id,
            users: std::mem::take(&mut st.users),
            system_messages: std::mem::take(&mut st.system_messages),
            contents: std::mem::take(&mut st.messages),
        })
    }
}
