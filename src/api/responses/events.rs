//! A chat completion's chunks as the Responses API's event stream (issue
//! 17), as they arrive: each chunk gives the events it completes, none
//! held back. Pure: the caller frames each event as SSE (`event:` its
//! type, `data:` its JSON; the stream has no `[DONE]`).
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

use serde_json::{json, Value};

use super::ids;
use super::response::{usage, Echo};

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
    usage: Value,
}

enum Item {
    Message {
        id: String,
        text: String,
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

impl Item {
    fn json(&self) -> Value {
        match self {
            Item::Message { id, text, open } => json!({
                "type": "message", "id": id, "role": "assistant",
                "status": if *open { "in_progress" } else { "completed" },
                "content": if *open { json!([]) } else { json!([output_text(text)]) },
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
            usage: Value::Null,
        }
    }

    fn event(&mut self, kind: &str, mut fields: Value) -> Value {
        fields["type"] = json!(kind);
        fields["sequence_number"] = json!(self.next_seq);
        self.next_seq += 1;
        fields
    }

    /// The Response as it stands.
    pub fn response(&self, status: &str, incomplete: Value, error: Value) -> Value {
        let mut r = super::response::from_completion(&json!({"model": self.model}), &self.echo);
        r["status"] = json!(status);
        r["incomplete_details"] = incomplete;
        r["error"] = error;
        r["output"] = Value::Array(self.items.iter().map(Item::json).collect());
        r["usage"] = self.usage.clone();
        r
    }

    /// The upstream said how its reply finished (`finish_reason`).
    pub fn finished(&self) -> bool {
        self.finish_reason.is_some()
    }

    /// The events that open the stream.
    pub fn start(&mut self) -> Vec<Value> {
        let r = self.response("in_progress", Value::Null, Value::Null);
        vec![
            self.event("response.created", json!({"response": r.clone()})),
            self.event("response.in_progress", json!({"response": r})),
        ]
    }

    /// The events one `chat.completion.chunk` completes.
    pub fn chunk(&mut self, chunk: &Value) -> Vec<Value> {
        let mut out = Vec::new();
        if let Some(model) = chunk.get("model").filter(|m| m.is_string()) {
            self.model = model.clone();
        }
        if chunk.get("usage").is_some_and(Value::is_object) {
            self.usage = usage(&chunk["usage"]);
        }
        let choice = &chunk["choices"][0];
        let delta = &choice["delta"];
        if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            self.text_delta(text, &mut out);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            self.call_delta(call, &mut out);
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.finish_reason = Some(reason.to_owned());
        }
        out
    }

    fn text_delta(&mut self, text: &str, out: &mut Vec<Value>) {
        let at = match self.text {
            Some(at) => at,
            None => {
                let at = self.items.len();
                self.items.push(Item::Message {
                    id: ids::item("msg", &self.echo.items, 0),
                    text: String::new(),
                    open: true,
                });
                self.text = Some(at);
                let item = self.items[at].json();
                let id = item["id"].clone();
                out.push(self.event(
                    "response.output_item.added",
                    json!({"output_index": at, "item": item}),
                ));
                out.push(self.event(
                    "response.content_part.added",
                    json!({"item_id": id, "output_index": at, "content_index": 0,
                           "part": output_text("")}),
                ));
                at
            }
        };
        if let Item::Message { text: all, id, .. } = &mut self.items[at] {
            all.push_str(text);
            let id = id.clone();
            out.push(self.event(
                "response.output_text.delta",
                json!({"item_id": id, "output_index": at, "content_index": 0,
                       "delta": text, "logprobs": []}),
            ));
        }
    }

    fn call_delta(&mut self, call: &Value, out: &mut Vec<Value>) {
        let index = call["index"].as_u64().unwrap_or(0);
        let at = match self.calls.iter().find(|(i, _)| *i == index) {
            Some(&(_, at)) => at,
            None => {
                // A message is done once the calls begin.
                self.close_text(out);
                let at = self.items.len();
                self.items.push(Item::Call {
                    id: ids::item("fc", &self.echo.items, self.calls.len()),
                    call_id: call["id"].as_str().unwrap_or_default().to_owned(),
                    name: call["function"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    arguments: String::new(),
                    open: true,
                });
                self.calls.push((index, at));
                let item = self.items[at].json();
                out.push(self.event(
                    "response.output_item.added",
                    json!({"output_index": at, "item": item}),
                ));
                at
            }
        };
        if let Some(piece) = call["function"]["arguments"]
            .as_str()
            .filter(|p| !p.is_empty())
        {
            if let Item::Call { arguments, id, .. } = &mut self.items[at] {
                arguments.push_str(piece);
                let id = id.clone();
                out.push(self.event(
                    "response.function_call_arguments.delta",
                    json!({"item_id": id, "output_index": at, "delta": piece}),
                ));
            }
        }
    }

    fn close_text(&mut self, out: &mut Vec<Value>) {
        let Some(at) = self.text.take() else {
            return;
        };
        let (id, text) = match &mut self.items[at] {
            Item::Message { id, text, open } => {
                *open = false;
                (id.clone(), text.clone())
            }
            Item::Call { .. } => return,
        };
        out.push(self.event(
            "response.output_text.done",
            json!({"item_id": id, "output_index": at, "content_index": 0,
                   "text": text, "logprobs": []}),
        ));
        out.push(self.event(
            "response.content_part.done",
            json!({"item_id": id, "output_index": at, "content_index": 0,
                   "part": output_text(&text)}),
        ));
        let item = self.items[at].json();
        out.push(self.event(
            "response.output_item.done",
            json!({"output_index": at, "item": item}),
        ));
    }

    fn close_all(&mut self, out: &mut Vec<Value>) {
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
            out.push(self.event(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": at, "name": name, "arguments": arguments}),
            ));
            let item = self.items[at].json();
            out.push(self.event(
                "response.output_item.done",
                json!({"output_index": at, "item": item}),
            ));
        }
    }

    /// The events that end a stream the upstream ended: open items closed,
    /// then `response.completed`, or `response.incomplete` when the
    /// upstream stopped at its token limit or a content filter.
    pub fn finish(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        self.close_all(&mut out);
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
        let r = self.response(status, incomplete, Value::Null);
        out.push(self.event(kind, json!({"response": r})));
        out
    }

    /// The events that end a stream cut short: by the client, a newer
    /// request or the interrupt endpoint (`reason` "interrupted").
    pub fn incomplete(&mut self, reason: &str) -> Vec<Value> {
        let mut out = Vec::new();
        self.close_all(&mut out);
        let r = self.response("incomplete", json!({"reason": reason}), Value::Null);
        out.push(self.event("response.incomplete", json!({"response": r})));
        out
    }

    /// The event that ends a stream the upstream failed.
    pub fn failed(&mut self, code: &str, message: &str) -> Vec<Value> {
        let error = json!({"code": code, "message": message});
        let r = self.response("failed", Value::Null, error);
        vec![self.event("response.failed", json!({"response": r}))]
    }
}

/// One event as SSE.
pub fn sse(event: &Value) -> String {
    format!(
        "event: {}\ndata: {event}\n\n",
        event["type"].as_str().unwrap_or("message")
    )
}
