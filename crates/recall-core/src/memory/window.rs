//! The window's limits, and which stored messages a session keeps.
//!
//! Trimming cuts the history at a group boundary: an assistant message
//! that makes tool calls and the tool results answering it are one group,
//! so a cut never lands on a `tool` message. The newest user message and
//! everything after it are never cut away, whatever the limits say. What
//! is sent upstream is `render`'s to decide.

use std::borrow::Borrow;

use crate::config::HistoryConfig;
use crate::memory::message::Message;
use crate::memory::tokens::Encoding;

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

impl Limits {
    /// The window `[history]` configures, counting tokens with `encoding`.
    pub fn of(history: &HistoryConfig, encoding: Encoding) -> Self {
        Self {
            messages: history.window_messages,
            chars: history.window_chars,
            tokens: history.window_tokens,
            encoding,
        }
    }
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
mod tests {
    use super::*;
    use crate::memory::message::Role;
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

    #[test]
    fn keep_drops_oldest_whole_groups() {
        let u = |t: &str| Message::new(Role::User, t);
        let a = |t: &str| Message::new(Role::Assistant, t);
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
        let h = [Message::new(Role::User, "q"), call("c1"), result("c1")];
        assert_eq!(keep_start(&h, 1), 0);
        let h = [Message::new(Role::Assistant, "greeting")];
        assert_eq!(keep_start(&h, 1), 0);
    }
}
