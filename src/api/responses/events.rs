//! A chat completion's chunks as the Responses API's event stream, as
//! they arrive: each chunk gives the events it completes, none held back,
//! written as SSE (`event:` its type, `data:` its JSON; the stream has no
//! `[DONE]`). Pure.
//!
//! The order the official SDKs' stream helpers expect: `response.created`,
//! `response.in_progress`; per output item `response.output_item.added`,
//! then for a message `response.content_part.added`, the
//! `response.output_text.delta`s, `response.output_text.done`,
//! `response.content_part.done`, and for a function call the
//! `response.function_call_arguments.delta`s and `.done`; then
//! `response.output_item.done`; last `response.completed`, or
//! `response.incomplete` / `response.failed` with the reason. Every event
//! has a `sequence_number`, from 0.
//!
//! A delta, which every streamed token makes, is written from a typed
//! struct that borrows its text (the chunk was parsed once, typed, by
//! `accumulate::Event`); so are the events that carry the whole Response
//! (`response::Written`), which open and end every stream; the other rare
//! events are built as JSON values.

use std::io::Write;

use serde::Serialize;
use serde_json::{json, Value};

use super::ids;
use super::response::{usage, Echo, Usage, Written};
use crate::proxy::accumulate::Delta;

/// The stream of one response.
pub struct Events {
    echo: Echo,
    model: Value,
    next_seq: u64,
    /// Output items in the order they were opened.
    items: Vec<Item>,
    /// The open message, by its index in `items`.
    text: Option<usize>,
    /// Function calls by the chat chunk's `index`, as indexes in `items`.
    calls: Vec<(u64, usize)>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
}

enum Item {
    Message {
        id: String,
        /// Its content parts in the order they began: text, or a refusal.
        parts: Vec<Part>,
        open: bool,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        open: bool,
    },
}

struct Part {
    refusal: bool,
    text: String,
}

impl Part {
    fn json(&self) -> Value {
        if self.refusal {
            json!({"type": "refusal", "refusal": self.text})
        } else {
            output_text(&self.text)
        }
    }

    fn empty(&self) -> Value {
        Part {
            refusal: self.refusal,
            text: String::new(),
        }
        .json()
    }
}

impl Item {
    fn json(&self) -> Value {
        match self {
            Item::Message { id, parts, open } => json!({
                "type": "message", "id": id, "role": "assistant",
                "status": if *open { "in_progress" } else { "completed" },
                "content": if *open { json!([]) } else {
                    Value::Array(parts.iter().map(Part::json).collect())
                },
            }),
            Item::Call {
                id,
                call_id,
                name,
                arguments,
                open,
            } => json!({
                "type": "function_call", "id": id, "call_id": call_id, "name": name,
                "arguments": if *open { "" } else { arguments.as_str() },
                "status": if *open { "in_progress" } else { "completed" },
            }),
        }
    }
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": []})
}

/// `response.output_text.delta` (or `response.refusal.delta`), field for
/// field.
#[derive(Serialize)]
struct TextDelta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    item_id: &'a str,
    output_index: usize,
    content_index: u32,
    delta: &'a str,
    /// Text deltas have it; refusal deltas do not.
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<[(); 0]>,
    sequence_number: u64,
}

/// `response.function_call_arguments.delta`.
#[derive(Serialize)]
struct ArgumentsDelta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    item_id: &'a str,
    output_index: usize,
    delta: &'a str,
    sequence_number: u64,
}

/// Writes one event as SSE. (Writing to a `Vec` cannot fail, nor can
/// serialising strings, numbers and JSON values.)
fn write_sse(out: &mut Vec<u8>, kind: &str, data: &impl Serialize) {
    let _ = write!(out, "event: {kind}\ndata: ");
    let _ = serde_json::to_writer(&mut *out, data);
    out.extend_from_slice(b"\n\n");
}

impl Events {
    pub fn new(echo: Echo, model: &str) -> Self {
        Self {
            echo,
            model: Value::String(model.to_owned()),
            next_seq: 0,
            items: Vec::new(),
            text: None,
            calls: Vec::new(),
            finish_reason: None,
            usage: None,
        }
    }

