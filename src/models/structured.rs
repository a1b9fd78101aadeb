//! How recall asks a chat model for an answer of a shape (a JSON schema),
//! on servers that differ in what they take: OpenAI, vLLM and llama.cpp's
//! `llama-server` take `response_format` of type `json_schema`;
//! llama-cpp-python's server refuses that type but takes `json_object`
//! with the schema beside it; some take neither. A refusal that names the
//! field steps down to the next way, and the upstream's `Formats`
//! remembers where it got to, for the process.

use std::sync::atomic::{AtomicU8, Ordering};

use serde_json::{json, Value};

use crate::config::StructuredOutput;

/// One way of asking for a shape, the most exact first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Format {
    /// `{"type": "json_schema", "json_schema": {"name", "strict", "schema"}}`.
    JsonSchema,
    /// `{"type": "json_object", "schema": ...}`.
    JsonObject,
    /// No `response_format`: the prompt alone says what to write.
    Plain,
}

impl Format {
    const ALL: [Format; 3] = [Format::JsonSchema, Format::JsonObject, Format::Plain];

    pub fn label(self) -> &'static str {
        match self {
            Format::JsonSchema => "json_schema",
            Format::JsonObject => "json_object",
            Format::Plain => "none",
        }
    }

    /// The way to try after this one is refused.
    fn next(self) -> Option<Format> {
        match self {
            Format::JsonSchema => Some(Format::JsonObject),
            Format::JsonObject => Some(Format::Plain),
            Format::Plain => None,
        }
    }

    /// The request's `response_format` for `shape`, if this way sends one.
    pub fn response_format(self, shape: &Shape) -> Option<Value> {
        match self {
            Format::JsonSchema => Some(json!({
                "type": "json_schema",
                "json_schema": {"name": shape.name, "strict": true, "schema": shape.schema},
            })),
            Format::JsonObject => Some(json!({"type": "json_object", "schema": shape.schema})),
            Format::Plain => None,
        }
    }

    fn of(config: StructuredOutput) -> Option<Format> {
        match config {
            StructuredOutput::Auto => None,
            StructuredOutput::JsonSchema => Some(Format::JsonSchema),
            StructuredOutput::JsonObject => Some(Format::JsonObject),
            StructuredOutput::None => Some(Format::Plain),
        }
    }
}

/// An answer's shape: a JSON schema, and the name `json_schema` gives it.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    pub name: &'static str,
    pub schema: Value,
}

/// Whether an error answer (its status and its error text) to a request
/// sent with `sent` refuses that way of asking, rather than failing for
/// another reason: a request error, a validation error (FastAPI's 422, or
/// llama-cpp-python's 500 that wraps one), that names the field or the
/// type sent. An overloaded or broken server's 5xx names neither, and is
/// the model's failure.
pub fn refused(sent: Format, status: u16, message: &str) -> bool {
    if sent == Format::Plain || !matches!(status, 400 | 422 | 500) {
        return false;
    }
    let message = message.to_ascii_lowercase();
    message.contains("response_format") || message.contains(sent.label())
}

/// What recall knows of an upstream's ways: pinned by its config, or
/// learnt from its refusals (`json_schema` until one).
#[derive(Debug)]
pub struct Formats {
    pinned: bool,
    current: AtomicU8,
}

/// What to do after a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub next: Format,
    /// This refusal is the one that moved what is remembered (another
    /// call may have been refused at the same time).
    pub moved: bool,
}

impl Formats {
    pub fn new(config: StructuredOutput) -> Self {
        let pinned = Format::of(config);
        Self {
            pinned: pinned.is_some(),
            current: AtomicU8::new(pinned.unwrap_or(Format::JsonSchema) as u8),
        }
    }

    /// The way the next call asks.
    pub fn current(&self) -> Format {
        let i = usize::from(self.current.load(Ordering::Relaxed));
        Format::ALL.get(i).copied().unwrap_or(Format::Plain)
    }

