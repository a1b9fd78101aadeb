//! A chat completion as a Response object (issue 17). Pure: the ids and
//! the request's echoed fields come in, the Response goes out.

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::{json, Map, Value};

use super::ids;

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

/// The Response for a chat completion (its first choice).
pub fn from_completion(completion: &Value, echo: &Echo) -> Value {
    serde_json::to_value(of_completion(completion, echo)).unwrap_or_default()
}

/// `from_completion`, to be written straight out.
pub fn of_completion<'a>(completion: &'a Value, echo: &'a Echo) -> Written<'a, Vec<Value>> {
    let choice = &completion["choices"][0];
    let message = &choice["message"];
    let mut output = Vec::new();
    let mut content = Vec::new();
    if let Some(text) = message["content"].as_str().filter(|t| !t.is_empty()) {
        content.push(json!({"type": "output_text", "text": text, "annotations": []}));
    }
    if let Some(refusal) = message["refusal"].as_str().filter(|t| !t.is_empty()) {
        content.push(json!({"type": "refusal", "refusal": refusal}));
    }
    if !content.is_empty() {
        output.push(json!({
            "type": "message", "id": ids::item("msg", &echo.items, 0), "status": "completed",
            "role": "assistant", "content": content,
        }));
    }
    for (n, call) in message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        output.push(json!({
            "type": "function_call", "id": ids::item("fc", &echo.items, n), "status": "completed",
            "call_id": call["id"], "name": call["function"]["name"],
            "arguments": call["function"]["arguments"],
        }));
    }
    let (status, incomplete) = match choice["finish_reason"].as_str() {
        Some("length") => ("incomplete", json!({"reason": "max_output_tokens"})),
        Some("content_filter") => ("incomplete", json!({"reason": "content_filter"})),
        _ => ("completed", Value::Null),
    };
    Written {
        echo,
        model: &completion["model"],
        status,
        incomplete,
        error: Value::Null,
        output,
        usage: usage(&completion["usage"]),
    }
}

/// A Response as it is written: the echo and what the reply gave. Written
/// field by field, where a `Value` tree cost a map of two dozen entries
/// (most of them the echo's defaults) per response, and on a stream two
/// such trees to open it and one to end it.
pub struct Written<'a, O> {
    pub echo: &'a Echo,
    pub model: &'a Value,
    pub status: &'a str,
    pub incomplete: Value,
    pub error: Value,
    pub output: O,
    pub usage: Value,
}

impl<O: Serialize> Serialize for Written<'_, O> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let e = self.echo;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("id", &e.id)?;
        m.serialize_entry("object", "response")?;
        m.serialize_entry("created_at", &e.created_at)?;
        m.serialize_entry("status", self.status)?;
        m.serialize_entry("error", &self.error)?;
        m.serialize_entry("incomplete_details", &self.incomplete)?;
        m.serialize_entry("model", self.model)?;
        m.serialize_entry("output", &self.output)?;
        m.serialize_entry("usage", &self.usage)?;
        m.serialize_entry("previous_response_id", &e.previous_response_id)?;
        let conversation = e.conversation.as_deref().map(|id| Id { id });
        m.serialize_entry("conversation", &conversation)?;
        m.serialize_entry("instructions", &e.instructions)?;
        match &e.metadata {
            Some(md) => m.serialize_entry("metadata", md)?,
            None => m.serialize_entry("metadata", &Map::new())?,
        }
        m.serialize_entry("store", &e.store)?;
        for key in ECHOED {
            match e.fields.get(*key) {
                Some(v) => m.serialize_entry(key, v)?,
                None => m.serialize_entry(key, &DefaultOf(key))?,
            }
        }
        m.end()
    }
}

#[derive(Serialize)]
struct Id<'a> {
    id: &'a str,
}

/// What OpenAI's Response says for a field the request left out.
struct DefaultOf<'a>(&'a str);

impl Serialize for DefaultOf<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Format {
            #[serde(rename = "type")]
            kind: &'static str,
        }
        #[derive(Serialize)]
        struct Text {
            format: Format,
        }
        match self.0 {
            "tools" => s.collect_seq(std::iter::empty::<()>()),
            "tool_choice" => s.serialize_str("auto"),
            "parallel_tool_calls" => s.serialize_bool(true),
            "text" => Text {
                format: Format { kind: "text" },
            }
            .serialize(s),
            "truncation" => s.serialize_str("disabled"),
            "temperature" | "top_p" => s.serialize_f64(1.0),
            _ => s.serialize_unit(),
        }
    }
}

/// Chat's usage in the Responses API's words (`null` when the upstream
/// gave none).
pub fn usage(chat: &Value) -> Value {
    if !chat.is_object() {
        return Value::Null;
    }
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    json!({
        "input_tokens": n(&chat["prompt_tokens"]),
        "input_tokens_details": {"cached_tokens": n(&chat["prompt_tokens_details"]["cached_tokens"])},
        "output_tokens": n(&chat["completion_tokens"]),
        "output_tokens_details": {
            "reasoning_tokens": n(&chat["completion_tokens_details"]["reasoning_tokens"])
        },
        "total_tokens": n(&chat["total_tokens"]),
    })
}
