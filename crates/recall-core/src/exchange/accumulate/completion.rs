//! A non-streaming completion body read for the record: choice 0's
//! message and finish reason, and where the parts a Response is written
//! from lie (`Parts`, handed along by the relay so that the Responses API
//! does not read the body again). Pure.

use std::fmt;
use std::ops::Range;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::memory::message::{Message, Role};

/// What the relay reads of a completion body: the record's reply, its
/// finish reason, and where the body's parts are.
#[derive(Debug, PartialEq)]
pub struct CompletionRead {
    pub reply: Message,
    pub reason: Option<String>,
    pub parts: Parts,
}

/// Where a completion body's parts lie, as byte ranges of it: its model
/// and usage, and choice 0's message and finish reason (none where the
/// body has none, or `null`, or they were not asked for).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parts {
    pub model: Option<Range<usize>>,
    pub usage: Option<Range<usize>>,
    pub message: Option<Range<usize>>,
    pub finish_reason: Option<Range<usize>>,
}

/// What recall reads of a completion body: each choice's index, message
/// and finish reason, the model and the usage raw, and nothing else (the
/// id and the rest are skipped unparsed). Messages stay raw, and only
/// choice 0's is read: the others are skipped as the id is, so that one a
/// `Value` would refuse (a lone surrogate escape) no longer makes the
/// whole answer unusable. A repeated `model` or `usage` keeps the last, as
/// a `Value` does (by hand: the derived reading refuses it).
struct CompletionBody<'a> {
    choices: Vec<CompletionChoice<'a>>,
    model: Option<&'a RawValue>,
    usage: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct CompletionChoice<'a> {
    #[serde(default)]
    index: Option<Value>,
    #[serde(borrow, default)]
    message: Option<&'a RawValue>,
    #[serde(borrow, default)]
    finish_reason: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum Key {
    Choices,
    Model,
    Usage,
    #[serde(other)]
    Other,
}

/// Reads a completion body; its `model` and `usage` only when `parts`
/// asks for them (a raw reading checks their text once more: chat's
/// record has no use for it).
struct Wanted {
    parts: bool,
}

impl<'de> DeserializeSeed<'de> for Wanted {
    type Value = CompletionBody<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Wanted {
    type Value = CompletionBody<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a completion object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut choices = None;
        let (mut model, mut usage) = (None, None);
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Choices if choices.is_some() => {
                    return Err(serde::de::Error::duplicate_field("choices"))
                }
                Key::Choices => choices = Some(map.next_value()?),
                Key::Model if self.parts => model = map.next_value()?,
                Key::Usage if self.parts => usage = map.next_value()?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let choices = choices.ok_or_else(|| serde::de::Error::missing_field("choices"))?;
        Ok(CompletionBody {
            choices,
            model,
            usage,
        })
    }
}

/// Choice 0 of a non-streaming completion body: its assistant message and
/// its `finish_reason`, and, if asked (`parts`), where the body's parts
/// are. Parsed straight
/// from the bytes: a `Value` tree of the whole body showed in the proxy's
/// profile at full load, and one of the message alone took longer than
/// this reading.
pub fn completion_read(body: &[u8], parts: bool) -> Option<CompletionRead> {
    // Parts a raw reading refuses (text that is not UTF-8) do not make the
    // answer unusable: chat's record takes it, without them.
    read(body, parts).or_else(|| parts.then(|| read(body, false)).flatten())
}

fn read(body: &[u8], parts: bool) -> Option<CompletionRead> {
    let at = |raw: Option<&RawValue>| raw.and_then(|r| range_in(body, r.get()));
    let mut de = serde_json::Deserializer::from_slice(body);
    let read = Wanted { parts }.deserialize(&mut de).ok()?;
    de.end().ok()?;
    let index = |c: &CompletionChoice| c.index.as_ref().map(Value::as_u64);
    let found = match read.choices.iter().position(|c| index(c) == Some(Some(0))) {
        Some(found) => found,
        None if read.choices.first().is_some_and(|c| c.index.is_none()) => 0,
        None => return None,
    };
    let choice = read.choices.into_iter().nth(found)?;
    let raw = choice.message?.get();
    // A message that repeats a key is read as a `Value` reads it (the
    // last one kept), which the typed reading refuses.
    let mut reply: Message = serde_json::from_str(raw)
        .or_else(|_| serde_json::from_str::<Value>(raw).and_then(serde_json::from_value))
        .ok()?;
    reply.role = Role::Assistant;
    // Response-only annotations are not part of the conversation.
    reply.retain_extra(|k, v| k != "annotations" && !v.is_null());
    // A response's mark is recall's to make (`memory::chain`), as in a
    // client's messages.
    if let Some(md) = &mut reply.metadata {
        md.remove(crate::memory::message::MARK_KEY);
    }
    let reason = choice.finish_reason.and_then(|r| text(r.get()));
    Some(CompletionRead {
        reply,
        reason,
        parts: Parts {
            model: at(read.model),
            usage: at(read.usage),
            message: range_in(body, raw).filter(|_| parts),
            finish_reason: at(choice.finish_reason.filter(|_| parts)),
        },
    })
}

/// `completion_read` without the parts.
pub fn completion_reply(body: &[u8]) -> Option<(Message, Option<String>)> {
    completion_read(body, false).map(|r| (r.reply, r.reason))
}

/// The text a raw JSON value holds, as `Value::as_str` takes it; one with
/// no escapes (a finish reason always) without a reading of its own.
fn text(raw: &str) -> Option<String> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    if !inner.contains('\\') {
        return Some(inner.to_owned());
    }
    serde_json::from_str(raw).ok()
}

/// Where `part`, a slice of `body`, lies in it.
fn range_in(body: &[u8], part: &str) -> Option<Range<usize>> {
    let start = (part.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    (end <= body.len()).then_some(start..end)
}
