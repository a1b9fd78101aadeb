//! What the upstream sees of a session: each stored message rendered for
//! the upstream, the window over that rendering, and the grammar every
//! chat API accepts. Pure: the stored history is never changed.
//!
//! For any stored history, what `outbound` returns
//! - leaves out superseded messages and failure records, and shows an
//!   interrupted reply as the upstream's `interrupted` mode says;
//! - follows every assistant `tool_calls` with a tool message for each id
//!   (unanswered calls are dropped from the copy, keeping its text; an
//!   assistant message left with nothing is dropped), and has no tool
//!   message whose call is not right before it;
//! - starts with a user message when it holds one, unless it is the whole
//!   conversation and the upstream takes roles in any order (so a greeting
//!   that opened the conversation is sent);
//! - holds `window_messages`, `window_chars` and `window_tokens` on what is
//!   sent (the rendered text, and in vendor "custom" mode the extension
//!   fields too), except that the newest user message and what follows it
//!   are always sent;
//! - sends a system or developer message stored inside the conversation
//!   where it stands (it leaves the window with the messages around it);
//!   with `roles = "alternate"` as a user message, since such templates
//!   take a system message first only;
//! - with `roles = "alternate"`, has no two plain messages of one role in
//!   a row: they are merged, joined by a blank line.
//!
//! It walks back from the newest message and stops at the window's start,
//! so its cost follows the window, not the stored history.

use std::borrow::Borrow;
use std::sync::Arc;

use serde_json::Value;

use crate::config::Roles;
use crate::exchange::protocol::VendorRules;
use crate::memory::interruption::is_superseded;
use crate::memory::message::{Message, Role};
use crate::memory::window::{Limits, TrimReason};

mod check;
#[cfg(test)]
mod tests;
mod units;

use units::Units;

pub use check::check;

/// What goes upstream after the instructions.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    /// Rendered, oldest first; a message rendering leaves as it is stays
    /// the stored one (a pointer copy).
    pub messages: Vec<Arc<Message>>,
    /// The stored index the window begins at: `history[start..]` is what
    /// `messages` was made from.
    pub start: usize,
    /// The limit that one more message would have exceeded, if any.
    pub reason: Option<TrimReason>,
    /// Where the window would have begun without its `Reach`.
    pub plain_start: usize,
    /// The reach was given up: it would have added more than its `max`.
    pub gap: bool,
}

/// How far back a window reaches past its limits: to the stored index
/// `from` (where the running summary ends), unless that adds more than
/// `max` messages to the plain window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reach {
    pub from: usize,
    pub max: usize,
}

/// A stored message, as `outbound` can share it.
pub trait Stored: Borrow<Message> {
    fn share(&self) -> Arc<Message>;
}

impl Stored for Arc<Message> {
    fn share(&self) -> Arc<Message> {
        Arc::clone(self)
    }
}

impl Stored for Message {
    fn share(&self) -> Arc<Message> {
        Arc::new(self.clone())
    }
}

/// The messages to send upstream for `history` (see the module's docs).
pub fn outbound<H: Stored>(history: &[H], rules: &VendorRules, limits: Limits) -> Sent {
    let units = Units {
        history,
        rules,
        next: history.len(),
    };
    let alternate = rules.roles == Roles::Alternate;
    // The newest user message and what follows it are always sent; with
    // no user message, the newest unit is.
    let floor = history
        .iter()
        .rposition(|m| {
            let m = m.borrow();
            m.role == "user" && !is_superseded(m)
        })
        .unwrap_or(history.len());
    // Units newest first; `kept` of them are the window.
    let mut window: Vec<Unit> = Vec::with_capacity(match limits.messages {
        0 => 16,
        n => n.min(history.len()) + 1,
    });
    let mut kept = 0;
    let mut totals = Cost::default();
    let mut holds_user = false;
    let mut reason = None;
    for unit in units {
        let protected = unit.from >= floor || window.is_empty();
        let cost = unit.cost(limits, rules.sends_extensions());
        // Merging with the oldest unit so far, if the upstream needs roles
        // to alternate.
        let merge = alternate
            && window
                .last()
                .is_some_and(|newer| newer.plain() && unit.plain() && newer.role() == unit.role());
        let added = Cost {
            messages: if merge { 0 } else { unit.len() },
            chars: cost.chars + if merge { SEPARATOR.len() } else { 0 },
            tokens: cost.tokens + if merge { 1 } else { 0 },
        };
        let total = totals.plus(added);
        if !protected {
            reason = limits.exceeded_by(total);
            if reason.is_some() {
                break;
            }
        }
        totals = total;
        let is_user = unit.role() == "user";
        if merge {
            if let Some(newer) = window.last_mut() {
                newer.merge_before(unit);
            }
        } else {
            window.push(unit);
        }
        // The window may begin here if it begins with a user message, or
        // holds none at all.
        if is_user || !holds_user {
            kept = window.len();
        }
        holds_user |= is_user;
    }
    // A conversation sent whole keeps what opened it (a greeting), unless
    // the upstream needs a user message first.
    if reason.is_none() && !alternate {
        kept = window.len();
    }
    window.truncate(kept);
    let start = window.last().map_or(history.len(), |u| u.from);
    let mut messages = Vec::with_capacity(window.iter().map(Unit::len).sum());
    for u in window.into_iter().rev() {
        messages.push(u.first);
        messages.extend(u.rest);
    }
    Sent {
        messages,
        start,
        reason,
        plain_start: start,
        gap: false,
    }
}

