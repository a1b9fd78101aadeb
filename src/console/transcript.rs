//! A session's messages as the console shows them: pure, over plain data.
//! An interrupted reply splits into what the user heard and the rest of
//! the original; replaced messages are grouped under why; tool calls are
//! read out of their JSON; the window's start is placed between messages.

use std::sync::Arc;

use serde_json::Value;

use crate::memory::interruption::{self as int, SUPERSEDED_BY};
use crate::memory::message::{source, Message};

/// One item of the transcript, in order.
#[derive(Debug, PartialEq)]
pub enum Entry<'a> {
    /// The window the upstream received on the last turn began here.
    WindowStart,
    Message(Box<Shown<'a>>),
    /// Messages a regenerate, an edit, a retry or a delete replaced.
    Replaced {
        why: &'static str,
        messages: Vec<Shown<'a>>,
    },
}

/// A message, ready to show.
#[derive(Debug, PartialEq)]
pub struct Shown<'a> {
    pub seq: u64,
    pub role: &'static str,
    /// Its text parts, joined; what the user heard for a cut reply.
    pub text: String,
    /// Its other parts (`[image]`, `[audio]`, ...).
    pub parts: Vec<String>,
    /// `metadata.source` when it is not the usual one for its role.
    pub source: Option<&'a str>,
    pub name: Option<&'a str>,
    pub timestamp: Option<i64>,
    pub turn_id: Option<u64>,
    pub cut: Option<Cut<'a>>,
    /// A failure record's error.
    pub failure: Option<&'a str>,
    pub tool_calls: Vec<Call<'a>>,
    pub tool_call_id: Option<&'a str>,
}

/// An interrupted reply: what was heard is `Shown::text`.
#[derive(Debug, PartialEq)]
pub struct Cut<'a> {
    /// The rest of the original, after what was heard.
    pub unheard: String,
    /// The original whole, when it does not begin with what was heard
    /// (the client said it heard something else).
    pub original: Option<&'a str>,
    pub at_ms: Option<i64>,
    pub by: Option<&'a str>,
    /// The original was read to its end.
    pub complete: bool,
    pub error: Option<&'a str>,
}

#[derive(Debug, PartialEq)]
pub struct Call<'a> {
    pub id: Option<&'a str>,
    pub name: &'a str,
    pub arguments: &'a str,
}

/// The transcript of `messages` (the first numbered `first_seq`), with the
/// window's start at `window_from` when it falls on one of them.
pub fn entries(messages: &[Arc<Message>], first_seq: u64, window_from: u64) -> Vec<Entry<'_>> {
    let mut out: Vec<Entry<'_>> = Vec::with_capacity(messages.len() + 1);
    for (i, m) in messages.iter().enumerate() {
        let seq = first_seq + i as u64;
        if seq == window_from {
            out.push(Entry::WindowStart);
        }
        let shown = shown(seq, m);
        if !int::is_superseded(m) {
            out.push(Entry::Message(Box::new(shown)));
            continue;
        }
        let why = replaced_why(m);
        match out.last_mut() {
            Some(Entry::Replaced { why: w, messages }) if *w == why => messages.push(shown),
            _ => out.push(Entry::Replaced {
                why,
                messages: vec![shown],
            }),
        }
    }
    out
}

fn replaced_why(m: &Message) -> &'static str {
    match m.meta_str(SUPERSEDED_BY) {
        Some("regenerate") => "regenerated",
        Some("edit") => "edited",
        Some("retry") => "retried",
        Some("deleted") => "deleted",
        _ => "replaced",
    }
}

pub fn shown(seq: u64, m: &Message) -> Shown<'_> {
    let (text, parts) = text_of(&m.content);
    let usual = match m.role.as_str() {
        "assistant" => source::LLM,
        _ => source::MESSAGE,
    };
    let failure = int::is_failure(m).then(|| m.meta_str(int::ERROR).unwrap_or("failed"));
    Shown {
        seq,
        role: m.role.as_str(),
        cut: cut_of(m, &text),
        text,
        parts,
        source: m.source().filter(|s| *s != usual),
        name: m.name(),
        timestamp: m.timestamp,
        turn_id: m.turn_id,
        failure,
        tool_calls: m
            .tool_calls()
            .map(|calls| calls.iter().filter_map(call).collect())
            .unwrap_or_default(),
        tool_call_id: m.tool_call_id(),
    }
}

fn cut_of<'a>(m: &'a Message, heard: &str) -> Option<Cut<'a>> {
    if !int::is_interrupted(m) {
        return None;
    }
    let (unheard, original) = match m.meta_str(int::ORIGINAL) {
        None => (String::new(), None),
        Some(original) => match original.strip_prefix(heard) {
            Some(rest) => (rest.to_owned(), None),
            None => (String::new(), Some(original)),
        },
    };
    let md = m.metadata.as_ref();
    Some(Cut {
        unheard,
        original,
        at_ms: md
            .and_then(|md| md.get(int::INTERRUPT_TIMESTAMP))
            .and_then(Value::as_i64),
        by: m.meta_str(int::CUT_BY),
        complete: md
            .and_then(|md| md.get(int::ORIGINAL_COMPLETE))
            .and_then(Value::as_bool)
            .unwrap_or(true),
        error: m.meta_str(int::ERROR),
    })
}

