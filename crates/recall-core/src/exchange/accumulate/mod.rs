//! Rebuilding the assistant message from what the upstream sent: the deltas
//! of a streamed reply, or the body of a non-streaming one.
//!
//! Only choice 0 is remembered when `n > 1`. Chunks without choices (the
//! usage chunk of `stream_options.include_usage`) are fine.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Deserialize;

use serde_json::{Map, Value};

use crate::memory::message::{Message, Role};

#[derive(Debug, Default, Clone)]
pub struct ReplyAccumulator {
    content: String,
    refusal: String,
    tool_calls: BTreeMap<u64, ToolCall>,
    function_call: Option<ToolFunction>,
    /// The stream's terminator, `data: [DONE]`, has been seen.
    pub done: bool,
    /// Some choice-0 chunk carried a `finish_reason`.
    pub finished: bool,
    /// Choice 0's `finish_reason`, once it has come.
    pub finish_reason: Option<String>,
    /// An `error` object the upstream sent inside the stream.
    pub error: Option<String>,
    /// Data lines that were not JSON.
    pub malformed: usize,
}

#[derive(Debug, Default, Clone)]
struct ToolCall {
    id: Option<String>,
    kind: Option<String>,
    function: ToolFunction,
}

#[derive(Debug, Default, Clone)]
struct ToolFunction {
    name: String,
    arguments: String,
}

/// The `data` of one SSE event, parsed once and then applied to as many
/// accumulators as need it (what arrived, what went out).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Done,
    Chunk(Delta),
    Malformed,
}

impl Event {
    /// Whether it adds anything the user would see or a tool would run.
    pub fn carries_content(&self) -> bool {
        match self {
            Event::Chunk(d) => {
                d.content.as_deref().is_some_and(|c| !c.is_empty())
                    || d.refusal.as_deref().is_some_and(|c| !c.is_empty())
                    || !d.tool_calls.is_empty()
                    || d.function_call.is_some()
            }
            Event::Done | Event::Malformed => false,
        }
    }
}

/// What a chunk adds to choice 0, and any error it carries: all that is
/// kept of it. Parsed into typed fields (borrowing the text where it can),
/// not into a JSON tree, since every streamed token goes through here.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Delta {
    content: Option<String>,
    refusal: Option<String>,
    tool_calls: Vec<(u64, ToolCallDe<'static>)>,
    function_call: Option<FunctionDe<'static>>,
    /// `Some` once choice 0 has a non-null `finish_reason`.
    finish_reason: Option<Option<String>>,
    /// Boxed: a chunk rarely has one.
    error: Option<Box<ChunkError>>,
    /// The chunk's `usage` (with `stream_options.include_usage`, the last).
    usage: Option<Value>,
}

/// The `error` object of a chunk: its message (or the whole object, when
/// it has none) and its `code`, when that is a string.
#[derive(Debug, Clone, PartialEq)]
struct ChunkError {
    message: String,
    code: Option<String>,
}

impl ChunkError {
    fn of(err: &Value) -> Box<Self> {
        let text = |k: &str| err.get(k).and_then(Value::as_str).map(str::to_owned);
        Box::new(Self {
            message: text("message").unwrap_or_else(|| err.to_string()),
            code: text("code"),
        })
    }
}

#[derive(Deserialize)]
struct ChunkDe<'a> {
    #[serde(default, borrow)]
    choices: Vec<ChoiceDe<'a>>,
    #[serde(default)]
    error: Option<Value>,
    #[serde(default)]
    usage: Option<Value>,
}

#[derive(Deserialize)]
struct ChoiceDe<'a> {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default, borrow)]
    delta: Option<DeltaDe<'a>>,
    #[serde(default)]
    finish_reason: Option<Value>,
}

#[derive(Deserialize)]
struct DeltaDe<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    refusal: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tool_calls: Option<Vec<ToolCallDe<'a>>>,
    #[serde(default, borrow)]
    function_call: Option<FunctionDe<'a>>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
struct ToolCallDe<'a> {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    function: Option<FunctionDe<'a>>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
struct FunctionDe<'a> {
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    arguments: Option<Cow<'a, str>>,
}

fn owned(c: Option<Cow<'_, str>>) -> Option<Cow<'static, str>> {
    c.map(|c| Cow::Owned(c.into_owned()))
}

impl FunctionDe<'_> {
    fn into_owned(self) -> FunctionDe<'static> {
        FunctionDe {
            name: owned(self.name),
            arguments: owned(self.arguments),
        }
    }
}

