//! What an interrupted reply looks like in memory, and how the model sees it.
//!
//! Seed 000's shape: `content` is what actually went out, and `metadata`
//! holds `interrupted: true`, `interrupt_timestamp` (Unix ms) and
//! `original`, the complete text the model generated. recall adds
//! `original_complete`, which says whether `original` is whole (the upstream
//! may have been closed, or the drain may have hit its limits), and `error`
//! when the reply was cut by an upstream failure rather than by the user.

use std::borrow::Cow;

use serde_json::Value;

use crate::config::InterruptedRendering;
use crate::memory::message::{Message, Role};

pub const INTERRUPTED: &str = "interrupted";
pub const INTERRUPT_TIMESTAMP: &str = "interrupt_timestamp";
pub const ORIGINAL: &str = "original";
pub const ORIGINAL_COMPLETE: &str = "original_complete";
pub const ORIGINAL_TOOL_CALLS: &str = "original_tool_calls";
pub const ERROR: &str = "error";
/// `error` of a record whose drain was cut short because a live request
/// needed the upstream's slot (`max_concurrent`).
pub const DRAIN_YIELDED: &str = "drain_yielded";
/// Who cut a reply off: `new_request`, `endpoint` and `replica` are the
/// user barging in; `client_gone`, `shutdown` and `upstream` mean the
/// client never got the reply whole, so sending the turn again is a retry.
pub const CUT_BY: &str = "cut_by";
pub const SUPERSEDED: &str = "superseded";
pub const SUPERSEDED_AT: &str = "superseded_at";
/// Why: `regenerate`, `edit`, `retry`, or `deleted` (the Conversations API).
pub const SUPERSEDED_BY: &str = "superseded_by";
pub const SOURCE_FAILURE: &str = "llm_failure";
/// `cut_by` of a reply whose stream broke off upstream.
pub const CUT_BY_UPSTREAM: &str = "upstream";
/// `cut_by` of a reply whose client closed its stream.
pub const CLIENT_GONE: &str = "client_gone";
/// `cut_by` of a reply a newer request of its session cut (barge-in).
pub const BARGE_IN: &str = "new_request";

pub fn is_interrupted(m: &Message) -> bool {
    m.metadata
        .as_ref()
        .and_then(|md| md.get(INTERRUPTED))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

pub fn is_failure(m: &Message) -> bool {
    m.source() == Some(SOURCE_FAILURE)
}

/// A message a regenerate, an edit or a retry replaced: it stays stored,
/// but no window, cache or resend sees it.
pub fn is_superseded(m: &Message) -> bool {
    m.metadata
        .as_ref()
        .and_then(|md| md.get(SUPERSEDED))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

pub fn supersede(m: &mut Message, at_ms: i64) {
    let md = m.metadata_mut();
    md.insert(SUPERSEDED, Value::Bool(true));
    md.insert(SUPERSEDED_AT, at_ms.into());
}

/// A recorded reply that never reached its client whole for a reason other
/// than the user: a failed call, or a reply cut because the client left,
/// recall shut down, or the upstream broke off. The same request sent
/// again re-runs the turn.
pub fn undelivered(m: &Message) -> bool {
    is_failure(m)
        || (is_interrupted(m)
            && matches!(
                m.meta_str(CUT_BY),
                Some(CLIENT_GONE | "shutdown" | CUT_BY_UPSTREAM)
            ))
}

/// What a new request of the session makes of a reply recorded as cut
/// because its client closed the stream (`cut_by: "client_gone"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// The user talked over it: the client cancelled the stream and sent
    /// the next turn at once (Pipecat closes first, then sends). The
    /// record says `new_request`.
    BargeIn,
    /// The client left, or came back for the same turn (a retry): the
    /// record stays `client_gone`.
    Left,
}

/// How a request arriving at `now_ms` reads `m`, the newest stored
/// message, when it is a reply its client closed; `None` when it is not.
/// Within `window_ms` of the close and not a retry, it is a barge-in.
pub fn after_close(m: &Message, now_ms: i64, window_ms: u64, retry: bool) -> Option<Closed> {
    if m.role != Role::Assistant || !is_interrupted(m) || m.meta_str(CUT_BY) != Some(CLIENT_GONE) {
        return None;
    }
    let at = m
        .metadata
        .as_ref()
        .and_then(|md| md.get(INTERRUPT_TIMESTAMP))
        .and_then(Value::as_i64)?;
    let window = i64::try_from(window_ms).unwrap_or(i64::MAX);
    let soon = window > 0 && (0..=window).contains(&now_ms.saturating_sub(at));
    Some(if soon && !retry {
        Closed::BargeIn
    } else {
        Closed::Left
    })
}

/// Rewrites a reply's cause as a barge-in (`after_close` said so).
pub fn barged_in(m: &mut Message) {
    m.metadata_mut()
        .insert(CUT_BY, Value::String(BARGE_IN.into()));
}

/// Messages recall added without the client: a client that resends its
/// conversation may not have them.
pub fn added_by_recall(m: &Message) -> bool {
    is_failure(m) || from_the_session_api(m)
}

/// Messages an agent added through the session API (a greeting, a
/// command, a silence reminder): no regenerate, edit or retry of the
/// client's supersedes them.
pub fn from_the_session_api(m: &Message) -> bool {
    matches!(m.source(), Some("greeting" | "command" | "silence"))
}

/// What the user actually heard, as an agent reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spoken {
    Text(String),
    Chars(usize),
}

