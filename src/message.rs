//! The stored message: OpenAI's chat message plus the conversational
//! extensions of seed 000 (`turn_id`, `timestamp`, `metadata`).
//!
//! Fields nobody here knows about are kept in `extra`, so that vendor
//! "custom" can forward everything a client sent.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Roles a chat message may have. `system` and `developer` are instructions:
/// they are sent upstream but never stored in a session's history.
pub const ROLES: &[&str] = &[
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];

/// The message fields OpenAI's API accepts; vendor modes other than "custom"
/// send only these.
pub const OPENAI_FIELDS: &[&str] = &[
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "refusal",
    "audio",
    "function_call",
];

pub mod source {
    pub const MESSAGE: &str = "message";
    pub const LLM: &str = "llm";
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    /// `refusal`, `audio`, `function_call` and anything unknown.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Message {
    pub fn new(role: &str, content: impl Into<Value>) -> Self {
        Self {
            role: role.to_owned(),
            content: content.into(),
            name: None,
            tool_calls: None,
            tool_call_id: None,
            turn_id: None,
            timestamp: None,
            metadata: None,
            extra: Map::new(),
        }
    }

    /// System and developer messages steer the model; they are not memory.
    pub fn is_instruction(&self) -> bool {
        matches!(self.role.as_str(), "system" | "developer")
    }

    pub fn is_tool_result(&self) -> bool {
        matches!(self.role.as_str(), "tool" | "function")
    }

    pub fn has_tool_calls(&self) -> bool {
        self.tool_calls.as_ref().is_some_and(|c| !c.is_empty())
    }

    pub fn content_str(&self) -> Option<&str> {
        self.content.as_str()
    }

    /// The ids of the tool calls this message makes, in order.
    pub fn tool_call_ids(&self) -> impl Iterator<Item = Option<&str>> {
        self.tool_calls
            .iter()
            .flatten()
            .map(|c| c.get("id").and_then(Value::as_str))
    }

    pub fn source(&self) -> Option<&str> {
        self.meta_str("source")
    }

    pub fn meta_str(&self, key: &str) -> Option<&str> {
        self.metadata.as_ref()?.get_str(key)
    }

    pub fn metadata_mut(&mut self) -> &mut Metadata {
        self.metadata.get_or_insert_with(Metadata::default)
    }

    /// Characters this message costs in a window: text counts its chars,
    /// anything structured (multimodal parts, tool calls) its JSON length.
    pub fn char_cost(&self) -> usize {
        let content = match &self.content {
            Value::Null => 0,
            Value::String(s) => s.chars().count(),
            other => other.to_string().len(),
        };
        let calls = self
            .tool_calls
            .as_ref()
            .map_or(0, |c| Value::from(c.clone()).to_string().len());
        content + calls
    }

    /// The message as OpenAI accepts it: extension fields dropped.
    pub fn to_openai(&self) -> Value {
        let mut out = Map::new();
        out.insert("role".into(), Value::String(self.role.clone()));
        out.insert("content".into(), self.content.clone());
        if let Some(name) = &self.name {
            out.insert("name".into(), Value::String(name.clone()));
        }
        if let Some(calls) = &self.tool_calls {
            out.insert("tool_calls".into(), Value::Array(calls.clone()));
        }
        if let Some(id) = &self.tool_call_id {
            out.insert("tool_call_id".into(), Value::String(id.clone()));
        }
        for (k, v) in &self.extra {
            if OPENAI_FIELDS.contains(&k.as_str()) {
                out.insert(k.clone(), v.clone());
            }
        }
        Value::Object(out)
    }
}

/// A message's `metadata`, kept small: nearly every stored message has a
/// `source`, nearly always one of a few words, so it has a field of its own
/// that costs no allocation; anything else is kept in order beside it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Metadata {
    source: Option<Cow<'static, str>>,
    rest: Vec<(String, Value)>,
}

const KNOWN_SOURCES: &[&str] = &[
    "message",
    "llm",
    "llm_failure",
    "cache",
    "asr",
    "greeting",
    "command",
    "silence",
];

fn source_word(text: &str) -> Cow<'static, str> {
    match KNOWN_SOURCES.iter().find(|k| **k == text) {
        Some(k) => Cow::Borrowed(k),
        None => Cow::Owned(text.to_owned()),
    }
}

