//! Reconciling what a client sends with what the session already holds.
//!
//! Some clients send only the new message, others resend the whole
//! conversation (or a recent part of it) every time; a UI regenerates or
//! edits, and an SDK retries a request whose reply it never got whole.
//! `reconcile` says which of these a request is, as a `Decision` the
//! session carries out: nothing is ever stored twice, and nothing a client
//! sends is dropped.

use std::borrow::Borrow;

use serde_json::Value;

use crate::interruption::{
    added_by_recall, from_the_session_api, is_failure, is_interrupted, is_superseded, undelivered,
};
use crate::message::Message;

/// What a request does to the stored history (`H`), given what it sends
/// (`M`, without instructions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// `M[from..]` is new: append it.
    Append { from: usize },
    /// The request runs the last turn again: the stored messages from
    /// `supersede` on (the reply its client never got whole) are
    /// superseded, and nothing is appended.
    Retry { supersede: usize },
    /// The client's view of the conversation differs from `H[at]` on (a
    /// regenerate, an edit): the stored messages from `at` on are
    /// superseded and `M[from..]` is appended.
    Diverge { at: usize, from: usize },
}

/// Why stored messages were superseded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rewrite {
    Regenerate,
    Edit,
    Retry,
}

impl Rewrite {
    pub fn label(self) -> &'static str {
        match self {
            Rewrite::Regenerate => "regenerate",
            Rewrite::Edit => "edit",
            Rewrite::Retry => "retry",
        }
    }
}

/// The outcome of lining a request up with the stored history.
#[derive(Debug, Clone, PartialEq)]
pub struct Reconciled {
    pub decision: Decision,
    /// Stored assistant replies (by history index) that the client resent
    /// shortened: the shorter text is what the user heard.
    pub shortened: Vec<(usize, String)>,
}

impl Reconciled {
    fn append(from: usize) -> Self {
        Self {
            decision: Decision::Append { from },
            shortened: Vec::new(),
        }
    }

    /// The first request message to append.
    pub fn new_from(&self, sent: usize) -> usize {
        match self.decision {
            Decision::Append { from } | Decision::Diverge { from, .. } => from,
            Decision::Retry { .. } => sent,
        }
    }

    /// The first stored index superseded, if any.
    pub fn superseded_from(&self) -> Option<usize> {
        match self.decision {
            Decision::Append { .. } => None,
            Decision::Retry { supersede: at } | Decision::Diverge { at, .. } => Some(at),
        }
    }

    /// Why messages from `superseded_from` on are superseded: `history` is
    /// the stored history the decision was made on.
    pub fn rewrite<H: Borrow<Message>>(&self, history: &[H], sent: usize) -> Option<Rewrite> {
        match self.decision {
            Decision::Append { .. } => None,
            Decision::Retry { .. } => Some(Rewrite::Retry),
            Decision::Diverge { at, from } => {
                let starts_at_reply = history.get(at).is_some_and(|m| m.borrow().role != "user");
                Some(if from == sent && starts_at_reply {
                    Rewrite::Regenerate
                } else {
                    Rewrite::Edit
                })
            }
        }
    }
}

/// What the request says about itself, beside its messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hints {
    /// Older messages were dropped from the history (`max_messages`): a
    /// client that resends everything starts with messages recall no
    /// longer holds.
    pub front_dropped: bool,
    /// The client says this is a retry (`x-stainless-retry-count` above
    /// 0, or the last turn's `Idempotency-Key`).
    pub retry: bool,
}

