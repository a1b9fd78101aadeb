//! The history walked newest first as the units the window takes or
//! leaves whole: a message, or an assistant message with the tool results
//! that answer it (calls no result answers dropped from the copy, results
//! no call is right before left out).

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::Value;

use super::{legacy_call, Stored, Unit};
use crate::config::Roles;
use crate::exchange::protocol::VendorRules;
use crate::memory::interruption::{self, is_superseded};
use crate::memory::message::{Message, Role};

/// The history's units as the upstream sees them, newest first.
pub(super) struct Units<'a, H> {
    pub(super) history: &'a [H],
    pub(super) rules: &'a VendorRules,
    /// Everything from here on has been walked.
    pub(super) next: usize,
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
        if m.is_instruction() && self.rules.roles == Roles::Alternate {
            // Templates that need user and assistant to alternate take a
            // system message first only: a note inside the conversation
            // goes as the user's (as Pipecat sends it to such services),
            // merged with a user message beside it.
            let mut note = m.clone();
            note.role = Role::User;
            return Some(Arc::new(note));
        }
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
        let all_answered = m
            .tool_call_ids()
            .all(|id| id.is_some_and(|id| answered.contains(&id)));
        if all_answered {
            return Some(m);
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
                    first: shown,
                    rest: vec![self.history[i].share()],
                });
            }
            if m.role != Role::Tool {
                self.next = i;
                // A call not followed by its results: none was answered.
                match self.with_calls(i, &[]) {
                    Some(shown) => return Some(Unit::one(i, shown)),
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
            return Some(Unit {
                from: caller,
                first: shown,
                rest: results,
            });
        }
    }
}
