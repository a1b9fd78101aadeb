//! The stored message: OpenAI's chat message plus the conversational
//! extensions (`turn_id`, `timestamp`, `metadata`).
//!
//! Fields nobody here knows about are kept, so that vendor "custom" can
//! forward everything a client sent.
//!
//! A session holds thousands of these, so the layout is compact: the role
//! is a byte, `metadata.source` is usually a static word, and the fields
//! most messages lack (`name`, `tool_calls`, `tool_call_id`, unknown
//! fields) share one optional box. A 200-character message costs about
//! 120 bytes beside its text.

use std::fmt;
use std::sync::Arc;

use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

mod counted;
mod mark;
mod metadata;
mod parse;
mod wire;

pub(in crate::memory) use counted::Counted;
pub use mark::{ResponseMark, KEY as MARK_KEY};
pub use metadata::Metadata;
pub use parse::{check_messages, parse_messages, MessageError};

/// A chat message's role. `system` and `developer` messages before any
/// other message of a request are instructions: sent upstream first, never
/// stored. Placed inside the conversation, they are part of it
/// (`leading_instructions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
    Function,
}

impl Role {
    pub const ALL: [Role; 6] = [
        Role::System,
        Role::Developer,
        Role::User,
        Role::Assistant,
        Role::Tool,
        Role::Function,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::Function => "function",
        }
    }

    pub fn parse(text: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == text)
    }
}

impl PartialEq<&str> for Role {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Role {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

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

/// How many of `messages` are the request's instructions: the system and
/// developer messages before its first other message. Those steer this
/// request and are not stored; one placed after a user or assistant message
/// (a one-off note mid-conversation) is part of the conversation, stored
/// and sent where the client put it.
pub fn leading_instructions(messages: &[Message]) -> usize {
    messages
        .iter()
        .position(|m| !m.is_instruction())
        .unwrap_or(messages.len())
}

pub mod source {
    pub const MESSAGE: &str = "message";
    pub const LLM: &str = "llm";
}

#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    pub content: Value,
    pub turn_id: Option<u64>,
    pub timestamp: Option<i64>,
    pub metadata: Option<Metadata>,
    rare: Option<Box<Rare>>,
    /// Sits in what would be padding after `role`: the layout test below
    /// holds the size.
    counted: Counted,
}

/// The fields few messages carry.
#[derive(Debug, Clone, PartialEq, Default)]
struct Rare {
    name: Option<String>,
    tool_calls: Option<Vec<Value>>,
    tool_call_id: Option<String>,
    /// `refusal`, `audio`, `function_call` and anything unknown.
    extra: Map<String, Value>,
}

impl Rare {
    fn is_empty(&self) -> bool {
        self.name.is_none()
            && self.tool_calls.is_none()
            && self.tool_call_id.is_none()
            && self.extra.is_empty()
    }
}

impl Serialize for Message {
    /// Seed 000's field order: OpenAI's fields, then the extensions, then
    /// anything unknown.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        self.serialize_openai_fields(&mut map)?;
        if let Some(t) = self.turn_id {
            map.serialize_entry("turn_id", &t)?;
        }
        if let Some(t) = self.timestamp {
            map.serialize_entry("timestamp", &t)?;
        }
        if let Some(md) = &self.metadata {
            map.serialize_entry("metadata", md)?;
        }
        for (k, v) in self.extra() {
            if !OPENAI_FIELDS.contains(&k.as_str()) {
                map.serialize_entry(k, v)?;
            }
        }
        map.end()
    }
}

impl Message {
    pub fn new(role: Role, content: impl Into<Value>) -> Self {
        Self {
            role,
            content: content.into(),
            turn_id: None,
            timestamp: None,
            metadata: None,
            rare: None,
            counted: Counted::default(),
        }
    }

    /// A stored message, to be changed: like `Arc::make_mut`, and it
    /// forgets the cached token count, which the change may make wrong.
    /// Every change to a stored message goes through here.
    pub fn edit(this: &mut Arc<Message>) -> &mut Message {
        let m = Arc::make_mut(this);
        m.counted.clear();
        m
    }

    /// Its token count as last counted (`Message::tokens`, in `tokens`).
    pub(in crate::memory) fn counted(&self) -> &Counted {
        &self.counted
    }

    /// Writes the fields OpenAI's API accepts, in its order.
    pub fn serialize_openai_fields<M: serde::ser::SerializeMap>(
        &self,
        map: &mut M,
    ) -> Result<(), M::Error> {
        for (key, field) in self.openai_fields() {
            map.serialize_entry(key, &field)?;
        }
        Ok(())
    }

