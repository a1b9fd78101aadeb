//! What the Responses and Conversations APIs change in a session besides
//! turns: a conversation's metadata, a response forgotten, an item
//! deleted. A deleted item is superseded, as an edited message is: kept
//! stored, seen by no window and no listing.

use serde_json::{Map, Value};

use super::{Policy, Refused, Session};
use crate::memory::chain;
use crate::memory::interruption;
use crate::store::Ticket;

impl Session {
    pub fn metadata(&self) -> Map<String, Value> {
        self.state().metadata.clone()
    }

    pub fn set_metadata(
        &self,
        policy: &Policy,
        metadata: Map<String, Value>,
        now_ms: i64,
    ) -> Result<Ticket, Refused> {
        let ((), ticket) = self.change_meta(policy, now_ms, |st| st.metadata = metadata)?;
        Ok(ticket)
    }

    /// Forgets the response `key`: its mark goes, its messages stay in the
    /// history. False if there was no such response.
    pub fn forget_response(
        &self,
        policy: &Policy,
        key: &str,
        now_ms: i64,
    ) -> Result<(bool, Ticket), Refused> {
        let mut st = self.state();
        if st.ended {
            return Err(Refused::Ended);
        }
        let Some(at) = st
            .messages
            .iter()
            .position(|m| chain::key_of(m) == Some(key))
        else {
            return Ok((false, Ticket::ready()));
        };
        self.touch(now_ms);
        st.edit_message(at, |m| {
            if let Some(md) = &mut m.metadata {
                md.remove(chain::KEY);
            }
        });
        let ops = vec![self.set_op(&st, at)];
        Ok((true, self.persist(&mut st, policy, ops)))
    }

    /// Deletes the message at sequence number `seq` from what the model
    /// and the listings see. False if there is no such visible message.
    pub fn delete_message(
        &self,
        policy: &Policy,
        seq: u64,
        now_ms: i64,
    ) -> Result<(bool, Ticket), Refused> {
        let mut st = self.state();
        if st.ended {
            return Err(Refused::Ended);
        }
        let Some(at) = seq
            .checked_sub(st.first_seq)
            .map(|i| i as usize)
            .filter(|&i| i < st.messages.len())
            .filter(|&i| !interruption::is_superseded(&st.messages[i]))
        else {
            return Ok((false, Ticket::ready()));
        };
        self.touch(now_ms);
        st.edit_message(at, |m| {
            interruption::supersede(m, now_ms);
            m.metadata_mut()
                .insert(interruption::SUPERSEDED_BY, Value::String("deleted".into()));
        });
        let ops = vec![self.set_op(&st, at)];
        Ok((true, self.persist(&mut st, policy, ops)))
    }
}
