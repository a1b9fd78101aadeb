//! A `POST /v1/responses` body as a chat request body, for the same path
//! a chat request takes. Pure: what the Responses API keeps
//! between requests (`previous_response_id`, `conversation`, `store`) is
//! handed back for the caller to act on.
//!
//! | Responses | chat completions |
//! | --- | --- |
//! | `instructions` | a system message first (this response only) |
//! | `input`: a string | one user message |
//! | `input`: message items (`input_text`, `output_text`, `input_image` parts) | messages of the item's role; `system` and `developer` ones before the first other item are instructions (this response only), later ones are input, stored in place |
//! | `input`: `function_call` items | one assistant message with their `tool_calls` |
//! | `input`: `function_call_output` | a `tool` message |
//! | `input`: `reasoning` items | left out: a chat upstream cannot take them back |
//! | `tools`: function tools | `tools` with the function nested |
//! | `tool_choice` `{"type": "function", "name"}` | `{"type": "function", "function": {"name"}}` |
//! | `text.format` | `response_format` |
//! | `max_output_tokens` | `max_tokens` (what local servers read) |
//! | `reasoning.effort` | `reasoning_effort` |
//! | `stream` | `stream`, with `stream_options.include_usage` |
//! | `include`, `truncation`, `metadata`, `store` | kept by recall, not sent |
//! | anything else | passed through |
//!
//! Refused with a 400 that names the field: built-in tools (`web_search`,
//! `file_search`, ...), `background: true`, `prompt` templates, chat's
//! `messages`, item
//! references and item types recall does not know, and
//! `previous_response_id` together with `conversation`.

use serde_json::{json, Map, Value};

use crate::error::RequestError;
use crate::memory::message::{Message, Role};

/// What a Responses request comes to.
#[derive(Debug, Clone, PartialEq)]
pub struct Translated {
    /// The chat request body, but for its `messages`.
    pub chat: Map<String, Value>,
    /// Its messages, built as `Message`s: a `Value` of each, read again
    /// by chat's parser, cost a long input about a microsecond an item.
    pub messages: Vec<Message>,
    pub previous_response_id: Option<String>,
    /// The conversation's id (given as a string or as `{"id": ...}`).
    pub conversation: Option<String>,
    /// Whether the response is kept (the default).
    pub store: bool,
    pub stream: bool,
    /// The request's `metadata`, kept on the Response.
    pub metadata: Option<Value>,
}

/// Fields the Responses API reads and chat does not take.
const KEPT_BY_RECALL: &[&str] = &[
    "input",
    "instructions",
    "previous_response_id",
    "conversation",
    "store",
    "include",
    "truncation",
    "metadata",
    "tools",
    "tool_choice",
    "text",
    "max_output_tokens",
    "reasoning",
    "stream",
    "stream_options",
    "background",
    "prompt",
];

pub fn translate(mut body: Map<String, Value>) -> Result<Translated, RequestError> {
    if body.get("background") == Some(&Value::Bool(true)) {
        return Err(refuse(
            "`background: true` is not supported: recall answers in the request, over a chat upstream",
            "background",
        ));
    }
    if body.get("prompt").is_some_and(|p| !p.is_null()) {
        return Err(refuse(
            "`prompt` templates are not supported: send `instructions` and `input`",
            "prompt",
        ));
    }
    // A chat body sent here by mistake: its `messages` would be dropped
    // (`input` is the conversation), so it is refused rather than ignored.
    if body.contains_key("messages") {
        return Err(refuse(
            "`messages` is a chat completions field: the Responses API takes the conversation as `input`",
            "messages",
        ));
    }
    let previous_response_id = optional_string(&body, "previous_response_id")?;
    let conversation = match body.get("conversation") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id.clone()),
        Some(Value::Object(c)) => match c.get("id") {
            Some(Value::String(id)) => Some(id.clone()),
            _ => return Err(refuse("`conversation.id` must be a string", "conversation")),
        },
        Some(_) => {
            return Err(refuse(
                "`conversation` must be an id or an object with an `id`",
                "conversation",
            ))
        }
    };
    if previous_response_id.is_some() && conversation.is_some() {
        return Err(refuse(
            "`previous_response_id` and `conversation` cannot be used together",
            "previous_response_id",
        ));
    }
    let store = flag(&body, "store", true)?;
    let stream = flag(&body, "stream", false)?;

    let mut messages = Vec::new();
    match body.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => messages.push(Message::new(Role::System, text.clone())),
        Some(_) => return Err(refuse("`instructions` must be a string", "instructions")),
    }
    match body.get("input") {
        Some(Value::String(text)) => messages.push(Message::new(Role::User, text.clone())),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                input_item(item, At { list: "input", i }, &mut messages)?;
            }
        }
        None | Some(Value::Null) => {}
        Some(_) => {
            return Err(refuse(
                "`input` must be a string or a list of items",
                "input",
            ))
        }
    }

    let mut chat = Map::new();
    if let Some(tools) = body.get("tools").filter(|t| !t.is_null()) {
        chat.insert("tools".into(), self::tools(tools)?);
    }
    if let Some(choice) = body.get("tool_choice").filter(|c| !c.is_null()) {
        chat.insert("tool_choice".into(), tool_choice(choice)?);
    }
    if let Some(format) = body.get("text").and_then(|t| t.get("format")) {
        if let Some(f) = response_format(format)? {
            chat.insert("response_format".into(), f);
        }
    }
    if let Some(n) = body.get("max_output_tokens").filter(|n| !n.is_null()) {
        chat.insert("max_tokens".into(), n.clone());
    }
    if let Some(effort) = body.get("reasoning").and_then(|r| r.get("effort")) {
        if !effort.is_null() {
            chat.insert("reasoning_effort".into(), effort.clone());
        }
    }
    if stream {
        chat.insert("stream".into(), Value::Bool(true));
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    let metadata = body.remove("metadata").filter(|m| !m.is_null());
    for (key, value) in body {
        if !KEPT_BY_RECALL.contains(&key.as_str()) {
            chat.insert(key, value);
        }
    }
    Ok(Translated {
        chat,
        messages,
        previous_response_id,
        conversation,
        store,
        stream,
        metadata,
    })
}