/// Decides what a request does to the history. Instructions (system and
/// developer messages) must already have been removed from `incoming`.
///
/// In order:
/// 1. **Retry**: the request adds nothing to the history without its
///    newest reply, and that reply never reached the client whole (the
///    client left, the call failed) or the client says it retries.
/// 2. **Append**: the longest run of leading request messages that lines
///    up with the end of the history (every stored message from its start
///    on either matched or one a client may leave out); the rest is new.
///    Its cost follows the request, not the stored history.
/// 3. **Diverge**: with evidence that the request is this conversation (a
///    stored user message and the reply that followed it appear in it, in
///    order), the request wins from the first message where it differs.
/// 4. Otherwise everything is new (a delta client).
///
/// Stored messages a client may not have are skipped when they do not
/// line up: interrupted replies, failure records, and what recall added
/// without the client (`greeting`, `command`, `silence`); superseded
/// messages are invisible. A request that matches only by skipping an
/// interrupted reply at the very end is a new utterance (the user said
/// the same thing again after being cut off), not a retry.
pub fn reconcile<H: Borrow<Message>>(
    history: &[H],
    incoming: &[Message],
    hints: Hints,
) -> Reconciled {
    if let Some(retry) = retry(history, incoming, hints) {
        return retry;
    }
    let found = overlap(history, incoming, hints.front_dropped);
    if found.overlap > 0 || incoming.len() < 2 {
        return Reconciled {
            decision: Decision::Append {
                from: found.overlap,
            },
            shortened: found.shortened,
        };
    }
    diverge(history, incoming, hints.front_dropped).unwrap_or_else(|| Reconciled::append(0))
}

/// The messages of `incoming` that are new to `history`.
pub fn to_append<'a, H: Borrow<Message>>(history: &[H], incoming: &'a [Message]) -> &'a [Message] {
    let r = reconcile(history, incoming, Hints::default());
    &incoming[r.new_from(incoming.len())..]
}

/// A retry re-runs the newest reply's turn: the request is already stored
/// whole once that reply is set aside.
fn retry<H: Borrow<Message>>(
    history: &[H],
    incoming: &[Message],
    hints: Hints,
) -> Option<Reconciled> {
    let start = reply_start(history);
    let mut reply = visible(&history[start..]).filter(|m| !from_the_session_api(m));
    let missed = reply.all(undelivered);
    if incoming.is_empty() || !(missed || hints.retry) {
        return None;
    }
    let found = overlap(&history[..start], incoming, hints.front_dropped);
    (found.overlap == incoming.len()).then_some(Reconciled {
        decision: Decision::Retry { supersede: start },
        shortened: found.shortened,
    })
}

/// Where the newest reply begins: after the last message a client sent
/// (or recall added), so that what follows is what the model produced.
fn reply_start<H: Borrow<Message>>(history: &[H]) -> usize {
    history
        .iter()
        .rposition(|m| {
            let m = m.borrow();
            !is_superseded(m) && !is_reply(m) && !from_the_session_api(m)
        })
        .map_or(0, |i| i + 1)
}

/// A recorded reply of the model (or its failure, or a cached answer).
fn is_reply(m: &Message) -> bool {
    m.role == "assistant" && matches!(m.source(), Some("llm" | "cache" | "llm_failure"))
}

fn visible<H: Borrow<Message>>(history: &[H]) -> impl Iterator<Item = &Message> {
    history
        .iter()
        .map(Borrow::borrow)
        .filter(|m| !is_superseded(m))
}

/// Stored messages a resend may leave out without differing.
fn may_be_left_out(m: &Message) -> bool {
    added_by_recall(m) || (m.role == "assistant" && is_interrupted(m))
}

#[derive(Debug, Default)]
struct Overlap {
    overlap: usize,
    shortened: Vec<(usize, String)>,
}

/// The longest run of leading request messages that lines up with the end
/// of the history. When older messages were dropped from the history, the
/// whole stored history may line up further into the request, and what
/// comes before it counts as already seen.
fn overlap<H: Borrow<Message>>(
    history: &[H],
    incoming: &[Message],
    front_dropped: bool,
) -> Overlap {
    let mut best = Overlap::default();
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
        let m = m.borrow();
        if !is_superseded(m) && !may_be_left_out(m) {
            needed += 1;
            if needed > sent {
                return i + 1;
            }
        }
    }
    0
}