impl Spoken {
    /// The content that replaces `current`.
    pub fn apply(&self, current: &str) -> String {
        match self {
            Spoken::Text(t) => t.clone(),
            Spoken::Chars(n) => current.chars().take(*n).collect(),
        }
    }
}

/// Turns the part of a reply that went out into the interrupted record.
/// `full` is everything the upstream had sent by then.
pub fn interrupted_reply(
    mut relayed: Message,
    full: &Message,
    full_complete: bool,
    at_ms: i64,
    spoken: Option<&Spoken>,
    cut_by: &'static str,
) -> Message {
    if let Some(spoken) = spoken {
        let current = relayed.content_str().unwrap_or_default().to_owned();
        relayed.content = Value::String(spoken.apply(&current));
    }
    let md = relayed.metadata_mut();
    md.insert(INTERRUPTED, Value::Bool(true));
    md.insert(INTERRUPT_TIMESTAMP, at_ms.into());
    md.insert(CUT_BY, Value::String(cut_by.into()));
    set_original(&mut relayed, full, full_complete);
    relayed
}

/// Records (or updates) the complete reply on an interrupted message.
pub fn set_original(m: &mut Message, full: &Message, complete: bool) {
    let text = full.content_str().unwrap_or_default().to_owned();
    let calls = full.tool_calls().cloned();
    let differs = calls.as_ref() != m.tool_calls();
    let md = m.metadata_mut();
    md.insert(ORIGINAL, Value::String(text));
    md.insert(ORIGINAL_COMPLETE, Value::Bool(complete));
    match calls {
        Some(calls) if differs => {
            md.insert(ORIGINAL_TOOL_CALLS, Value::Array(calls));
        }
        _ => {
            md.remove(ORIGINAL_TOOL_CALLS);
        }
    }
}

/// The fields a drain or a break sets on a record after it was written
/// (`set_original`, `set_error`), as they are on `m`.
pub fn late_fields(m: &Message) -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    for key in [ORIGINAL, ORIGINAL_COMPLETE, ORIGINAL_TOOL_CALLS, ERROR] {
        if let Some(v) = m.metadata.as_ref().and_then(|md| md.get(key)) {
            out.insert(key.to_owned(), v.clone());
        }
    }
    out
}

/// Puts `late_fields` back on a message read from storage.
pub fn merge_late_fields(m: &mut Message, fields: serde_json::Map<String, Value>) {
    let md = m.metadata_mut();
    for (key, value) in fields {
        md.insert(key, value);
    }
}

pub fn set_error(m: &mut Message, error: &str) {
    m.metadata_mut()
        .insert(ERROR, Value::String(error.to_owned()));
}

