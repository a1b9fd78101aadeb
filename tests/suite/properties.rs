//! Properties of the pure decisions, over random histories: what the
//! upstream is sent (`render::outbound`), how much a session drops
//! (`window::keep_start`, `window::keep_start_bytes`), and which request
//! messages are new (`reconcile::reconcile`). Histories mix plain turns,
//! tool groups (an assistant message with tool calls followed by its
//! results, some left unanswered), interrupted replies, recorded failures,
//! superseded messages, system messages and stray tool results; texts come
//! from a tiny alphabet so that messages collide and reconcile has real
//! choices to make. `tests/behaviours.rs` drives real sessions through
//! random client behaviours.

use proptest::prelude::*;
use recall::config::{InterruptedRendering, Roles};
use recall::memory::interruption::{
    added_by_recall, failure_reply, interrupted_reply, is_failure, is_interrupted, is_superseded,
    supersede,
};
use recall::memory::message::{Message, Role};
use recall::memory::reconcile::{reconcile, Hints};
use recall::memory::render::{check, outbound, outbound_reaching, Reach};
use recall::memory::summary::{fold, Due, Remembered, Summary};
use recall::memory::tokens::Encoding;
use recall::memory::window::{keep_start, keep_start_bytes, Limits};
use recall::proxy::protocol::{Vendor, VendorRules};
use serde_json::{json, Value};
use std::sync::Arc;

/// A few hundred cases each: enough to shrink to small counterexamples,
/// and the whole file runs in well under a second.
fn config() -> ProptestConfig {
    ProptestConfig {
        // PROPTEST_CASES runs more locally; CI runs these.
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(400),
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
    /// A reply a regenerate replaced.
    Superseded(&'static str),
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
        1 => text().prop_map(Entry::Superseded),
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
                "new_request",
            )),
            Entry::Superseded(t) => {
                let mut m = Message::new(Role::Assistant, *t);
                supersede(&mut m, 1);
                out.push(m);
            }
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
    (
        0usize..12,
        prop_oneof![Just(0usize), 1usize..60],
        prop_oneof![Just(0usize), 1usize..80],
    )
        .prop_map(|(messages, chars, tokens)| Limits {
            messages,
            chars,
            tokens,
            encoding: Encoding::Approx,
        })
}

fn rules() -> impl Strategy<Value = VendorRules> {
    (
        any::<bool>(),
        prop::sample::select(vec![
            InterruptedRendering::Truncated,
            InterruptedRendering::Original,
            InterruptedRendering::Annotated,
        ]),
        any::<bool>(),
    )
        .prop_map(|(custom, interrupted, alternate)| VendorRules {
            mode: if custom {
                Vendor::Custom
            } else {
                Vendor::Openai
            },
            interruptable: true,
            strip_fields: Vec::new(),
            interrupted,
            interrupted_marker: " [cut]".into(),
            roles: if alternate {
                Roles::Alternate
            } else {
                Roles::Any
            },
        })
}

/// The part no limit cuts, as trimming defines it: from the newest user
/// message on, or, with none, from the last message a cut may start at
/// (anything but a tool result).
fn protected(h: &[Message]) -> usize {
    h.iter()
        .rposition(|m| m.role == Role::User)
        .or_else(|| h.iter().rposition(|m| !m.is_tool_result()))
        .unwrap_or(h.len())
}

/// What a sent window costs, counted on what is sent: (messages,
/// characters, tokens), the extension fields included for vendor "custom".
fn sent_cost(
    sent: &[std::sync::Arc<Message>],
    custom: bool,
    enc: Encoding,
) -> (usize, usize, usize) {
    let mut chars = 0;
    let mut tokens = 0;
    for m in sent {
        chars += m.char_cost();
        tokens += m.tokens(enc);
        if custom {
            let ext = json!({"turn_id": m.turn_id, "timestamp": m.timestamp,
                             "metadata": m.metadata.as_ref().map(|md| md.to_value())});
            let mut ext = ext.as_object().cloned().unwrap_or_default();
            ext.retain(|_, v| !v.is_null());
            if !ext.is_empty() {
                let text = Value::Object(ext).to_string();
                chars += text.chars().count();
                tokens += enc.count(&text);
            }
        }
    }
    (sent.len(), chars, tokens)
}