/// What the Responses API's stream reads of a chunk.
impl Delta {
    pub fn content(&self) -> Option<&str> {
        self.content.as_deref()
    }

    pub fn refusal(&self) -> Option<&str> {
        self.refusal.as_deref()
    }

    /// `Some` when choice 0 finished, with its reason if it gave one.
    pub fn finish_reason(&self) -> Option<Option<&str>> {
        self.finish_reason.as_ref().map(Option::as_deref)
    }

    pub fn error(&self) -> Option<&str> {
        self.error.as_ref().map(|e| e.message.as_str())
    }

    pub fn error_code(&self) -> Option<&str> {
        self.error.as_ref()?.code.as_deref()
    }

    pub fn usage(&self) -> Option<&Value> {
        self.usage.as_ref()
    }

    /// The tool calls' pieces: (index, id, name, arguments).
    pub fn calls(&self) -> impl Iterator<Item = (u64, Option<&str>, Option<&str>, Option<&str>)> {
        self.tool_calls.iter().map(|(i, c)| {
            let f = c.function.as_ref();
            (
                *i,
                c.id.as_deref(),
                f.and_then(|f| f.name.as_deref()),
                f.and_then(|f| f.arguments.as_deref()),
            )
        })
    }
}

impl Delta {
    /// The slow, lenient reading of a chunk whose shape the typed one
    /// refused: every field that has the expected type is kept.
    fn from_value(chunk: &Value) -> Self {
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
        let function = |f: Option<&Value>| {
            f.map(|f| FunctionDe {
                name: text(f.get("name")).map(Cow::Owned),
                arguments: text(f.get("arguments")).map(Cow::Owned),
            })
        };
        let mut delta = Delta {
            error: chunk.get("error").map(ChunkError::of),
            usage: chunk.get("usage").filter(|u| u.is_object()).cloned(),
            ..Delta::default()
        };
        let Some(choice) = first_choice(chunk) else {
            return delta;
        };
        if let Some(reason) = choice.get("finish_reason").filter(|r| !r.is_null()) {
            delta.finish_reason = Some(reason.as_str().map(str::to_owned));
        }
        let Some(d) = choice.get("delta") else {
            return delta;
        };
        delta.content = text(d.get("content"));
        delta.refusal = text(d.get("refusal"));
        delta.function_call = function(d.get("function_call"));
        let calls = d.get("tool_calls").and_then(Value::as_array);
        for (position, call) in calls.into_iter().flatten().enumerate() {
            let index = call.get("index").and_then(Value::as_u64);
            let entry = ToolCallDe {
                index,
                id: text(call.get("id")).map(Cow::Owned),
                kind: text(call.get("type")).map(Cow::Owned),
                function: function(call.get("function")),
            };
            delta
                .tool_calls
                .push((index.unwrap_or(position as u64), entry));
        }
        delta
    }
}

impl Event {
    pub fn parse(data: &str) -> Self {
        let data = data.trim();
        if data == "[DONE]" {
            return Event::Done;
        }
        let Ok(chunk) = serde_json::from_str::<ChunkDe<'_>>(data) else {
            // An odd shape somewhere in the chunk: take what can be read.
            return serde_json::from_str::<Value>(data)
                .map_or(Event::Malformed, |v| Event::Chunk(Delta::from_value(&v)));
        };
        let mut delta = Delta {
            error: chunk.error.as_ref().map(ChunkError::of),
            usage: chunk.usage.filter(Value::is_object),
            ..Delta::default()
        };
        let has_index = chunk.choices.iter().any(|c| c.index.is_some());
        let choice = chunk
            .choices
            .into_iter()
            .enumerate()
            .find(|(i, c)| {
                if has_index {
                    c.index == Some(0)
                } else {
                    *i == 0
                }
            })
            .map(|(_, c)| c);
        if let Some(choice) = choice {
            if let Some(reason) = choice.finish_reason.filter(|r| !r.is_null()) {
                delta.finish_reason = Some(reason.as_str().map(str::to_owned));
            }
            if let Some(d) = choice.delta {
                delta.content = d.content.map(Cow::into_owned);
                delta.refusal = d.refusal.map(Cow::into_owned);
                delta.function_call = d.function_call.map(FunctionDe::into_owned);
                delta.tool_calls = d
                    .tool_calls
                    .unwrap_or_default()
                    .into_iter()
                    .enumerate()
                    .map(|(position, c)| {
                        let index = c.index.unwrap_or(position as u64);
                        let call = ToolCallDe {
                            index: c.index,
                            id: owned(c.id),
                            kind: owned(c.kind),
                            function: c.function.map(FunctionDe::into_owned),
                        };
                        (index, call)
                    })
                    .collect();
            }
        }
        Event::Chunk(delta)
    }
}