/// The Conversations API's `items` as chat messages (`param` names the
/// list in errors).
pub fn items_to_messages(items: &[Value], param: &str) -> Result<Vec<Message>, RequestError> {
    let mut messages = Vec::new();
    for (i, item) in items.iter().enumerate() {
        input_item(item, At { list: param, i }, &mut messages)?;
    }
    Ok(messages)
}

fn refuse(message: impl Into<String>, param: impl std::fmt::Display) -> RequestError {
    RequestError::invalid(message, Some(&param.to_string()))
}

/// Where an item sits (`input[3]`), written only into an error: a
/// `format!` per item cost an allocation for each of a long input's items.
#[derive(Debug, Clone, Copy)]
struct At<'a> {
    list: &'a str,
    i: usize,
}

impl std::fmt::Display for At<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]", self.list, self.i)
    }
}

fn optional_string(body: &Map<String, Value>, key: &str) -> Result<Option<String>, RequestError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(refuse(format!("`{key}` must be a string"), key)),
    }
}

fn flag(body: &Map<String, Value>, key: &str, default: bool) -> Result<bool, RequestError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(refuse(format!("`{key}` must be a boolean"), key)),
    }
}

/// One input item, appended to `messages` as chat messages.
fn input_item(item: &Value, param: At, messages: &mut Vec<Message>) -> Result<(), RequestError> {
    let Some(item) = item.as_object() else {
        return Err(refuse(format!("`{param}` must be an object"), param));
    };
    // A message may leave out its type (the "easy" input message).
    let kind = match item.get("type") {
        Some(Value::String(t)) => t.as_str(),
        None if item.contains_key("role") => "message",
        _ => return Err(refuse(format!("`{param}.type` must be a string"), param)),
    };
    match kind {
        "message" => {
            let role = match item
                .get("role")
                .and_then(Value::as_str)
                .and_then(Role::parse)
            {
                Some(r @ (Role::User | Role::Assistant | Role::System | Role::Developer)) => r,
                _ => {
                    return Err(refuse(
                        format!("`{param}.role` must be user, assistant, system or developer"),
                        param,
                    ))
                }
            };
            let content = message_content(item.get("content"), role, param)?;
            messages.push(Message::new(role, content));
        }
        "function_call" => {
            let field = |name: &str| {
                item.get(name)
                    .and_then(Value::as_str)
                    .ok_or_else(|| refuse(format!("`{param}.{name}` must be a string"), param))
            };
            let call = json!({"id": field("call_id")?, "type": "function",
                              "function": {"name": field("name")?, "arguments": field("arguments")?}});
            // Calls made together are one assistant message, as a chat
            // model makes them; so is a reply's text and the calls after it.
            match messages.last_mut() {
                Some(last) if last.role == Role::Assistant => last.push_tool_call(call),
                _ => {
                    let mut m = Message::new(Role::Assistant, Value::Null);
                    m.push_tool_call(call);
                    messages.push(m);
                }
            }
        }
        "function_call_output" => {
            let call_id = item
                .get("call_id")
                .and_then(Value::as_str)
                .ok_or_else(|| refuse(format!("`{param}.call_id` must be a string"), param))?;
            let output = match item.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => text_of(parts, param)?,
                _ => {
                    return Err(refuse(
                        format!("`{param}.output` must be a string or a list of parts"),
                        param,
                    ))
                }
            };
            let mut m = Message::new(Role::Tool, output);
            m.set_tool_call_id(Some(call_id.to_owned()));
            messages.push(m);
        }
        // The model's own reasoning: a chat upstream cannot take it back.
        "reasoning" => {}
        "item_reference" => {
            return Err(refuse(
                format!("`{param}`: item references are not supported; send the item itself"),
                param,
            ))
        }
        other => {
            return Err(refuse(
                format!("`{param}.type` `{other}` is not supported over a chat upstream"),
                param,
            ))
        }
    }
    Ok(())
}

