//! Reconciling what a client sends with what the session already holds.
//!
//! Some clients send only the new message, others resend the whole
//! conversation (or a recent part of it) every time. Both must leave the
//! history free of duplicates, and nothing a client sends may be dropped.

use std::borrow::Borrow;

use serde_json::Value;

use crate::interruption::{is_failure, is_interrupted};
use crate::message::Message;

/// The outcome of lining a request up with the stored history.
#[derive(Debug, Default, PartialEq)]
pub struct Reconciled {
    /// How many leading messages of the request are already stored; the
    /// rest are new and are to be appended.
    pub overlap: usize,
    /// Stored assistant replies (by history index) that the client resent
    /// shortened: the shorter text is what the user heard.
    pub shortened: Vec<(usize, String)>,
}

/// Finds the longest run of leading request messages that lines up with
/// the end of the history. Instructions (system and developer messages)
/// must already have been removed from `incoming`.
///
/// Replies the client never saw whole may be missing from what it resends:
/// interrupted replies (a voice framework may drop what was not spoken) and
/// recorded failures. Such stored messages may be skipped. But a request
/// that matches only by skipping an interrupted reply at the very end, with
/// nothing after it, is a new utterance (the user said the same thing again
/// after being answered), not a retry.
///
/// When older messages were dropped from the history (`max_messages`), a
/// client that resends everything starts with messages recall no longer
/// holds: the whole stored history may then line up further into the
/// request, and what comes before it counts as already seen.
pub fn reconcile<H: Borrow<Message>>(
    history: &[H],
    incoming: &[Message],
    front_dropped: bool,
) -> Reconciled {
    let mut best = Reconciled::default();
    // An alignment uses up every stored message from its start on, each
    // either matched by one sent message or skipped: starts earlier than
    // this cannot line up, so the cost follows the request, not the history.
    let earliest = earliest_start(history, incoming.len());
    for start in earliest..history.len() {
        if best.overlap == incoming.len() {
            return best;
        }
        if let Some(found) = align(history, start, incoming) {
            if found.overlap > best.overlap {
                best = found;
            }
        }
    }
    if front_dropped && earliest == 0 && !history.is_empty() {
        for skip in 1..incoming.len() {
            if best.overlap == incoming.len() {
                break;
            }
            if let Some(mut found) = align(history, 0, &incoming[skip..]) {
                found.overlap += skip;
                if found.overlap > best.overlap {
                    best = found;
                }
            }
        }
    }
    best
}

/// The first index from which the history holds at most `sent` messages
/// that a request must match (those it may leave out are not counted).
fn earliest_start<H: Borrow<Message>>(history: &[H], sent: usize) -> usize {
    let mut needed = 0;
    for (i, m) in history.iter().enumerate().rev() {
        if !may_be_left_out(m.borrow()) {
            needed += 1;
            if needed > sent {
                return i + 1;
            }
        }
    }
    0
}

/// Stored messages a client may not resend: recorded failures, and
/// interrupted replies (a voice framework may drop what was not spoken).
fn may_be_left_out(m: &Message) -> bool {
    is_failure(m) || (m.role == "assistant" && is_interrupted(m))
}

/// The messages of `incoming` that are new to `history`.
pub fn to_append<'a, H: Borrow<Message>>(history: &[H], incoming: &'a [Message]) -> &'a [Message] {
    &incoming[reconcile(history, incoming, false).overlap..]
}