impl ReplyAccumulator {
    /// Takes the `data` of one SSE event.
    pub fn push_data(&mut self, data: &str) {
        self.push(&Event::parse(data));
    }

    pub fn push(&mut self, event: &Event) {
        match event {
            Event::Done => self.done = true,
            Event::Chunk(delta) => self.push_delta(delta),
            Event::Malformed => self.malformed += 1,
        }
    }

    /// The reply reached its end: `[DONE]`, or choice 0 finished.
    pub fn is_complete(&self) -> bool {
        self.done || self.finished
    }

    fn push_delta(&mut self, delta: &Delta) {
        if let Some(err) = delta.error() {
            self.error = Some(err.to_owned());
        }
        if let Some(reason) = &delta.finish_reason {
            self.finished = true;
            self.finish_reason = reason.clone();
        }
        if let Some(text) = &delta.content {
            self.content.push_str(text);
        }
        if let Some(text) = &delta.refusal {
            self.refusal.push_str(text);
        }
        if let Some(f) = &delta.function_call {
            self.function_call
                .get_or_insert_with(ToolFunction::default)
                .extend(f);
        }
        for (index, call) in &delta.tool_calls {
            let entry = self.tool_calls.entry(*index).or_default();
            if let Some(id) = &call.id {
                entry.id = Some(id.to_string());
            }
            if let Some(kind) = &call.kind {
                entry.kind = Some(kind.to_string());
            }
            if let Some(f) = &call.function {
                entry.function.extend(f);
            }
        }
    }

    /// The text received so far.
    pub fn content(&self) -> &str {
        &self.content
    }

    /// Whether anything worth remembering has arrived.
    pub fn is_empty(&self) -> bool {
        self.content.is_empty()
            && self.refusal.is_empty()
            && self.tool_calls.is_empty()
            && self.function_call.is_none()
    }

    /// The assistant message as it stands.
    pub fn to_message(&self) -> Message {
        let has_calls = !self.tool_calls.is_empty() || self.function_call.is_some();
        let content = if self.content.is_empty() && has_calls {
            Value::Null
        } else {
            Value::String(self.content.clone())
        };
        let mut m = Message::new(Role::Assistant, content);
        if !self.tool_calls.is_empty() {
            m.set_tool_calls(Some(
                self.tool_calls.values().map(ToolCall::to_value).collect(),
            ));
        }
        if let Some(f) = &self.function_call {
            m.set_extra("function_call", f.to_value());
        }
        if !self.refusal.is_empty() {
            m.set_extra("refusal", Value::String(self.refusal.clone()));
        }
        m
    }
}

impl ToolFunction {
    fn extend(&mut self, f: &FunctionDe<'_>) {
        if let Some(name) = &f.name {
            self.name.push_str(name);
        }
        if let Some(args) = &f.arguments {
            self.arguments.push_str(args);
        }
    }

    fn to_value(&self) -> Value {
        let mut f = Map::new();
        f.insert("name".into(), Value::String(self.name.clone()));
        f.insert("arguments".into(), Value::String(self.arguments.clone()));
        Value::Object(f)
    }
}

impl ToolCall {
    fn to_value(&self) -> Value {
        let mut c = Map::new();
        if let Some(id) = &self.id {
            c.insert("id".into(), Value::String(id.clone()));
        }
        let kind = self.kind.as_deref().unwrap_or("function");
        c.insert("type".into(), Value::String(kind.to_owned()));
        c.insert("function".into(), self.function.to_value());
        Value::Object(c)
    }
}

/// Choice 0 of a chunk: the one whose `index` is 0, or the
/// first one when the upstream leaves `index` out.
fn first_choice(body: &Value) -> Option<&Value> {
    let choices = body.get("choices")?.as_array()?;
    choices
        .iter()
        .find(|c| c.get("index").and_then(Value::as_u64) == Some(0))
        .or_else(|| choices.first().filter(|c| c.get("index").is_none()))
}

mod completion;
pub use completion::{completion_read, completion_reply, CompletionRead, Parts};

#[cfg(test)]
mod tests;