    /// The fields OpenAI's API accepts, in the order they are sent: what
    /// both serde and the upstream body's writer (`proxy::vendor`) write.
    pub fn openai_fields(&self) -> impl Iterator<Item = (&str, Field<'_>)> {
        let fixed = [
            ("role", Some(Field::Text(self.role.as_str()))),
            ("content", Some(Field::Value(&self.content))),
            ("name", self.name().map(Field::Text)),
            ("tool_calls", self.tool_calls().map(|c| Field::Values(c))),
            ("tool_call_id", self.tool_call_id().map(Field::Text)),
        ];
        let extra = self
            .extra()
            .filter(|(k, _)| OPENAI_FIELDS.contains(&k.as_str()))
            .map(|(k, v)| (k.as_str(), Field::Value(v)));
        fixed
            .into_iter()
            .filter_map(|(k, f)| Some((k, f?)))
            .chain(extra)
    }

    /// The fields behind this are counted as tokens: a change to one
    /// forgets the count.
    fn rare_mut(&mut self) -> &mut Rare {
        self.counted.clear();
        self.rare.get_or_insert_with(Box::default)
    }

    /// Drops the box once nothing is left in it.
    fn tidy(&mut self) {
        if self.rare.as_ref().is_some_and(|r| r.is_empty()) {
            self.rare = None;
        }
    }

    pub fn name(&self) -> Option<&str> {
        self.rare.as_ref()?.name.as_deref()
    }

    pub fn set_name(&mut self, name: Option<String>) {
        self.rare_mut().name = name;
        self.tidy();
    }

    pub fn tool_calls(&self) -> Option<&Vec<Value>> {
        self.rare.as_ref()?.tool_calls.as_ref()
    }

    pub fn set_tool_calls(&mut self, calls: Option<Vec<Value>>) {
        self.rare_mut().tool_calls = calls;
        self.tidy();
    }

    /// Appends a call to the message's `tool_calls`, making the list if
    /// there is none.
    pub fn push_tool_call(&mut self, call: Value) {
        self.rare_mut()
            .tool_calls
            .get_or_insert_with(Vec::new)
            .push(call);
    }

    pub fn tool_call_id(&self) -> Option<&str> {
        self.rare.as_ref()?.tool_call_id.as_deref()
    }

    pub fn set_tool_call_id(&mut self, id: Option<String>) {
        self.rare_mut().tool_call_id = id;
        self.tidy();
    }

    /// `refusal`, `audio`, `function_call` and any field nobody here knows.
    pub fn extra(&self) -> impl Iterator<Item = (&String, &Value)> {
        self.rare.iter().flat_map(|r| r.extra.iter())
    }

    pub fn extra_get(&self, key: &str) -> Option<&Value> {
        self.rare.as_ref()?.extra.get(key)
    }

    pub fn set_extra(&mut self, key: &str, value: Value) {
        self.rare_mut().extra.insert(key.to_owned(), value);
    }

    pub fn retain_extra(&mut self, keep: impl FnMut(&String, &mut Value) -> bool) {
        if let Some(r) = &mut self.rare {
            r.extra.retain(keep);
        }
        self.tidy();
    }

    /// A system or developer message: it steers the model. Whether it is
    /// memory depends on where it stands (`leading_instructions`).
    pub fn is_instruction(&self) -> bool {
        matches!(self.role, Role::System | Role::Developer)
    }

    pub fn is_tool_result(&self) -> bool {
        matches!(self.role, Role::Tool | Role::Function)
    }

    pub fn has_tool_calls(&self) -> bool {
        self.tool_calls().is_some_and(|c| !c.is_empty())
    }

    pub fn content_str(&self) -> Option<&str> {
        self.content.as_str()
    }

    /// The ids of the tool calls this message makes, in order.
    pub fn tool_call_ids(&self) -> impl Iterator<Item = Option<&str>> {
        self.tool_calls()
            .into_iter()
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
            .tool_calls()
            .and_then(|c| serde_json::to_string(c).ok())
            .map_or(0, |s| s.len());
        content + calls
    }