/// Lines `incoming` up against `history[start..]`, which must be used up.
fn align<H: Borrow<Message>>(history: &[H], start: usize, incoming: &[Message]) -> Option<Overlap> {
    let mut found = Overlap::default();
    let mut skipped_interrupted_at_end = false;
    for (i, stored) in history.iter().enumerate().skip(start) {
        let stored: &Message = stored.borrow();
        if is_superseded(stored) {
            continue;
        }
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

/// The request is this conversation but differs from the stored one: it
/// wins from the first message where the two part.
fn diverge<H: Borrow<Message>>(
    history: &[H],
    incoming: &[Message],
    front_dropped: bool,
) -> Option<Reconciled> {
    let vis: Vec<usize> = (0..history.len())
        .filter(|&i| !is_superseded(history[i].borrow()))
        .collect();
    let at = |k: usize| history[vis[k]].borrow();
    let (anchor_k, anchor_q) = anchor(history, &vis, incoming)?;
    // Where the request's first message sits in the history: where it
    // lines up, or where walking back from the anchor puts it.
    let mut starts: Vec<Start> = (0..vis.len())
        .filter(|&k| !matches!(lines_up(at(k), &incoming[0]), Match::No))
        .map(Start::At)
        .collect();
    starts.push(walk_back(history, &vis, incoming, anchor_k, anchor_q));
    let mut best: Option<Walk> = None;
    for start in starts {
        let walk = walk_forward(history, &vis, incoming, start, front_dropped);
        let better = best.as_ref().is_none_or(|b| {
            walk.matched > b.matched || (walk.matched == b.matched && walk.k >= b.k)
        });
        if better {
            best = Some(walk);
        }
    }
    let walk = best?;
    let decision = if walk.k == vis.len() {
        // The whole stored history lines up and the request goes on.
        Decision::Append { from: walk.i }
    } else {
        Decision::Diverge {
            at: vis[walk.k],
            from: walk.i,
        }
    };
    Some(Reconciled {
        decision,
        shortened: walk.shortened,
    })
}

/// The newest pair of a user message and the reply that followed it that
/// the history and the request share: (visible index, request index).
fn anchor<H: Borrow<Message>>(
    history: &[H],
    vis: &[usize],
    incoming: &[Message],
) -> Option<(usize, usize)> {
    for q in (0..incoming.len().saturating_sub(1)).rev() {
        if incoming[q].role != "user" || incoming[q + 1].role != "assistant" {
            continue;
        }
        for k in (0..vis.len().saturating_sub(1)).rev() {
            let u = history[vis[k]].borrow();
            if u.role != "user" || !matches!(lines_up(u, &incoming[q]), Match::Same) {
                continue;
            }
            // Its reply: the next stored message, past any the client
            // may not have.
            for &j in &vis[k + 1..] {
                let a = history[j].borrow();
                if a.role == "assistant" && !matches!(lines_up(a, &incoming[q + 1]), Match::No) {
                    return Some((k, q));
                }
                if !may_be_left_out(a) {
                    break;
                }
            }
        }
    }
    None
}

#[derive(Debug, Clone, Copy)]
enum Start {
    /// The request's first message is the visible message `k`.
    At(usize),
    /// The request begins with `n` messages from before the first one
    /// stored.
    Before(usize),
}

/// Walks back from the anchor, one request message per visible stored one
/// (skipping what a client may leave out), to where the request begins.
fn walk_back<H: Borrow<Message>>(
    history: &[H],
    vis: &[usize],
    incoming: &[Message],
    mut k: usize,
    mut q: usize,
) -> Start {
    while q > 0 {
        if k == 0 {
            return Start::Before(q);
        }
        let stored = history[vis[k - 1]].borrow();
        if may_be_left_out(stored) && matches!(lines_up(stored, &incoming[q - 1]), Match::No) {
            k -= 1;
            continue;
        }
        k -= 1;
        q -= 1;
    }
    Start::At(k)
}

struct Walk {
    /// Request messages that lined up.
    matched: usize,
    /// Where the two part: request index, visible index.
    i: usize,
    k: usize,
    shortened: Vec<(usize, String)>,
}

/// Lines the request up from `start` until the two part or one ends.
fn walk_forward<H: Borrow<Message>>(
    history: &[H],
    vis: &[usize],
    incoming: &[Message],
    start: Start,
    front_dropped: bool,
) -> Walk {
    let (mut i, mut k) = match start {
        Start::At(k) => (0, k),
        // Messages recall dropped were seen; others it never had are the
        // request's, and it wins from its first message.
        Start::Before(n) if front_dropped => (n, 0),
        Start::Before(_) => {
            return Walk {
                matched: 0,
                i: 0,
                k: 0,
                shortened: Vec::new(),
            }
        }
    };
    let mut walk = Walk {
        matched: 0,
        i,
        k,
        shortened: Vec::new(),
    };
    while i < incoming.len() && k < vis.len() {
        let stored = history[vis[k]].borrow();
        match lines_up(stored, &incoming[i]) {
            Match::Same => {}
            Match::Shortened(text) => walk.shortened.push((vis[k], text)),
            Match::No if may_be_left_out(stored) => {
                k += 1;
                continue;
            }
            Match::No => break,
        }
        walk.matched += 1;
        i += 1;
        k += 1;
    }
    // Trailing messages a client may leave out do not make it differ.
    while i == incoming.len() && k < vis.len() && may_be_left_out(history[vis[k]].borrow()) {
        k += 1;
    }
    walk.i = i;
    walk.k = k;
    walk
}

enum Match {
    No,
    Same,
    Shortened(String),
}

/// Whether a message a client sent is the same as a stored one: the role,
/// the content and the tool calls agree. A client may send an assistant
/// message shortened to what its user actually heard, so an assistant
/// message whose text is a prefix of the stored text lines up too.
fn lines_up(stored: &Message, sent: &Message) -> Match {
    if stored.role != sent.role || stored.tool_call_id() != sent.tool_call_id() {
        return Match::No;
    }
    if !same_calls(stored.tool_calls(), sent.tool_calls()) {
        return Match::No;
    }
    if same_content(&stored.content, &sent.content) {
        return Match::Same;
    }
    if stored.role != "assistant" {
        return Match::No;
    }
    let (Some(full), Some(part)) = (text_of(&stored.content), text_of(&sent.content)) else {
        return Match::No;
    };
    if full.trim_end() == part.trim_end() || (part.trim().is_empty() && stored.has_tool_calls()) {
        // Clients that trim whitespace, or blank the text of a tool-call
        // message, have not reported a cut.
        Match::Same
    } else if full.starts_with(part.as_ref()) {
        Match::Shortened(part.into_owned())
    } else if stored
        .meta_str(crate::interruption::ORIGINAL)
        .is_some_and(|o| o.starts_with(part.as_ref()))
    {
        // Longer than what went out, but part of what was generated: the
        // client knows more than recall relayed; keep the record as it is.
        Match::Same
    } else {
        Match::No
    }
}

/// Content compares canonically: a string is the same as a parts array of
/// text alone with the same text, `null` as `""`, and the order of keys
/// never matters (`serde_json` maps are ordered by key).
fn same_content(stored: &Value, sent: &Value) -> bool {
    stored == sent
        || match (text_of(stored), text_of(sent)) {
            (Some(a), Some(b)) => a == b,
            _ => false,
        }
}

/// The text of content that is only text: a string, `null` (no text), or
/// an array of `text` parts (their texts joined).
fn text_of(content: &Value) -> Option<std::borrow::Cow<'_, str>> {
    use std::borrow::Cow;
    match content {
        Value::String(s) => Some(Cow::Borrowed(s)),
        Value::Null => Some(Cow::Borrowed("")),
        Value::Array(parts) => {
            let mut text = String::new();
            for part in parts {
                if part.get("type").and_then(Value::as_str) != Some("text") {
                    return None;
                }
                text.push_str(part.get("text").and_then(Value::as_str)?);
            }
            Some(Cow::Owned(text))
        }
        _ => None,
    }
}

/// Tool calls are the same when their ids, names and arguments are;
/// arguments that are JSON compare as JSON, whatever their spacing.
fn same_calls(stored: Option<&Vec<Value>>, sent: Option<&Vec<Value>>) -> bool {
    let empty = Vec::new();
    let (a, b) = (stored.unwrap_or(&empty), sent.unwrap_or(&empty));
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_call(x, y))
}

