//! Which stored messages go upstream, and which a session keeps.
//!
//! Both decisions cut the history at a group boundary: an assistant message
//! that makes tool calls and the tool results answering it are one group,
//! so a cut never lands on a `tool` message. The newest user message and
//! everything after it are never cut away, whatever the limits say.

use std::borrow::Borrow;

use crate::message::Message;
use crate::tokens::Encoding;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// At most this many messages (0 = no limit).
    pub messages: usize,
    /// At most this many characters, by `Message::char_cost` (0 = no limit).
    pub chars: usize,
    /// At most this many tokens, by `Message::tokens` (0 = no limit).
    pub tokens: usize,
    /// How the model the window is for counts tokens.
    pub encoding: Encoding,
}

/// Where a window starts, and why it leaves out what comes before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// `history[start..]` is sent; `start` messages are left out.
    pub start: usize,
    /// The limit that one more message would have exceeded; `None` when no
    /// limit was reached (nothing is left out, or only tool results whose
    /// call is gone).
    pub reason: Option<TrimReason>,
}

/// Index of the first message to send upstream: `history[start..]` is the
/// window and `start` is how many messages were trimmed.
pub fn window_start<H: Borrow<Message>>(history: &[H], limits: Limits) -> usize {
    window(history, limits).start
}

/// The newest messages within every limit, starting at a group boundary,
/// and never less than the newest user message and what follows it.
pub fn window<H: Borrow<Message>>(history: &[H], limits: Limits) -> Window {
    let floor = protected_start(history);
    let mut start = floor;
    // Counting costs: characters and tokens only when they are limited.
    // Tokens are cached in each message, so a walk over the same history
    // counts only the messages added since the last one.
    let cost = |m: &H| {
        let m = m.borrow();
        let chars = if limits.chars == 0 { 0 } else { m.char_cost() };
        let tokens = if limits.tokens == 0 {
            0
        } else {
            m.tokens(limits.encoding)
        };
        (chars, tokens)
    };
    let (mut chars, mut tokens) = history[floor..]
        .iter()
        .map(cost)
        .fold((0usize, 0usize), |(c, t), (dc, dt)| {
            (c.saturating_add(dc), t.saturating_add(dt))
        });
    let mut reason = None;
    // Walk back from the protected tail while every limit still holds,
    // remembering the earliest position where a cut is allowed.
    for i in (0..floor).rev() {
        let (c, t) = cost(&history[i]);
        chars = chars.saturating_add(c);
        tokens = tokens.saturating_add(t);
        let count = history.len() - i;
        reason = if limits.messages != 0 && count > limits.messages {
            Some(TrimReason::MaxMessages)
        } else if limits.chars != 0 && chars > limits.chars {
            Some(TrimReason::MaxChars)
        } else if limits.tokens != 0 && tokens > limits.tokens {
            Some(TrimReason::MaxTokens)
        } else {
            None
        };
        if reason.is_some() {
            break;
        }
        if can_start_at(history, i) {
            start = i;
        }
    }
    Window { start, reason }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TrimReason {
    MaxMessages,
    MaxChars,
    MaxTokens,
    MaxBytes,
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
    first_start_from(history, history.len() - max, floor)
}

/// How many of the oldest messages to drop so that the rest hold at most
/// `max` bytes (`Message::byte_cost`; 0 = no limit), given that all of them
/// hold `total`. Groups stay whole and the newest turn is always kept. It
/// looks only at what it drops, so a long history costs nothing extra.
pub fn keep_start_bytes<H: Borrow<Message>>(history: &[H], total: usize, max: usize) -> usize {
    if max == 0 || total <= max {
        return 0;
    }
    let floor = protected_start(history);
    let mut excess = total - max;
    let mut first_kept = 0;
    while first_kept < floor && excess > 0 {
        excess = excess.saturating_sub(history[first_kept].borrow().byte_cost());
        first_kept += 1;
    }
    first_start_from(history, first_kept, floor)
}

/// The first place from `from` on where the kept history may begin; never
/// past `floor`, the newest turn.
fn first_start_from<H: Borrow<Message>>(history: &[H], from: usize, floor: usize) -> usize {
    (from..floor)
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
mod bytes_tests {
    use super::*;
    use crate::message::Role;
    use serde_json::{json, Value};

    fn total(h: &[Message]) -> usize {
        h.iter().map(Message::byte_cost).sum()
    }

    #[test]
    fn the_oldest_go_until_the_rest_fit_and_groups_stay_whole() {
        let u = |t: &str| Message::new(Role::User, t);
        let a = |t: &str| Message::new(Role::Assistant, t);
        let h = vec![u("aaaa"), a("bbbb"), u("cccc"), a("dddd"), u("eeee")];
        assert_eq!(keep_start_bytes(&h, total(&h), 0), 0);
        assert_eq!(keep_start_bytes(&h, total(&h), 20), 0);
        assert_eq!(keep_start_bytes(&h, total(&h), 12), 2);
        // The newest user message stays, whatever its size.
        assert_eq!(keep_start_bytes(&h, total(&h), 1), 4);

        let mut call = Message::new(Role::Assistant, Value::Null);
        call.set_tool_calls(Some(vec![json!({"id": "c", "type": "function",
            "function": {"name": "f", "arguments": ""}})]));
        let mut result = Message::new(Role::Tool, "r".repeat(10));
        result.set_tool_call_id(Some("c".into()));
        let h = vec![u("x".repeat(10).as_str()), call, result, a("ok"), u("next")];
        // Dropping the call would strand its result: the result goes too.
        let start = keep_start_bytes(&h, total(&h), total(&h) - 11);
        assert_eq!(start, 3, "{start}");
    }

    #[test]
    fn an_interrupted_replys_original_counts() {
        let mut m = Message::new(Role::Assistant, "cut");
        m.metadata_mut()
            .insert("original", Value::String("cut off mid-sentence".into()));
        assert_eq!(m.byte_cost(), 3 + 20);
    }
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
            ..Limits::default()
        }
    }
    fn chars(n: usize) -> Limits {
        Limits {
            chars: n,
            ..Limits::default()
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
            ..Limits::default()
        };
        assert_eq!(window(&h, both).reason, Some(TrimReason::MaxMessages));
        let chars = Limits {
            messages: 10,
            chars: 6,
            ..Limits::default()
        };
        assert_eq!(window(&h, chars).reason, Some(TrimReason::MaxChars));
        assert_eq!(window(&h, count(10)).reason, None);
        // Four messages would start with a tool result: the window is two,
        // and it was the count that stopped it, not characters.
        let h = [
            u("q"),
            call("c1"),
            result("c1"),
            result("c1b"),
            a("done"),
            u("next"),
        ];
        assert_eq!(
            window(&h, count(4)),
            Window {
                start: 4,
                reason: Some(TrimReason::MaxMessages)
            }
        );
    }

    fn tokens(n: usize, encoding: Encoding) -> Limits {
        Limits {
            tokens: n,
            encoding,
            ..Limits::default()
        }
    }

    #[test]
    fn token_limit_keeps_the_newest() {
        // "hello world" is 2 tokens in both encodings, and each role 1:
        // 3 + 1 + 2 = 6 a message.
        for enc in [Encoding::O200k, Encoding::Cl100k] {
            let h = [
                u("hello world"),
                a("hello world"),
                u("hello world"),
                a("hello world"),
                u("hello world"),
            ];
            assert_eq!(window_start(&h, tokens(30, enc)), 0);
            assert_eq!(window_start(&h, tokens(18, enc)), 2);
            assert_eq!(window_start(&h, tokens(17, enc)), 3);
            assert_eq!(
                window(&h, tokens(17, enc)).reason,
                Some(TrimReason::MaxTokens)
            );
        }
    }

    #[test]
    fn unknown_models_are_bounded_by_the_estimate() {
        // u("abcd"): 3 + "user" 1 + "abcd" 1 = 5; a("abcd"): 3 + 3 + 1 = 7.
        let h = [u("abcd"), a("abcd"), u("abcd")];
        assert_eq!(window_start(&h, tokens(17, Encoding::Approx)), 0);
        assert_eq!(window_start(&h, tokens(16, Encoding::Approx)), 1);
        assert_eq!(window_start(&h, tokens(11, Encoding::Approx)), 2);
    }

    #[test]
    fn token_limit_keeps_the_newest_user_message_and_tool_groups_whole() {
        let enc = Encoding::O200k;
        let long = "many words in a long question ".repeat(20);
        let h = [u("a"), a("b"), u(&long)];
        assert_eq!(window_start(&h, tokens(10, enc)), 2);
        let h = [u("old"), a("x"), u("weather?"), call("c1"), result("c1")];
        assert_eq!(window_start(&h, tokens(1, enc)), 2);
        // Room for the tool result but not its call: neither is sent.
        let h = [u("q"), call("c1"), result("c1"), a("done"), u("next")];
        let tail: usize = h[3..].iter().map(|m| m.tokens(enc)).sum();
        let with_result = tail + h[2].tokens(enc);
        assert_eq!(window_start(&h, tokens(with_result, enc)), 3);
        let with_call = with_result + h[1].tokens(enc);
        assert_eq!(window_start(&h, tokens(with_call, enc)), 1);
    }

    #[test]
    fn the_tightest_of_all_limits_wins_and_is_named() {
        let enc = Encoding::O200k;
        // 6 tokens and 11 characters each.
        let h = [
            u("hello world"),
            a("hello world"),
            u("hello world"),
            a("hello world"),
            u("hello world"),
        ];
        let all = |messages, chars, tokens| Limits {
            messages,
            chars,
            tokens,
            encoding: enc,
        };
        assert_eq!(
            window(&h, all(4, 100, 100)),
            Window {
                start: 1,
                reason: Some(TrimReason::MaxMessages)
            }
        );
        assert_eq!(
            window(&h, all(4, 33, 100)),
            Window {
                start: 2,
                reason: Some(TrimReason::MaxChars)
            }
        );
        assert_eq!(
            window(&h, all(4, 33, 12)),
            Window {
                start: 3,
                reason: Some(TrimReason::MaxTokens)
            }
        );
        assert_eq!(window_start(&h, all(1, 33, 12)), 4);
        assert_eq!(window_start(&h, all(0, 0, 0)), 0);
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
