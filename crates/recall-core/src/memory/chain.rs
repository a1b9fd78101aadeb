//! Responses in a session's history. A response is kept as a
//! mark on the first message of its input (`metadata.response`: its key,
//! the last part of its id; how many input messages it has; and what the
//! Response echoes), so it
//! is stored, forked, trimmed and deleted with the messages, on every
//! backend, with no record of its own. Its output is the assistant
//! messages after its input. Pure: where a response is, and whether a
//! request that continues from it appends or forks.

use std::borrow::Borrow;
use std::ops::Range;

use super::interruption;
pub use super::message::MARK_KEY as KEY;
use super::message::{Message, ResponseMark, Role};

/// Marks `m` as the first input message of a response.
pub fn mark(m: &mut Message, record: ResponseMark) {
    m.metadata_mut().set_mark(record);
}

/// The response `m` opens, if any.
pub fn record(m: &Message) -> Option<&ResponseMark> {
    m.metadata.as_ref()?.mark()
}

/// The key of the response `m` opens.
pub fn key_of(m: &Message) -> Option<&str> {
    Some(&record(m)?.key)
}

/// Where a response sits in a history, by index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub input: Range<usize>,
    /// Its replies: the assistant messages after the input, up to the next
    /// client message or response (empty while the reply is in flight).
    pub output: Range<usize>,
}

pub fn find<H: Borrow<Message>>(history: &[H], key: &str) -> Option<Span> {
    let start = history
        .iter()
        .position(|m| key_of(m.borrow()) == Some(key))?;
    let count = record(history[start].borrow()).map_or(1, |r| r.input_items) as usize;
    // The input is its own messages only: it ends early at another mark.
    let mut end = start + 1;
    while end < history.len()
        && end < start.saturating_add(count.max(1))
        && key_of(history[end].borrow()).is_none()
    {
        end += 1;
    }
    let mut out = end;
    while out < history.len() {
        let m = history[out].borrow();
        if m.role != Role::Assistant || key_of(m).is_some() {
            break;
        }
        out += 1;
    }
    Some(Span {
        input: start..end,
        output: end..out,
    })
}

/// What continuing from a response does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Position {
    /// No such response in this history.
    Unknown,
    /// Nothing the client can see follows it: the new input is appended.
    Newest,
    /// Later messages follow: the new response forks, seeing the history
    /// up to `end` (exclusive) and none of what follows.
    Older { end: usize },
}

pub fn position<H: Borrow<Message>>(history: &[H], key: &str) -> Position {
    let Some(span) = find(history, key) else {
        return Position::Unknown;
    };
    let end = span.output.end;
    let later = history[end..]
        .iter()
        .any(|m| !interruption::is_superseded(m.borrow()));
    // As in OpenAI's API, continuing a conversation's response by its id
    // leaves the conversation as it is.
    let in_conversation =
        record(history[span.input.start].borrow()).is_some_and(|r| r.conversation.is_some());
    if later || in_conversation {
        Position::Older { end }
    } else {
        Position::Newest
    }
}

/// The newest response, when a request that says it retries sends its
/// input again: the history's last visible response has exactly
/// `incoming` as input, and nothing visible follows its replies. Its
/// messages are then superseded, and the input stored once more.
pub fn retried<H: Borrow<Message>>(history: &[H], incoming: &[Message]) -> Option<Span> {
    let last = history.iter().rposition(|m| {
        let m = m.borrow();
        key_of(m).is_some() && !interruption::is_superseded(m)
    })?;
    let span = find(history, key_of(history[last].borrow())?)?;
    let input = &history[span.input.clone()];
    let same = input.len() == incoming.len()
        && input
            .iter()
            .zip(incoming)
            .all(|(stored, sent)| super::reconcile::same_message(stored.borrow(), sent));
    let later = history[span.output.end..]
        .iter()
        .any(|m| !interruption::is_superseded(m.borrow()));
    (same && !later).then_some(span)
}

/// What a Responses API turn does to a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Continue {
    /// `after` names no response here.
    Unknown,
    /// Append the input; first supersede the messages from `retry_from`
    /// on, an earlier attempt of this same request.
    Append { retry_from: Option<usize> },
    /// Start a new session from the history up to `end`.
    Fork { end: usize },
}

