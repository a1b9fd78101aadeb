//! A chat completion as a Response object. Pure: the ids and
//! the request's echoed fields come in, the Response goes out.

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::completion::Completion;
use super::ids;
use super::usage::Usage;
use crate::json;

/// What a Response says besides its output: its id and when, and what
/// the request asked for that the Response echoes.
#[derive(Debug, Clone, Default)]
pub struct Echo {
    /// `resp_...`
    pub id: String,
    /// What its output items' ids start with (`ids::items_base`: the
    /// reply's message), so they are the ids the conversation shows.
    pub items: String,
    /// Seconds.
    pub created_at: i64,
    pub previous_response_id: Option<String>,
    pub conversation: Option<String>,
    pub instructions: Option<String>,
    pub metadata: Option<Value>,
    pub store: bool,
    /// The request's fields a Response repeats (`tools`, `temperature`,
    /// ...), as the request gave them.
    pub fields: Map<String, Value>,
}

/// The request fields a Response repeats as they were sent.
pub const ECHOED: &[&str] = &[
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "text",
    "max_output_tokens",
    "truncation",
    "reasoning",
    "user",
];

/// A Response's output item, as the non-streaming answer writes it.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Output<'a> {
    Message {
        id: String,
        status: &'static str,
        role: &'static str,
        content: Vec<Part<'a>>,
    },
    FunctionCall {
        id: String,
        status: &'static str,
        call_id: Value,
        name: Value,
        arguments: Value,
    },
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part<'a> {
    OutputText {
        text: &'a RawValue,
        annotations: [(); 0],
    },
    Refusal {
        refusal: &'a RawValue,
    },
}

/// A raw JSON string with some text in it.
fn text(raw: Option<&RawValue>) -> Option<&RawValue> {
    raw.filter(|r| r.get().starts_with('"') && r.get() != "\"\"")
}

/// The Response for a chat completion (its choice 0), to be written
/// straight out.
pub fn of_completion<'a>(
    completion: &Completion<'a>,
    echo: &'a Echo,
) -> Written<'a, Option<&'a RawValue>, Vec<Output<'a>>> {
    let message = &completion.message;
    let mut output = Vec::new();
    let mut content = Vec::new();
    if let Some(text) = text(message.content) {
        content.push(Part::OutputText {
            text,
            annotations: [],
        });
    }
    if let Some(refusal) = text(message.refusal) {
        content.push(Part::Refusal { refusal });
    }
    if !content.is_empty() {
        output.push(Output::Message {
            id: ids::item("msg", &echo.items, 0),
            status: "completed",
            role: "assistant",
            content,
        });
    }
    let calls = match message.tool_calls.map(|r| serde_json::from_str(r.get())) {
        Some(Ok(Value::Array(calls))) => calls,
        _ => Vec::new(),
    };
    for (n, mut call) in calls.into_iter().enumerate() {
        // By pointer: indexing a call that is not an object would panic.
        let mut take = |at: &str| call.pointer_mut(at).map(Value::take).unwrap_or_default();
        output.push(Output::FunctionCall {
            id: ids::item("fc", &echo.items, n),
            status: "completed",
            call_id: take("/id"),
            name: take("/function/name"),
            arguments: take("/function/arguments"),
        });
    }
    let (status, incomplete) = match completion.finish_reason.map(RawValue::get) {
        Some("\"length\"") => ("incomplete", json!({"reason": "max_output_tokens"})),
        Some("\"content_filter\"") => ("incomplete", json!({"reason": "content_filter"})),
        _ => ("completed", Value::Null),
    };
    Written {
        echo,
        model: completion.model,
        status,
        incomplete,
        error: Value::Null,
        output,
        usage: completion.usage,
    }
}

/// A Response as it is written: the echo and what the reply gave. Written
/// field by field, where a `Value` tree cost a map of two dozen entries
/// (most of them the echo's defaults) per response, and on a stream two
/// such trees to open it and one to end it.
pub struct Written<'a, M, O> {
    pub echo: &'a Echo,
    pub model: M,
    pub status: &'a str,
    pub incomplete: Value,
    pub error: Value,
    pub output: O,
    pub usage: Option<Usage>,
}

impl<M: Serialize, O: Serialize> Written<'_, M, O> {
    /// Appends the Response as JSON, written by hand: through serde it
    /// cost fifty-odd short strings (its keys, the echo's defaults) each
    /// escaped a byte at a time, a fifth of a Response turn's own work.
    /// Keys and fixed values go out as the bytes they are.
    pub fn write(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        let e = self.echo;
        out.extend_from_slice(b"{\"id\":");
        json::string(out, &e.id);
        out.extend_from_slice(b",\"object\":\"response\",\"created_at\":");
        json::value(out, &e.created_at)?;
        field(out, "status");
        json::string(out, self.status);
        field(out, "error");
        json::json(out, &self.error)?;
        field(out, "incomplete_details");
        json::json(out, &self.incomplete)?;
        field(out, "model");
        json::value(out, &self.model)?;
        field(out, "output");
        json::value(out, &self.output)?;
        field(out, "usage");
        match &self.usage {
            Some(u) => u.write(out),
            None => out.extend_from_slice(b"null"),
        }
        field(out, "previous_response_id");
        optional(out, e.previous_response_id.as_deref());
        field(out, "conversation");
        match e.conversation.as_deref() {
            Some(id) => {
                out.extend_from_slice(b"{\"id\":");
                json::string(out, id);
                out.push(b'}');
            }
            None => out.extend_from_slice(b"null"),
        }
        field(out, "instructions");
        optional(out, e.instructions.as_deref());
        field(out, "metadata");
        match &e.metadata {
            Some(md) => json::json(out, md)?,
            None => out.extend_from_slice(b"{}"),
        }
        field(out, "store");
        out.extend_from_slice(if e.store { b"true" } else { b"false" });
        for key in ECHOED {
            field(out, key);
            match e.fields.get(*key) {
                Some(v) => json::json(out, v)?,
                None => out.extend_from_slice(default_of(key)),
            }
        }
        out.push(b'}');
        Ok(())
    }
}

/// `,"key":` for a key of ours, which has nothing to escape.
fn field(out: &mut Vec<u8>, key: &str) {
    out.extend_from_slice(b",\"");
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
}

fn optional(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => json::string(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

/// What OpenAI's Response says for a field the request left out.
fn default_of(key: &str) -> &'static [u8] {
    match key {
        "tools" => b"[]",
        "tool_choice" => b"\"auto\"",
        "parallel_tool_calls" => b"true",
        "text" => br#"{"format":{"type":"text"}}"#,
        "truncation" => b"\"disabled\"",
        "temperature" | "top_p" => b"1.0",
        _ => b"null",
    }
}
