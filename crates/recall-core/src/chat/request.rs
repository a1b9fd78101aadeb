//! A chat request body, read and checked before anything is touched:
//! everything in it that could be refused has been.

use serde_json::{Map, Value};

use crate::error::RequestError;
use crate::memory::message::{check_messages, parse_messages, Message};

/// A chat request body, parsed and checked: everything in it that could
/// be refused has been, before any state is touched.
#[derive(Debug, PartialEq)]
pub struct ChatRequest {
    /// The body without `messages` (taken out; `Protocol::turn_body` writes the
    /// new list in its place).
    pub body: Map<String, Value>,
    pub messages: Vec<Message>,
}

/// Parses and checks a chat request body. `serde_json`'s recursion limit
/// (128 levels) refuses deeper nesting as an error, so no input can
/// overflow the stack here.
pub fn parse_request(bytes: &[u8], max_messages: usize) -> Result<ChatRequest, RequestError> {
    if let Some((body, messages)) = super::one_pass::read(bytes, max_messages) {
        return Ok(ChatRequest { body, messages });
    }
    request_of(parse_body(bytes)?, max_messages)
}

/// `parse_request` for a body already parsed.
pub fn request_of(
    mut body: Map<String, Value>,
    max_messages: usize,
) -> Result<ChatRequest, RequestError> {
    let messages = take_messages(&mut body, max_messages)?;
    Ok(ChatRequest { body, messages })
}

pub fn parse_body(bytes: &[u8]) -> Result<Map<String, Value>, RequestError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(RequestError::invalid(
            "the request body must be a JSON object",
            None,
        )),
        Err(e) => Err(RequestError::invalid(
            format!("the request body is not valid JSON: {e}"),
            None,
        )),
    }
}

/// `request_of` for messages already built (the Responses API's), held
/// to the same limits and checks.
pub fn request_with(
    mut body: Map<String, Value>,
    messages: Vec<Message>,
    max_messages: usize,
) -> Result<ChatRequest, RequestError> {
    count(messages.len(), max_messages)?;
    let messages = check_messages(messages)?;
    // Where `request_of` leaves it, for `Protocol::turn_body` to fill.
    body.insert("messages".into(), Value::Array(Vec::new()));
    Ok(ChatRequest { body, messages })
}

/// OpenAI's own answers to a list too short or too long, word for word
/// where it has one.
fn count(len: usize, max_messages: usize) -> Result<(), RequestError> {
    if len == 0 {
        return Err(RequestError::invalid_code(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
            Some("messages"),
            "empty_array",
        )
        );
    }
    if len > max_messages {
        return Err(RequestError::invalid_code(
            format!(
                "Invalid 'messages': array too long. Expected an array with maximum length {max_messages} (server.max_request_messages), but got an array with length {len} instead."
            ),
            Some("messages"),
            "array_above_max_length",
        )
        );
    }
    Ok(())
}

/// Takes `messages` out of the body; `Protocol::turn_body` writes the new list
/// in the same place.
fn take_messages(
    body: &mut Map<String, Value>,
    max_messages: usize,
) -> Result<Vec<Message>, RequestError> {
    match body.get_mut("messages") {
        Some(Value::Array(list)) => {
            count(list.len(), max_messages)?;
            Ok(parse_messages(std::mem::take(list))?)
        }
        Some(_) => Err(RequestError::invalid(
            "`messages` must be an array",
            Some("messages"),
        )),
        None => Err(RequestError::invalid(
            "missing required parameter: `messages`",
            Some("messages"),
        )),
    }
}