/// Lines `incoming` up against `history[start..]`, which must be used up.
fn align<H: Borrow<Message>>(
    history: &[H],
    start: usize,
    incoming: &[Message],
) -> Option<Reconciled> {
    let mut found = Reconciled::default();
    let mut skipped_interrupted_at_end = false;
    for (i, stored) in history.iter().enumerate().skip(start) {
        let stored: &Message = stored.borrow();
        let sent = incoming.get(found.overlap);
        match sent.map(|m| lines_up(stored, m)) {
            Some(Match::Same) => {}
            Some(Match::Shortened(text)) => found.shortened.push((i, text)),
            Some(Match::No) | None => {
                if is_failure(stored) {
                    continue;
                }
                if may_be_left_out(stored) {
                    skipped_interrupted_at_end = true;
                    continue;
                }
                return None;
            }
        }
        found.overlap += 1;
        skipped_interrupted_at_end = false;
    }
    if skipped_interrupted_at_end && found.overlap == incoming.len() {
        // The request ends where a cut reply was: if it ends with a user
        // message, that message was said again and is new.
        if incoming[found.overlap - 1].role == "user" {
            found.overlap -= 1;
        }
    }
    (found.overlap > 0).then_some(found)
}

enum Match {
    No,
    Same,
    Shortened(String),
}