/// A message item's content as chat content: a string stays; parts become
/// chat parts, or one string for an assistant (whose content chat takes
/// as text).
fn message_content(content: Option<&Value>, role: Role, param: At) -> Result<Value, RequestError> {
    let parts = match content {
        Some(Value::String(s)) => return Ok(Value::String(s.clone())),
        Some(Value::Array(parts)) => parts,
        _ => {
            return Err(refuse(
                format!("`{param}.content` must be a string or a list of parts"),
                param,
            ))
        }
    };
    if role != Role::User {
        return Ok(Value::String(text_of(parts, param)?));
    }
    let mut out = Vec::with_capacity(parts.len());
    for part in parts {
        match part.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text" | "text") => {
                out.push(json!({"type": "text", "text": part_text(part, param)?}))
            }
            Some("input_image") => match part.get("image_url").and_then(Value::as_str) {
                Some(url) => {
                    let mut image = json!({"url": url});
                    if let Some(detail) = part.get("detail").filter(|d| !d.is_null()) {
                        image["detail"] = detail.clone();
                    }
                    out.push(json!({"type": "image_url", "image_url": image}));
                }
                None => {
                    return Err(refuse(
                        format!("`{param}`: an `input_image` needs an `image_url` (file ids are not supported)"),
                        param,
                    ))
                }
            },
            other => return Err(unknown_part(other, param)),
        }
    }
    Ok(Value::Array(out))
}

/// Text parts joined, for content chat takes as a string.
fn text_of(parts: &[Value], param: At) -> Result<String, RequestError> {
    let mut text = String::new();
    for part in parts {
        match part.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text" | "text") => text.push_str(part_text(part, param)?),
            // What the model refused to say is what it said.
            Some("refusal") => {
                text.push_str(part.get("refusal").and_then(Value::as_str).unwrap_or(""))
            }
            other => return Err(unknown_part(other, param)),
        }
    }
    Ok(text)
}

fn part_text<'a>(part: &'a Value, param: At) -> Result<&'a str, RequestError> {
    part.get("text").and_then(Value::as_str).ok_or_else(|| {
        refuse(
            format!("`{param}`: a text part needs a string `text`"),
            param,
        )
    })
}

fn unknown_part(kind: Option<&str>, param: At) -> RequestError {
    refuse(
        format!(
            "`{param}`: content part type {} is not supported over a chat upstream",
            kind.map_or("(none)".to_owned(), |k| format!("`{k}`"))
        ),
        param,
    )
}

/// Function tools, nested as chat nests them; any other tool is refused.
fn tools(tools: &Value) -> Result<Value, RequestError> {
    let Some(list) = tools.as_array() else {
        return Err(refuse("`tools` must be a list", "tools"));
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let param = At { list: "tools", i };
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => {
                let mut function = Map::new();
                for key in ["name", "description", "parameters", "strict"] {
                    if let Some(v) = tool.get(key).filter(|v| !v.is_null()) {
                        function.insert(key.into(), v.clone());
                    }
                }
                if !function.get("name").is_some_and(Value::is_string) {
                    return Err(refuse(format!("`{param}.name` must be a string"), param));
                }
                out.push(json!({"type": "function", "function": function}));
            }
            Some(other) => {
                return Err(refuse(
                    format!("`{param}`: the built-in tool `{other}` is not available over a chat upstream; only function tools are"),
                    param,
                ))
            }
            None => return Err(refuse(format!("`{param}.type` must be a string"), param)),
        }
    }
    Ok(Value::Array(out))
}

fn tool_choice(choice: &Value) -> Result<Value, RequestError> {
    match choice {
        Value::String(s) if matches!(s.as_str(), "auto" | "none" | "required") => {
            Ok(choice.clone())
        }
        Value::Object(c) if c.get("type").and_then(Value::as_str) == Some("function") => {
            match c.get("name").and_then(Value::as_str) {
                Some(name) => Ok(json!({"type": "function", "function": {"name": name}})),
                None => Err(refuse("`tool_choice.name` must be a string", "tool_choice")),
            }
        }
        _ => Err(refuse(
            "`tool_choice` must be auto, none, required or a function tool",
            "tool_choice",
        )),
    }
}

/// `text.format` as chat's `response_format` (`None` for plain text).
fn response_format(format: &Value) -> Result<Option<Value>, RequestError> {
    match format.get("type").and_then(Value::as_str) {
        None | Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut schema = Map::new();
            for key in ["name", "schema", "description", "strict"] {
                if let Some(v) = format.get(key).filter(|v| !v.is_null()) {
                    schema.insert(key.into(), v.clone());
                }
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": schema})))
        }
        Some(other) => Err(refuse(
            format!("`text.format.type` `{other}` is not supported"),
            "text.format",
        )),
    }
}
