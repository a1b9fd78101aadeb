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
//! - with `roles = "alternate"`, has no two plain messages of one role in
//!   a row: they are merged, joined by a blank line.
//!
//! It walks back from the newest message and stops at the window's start,
//! so its cost follows the window, not the stored history.

use std::borrow::{Borrow, Cow};
use std::sync::Arc;

use serde_json::Value;

use crate::config::Roles;
use crate::interruption::{self, is_superseded};
use crate::message::{Message, Role};
use crate::vendor::VendorRules;
use crate::window::{Limits, TrimReason};

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
    let mut window: Vec<Unit> = Vec::new();
    let mut kept = 0;
    let mut totals = Cost::default();
    let mut holds_user = false;
    let mut reason = None;
    for unit in units {
        let protected = unit.from >= floor || window.is_empty();
        let cost = unit.cost(limits, rules.custom);
        // Merging with the oldest unit so far, if the upstream needs roles
        // to alternate.
        let merge = alternate
            && window
                .last()
                .is_some_and(|newer| newer.plain() && unit.plain() && newer.role() == unit.role());
        let added = Cost {
            messages: if merge { 0 } else { unit.messages.len() },
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
    let messages = window.into_iter().rev().flat_map(|u| u.messages).collect();
    Sent {
        messages,
        start,
        reason,
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
    messages: Vec<Arc<Message>>,
}

impl Unit {
    fn role(&self) -> &str {
        self.messages.first().map_or("", |m| m.role.as_str())
    }

    /// One user or assistant message with text alone: what `alternate`
    /// may merge.
    fn plain(&self) -> bool {
        match self.messages.as_slice() {
            [m] => {
                matches!(m.role.as_str(), "user" | "assistant")
                    && !m.has_tool_calls()
                    && m.name().is_none()
            }
            _ => false,
        }
    }

    fn cost(&self, limits: Limits, custom: bool) -> Cost {
        let mut c = Cost {
            messages: self.messages.len(),
            ..Cost::default()
        };
        for m in &self.messages {
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
        let (Some(old), Some(new)) = (older.messages.first(), self.messages.first_mut()) else {
            return;
        };
        let mut merged = (**old).clone();
        merged.content = join(&old.content, &new.content);
        *new = Arc::new(merged);
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

/// The history's units as the upstream sees them, newest first.
struct Units<'a, H> {
    history: &'a [H],
    rules: &'a VendorRules,
    /// Everything from here on has been walked.
    next: usize,
}

impl<H: Stored> Units<'_, H> {
    /// The visible message before `i`, if any.
    fn before(&self, i: usize) -> Option<usize> {
        (0..i)
            .rev()
            .find(|&j| !is_superseded(self.history[j].borrow()))
    }

    fn rendered(&self, i: usize) -> Option<Arc<Message>> {
        let stored = &self.history[i];
        let m: &Message = stored.borrow();
        match interruption::render(m, self.rules.interrupted, &self.rules.interrupted_marker)? {
            Cow::Borrowed(_) => Some(stored.share()),
            Cow::Owned(m) => Some(Arc::new(m)),
        }
    }

    /// An assistant message with only the calls in `answered` (all of them
    /// when `None`), or nothing if it is left with neither text nor calls.
    fn with_calls(&self, i: usize, answered: &[&str]) -> Option<Arc<Message>> {
        let m = self.rendered(i)?;
        if !m.has_tool_calls() {
            // An assistant message with nothing in it is refused.
            let empty = m.role == "assistant" && m.content.is_null() && !legacy_call(&m);
            return (!empty).then_some(m);
        }
        let calls = m.tool_calls().cloned().unwrap_or_default();
        let kept: Vec<Value> = calls
            .into_iter()
            .filter(|c| {
                c.get("id")
                    .and_then(Value::as_str)
                    .is_some_and(|id| answered.contains(&id))
            })
            .collect();
        if kept.len() == m.tool_calls().map_or(0, Vec::len) {
            return Some(m);
        }
        let mut out = (*m).clone();
        let empty_text = match &out.content {
            Value::Null => true,
            Value::String(s) => s.is_empty(),
            Value::Array(parts) => parts.is_empty(),
            _ => false,
        };
        if kept.is_empty() {
            if empty_text {
                return None;
            }
            out.set_tool_calls(None);
        } else {
            out.set_tool_calls(Some(kept));
        }
        Some(Arc::new(out))
    }
}

impl<H: Stored> Iterator for Units<'_, H> {
    type Item = Unit;

    fn next(&mut self) -> Option<Unit> {
        loop {
            let i = self.before(self.next)?;
            let m: &Message = self.history[i].borrow();
            if m.role == Role::Function {
                // The deprecated `function_call`: its result answers the
                // message right before it, or nothing.
                self.next = i;
                let caller = self
                    .before(i)
                    .filter(|&k| legacy_call(self.history[k].borrow()));
                let Some(caller) = caller else { continue };
                self.next = caller;
                let Some(shown) = self.rendered(caller) else {
                    continue;
                };
                return Some(Unit {
                    from: caller,
                    messages: vec![shown, self.history[i].share()],
                });
            }
            if m.role != Role::Tool {
                self.next = i;
                // A call not followed by its results: none was answered.
                match self.with_calls(i, &[]) {
                    Some(shown) => {
                        return Some(Unit {
                            from: i,
                            messages: vec![shown],
                        })
                    }
                    None => continue,
                }
            }
            // A run of tool results, and the message before it.
            let mut run = vec![i];
            let mut j = self.before(i);
            while let Some(k) = j.filter(|&k| self.history[k].borrow().role == Role::Tool) {
                run.push(k);
                j = self.before(k);
            }
            run.reverse();
            let caller = j.filter(|&k| {
                let c: &Message = self.history[k].borrow();
                c.role == "assistant" && c.has_tool_calls() && !interruption::is_failure(c)
            });
            let Some(caller) = caller else {
                // Results whose call is not right before them: left out.
                self.next = run[0];
                continue;
            };
            let calls: Vec<&str> = self.history[caller]
                .borrow()
                .tool_call_ids()
                .flatten()
                .collect();
            let mut answered: Vec<&str> = Vec::new();
            let mut results = Vec::new();
            for &k in &run {
                let id = self.history[k].borrow().tool_call_id();
                if let Some(id) = id.filter(|id| calls.contains(id) && !answered.contains(id)) {
                    answered.push(id);
                    results.push(self.history[k].share());
                }
            }
            if answered.is_empty() {
                // None of them answers it: the results go, and the caller
                // is walked next as a message on its own.
                self.next = caller + 1;
                continue;
            }
            self.next = caller;
            let Some(shown) = self.with_calls(caller, &answered) else {
                continue;
            };
            let mut messages = vec![shown];
            messages.extend(results);
            return Some(Unit {
                from: caller,
                messages,
            });
        }
    }
}

/// Whether `messages` (what follows the instructions) is a conversation
/// every chat API accepts, as `outbound` promises; the error says where it
/// is not. `whole` says it is the whole conversation (nothing was left out
/// for a limit). Tests and the fuzz targets hold `outbound` to it.
pub fn check<H: Borrow<Message>>(messages: &[H], roles: Roles, whole: bool) -> Result<(), String> {
    let at = |i: usize| -> &Message { messages[i].borrow() };
    if let Some(first) = messages.first().map(Borrow::borrow) {
        let holds_user = messages.iter().any(|m| m.borrow().role == "user");
        let may_open = whole && roles == Roles::Any;
        if holds_user && first.role != "user" && !may_open {
            return Err(format!("it starts with a {} message", first.role));
        }
    }
    for i in 0..messages.len() {
        let m = at(i);
        if is_superseded(m) || interruption::is_failure(m) {
            return Err(format!("message {i} is superseded or a failure record"));
        }
        if m.role == Role::Function {
            if i == 0 || !legacy_call(at(i - 1)) {
                return Err(format!("function message {i} answers no function_call"));
            }
        } else if m.is_tool_result() {
            // Its call is in the assistant message before its run of results.
            let caller = (0..i).rev().find(|&j| at(j).role != Role::Tool);
            let answers = caller.is_some_and(|j| {
                at(j).role == "assistant"
                    && at(j)
                        .tool_call_ids()
                        .flatten()
                        .any(|id| Some(id) == m.tool_call_id())
            });
            if !answers {
                return Err(format!("tool message {i} answers no call before it"));
            }
        }
        if m.has_tool_calls() {
            let results: Vec<&str> = (i + 1..messages.len())
                .take_while(|&j| at(j).role == Role::Tool)
                .filter_map(|j| at(j).tool_call_id())
                .collect();
            if let Some(id) = m
                .tool_call_ids()
                .find(|id| !id.is_some_and(|id| results.contains(&id)))
            {
                return Err(format!(
                    "message {i} has a call ({id:?}) no tool message answers"
                ));
            }
        }
        if m.role == "assistant" && !m.has_tool_calls() && m.content.is_null() && !legacy_call(m) {
            return Err(format!("assistant message {i} is empty"));
        }
        if roles == Roles::Alternate && i > 0 {
            let p = at(i - 1);
            let plain = |m: &Message| {
                matches!(m.role.as_str(), "user" | "assistant") && !m.has_tool_calls()
            };
            if p.role == m.role && plain(p) && plain(m) && p.name().is_none() && m.name().is_none()
            {
                return Err(format!("messages {} and {i} are both {}", i - 1, m.role));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::InterruptedRendering;
    use crate::tokens::Encoding;
    use serde_json::json;

    fn u(t: &str) -> Message {
        Message::new(Role::User, t)
    }
    fn a(t: &str) -> Message {
        Message::new(Role::Assistant, t)
    }
    fn call(text: Value, ids: &[&str]) -> Message {
        let mut m = Message::new(Role::Assistant, text);
        m.set_tool_calls(Some(
            ids.iter()
                .map(|id| {
                    json!({"id": id, "type": "function",
                    "function": {"name": "f", "arguments": "{}"}})
                })
                .collect(),
        ));
        m
    }
    fn result(id: &str) -> Message {
        let mut m = Message::new(Role::Tool, "ok");
        m.set_tool_call_id(Some(id.into()));
        m
    }
    fn rules() -> VendorRules {
        VendorRules {
            custom: false,
            interruptable: true,
            strip_fields: Vec::new(),
            interrupted: InterruptedRendering::Truncated,
            interrupted_marker: " [cut]".into(),
            roles: Roles::Any,
        }
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
    /// `role:content` of what is sent, calls as `[ids]`.
    fn shown(h: &[Message], rules: &VendorRules, limits: Limits) -> Vec<String> {
        let sent = outbound(h, rules, limits);
        check(&sent.messages, rules.roles, sent.reason.is_none()).unwrap();
        sent.messages
            .iter()
            .map(|m| {
                let calls: Vec<&str> = m.tool_call_ids().flatten().collect();
                let text = match &m.content {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                };
                if calls.is_empty() {
                    format!("{}:{text}", m.role)
                } else {
                    format!("{}:{text}{calls:?}", m.role)
                }
            })
            .collect()
    }

    #[test]
    fn no_limits_send_everything_visible() {
        let mut old = a("old");
        interruption::supersede(&mut old, 1);
        let h = [
            u("1"),
            old,
            a("2"),
            u("3"),
            interruption::failure_reply("Sorry.", "503"),
        ];
        assert_eq!(
            shown(&h, &rules(), Limits::default()),
            ["user:1", "assistant:2", "user:3"]
        );
        assert!(outbound::<Message>(&[], &rules(), count(3))
            .messages
            .is_empty());
    }

    #[test]
    fn a_window_starts_with_a_user_message() {
        let h = [u("1"), a("2"), u("3"), a("4"), u("5"), a("6"), u("7")];
        // Six would start with a("2"): the window is five.
        let sent = outbound(&h, &rules(), count(6));
        assert_eq!(sent.start, 2);
        assert_eq!(sent.reason, Some(TrimReason::MaxMessages));
        assert_eq!(shown(&h, &rules(), count(6))[0], "user:3");
        // A greeting that opened the conversation is sent when nothing is
        // cut, unless the upstream needs a user message first.
        let h = [a("hello"), u("1"), a("2")];
        assert_eq!(
            shown(&h, &rules(), Limits::default()),
            ["assistant:hello", "user:1", "assistant:2"]
        );
        assert_eq!(shown(&h, &rules(), count(2)), ["user:1", "assistant:2"]);
        let mut r = rules();
        r.roles = Roles::Alternate;
        assert_eq!(shown(&h, &r, Limits::default()), ["user:1", "assistant:2"]);
        // With no user message at all, the newest is sent whatever the limits.
        let h = [a("hello"), a("still there?")];
        assert_eq!(shown(&h, &rules(), chars(1)), ["assistant:still there?"]);
    }

    #[test]
    fn the_newest_user_message_and_what_follows_are_always_sent() {
        let h = [
            u("a"),
            a("b"),
            u("a very long message"),
            call(Value::Null, &["c"]),
            result("c"),
        ];
        assert_eq!(
            shown(&h, &rules(), chars(3)),
            ["user:a very long message", "assistant:[\"c\"]", "tool:ok"]
        );
    }

    #[test]
    fn unanswered_tool_calls_are_dropped_from_what_is_sent() {
        let h = [
            u("weather?"),
            call(json!("Let me look."), &["c1"]),
            u("never mind"),
            call(Value::Null, &["c2"]),
            u("ok"),
        ];
        assert_eq!(
            shown(&h, &rules(), Limits::default()),
            [
                "user:weather?",
                "assistant:Let me look.",
                "user:never mind",
                "user:ok"
            ]
        );
        // The stored messages keep their calls.
        assert!(h[1].has_tool_calls());
        // Partly answered: only the answered call stays.
        let h = [
            u("q"),
            call(Value::Null, &["c1", "c2"]),
            result("c2"),
            a("done"),
        ];
        assert_eq!(
            shown(&h, &rules(), Limits::default()),
            ["user:q", "assistant:[\"c2\"]", "tool:ok", "assistant:done"]
        );
    }

    #[test]
    fn orphan_tool_results_are_dropped() {
        let h = [
            u("q"),
            result("gone"),
            a("x"),
            call(Value::Null, &["c1"]),
            result("c9"),
            u("n"),
        ];
        assert_eq!(
            shown(&h, &rules(), Limits::default()),
            ["user:q", "assistant:x", "user:n"]
        );
        // A result after a superseded call is an orphan too.
        let mut old = call(Value::Null, &["c1"]);
        interruption::supersede(&mut old, 1);
        let h = [u("q"), old, result("c1"), u("n")];
        assert_eq!(shown(&h, &rules(), Limits::default()), ["user:q", "user:n"]);
    }

    #[test]
    fn a_tool_group_is_sent_whole_or_not_at_all() {
        let h = [
            u("q"),
            call(Value::Null, &["c1"]),
            result("c1"),
            a("done"),
            u("next"),
        ];
        assert_eq!(shown(&h, &rules(), count(4)), ["user:next"]);
        assert_eq!(shown(&h, &rules(), count(5)).len(), 5);
    }

    #[test]
    fn interrupted_replies_are_rendered_and_counted_as_sent() {
        let cut =
            interruption::interrupted_reply(a("Why"), &a("Why not"), true, 3, None, "endpoint");
        let h = [u("q"), cut.clone(), u("n")];
        let mut r = rules();
        r.interrupted = InterruptedRendering::Annotated;
        assert_eq!(shown(&h, &r, Limits::default())[1], "assistant:Why [cut]");
        r.interrupted = InterruptedRendering::Original;
        assert_eq!(shown(&h, &r, Limits::default())[1], "assistant:Why not");
        // "q" + "Why not" + "n" is 9 characters; stored, it is 5.
        assert_eq!(shown(&h, &r, chars(8)), ["user:n"]);
        assert_eq!(shown(&h, &r, chars(9)).len(), 3);
        let empty = interruption::interrupted_reply(a(""), &a("long"), true, 3, None, "endpoint");
        assert_eq!(
            shown(&[u("q"), empty, u("n")], &rules(), Limits::default()),
            ["user:q", "user:n"]
        );
    }

    #[test]
    fn vendor_custom_counts_the_extension_fields() {
        let mut m = u("hi");
        m.metadata_mut().insert("source", json!("asr"));
        let h = [m, a("yo"), u("n")];
        let mut r = rules();
        assert_eq!(shown(&h, &r, chars(5)).len(), 3);
        r.custom = true;
        assert_eq!(shown(&h, &r, chars(5)), ["user:n"]);
        let limits = Limits {
            tokens: 20,
            encoding: Encoding::Approx,
            ..Limits::default()
        };
        assert!(
            outbound(&h, &r, limits).messages.len() < outbound(&h, &rules(), limits).messages.len()
        );
    }

    #[test]
    fn alternate_roles_merge_messages_of_one_role_in_a_row() {
        let cut = interruption::interrupted_reply(a(""), &a("long"), true, 3, None, "new_request");
        let h = [u("u1"), cut, u("u2"), a("a2"), a("are you there?"), u("u3")];
        let mut r = rules();
        r.roles = Roles::Alternate;
        assert_eq!(
            shown(&h, &r, Limits::default()),
            ["user:u1\n\nu2", "assistant:a2\n\nare you there?", "user:u3"]
        );
        assert_eq!(shown(&h, &rules(), Limits::default()).len(), 5);
        // A merge that would not fit is not made: the window starts later.
        assert_eq!(
            shown(&h, &r, chars(23)),
            ["user:u2", "assistant:a2\n\nare you there?", "user:u3"]
        );
        // Parts and text merge as parts.
        let parts = Message::new(Role::User, json!([{"type": "text", "text": "p"}]));
        let m = outbound(&[u("t"), parts], &r, Limits::default()).messages;
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].content.as_array().map(Vec::len), Some(3));
    }

    #[test]
    fn legacy_function_calls_stay_with_their_result() {
        let mut caller = a("");
        caller.content = Value::Null;
        caller.set_extra("function_call", json!({"name": "f", "arguments": "{}"}));
        let mut res = Message::new(Role::Function, "42");
        res.set_name(Some("f".into()));
        let h = [u("q"), caller, res.clone(), a("42 it is"), res, u("n")];
        let sent = outbound(&h, &rules(), Limits::default()).messages;
        assert_eq!(sent.len(), 5, "{sent:?}");
        check(&sent, Roles::Any, true).unwrap();
    }

    #[test]
    fn check_names_what_an_upstream_refuses() {
        assert!(check(&[a("x"), u("y")], Roles::Any, false).is_err());
        assert!(check(&[a("x"), u("y")], Roles::Any, true).is_ok());
        assert!(check(&[a("x"), u("y")], Roles::Alternate, true).is_err());
        assert!(check(&[u("y"), call(Value::Null, &["c"])], Roles::Any, true).is_err());
        assert!(check(&[u("y"), result("c")], Roles::Any, true).is_err());
        assert!(check(&[u("y"), u("z")], Roles::Alternate, true).is_err());
        assert!(check(&[u("y"), u("z")], Roles::Any, true).is_ok());
    }
}
