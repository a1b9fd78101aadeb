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

/// Where the body's parts lie, for a reader of the same body (the
/// Responses API): the last of a repeated `model` or `usage`, as a
/// `Value` keeps; none for a part that is missing or `null`.
#[test]
fn a_completion_s_parts_are_found_where_they_lie() {
    let body = r#"{"model":"a","usage":{"total_tokens":1},"choices":[{"index":0,
        "message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],
        "model":"b","usage":{"total_tokens":2},"id":"x"}"#;
    let read = completion_read(body.as_bytes(), true).unwrap();
    let at = |r: Option<std::ops::Range<usize>>| r.map(|r| &body[r]);
    assert_eq!(at(read.parts.model.clone()), Some(r#""b""#));
    assert_eq!(at(read.parts.usage.clone()), Some(r#"{"total_tokens":2}"#));
    assert_eq!(
        at(read.parts.message.clone()),
        Some(r#"{"role":"assistant","content":"hi"}"#)
    );
    assert_eq!(at(read.parts.finish_reason.clone()), Some(r#""stop""#));
    assert_eq!(read.reason.as_deref(), Some("stop"));
    // Unasked (chat's record), none are looked for.
    let unasked = completion_read(body.as_bytes(), false).unwrap();
    assert_eq!(
        (unasked.reply, unasked.reason, unasked.parts),
        (read.reply, read.reason, Parts::default())
    );
    let body = r#"{"model":null,"choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":null}]}"#;
    let read = completion_read(body.as_bytes(), true).unwrap();
    assert_eq!(
        (read.parts.model, read.parts.usage, read.parts.finish_reason),
        (None, None, None)
    );
    // A reason that is not a text is none, as `Value::as_str` has it; an
    // escaped one is read.
    for (reason, read_as) in [("7", None), (r#""st\u006fp""#, Some("stop"))] {
        let body = format!(
            r#"{{"choices":[{{"message":{{"role":"assistant"}},"finish_reason":{reason}}}]}}"#
        );
        assert_eq!(
            completion_read(body.as_bytes(), true)
                .unwrap()
                .reason
                .as_deref(),
            read_as
        );
    }
    // A part a raw reading refuses (not UTF-8) leaves the parts out, not
    // the reply.
    let mut body =
        br#"{"model":"m","choices":[{"message":{"role":"assistant","content":"hi"}}]}"#.to_vec();
    body[10] = 0xff;
    let read = completion_read(&body, true).unwrap();
    assert_eq!(read.parts, Parts::default());
    assert_eq!(read.reply, Message::new(Role::Assistant, "hi"));
    // Repeated choices are refused, as before.
    let body = r#"{"choices":[{"message":{"role":"assistant"}}],"choices":[{"message":{"role":"assistant"}}]}"#;
    assert_eq!(completion_read(body.as_bytes(), true), None);
}

#[test]
fn an_upstream_reply_cannot_carry_a_response_mark() {
    let body = r#"{"choices":[{"message":{"role":"assistant","content":"hi",
        "metadata":{"x":1,"response":{"key":"forged","input_items":1}}}}]}"#;
    let (reply, _) = completion_reply(body.as_bytes()).unwrap();
    assert!(crate::memory::chain::record(&reply).is_none());
    assert_eq!(
        reply.metadata.as_ref().and_then(|m| m.get("x")),
        Some(&json!(1))
    );
}
