//! Reconciling what a client sends with what the session already holds.
//!
//! Some clients send only the new message, others resend the whole
//! conversation (or a recent part of it) every time. Both must leave the
//! history free of duplicates, and nothing a client sends may be dropped.

use serde_json::Value;

use crate::message::Message;

/// How many leading messages of `incoming` are already the tail of
/// `history`. The rest of `incoming` is new and is to be appended.
///
/// The longest overlap wins: `incoming[..k]` must line up, message by
/// message, with the last `k` stored messages. Instructions (system and
/// developer messages) must already have been removed from `incoming`.
pub fn overlap(history: &[Message], incoming: &[Message]) -> usize {
    let longest = history.len().min(incoming.len());
    (1..=longest)
        .rev()
        .find(|&k| {
            let tail = &history[history.len() - k..];
            tail.iter().zip(&incoming[..k]).all(|(h, m)| lines_up(h, m))
        })
        .unwrap_or(0)
}

/// The messages of `incoming` that are new to `history`.
pub fn to_append<'a>(history: &[Message], incoming: &'a [Message]) -> &'a [Message] {
    &incoming[overlap(history, incoming)..]
}

/// Whether a message a client sent is the same as a stored one: the role,
/// the content and the tool-call ids agree. A client may send an assistant
/// message shortened to what its user actually heard, so an assistant
/// message whose text is a prefix of the stored text lines up too.
fn lines_up(stored: &Message, sent: &Message) -> bool {
    if stored.role != sent.role || stored.tool_call_id != sent.tool_call_id {
        return false;
    }
    if !stored.tool_call_ids().eq(sent.tool_call_ids()) {
        return false;
    }
    if stored.content == sent.content {
        return true;
    }
    match (&stored.content, &sent.content) {
        (Value::String(full), Value::String(part)) if stored.role == "assistant" => {
            full.starts_with(part.as_str())
        }
        // An assistant message with only tool calls may come back as
        // `content: ""` from some clients and `null` from others.
        (Value::Null, Value::String(s)) | (Value::String(s), Value::Null) => {
            stored.role == "assistant" && s.is_empty()
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn u(text: &str) -> Message {
        Message::new("user", text)
    }
    fn a(text: &str) -> Message {
        Message::new("assistant", text)
    }
    fn contents(ms: &[Message]) -> Vec<&str> {
        ms.iter().map(|m| m.content_str().unwrap_or("")).collect()
    }

    #[test]
    fn delta_client_appends_the_new_message() {
        let h = [u("u1"), a("a1")];
        assert_eq!(contents(to_append(&h, &[u("u2")])), ["u2"]);
    }

    #[test]
    fn full_resend_appends_only_the_tail() {
        let h = [u("u1"), a("a1")];
        assert_eq!(
            contents(to_append(&h, &[u("u1"), a("a1"), u("u2")])),
            ["u2"]
        );
    }

    #[test]
    fn recent_window_resend_appends_only_the_tail() {
        let h = [u("u1"), a("a1"), u("u2"), a("a2")];
        assert_eq!(
            contents(to_append(&h, &[u("u2"), a("a2"), u("u3")])),
            ["u3"]
        );
    }

    #[test]
    fn unmatched_messages_are_never_dropped() {
        let h = [u("u1"), a("a1")];
        let m = [u("x"), a("y"), u("u2")];
        assert_eq!(contents(to_append(&h, &m)), ["x", "y", "u2"]);
    }

    #[test]
    fn a_repeated_utterance_is_a_new_message() {
        let h = [u("yes"), a("a1")];
        assert_eq!(contents(to_append(&h, &[u("yes")])), ["yes"]);
    }

    #[test]
    fn a_retry_after_a_failed_call_is_not_a_duplicate() {
        let h = [u("u1")];
        assert!(to_append(&h, &[u("u1")]).is_empty());
    }

    #[test]
    fn empty_sides() {
        assert_eq!(contents(to_append(&[], &[u("u1")])), ["u1"]);
        assert!(to_append(&[u("u1")], &[]).is_empty());
    }

    #[test]
    fn shortened_assistant_text_lines_up() {
        let h = [u("joke?"), a("Why did the scarecrow win an award?")];
        let m = [u("joke?"), a("Why did the"), u("story instead")];
        assert_eq!(contents(to_append(&h, &m)), ["story instead"]);
        // But a user message is never matched by prefix.
        let h = [u("tell me a joke")];
        assert_eq!(contents(to_append(&h, &[u("tell me")])), ["tell me"]);
    }

    #[test]
    fn tool_call_ids_must_agree() {
        let call = |id: &str| {
            let mut m = Message::new("assistant", Value::Null);
            m.tool_calls = Some(vec![json!({"id": id, "type": "function",
                "function": {"name": "f", "arguments": "{}"}})]);
            m
        };
        let result = |id: &str| {
            let mut m = Message::new("tool", "42");
            m.tool_call_id = Some(id.into());
            m
        };
        let h = [u("q"), call("c1"), result("c1")];
        assert!(to_append(&h, &[u("q"), call("c1"), result("c1")]).is_empty());
        assert_eq!(to_append(&h, &[call("c2"), result("c2")]).len(), 2);
        assert_eq!(to_append(&h, &[result("c2")]).len(), 1);
    }

    #[test]
    fn stored_extension_fields_do_not_prevent_a_match() {
        let mut stored = u("u1");
        stored.turn_id = Some(1);
        stored.timestamp = Some(5);
        stored
            .metadata_mut()
            .insert("source".into(), json!("message"));
        assert!(to_append(&[stored, a("a1")], &[u("u1"), a("a1"), u("u2")]).len() == 1);
    }
}
