//! The grammar `outbound` promises, stated on its own for the tests and
//! the fuzz targets.

use std::borrow::Borrow;

use super::legacy_call;
use crate::config::Roles;
use crate::memory::interruption::{self, is_superseded};
use crate::memory::message::{Message, Role};

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
        if roles == Roles::Alternate && m.is_instruction() {
            return Err(format!("message {i} is a {} message", m.role));
        }
        if roles == Roles::Alternate && i > 0 {
            let p = at(i - 1);
            // A call (of either kind) may follow a reply: it is not text.
            let plain = |m: &Message| {
                matches!(m.role.as_str(), "user" | "assistant")
                    && !m.has_tool_calls()
                    && !legacy_call(m)
            };
            if p.role == m.role && plain(p) && plain(m) && p.name().is_none() && m.name().is_none()
            {
                return Err(format!("messages {} and {i} are both {}", i - 1, m.role));
            }
        }
    }
    Ok(())
}
