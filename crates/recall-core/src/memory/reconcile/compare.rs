//! Whether a message a client sent is one the session stores: content
//! compared canonically, assistant text that may be shortened.

use serde_json::Value;

use crate::memory::message::Message;

pub(super) enum Match {
    No,
    Same,
    Shortened(String),
}

/// Whether a message a client sent is the same as a stored one: the role,
/// the content and the tool calls agree. A client may send an assistant
/// message shortened to what its user actually heard, so an assistant
/// message whose text is a prefix of the stored text lines up too.
pub(super) fn lines_up(stored: &Message, sent: &Message) -> Match {
    if stored.role != sent.role || stored.tool_call_id() != sent.tool_call_id() {
        return Match::No;
    }
    if !same_calls(stored.tool_calls(), sent.tool_calls()) {
        return Match::No;
    }
    if same_content(&stored.content, &sent.content) {
        return Match::Same;
    }
    if stored.role != "assistant" {
        return Match::No;
    }
    let (Some(full), Some(part)) = (text_of(&stored.content), text_of(&sent.content)) else {
        return Match::No;
    };
    if full.trim_end() == part.trim_end() || (part.trim().is_empty() && stored.has_tool_calls()) {
        // Clients that trim whitespace, or blank the text of a tool-call
        // message, have not reported a cut.
        Match::Same
    } else if full.starts_with(part.as_ref()) {
        Match::Shortened(part.into_owned())
    } else if stored
        .meta_str(crate::memory::interruption::ORIGINAL)
        .is_some_and(|o| o.starts_with(part.as_ref()))
    {
        // Longer than what went out, but part of what was generated: the
        // client knows more than recall relayed; keep the record as it is.
        Match::Same
    } else {
        Match::No
    }
}

/// Content compares canonically: a string is the same as a parts array of
/// text alone with the same text, `null` as `""`, and the order of keys
/// never matters (`serde_json` maps are ordered by key).
fn same_content(stored: &Value, sent: &Value) -> bool {
    stored == sent
        || match (text_of(stored), text_of(sent)) {
            (Some(a), Some(b)) => a == b,
            _ => false,
        }
}

/// The text of content that is only text: a string, `null` (no text), or
/// an array of `text` parts (their texts joined).
fn text_of(content: &Value) -> Option<std::borrow::Cow<'_, str>> {
    use std::borrow::Cow;
    match content {
        Value::String(s) => Some(Cow::Borrowed(s)),
        Value::Null => Some(Cow::Borrowed("")),
        Value::Array(parts) => {
            let mut text = String::new();
            for part in parts {
                if part.get("type").and_then(Value::as_str) != Some("text") {
                    return None;
                }
                text.push_str(part.get("text").and_then(Value::as_str)?);
            }
            Some(Cow::Owned(text))
        }
        _ => None,
    }
}

/// Tool calls are the same when their ids, names and arguments are;
/// arguments that are JSON compare as JSON, whatever their spacing.
fn same_calls(stored: Option<&Vec<Value>>, sent: Option<&Vec<Value>>) -> bool {
    let empty = Vec::new();
    let (a, b) = (stored.unwrap_or(&empty), sent.unwrap_or(&empty));
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_call(x, y))
}

fn same_call(a: &Value, b: &Value) -> bool {
    let field = |v: &'_ Value, f: &str| v.get("function").and_then(|x| x.get(f)).cloned();
    if a.get("id") != b.get("id") || field(a, "name") != field(b, "name") {
        return false;
    }
    match (field(a, "arguments"), field(b, "arguments")) {
        (Some(Value::String(x)), Some(Value::String(y))) if x != y => {
            match (
                serde_json::from_str::<Value>(&x),
                serde_json::from_str::<Value>(&y),
            ) {
                (Ok(x), Ok(y)) => x == y,
                _ => false,
            }
        }
        (x, y) => x == y,
    }
}
