//! Stored messages as the Responses API's items, and a stored response
//! as a Response object. Pure: the session's messages come in, JSON goes
//! out. An item carries recall's extension fields (`turn_id`, `timestamp`,
//! `metadata`) beside OpenAI's, as a chat message does.

use std::borrow::Borrow;

use serde_json::{json, Value};

use super::ids;
use super::response::{Echo, Written, ECHOED};
use crate::memory::chain::{self, Span};
use crate::memory::interruption;
use crate::memory::message::{Message, ResponseMark, Role};

/// A stored message as items: a reply with text and tool calls is a
/// `message` and a `function_call` per call; `base` is `ids::items_base`
/// of its sequence number.
pub fn of_message(m: &Message, base: &str) -> Vec<Value> {
    let mut items = Vec::new();
    match m.role {
        Role::Tool => items.push(json!({
            "type": "function_call_output", "id": ids::item("fco", base, 0),
            "call_id": m.tool_call_id(), "output": text_of(&m.content),
            "status": "completed",
        })),
        Role::Assistant => {
            let status = if interruption::is_interrupted(m) {
                "incomplete"
            } else {
                "completed"
            };
            let parts = parts(&m.content, "output_text");
            if !parts.is_empty() {
                items.push(json!({
                    "type": "message", "id": ids::item("msg", base, 0), "role": "assistant",
                    "status": status, "content": parts,
                }));
            }
            for (n, call) in m.tool_calls().into_iter().flatten().enumerate() {
                items.push(json!({
                    "type": "function_call", "id": ids::item("fc", base, n),
                    "call_id": call["id"], "name": call["function"]["name"],
                    "arguments": call["function"]["arguments"], "status": status,
                }));
            }
        }
        role => items.push(json!({
            "type": "message", "id": ids::item("msg", base, 0), "role": role.as_str(),
            "status": "completed", "content": parts(&m.content, "input_text"),
        })),
    }
    for item in &mut items {
        if let Value::Object(item) = item {
            if let Some(t) = m.turn_id {
                item.insert("turn_id".into(), t.into());
            }
            if let Some(t) = m.timestamp {
                item.insert("timestamp".into(), t.into());
            }
            if let Some(md) = &m.metadata {
                item.insert("metadata".into(), md.to_value());
            }
        }
    }
    items
}

