//! The chat-completions body that goes upstream: instructions first, then
//! the window of history, then every other field of the client's body,
//! rewritten for the upstream's vendor mode.
//!
//! Vendor "custom" receives everything:
//! each message with its `turn_id`, `timestamp` and `metadata`, and the
//! body with top-level `turn_id`, `timestamp` and `interruptable`. Any other
//! vendor receives only what OpenAI's API accepts.

use std::borrow::Borrow;

use serde_json::{Map, Value};

use super::{TurnInfo, Vendor, VendorRules};
use crate::json;
use crate::memory::message::{Field, Message};

/// The upstream body, serialised: the client's `body` with its messages
/// replaced by `instructions` and `history` (the window, as
/// `render::outbound` made it for this upstream), rewritten for the vendor
/// mode. Written straight out, field by field, into one buffer sized for
/// it up front: no message is copied into an intermediate JSON value, and
/// the window's text is copied, not escaped, where it has nothing to
/// escape (`json`).
pub fn write<H: Borrow<Message>>(
    rules: &VendorRules,
    body: &Map<String, Value>,
    instructions: &[Message],
    history: &[H],
    turn: Option<TurnInfo<'_>>,
    now_ms: i64,
) -> serde_json::Result<Vec<u8>> {
    let upstream = UpstreamBody {
        rules,
        body,
        instructions,
        history,
        turn,
        now_ms,
    };
    let mut out = Vec::with_capacity(upstream.size_hint());
    upstream.write(&mut out)?;
    Ok(out)
}

/// The body field that carries the running summary in vendor "custom".
pub const RECALL_SUMMARY: &str = "recall_summary";

struct UpstreamBody<'a, H> {
    rules: &'a VendorRules,
    body: &'a Map<String, Value>,
    instructions: &'a [Message],
    history: &'a [H],
    turn: Option<TurnInfo<'a>>,
    now_ms: i64,
}

impl<H: Borrow<Message>> UpstreamBody<'_, H> {
    /// Whether a field of the client's body is left out.
    fn drops(&self, key: &str) -> bool {
        // In custom mode these are recall's own, written below (the
        // client's turn_id stays when there is no session turn to send).
        let ours = match key {
            "session_id" => self.rules.mode == Vendor::Openai,
            "turn_id" => self.rules.mode == Vendor::Openai || self.turn.is_some(),
            "timestamp" | "interruptable" | RECALL_SUMMARY => true,
            _ => false,
        };
        ours || self.stripped(key)
    }

    fn stripped(&self, key: &str) -> bool {
        self.rules.strip_fields.iter().any(|f| f == key)
    }

    fn messages(&self) -> impl Iterator<Item = &Message> {
        self.instructions
            .iter()
            .chain(self.history.iter().map(Borrow::borrow))
    }

    /// Room for the body: the messages' text, which is most of it, and a
    /// little for everything else. Growing the buffer as it is written
    /// meant six reallocations and copies for a window of 4 KB.
    fn size_hint(&self) -> usize {
        let text = |m: &Message| m.content.as_str().map_or(256, str::len) + 48;
        512 + self.messages().map(text).sum::<usize>()
    }

    fn write(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        let mut body = json::Object::open(out);
        let mut wrote_messages = false;
        for (key, value) in self.body {
            if key == "messages" {
                self.write_messages(body.key("messages"))?;
                wrote_messages = true;
            } else if !self.drops(key) {
                json::json(body.key(key), value)?;
            }
        }
        if !wrote_messages {
            self.write_messages(body.key("messages"))?;
        }
        if self.rules.mode == Vendor::Custom {
            if let (Some(t), false) = (self.turn, self.stripped("turn_id")) {
                json::value(body.key("turn_id"), &t.turn_id)?;
            }
            if !self.stripped("timestamp") {
                json::value(body.key("timestamp"), &self.now_ms)?;
            }
            if !self.stripped("interruptable") {
                json::value(body.key("interruptable"), &self.rules.interruptable)?;
            }
            let summary = self.turn.and_then(|t| t.summary);
            if let (Some(s), false) = (summary, self.stripped(RECALL_SUMMARY)) {
                json::value(body.key(RECALL_SUMMARY), &s.view())?;
            }
        }
        body.close();
        Ok(())
    }

    fn write_messages(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        out.push(b'[');
        for (i, m) in self.messages().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            match self.rules.mode {
                Vendor::Custom => write_whole(out, m)?,
                Vendor::Openai => write_openai(out, m)?,
            }
        }
        out.push(b']');
        Ok(())
    }
}

/// A message as vendor "custom" gets it: whole.
fn write_whole(out: &mut Vec<u8>, m: &Message) -> serde_json::Result<()> {
    // A Responses API mark is recall's bookkeeping (it repeats the
    // response's instructions and tools), not the conversation's.
    let marked = m.metadata.as_ref();
    if marked.is_some_and(|md| md.contains(crate::memory::chain::KEY)) {
        let mut m = m.clone();
        if let Some(md) = &mut m.metadata {
            md.remove(crate::memory::chain::KEY);
        }
        return json::value(out, &m);
    }
    json::value(out, m)
}

