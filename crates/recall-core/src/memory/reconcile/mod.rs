//! Reconciling what a client sends with what the session already holds.
//!
//! Some clients send only the new message, others resend the whole
//! conversation (or a recent part of it) every time; a UI regenerates or
//! edits, and an SDK retries a request whose reply it never got whole.
//! `reconcile` says which of these a request is, as a `Decision` the
//! session carries out: nothing is ever stored twice, and nothing a client
//! sends is dropped.

use std::borrow::Borrow;

use crate::memory::interruption::{
    added_by_recall, from_the_session_api, is_failure, is_interrupted, is_superseded, undelivered,
};
use crate::memory::message::Message;

mod compare;

/// Whether `sent` is the stored message `stored` sent again (role, content
/// compared canonically, tool calls).
pub fn same_message(stored: &Message, sent: &Message) -> bool {
    matches!(compare::lines_up(stored, sent), compare::Match::Same)
}
mod diverge;
#[cfg(test)]
mod tests;

use compare::{lines_up, Match};
use diverge::diverge;

/// What a request does to the stored history (`H`), given what it sends
/// (`M`, without its leading instructions).
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
    pub const ALL: [Rewrite; 3] = [Rewrite::Regenerate, Rewrite::Edit, Rewrite::Retry];

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

/// Decides what a request does to the history. The request's leading
/// instructions (`message::leading_instructions`) must already have been
/// removed from `incoming`; a system or developer message inside the
/// conversation lines up like any other message.
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
/// line up: interrupted replies, failure records, what recall added
/// without the client (`greeting`, `command`, `silence`), and system or
/// developer messages inside the conversation; superseded messages are
/// invisible. A request that matches only by skipping an
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
    // Divergence needs evidence: a user message and the reply after it.
    let evidence = incoming
        .windows(2)
        .any(|w| w[0].role == "user" && w[1].role == "assistant");
    evidence
        .then(|| diverge(history, incoming, hints.front_dropped))
        .flatten()
        .unwrap_or_else(|| Reconciled::append(0))
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
    if start == history.len() {
        // Nothing follows the client's last message: nothing to run again.
        return None;
    }
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

/// Stored messages a resend may leave out without differing. A system or
/// developer message stored inside the conversation is one: a client may
/// have sent it for one request only.
fn may_be_left_out(m: &Message) -> bool {
    added_by_recall(m) || (m.role == "assistant" && is_interrupted(m)) || m.is_instruction()
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
    let (earliest, mut visible) = earliest_start(history, incoming.len());
    for start in earliest..history.len() {
        if best.overlap == incoming.len() {
            return best;
        }
        // A start matches at most the visible messages from it on: once
        // they are no more than the best run, no later start can beat it
        // (a resend that lined up from its first message stops there).
        if visible <= best.overlap {
            break;
        }
        let stored: &Message = history[start].borrow();
        if !is_superseded(stored) {
            visible -= 1;
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
/// that a request must match (those it may leave out are not counted), and
/// how many visible messages it holds from there.
fn earliest_start<H: Borrow<Message>>(history: &[H], sent: usize) -> (usize, usize) {
    let (mut needed, mut visible) = (0, 0);
    for (i, m) in history.iter().enumerate().rev() {
        let m = m.borrow();
        if is_superseded(m) {
            continue;
        }
        if !may_be_left_out(m) {
            needed += 1;
            if needed > sent {
                return (i + 1, visible);
            }
        }
        visible += 1;
    }
    (0, visible)
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
                    // A note left out says nothing of whether the request's
                    // last message was said again.
                    skipped_interrupted_at_end |= !stored.is_instruction();
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
