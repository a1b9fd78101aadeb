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
//! Every event borrows what it shows: a text delta's text (the chunk was
//! parsed once, typed, by `accumulate::Event`), written by hand, as is the
//! whole Response (`response::Written`) that opens and ends every stream;
//! the other events from typed structs. Only the small
//! `incomplete_details` and `error` objects are built as JSON values.

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::{json, Value};

use super::ids;
use super::response::{Echo, Written};
use super::usage::{usage, Usage};
use crate::exchange::accumulate::Delta;
use crate::json;

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

/// A content part as written: `output_text` or `refusal`.
impl Serialize for Part {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        if self.refusal {
            m.serialize_entry("type", "refusal")?;
            m.serialize_entry("refusal", &self.text)?;
        } else {
            m.serialize_entry("type", "output_text")?;
            m.serialize_entry("text", &self.text)?;
            m.serialize_entry("annotations", &[(); 0])?;
        }
        m.end()
    }
}

/// An output item as it stands: an open one shows no content (a message)
/// or no arguments (a call) yet.
impl Serialize for Item {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let status = |open: bool| if open { "in_progress" } else { "completed" };
        let mut m = s.serialize_map(None)?;
        match self {
            Item::Message { id, parts, open } => {
                m.serialize_entry("type", "message")?;
                m.serialize_entry("id", id)?;
                m.serialize_entry("role", "assistant")?;
                m.serialize_entry("status", status(*open))?;
                let shown = if *open { &[][..] } else { &parts[..] };
                m.serialize_entry("content", shown)?;
            }
            Item::Call {
                id,
                call_id,
                name,
                arguments,
                open,
            } => {
                m.serialize_entry("type", "function_call")?;
                m.serialize_entry("id", id)?;
                m.serialize_entry("call_id", call_id)?;
                m.serialize_entry("name", name)?;
                let arguments = if *open { "" } else { arguments.as_str() };
                m.serialize_entry("arguments", arguments)?;
                m.serialize_entry("status", status(*open))?;
            }
        }
        m.end()
    }
}

/// An event: its type, what it says, its sequence number.
#[derive(Serialize)]
struct Ev<'a, F> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(flatten)]
    fields: F,
    sequence_number: u64,
}

/// `response.output_item.added` / `.done`.
#[derive(Serialize)]
struct ItemAt<'a> {
    output_index: usize,
    item: &'a Item,
}

/// The events about one content part of a message.
#[derive(Serialize)]
struct PartAt<'a, P> {
    item_id: &'a str,
    output_index: usize,
    content_index: usize,
    #[serde(flatten)]
    what: P,
}

impl<'a, P> PartAt<'a, P> {
    fn of(item_id: &'a str, output_index: usize, content_index: usize, what: P) -> Self {
        Self {
            item_id,
            output_index,
            content_index,
            what,
        }
    }
}

#[derive(Serialize)]
struct WithPart<'a> {
    part: &'a Part,
}

#[derive(Serialize)]
struct TextDone<'a> {
    text: &'a str,
    logprobs: [(); 0],
}

#[derive(Serialize)]
struct RefusalDone<'a> {
    refusal: &'a str,
}

/// `response.function_call_arguments.done`.
#[derive(Serialize)]
struct ArgumentsDone<'a> {
    item_id: &'a str,
    output_index: usize,
    name: &'a str,
    arguments: &'a str,
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

/// Writes one event as SSE, its data serialised. (Writing to a `Vec`
/// cannot fail, nor can serialising strings, numbers and JSON values.)
fn write_sse(out: &mut Vec<u8>, kind: &str, data: &impl Serialize) {
    frame(out, kind, |out| {
        let _ = serde_json::to_writer(out, data);
    });
}

/// One SSE event of type `kind`, its data written by `data`.
fn frame(out: &mut Vec<u8>, kind: &str, data: impl FnOnce(&mut Vec<u8>)) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    data(out);
    out.extend_from_slice(b"\n\n");
}

/// The next sequence number (a free function, so that it can be taken
/// while the items are borrowed).
fn next(seq: &mut u64) -> u64 {
    *seq += 1;
    *seq - 1
}

