//! A chat completion as a Response object (issue 17). Pure: the ids and
//! the request's echoed fields come in, the Response goes out.

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
    let mut response = Map::new();
    response.insert("id".into(), json!(echo.id));
    response.insert("object".into(), json!("response"));
    response.insert("created_at".into(), json!(echo.created_at));
    response.insert("status".into(), json!(status));
    response.insert("error".into(), Value::Null);
    response.insert("incomplete_details".into(), incomplete);
    response.insert("model".into(), completion["model"].clone());
    response.insert("output".into(), Value::Array(output));
    response.insert("usage".into(), usage(&completion["usage"]));
    response.insert(
        "previous_response_id".into(),
        json!(echo.previous_response_id),
    );
    response.insert(
        "conversation".into(),
        echo.conversation
            .as_ref()
            .map_or(Value::Null, |id| json!({"id": id})),
    );
    response.insert("instructions".into(), json!(echo.instructions));
    response.insert(
        "metadata".into(),
        echo.metadata.clone().unwrap_or_else(|| json!({})),
    );
    response.insert("store".into(), json!(echo.store));
    for key in ECHOED {
        let value = echo.fields.get(*key).cloned();
        response.insert((*key).into(), value.unwrap_or_else(|| default_of(key)));
    }
    Value::Object(response)
}

/// What OpenAI's Response says for a field the request left out.
fn default_of(key: &str) -> Value {
    match key {
        "tools" => json!([]),
        "tool_choice" => json!("auto"),
        "parallel_tool_calls" => json!(true),
        "text" => json!({"format": {"type": "text"}}),
        "truncation" => json!("disabled"),
        "temperature" | "top_p" => json!(1.0),
        _ => Value::Null,
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