impl Metadata {
    /// Any field but `source` (see `get_str`).
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.rest.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// A text field, `source` included.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        if key == "source" {
            return self.source.as_deref();
        }
        self.get(key)?.as_str()
    }

    pub fn insert(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        if key == "source" {
            if let Value::String(text) = &value {
                self.source = Some(source_word(text));
                self.rest.retain(|(k, _)| k != "source");
                return;
            }
            self.source = None;
        }
        match self.rest.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => *v = value,
            None => self.rest.push((key, value)),
        }
    }

    /// Sets `key` unless it is set already.
    pub fn insert_default(&mut self, key: &str, value: impl FnOnce() -> Value) {
        let present = if key == "source" {
            self.source.is_some() || self.get(key).is_some()
        } else {
            self.get(key).is_some()
        };
        if !present {
            self.insert(key, value());
        }
    }

    pub fn remove(&mut self, key: &str) {
        if key == "source" {
            self.source = None;
        }
        self.rest.retain(|(k, _)| k != key);
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

impl Serialize for Metadata {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.rest.len() + 1))?;
        if let Some(source) = &self.source {
            map.serialize_entry("source", source)?;
        }
        for (k, v) in &self.rest {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let map = Map::<String, Value>::deserialize(deserializer)?;
        let mut meta = Metadata {
            source: None,
            rest: Vec::with_capacity(map.len()),
        };
        for (k, v) in map {
            meta.insert(k, v);
        }
        meta.rest.shrink_to_fit();
        Ok(meta)
    }
}

/// Why a message in a request body was refused; the index is its position.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MessageError {
    #[error("messages[{0}] must be an object")]
    NotObject(usize),
    #[error("messages[{0}].role must be one of system, developer, user, assistant, tool")]
    BadRole(usize),
    #[error("messages[{0}] is invalid: {1}")]
    Invalid(usize, String),
}

impl MessageError {
    pub fn param(&self) -> String {
        match self {
            MessageError::NotObject(i) | MessageError::Invalid(i, _) => format!("messages[{i}]"),
            MessageError::BadRole(i) => format!("messages[{i}].role"),
        }
    }
}

/// Parses the `messages` array of a request body.
pub fn parse_messages(values: Vec<Value>) -> Result<Vec<Message>, MessageError> {
    values
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let Value::Object(obj) = v else {
                return Err(MessageError::NotObject(i));
            };
            match obj.get("role").and_then(Value::as_str) {
                Some(role) if ROLES.contains(&role) => {}
                _ => return Err(MessageError::BadRole(i)),
            }
            serde_json::from_value(Value::Object(obj))
                .map_err(|e| MessageError::Invalid(i, e.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_fields_survive_a_round_trip() {
        let v = json!({"role": "user", "content": "hi", "turn_id": 3, "timestamp": 5,
                        "metadata": {"source": "asr", "user": "u1"}, "x_custom": [1]});
        let m = parse_messages(vec![v.clone()]).unwrap().remove(0);
        assert_eq!(m.turn_id, Some(3));
        assert_eq!(m.source(), Some("asr"));
        assert_eq!(serde_json::to_value(&m).unwrap(), v);
    }

    #[test]
    fn openai_form_keeps_only_openai_fields() {
        let v = json!({"role": "assistant", "content": null, "turn_id": 3, "refusal": "no",
                        "metadata": {"source": "llm"}, "x_custom": 1,
                        "tool_calls": [{"id": "c1", "type": "function",
                                        "function": {"name": "f", "arguments": "{}"}}]});
        let m = parse_messages(vec![v]).unwrap().remove(0);
        assert_eq!(
            m.to_openai(),
            json!({"role": "assistant", "content": null, "refusal": "no",
                   "tool_calls": [{"id": "c1", "type": "function",
                                   "function": {"name": "f", "arguments": "{}"}}]})
        );
    }

    #[test]
    fn bad_messages_are_named_by_index() {
        let err = parse_messages(vec![json!({"role": "user", "content": "a"}), json!("x")]);
        assert_eq!(err.unwrap_err(), MessageError::NotObject(1));
        let err = parse_messages(vec![json!({"role": "robot", "content": "a"})]);
        assert_eq!(err.unwrap_err(), MessageError::BadRole(0));
        let err = parse_messages(vec![json!({"content": "a"})]);
        assert_eq!(err.unwrap_err(), MessageError::BadRole(0));
        let err = parse_messages(vec![json!({"role": "user", "turn_id": "x"})]);
        assert!(matches!(err.unwrap_err(), MessageError::Invalid(0, _)));
    }

    #[test]
    fn char_cost_counts_text_chars_and_structured_json() {
        assert_eq!(Message::new("user", "héllo").char_cost(), 5);
        let parts = json!([{"type": "text", "text": "hi"}]);
        assert_eq!(
            Message::new("user", parts.clone()).char_cost(),
            parts.to_string().len()
        );
    }
}