/// A content value's text parts joined, and a label for each other part.
pub fn text_of(content: &Value) -> (String, Vec<String>) {
    match content {
        Value::Null => (String::new(), Vec::new()),
        Value::String(s) => (s.clone(), Vec::new()),
        Value::Array(parts) => {
            let mut text = String::new();
            let mut other = Vec::new();
            for p in parts {
                let kind = p.get("type").and_then(Value::as_str).unwrap_or("part");
                match p.get("text").and_then(Value::as_str) {
                    Some(t) => {
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(t);
                    }
                    None => other.push(format!("[{kind}]")),
                }
            }
            (text, other)
        }
        other => (other.to_string(), Vec::new()),
    }
}

fn call(v: &Value) -> Option<Call<'_>> {
    let f = v.get("function")?;
    Some(Call {
        id: v.get("id").and_then(Value::as_str),
        name: f.get("name").and_then(Value::as_str).unwrap_or("?"),
        arguments: f.get("arguments").and_then(Value::as_str).unwrap_or(""),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::message::Role;
    use serde_json::json;

    fn msg(v: Value) -> Arc<Message> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    #[test]
    fn a_cut_reply_shows_what_was_heard_and_the_rest_of_the_original() {
        let m = msg(json!({"role": "assistant", "content": "Hello the",
            "metadata": {"interrupted": true, "interrupt_timestamp": 5, "original": "Hello there, friend",
                         "original_complete": false, "cut_by": "endpoint"}}));
        let s = shown(3, &m);
        assert_eq!(s.text, "Hello the");
        let cut = s.cut.unwrap();
        assert_eq!(cut.unheard, "re, friend");
        assert_eq!(cut.original, None);
        assert_eq!(cut.at_ms, Some(5));
        assert_eq!(cut.by, Some("endpoint"));
        assert!(!cut.complete);
    }

    #[test]
    fn a_heard_text_the_original_does_not_begin_with_shows_the_original_whole() {
        let m = msg(json!({"role": "assistant", "content": "Hi",
            "metadata": {"interrupted": true, "original": "Hello there"}}));
        let cut = shown(0, &m).cut.unwrap();
        assert_eq!(cut.unheard, "");
        assert_eq!(cut.original, Some("Hello there"));
    }

    #[test]
    fn replaced_messages_group_by_why_and_the_window_start_is_placed() {
        let h = vec![
            msg(json!({"role": "user", "content": "a"})),
            msg(
                json!({"role": "assistant", "content": "b", "metadata": {"superseded": true, "superseded_by": "regenerate"}}),
            ),
            msg(
                json!({"role": "assistant", "content": "c", "metadata": {"superseded": true, "superseded_by": "regenerate"}}),
            ),
            msg(
                json!({"role": "user", "content": "d", "metadata": {"superseded": true, "superseded_by": "edit"}}),
            ),
            msg(json!({"role": "assistant", "content": "e"})),
        ];
        let e = entries(&h, 10, 14);
        assert_eq!(e.len(), 5);
        assert!(
            matches!(&e[1], Entry::Replaced { why: "regenerated", messages } if messages.len() == 2)
        );
        assert!(
            matches!(&e[2], Entry::Replaced { why: "edited", messages } if messages[0].seq == 13)
        );
        assert_eq!(e[3], Entry::WindowStart);
        assert!(matches!(&e[4], Entry::Message(s) if s.seq == 14 && s.text == "e"));
        // A window start before the first message, and one past the end.
        assert_eq!(entries(&h, 10, 10)[0], Entry::WindowStart);
        assert!(!entries(&h, 10, 15).contains(&Entry::WindowStart));
    }

    #[test]
    fn tool_calls_parts_sources_and_failures_are_read_out() {
        let call = msg(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Hanoi\"}"}}]}));
        let s = shown(0, &call);
        assert_eq!(
            s.tool_calls,
            vec![Call {
                id: Some("c1"),
                name: "weather",
                arguments: "{\"city\":\"Hanoi\"}"
            }]
        );
        assert_eq!(s.text, "");
        let result = msg(json!({"role": "tool", "tool_call_id": "c1", "content": "31 C"}));
        assert_eq!(shown(1, &result).tool_call_id, Some("c1"));
        let parts = msg(
            json!({"role": "user", "metadata": {"source": "asr"}, "content": [
            {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}}]}),
        );
        let s = shown(2, &parts);
        assert_eq!(
            (s.text.as_str(), s.parts.clone(), s.source),
            ("look", vec!["[image_url]".to_owned()], Some("asr"))
        );
        let plain = msg(json!({"role": "user", "content": "x", "metadata": {"source": "message"}}));
        assert_eq!(shown(3, &plain).source, None);
        let failed = crate::memory::interruption::failure_reply("Sorry.", "upstream_timeout");
        let s = shown(4, &failed);
        assert_eq!(s.failure, Some("upstream_timeout"));
        assert_eq!(s.source, Some("llm_failure"));
        assert_eq!(Message::new(Role::User, "x").role, Role::User);
    }
}