/// Chat content as Responses content parts.
fn parts(content: &Value, text_type: &str) -> Vec<Value> {
    match content {
        Value::String(t) if t.is_empty() => Vec::new(),
        Value::String(t) => vec![text_part(text_type, t)],
        Value::Array(list) => list
            .iter()
            .map(|p| match p["type"].as_str() {
                Some("text") => text_part(text_type, p["text"].as_str().unwrap_or_default()),
                Some("image_url") => json!({
                    "type": "input_image", "image_url": p["image_url"]["url"],
                    "detail": p["image_url"]["detail"].as_str().unwrap_or("auto"),
                }),
                _ => p.clone(),
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn text_part(kind: &str, text: &str) -> Value {
    if kind == "output_text" {
        json!({"type": kind, "text": text, "annotations": []})
    } else {
        json!({"type": kind, "text": text})
    }
}

fn text_of(content: &Value) -> Value {
    match content {
        Value::String(_) => content.clone(),
        Value::Array(list) => Value::String(
            list.iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<String>(),
        ),
        _ => Value::String(String::new()),
    }
}

/// What a response's mark says, as the Response echoes it.
pub fn echo_of(record: &ResponseMark, id: &str, items: String) -> Echo {
    Echo {
        id: id.to_owned(),
        items,
        created_at: record.created_at,
        previous_response_id: record.previous_response_id.clone(),
        conversation: record.conversation.clone(),
        instructions: record.instructions.clone(),
        metadata: record.metadata.clone(),
        store: true,
        fields: record
            .fields
            .iter()
            .filter(|(k, _)| ECHOED.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    }
}

/// A stored response as a Response: its mark's echo, and its output from
/// the replies after its input. `session` is the session's id as the
/// client knows it; `first_seq` the sequence number of `history[0]`.
pub fn response<H: Borrow<Message>>(
    history: &[H],
    first_seq: u64,
    span: &Span,
    session: &str,
    in_flight: bool,
) -> Option<Value> {
    let mark = history.get(span.input.start)?.borrow();
    let record = chain::record(mark)?;
    let key = chain::key_of(mark)?;
    let reply_seq = first_seq + span.output.start as u64;
    let echo = echo_of(
        record,
        &ids::response(session, key),
        ids::items_base(session, reply_seq),
    );
    let mut output = Vec::new();
    let mut status = "completed";
    let mut incomplete = Value::Null;
    let mut error = Value::Null;
    for (i, m) in history[span.output.clone()].iter().enumerate() {
        let m = m.borrow();
        if interruption::is_superseded(m) {
            continue;
        }
        if interruption::is_failure(m) {
            status = "failed";
            error = json!({"code": "server_error",
                           "message": m.meta_str("error").unwrap_or("the upstream call failed")});
            continue;
        }
        if interruption::is_interrupted(m) {
            status = "incomplete";
            incomplete = json!({"reason": "interrupted"});
        }
        let seq = first_seq + (span.output.start + i) as u64;
        output.extend(of_message(m, &ids::items_base(session, seq)));
    }
    if span.output.is_empty() {
        // The reply is still in flight, or was never recorded.
        status = if in_flight {
            "in_progress"
        } else {
            "incomplete"
        };
    }
    let r = Written {
        echo: &echo,
        model: &record.model,
        status,
        incomplete,
        error,
        output,
        usage: None,
    };
    let mut out = Vec::new();
    r.write(&mut out).ok()?;
    serde_json::from_slice(&out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marked(text: &str) -> Message {
        let mut m = Message::new(Role::User, text);
        let r = ResponseMark::of_value(&json!({"key": "k1", "input_items": 1, "created_at": 7,
            "model": "m", "instructions": "Be brief.", "temperature": 0.5}))
        .unwrap();
        chain::mark(&mut m, r);
        m
    }

    #[test]
    fn a_stored_response_shows_its_echo_and_its_reply_with_the_conversation_ids() {
        let mut reply = Message::new(Role::Assistant, "hello");
        reply.set_tool_calls(Some(vec![json!({"id": "call_1", "type": "function",
            "function": {"name": "f", "arguments": "{}"}})]));
        let h = vec![Message::new(Role::User, "before"), marked("hi"), reply];
        let span = chain::find(&h, "k1").unwrap();
        let r = response(&h, 10, &span, "chain_1", false).unwrap();
        assert_eq!(r["id"], ids::response("chain_1", "k1"));
        assert_eq!(r["status"], "completed");
        assert_eq!(r["model"], "m");
        assert_eq!(r["instructions"], "Be brief.");
        assert_eq!(r["temperature"], 0.5);
        assert_eq!(r["created_at"], 7);
        let base = ids::items_base("chain_1", 12);
        assert_eq!(r["output"][0]["id"], ids::item("msg", &base, 0));
        assert_eq!(r["output"][0]["content"][0]["text"], "hello");
        assert_eq!(r["output"][1]["id"], ids::item("fc", &base, 0));
        assert_eq!(r["output"][1]["call_id"], "call_1");
        // The same ids as the conversation's items.
        assert_eq!(of_message(&h[2], &base)[1]["id"], r["output"][1]["id"]);
    }

    #[test]
    fn an_interrupted_reply_makes_an_incomplete_response_and_one_in_flight_is_in_progress() {
        let mut cut = Message::new(Role::Assistant, "Once upon");
        interruption::mark_stored(&mut cut, None, 9, "client_gone");
        let h = vec![marked("tell me"), cut];
        let span = chain::find(&h, "k1").unwrap();
        let r = response(&h, 0, &span, "s", false).unwrap();
        assert_eq!(r["status"], "incomplete");
        assert_eq!(r["incomplete_details"]["reason"], "interrupted");
        assert_eq!(r["output"][0]["status"], "incomplete");
        assert_eq!(r["output"][0]["metadata"]["interrupted"], true);

        let h = vec![marked("tell me")];
        let span = chain::find(&h, "k1").unwrap();
        assert_eq!(
            response(&h, 0, &span, "s", true).unwrap()["status"],
            "in_progress"
        );
    }

    #[test]
    fn tool_results_and_input_parts_become_their_item_types() {
        let mut tool = Message::new(Role::Tool, "22C");
        tool.set_tool_call_id(Some("call_1".into()));
        let items = of_message(&tool, "b_1");
        assert_eq!(items[0]["type"], "function_call_output");
        assert_eq!(items[0]["output"], "22C");
        let user = Message::new(
            Role::User,
            json!([{"type": "text", "text": "see"},
                   {"type": "image_url", "image_url": {"url": "data:x"}}]),
        );
        let items = of_message(&user, "b_2");
        assert_eq!(
            items[0]["content"][0],
            json!({"type": "input_text", "text": "see"})
        );
        assert_eq!(items[0]["content"][1]["type"], "input_image");
    }
}
