//! A request that is this conversation but differs from the stored one
//! (a regenerate, an edit): where the two part, given evidence.

use std::borrow::Borrow;

use super::compare::{lines_up, Match};
use super::{may_be_left_out, Decision, Reconciled};
use crate::memory::interruption::is_superseded;
use crate::memory::message::Message;

/// The request is this conversation but differs from the stored one: it
/// wins from the first message where the two part.
pub(super) fn diverge<H: Borrow<Message>>(
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
            // A note where the request has another note is changed, not
            // left out.
            Match::No if may_be_left_out(stored) && !both_notes(stored, &incoming[i]) => {
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

/// Two system or developer messages: the one sent replaces the stored one.
fn both_notes(stored: &Message, sent: &Message) -> bool {
    stored.is_instruction() && sent.is_instruction()
}
