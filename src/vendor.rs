//! The body that goes upstream: instructions first, then the window of
//! history, then every other field of the client's body, rewritten for the
//! upstream's vendor mode.
//!
//! Vendor "custom" receives everything (as seed 000's custom example shows):
//! each message with its `turn_id`, `timestamp` and `metadata`, and the
//! body with top-level `turn_id`, `timestamp` and `interruptable`. Any other
//! vendor receives only what OpenAI's API accepts.

use std::borrow::Borrow;

use serde_json::{Map, Value};

use crate::config::{InterruptedRendering, UpstreamConfig};
use crate::interruption;
use crate::message::Message;

/// Top-level fields that are recall's (or seed 000's) and not OpenAI's.
pub const EXTENSION_FIELDS: &[&str] = &["session_id", "turn_id", "timestamp", "interruptable"];

/// What a vendor mode decides, taken from an upstream's config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VendorRules {
    pub custom: bool,
    pub interruptable: bool,
    pub strip_fields: Vec<String>,
    pub interrupted: InterruptedRendering,
    pub interrupted_marker: String,
}

impl VendorRules {
    pub fn from_config(u: &UpstreamConfig) -> Self {
        Self {
            custom: u.is_custom(),
            interruptable: u.interruptable,
            strip_fields: u.strip_fields.clone(),
            interrupted: u.interrupted,
            interrupted_marker: u.interrupted_marker.clone(),
        }
    }
}

/// What the session knows about the turn being sent, if there is a session.
#[derive(Debug, Clone, Copy)]
pub struct TurnInfo {
    pub turn_id: u64,
}

/// Rewrites the client's `body` in place into the upstream body.
pub fn rewrite<H: Borrow<Message>>(
    rules: &VendorRules,
    body: &mut Map<String, Value>,
    instructions: &[Message],
    history: &[H],
    turn: Option<TurnInfo>,
    now_ms: i64,
) {
    let render = |m: &Message| {
        if rules.custom {
            serde_json::to_value(m).unwrap_or(Value::Null)
        } else {
            m.to_openai()
        }
    };
    let shown = history.iter().enumerate().filter_map(|(i, m)| {
        let answered = history
            .get(i + 1)
            .is_some_and(|n| n.borrow().is_tool_result());
        interruption::render(
            m.borrow(),
            rules.interrupted,
            &rules.interrupted_marker,
            answered,
        )
    });
    let messages: Vec<Value> = instructions
        .iter()
        .map(render)
        .chain(shown.map(|m| render(&m)))
        .collect();
    body.insert("messages".into(), Value::Array(messages));

    if rules.custom {
        if let Some(t) = turn {
            body.insert("turn_id".into(), t.turn_id.into());
        }
        body.insert("timestamp".into(), now_ms.into());
        body.insert("interruptable".into(), rules.interruptable.into());
    } else {
        for field in EXTENSION_FIELDS {
            body.shift_remove(*field);
        }
    }
    for field in &rules.strip_fields {
        body.shift_remove(field);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules(custom: bool) -> VendorRules {
        VendorRules {
            custom,
            interruptable: true,
            strip_fields: vec!["x_debug".into()],
            interrupted: InterruptedRendering::Annotated,
            interrupted_marker: " [cut]".into(),
        }
    }

    fn history() -> Vec<Message> {
        let mut m = Message::new("user", "hi");
        m.turn_id = Some(2);
        m.timestamp = Some(10);
        m.metadata_mut().insert("source".into(), json!("asr"));
        m.extra.insert("x_field".into(), json!(1));
        vec![m]
    }

    fn body() -> Map<String, Value> {
        json!({"model": "m", "messages": [], "temperature": 0.2, "session_id": "s",
               "turn_id": 9, "timestamp": 1, "interruptable": false, "metadata": {"k": "v"},
               "user": "u", "store": true, "x_debug": 1, "x_unknown": 2})
        .as_object()
        .cloned()
        .unwrap()
    }

    #[test]
    fn openai_mode_sends_only_openai_fields() {
        let mut b = body();
        let sys = [Message::new("system", "be brief")];
        rewrite(
            &rules(false),
            &mut b,
            &sys,
            &history(),
            Some(TurnInfo { turn_id: 2 }),
            5,
        );
        assert_eq!(
            Value::Object(b),
            json!({"model": "m",
                   "messages": [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "hi"}],
                   "temperature": 0.2, "metadata": {"k": "v"}, "user": "u", "store": true,
                   "x_unknown": 2})
        );
    }

    #[test]
    fn interrupted_replies_are_rendered_per_upstream() {
        let cut = interruption::interrupted_reply(
            Message::new("assistant", "Why"),
            &Message::new("assistant", "Why not"),
            true,
            3,
            None,
        );
        let history = [Message::new("user", "q"), cut];
        let mut b = body();
        rewrite(&rules(false), &mut b, &[], &history, None, 5);
        assert_eq!(
            b["messages"][1],
            json!({"role": "assistant", "content": "Why [cut]"})
        );
        let mut b = body();
        rewrite(&rules(true), &mut b, &[], &history, None, 5);
        assert_eq!(b["messages"][1]["content"], "Why [cut]");
        assert_eq!(b["messages"][1]["metadata"]["original"], "Why not");
    }

    #[test]
    fn custom_mode_forwards_everything_and_adds_turn_fields() {
        let mut b = body();
        let sys = [Message::new("system", "be brief")];
        rewrite(
            &rules(true),
            &mut b,
            &sys,
            &history(),
            Some(TurnInfo { turn_id: 2 }),
            5,
        );
        assert_eq!(
            Value::Object(b),
            json!({"model": "m",
                   "messages": [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "hi", "turn_id": 2, "timestamp": 10,
                                 "metadata": {"source": "asr"}, "x_field": 1}],
                   "temperature": 0.2, "session_id": "s", "turn_id": 2, "timestamp": 5,
                   "interruptable": true, "metadata": {"k": "v"}, "user": "u", "store": true,
                   "x_unknown": 2})
        );
    }
}