fn same_call(a: &Value, b: &Value) -> bool {
    let field = |v: &'_ Value, f: &str| v.get("function").and_then(|x| x.get(f)).cloned();
    if a.get("id") != b.get("id") || field(a, "name") != field(b, "name") {
        return false;
    }
    match (field(a, "arguments"), field(b, "arguments")) {
        (Some(Value::String(x)), Some(Value::String(y))) if x != y => {
            match (
                serde_json::from_str::<Value>(&x),
                serde_json::from_str::<Value>(&y),
            ) {
                (Ok(x), Ok(y)) => x == y,
                _ => false,
            }
        }
        (x, y) => x == y,
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
        crate::interruption::interrupted_reply(a(text), &a(original), true, 1, None, "new_request")
    }

    fn dropped() -> Hints {
        Hints {
            front_dropped: true,
            ..Hints::default()
        }
    }

    #[test]
    fn a_shortened_reply_is_reported() {
        let h = [u("joke?"), a("Why did the scarecrow win?")];
        let r = reconcile(
            &h,
            &[u("joke?"), a("Why did"), u("story")],
            Hints::default(),
        );
        assert_eq!(r.new_from(99), 2);
        assert_eq!(r.shortened, vec![(1, "Why did".to_owned())]);
        // The same text is no correction.
        let r = reconcile(
            &h,
            &[u("joke?"), a("Why did the scarecrow win?"), u("x")],
            Hints::default(),
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
        let r = reconcile(&h, &m, dropped());
        assert_eq!(contents(&m[r.new_from(99)..]), ["u4"]);
        // Without trimming, unknown leading messages are never dropped.
        // Without trimming, the request has messages recall never held
        // before its start: it wins whole, and nothing it sent is dropped.
        assert_eq!(
            reconcile(&h, &m, Hints::default()).decision,
            Decision::Diverge { at: 0, from: 0 }
        );
        let h = [u("hi")];
        assert_eq!(
            reconcile(&h, &[u("other"), u("hi")], Hints::default()).new_from(2),
            0
        );
    }

    #[test]
    fn whitespace_or_blanked_tool_text_is_no_cut() {
        let h = [u("q"), a("Sure. ")];
        let r = reconcile(&h, &[u("q"), a("Sure."), u("n")], Hints::default());
        assert_eq!((r.new_from(99), r.shortened.len()), (2, 0));
        let mut call = a("Let me check.");
        call.set_tool_calls(Some(vec![json!({"id": "c1"})]));
        let mut sent = a("");
        sent.set_tool_calls(Some(vec![json!({"id": "c1"})]));
        let r = reconcile(&[u("q"), call], &[u("q"), sent], Hints::default());
        assert_eq!((r.new_from(2), r.shortened.len()), (2, 0));
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
        let r = reconcile(&h, &[u("q"), a("Why did"), u("n")], Hints::default());
        assert_eq!((r.new_from(99), r.shortened.len()), (2, 0));
    }

    #[test]
    fn stored_extension_fields_do_not_prevent_a_match() {
        let mut stored = u("u1");
        stored.turn_id = Some(1);
        stored.timestamp = Some(5);
        stored.metadata_mut().insert("source", json!("message"));
        assert!(to_append(&[stored, a("a1")], &[u("u1"), a("a1"), u("u2")]).len() == 1);
    }

    /// Stored replies, as the session records them.
    fn llm(text: &str) -> Message {
        let mut m = a(text);
        m.metadata_mut().insert("source", json!("llm"));
        m
    }

    fn decide(h: &[Message], m: &[Message]) -> Decision {
        reconcile(h, m, Hints::default()).decision
    }

    #[test]
    fn regenerate_supersedes_the_reply_and_appends_nothing() {
        let h = [u("u1"), llm("a1"), u("u2"), llm("a2")];
        let r = reconcile(&h, &[u("u1"), a("a1"), u("u2")], Hints::default());
        assert_eq!(r.decision, Decision::Diverge { at: 3, from: 3 });
        assert_eq!(r.rewrite(&h, 3), Some(Rewrite::Regenerate));
    }

    #[test]
    fn a_window_resend_regenerates_too() {
        let h = [u("u1"), llm("a1"), u("u2"), llm("a2"), u("u3"), llm("a3")];
        assert_eq!(
            decide(&h, &[u("u2"), a("a2"), u("u3")]),
            Decision::Diverge { at: 5, from: 3 }
        );
    }

    #[test]
    fn editing_the_last_message_supersedes_it_and_its_reply() {
        let h = [u("u1"), llm("a1"), u("u2"), llm("a2")];
        let m = [u("u1"), a("a1"), u("u2 edited")];
        let r = reconcile(&h, &m, Hints::default());
        assert_eq!(r.decision, Decision::Diverge { at: 2, from: 2 });
        assert_eq!(r.rewrite(&h, 3), Some(Rewrite::Edit));
    }

    #[test]
    fn an_earlier_edit_makes_the_request_win_from_there() {
        let h = [u("u1"), llm("a1"), u("u2"), llm("a2")];
        let m = [u("u1 redacted"), a("a1"), u("u2"), a("a2"), u("u3")];
        assert_eq!(decide(&h, &m), Decision::Diverge { at: 0, from: 0 });
        // A pair taken out in the middle: what comes before it stays.
        let h = [u("u1"), llm("a1"), u("u2"), llm("a2"), u("u3"), llm("a3")];
        let m = [u("u1"), a("a1"), u("u3"), a("a3"), u("u4")];
        assert_eq!(decide(&h, &m), Decision::Diverge { at: 2, from: 2 });
    }

    #[test]
    fn no_evidence_no_divergence() {
        // The same words again from a delta client: a new utterance.
        let h = [u("yes"), llm("a1")];
        assert_eq!(decide(&h, &[u("yes")]), Decision::Append { from: 0 });
        // Nothing in common: a delta client's own lines, all new.
        let h = [u("u1"), llm("a1")];
        assert_eq!(
            decide(&h, &[a("x"), u("y"), u("u2")]),
            Decision::Append { from: 0 }
        );
        // A user message alone is no evidence: its reply must follow it.
        let h = [u("u1"), llm("a1"), u("u2"), llm("a2")];
        assert_eq!(
            decide(&h, &[u("u1"), a("other"), u("u3")]),
            Decision::Append { from: 0 }
        );
    }

    #[test]
    fn content_compares_canonically() {
        let parts = Message::new(Role::User, json!([{"type": "text", "text": "hello there"}]));
        let h = [u("hello there"), llm("hi")];
        assert_eq!(
            contents(to_append(&h, &[parts.clone(), a("hi"), u("next")])),
            ["next"]
        );
        // And the other way round, with the parts stored.
        let h = [parts, llm("hi")];
        assert_eq!(
            contents(to_append(&h, &[u("hello there"), a("hi"), u("next")])),
            ["next"]
        );
        let image = Message::new(
            Role::User,
            json!([{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}}]),
        );
        assert!(matches!(lines_up(&image, &u("hi")), Match::No));
    }

    #[test]
    fn tool_calls_compare_by_id_name_and_arguments() {
        let call = |args: &str, extra: Value| {
            let mut m = Message::new(Role::Assistant, Value::Null);
            let mut c = json!({"id": "c1", "type": "function",
                "function": {"name": "f", "arguments": args}});
            if let (Some(c), Some(extra)) = (c.as_object_mut(), extra.as_object()) {
                c.extend(extra.clone());
            }
            m.set_tool_calls(Some(vec![c]));
            m
        };
        let stored = call(r#"{"a": 1, "b": [2]}"#, json!({}));
        assert!(matches!(
            lines_up(&stored, &call(r#"{"b":[2],"a":1}"#, json!({"index": 0}))),
            Match::Same
        ));
        assert!(matches!(
            lines_up(&stored, &call(r#"{"a": 2}"#, json!({}))),
            Match::No
        ));
    }

    fn gone(text: &str) -> Message {
        let mut m = crate::interruption::interrupted_reply(
            a(text),
            &a("the whole reply"),
            false,
            1,
            None,
            "client_gone",
        );
        m.metadata_mut().insert("source", json!("llm"));
        m
    }

    #[test]
    fn a_client_that_left_and_sends_again_retries() {
        let h = [u("u1"), llm("a1"), u("u2"), gone("the wh")];
        // Delta and full resend alike.
        assert_eq!(decide(&h, &[u("u2")]), Decision::Retry { supersede: 3 });
        assert_eq!(
            decide(&h, &[u("u1"), a("a1"), u("u2")]),
            Decision::Retry { supersede: 3 }
        );
        let r = reconcile(&h, &[u("u2")], Hints::default());
        assert_eq!(r.rewrite(&h, 1), Some(Rewrite::Retry));
        // Something new after it is a new turn, not a retry.
        assert_eq!(
            decide(&h, &[u("u2"), u("more")]).clone(),
            Decision::Append { from: 1 }
        );
        // A failed call too.
        let fail = crate::interruption::failure_reply("Sorry.", "503");
        let h = [u("u1"), fail];
        assert_eq!(decide(&h, &[u("u1")]), Decision::Retry { supersede: 1 });
    }

    #[test]
    fn a_barge_in_with_the_same_words_is_a_new_utterance() {
        let mut cut = cut("Why", "Why did");
        cut.metadata_mut().insert("source", json!("llm"));
        let h = [u("joke?"), cut];
        assert_eq!(decide(&h, &[u("joke?")]), Decision::Append { from: 0 });
    }

    #[test]
    fn the_client_saying_retry_reruns_a_delivered_reply() {
        let h = [u("u1"), llm("a1")];
        let retry = Hints {
            retry: true,
            ..Hints::default()
        };
        assert_eq!(
            reconcile(&h, &[u("u1")], retry).decision,
            Decision::Retry { supersede: 1 }
        );
        // But not when the request holds something new.
        assert_eq!(
            reconcile(&h, &[u("u2")], retry).decision,
            Decision::Append { from: 0 }
        );
    }

    #[test]
    fn superseded_messages_are_invisible() {
        let mut old = llm("a2");
        crate::interruption::supersede(&mut old, 1);
        let h = [u("u1"), llm("a1"), u("u2"), old, llm("a2 again")];
        assert_eq!(
            contents(to_append(
                &h,
                &[u("u1"), a("a1"), u("u2"), a("a2 again"), u("u3")]
            )),
            ["u3"]
        );
        assert_eq!(contents(to_append(&h, &[u("u3")])), ["u3"]);
    }

    #[test]
    fn messages_recall_added_may_be_missing_from_a_resend() {
        let mut greeting = a("Hi, I am Ava.");
        greeting.metadata_mut().insert("source", json!("greeting"));
        let mut reminder = a("Are you still there?");
        reminder.metadata_mut().insert("source", json!("silence"));
        let h = [greeting, u("u1"), llm("a1"), reminder, u("u2"), llm("a2")];
        let m = [u("u1"), a("a1"), u("u2"), a("a2"), u("u3")];
        assert_eq!(contents(to_append(&h, &m)), ["u3"]);
        // And a regenerate past them is still a regenerate.
        assert_eq!(
            decide(&h, &[u("u1"), a("a1"), u("u2")]),
            Decision::Diverge { at: 5, from: 3 }
        );
    }
}