/// Writes an event with the next sequence number.
fn write_event(out: &mut Vec<u8>, next_seq: &mut u64, kind: &str, fields: impl Serialize) {
    let sequence_number = next(next_seq);
    let event = Ev {
        kind,
        fields,
        sequence_number,
    };
    write_sse(out, kind, &event);
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

    /// An event that carries the Response as it stands.
    fn response_event(
        &mut self,
        out: &mut Vec<u8>,
        kind: &str,
        status: &str,
        incomplete: Value,
        error: Value,
    ) {
        let response = Written {
            echo: &self.echo,
            model: &self.model,
            status,
            incomplete,
            error,
            output: &self.items,
            usage: self.usage,
        };
        // As `write_event` would write it, with the Response by hand.
        let sequence_number = next(&mut self.next_seq);
        frame(out, kind, |out| {
            let mut event = json::Object::open(out);
            json::string(event.key("type"), kind);
            let _ = response.write(event.key("response"));
            let _ = json::value(event.key("sequence_number"), &sequence_number);
            event.close();
        });
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

    /// The open message's index in `items`, opened (with its event) if
    /// none is.
    fn open_message(&mut self, out: &mut Vec<u8>) -> usize {
        if let Some(at) = self.text {
            return at;
        }
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
        let item = &self.items[at];
        let added = ItemAt {
            output_index: at,
            item,
        };
        write_event(out, &mut self.next_seq, "response.output_item.added", added);
        at
    }

    /// A piece of the reply's text, or of its refusal.
    fn text_delta(&mut self, text: &str, refusal: bool, out: &mut Vec<u8>) {
        let at = self.open_message(out);
        let Item::Message { id, parts, .. } = &mut self.items[at] else {
            return;
        };
        let part = match parts.iter().position(|p| p.refusal == refusal) {
            Some(part) => part,
            None => {
                parts.push(Part {
                    refusal,
                    text: String::new(),
                });
                let part = parts.len() - 1;
                let what = WithPart { part: &parts[part] };
                let added = PartAt::of(id, at, part, what);
                write_event(
                    out,
                    &mut self.next_seq,
                    "response.content_part.added",
                    added,
                );
                part
            }
        };
        parts[part].text.push_str(text);
        let kind = if refusal {
            "response.refusal.delta"
        } else {
            "response.output_text.delta"
        };
        // `response.output_text.delta` (or `response.refusal.delta`), by
        // hand: a stream writes one a chunk, and serde escaped each of its
        // keys a byte at a time.
        let sequence_number = next(&mut self.next_seq);
        frame(out, kind, |out| {
            out.extend_from_slice(b"{\"type\":\"");
            out.extend_from_slice(kind.as_bytes());
            out.extend_from_slice(b"\",\"item_id\":");
            json::string(out, id);
            out.extend_from_slice(b",\"output_index\":");
            let _ = json::value(out, &at);
            out.extend_from_slice(b",\"content_index\":");
            let _ = json::value(out, &part);
            out.extend_from_slice(b",\"delta\":");
            json::string(out, text);
            if !refusal {
                // Text deltas have it; refusal deltas do not.
                out.extend_from_slice(b",\"logprobs\":[]");
            }
            out.extend_from_slice(b",\"sequence_number\":");
            let _ = json::value(out, &sequence_number);
            out.push(b'}');
        });
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
                let added = ItemAt {
                    output_index: at,
                    item: &self.items[at],
                };
                write_event(out, &mut self.next_seq, "response.output_item.added", added);
                at
            }
        };
        let Some(piece) = arguments.filter(|p| !p.is_empty()) else {
            return;
        };
        let sequence_number = next(&mut self.next_seq);
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
        let next_seq = &mut self.next_seq;
        let Item::Message { id, parts, open } = &mut self.items[at] else {
            return;
        };
        *open = false;
        for (n, part) in parts.iter().enumerate() {
            if part.refusal {
                let refusal = &part.text;
                let done = PartAt::of(id, at, n, RefusalDone { refusal });
                write_event(out, next_seq, "response.refusal.done", done);
            } else {
                let (text, logprobs) = (&part.text, []);
                let done = PartAt::of(id, at, n, TextDone { text, logprobs });
                write_event(out, next_seq, "response.output_text.done", done);
            }
            let done = PartAt::of(id, at, n, WithPart { part });
            write_event(out, next_seq, "response.content_part.done", done);
        }
        self.item_done(at, out);
    }

    fn item_done(&mut self, at: usize, out: &mut Vec<u8>) {
        let done = ItemAt {
            output_index: at,
            item: &self.items[at],
        };
        write_event(out, &mut self.next_seq, "response.output_item.done", done);
    }

    fn close_all(&mut self, out: &mut Vec<u8>) {
        self.close_text(out);
        for (_, at) in std::mem::take(&mut self.calls) {
            let Item::Call {
                id,
                name,
                arguments,
                open,
                ..
            } = &mut self.items[at]
            else {
                continue;
            };
            *open = false;
            let done = ArgumentsDone {
                item_id: id,
                output_index: at,
                name,
                arguments,
            };
            let kind = "response.function_call_arguments.done";
            write_event(out, &mut self.next_seq, kind, done);
            self.item_done(at, out);
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
