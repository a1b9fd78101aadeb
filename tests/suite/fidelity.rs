//! Conversation fidelity through the real server: how each way a client
//! resends, regenerates, edits, retries or drops a tool call reaches the
//! upstream and the stored history (README, "How recall decides what is
//! new"). Every test runs with `window_messages = 6`, the configuration of
//! the issue these behaviours were reported in, and asserts both what the
//! scripted upstream received and the exact stored history, superseded
//! messages included.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};

const WINDOW: &str = "[history]\nwindow_messages = 6\n";

async fn start(upstream_extra: &str) -> Harness {
    Harness::start(WINDOW, upstream_extra).await
}

/// Sends `messages` (with the given extra headers) and returns the reply.
async fn send(
    h: &Harness,
    session: &str,
    messages: Vec<Value>,
    headers: &[(&str, &str)],
) -> String {
    let mut req = h
        .client
        .post(format!("{}/v1/chat/completions", h.url))
        .header("x-session-id", session)
        .json(&json!({"model": "m", "messages": messages}));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(status, 200, "{body}");
    body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn line(m: &Value) -> String {
    let content = match &m["content"] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    format!("{}: {content}", m["role"].as_str().unwrap())
}

/// The whole stored history, superseded messages marked. Also checks that
/// each superseded message says when, and that the history read without
/// `include_superseded` is exactly the messages not superseded.
async fn stored(h: &Harness, session: &str) -> Vec<String> {
    let path = format!("/v1/sessions/{session}/history?include_superseded=true");
    let (status, all) = h.api(reqwest::Method::GET, &path, None).await;
    assert_eq!(status, 200, "{all}");
    let mut visible = Vec::new();
    let mut marked = Vec::new();
    for m in all["contents"].as_array().unwrap() {
        if m["metadata"]["superseded"] == true {
            let at = m["metadata"]["superseded_at"].as_i64();
            assert!(
                at.is_some_and(|t| t >= m["timestamp"].as_i64().unwrap()),
                "{m}"
            );
            marked.push(format!("{} [superseded]", line(m)));
        } else {
            assert!(m["metadata"].get("superseded_at").is_none(), "{m}");
            visible.push(line(m));
            marked.push(line(m));
        }
    }
    assert_eq!(h.transcript(session).await, visible);
    marked
}

/// Polls the stored history (superseded included) until `pred` holds for
/// the message at `index`.
async fn wait_for(h: &Harness, session: &str, index: usize, pred: impl Fn(&Value) -> bool) {
    let path = format!("/v1/sessions/{session}/history?include_superseded=true");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, all) = h.api(reqwest::Method::GET, &path, None).await;
        if all["contents"].get(index).is_some_and(&pred) {
            return;
        }
        assert!(Instant::now() < deadline, "{session}[{index}]: {all}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Starts a streaming request and reads until `until` has arrived.
async fn stream_until(
    h: &Harness,
    session: &str,
    messages: Vec<Value>,
    until: &str,
) -> impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> {
    let resp = h
        .post_chat(
            session,
            json!({"model": "m", "stream": true, "messages": messages}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let mut stream = Box::pin(resp.bytes_stream());
    let mut seen = String::new();
    while !seen.contains(until) {
        let chunk = stream.next().await.expect("stream ended early").unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    stream
}

/// Chat APIs reject an assistant `tool_calls` message unless a tool
/// message answers each of its ids right after it.
fn assert_every_call_answered(sent: &Received) {
    let messages = sent.messages();
    for (i, m) in messages.iter().enumerate() {
        let Some(calls) = m.get("tool_calls").and_then(Value::as_array) else {
            continue;
        };
        let answered: Vec<&Value> = messages[i + 1..]
            .iter()
            .take_while(|r| r["role"] == "tool")
            .map(|r| &r["tool_call_id"])
            .collect();
        for call in calls {
            assert!(
                answered.contains(&&call["id"]),
                "unanswered {call}: {:?}",
                sent.body
            );
        }
    }
}

#[tokio::test]
async fn a_regenerate_from_a_full_resend_client_supersedes_the_last_reply() {
    let h = start("").await;
    let sys = system("Be brief.");
    send(&h, "regen", vec![sys.clone(), user("u1")], &[]).await;
    let mut convo = vec![sys, user("u1"), assistant("reply 1"), user("u2")];
    assert_eq!(send(&h, "regen", convo.clone(), &[]).await, "reply 2");
    // "Regenerate": the same conversation again, up to the last user message.
    assert_eq!(send(&h, "regen", convo.clone(), &[]).await, "reply 3");

    assert_eq!(
        h.upstream.last().transcript(),
        [
            "system: Be brief.",
            "user: u1",
            "assistant: reply 1",
            "user: u2"
        ]
    );
    assert_eq!(
        stored(&h, "regen").await,
        [
            "user: u1",
            "assistant: reply 1",
            "user: u2",
            "assistant: reply 2 [superseded]",
            "assistant: reply 3"
        ]
    );
    // The conversation goes on from the new reply; the old one is never
    // sent again.
    convo.extend([assistant("reply 3"), user("u3")]);
    send(&h, "regen", convo, &[]).await;
    assert_eq!(
        h.upstream.last().transcript(),
        [
            "system: Be brief.",
            "user: u1",
            "assistant: reply 1",
            "user: u2",
            "assistant: reply 3",
            "user: u3"
        ]
    );
    assert_eq!(stored(&h, "regen").await.len(), 7);
}

#[tokio::test]
async fn an_edit_of_the_last_message_supersedes_it_and_its_reply() {
    let h = start("").await;
    h.say("edit", "u1").await;
    let sent = vec![user("u1"), assistant("reply 1"), user("u2")];
    send(&h, "edit", sent, &[]).await;
    let edited = vec![user("u1"), assistant("reply 1"), user("u2 (edited)")];
    assert_eq!(send(&h, "edit", edited, &[]).await, "reply 3");

    assert_eq!(
        h.upstream.last().transcript(),
        ["user: u1", "assistant: reply 1", "user: u2 (edited)"]
    );
    assert_eq!(
        stored(&h, "edit").await,
        [
            "user: u1",
            "assistant: reply 1",
            "user: u2 [superseded]",
            "assistant: reply 2 [superseded]",
            "user: u2 (edited)",
            "assistant: reply 3"
        ]
    );
}

#[tokio::test]
async fn a_message_resent_as_text_parts_is_the_same_message() {
    let h = start("").await;
    h.say("parts", "hello there").await;
    let as_parts = json!({"role": "user", "content": [{"type": "text", "text": "hello there"}]});
    let resent = vec![as_parts, assistant("reply 1"), user("and now?")];
    assert_eq!(send(&h, "parts", resent, &[]).await, "reply 2");

    assert_eq!(
        h.upstream.last().transcript(),
        ["user: hello there", "assistant: reply 1", "user: and now?"]
    );
    assert_eq!(
        stored(&h, "parts").await,
        [
            "user: hello there",
            "assistant: reply 1",
            "user: and now?",
            "assistant: reply 2"
        ]
    );
}

#[tokio::test]
async fn an_sdk_retry_after_a_client_timeout_mid_stream_reruns_the_turn() {
    let h = start("").await;
    h.say("timeout", "u1").await;
    let convo = vec![user("u1"), assistant("reply 1"), user("tell me a story")];
    h.upstream.push(sse_text(
        &["Once ", "upon ", "a time."],
        Duration::from_millis(300),
    ));
    h.upstream.push(sse_text(&["The end."], Duration::ZERO));
    // The client's read timeout fires: it drops the connection mid-reply...
    drop(stream_until(&h, "timeout", convo.clone(), "Once ").await);
    wait_for(&h, "timeout", 3, |m| m["metadata"]["interrupted"] == true).await;
    // ...and the SDK sends the same request again.
    drop(stream_until(&h, "timeout", convo, "[DONE]").await);

    let received = h.upstream.received();
    assert_eq!(received.len(), 3);
    assert_eq!(
        received[2].transcript(),
        ["user: u1", "assistant: reply 1", "user: tell me a story"]
    );
    // The drain of the cut reply finishes after the retry; it must not
    // bring the superseded record back.
    wait_for(&h, "timeout", 3, |m| {
        m["metadata"]["original_complete"] == true
    })
    .await;
    assert_eq!(
        stored(&h, "timeout").await,
        [
            "user: u1",
            "assistant: reply 1",
            "user: tell me a story",
            "assistant: Once  [superseded]",
            "assistant: The end."
        ]
    );
    let path = "/v1/sessions/timeout/history?include_superseded=true";
    let (_, all) = h.api(reqwest::Method::GET, path, None).await;
    assert_eq!(all["contents"][3]["metadata"]["cut_by"], "client_gone");
}

#[tokio::test]
async fn an_sdk_retry_header_reruns_a_turn_whose_reply_was_delivered() {
    let h = start("").await;
    h.say("hdr", "u1").await;
    h.say("hdr", "u2").await;
    // A delta client's SDK lost the answer on the way back and retries.
    let reply = send(
        &h,
        "hdr",
        vec![user("u2")],
        &[("x-stainless-retry-count", "1")],
    )
    .await;
    assert_eq!(reply, "reply 3");

    assert_eq!(
        h.upstream.last().transcript(),
        ["user: u1", "assistant: reply 1", "user: u2"]
    );
    assert_eq!(
        stored(&h, "hdr").await,
        [
            "user: u1",
            "assistant: reply 1",
            "user: u2",
            "assistant: reply 2 [superseded]",
            "assistant: reply 3"
        ]
    );
}

#[tokio::test]
async fn an_agent_that_drops_a_tool_call_and_says_something_new_sends_no_unanswered_call() {
    let h = start("").await;
    let call = json!({"id": "call_1", "type": "function",
                      "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}});
    h.upstream.push(Reply::Json {
        status: 200,
        body: json!({"id": "c", "object": "chat.completion", "created": 1, "model": "mock-model",
                     "choices": [{"index": 0, "finish_reason": "tool_calls",
                                  "message": {"role": "assistant", "content": "Let me check.",
                                              "tool_calls": [call.clone()]}}]}),
        headers: vec![],
    });
    h.say("tools", "Weather in Paris?").await;
    h.say("tools", "Never mind, a joke instead").await;

    let sent = h.upstream.last();
    assert_every_call_answered(&sent);
    // The call's text stays; only the unanswered call is left out.
    assert_eq!(
        sent.transcript(),
        [
            "user: Weather in Paris?",
            "assistant: Let me check.",
            "user: Never mind, a joke instead"
        ]
    );
    assert_eq!(
        stored(&h, "tools").await,
        [
            "user: Weather in Paris?",
            "assistant: Let me check.",
            "user: Never mind, a joke instead",
            "assistant: reply 2"
        ]
    );
    let (_, hist) = h.history("tools").await;
    assert_eq!(hist["contents"][1]["tool_calls"], json!([call]));
}

#[tokio::test]
async fn a_long_conversation_is_windowed_from_a_user_message() {
    let h = start("").await;
    for text in ["u1", "u2", "u3"] {
        h.say("long", text).await;
    }
    // Seven stored messages: the newest six would start at "reply 1".
    send(&h, "long", vec![system("Be brief."), user("u4")], &[]).await;

    assert_eq!(
        h.upstream.last().transcript(),
        [
            "system: Be brief.",
            "user: u2",
            "assistant: reply 2",
            "user: u3",
            "assistant: reply 3",
            "user: u4"
        ]
    );
    assert_eq!(
        stored(&h, "long").await,
        [
            "user: u1",
            "assistant: reply 1",
            "user: u2",
            "assistant: reply 2",
            "user: u3",
            "assistant: reply 3",
            "user: u4",
            "assistant: reply 4"
        ]
    );
}

#[tokio::test]
async fn a_barge_in_with_the_same_words_is_a_new_utterance() {
    let h = start("").await;
    let joke = sse_text(&["Why did ", "the scarecrow"], Duration::from_millis(300));
    h.upstream.push(joke);
    let first = stream_until(&h, "barge", vec![user("A joke")], "Why did ").await;
    // The user talks over the bot, saying the same words again.
    assert_eq!(
        send(&h, "barge", vec![user("A joke")], &[]).await,
        "reply 2"
    );
    drop(first);

    assert_eq!(
        h.upstream.last().transcript(),
        ["user: A joke", "assistant: Why did ", "user: A joke"]
    );
    assert_eq!(
        stored(&h, "barge").await,
        [
            "user: A joke",
            "assistant: Why did ",
            "user: A joke",
            "assistant: reply 2"
        ]
    );
    let (_, hist) = h.history("barge").await;
    assert_eq!(hist["contents"][1]["metadata"]["interrupted"], true);
}

#[tokio::test]
async fn a_strict_template_upstream_gets_alternating_roles_after_a_reminder_and_a_failed_call() {
    let h = start("roles = \"alternate\"\n").await;
    h.say("alt", "u1").await;
    // The agent reminds the user through the session API: two assistant
    // messages in a row.
    let reminder = json!({"messages": [assistant("Still there?")]});
    let path = "/v1/sessions/alt/messages";
    let (status, body) = h.api(reqwest::Method::POST, path, Some(reminder)).await;
    assert_eq!(status, 200, "{body}");
    // A delta client's call fails, and it says something else: two user
    // messages in a row.
    h.upstream.push(error_reply(503, "overloaded"));
    let (status, _) = h
        .chat(Some("alt"), json!({"model": "m", "messages": [user("u2")]}))
        .await;
    assert_eq!(status, 503);
    assert_eq!(h.say("alt", "u3").await, "reply 3");

    assert_eq!(
        h.upstream.last().transcript(),
        [
            "user: u1",
            "assistant: reply 1\n\nStill there?",
            "user: u2\n\nu3"
        ]
    );
    assert_eq!(
        stored(&h, "alt").await,
        [
            "user: u1",
            "assistant: reply 1",
            "assistant: Still there?",
            "user: u2",
            "user: u3",
            "assistant: reply 3"
        ]
    );
}
