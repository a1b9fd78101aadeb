//! Which stored messages go upstream, and which a session keeps.
//!
//! Both decisions cut the history at a group boundary: an assistant message
//! that makes tool calls and the tool results answering it are one group,
//! so a cut never lands on a `tool` message. The newest user message and
//! everything after it are never cut away, whatever the limits say.

use std::borrow::Borrow;

use crate::message::Message;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// At most this many messages (0 = no limit).
    pub messages: usize,
    /// At most this many characters, by `Message::char_cost` (0 = no limit).
    pub chars: usize,
}

/// Index of the first message to send upstream: `history[start..]` is the
/// window and `start` is how many messages were trimmed.
pub fn window_start<H: Borrow<Message>>(history: &[H], limits: Limits) -> usize {
    let floor = protected_start(history);
    let mut start = floor;
    // Counting characters costs: only when there is a limit on them.
    let cost = |m: &H| {
        if limits.chars == 0 {
            0
        } else {
            m.borrow().char_cost()
        }
    };
    let mut chars: usize = history[floor..].iter().map(cost).sum();
    // Walk back from the protected tail while both limits still hold,
    // remembering the earliest position where a cut is allowed.
    for i in (0..floor).rev() {
        chars = chars.saturating_add(cost(&history[i]));
        let count = history.len() - i;
        if (limits.messages != 0 && count > limits.messages)
            || (limits.chars != 0 && chars > limits.chars)
        {
            break;
        }
        if can_start_at(history, i) {
            start = i;
        }
    }
    start
}

/// Why a window left out older messages: what including one more would
/// have exceeded. Call only with `start > 0`.
pub fn trim_reason<H>(history: &[H], limits: Limits, start: usize) -> TrimReason {
    let widened = history.len() - start + 1;
    if limits.messages != 0 && widened > limits.messages {
        TrimReason::MaxMessages
    } else {
        TrimReason::MaxChars
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TrimReason {
    MaxMessages,
    MaxChars,
}

/// Where messages were trimmed from: the window sent upstream, or the
/// history a session keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TrimScope {
    Window,
    History,
}

/// How many of the oldest messages to drop so that at most `max` remain
/// (0 = keep all). Groups stay whole and the newest turn is always kept.
pub fn keep_start<H: Borrow<Message>>(history: &[H], max: usize) -> usize {
    if max == 0 || history.len() <= max {
        return 0;
    }
    let floor = protected_start(history);
    (history.len() - max..floor)
        .find(|&i| can_start_at(history, i))
        .unwrap_or(floor)
}

/// The start of the part that is never trimmed: the newest user message,
/// or failing that the last place a window may start.
fn protected_start<H: Borrow<Message>>(history: &[H]) -> usize {
    history
        .iter()
        .rposition(|m| m.borrow().role == "user")
        .or_else(|| (0..history.len()).rev().find(|&i| can_start_at(history, i)))
        .unwrap_or(history.len())
}

/// A window may not begin with a tool result: its tool call would be cut off.
fn can_start_at<H: Borrow<Message>>(history: &[H], i: usize) -> bool {
    !history[i].borrow().is_tool_result()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Role;
    use serde_json::{json, Value};

    fn u(t: &str) -> Message {
        Message::new(Role::User, t)
    }
    fn a(t: &str) -> Message {
        Message::new(Role::Assistant, t)
    }
    fn call(id: &str) -> Message {
        let mut m = Message::new(Role::Assistant, Value::Null);
        m.set_tool_calls(Some(vec![json!({"id": id, "type": "function",
            "function": {"name": "f", "arguments": ""}})]));
        m
    }
    fn result(id: &str) -> Message {
        let mut m = Message::new(Role::Tool, "ok");
        m.set_tool_call_id(Some(id.into()));
        m
    }
    fn count(n: usize) -> Limits {
        Limits {
            messages: n,
            chars: 0,
        }
    }
    fn chars(n: usize) -> Limits {
        Limits {
            messages: 0,
            chars: n,
        }
    }

    #[test]
    fn no_limits_sends_everything() {
        let h = [u("1"), a("2"), u("3")];
        assert_eq!(window_start(&h, Limits::default()), 0);
        assert_eq!(window_start::<Message>(&[], count(3)), 0);
    }

    #[test]
    fn count_limit_keeps_the_newest() {
        let h = [u("1"), a("2"), u("3"), a("4"), u("5")];
        assert_eq!(window_start(&h, count(3)), 2);
        assert_eq!(window_start(&h, count(2)), 3);
        assert_eq!(window_start(&h, count(10)), 0);
    }

    #[test]
    fn char_limit_counts_content() {
        let h = [u("aaaa"), a("bbbb"), u("cc")];
        assert_eq!(window_start(&h, chars(6)), 1);
        assert_eq!(window_start(&h, chars(5)), 2);
        assert_eq!(window_start(&h, chars(10)), 0);
    }

    #[test]
    fn newest_user_message_is_sent_even_when_too_long() {
        let h = [u("a"), a("b"), u("a very long message")];
        assert_eq!(window_start(&h, chars(3)), 2);
        assert_eq!(window_start(&h, count(1)), 2);
    }

    #[test]
    fn newest_turn_with_tool_loop_stays_whole() {
        let h = [u("old"), a("x"), u("weather?"), call("c1"), result("c1")];
        assert_eq!(window_start(&h, count(1)), 2);
        assert_eq!(window_start(&h, count(2)), 2);
        assert_eq!(window_start(&h, count(4)), 1);
    }

    #[test]
    fn window_never_starts_with_a_tool_result() {
        let h = [
            u("q"),
            call("c1"),
            result("c1"),
            result("c1b"),
            a("done"),
            u("next"),
        ];
        // Four messages would start at result("c1b"): move on to a("done").
        assert_eq!(window_start(&h, count(4)), 4);
        // Five start at the call, which brings its results along.
        assert_eq!(window_start(&h, count(5)), 1);
        assert_eq!(window_start(&h, count(6)), 0);
    }

    #[test]
    fn trim_reason_names_the_limit_that_cut() {
        let h = [u("aaaa"), a("bbbb"), u("cc")];
        let both = Limits {
            messages: 2,
            chars: 100,
        };
        assert_eq!(
            trim_reason(&h, both, window_start(&h, both)),
            TrimReason::MaxMessages
        );
        let chars = Limits {
            messages: 10,
            chars: 6,
        };
        assert_eq!(
            trim_reason(&h, chars, window_start(&h, chars)),
            TrimReason::MaxChars
        );
    }

    #[test]
    fn keep_drops_oldest_whole_groups() {
        let h = [u("1"), a("2"), u("3"), a("4"), u("5")];
        assert_eq!(keep_start(&h, 0), 0);
        assert_eq!(keep_start(&h, 5), 0);
        assert_eq!(keep_start(&h, 3), 2);
        let h = [u("q"), call("c1"), result("c1"), a("ok"), u("n")];
        assert_eq!(keep_start(&h, 3), 3);
        assert_eq!(keep_start(&h, 4), 1);
    }

    #[test]
    fn keep_never_drops_the_newest_turn() {
        let h = [u("q"), call("c1"), result("c1")];
        assert_eq!(keep_start(&h, 1), 0);
        let h = [a("greeting")];
        assert_eq!(keep_start(&h, 1), 0);
    }
}