/// Whether a message a client sent is the same as a stored one: the role,
/// the content and the tool-call ids agree. A client may send an assistant
/// message shortened to what its user actually heard, so an assistant
/// message whose text is a prefix of the stored text lines up too.
fn lines_up(stored: &Message, sent: &Message) -> Match {
    if stored.role != sent.role || stored.tool_call_id() != sent.tool_call_id() {
        return Match::No;
    }
    if !stored.tool_call_ids().eq(sent.tool_call_ids()) {
        return Match::No;
    }
    if stored.content == sent.content {
        return Match::Same;
    }
    if stored.role != "assistant" {
        return Match::No;
    }
    match (&stored.content, &sent.content) {
        // Clients that trim whitespace, or blank the text of a tool-call
        // message, have not reported a cut.
        (Value::String(full), Value::String(part))
            if full.trim_end() == part.trim_end()
                || (part.trim().is_empty() && stored.has_tool_calls()) =>
        {
            Match::Same
        }
        (Value::String(full), Value::String(part)) if full.starts_with(part.as_str()) => {
            Match::Shortened(part.clone())
        }
        // Longer than what went out, but part of what was generated: the
        // client knows more than recall relayed; keep the record as it is.
        (Value::String(_), Value::String(part))
            if stored
                .meta_str(crate::interruption::ORIGINAL)
                .is_some_and(|o| o.starts_with(part.as_str())) =>
        {
            Match::Same
        }
        // An assistant message with only tool calls may come back as
        // `content: ""` from some clients and `null` from others.
        (Value::Null, Value::String(s)) | (Value::String(s), Value::Null) if s.is_empty() => {
            Match::Same
        }
        _ => Match::No,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Role;
    use serde_json::json;

    fn u(text: &str) -> Message {
        Message::new(Role::User, text)
    }
    fn a(text: &str) -> Message {
        Message::new(Role::Assistant, text)
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
        assert_eq!(contents(to_append::<Message>(&[], &[u("u1")])), ["u1"]);
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
            let mut m = Message::new(Role::Assistant, Value::Null);
            m.set_tool_calls(Some(vec![json!({"id": id, "type": "function",
                "function": {"name": "f", "arguments": "{}"}})]));
            m
        };
        let result = |id: &str| {
            let mut m = Message::new(Role::Tool, "42");
            m.set_tool_call_id(Some(id.into()));
            m
        };
        let h = [u("q"), call("c1"), result("c1")];
        assert!(to_append(&h, &[u("q"), call("c1"), result("c1")]).is_empty());
        assert_eq!(to_append(&h, &[call("c2"), result("c2")]).len(), 2);
        assert_eq!(to_append(&h, &[result("c2")]).len(), 1);
    }

    fn cut(text: &str, original: &str) -> Message {
        crate::interruption::interrupted_reply(a(text), &a(original), true, 1, None)
    }

    #[test]
    fn a_shortened_reply_is_reported() {
        let h = [u("joke?"), a("Why did the scarecrow win?")];
        let r = reconcile(&h, &[u("joke?"), a("Why did"), u("story")], false);
        assert_eq!(r.overlap, 2);
        assert_eq!(r.shortened, vec![(1, "Why did".to_owned())]);
        // The same text is no correction.
        let r = reconcile(
            &h,
            &[u("joke?"), a("Why did the scarecrow win?"), u("x")],
            false,
        );
        assert!(r.shortened.is_empty());
    }

    #[test]
    fn a_client_may_leave_out_an_interrupted_reply() {
        let h = [u("joke?"), cut("Why", "Why did the scarecrow")];
        assert_eq!(
            contents(to_append(&h, &[u("joke?"), u("story")])),
            ["story"]
        );
        // A delta client's new message is still new.
        assert_eq!(contents(to_append(&h, &[u("story")])), ["story"]);
        // Saying the same thing again after a cut reply is a new utterance.
        assert_eq!(contents(to_append(&h, &[u("joke?")])), ["joke?"]);
        // In the middle of a resent conversation too.
        let h = [u("1"), cut("", "x"), u("2"), a("b")];
        assert_eq!(
            contents(to_append(&h, &[u("1"), u("2"), a("b"), u("3")])),
            ["3"]
        );
    }

    #[test]
    fn resending_up_to_a_cut_reply_adds_only_the_repeated_utterance() {
        let h = [u("1"), a("b"), u("q"), cut("Why", "Why did")];
        assert_eq!(contents(to_append(&h, &[u("1"), a("b"), u("q")])), ["q"]);
    }

    #[test]
    fn a_full_resend_after_trimming_appends_only_the_new_tail() {
        let h = [u("u2"), a("a2"), u("u3"), a("a3")];
        let m = [
            u("u1"),
            a("a1"),
            u("u2"),
            a("a2"),
            u("u3"),
            a("a3"),
            u("u4"),
        ];
        let r = reconcile(&h, &m, true);
        assert_eq!(contents(&m[r.overlap..]), ["u4"]);
        // Without trimming, unknown leading messages are never dropped.
        assert_eq!(reconcile(&h, &m, false).overlap, 0);
        let h = [u("hi")];
        assert_eq!(reconcile(&h, &[u("other"), u("hi")], false).overlap, 0);
    }

    #[test]
    fn whitespace_or_blanked_tool_text_is_no_cut() {
        let h = [u("q"), a("Sure. ")];
        let r = reconcile(&h, &[u("q"), a("Sure."), u("n")], false);
        assert_eq!((r.overlap, r.shortened.len()), (2, 0));
        let mut call = a("Let me check.");
        call.set_tool_calls(Some(vec![json!({"id": "c1"})]));
        let mut sent = a("");
        sent.set_tool_calls(Some(vec![json!({"id": "c1"})]));
        let r = reconcile(&[u("q"), call], &[u("q"), sent], false);
        assert_eq!((r.overlap, r.shortened.len()), (2, 0));
    }

    #[test]
    fn a_recorded_failure_does_not_turn_a_retry_into_a_duplicate() {
        let fail = crate::interruption::failure_reply("Sorry.", "503");
        let h = [u("a"), a("b"), u("q"), fail];
        assert!(to_append(&h, &[u("q")]).is_empty());
        assert_eq!(contents(to_append(&h, &[u("q"), u("next")])), ["next"]);
    }

    #[test]
    fn text_beyond_what_went_out_still_lines_up() {
        let h = [u("q"), cut("Why", "Why did it")];
        let r = reconcile(&h, &[u("q"), a("Why did"), u("n")], false);
        assert_eq!((r.overlap, r.shortened.len()), (2, 0));
    }

    #[test]
    fn stored_extension_fields_do_not_prevent_a_match() {
        let mut stored = u("u1");
        stored.turn_id = Some(1);
        stored.timestamp = Some(5);
        stored.metadata_mut().insert("source", json!("message"));
        assert!(to_append(&[stored, a("a1")], &[u("u1"), a("a1"), u("u2")]).len() == 1);
    }
}
