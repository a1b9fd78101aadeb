//! A message read from its wire form, as clients and storage write it.
//!
//! Written by hand rather than derived: a derived struct that keeps
//! unknown fields (`#[serde(flatten)]`) buffers every message whole into
//! serde's intermediate form and reads it a second time, on every message
//! of every request and every history load. This reads each field once,
//! with the derive's rules: a known field at most once, `null` as absent,
//! `role` required, anything else kept as it came.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::{Map, Value};

use super::{Message, Metadata, Rare, Role};

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(MessageVisitor)
    }
}

struct MessageVisitor;

impl<'de> Visitor<'de> for MessageVisitor {
    type Value = Message;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a chat message object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Message, A::Error> {
        let mut role = None;
        let mut content = None;
        let mut name = None;
        let mut tool_calls = None;
        let mut tool_call_id = None;
        let mut turn_id = None;
        let mut timestamp = None;
        let mut metadata = None;
        let mut extra = Map::new();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Role => once(&mut role, "role", map.next_value::<Role>()?)?,
                Key::Content => once(&mut content, "content", map.next_value::<Value>()?)?,
                Key::Name => once(&mut name, "name", map.next_value()?)?,
                Key::ToolCalls => once(&mut tool_calls, "tool_calls", map.next_value()?)?,
                Key::ToolCallId => once(&mut tool_call_id, "tool_call_id", map.next_value()?)?,
                Key::TurnId => once(&mut turn_id, "turn_id", map.next_value()?)?,
                Key::Timestamp => once(&mut timestamp, "timestamp", map.next_value()?)?,
                Key::Metadata => {
                    let md: Option<Metadata> = map.next_value()?;
                    once(&mut metadata, "metadata", md)?
                }
                Key::Other(k) => {
                    extra.insert(k, map.next_value()?);
                }
            }
        }
        let role = role.ok_or_else(|| de::Error::missing_field("role"))?;
        let rare = Rare {
            name: name.flatten(),
            tool_calls: tool_calls.flatten(),
            tool_call_id: tool_call_id.flatten(),
            extra,
        };
        Ok(Message {
            role,
            content: content.unwrap_or_default(),
            turn_id: turn_id.flatten(),
            timestamp: timestamp.flatten(),
            metadata: metadata.flatten(),
            rare: (!rare.is_empty()).then(|| Box::new(rare)),
            counted: super::Counted::default(),
        })
    }
}

/// A role is one of its six names, as a string: a derived enum would also
/// take `{"user": null}`, which the check of `parse_messages` refuses.
impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct RoleVisitor;
        impl Visitor<'_> for RoleVisitor {
            type Value = Role;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a role")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Role, E> {
                const NAMES: &[&str] = &[
                    "system",
                    "developer",
                    "user",
                    "assistant",
                    "tool",
                    "function",
                ];
                Role::parse(v).ok_or_else(|| E::unknown_variant(v, NAMES))
            }
        }
        deserializer.deserialize_str(RoleVisitor)
    }
}

/// Sets a field seen for the first time; a second is an error, as the
/// derive makes it.
fn once<T, E: de::Error>(slot: &mut Option<T>, field: &'static str, value: T) -> Result<(), E> {
    if slot.is_some() {
        return Err(E::duplicate_field(field));
    }
    *slot = Some(value);
    Ok(())
}

/// A message's key: a known field, or one kept as it came.
enum Key {
    Role,
    Content,
    Name,
    ToolCalls,
    ToolCallId,
    TurnId,
    Timestamp,
    Metadata,
    Other(String),
}

impl Key {
    fn known(k: &str) -> Option<Key> {
        Some(match k {
            "role" => Key::Role,
            "content" => Key::Content,
            "name" => Key::Name,
            "tool_calls" => Key::ToolCalls,
            "tool_call_id" => Key::ToolCallId,
            "turn_id" => Key::TurnId,
            "timestamp" => Key::Timestamp,
            "metadata" => Key::Metadata,
            _ => return None,
        })
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: de::Error>(self, k: &str) -> Result<Key, E> {
                Ok(Key::known(k).unwrap_or_else(|| Key::Other(k.to_owned())))
            }
            // A `Value`'s keys come owned: an unknown one is moved, not copied.
            fn visit_string<E: de::Error>(self, k: String) -> Result<Key, E> {
                Ok(Key::known(&k).unwrap_or(Key::Other(k)))
            }
        }
        deserializer.deserialize_identifier(KeyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn reads_every_field_once_and_keeps_the_unknown() {
        let v = json!({"role": "assistant", "content": null, "name": "bot", "refusal": "no",
            "tool_calls": [{"id": "c"}], "tool_call_id": null, "turn_id": 4,
            "timestamp": -5, "metadata": {"source": "asr", "k": 1}, "audio": {"id": "a"}});
        for m in [
            serde_json::from_value::<Message>(v.clone()).unwrap(),
            serde_json::from_str::<Message>(&v.to_string()).unwrap(),
        ] {
            assert_eq!(m.role, Role::Assistant);
            assert_eq!((m.turn_id, m.timestamp), (Some(4), Some(-5)));
            assert_eq!(m.tool_call_id(), None);
            let mut back = serde_json::to_value(&m).unwrap();
            back.as_object_mut()
                .unwrap()
                .insert("tool_call_id".into(), Value::Null);
            assert_eq!(back, v);
        }
        let bare: Message = serde_json::from_str(r#"{"role": "user"}"#).unwrap();
        assert_eq!(bare.content, Value::Null);
        assert!(bare.rare.is_none() && bare.metadata.is_none());
    }

    #[test]
    fn refuses_as_the_derive_did() {
        let err = |s: &str| serde_json::from_str::<Message>(s).unwrap_err().to_string();
        assert!(err(r#"{"role": "user", "role": "user"}"#).starts_with("duplicate field `role`"));
        assert!(err(r#"{"content": "a"}"#).starts_with("missing field `role`"));
        assert!(err(r#"{"role": "robot"}"#).starts_with("unknown variant `robot`"));
        // A derived enum took a variant's map form too.
        assert!(
            err(r#"{"role": {"user": null}}"#).starts_with("invalid type: map, expected a role")
        );
        let v = serde_json::json!({"role": {"user": null}});
        assert!(serde_json::from_value::<Message>(v).is_err());
        assert!(err(r#"{"role": "user", "turn_id": "1"}"#).starts_with("invalid type: string"));
        assert!(err(r#"["user"]"#).starts_with("invalid type: sequence, expected a chat message"));
    }
}