proptest! {
    #![proptest_config(config())]

    /// For any stored history, what is sent is a conversation every chat
    /// API accepts, within its limits on what is sent, and leaves out only
    /// what it must.
    #[test]
    fn every_window_is_one_the_upstream_accepts(h in history(), l in limits(), r in rules()) {
        let h: Vec<Message> = h.into_iter().filter(|m| !m.is_instruction()).collect();
        let sent = outbound(&h, &r, l);
        prop_assert!(sent.start <= h.len());
        let whole = outbound(&h, &r, Limits::default()).messages == sent.messages;
        if let Err(e) = check(&sent.messages, r.roles, whole) {
            prop_assert!(false, "{}: {:?}", e, sent.messages);
        }
        prop_assert!(sent.messages.iter().all(|m| !is_superseded(m) && !is_failure(m)));
        // The newest user message is always sent.
        if let Some(newest) = h.iter().rposition(|m| m.role == Role::User) {
            prop_assert!(sent.start <= newest, "the newest user message was cut");
        }
        // The limits hold on what is sent, unless all of it is the part
        // that is always sent (the newest user message and what follows).
        let (n, chars, tokens) = sent_cost(&sent.messages, r.sends_extensions(), l.encoding);
        let within = (l.messages == 0 || n <= l.messages)
            && (l.chars == 0 || chars <= l.chars)
            && (l.tokens == 0 || tokens <= l.tokens);
        // That part is one user message and what follows it, or with no
        // user message, one message or one tool group.
        let users = sent.messages.iter().filter(|m| m.role == Role::User).count();
        let one_unit = sent.messages.len() <= 1
            || (sent.messages[0].has_tool_calls()
                && sent.messages[1..].iter().all(|m| m.is_tool_result()));
        let only_protected = if h.iter().any(|m| m.role == Role::User && !is_superseded(m)) {
            users == 1 && sent.messages.first().is_some_and(|m| m.role == Role::User)
        } else {
            one_unit
        };
        prop_assert!(within || only_protected, "{} messages, {} chars, {} tokens exceed {:?}", n, chars, tokens, l);
        // Without limits, nothing is left out but what the grammar drops
        // (and, for an upstream that needs it, what precedes the first
        // user message).
        if l == Limits::default() {
            let first_user = h.iter().position(|m| m.role == Role::User && !is_superseded(m));
            if let (Some(first), Roles::Alternate) = (first_user, r.roles) {
                prop_assert_eq!(sent.start, first);
            }
            if r.roles == Roles::Any {
                // Every user message is sent.
                let users = |ms: &mut dyn Iterator<Item = &Message>| {
                    ms.filter(|m| m.role == Role::User && !is_superseded(m)).count()
                };
                prop_assert_eq!(users(&mut sent.messages.iter().map(|m| &**m)), users(&mut h.iter()));
            }
            prop_assert_eq!(sent.reason, None);
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
    is_failure(m)
        || added_by_recall(m)
        || is_superseded(m)
        || (m.role == Role::Assistant && is_interrupted(m))
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
    /// the stored messages it keeps, in which only what a client may leave
    /// out (interrupted replies, recorded failures, superseded messages) is
    /// passed over.
    #[test]
    fn reconcile_drops_only_messages_that_line_up(
        h in stored_history(), sent in request(), retry in any::<bool>(),
    ) {
        let r = reconcile(&h, &sent, Hints { front_dropped: false, retry });
        let taken = r.new_from(sent.len());
        let kept = r.superseded_from().unwrap_or(h.len());
        prop_assert!(taken <= sent.len());
        prop_assert!(kept <= h.len());
        prop_assert!(
            lines_up_in_a_run(&h[..kept], &sent[..taken]),
            "{} sent messages were taken as stored, but they do not line up with the history kept", taken
        );
        for (i, _) in &r.shortened {
            prop_assert!(*i < h.len() && h[*i].role == Role::Assistant, "shortened {} is no stored reply", i);
        }
    }

    /// A delta client: messages unlike anything stored are all new.
    #[test]
    fn new_messages_are_all_appended(h in stored_history(), n in 1usize..4, dropped in any::<bool>()) {
        let sent = fresh(n);
        let hints = Hints { front_dropped: dropped, retry: false };
        prop_assert_eq!(reconcile(&h, &sent, hints).new_from(n), 0);
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
        let r = reconcile(&h, &sent, Hints::default());
        prop_assert_eq!(r.new_from(sent.len()), h.len() - from);
        prop_assert!(r.shortened.is_empty());
        // Nothing stored is superseded by a plain resend.
        prop_assert!(r.superseded_from().is_none_or(|i| i == h.len()));
    }
}

proptest! {
    #![proptest_config(config())]

    /// Turn after turn of a growing history, with a running summary folded
    /// whenever it is due: the window reaches back to the summary's end and
    /// sends everything from there as the whole rendering would, as a
    /// conversation the upstream accepts; folds follow one another with
    /// nothing skipped; a fold never ends inside a tool group; and a reach
    /// past its limit sends exactly the plain window. So every message is
    /// in the window or folded, but for a counted gap.
    #[test]
    fn a_summary_and_its_window_leave_nothing_out(
        h in history(),
        l in limits(),
        every in 1usize..5,
        max in prop_oneof![Just(usize::MAX), 0usize..8],
        r in rules(),
    ) {
        let h: Vec<Arc<Message>> = h
            .into_iter()
            .filter(|m| !m.is_instruction())
            .map(Arc::new)
            .collect();
        let mut remembered = Remembered::default();
        let due = Due { messages: every, tokens: 0, encoding: Encoding::Approx };
        for end in 1..=h.len() {
            let turn = &h[..end];
            let from = remembered.uncovered_from(0) as usize;
            let sent = outbound_reaching(turn, &r, l, Some(Reach { from, max }));
            let plain = outbound(turn, &r, l);
            prop_assert_eq!(sent.plain_start, plain.start);
            if sent.gap {
                prop_assert_eq!(&sent.messages, &plain.messages);
                prop_assert!(from < plain.start);
                // The gap is only ever left behind, never papered over.
                remembered.summary = Some(Box::new(Summary {
                    text: "s".into(),
                    until: plain.start as u64,
                    model: "m".into(),
                    at_ms: 0,
                    covered_tokens: 0,
                }));
                continue;
            }
            if let Err(e) = check(&sent.messages, r.roles, sent.messages == outbound(turn, &r, Limits::default()).messages) {
                prop_assert!(false, "{}: {:?}", e, sent.messages);
            }
            // What is sent is what the whole rendering ends with, and all
            // it leaves out is what the summary covers.
            let whole = outbound(turn, &r, Limits::default()).messages;
            if r.roles == Roles::Any {
                prop_assert!(sent.messages.len() <= whole.len());
                let tail = &whole[whole.len() - sent.messages.len()..];
                prop_assert_eq!(&sent.messages[..], tail);
            }
            if r.roles == Roles::Any {
                let covered = outbound(&turn[..from.min(end)], &r, Limits::default()).messages;
                prop_assert!(whole.len() - sent.messages.len() <= covered.len(),
                    "{} messages left out, the summary covers {}", whole.len() - sent.messages.len(), covered.len());
            }
            if let Some(f) = fold(turn, 0, &remembered, sent.plain_start, Some(due)) {
                prop_assert_eq!(f.from, from as u64, "a fold skipped messages");
                let end_at = f.until as usize;
                prop_assert!(end_at == turn.len() || !turn[end_at].is_tool_result(),
                    "a fold ends inside a tool group at {}", end_at);
                remembered.summary = Some(Box::new(Summary {
                    text: "s".into(),
                    until: f.until,
                    model: "m".into(),
                    at_ms: 0,
                    covered_tokens: 0,
                }));
            }
        }
    }
}
