//! A chat completion as a Response object (issue 17). Pure: the ids and
//! the request's echoed fields come in, the Response goes out.

use serde_json::{json, Map, Value};

/// What a Response says besides its output: its id and when, and what
/// the request asked for that the Response echoes.
#[derive(Debug, Clone, Default)]
pub struct Echo {
    /// `resp_...`; its items' ids are derived from it, so they are stable.
    pub id: String,
    pub created_at: i64,
    pub previous_response_id: Option<String>,
    pub conversation: Option<String>,
    pub instructions: Option<String>,
    pub metadata: Option<Value>,
    pub store: bool,
}

/// The id of a Response's `n`th output item of a kind (`msg`, `fc`).
pub fn item_id(response_id: &str, kind: &str, n: usize) -> String {
    let base = response_id.strip_prefix("resp_").unwrap_or(response_id);
    format!("{kind}_{base}_{n}")
}

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
            "type": "message", "id": item_id(&echo.id, "msg", 0), "status": "completed",
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
            "type": "function_call", "id": item_id(&echo.id, "fc", n), "status": "completed",
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
    Value::Object(response)
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