/// A message as any other vendor gets it: OpenAI's fields only.
fn write_openai(out: &mut Vec<u8>, m: &Message) -> serde_json::Result<()> {
    let mut fields = json::Object::open(out);
    for (key, field) in m.openai_fields() {
        let out = fields.key(key);
        match field {
            Field::Text(s) => json::string(out, s),
            Field::Value(v) => json::json(out, v)?,
            Field::Values(vs) => json::value(out, vs)?,
        }
    }
    fields.close();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{InterruptedRendering, Roles};
    use crate::memory::message::Role;
    use crate::memory::summary::Summary;
    use serde_json::json;

    fn rules(custom: bool) -> VendorRules {
        VendorRules {
            mode: if custom {
                Vendor::Custom
            } else {
                Vendor::Openai
            },
            interruptable: true,
            strip_fields: vec!["x_debug".into()],
            interrupted: InterruptedRendering::Annotated,
            interrupted_marker: " [cut]".into(),
            roles: Roles::Any,
        }
    }

    fn history() -> Vec<Message> {
        let mut m = Message::new(Role::User, "hi");
        m.turn_id = Some(2);
        m.timestamp = Some(10);
        m.metadata_mut().insert("source", json!("asr"));
        m.set_extra("x_field", json!(1));
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

    fn sent(
        rules: &VendorRules,
        sys: &[Message],
        history: &[Message],
        turn: Option<TurnInfo>,
    ) -> Value {
        serde_json::from_slice(&write(rules, &body(), sys, history, turn, 5).unwrap()).unwrap()
    }

    #[test]
    fn openai_mode_sends_only_openai_fields() {
        let sys = [Message::new(Role::System, "be brief")];
        let b = sent(
            &rules(false),
            &sys,
            &history(),
            Some(TurnInfo {
                turn_id: 2,
                summary: None,
            }),
        );
        assert_eq!(
            b,
            json!({"model": "m",
                   "messages": [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "hi"}],
                   "temperature": 0.2, "metadata": {"k": "v"}, "user": "u", "store": true,
                   "x_unknown": 2})
        );
    }

    #[test]
    fn custom_mode_forwards_everything_and_adds_turn_fields() {
        let sys = [Message::new(Role::System, "be brief")];
        let b = sent(
            &rules(true),
            &sys,
            &history(),
            Some(TurnInfo {
                turn_id: 2,
                summary: None,
            }),
        );
        assert_eq!(
            b,
            json!({"model": "m",
                   "messages": [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "hi", "turn_id": 2, "timestamp": 10,
                                 "metadata": {"source": "asr"}, "x_field": 1}],
                   "temperature": 0.2, "session_id": "s", "turn_id": 2, "timestamp": 5,
                   "interruptable": true, "metadata": {"k": "v"}, "user": "u", "store": true,
                   "x_unknown": 2})
        );
    }

    #[test]
    fn custom_mode_leaves_out_a_responses_mark() {
        let mut h = history();
        let mark = crate::memory::message::ResponseMark {
            key: "k".into(),
            input_items: 1,
            instructions: Some("long".into()),
            ..Default::default()
        };
        crate::memory::chain::mark(&mut h[0], mark);
        let b = sent(
            &rules(true),
            &[],
            &h,
            Some(TurnInfo {
                turn_id: 2,
                summary: None,
            }),
        );
        assert_eq!(b["messages"][0]["metadata"], json!({"source": "asr"}));
    }

    #[test]
    fn custom_mode_gets_the_running_summary_as_a_field_and_openai_does_not() {
        let summary = Summary {
            text: "Ada likes tea.".into(),
            until: 8,
            model: "m".into(),
            at_ms: 3,
            covered_tokens: 40,
        };
        let turn = Some(TurnInfo {
            turn_id: 2,
            summary: Some(&summary),
        });
        let b = sent(&rules(true), &[], &history(), turn);
        assert_eq!(
            b[RECALL_SUMMARY],
            json!({"text": "Ada likes tea.", "last_seq": 7, "model": "m", "created_at": 3})
        );
        let b = sent(&rules(false), &[], &history(), turn);
        assert!(b.get(RECALL_SUMMARY).is_none(), "{b}");
    }

    proptest::proptest! {
        /// The body written by hand reads back as serde would have written
        /// each message, whatever the text holds.
        #[test]
        fn messages_read_back_as_serde_writes_them(
            texts in proptest::collection::vec(proptest::prelude::any::<String>(), 0..6),
            named in proptest::prelude::any::<bool>(),
        ) {
            let history: Vec<Message> = texts
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let mut m = Message::new(if i % 2 == 0 { Role::User } else { Role::Assistant }, t.as_str());
                    if named {
                        m.set_name(Some(t.clone()));
                        m.set_extra("refusal", json!(t));
                    }
                    m
                })
                .collect();
            for custom in [false, true] {
                let b = sent(&rules(custom), &[], &history, None);
                let expected: Vec<Value> = history
                    .iter()
                    .map(|m| if custom {
                        serde_json::to_value(m).unwrap()
                    } else {
                        serde_json::to_value(crate::memory::message::OpenAi(m)).unwrap()
                    })
                    .collect();
                proptest::prop_assert_eq!(&b["messages"], &Value::Array(expected));
            }
        }
    }
}
