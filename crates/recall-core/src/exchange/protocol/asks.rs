//! The chat-completions shapes of the calls recall makes for itself (a
//! summary, a note, facts): a non-streamed completion bounded by
//! `max_tokens`, in a `response_format` when a shape is asked for, and
//! the text of its first choice.

use serde_json::{json, Value};

/// A model's answer to one of recall's own calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Said {
    pub text: String,
    /// The model stopped at `max_tokens` (`finish_reason: "length"`): the
    /// text is not all it meant to write.
    pub cut_off: bool,
}

pub fn body(
    model: &str,
    messages: &[Value],
    max_tokens: u32,
    response_format: Option<Value>,
) -> Vec<u8> {
    let mut body = json!({
        "model": model, "messages": messages, "stream": false,
        "max_tokens": max_tokens,
    });
    if let Some(f) = response_format {
        body["response_format"] = f;
    }
    body.to_string().into_bytes()
}

/// The text of a chat completion's first choice, and whether it stopped
/// at `max_tokens`; else why the body is not a completion.
pub fn read(body: &[u8]) -> Result<Said, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let choice = &v["choices"][0];
    let text = match &choice["message"]["content"] {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => return Err(format!("its content is {other}")),
    };
    Ok(Said {
        text,
        cut_off: choice["finish_reason"] == "length",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_completions_text_is_an_answer() {
        let answer = read;
        let ok = br#"{"choices": [{"message": {"role": "assistant", "content": "Ada."}, "finish_reason": "stop"}]}"#;
        let whole = Said {
            text: "Ada.".into(),
            cut_off: false,
        };
        assert_eq!(answer(ok).unwrap(), whole);
        let null = br#"{"choices": [{"message": {"content": null}}]}"#;
        assert_eq!(answer(null).unwrap().text, "");
        assert!(answer(b"not json").is_err());
        assert!(answer(br#"{"choices": [{"message": {"content": 3}}]}"#).is_err());
        let cut =
            br#"{"choices": [{"message": {"content": "Ada is"}, "finish_reason": "length"}]}"#;
        assert!(answer(cut).unwrap().cut_off);
    }
}
