//! Properties of the pure decisions, over random histories: where the
//! window starts and why (`window::window`), how much a session drops
//! (`window::keep_start`, `window::keep_start_bytes`), and which request
//! messages are new (`reconcile::reconcile`). Histories mix plain turns, tool groups (an
//! assistant message with tool calls followed by its results, some left
//! unanswered), interrupted replies, recorded failures, system messages and
//! stray tool results; texts come from a tiny alphabet so that messages
//! collide and reconcile has real choices to make.

use proptest::prelude::*;
use recall::interruption::{failure_reply, interrupted_reply, is_failure, is_interrupted};
use recall::message::{Message, Role};
use recall::reconcile::reconcile;
use recall::window::{keep_start, keep_start_bytes, window, Limits};
use serde_json::{json, Value};

/// A few hundred cases each: enough to shrink to small counterexamples,
/// and the whole file runs in well under a second.
fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 400,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

#[derive(Debug, Clone)]
enum Entry {
    User(&'static str),
    Assistant(&'static str),
    /// A reply cut off after `said`, whose full text was `original`.
    Interrupted(&'static str, &'static str),
    Failure,
    /// An assistant message calling `calls` tools, then the first
    /// `answered` results.
    Tools {
        calls: usize,
        answered: usize,
    },
    System(&'static str),
    /// A tool result whose call is not stored (trimmed away, or seeded so).
    StrayResult,
}

const TEXTS: &[&str] = &["", "a", "b", "ab", "hello there"];

fn text() -> impl Strategy<Value = &'static str> {
    prop::sample::select(TEXTS)
}

fn entry() -> impl Strategy<Value = Entry> {
    prop_oneof![
        4 => text().prop_map(Entry::User),
        4 => text().prop_map(Entry::Assistant),
        1 => (text(), text()).prop_map(|(s, o)| Entry::Interrupted(s, o)),
        1 => Just(Entry::Failure),
        2 => (1usize..4, 0usize..4).prop_map(|(c, a)| Entry::Tools { calls: c, answered: a.min(c) }),
        1 => text().prop_map(Entry::System),
        1 => Just(Entry::StrayResult),
    ]
}

fn call_message(ids: &[String]) -> Message {
    let mut m = Message::new(Role::Assistant, Value::Null);
    m.set_tool_calls(Some(
        ids.iter()
            .map(|id| json!({"id": id, "type": "function", "function": {"name": "f", "arguments": "{}"}}))
            .collect(),
    ));
    m
}

fn result_message(id: &str) -> Message {
    let mut m = Message::new(Role::Tool, "42");
    m.set_tool_call_id(Some(id.to_owned()));
    m
}

/// Flattens entries into messages; tool call ids are unique per history.
fn build(entries: &[Entry]) -> Vec<Message> {
    let mut out = Vec::new();
    for (n, e) in entries.iter().enumerate() {
        match e {
            Entry::User(t) => out.push(Message::new(Role::User, *t)),
            Entry::Assistant(t) => out.push(Message::new(Role::Assistant, *t)),
            Entry::Interrupted(said, original) => out.push(interrupted_reply(
                Message::new(Role::Assistant, *said),
                &Message::new(Role::Assistant, *original),
                true,
                1,
                None,
            )),
            Entry::Failure => out.push(failure_reply("Sorry.", "503")),
            Entry::Tools { calls, answered } => {
                let ids: Vec<String> = (0..*calls).map(|c| format!("call-{n}-{c}")).collect();
                out.push(call_message(&ids));
                out.extend(ids.iter().take(*answered).map(|id| result_message(id)));
            }
            Entry::System(t) => out.push(Message::new(Role::System, *t)),
            Entry::StrayResult => out.push(result_message(&format!("gone-{n}"))),
        }
    }
    out
}

fn history() -> impl Strategy<Value = Vec<Message>> {
    prop::collection::vec(entry(), 0..14).prop_map(|e| build(&e))
}

fn limits() -> impl Strategy<Value = Limits> {
    (0usize..12, prop_oneof![Just(0usize), 1usize..60]).prop_map(|(messages, chars)| Limits {
        messages,
        chars,
        ..Limits::default()
    })
}

/// The part no limit cuts, as the window's docs define it: from the newest
/// user message on, or, with none, from the last message a window may
/// start with (anything but a tool result).
fn protected(h: &[Message]) -> usize {
    h.iter()
        .rposition(|m| m.role == Role::User)
        .or_else(|| h.iter().rposition(|m| !m.is_tool_result()))
        .unwrap_or(h.len())
}

fn chars(h: &[Message]) -> usize {
    h.iter().map(Message::char_cost).sum()
}

fn within(h: &[Message], from: usize, l: Limits) -> bool {
    (l.messages == 0 || h.len() - from <= l.messages)
        && (l.chars == 0 || chars(&h[from..]) <= l.chars)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn the_window_keeps_groups_the_newest_turn_and_its_bounds(h in history(), l in limits()) {
        let cut = window(&h, l);
        let start = cut.start;
        let floor = protected(&h);
        prop_assert!(start <= floor, "start {} cuts into the protected tail at {}", start, floor);
        // Never splits a tool group: a result never opens the window, so
        // every result in it comes with the call stored just before it.
        if let Some(first) = h.get(start) {
            prop_assert!(!first.is_tool_result(), "the window starts with a tool result at {}", start);
        }
        if let Some(newest_user) = h.iter().rposition(|m| m.role == Role::User) {
            prop_assert!(start <= newest_user);
        }
        // Within both limits, unless it is only the protected tail (the one
        // group allowed to exceed them).
        prop_assert!(start == floor || within(&h, start, l), "window from {} exceeds {:?}", start, l);
        // A reason is given exactly when a limit left something out.
        match cut.reason {
            Some(_) => prop_assert!(start > 0),
            None => prop_assert!(h[..start].iter().all(Message::is_tool_result)),
        }
        // And it trims no more than it must: any earlier place a window may
        // start would break a limit.
        for i in 0..start {
            if !h[i].is_tool_result() {
                prop_assert!(!within(&h, i, l), "could have started at {} instead of {}", i, start);
            }
        }
    }

    #[test]
    fn a_session_drops_whole_groups_and_never_the_newest_turn(h in history(), max in 0usize..12) {
        let drop = keep_start(&h, max);
        prop_assert!(drop <= h.len());
        if max == 0 || h.len() <= max {
            prop_assert_eq!(drop, 0);
            return Ok(());
        }
        let floor = protected(&h);
        prop_assert!(drop <= floor, "dropped {} past the protected tail at {}", drop, floor);
        if let Some(first) = h.get(drop) {
            prop_assert!(drop == 0 || !first.is_tool_result(), "kept history starts with a tool result");
        }
        prop_assert!(h.len() - drop <= max || drop == floor, "kept {} > {}", h.len() - drop, max);
        // It drops as few as it can.
        let earliest = h.len() - max;
        if let Some(i) = (earliest..drop.min(floor)).find(|&i| !h[i].is_tool_result()) {
            prop_assert!(false, "could have kept from {} instead of {}", i, drop);
        }
    }

    #[test]
    fn a_session_over_its_byte_budget_drops_whole_groups_and_never_the_newest_turn(
        h in history(), max in 0usize..400,
    ) {
        let total: usize = h.iter().map(Message::byte_cost).sum();
        let drop = keep_start_bytes(&h, total, max);
        prop_assert!(drop <= h.len());
        if max == 0 || total <= max {
            prop_assert_eq!(drop, 0);
            return Ok(());
        }
        let floor = protected(&h);
        prop_assert!(drop <= floor, "dropped {} past the protected tail at {}", drop, floor);
        if let Some(first) = h.get(drop) {
            prop_assert!(drop == 0 || !first.is_tool_result(), "kept history starts with a tool result");
        }
        let kept: usize = h[drop..].iter().map(Message::byte_cost).sum();
        prop_assert!(kept <= max || drop == floor, "kept {} bytes > {}", kept, max);
    }
}

/// Loosely the same message, as `reconcile` may take a sent message for a
/// stored one: same role and tool-call ids, and the same text, or for a
/// reply, text the stored (or originally generated) text starts with.
fn may_line_up(stored: &Message, sent: &Message) -> bool {
    if stored.role != sent.role || stored.tool_call_id() != sent.tool_call_id() {
        return false;
    }
    if !stored.tool_call_ids().eq(sent.tool_call_ids()) {
        return false;
    }
    if stored.content == sent.content || stored.role != Role::Assistant {
        return stored.content == sent.content;
    }
    let sent_text = sent.content_str().unwrap_or("");
    let stored_text = stored.content_str().unwrap_or("");
    let original = stored.meta_str("original").unwrap_or("");
    stored_text.trim_end() == sent_text.trim_end()
        || stored_text.starts_with(sent_text)
        || original.starts_with(sent_text)
        || (sent_text.trim().is_empty() && stored.has_tool_calls())
}

/// Whether `sent` lines up, in order, with some run of `h` that passes
/// over only messages a client may leave out.
fn lines_up_in_a_run(h: &[Message], sent: &[Message]) -> bool {
    if sent.is_empty() {
        return true;
    }
    // from[i][j]: sent[j..] lines up starting at h[i].
    let mut from = vec![vec![false; sent.len() + 1]; h.len() + 1];
    for row in from.iter_mut() {
        row[sent.len()] = true;
    }
    for i in (0..h.len()).rev() {
        for j in (0..sent.len()).rev() {
            from[i][j] = (may_line_up(&h[i], &sent[j]) && from[i + 1][j + 1])
                || (j > 0 && left_out_allowed(&h[i]) && from[i + 1][j]);
        }
    }
    (0..h.len()).any(|i| from[i][0])
}

fn left_out_allowed(m: &Message) -> bool {
    is_failure(m) || (m.role == Role::Assistant && is_interrupted(m))
}

/// What a client sends: drawn from the same entries (so it collides with
/// the history), without instructions, which the chat path removes first.
fn request() -> impl Strategy<Value = Vec<Message>> {
    prop::collection::vec(entry(), 0..8).prop_map(|e| {
        build(&e)
            .into_iter()
            .filter(|m| !m.is_instruction())
            .collect()
    })
}

fn stored_history() -> impl Strategy<Value = Vec<Message>> {
    history().prop_map(|h| h.into_iter().filter(|m| !m.is_instruction()).collect())
}

fn fresh(n: usize) -> Vec<Message> {
    (0..n)
        .map(|i| Message::new(Role::User, format!("new-{i}")))
        .collect()
}

proptest! {
    #![proptest_config(config())]

    /// Reconcile never drops a request message that does not line up: the
    /// messages it takes as already stored line up, in order, with a run of
    /// stored messages, in which only what a client may leave out
    /// (interrupted replies, recorded failures) is passed over.
    #[test]
    fn reconcile_drops_only_messages_that_line_up(h in stored_history(), sent in request()) {
        let r = reconcile(&h, &sent, false);
        prop_assert!(r.overlap <= sent.len());
        prop_assert!(r.overlap <= h.len(), "more messages already stored than the history holds");
        prop_assert!(
            lines_up_in_a_run(&h, &sent[..r.overlap]),
            "{} sent messages were taken as stored, but they do not line up with the history", r.overlap
        );
        for (i, _) in &r.shortened {
            prop_assert!(*i < h.len() && h[*i].role == Role::Assistant, "shortened {} is no stored reply", i);
        }
    }

    /// A delta client: messages unlike anything stored are all new.
    #[test]
    fn new_messages_are_all_appended(h in stored_history(), n in 1usize..4, dropped in any::<bool>()) {
        let sent = fresh(n);
        prop_assert_eq!(reconcile(&h, &sent, dropped).overlap, 0);
    }

    /// A client resending the stored conversation, or its newest part,
    /// followed by new messages: exactly the new messages are appended.
    #[test]
    fn a_resent_tail_appends_only_what_is_new(
        h in stored_history(), from in 0usize..16, n in 0usize..3,
    ) {
        // Replies the client never saw whole may be left out or not; here
        // the history has none, so the resend is exact.
        let h: Vec<Message> = h.into_iter().filter(|m| !left_out_allowed(m)).collect();
        let from = from.min(h.len());
        let mut sent = h[from..].to_vec();
        sent.extend(fresh(n));
        let r = reconcile(&h, &sent, false);
        prop_assert_eq!(r.overlap, h.len() - from);
        prop_assert!(r.shortened.is_empty());
    }
}