/// A turn continuing the response `after` (else, a conversation's newest
/// message) with `incoming`, which the client says it retries or not.
///
/// A retry after a response goes in place of the attempt stored right
/// after it, if that attempt had this input (the client never saw its
/// answer, or it would not retry), instead of forking beside it. In a
/// conversation nothing names where the attempt went, so only a newest
/// response with this input whose reply never reached its client whole
/// (none yet, a failure, a cut not made by the user) is taken for one: a
/// first attempt refused before anything was stored leaves an earlier
/// turn that said the same as it was.
pub fn continues<H: Borrow<Message>>(
    history: &[H],
    after: Option<&str>,
    incoming: &[Message],
    retrying: bool,
) -> Continue {
    let attempt = if retrying {
        retried(history, incoming)
    } else {
        None
    };
    match after {
        Some(key) => match position(history, key) {
            Position::Unknown => Continue::Unknown,
            Position::Newest => Continue::Append { retry_from: None },
            Position::Older { end } => match attempt {
                Some(span) if span.input.start == end => Continue::Append {
                    retry_from: Some(end),
                },
                _ => Continue::Fork { end },
            },
        },
        None => {
            let retry_from = attempt
                .filter(|span| {
                    history[span.output.clone()]
                        .iter()
                        .map(Borrow::borrow)
                        .filter(|m| !interruption::is_superseded(m))
                        .all(interruption::undelivered)
                })
                .map(|span| span.input.start);
            Continue::Append { retry_from }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marked(role: Role, text: &str, id: &str, items: u64) -> Message {
        let mut m = Message::new(role, text);
        let r = ResponseMark {
            key: id.into(),
            input_items: items,
            ..Default::default()
        };
        mark(&mut m, r);
        m
    }

    fn chain() -> Vec<Message> {
        vec![
            marked(Role::User, "one", "r1", 1),
            Message::new(Role::Assistant, "a1"),
            marked(Role::User, "two", "r2", 2),
            Message::new(Role::User, "two, more"),
            Message::new(Role::Assistant, "a2"),
        ]
    }

    #[test]
    fn a_response_spans_its_input_and_the_replies_after_it() {
        let h = chain();
        assert_eq!(
            find(&h, "r1"),
            Some(Span {
                input: 0..1,
                output: 1..2
            })
        );
        assert_eq!(
            find(&h, "r2"),
            Some(Span {
                input: 2..4,
                output: 4..5
            })
        );
        assert_eq!(find(&h, "r3"), None);
    }

    #[test]
    fn the_newest_response_appends_and_an_older_one_forks_at_its_end() {
        let h = chain();
        assert_eq!(position(&h, "r2"), Position::Newest);
        assert_eq!(position(&h, "r1"), Position::Older { end: 2 });
        assert_eq!(position(&h, "nope"), Position::Unknown);
    }

    #[test]
    fn a_reply_still_in_flight_leaves_its_response_the_newest() {
        let mut h = chain();
        h.push(marked(Role::User, "three", "r3", 1));
        assert_eq!(position(&h, "r3"), Position::Newest);
        assert_eq!(find(&h, "r3").map(|s| s.output), Some(6..6));
    }

    #[test]
    fn superseded_messages_after_a_response_do_not_make_it_older() {
        let mut h = chain();
        let mut gone = Message::new(Role::User, "edited away");
        interruption::supersede(&mut gone, 1);
        h.push(gone);
        assert_eq!(position(&h, "r2"), Position::Newest);
        // A chat turn after it (one memory, two APIs) does.
        h.push(Message::new(Role::User, "from chat"));
        assert_eq!(position(&h, "r2"), Position::Older { end: 5 });
    }

    #[test]
    fn a_response_of_a_conversation_is_continued_by_its_id_in_a_fork() {
        let mut h = chain();
        let mut m = Message::new(Role::User, "in a conversation");
        let r = ResponseMark {
            key: "c1".into(),
            input_items: 1,
            conversation: Some("conv_1".into()),
            ..Default::default()
        };
        mark(&mut m, r);
        h.push(m);
        h.push(Message::new(Role::Assistant, "a3"));
        assert_eq!(position(&h, "c1"), Position::Older { end: 7 });
    }

    #[test]
    fn a_retry_is_the_newest_response_with_the_same_input_and_nothing_after_it() {
        let h = chain();
        let again = [
            Message::new(Role::User, "two"),
            Message::new(Role::User, "two, more"),
        ];
        assert_eq!(retried(&h, &again).map(|s| s.input), Some(2..4));
        assert_eq!(retried(&h, &again[..1]), None, "another input");
        assert_eq!(
            retried(&h, &[Message::new(Role::User, "one")]),
            None,
            "not the newest"
        );
        let mut later = h.clone();
        later.push(Message::new(Role::User, "from chat"));
        assert_eq!(retried(&later, &again), None);
    }

    #[test]
    fn a_retry_after_a_response_replaces_the_attempt_after_it_and_never_the_response() {
        let h = chain();
        let two = [
            Message::new(Role::User, "two"),
            Message::new(Role::User, "two, more"),
        ];
        // The attempt after r1 had this input: it is replaced.
        assert_eq!(
            continues(&h, Some("r1"), &two, true),
            Continue::Append {
                retry_from: Some(2)
            }
        );
        assert_eq!(
            continues(&h, Some("r1"), &two, false),
            Continue::Fork { end: 2 }
        );
        // The same input after r2, the newest: r2 is what is continued.
        assert_eq!(
            continues(&h, Some("r2"), &two, true),
            Continue::Append { retry_from: None }
        );
        assert_eq!(continues(&h, Some("nope"), &two, true), Continue::Unknown);
    }

    #[test]
    fn a_retry_in_a_conversation_replaces_only_an_attempt_whose_reply_was_not_delivered() {
        let two = [
            Message::new(Role::User, "two"),
            Message::new(Role::User, "two, more"),
        ];
        // r2's reply reached its client: a first attempt refused before it
        // was stored leaves r2 alone.
        assert_eq!(
            continues(&chain(), None, &two, true),
            Continue::Append { retry_from: None }
        );
        let mut failed = chain();
        failed[4] = interruption::failure_reply("", "upstream 500");
        assert_eq!(
            continues(&failed, None, &two, true),
            Continue::Append {
                retry_from: Some(2)
            }
        );
        let mut in_flight = chain();
        in_flight.pop();
        assert_eq!(
            continues(&in_flight, None, &two, true),
            Continue::Append {
                retry_from: Some(2)
            }
        );
        assert_eq!(
            continues(&in_flight, None, &two, false),
            Continue::Append { retry_from: None }
        );
    }

    #[test]
    fn a_forged_input_count_does_not_overflow() {
        let mut h = chain();
        let r = ResponseMark {
            key: "big".into(),
            input_items: u64::MAX,
            ..Default::default()
        };
        mark(&mut h[0], r);
        assert_eq!(find(&h, "big").map(|s| s.input), Some(0..2));
    }

    #[test]
    fn an_input_count_past_the_next_mark_stops_there() {
        let mut h = chain();
        // A record that claims more input than there is before r2.
        h[0] = marked(Role::User, "one", "r1", 5);
        h.remove(1);
        assert_eq!(find(&h, "r1").map(|s| s.input), Some(0..1));
    }
}