/// Marks a stored reply as interrupted after the fact: the agent says the
/// user heard only `spoken` of it. The stored text becomes `original`
/// unless an earlier interruption already recorded one.
pub fn mark_stored(m: &mut Message, spoken: Option<&Spoken>, at_ms: i64, cut_by: &'static str) {
    let current = m.content_str().unwrap_or_default().to_owned();
    if !is_interrupted(m) {
        let full = m.clone();
        let md = m.metadata_mut();
        md.insert(INTERRUPTED, Value::Bool(true));
        md.insert(INTERRUPT_TIMESTAMP, at_ms.into());
        md.insert(CUT_BY, Value::String(cut_by.into()));
        set_original(m, &full, true);
    }
    if let Some(spoken) = spoken {
        m.content = Value::String(spoken.apply(&current));
    }
}

/// The assistant message recorded for a failed call.
pub fn failure_reply(text: &str, error: &str) -> Message {
    let mut m = Message::new(Role::Assistant, text);
    m.metadata_mut()
        .insert("source", Value::String(SOURCE_FAILURE.into()));
    set_error(&mut m, error);
    m
}

/// The message as the model should see it, or `None` to leave it out.
/// Only interrupted replies change, and failure records are left out.
/// Tool calls are kept: whether they were answered is `render`'s to judge.
pub fn render<'a>(
    m: &'a Message,
    mode: InterruptedRendering,
    marker: &str,
) -> Option<Cow<'a, Message>> {
    if is_failure(m) {
        // The call failed: the model never said it, and showing it would
        // make the question look answered.
        return None;
    }
    if m.role != "assistant" || !is_interrupted(m) {
        return Some(Cow::Borrowed(m));
    }
    if mode == InterruptedRendering::Truncated && m.content_str().is_some_and(|t| !t.is_empty()) {
        // Shown as stored: no copy, and its cached token count stays.
        return Some(Cow::Borrowed(m));
    }
    let mut out = m.clone();
    let stored = m.content_str().unwrap_or_default();
    let text = match mode {
        InterruptedRendering::Truncated => stored.to_owned(),
        InterruptedRendering::Original => m.meta_str(ORIGINAL).unwrap_or(stored).to_owned(),
        InterruptedRendering::Annotated => format!("{stored}{marker}").trim_start().to_owned(),
    };
    if text.is_empty() && !out.has_tool_calls() {
        // Nothing was said: an empty assistant turn would only confuse.
        return None;
    }
    out.content = if text.is_empty() {
        Value::Null
    } else {
        Value::String(text)
    };
    Some(Cow::Owned(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reply(text: &str) -> Message {
        Message::new(Role::Assistant, text)
    }

    #[test]
    fn interrupted_reply_has_seed_000_fields() {
        let m = interrupted_reply(
            reply("Why did"),
            &reply("Why did the scarecrow"),
            true,
            42,
            None,
            "new_request",
        );
        assert_eq!(m.content, "Why did");
        assert_eq!(
            m.metadata.unwrap().to_value(),
            json!({"interrupted": true, "interrupt_timestamp": 42,
                   "cut_by": "new_request",
                   "original": "Why did the scarecrow", "original_complete": true})
        );
    }

    #[test]
    fn spoken_overrides_what_was_relayed() {
        let text = Spoken::Text("Why".into());
        let m = interrupted_reply(
            reply("Why did"),
            &reply("Why did it"),
            false,
            1,
            Some(&text),
            "endpoint",
        );
        assert_eq!(m.content, "Why");
        let m = interrupted_reply(
            reply("Why did"),
            &reply("Why did it"),
            false,
            1,
            Some(&Spoken::Chars(5)),
            "endpoint",
        );
        assert_eq!(m.content, "Why d");
        assert_eq!(Spoken::Chars(99).apply("héllo"), "héllo");
    }

    #[test]
    fn marking_a_stored_reply_keeps_the_first_original() {
        let mut m = reply("The whole story.");
        mark_stored(&mut m, Some(&Spoken::Chars(9)), 5, "endpoint");
        assert_eq!(m.content, "The whole");
        assert_eq!(m.meta_str(ORIGINAL), Some("The whole story."));
        mark_stored(&mut m, Some(&Spoken::Text("The".into())), 6, "endpoint");
        assert_eq!(m.content, "The");
        assert_eq!(m.meta_str(ORIGINAL), Some("The whole story."));
        assert_eq!(
            m.metadata.as_ref().unwrap().get(INTERRUPT_TIMESTAMP),
            Some(&Value::from(5))
        );
    }

    #[test]
    fn rendering_modes() {
        let m = interrupted_reply(
            reply("Why did"),
            &reply("Why did it"),
            true,
            1,
            None,
            "endpoint",
        );
        let r = |mode| render(&m, mode, " [cut]").map(|c| c.content.clone());
        assert_eq!(r(InterruptedRendering::Truncated), Some(json!("Why did")));
        assert_eq!(r(InterruptedRendering::Original), Some(json!("Why did it")));
        assert_eq!(
            r(InterruptedRendering::Annotated),
            Some(json!("Why did [cut]"))
        );
        let plain = reply("fine");
        assert!(matches!(
            render(&plain, InterruptedRendering::Original, ""),
            Some(Cow::Borrowed(_))
        ));
    }

    #[test]
    fn silent_cut_replies_are_left_out() {
        let empty = interrupted_reply(reply(""), &reply("long answer"), true, 1, None, "endpoint");
        assert!(render(&empty, InterruptedRendering::Truncated, "").is_none());
        assert!(render(&empty, InterruptedRendering::Original, "").is_some());
    }

    #[test]
    fn who_cut_a_reply_tells_a_retry_from_a_barge_in() {
        let cut = |by| interrupted_reply(reply("Why"), &reply("Why not"), false, 1, None, by);
        for by in ["client_gone", "shutdown", CUT_BY_UPSTREAM] {
            assert!(undelivered(&cut(by)), "{by}");
        }
        for by in ["new_request", "endpoint", "replica"] {
            assert!(!undelivered(&cut(by)), "{by}");
        }
        assert!(undelivered(&failure_reply("Sorry.", "503")));
        assert!(!undelivered(&reply("fine")));
    }

    #[test]
    fn a_request_soon_after_a_close_is_a_barge_in_unless_it_retries() {
        let closed = |at| {
            interrupted_reply(
                reply("Why"),
                &reply("Why not"),
                false,
                at,
                None,
                CLIENT_GONE,
            )
        };
        let m = closed(1_000);
        assert_eq!(after_close(&m, 1_000, 2_000, false), Some(Closed::BargeIn));
        assert_eq!(after_close(&m, 3_000, 2_000, false), Some(Closed::BargeIn));
        assert_eq!(after_close(&m, 3_001, 2_000, false), Some(Closed::Left));
        assert_eq!(after_close(&m, 1_200, 2_000, true), Some(Closed::Left));
        assert_eq!(after_close(&m, 1_200, 0, false), Some(Closed::Left), "off");
        // A clock that went back says nothing of how soon.
        assert_eq!(after_close(&m, 999, 2_000, false), Some(Closed::Left));
        for by in ["new_request", "endpoint", "shutdown", CUT_BY_UPSTREAM] {
            let cut = interrupted_reply(reply("Why"), &reply("Why not"), false, 1_000, None, by);
            assert_eq!(after_close(&cut, 1_100, 2_000, false), None, "{by}");
        }
        assert_eq!(after_close(&reply("whole"), 1_100, 2_000, false), None);

        let mut m = closed(1_000);
        barged_in(&mut m);
        assert_eq!(m.meta_str(CUT_BY), Some("new_request"));
        assert!(!undelivered(&m), "the same words again are a new utterance");
        assert_eq!(m.meta_str(ORIGINAL), Some("Why not"));
        assert_eq!(after_close(&m, 1_100, 2_000, false), None);
    }

    #[test]
    fn superseding_marks_and_keeps() {
        let mut m = reply("old");
        assert!(!is_superseded(&m));
        supersede(&mut m, 9);
        assert!(is_superseded(&m));
        assert_eq!(m.content, "old");
        assert_eq!(
            m.metadata.unwrap().get(SUPERSEDED_AT),
            Some(&Value::from(9))
        );
    }

    #[test]
    fn failure_reply_is_marked_and_not_shown_to_the_model() {
        let m = failure_reply("Sorry, try again.", "upstream answered 503");
        assert!(is_failure(&m));
        assert!(render(&m, InterruptedRendering::Original, "").is_none());
        assert_eq!(m.meta_str(ERROR), Some("upstream answered 503"));
    }
}