    fn seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq - 1
    }

    /// A rare event, built as JSON.
    fn event(&mut self, out: &mut Vec<u8>, kind: &str, mut fields: Value) {
        fields["type"] = json!(kind);
        fields["sequence_number"] = json!(self.seq());
        write_sse(out, kind, &fields);
    }

    /// An event that carries the Response as it stands.
    fn response_event(
        &mut self,
        out: &mut Vec<u8>,
        kind: &str,
        status: &str,
        incomplete: Value,
        error: Value,
    ) {
        #[derive(Serialize)]
        struct WithResponse<'a, R> {
            #[serde(rename = "type")]
            kind: &'a str,
            response: R,
            sequence_number: u64,
        }
        let sequence_number = self.seq();
        let response = Written {
            echo: &self.echo,
            model: &self.model,
            status,
            incomplete,
            error,
            output: self.items.iter().map(Item::json).collect::<Vec<_>>(),
            usage: self.usage,
        };
        let event = WithResponse {
            kind,
            response,
            sequence_number,
        };
        write_sse(out, kind, &event);
    }

    /// The upstream said how its reply finished (`finish_reason`).
    pub fn finished(&self) -> bool {
        self.finish_reason.is_some()
    }

    /// The events that open the stream.
    pub fn start(&mut self, out: &mut Vec<u8>) {
        for kind in ["response.created", "response.in_progress"] {
            self.response_event(out, kind, "in_progress", Value::Null, Value::Null);
        }
    }

    /// The events one `chat.completion.chunk` completes.
    pub fn chunk(&mut self, delta: &Delta, out: &mut Vec<u8>) {
        if let Some(u) = delta.usage() {
            self.usage = usage(u);
        }
        if let Some(text) = delta.content().filter(|t| !t.is_empty()) {
            self.text_delta(text, false, out);
        }
        if let Some(text) = delta.refusal().filter(|t| !t.is_empty()) {
            self.text_delta(text, true, out);
        }
        for (index, id, name, arguments) in delta.calls() {
            self.call_delta(index, id, name, arguments, out);
        }
        if let Some(reason) = delta.finish_reason() {
            self.finish_reason = Some(reason.unwrap_or("stop").to_owned());
        }
    }

    /// A piece of the reply's text, or of its refusal.
    fn text_delta(&mut self, text: &str, refusal: bool, out: &mut Vec<u8>) {
        let at = match self.text {
            Some(at) => at,
            None => {
                let at = self.items.len();
                // A message after calls is another item, with an id of its own.
                let n = self
                    .items
                    .iter()
                    .filter(|i| matches!(i, Item::Message { .. }))
                    .count();
                self.items.push(Item::Message {
                    id: ids::item("msg", &self.echo.items, n),
                    parts: Vec::new(),
                    open: true,
                });
                self.text = Some(at);
                let item = self.items[at].json();
                self.event(
                    out,
                    "response.output_item.added",
                    json!({"output_index": at, "item": item}),
                );
                at
            }
        };
        let Item::Message { id, parts, .. } = &mut self.items[at] else {
            return;
        };
        let id = id.clone();
        let part = match parts.iter().position(|p| p.refusal == refusal) {
            Some(part) => part,
            None => {
                parts.push(Part {
                    refusal,
                    text: String::new(),
                });
                let part = parts.len() - 1;
                let empty = parts[part].empty();
                self.event(
                    out,
                    "response.content_part.added",
                    json!({"item_id": id, "output_index": at, "content_index": part,
                           "part": empty}),
                );
                part
            }
        };
        let sequence_number = self.seq();
        if let Item::Message { parts, .. } = &mut self.items[at] {
            parts[part].text.push_str(text);
        }
        let kind = if refusal {
            "response.refusal.delta"
        } else {
            "response.output_text.delta"
        };
        let event = TextDelta {
            kind,
            item_id: &id,
            output_index: at,
            content_index: part as u32,
            delta: text,
            logprobs: (!refusal).then_some([]),
            sequence_number,
        };
        write_sse(out, kind, &event);
    }

    fn call_delta(
        &mut self,
        index: u64,
        call_id: Option<&str>,
        name: Option<&str>,
        arguments: Option<&str>,
        out: &mut Vec<u8>,
    ) {
        let at = match self.calls.iter().find(|(i, _)| *i == index) {
            Some(&(_, at)) => at,
            None => {
                // A message is done once the calls begin.
                self.close_text(out);
                let at = self.items.len();
                self.items.push(Item::Call {
                    id: ids::item("fc", &self.echo.items, self.calls.len()),
                    call_id: call_id.unwrap_or_default().to_owned(),
                    name: name.unwrap_or_default().to_owned(),
                    arguments: String::new(),
                    open: true,
                });
                self.calls.push((index, at));
                let item = self.items[at].json();
                self.event(
                    out,
                    "response.output_item.added",
                    json!({"output_index": at, "item": item}),
                );
                at
            }
        };
        let Some(piece) = arguments.filter(|p| !p.is_empty()) else {
            return;
        };
        let sequence_number = self.seq();
        if let Item::Call { arguments, id, .. } = &mut self.items[at] {
            arguments.push_str(piece);
            let kind = "response.function_call_arguments.delta";
            let event = ArgumentsDelta {
                kind,
                item_id: id,
                output_index: at,
                delta: piece,
                sequence_number,
            };
            write_sse(out, kind, &event);
        }
    }

    fn close_text(&mut self, out: &mut Vec<u8>) {
        let Some(at) = self.text.take() else {
            return;
        };
        let (id, parts) = match &mut self.items[at] {
            Item::Message { id, parts, open } => {
                *open = false;
                let parts: Vec<(bool, String)> =
                    parts.iter().map(|p| (p.refusal, p.text.clone())).collect();
                (id.clone(), parts)
            }
            Item::Call { .. } => return,
        };
        for (n, (refusal, text)) in parts.into_iter().enumerate() {
            let part = Part { refusal, text };
            if refusal {
                self.event(
                    out,
                    "response.refusal.done",
                    json!({"item_id": id, "output_index": at, "content_index": n,
                           "refusal": part.text}),
                );
            } else {
                self.event(
                    out,
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": at, "content_index": n,
                           "text": part.text, "logprobs": []}),
                );
            }
            self.event(
                out,
                "response.content_part.done",
                json!({"item_id": id, "output_index": at, "content_index": n,
                       "part": part.json()}),
            );
        }
        let item = self.items[at].json();
        self.event(
            out,
            "response.output_item.done",
            json!({"output_index": at, "item": item}),
        );
    }

    fn close_all(&mut self, out: &mut Vec<u8>) {
        self.close_text(out);
        for (_, at) in std::mem::take(&mut self.calls) {
            let (id, name, arguments) = match &mut self.items[at] {
                Item::Call {
                    id,
                    name,
                    arguments,
                    open,
                    ..
                } => {
                    *open = false;
                    (id.clone(), name.clone(), arguments.clone())
                }
                Item::Message { .. } => continue,
            };
            self.event(
                out,
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": at, "name": name, "arguments": arguments}),
            );
            let item = self.items[at].json();
            self.event(
                out,
                "response.output_item.done",
                json!({"output_index": at, "item": item}),
            );
        }
    }

    /// The events that end a stream the upstream ended: open items closed,
    /// then `response.completed`, or `response.incomplete` when the
    /// upstream stopped at its token limit or a content filter.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        self.close_all(out);
        let (kind, status, incomplete) = match self.finish_reason.as_deref() {
            Some("length") => (
                "response.incomplete",
                "incomplete",
                json!({"reason": "max_output_tokens"}),
            ),
            Some("content_filter") => (
                "response.incomplete",
                "incomplete",
                json!({"reason": "content_filter"}),
            ),
            _ => ("response.completed", "completed", Value::Null),
        };
        self.response_event(out, kind, status, incomplete, Value::Null);
    }

    /// The events that end a stream cut short: by the client, a newer
    /// request or the interrupt endpoint (`reason` "interrupted").
    pub fn incomplete(&mut self, reason: &str, out: &mut Vec<u8>) {
        self.close_all(out);
        let incomplete = json!({"reason": reason});
        self.response_event(
            out,
            "response.incomplete",
            "incomplete",
            incomplete,
            Value::Null,
        );
    }

    /// The event that ends a stream the upstream failed.
    pub fn failed(&mut self, code: &str, message: &str, out: &mut Vec<u8>) {
        let error = json!({"code": code, "message": message});
        self.response_event(out, "response.failed", "failed", Value::Null, error);
    }
}