/// `outbound`, with the window reaching back past its limits to
/// `reach.from` (where the running summary ends), whole units, and on to
/// the user message before it if that is not one (already summarized: sent
/// twice rather than start with a reply). If that adds more than
/// `reach.max` messages, the plain window is sent and `gap` says so.
pub fn outbound_reaching<H: Stored>(
    history: &[H],
    rules: &VendorRules,
    limits: Limits,
    reach: Option<Reach>,
) -> Sent {
    let plain = outbound(history, rules, limits);
    let Some(reach) = reach.filter(|r| r.from < plain.start) else {
        return plain;
    };
    let units = Units {
        history,
        rules,
        next: plain.start,
    };
    let mut added = 0;
    let mut start = plain.start;
    for unit in units {
        added += unit.len();
        if added > reach.max {
            return Sent { gap: true, ..plain };
        }
        start = unit.from;
        if unit.from <= reach.from && unit.role() == "user" {
            break;
        }
    }
    // Units never straddle `start`, so the suffix renders as it does in
    // the whole history; sent whole, it keeps every unit from `start` on.
    let whole = outbound(&history[start..], rules, Limits::default());
    Sent {
        messages: whole.messages,
        start: start + whole.start,
        reason: plain.reason,
        plain_start: plain.start,
        gap: false,
    }
}

const SEPARATOR: &str = "\n\n";

#[derive(Debug, Default, Clone, Copy)]
struct Cost {
    messages: usize,
    chars: usize,
    tokens: usize,
}

impl Cost {
    fn plus(self, o: Cost) -> Cost {
        Cost {
            messages: self.messages + o.messages,
            chars: self.chars.saturating_add(o.chars),
            tokens: self.tokens.saturating_add(o.tokens),
        }
    }
}

impl Limits {
    fn exceeded_by(&self, c: Cost) -> Option<TrimReason> {
        if self.messages != 0 && c.messages > self.messages {
            Some(TrimReason::MaxMessages)
        } else if self.chars != 0 && c.chars > self.chars {
            Some(TrimReason::MaxChars)
        } else if self.tokens != 0 && c.tokens > self.tokens {
            Some(TrimReason::MaxTokens)
        } else {
            None
        }
    }
}

/// What the window takes or leaves whole: one message, or an assistant
/// message with the tool results that answer it.
struct Unit {
    /// The stored index of its first message.
    from: usize,
    first: Arc<Message>,
    /// Tool results; empty (no allocation) for the usual single message.
    rest: Vec<Arc<Message>>,
}

impl Unit {
    fn one(from: usize, first: Arc<Message>) -> Self {
        Self {
            from,
            first,
            rest: Vec::new(),
        }
    }

    fn len(&self) -> usize {
        1 + self.rest.len()
    }

    fn role(&self) -> &str {
        self.first.role.as_str()
    }

    /// One user or assistant message with text alone: what `alternate`
    /// may merge. A call of either kind is not: merged, it would lose its
    /// call or carry it away from its place.
    fn plain(&self) -> bool {
        let m = &self.first;
        self.rest.is_empty()
            && matches!(m.role.as_str(), "user" | "assistant")
            && !m.has_tool_calls()
            && !legacy_call(m)
            && m.name().is_none()
    }

    fn cost(&self, limits: Limits, custom: bool) -> Cost {
        let mut c = Cost {
            messages: self.len(),
            ..Cost::default()
        };
        if limits.chars == 0 && limits.tokens == 0 {
            return c;
        }
        for m in std::iter::once(&self.first).chain(&self.rest) {
            if limits.chars != 0 {
                c.chars += m.char_cost();
            }
            if limits.tokens != 0 {
                c.tokens += m.tokens(limits.encoding);
            }
            if custom && (limits.chars != 0 || limits.tokens != 0) {
                // Vendor "custom" sends the extension fields as well.
                let ext = extensions_json(m);
                if limits.chars != 0 {
                    c.chars += ext.chars().count();
                }
                if limits.tokens != 0 {
                    c.tokens += limits.encoding.count(&ext);
                }
            }
        }
        c
    }

    /// Puts an older message of the same role in front of this one.
    fn merge_before(&mut self, older: Unit) {
        let mut merged = (*older.first).clone();
        merged.content = join(&older.first.content, &self.first.content);
        self.first = Arc::new(merged);
        self.from = older.from;
    }
}

/// Two contents as one: texts joined by a blank line, parts one after
/// the other.
fn join(a: &Value, b: &Value) -> Value {
    match (a, b) {
        (Value::String(x), Value::String(y)) => Value::String(format!("{x}{SEPARATOR}{y}")),
        _ => {
            let parts = |v: &Value| match v {
                Value::Array(p) => p.clone(),
                Value::String(s) => vec![serde_json::json!({"type": "text", "text": s})],
                _ => Vec::new(),
            };
            let mut all = parts(a);
            all.push(serde_json::json!({"type": "text", "text": SEPARATOR}));
            all.extend(parts(b));
            Value::Array(all)
        }
    }
}

/// An assistant message of the deprecated `function_call` kind.
fn legacy_call(m: &Message) -> bool {
    m.role == Role::Assistant && m.extra_get("function_call").is_some()
}

/// The fields vendor "custom" sends beside OpenAI's, as sent.
fn extensions_json(m: &Message) -> String {
    let mut map = serde_json::Map::new();
    if let Some(t) = m.turn_id {
        map.insert("turn_id".into(), t.into());
    }
    if let Some(t) = m.timestamp {
        map.insert("timestamp".into(), t.into());
    }
    if let Some(md) = &m.metadata {
        map.insert("metadata".into(), md.to_value());
    }
    if map.is_empty() {
        return String::new();
    }
    Value::Object(map).to_string()
}
