//! A chat request body read in one pass: its `messages` straight into
//! `Message`s, the rest into the body's map.
//!
//! The general reading (`parse_body`, then `parse_messages`) builds a
//! `Value` tree of every message and reads each tree again into a
//! `Message`. This pass reads what that one accepts, the same; where it
//! stops (a body the general reading refuses, or one it reads in a way
//! this pass does not, such as a message that repeats a key), the caller
//! reads the body the general way, which gives every refusal its exact
//! words. `fuzzing::request_reconcile` holds the two readings equal.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::{Map, Value};

use crate::memory::message::{check_messages, Message};

/// The request's body without its `messages` (`[]` in their place) and
/// the messages, checked: a `ChatRequest`'s parts. `None` where the
/// general reading must decide.
pub fn read(bytes: &[u8], max_messages: usize) -> Option<(Map<String, Value>, Vec<Message>)> {
    let Body { body, messages } = serde_json::from_slice(bytes).ok()?;
    let messages = messages?;
    if messages.is_empty() || messages.len() > max_messages {
        return None;
    }
    // serde_json's `Value` reads an object that opens with this key as the
    // JSON text it holds (its raw-value feature is on); the maps read here
    // without a `Value` would keep it as a key.
    let token = |m: &Message| {
        m.extra_get(RAW_VALUE_KEY).is_some()
            || m.metadata
                .as_ref()
                .is_some_and(|md| md.get(RAW_VALUE_KEY).is_some())
    };
    if body.contains_key(RAW_VALUE_KEY) || messages.iter().any(token) {
        return None;
    }
    let messages = check_messages(messages).ok()?;
    Some((body, messages))
}

const RAW_VALUE_KEY: &str = "$serde_json::private::RawValue";

struct Body {
    /// As the general reading leaves it: `messages` taken out, `[]` in its
    /// place.
    body: Map<String, Value>,
    messages: Option<Vec<Message>>,
}

impl<'de> Deserialize<'de> for Body {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(BodyVisitor)
    }
}

struct BodyVisitor;

impl<'de> Visitor<'de> for BodyVisitor {
    type Value = Body;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Body, A::Error> {
        let mut body = Map::new();
        let mut messages = None;
        while let Some(key) = map.next_key::<String>()? {
            // A repeated key is read as a `Value` map reads it: the last
            // one counts.
            if key == "messages" {
                messages = Some(map.next_value::<Vec<Message>>()?);
                body.insert(key, Value::Array(Vec::new()));
            } else {
                body.insert(key, map.next_value()?);
            }
        }
        Ok(Body { body, messages })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::request::{parse_body, parse_request, request_of, ChatRequest};

    fn general(body: &str) -> Result<ChatRequest, String> {
        parse_body(body.as_bytes())
            .and_then(|b| request_of(b, 8))
            .map_err(|e| e.to_string())
    }

    fn answer(body: &str) -> Result<ChatRequest, String> {
        parse_request(body.as_bytes(), 8).map_err(|e| e.to_string())
    }

    #[test]
    fn reads_what_the_general_reading_reads_alike() {
        for body in [
            r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true}"#,
            r#"{"messages": [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "ann",
                 "turn_id": 3, "timestamp": 1700000000000,
                 "metadata": {"source": "asr", "response": {"key": "forged"}, "x": [1]}},
                {"role": "assistant", "content": null, "refusal": null, "tool_calls":
                 [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "42", "vendor": {"a": 1}}],
               "tools": [], "session_id": "s"}"#,
            // Escaped keys, null fields, and a body's repeated key.
            r#"{"mes\u0073ages": [{"r\u006fle": "user", "content": "a", "name": null,
                "metadata": null, "turn_id": null}], "n": 1, "n": 2}"#,
            r#"{"messages": [{"role": "user", "content": "first"}],
                "messages": [{"role": "user", "content": "last"}]}"#,
        ] {
            let (body_read, messages) = read(body.as_bytes(), 8).expect("read in one pass");
            let one_pass = ChatRequest {
                body: body_read,
                messages,
            };
            // A client's forged response mark is gone, as `check_messages` makes it.
            assert!(one_pass
                .messages
                .iter()
                .all(|m| crate::memory::chain::record(m).is_none()));
            assert_eq!(Ok(one_pass), general(body), "{body}");
        }
    }

    #[test]
    fn leaves_to_the_general_reading_what_it_does_not_read_alike() {
        for body in [
            // A message that repeats a key: a `Value` keeps the last.
            r#"{"messages": [{"role": "user", "content": "a", "content": "b"}]}"#,
            r#"{"messages": [{"role": "robot", "content": "a"}],
                "messages": [{"role": "user", "content": "a"}]}"#,
            // Refusals, each in the general reading's words.
            r#"{"messages": []}"#,
            r#"{"messages": "hi"}"#,
            r#"{"messages": null}"#,
            r#"{"model": "m"}"#,
            r#"{"messages": [{"role": "user", "content": "a"}], "x": }"#,
            r#"[{"role": "user", "content": "a"}]"#,
            r#"{"messages": [{"role": "robot", "content": "a"}]}"#,
            r#"{"messages": [{"content": "a"}]}"#,
            r#"{"messages": [{"role": {"user": null}, "content": "a"}]}"#,
            // serde_json's raw-value token, which a `Value` reads as the
            // JSON text it holds, at each level read without a `Value`.
            r#"{"$serde_json::private::RawValue": "1", "messages": [{"role": "user", "content": "a"}]}"#,
            r#"{"messages": [{"$serde_json::private::RawValue": "1", "role": "user", "content": "a"}]}"#,
            r#"{"messages": [{"role": "user", "content": "a", "metadata": {"$serde_json::private::RawValue": "{\"source\":\"asr\"}"}}]}"#,
            r#"{"messages": [{"role": "user", "content": "a", "metadata": {"\u0024serde_json::private::RawValue": "null"}}]}"#,
            r#"{"messages": [7]}"#,
            r#"{"messages": [{"role": "tool", "content": "42"}]}"#,
            r#"{"messages": [{"role": "user"}]}"#,
            r#"{"messages": [{"role": "user", "content": "a", "turn_id": 1.0}]}"#,
            r#"{"messages": [{"role": "user", "content": [{"text": "no type"}]}]}"#,
            r#"{"messages": [1, 2, 3, 4, 5, 6, 7, 8, 9]}"#,
        ] {
            assert!(read(body.as_bytes(), 8).is_none(), "{body}");
            assert_eq!(answer(body), general(body), "{body}");
        }
        let nine = [r#"{"role": "user", "content": "a"}"#; 9].join(",");
        let body = format!(r#"{{"messages": [{nine}]}}"#);
        assert!(read(body.as_bytes(), 8).is_none());
        assert_eq!(answer(&body), general(&body));
        assert!(answer(&body).is_err());
    }
}
