//! The chat-completions shapes of an answer recall gives itself (a cache
//! hit): what the OpenAI SDKs parse, with no usage to report.

use serde_json::{json, Value};

/// The answer as a `chat.completion` body.
pub fn completion(model: &str, text: &str, created: i64) -> Value {
    json!({
        "id": format!("chatcmpl-recall-{created}"),
        "object": "chat.completion",
        "created": created / 1000,
        "model": model,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text, "refusal": null}}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    })
}

/// The answer as the SSE stream a streaming client expects.
pub fn stream(model: &str, text: &str, created: i64, include_usage: bool) -> String {
    let chunk = |delta: Value, finish: Value| {
        json!({"id": format!("chatcmpl-recall-{created}"), "object": "chat.completion.chunk",
               "created": created / 1000, "model": model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut out = String::new();
    for event in [
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
        chunk(json!({"content": text}), Value::Null),
        chunk(json!({}), json!("stop")),
    ] {
        out.push_str(&format!("data: {event}\n\n"));
    }
    if include_usage {
        let usage = json!({"id": format!("chatcmpl-recall-{created}"), "object": "chat.completion.chunk",
                           "created": created / 1000, "model": model, "choices": [],
                           "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}});
        out.push_str(&format!("data: {usage}\n\n"));
    }
    out.push_str("data: [DONE]\n\n");
    out
}
