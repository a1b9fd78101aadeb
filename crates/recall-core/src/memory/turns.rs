//! Turn numbering and the extension fields every stored message carries.
//!
//! Turns count from 1 (a session with no messages is at turn 0). A user
//! message starts a turn; the reply to it, and any tool traffic in between,
//! belong to that turn. An assistant message a client sends on its own, not
//! answering anything (a greeting, a command), starts a turn of its own.

use serde_json::Value;

use crate::memory::message::Message;

/// Fills in `turn_id`, `timestamp` and `metadata.source` on messages a
/// client sent, keeping any value the client supplied. `last` is the
/// message stored just before them; returns the session's new turn.
pub fn stamp_client_messages(
    messages: &mut [Message],
    mut turn: u64,
    last: Option<&Message>,
    now_ms: i64,
) -> u64 {
    for i in 0..messages.len() {
        let previous = match i {
            0 => last.map(|m| m.role.as_str()),
            _ => Some(messages[i - 1].role.as_str()),
        };
        let opens_turn = match messages[i].role.as_str() {
            "user" => true,
            "assistant" => !matches!(previous, Some("user" | "tool" | "function")),
            _ => turn == 0,
        };
        let m = &mut messages[i];
        match m.turn_id {
            Some(given) => turn = turn.max(given),
            None => {
                if opens_turn {
                    turn = turn.saturating_add(1);
                }
                m.turn_id = Some(turn);
            }
        }
        fill(m, now_ms, crate::memory::message::source::MESSAGE);
    }
    turn
}

/// Stamps a reply the upstream produced: it belongs to the current turn.
pub fn stamp_reply(reply: &mut Message, turn: u64, now_ms: i64) {
    reply.turn_id = Some(turn);
    fill(reply, now_ms, crate::memory::message::source::LLM);
}

fn fill(m: &mut Message, now_ms: i64, source: &str) {
    m.timestamp.get_or_insert(now_ms);
    m.metadata_mut()
        .insert_default("source", || Value::String(source.to_owned()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::message::Role;
    use serde_json::json;

    fn turns(ms: &[Message]) -> Vec<u64> {
        ms.iter().map(|m| m.turn_id.unwrap()).collect()
    }

    #[test]
    fn user_messages_open_turns_and_answers_share_them() {
        let mut ms = vec![
            Message::new(Role::Assistant, "greeting"),
            Message::new(Role::User, "joke?"),
            Message::new(Role::Assistant, "why did"),
            Message::new(Role::User, "story"),
            Message::new(Role::Assistant, "once"),
            Message::new(Role::Assistant, "still there?"),
        ];
        let turn = stamp_client_messages(&mut ms, 0, None, 7);
        assert_eq!(turns(&ms), [1, 2, 2, 3, 3, 4]);
        assert_eq!(turn, 4);
        assert!(ms
            .iter()
            .all(|m| m.timestamp == Some(7) && m.source() == Some("message")));
    }

    #[test]
    fn continues_from_the_stored_history() {
        let prev = Message::new(Role::User, "q");
        let mut ms = vec![
            Message::new(Role::Assistant, "answer"),
            Message::new(Role::User, "next"),
        ];
        assert_eq!(stamp_client_messages(&mut ms, 5, Some(&prev), 1), 6);
        assert_eq!(turns(&ms), [5, 6]);
    }

    #[test]
    fn tool_results_stay_in_their_turn() {
        let prev = Message::new(Role::Assistant, json!(null));
        let mut ms = vec![
            Message::new(Role::Tool, "42"),
            Message::new(Role::Assistant, "it is 42"),
        ];
        stamp_client_messages(&mut ms, 3, Some(&prev), 1);
        assert_eq!(turns(&ms), [3, 3]);
    }

    #[test]
    fn client_values_are_kept() {
        let mut m = Message::new(Role::User, "hi");
        m.turn_id = Some(10);
        m.timestamp = Some(99);
        m.metadata_mut().insert("source", json!("asr"));
        let mut ms = vec![m, Message::new(Role::User, "again")];
        assert_eq!(stamp_client_messages(&mut ms, 2, None, 1), 11);
        assert_eq!(turns(&ms), [10, 11]);
        assert_eq!(ms[0].timestamp, Some(99));
        assert_eq!(ms[0].source(), Some("asr"));
    }

    #[test]
    fn replies_take_the_current_turn() {
        let mut r = Message::new(Role::Assistant, "hi");
        stamp_reply(&mut r, 4, 8);
        assert_eq!(
            (r.turn_id, r.timestamp, r.source()),
            (Some(4), Some(8), Some("llm"))
        );
    }
}