    /// After `sent` was refused: the next way, remembered (the lower of
    /// `sent`'s next and what another refusal already remembered). None
    /// when pinned, or when nothing is left to step down to.
    pub fn step_down(&self, sent: Format) -> Option<Step> {
        if self.pinned {
            return None;
        }
        let next = sent.next()?;
        let before = self.current.fetch_max(next as u8, Ordering::Relaxed);
        Some(Step {
            next: next.max(Format::ALL.get(usize::from(before)).copied()?),
            moved: before < next as u8,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama-cpp-python 0.3's answer to `json_schema`, verbatim.
    const LLAMA_CPP_PYTHON: &str = "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), 'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema', 'ctx': {'expected': \"'text' or 'json_object'\"}}\n\n  File \"/venv/lib/python3.11/site-packages/llama_cpp/server/app.py\", line 376, in create_chat_completion\n    POST /v1/chat/completions";

    #[test]
    fn a_refusal_names_the_field_or_the_type_sent() {
        assert!(refused(Format::JsonSchema, 500, LLAMA_CPP_PYTHON));
        assert!(refused(
            Format::JsonSchema,
            400,
            "Invalid parameter: 'response_format' of type 'json_schema' is not supported with this model. (param: response_format)"
        ));
        assert!(refused(
            Format::JsonObject,
            422,
            r#"[{"loc":["body","response_format","type"],"msg":"unexpected value"}]"#
        ));
        assert!(refused(
            Format::JsonSchema,
            400,
            "JSON_SCHEMA is not supported"
        ));
    }

    #[test]
    fn other_failures_are_not_refusals() {
        // Another status, however worded.
        for status in [401, 404, 429, 502, 503, 504] {
            assert!(
                !refused(Format::JsonSchema, status, LLAMA_CPP_PYTHON),
                "{status}"
            );
        }
        // An overloaded or broken server, or another field.
        assert!(!refused(
            Format::JsonSchema,
            500,
            "server overloaded, try again"
        ));
        assert!(!refused(
            Format::JsonSchema,
            500,
            "CUDA error: out of memory"
        ));
        assert!(!refused(
            Format::JsonSchema,
            400,
            "This model's maximum context length is 8192 tokens (param: messages)"
        ));
        // A validation error of `max_tokens` names neither the field nor the type.
        assert!(!refused(
            Format::JsonObject,
            500,
            "1 validation error:\n  {'type': 'int_parsing', 'loc': ('body', 'max_tokens')}"
        ));
        // Nothing was sent to refuse.
        assert!(!refused(Format::Plain, 400, LLAMA_CPP_PYTHON));
    }

    #[test]
    fn auto_steps_down_once_per_way_and_remembers() {
        let f = Formats::new(StructuredOutput::Auto);
        assert_eq!(f.current(), Format::JsonSchema);
        let step = f.step_down(Format::JsonSchema).unwrap();
        assert_eq!((step.next, step.moved), (Format::JsonObject, true));
        assert_eq!(f.current(), Format::JsonObject);
        // A call refused at the same time learns nothing new.
        let again = f.step_down(Format::JsonSchema).unwrap();
        assert_eq!((again.next, again.moved), (Format::JsonObject, false));
        let step = f.step_down(Format::JsonObject).unwrap();
        assert_eq!((step.next, step.moved), (Format::Plain, true));
        // A late refusal of the first way goes on from where the others got.
        let late = f.step_down(Format::JsonSchema).unwrap();
        assert_eq!((late.next, late.moved), (Format::Plain, false));
        assert_eq!(f.current(), Format::Plain);
        assert_eq!(f.step_down(Format::Plain), None);
    }

    #[test]
    fn a_pinned_way_never_moves() {
        for (config, way) in [
            (StructuredOutput::JsonSchema, Format::JsonSchema),
            (StructuredOutput::JsonObject, Format::JsonObject),
            (StructuredOutput::None, Format::Plain),
        ] {
            let f = Formats::new(config);
            assert_eq!(f.current(), way);
            assert_eq!(f.step_down(way), None);
            assert_eq!(f.current(), way);
        }
    }

    #[test]
    fn each_way_writes_its_response_format() {
        let shape = Shape {
            name: "facts",
            schema: json!({"type": "object"}),
        };
        assert_eq!(
            Format::JsonSchema.response_format(&shape).unwrap(),
            json!({"type": "json_schema",
                   "json_schema": {"name": "facts", "strict": true, "schema": {"type": "object"}}})
        );
        assert_eq!(
            Format::JsonObject.response_format(&shape).unwrap(),
            json!({"type": "json_object", "schema": {"type": "object"}})
        );
        assert_eq!(Format::Plain.response_format(&shape), None);
    }
}
