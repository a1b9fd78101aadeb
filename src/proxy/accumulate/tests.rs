//! SSE events and the reply they add up to.

use super::*;
use serde_json::json;

fn feed(events: &[Value]) -> ReplyAccumulator {
    let mut acc = ReplyAccumulator::default();
    for e in events {
        acc.push_data(&e.to_string());
    }
    acc.push_data("[DONE]");
    acc
}

fn delta(index: u64, d: Value) -> Value {
    json!({"object": "chat.completion.chunk",
           "choices": [{"index": index, "delta": d, "finish_reason": null}]})
}

#[test]
fn text_deltas_concatenate() {
    let acc = feed(&[
        delta(0, json!({"role": "assistant", "content": ""})),
        delta(0, json!({"content": "Hel"})),
        delta(0, json!({"content": "lo"})),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        json!({"choices": [], "usage": {"total_tokens": 3}}),
    ]);
    assert!(acc.done && acc.finished);
    assert_eq!(acc.to_message(), Message::new(Role::Assistant, "Hello"));
}

#[test]
fn only_choice_zero_is_remembered() {
    let acc = feed(&[
        delta(1, json!({"content": "other"})),
        delta(0, json!({"content": "mine"})),
    ]);
    assert_eq!(acc.content(), "mine");
}

#[test]
fn tool_calls_accumulate_by_index() {
    let acc = feed(&[
        delta(
            0,
            json!({"role": "assistant", "content": null, "tool_calls": [
            {"index": 0, "id": "c1", "type": "function",
             "function": {"name": "weather", "arguments": ""}}]}),
        ),
        delta(
            0,
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"ci"}}]}),
        ),
        delta(
            0,
            json!({"tool_calls": [
            {"index": 1, "id": "c2", "type": "function",
             "function": {"name": "time", "arguments": "{}"}}]}),
        ),
        delta(
            0,
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "ty\":1}"}}]}),
        ),
    ]);
    let m = acc.to_message();
    assert_eq!(m.content, Value::Null);
    assert_eq!(
        m.tool_calls().unwrap().clone(),
        vec![
            json!({"id": "c1", "type": "function",
                   "function": {"name": "weather", "arguments": "{\"city\":1}"}}),
            json!({"id": "c2", "type": "function",
                   "function": {"name": "time", "arguments": "{}"}}),
        ]
    );
}

#[test]
fn odd_shapes_keep_what_can_be_read() {
    let mut acc = ReplyAccumulator::default();
    acc.push_data(r#"{"choices":[{"index":0,"delta":{"content":"A","tool_calls":[{"index":0,"function":{"arguments":{"x":1}}}]}}]}"#);
    acc.push_data(
        r#"{"choices":[{"index":0,"delta":{"content":["odd"]},"finish_reason":"stop"}]}"#,
    );
    acc.push_data(r#"{"choices":null}"#);
    assert_eq!(acc.content(), "A");
    assert!(acc.finished);
    assert_eq!(acc.malformed, 0);
}

#[test]
fn errors_and_garbage_are_noted() {
    let mut acc = ReplyAccumulator::default();
    acc.push_data("not json");
    acc.push_data(r#"{"error": {"message": "overloaded"}}"#);
    assert_eq!(acc.malformed, 1);
    assert_eq!(acc.error.as_deref(), Some("overloaded"));
    assert!(acc.is_empty() && !acc.done);
}

#[test]
fn completion_body_gives_choice_zero() {
    let body = json!({"id": "c", "usage": {"total_tokens": 3}, "choices": [
        {"index": 1, "message": {"role": "assistant", "content": "no"}, "finish_reason": 7},
        {"index": 0, "message": {"role": "assistant", "content": "yes",
                                  "refusal": null, "annotations": []},
         "finish_reason": "stop"}]});
    assert_eq!(
        completion_reply(body.to_string().as_bytes()),
        Some((Message::new(Role::Assistant, "yes"), Some("stop".into())))
    );
    // No index: the first choice is choice 0.
    let body = json!({"choices": [{"message": {"role": "assistant", "content": "hi"}}]});
    assert_eq!(
        completion_reply(body.to_string().as_bytes()),
        Some((Message::new(Role::Assistant, "hi"), None))
    );
    for bad in [
        json!({"choices": []}),
        json!({"choices": [{"index": 1, "message": {"role": "assistant", "content": "x"}}]}),
        json!({"choices": [{"index": 0}]}),
        json!({"choices": "no"}),
        json!([1, 2]),
    ] {
        assert_eq!(completion_reply(bad.to_string().as_bytes()), None, "{bad}");
    }
    assert_eq!(completion_reply(b"<html>"), None);
    // A message that repeats a key keeps the last, as a `Value` reading
    // does; another choice's message is not read, even one a `Value`
    // would refuse.
    let body = r#"{"choices": [{"index": 1, "message": {"content": "\ud800"}}, {"index": 0,
        "message": {"role": "assistant", "content": "no", "content": "yes"}}]}"#;
    assert_eq!(
        completion_reply(body.as_bytes()),
        Some((Message::new(Role::Assistant, "yes"), None))
    );
    for message in ["null", "[1]", r#""x""#, r#"{"content": "\ud800"}"#] {
        let body = format!(r#"{{"choices": [{{"index": 0, "message": {message}}}]}}"#);
        assert_eq!(completion_reply(body.as_bytes()), None, "{body}");
    }
}