    /// Roughly the bytes this message holds: its text (or its parts as
    /// JSON), its tool calls as JSON, and an interrupted reply's
    /// `original`. What `[history] max_bytes` bounds.
    pub fn byte_cost(&self) -> usize {
        let content = match &self.content {
            Value::Null => 0,
            Value::String(s) => s.len(),
            other => serde_json::to_string(other).map_or(0, |s| s.len()),
        };
        let calls = self
            .tool_calls()
            .and_then(|c| serde_json::to_string(c).ok())
            .map_or(0, |s| s.len());
        let original = self.meta_str("original").map_or(0, str::len);
        content + calls + original
    }

    /// The message as OpenAI accepts it: extension fields dropped.
    pub fn to_openai(&self) -> Value {
        serde_json::to_value(OpenAi(self)).unwrap_or(Value::Null)
    }
}

/// One field of a message, as the message holds it.
#[derive(Debug, Clone, Copy)]
pub enum Field<'a> {
    Text(&'a str),
    Value(&'a Value),
    Values(&'a [Value]),
}

impl Serialize for Field<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Field::Text(s) => serializer.serialize_str(s),
            Field::Value(v) => v.serialize(serializer),
            Field::Values(vs) => vs.serialize(serializer),
        }
    }
}

/// A message serialised with OpenAI's fields only.
pub struct OpenAi<'a>(pub &'a Message);

impl Serialize for OpenAi<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        self.0.serialize_openai_fields(&mut map)?;
        map.end()
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod layout {
    use super::*;

    /// A session holds thousands of messages: this is the budget the
    /// memory benchmark's target rests on (with `Arc`'s two counters, one
    /// 128-byte allocation per message beside its text).
    #[test]
    fn a_message_fits_in_112_bytes() {
        // The token cache sits in the padding after `role`.
        assert!(
            std::mem::size_of::<Message>() <= 112,
            "{}",
            std::mem::size_of::<Message>()
        );
        assert!(std::mem::size_of::<Option<Metadata>>() <= 32);
    }
}

#[cfg(test)]
mod token_cache {
    use super::*;
    use crate::memory::tokens::Encoding::{Cl100k, O200k};
    use serde_json::json;

    #[test]
    fn a_count_is_cached_and_forgotten_when_the_message_changes() {
        let mut m = Arc::new(Message::new(Role::User, "hello world"));
        assert_eq!(m.tokens(O200k), 6);
        assert_eq!(m.counted.get(O200k.id()), Some(6));
        // Shared (a window holds it): the copy that is changed starts over.
        let window = Arc::clone(&m);
        Message::edit(&mut m).content = "hello world hello world".into();
        assert_eq!(m.counted.get(O200k.id()), None);
        assert_eq!(m.tokens(O200k), 8);
        assert_eq!(window.tokens(O200k), 6);
        // Not shared: changed in place, forgotten all the same.
        drop(window);
        Message::edit(&mut m).content = "hi".into();
        assert_eq!(m.tokens(O200k), 5);
        // Another encoding replaces the count.
        assert_eq!(m.tokens(Cl100k), 5);
        assert_eq!(m.counted.get(O200k.id()), None);
    }

    #[test]
    fn setters_of_counted_fields_forget_the_count() {
        let mut m = Message::new(Role::Tool, "ok");
        let before = m.tokens(O200k);
        m.set_tool_call_id(Some("call_123".into()));
        assert!(m.tokens(O200k) > before);
        let before = m.tokens(O200k);
        m.set_name(Some("weather".into()));
        assert!(m.tokens(O200k) > before);
        let before = m.tokens(O200k);
        m.set_tool_calls(Some(vec![json!({"id": "c"})]));
        assert!(m.tokens(O200k) > before);
    }

    /// Stored messages are shared; `Message::edit` is the one way to change
    /// one that keeps its token count right. This finds any other.
    #[test]
    fn stored_messages_are_changed_only_through_edit() {
        fn visit(dir: &std::path::Path, found: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    visit(&path, found);
                } else if path.extension().is_some_and(|e| e == "rs")
                    && !path.ends_with("memory/message/mod.rs")
                {
                    let text = std::fs::read_to_string(&path).unwrap();
                    for bad in ["Arc::make_mut", "Arc::get_mut"] {
                        if text.contains(bad) {
                            found.push(format!("{}: {bad}", path.display()));
                        }
                    }
                }
            }
        }
        let mut found = Vec::new();
        // This crate's code and the server's, which holds the sessions.
        for dir in ["/src", "/../../src"] {
            let dir = format!("{}{dir}", env!("CARGO_MANIFEST_DIR"));
            visit(std::path::Path::new(&dir), &mut found);
        }
        assert!(found.is_empty(), "use Message::edit: {found:?}");
    }
}
