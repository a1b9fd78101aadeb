//! A request's `messages`, parsed and checked in shape before anything is
//! stored.

use serde_json::Value;

use super::{Message, Role};

/// Why a message in a request body was refused; the index is its position.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MessageError {
    #[error("messages[{0}] must be an object")]
    NotObject(usize),
    #[error("messages[{0}].role must be one of system, developer, user, assistant, tool")]
    BadRole(usize),
    #[error("messages[{0}] is invalid: {1}")]
    Invalid(usize, String),
    /// One field is missing or has the wrong type; `param` names it, and
    /// the message says what it must be.
    #[error("{message}")]
    Field { param: String, message: String },
}

impl MessageError {
    pub fn param(&self) -> String {
        match self {
            MessageError::NotObject(i) | MessageError::Invalid(i, _) => format!("messages[{i}]"),
            MessageError::BadRole(i) => format!("messages[{i}].role"),
            MessageError::Field { param, .. } => param.clone(),
        }
    }

    fn field(param: String, must: &str) -> Self {
        MessageError::Field {
            message: format!("{param} {must}"),
            param,
        }
    }
}

/// Parses the `messages` array of a request body. Every message must be
/// one OpenAI would accept in shape: an object with a known role, content
/// of a type that role allows, and a `tool_call_id` on a tool result (the
/// window keeps a result with its call by that id, and the upstream would
/// refuse the turn without it). What is refused here is never stored.
pub fn parse_messages(values: Vec<Value>) -> Result<Vec<Message>, MessageError> {
    values
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let Value::Object(obj) = v else {
                return Err(MessageError::NotObject(i));
            };
            if obj
                .get("role")
                .and_then(Value::as_str)
                .and_then(Role::parse)
                .is_none()
            {
                return Err(MessageError::BadRole(i));
            }
            let m: Message = serde_json::from_value(Value::Object(obj))
                .map_err(|e| MessageError::Invalid(i, e.to_string()))?;
            checked(i, m)
        })
        .collect()
}

/// Messages read without a `Value` (chat's one-pass reading, the
/// Responses API's translation), each `checked` in its place.
pub fn check_messages(messages: Vec<Message>) -> Result<Vec<Message>, MessageError> {
    messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| checked(i, m))
        .collect()
}

/// A message read from a request, checked in shape (`i` is its place in
/// `messages`) and cleared of what only recall may write.
fn checked(i: usize, mut m: Message) -> Result<Message, MessageError> {
    check_shape(i, &m)?;
    // A response's mark is recall's to make (`chain`): one a client sent
    // could stand in for a real response.
    if let Some(md) = &mut m.metadata {
        md.remove(crate::memory::chain::KEY);
    }
    Ok(m)
}

/// The content types each role may carry, and the fields a role requires.
fn check_shape(i: usize, m: &Message) -> Result<(), MessageError> {
    let param = |field: &str| format!("messages[{i}].{field}");
    let content_ok = match (&m.content, m.role) {
        (Value::String(_), _) => true,
        // The deprecated function result is text only.
        (Value::Array(_), Role::Function) => false,
        (Value::Array(parts), _) => {
            // Each part is `{"type": ..., ...}`; what a type holds is the
            // upstream's business (vendors add their own types).
            if let Some(j) = parts
                .iter()
                .position(|p| p.get("type").and_then(Value::as_str).is_none())
            {
                return Err(MessageError::field(
                    format!("messages[{i}].content[{j}]"),
                    "must be an object with a string `type` (a content part)",
                ));
            }
            true
        }
        // A reply that only calls tools, refuses or speaks has no text;
        // recall itself stores such replies with `content: null`, and a
        // client that resends the conversation sends them back that way.
        (Value::Null, Role::Assistant | Role::Function) => true,
        _ => false,
    };
    if !content_ok {
        let must = match (m.role, &m.content) {
            (Role::Assistant, _) => "must be a string, an array of content parts, or null",
            (Role::Function, _) => "must be a string or null",
            (_, Value::Null) => "is required: a string or an array of content parts",
            _ => "must be a string or an array of content parts",
        };
        return Err(MessageError::field(param("content"), must));
    }
    if m.role == Role::Tool && m.tool_call_id().is_none() {
        return Err(MessageError::field(
            param("tool_call_id"),
            "is required on a tool message: the id of the tool call it answers",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bad_messages_are_named_by_index() {
        let err = parse_messages(vec![json!({"role": "user", "content": "a"}), json!("x")]);
        assert_eq!(err.unwrap_err(), MessageError::NotObject(1));
        let err = parse_messages(vec![json!({"role": "robot", "content": "a"})]);
        assert_eq!(err.unwrap_err(), MessageError::BadRole(0));
        let err = parse_messages(vec![json!({"content": "a"})]);
        assert_eq!(err.unwrap_err(), MessageError::BadRole(0));
        let err = parse_messages(vec![json!({"role": "user", "turn_id": "x"})]);
        assert!(matches!(err.unwrap_err(), MessageError::Invalid(0, _)));
    }

    #[test]
    fn content_types_and_tool_call_ids_are_checked_per_role() {
        let param = |v: Value| parse_messages(vec![v]).map(|_| ()).map_err(|e| e.param());
        assert_eq!(param(json!({"role": "user", "content": "a"})), Ok(()));
        assert_eq!(
            param(json!({"role": "user", "content": [{"type": "text", "text": "a"}]})),
            Ok(())
        );
        assert_eq!(
            param(json!({"role": "assistant", "content": null, "refusal": "no"})),
            Ok(())
        );
        assert_eq!(
            param(json!({"role": "function", "name": "f", "content": null})),
            Ok(())
        );
        for bad in [
            json!({"role": "user", "content": 5}),
            json!({"role": "user"}),
            json!({"role": "system", "content": {"text": "a"}}),
            json!({"role": "assistant", "content": false}),
            json!({"role": "function", "name": "f", "content": []}),
        ] {
            assert_eq!(
                param(bad.clone()),
                Err("messages[0].content".into()),
                "{bad}"
            );
        }
        assert_eq!(
            param(json!({"role": "user", "content": [{"type": "text"}, "x"]})),
            Err("messages[0].content[1]".into())
        );
        assert_eq!(
            param(json!({"role": "tool", "content": "42"})),
            Err("messages[0].tool_call_id".into())
        );
        assert_eq!(
            param(json!({"role": "tool", "tool_call_id": "c1", "content": "42"})),
            Ok(())
        );
    }
}
