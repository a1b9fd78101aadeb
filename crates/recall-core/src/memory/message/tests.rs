//! The message: its wire form, its OpenAI form, and its costs.

use super::*;
use serde_json::json;

#[test]
fn unknown_fields_survive_a_round_trip() {
    let v = json!({"role": "user", "content": "hi", "turn_id": 3, "timestamp": 5,
                    "metadata": {"source": "asr", "user": "u1"}, "x_custom": [1]});
    let m = parse_messages(vec![v.clone()]).unwrap().remove(0);
    assert_eq!(m.turn_id, Some(3));
    assert_eq!(m.source(), Some("asr"));
    assert_eq!(serde_json::to_value(&m).unwrap(), v);
}

#[test]
fn openai_form_keeps_only_openai_fields() {
    let v = json!({"role": "assistant", "content": null, "turn_id": 3, "refusal": "no",
                    "metadata": {"source": "llm"}, "x_custom": 1,
                    "tool_calls": [{"id": "c1", "type": "function",
                                    "function": {"name": "f", "arguments": "{}"}}]});
    let m = parse_messages(vec![v]).unwrap().remove(0);
    assert_eq!(
        m.to_openai(),
        json!({"role": "assistant", "content": null, "refusal": "no",
               "tool_calls": [{"id": "c1", "type": "function",
                               "function": {"name": "f", "arguments": "{}"}}]})
    );
}

#[test]
fn char_cost_counts_text_chars_and_structured_json() {
    assert_eq!(Message::new(Role::User, "héllo").char_cost(), 5);
    let parts = json!([{"type": "text", "text": "hi"}]);
    assert_eq!(
        Message::new(Role::User, parts.clone()).char_cost(),
        parts.to_string().len()
    );
}

#[test]
fn only_leading_system_and_developer_messages_are_instructions() {
    let m = |role| Message::new(role, "x");
    let request = [
        m(Role::System),
        m(Role::Developer),
        m(Role::User),
        m(Role::Assistant),
        m(Role::Developer),
        m(Role::User),
    ];
    assert_eq!(leading_instructions(&request), 2);
    assert_eq!(leading_instructions(&request[2..]), 0);
    assert_eq!(
        leading_instructions(&request[4..]),
        1,
        "a request of its own"
    );
    assert_eq!(leading_instructions(&[m(Role::System)]), 1);
    assert_eq!(leading_instructions(&[]), 0);
}
