//! The Responses API over a chat upstream: what the upstream receives for
//! chains, forks, `store: false`, conversations shared with chat, function
//! calls and streams; what is stored; and the bad inputs, which change
//! nothing.

use crate::common;

use std::time::Duration;

use common::*;
use recall::api::responses::ids;
use reqwest::Method;
use serde_json::{json, Value};

async fn respond(h: &Harness, body: Value) -> (u16, Value) {
    h.respond(body).await
}

async fn ok(h: &Harness, body: Value) -> Value {
    h.respond_ok(body).await
}

/// The session a response is kept in.
fn session_of(r: &Value) -> String {
    ids::parse_response(r["id"].as_str().unwrap()).unwrap().0
}

fn output_text(r: &Value) -> String {
    r["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().iter())
        .filter_map(|p| p["text"].as_str())
        .collect()
}

#[tokio::test]
async fn a_chain_sends_the_window_and_keeps_instructions_to_their_own_response() {
    let h = Harness::default().await;
    let r1 = ok(
        &h,
        json!({"model": "m", "input": "My name is Ada.", "instructions": "Be brief."}),
    )
    .await;
    assert_eq!(r1["object"], "response");
    assert_eq!(r1["status"], "completed");
    assert_eq!(output_text(&r1), "reply 1");
    assert_eq!(r1["instructions"], "Be brief.");
    assert_eq!(
        h.upstream.last().transcript(),
        ["system: Be brief.", "user: My name is Ada."]
    );

    let r2 = ok(
        &h,
        json!({"model": "m", "input": "What is my name?", "previous_response_id": r1["id"]}),
    )
    .await;
    assert_eq!(r2["previous_response_id"], r1["id"]);
    // Only the new input was sent; the upstream got the whole window, and
    // the first response's instructions stayed with it.
    assert_eq!(
        h.upstream.last().transcript(),
        [
            "user: My name is Ada.",
            "assistant: reply 1",
            "user: What is my name?"
        ]
    );
    let r3 = ok(
        &h,
        json!({"model": "m", "previous_response_id": r2["id"], "instructions": "In French.",
               "input": [{"role": "user", "content": [{"type": "input_text", "text": "Again?"}]}]}),
    )
    .await;
    assert_eq!(h.upstream.last().transcript().len(), 6);
    assert_eq!(h.upstream.last().transcript()[0], "system: In French.");
    assert_eq!(session_of(&r1), session_of(&r3), "one chain, one session");
    assert_eq!(
        h.transcript(&session_of(&r3)).await,
        [
            "user: My name is Ada.",
            "assistant: reply 1",
            "user: What is my name?",
            "assistant: reply 2",
            r#"user: [{"text":"Again?","type":"text"}]"#,
            "assistant: reply 3"
        ]
    );
}

/// Input items: a developer message before the first other item steers
/// this response only; one after it is input, stored in its place and sent
/// there on the chain's later turns.
#[tokio::test]
async fn a_developer_item_inside_the_input_is_kept_in_place() {
    let h = Harness::default().await;
    let r1 = ok(&h, json!({"model": "m", "input": "joke?"})).await;
    let r2 = ok(
        &h,
        json!({"model": "m", "previous_response_id": r1["id"], "input": [
            {"role": "developer", "content": "Once only."},
            {"role": "user", "content": "again?"},
            {"role": "developer", "content": "Answer in one line."}]}),
    )
    .await;
    assert_eq!(
        h.upstream.last().transcript(),
        [
            "developer: Once only.",
            "user: joke?",
            "assistant: reply 1",
            "user: again?",
            "developer: Answer in one line."
        ]
    );
    let session = session_of(&r2);
    assert_eq!(
        h.transcript(&session).await,
        [
            "user: joke?",
            "assistant: reply 1",
            "user: again?",
            "developer: Answer in one line.",
            "assistant: reply 2"
        ]
    );
    let id = r2["id"].as_str().unwrap();
    let (status, items) = h
        .api(
            Method::GET,
            &format!("/v1/responses/{id}/input_items?order=asc"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{items}");
    let roles: Vec<&str> = items["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "developer"], "{items}");
    ok(
        &h,
        json!({"model": "m", "previous_response_id": r2["id"], "input": "thanks"}),
    )
    .await;
    assert_eq!(
        h.upstream.last().transcript()[3],
        "developer: Answer in one line."
    );
    assert_eq!(h.upstream.last().transcript().len(), 6);
}

#[tokio::test]
async fn continuing_an_older_response_forks_and_leaves_the_other_branch_as_it_was() {
    let h = Harness::default().await;
    let r1 = ok(&h, json!({"model": "m", "input": "one"})).await;
    let r2 = ok(
        &h,
        json!({"model": "m", "input": "two", "previous_response_id": r1["id"]}),
    )
    .await;
    let fork = ok(
        &h,
        json!({"model": "m", "input": "two, otherwise", "previous_response_id": r1["id"]}),
    )
    .await;
    assert_eq!(
        h.upstream.last().transcript(),
        ["user: one", "assistant: reply 1", "user: two, otherwise"]
    );
    assert_ne!(
        session_of(&fork),
        session_of(&r1),
        "a fork is a session of its own"
    );
    // The first branch goes on as if the fork never happened.
    ok(
        &h,
        json!({"model": "m", "input": "three", "previous_response_id": r2["id"]}),
    )
    .await;
    assert_eq!(
        h.upstream.last().transcript(),
        [
            "user: one",
            "assistant: reply 1",
            "user: two",
            "assistant: reply 2",
            "user: three"
        ]
    );
    // And the fork goes on from itself.
    ok(
        &h,
        json!({"model": "m", "input": "fork again", "previous_response_id": fork["id"]}),
    )
    .await;
    assert_eq!(
        h.upstream.last().transcript(),
        [
            "user: one",
            "assistant: reply 1",
            "user: two, otherwise",
            "assistant: reply 3",
            "user: fork again"
        ]
    );
    // Responses of the first branch are still read from it.
    let (status, got) = h
        .api(
            Method::GET,
            &format!("/v1/responses/{}", r2["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(output_text(&got), "reply 2");
}

#[tokio::test]
async fn store_false_runs_with_the_chains_context_and_records_nothing() {
    let h = Harness::default().await;
    let r1 = ok(&h, json!({"model": "m", "input": "one"})).await;
    let before = h.app.sessions.len();
    let r2 = ok(
        &h,
        json!({"model": "m", "input": "aside", "store": false, "previous_response_id": r1["id"]}),
    )
    .await;
    assert_eq!(r2["store"], false);
    assert_eq!(
        h.upstream.last().transcript(),
        ["user: one", "assistant: reply 1", "user: aside"]
    );
    assert_eq!(h.app.sessions.len(), before, "no session was made");
    assert_eq!(
        h.transcript(&session_of(&r1)).await,
        ["user: one", "assistant: reply 1"]
    );
    let (status, _) = h
        .api(
            Method::GET,
            &format!("/v1/responses/{}", r2["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(status, 404);
    // r1 is still the newest of its chain: continuing it appends.
    let r3 = ok(
        &h,
        json!({"model": "m", "input": "two", "previous_response_id": r1["id"]}),
    )
    .await;
    assert_eq!(session_of(&r3), session_of(&r1));
    // Without anything to continue, nothing is kept either.
    ok(&h, json!({"model": "m", "input": "alone", "store": false})).await;
    assert_eq!(h.upstream.last().transcript(), ["user: alone"]);
    assert_eq!(h.app.sessions.len(), before);
}

#[tokio::test]
async fn a_conversation_is_one_memory_for_chat_and_responses() {
    let h = Harness::default().await;
    h.say("talk", "hello from chat").await;
    let r = ok(
        &h,
        json!({"model": "m", "input": "and from responses", "conversation": "talk"}),
    )
    .await;
    assert_eq!(r["conversation"], json!({"id": "talk"}));
    assert_eq!(
        h.upstream.last().transcript(),
        [
            "user: hello from chat",
            "assistant: reply 1",
            "user: and from responses"
        ]
    );
    // A chat client that resends everything it has seen adds only its new
    // message.
    let (status, _) = h
        .chat(
            Some("talk"),
            json!({"model": "m", "messages": [user("hello from chat"), assistant("reply 1"),
                   user("and from responses"), assistant("reply 2"), user("chat again")]}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(h.transcript("talk").await.len(), 6);
    // The conversation's items are the session's messages.
    let (_, items) = h
        .api(
            Method::GET,
            "/v1/conversations/talk/items?order=asc&limit=100",
            None,
        )
        .await;
    let kinds: Vec<_> = items["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            format!(
                "{}:{}",
                i["type"].as_str().unwrap(),
                i["role"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert_eq!(kinds.len(), 6, "{items}");
    assert_eq!(kinds[0], "message:user");
    assert_eq!(
        items["data"][3]["id"], r["output"][0]["id"],
        "one id per item, in both APIs"
    );
}

#[tokio::test]
async fn a_function_call_round_trip() {
    let h = Harness::default().await;
    h.upstream.push(Reply::Json {
        status: 200,
        body: json!({"id": "c", "object": "chat.completion", "model": "mock-model",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": null,
                "tool_calls": [{"id": "call_7", "type": "function",
                    "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}]}}]}),
        headers: vec![],
    });
    let tools = json!([{"type": "function", "name": "weather", "description": "the weather",
                        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let r1 = ok(
        &h,
        json!({"model": "m", "input": "Weather in Paris?", "tools": tools}),
    )
    .await;
    let sent = h.upstream.last().body;
    assert_eq!(sent["tools"][0]["function"]["name"], "weather");
    assert_eq!(r1["output"][0]["type"], "function_call");
    assert_eq!(r1["output"][0]["call_id"], "call_7");
    assert_eq!(r1["tools"], tools);

    let r2 = ok(
        &h,
        json!({"model": "m", "previous_response_id": r1["id"], "tools": tools,
               "input": [{"type": "function_call_output", "call_id": "call_7", "output": "22C"}]}),
    )
    .await;
    let sent = h.upstream.last();
    let msgs = sent.messages();
    assert_eq!(msgs.len(), 3, "{msgs:?}");
    assert_eq!(msgs[1]["tool_calls"][0]["id"], "call_7");
    assert_eq!(msgs[2]["role"], "tool");
    assert_eq!(msgs[2]["tool_call_id"], "call_7");
    assert_eq!(output_text(&r2), "reply 2");
}

/// The SSE events of a Responses stream: (type, data).
fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let kind = e.lines().find_map(|l| l.strip_prefix("event: ")).unwrap();
            let data = e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
            (kind.to_owned(), serde_json::from_str(data).unwrap())
        })
        .collect()
}

/// A streamed response to "hi": its body and its events.
async fn streamed(h: &Harness) -> (String, Vec<(String, Value)>) {
    let resp = h
        .client
        .post(format!("{}/v1/responses", h.url))
        .json(&json!({"model": "m", "input": "hi", "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.text().await.unwrap();
    let evs = events(&body);
    (body, evs)
}

#[tokio::test]
async fn a_stream_comes_as_responses_events_in_order_and_is_stored() {
    let h = Harness::default().await;
    h.upstream
        .push(sse_text(&["Hel", "lo ", "there"], Duration::from_millis(5)));
    let (body, evs) = streamed(&h).await;
    assert!(!body.contains("[DONE]"));
    let kinds: Vec<&str> = evs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    for (n, (kind, data)) in evs.iter().enumerate() {
        assert_eq!(data["type"], kind.as_str());
        assert_eq!(data["sequence_number"], n);
    }
    let done = &evs.last().unwrap().1["response"];
    assert_eq!(output_text(done), "Hello there");
    assert_eq!(done["usage"]["total_tokens"], 5);
    let (status, got) = h
        .api(
            Method::GET,
            &format!("/v1/responses/{}", done["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(got["status"], "completed");
    assert_eq!(output_text(&got), "Hello there");
    assert_eq!(got["output"][0]["id"], done["output"][0]["id"]);
}

/// A Responses stream whose upstream fails ends in `response.failed` with
/// the failure's code, after the text that went out: for an upstream that
/// breaks off in the middle of an event (the relayed half of it must not
/// swallow recall's error event) and for an upstream's own error event.
#[tokio::test]
async fn a_stream_whose_upstream_fails_ends_in_response_failed_with_its_code() {
    let h = Harness::default().await;
    let half = delta_event(json!({"content": "lost words"}));
    let broken = Reply::Sse {
        chunks: vec![
            (Duration::ZERO, delta_event(json!({"content": "Half a "}))),
            (Duration::from_millis(20), half[..half.len() / 2].to_owned()),
            (Duration::from_millis(20), BREAK.to_owned()),
        ],
    };
    let upstream_error = Reply::Sse {
        chunks: vec![
            (Duration::ZERO, delta_event(json!({"content": "Half a "}))),
            (
                Duration::from_millis(20),
                format!(
                    "data: {}\n\n",
                    json!({"error": {"message": "overloaded", "type": "server_error", "code": "server_overloaded"}})
                ),
            ),
        ],
    };
    for (reply, code, message) in [
        (broken, "stream_broken", "broke off"),
        (upstream_error, "server_overloaded", "overloaded"),
    ] {
        h.upstream.push(reply);
        let (body, evs) = streamed(&h).await;
        let deltas: String = evs
            .iter()
            .filter(|(k, _)| k == "response.output_text.delta")
            .map(|(_, d)| d["delta"].as_str().unwrap())
            .collect();
        assert_eq!(deltas, "Half a ", "{body}");
        let (kind, last) = evs.last().unwrap();
        assert_eq!(kind, "response.failed", "{body}");
        let error = &last["response"]["error"];
        assert_eq!(error["code"], code, "{body}");
        let text = error["message"].as_str().unwrap();
        assert!(text.contains(message), "{text}");
    }
}

#[tokio::test]
async fn a_stream_cut_by_its_client_is_stored_as_an_interrupted_response() {
    let h = Harness::default().await;
    h.upstream.push(sse_text(
        &["Once ", "upon ", "a ", "time ", "there ", "was"],
        Duration::from_millis(150),
    ));
    let (stream, seen) = stream_response(
        &h,
        json!({"model": "m", "input": "tell me a story", "stream": true}),
        "upon",
    )
    .await;
    let id = events(&seen)[0].1["response"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    drop(stream);
    let path = format!("/v1/responses/{id}");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let got = loop {
        let (_, got) = h.api(Method::GET, &path, None).await;
        if got["status"] == "incomplete" {
            break got;
        }
        assert!(std::time::Instant::now() < deadline, "{got}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(got["incomplete_details"]["reason"], "interrupted");
    let heard = output_text(&got);
    assert!(heard.starts_with("Once upon"), "{heard}");
    assert_eq!(got["output"][0]["metadata"]["interrupted"], true);
    // The next response continues from what was heard.
    ok(
        &h,
        json!({"model": "m", "input": "go on", "previous_response_id": id}),
    )
    .await;
    let sent = h.upstream.last().transcript();
    assert!(sent[1].starts_with("assistant: Once upon"), "{sent:?}");
    assert!(!sent[1].contains("was"), "{sent:?}");
}

#[tokio::test]
async fn bad_inputs_are_refused_and_change_nothing() {
    let h = Harness::default().await;
    let r1 = ok(&h, json!({"model": "m", "input": "one"})).await;
    let chain = session_of(&r1);
    let calls = h.upstream.received().len();
    let sessions = h.app.sessions.len();
    let cases = [
        (
            json!({"model": "m", "input": "x", "previous_response_id": r1["id"], "conversation": chain}),
            400,
            "previous_response_id",
        ),
        (
            json!({"model": "m", "input": "x", "previous_response_id": "resp_bm9uZQ_00"}),
            404,
            "previous_response_id",
        ),
        (
            json!({"model": "m", "input": "x", "previous_response_id": "nonsense"}),
            404,
            "previous_response_id",
        ),
        (
            json!({"model": "m", "input": "x", "conversation": "no-such"}),
            404,
            "conversation",
        ),
        (
            json!({"model": "m", "input": [{"type": "computer_call"}]}),
            400,
            "input[0]",
        ),
        (
            json!({"model": "m", "input": [{"role": "user"}]}),
            400,
            "input[0]",
        ),
        (
            json!({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}),
            400,
            "tools[0]",
        ),
        (
            json!({"model": "m", "input": "x", "background": true}),
            400,
            "background",
        ),
        (
            json!({"model": "m", "instructions": "only instructions"}),
            400,
            "input",
        ),
    ];
    for (body, status, param) in cases {
        let (got, err) = respond(&h, body.clone()).await;
        assert_eq!(got, status, "{body} -> {err}");
        assert_eq!(err["error"]["param"], param, "{body} -> {err}");
        assert!(err["error"]["message"].is_string());
    }
    // The previous response of another session, named by a valid id.
    let other = ids::response(&chain, "0000");
    let (got, _) = respond(
        &h,
        json!({"model": "m", "input": "x", "previous_response_id": other}),
    )
    .await;
    assert_eq!(got, 404);
    assert_eq!(
        h.upstream.received().len(),
        calls,
        "the upstream was not called"
    );
    assert_eq!(h.app.sessions.len(), sessions, "no session was made");
    assert_eq!(
        h.transcript(&chain).await,
        ["user: one", "assistant: reply 1"]
    );
}

#[tokio::test]
async fn a_response_is_read_listed_and_deleted() {
    let h = Harness::default().await;
    let r1 = ok(
        &h,
        json!({"model": "m", "metadata": {"k": "v"}, "input": [
            {"role": "user", "content": "first"},
            {"role": "user", "content": "second"},
            {"role": "user", "content": "third"}]}),
    )
    .await;
    let id = r1["id"].as_str().unwrap();
    let (status, got) = h
        .api(Method::GET, &format!("/v1/responses/{id}"), None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(got["metadata"], json!({"k": "v"}));
    // The stored items also carry recall's fields (turn_id, timestamp, metadata).
    assert_eq!(got["output"][0]["id"], r1["output"][0]["id"]);
    assert_eq!(got["output"][0]["content"], r1["output"][0]["content"]);
    assert_eq!(got["output"][0]["turn_id"], 3);

    let (_, page1) = h
        .api(
            Method::GET,
            &format!("/v1/responses/{id}/input_items?limit=2"),
            None,
        )
        .await;
    let texts = |p: &Value| -> Vec<String> {
        p["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["content"][0]["text"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        texts(&page1),
        ["third", "second"],
        "newest first by default"
    );
    assert_eq!(page1["has_more"], true);
    let after = page1["last_id"].as_str().unwrap();
    let (_, page2) = h
        .api(
            Method::GET,
            &format!("/v1/responses/{id}/input_items?limit=2&after={after}"),
            None,
        )
        .await;
    assert_eq!(texts(&page2), ["first"]);
    assert_eq!(page2["has_more"], false);

    let (status, deleted) = h
        .api(Method::DELETE, &format!("/v1/responses/{id}"), None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        deleted,
        json!({"id": id, "object": "response", "deleted": true})
    );
    let (status, _) = h
        .api(Method::GET, &format!("/v1/responses/{id}"), None)
        .await;
    assert_eq!(status, 404);
    let (status, _) = respond(
        &h,
        json!({"model": "m", "input": "x", "previous_response_id": id}),
    )
    .await;
    assert_eq!(status, 404, "a deleted response is not continued");
    let (status, _) = h
        .api(Method::DELETE, &format!("/v1/responses/{id}"), None)
        .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn conversations_are_created_read_updated_listed_and_deleted() {
    let h = Harness::default().await;
    let (status, c) = h
        .api(
            Method::POST,
            "/v1/conversations",
            Some(json!({"metadata": {"topic": "tea"}, "items": [
                {"type": "message", "role": "user", "content": "I like green tea."},
                {"type": "message", "role": "assistant", "content": "Noted."}]})),
        )
        .await;
    assert_eq!(status, 200, "{c}");
    let id = c["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("conv_"));
    assert_eq!(c["object"], "conversation");
    assert_eq!(c["metadata"], json!({"topic": "tea"}));

    ok(
        &h,
        json!({"model": "m", "input": "What do I like?", "conversation": {"id": id}}),
    )
    .await;
    assert_eq!(
        h.upstream.last().transcript(),
        [
            "user: I like green tea.",
            "assistant: Noted.",
            "user: What do I like?"
        ]
    );
    let (status, added) = h
        .api(
            Method::POST,
            &format!("/v1/conversations/{id}/items"),
            Some(json!({"items": [{"role": "user", "content": "Also coffee."}]})),
        )
        .await;
    assert_eq!(status, 200, "{added}");
    let item = added["data"][0]["id"].as_str().unwrap().to_owned();
    let (status, got) = h
        .api(
            Method::GET,
            &format!("/v1/conversations/{id}/items/{item}"),
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(got["content"][0]["text"], "Also coffee.");

    let (_, list) = h
        .api(
            Method::GET,
            &format!("/v1/conversations/{id}/items?limit=1"),
            None,
        )
        .await;
    assert_eq!(list["data"][0]["id"], item.as_str(), "newest first");
    assert_eq!(list["has_more"], true);

    // A deleted item leaves what the model sees.
    let first = {
        let (_, all) = h
            .api(
                Method::GET,
                &format!("/v1/conversations/{id}/items?order=asc"),
                None,
            )
            .await;
        all["data"][0]["id"].as_str().unwrap().to_owned()
    };
    let (status, _) = h
        .api(
            Method::DELETE,
            &format!("/v1/conversations/{id}/items/{first}"),
            None,
        )
        .await;
    assert_eq!(status, 200);
    let (status, _) = h
        .api(
            Method::GET,
            &format!("/v1/conversations/{id}/items/{first}"),
            None,
        )
        .await;
    assert_eq!(status, 404);
    ok(
        &h,
        json!({"model": "m", "input": "And now?", "conversation": id}),
    )
    .await;
    let sent = h.upstream.last().transcript();
    assert!(!sent.iter().any(|m| m.contains("green tea")), "{sent:?}");

    let (status, c) = h
        .api(
            Method::POST,
            &format!("/v1/conversations/{id}"),
            Some(json!({"metadata": {"topic": "coffee"}})),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(c["metadata"], json!({"topic": "coffee"}));
    let (_, c) = h
        .api(Method::GET, &format!("/v1/conversations/{id}"), None)
        .await;
    assert_eq!(c["metadata"], json!({"topic": "coffee"}));

    let (status, gone) = h
        .api(Method::DELETE, &format!("/v1/conversations/{id}"), None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(gone["deleted"], true);
    let (status, err) = h
        .api(Method::GET, &format!("/v1/conversations/{id}"), None)
        .await;
    assert_eq!(status, 404);
    assert_eq!(err["error"]["code"], "conversation_not_found");
    let (status, _) = respond(&h, json!({"model": "m", "input": "x", "conversation": id})).await;
    assert_eq!(status, 404, "never a silent fresh start");
}

#[tokio::test]
async fn conversation_requests_are_checked() {
    let h = Harness::default().await;
    let too_many: Vec<Value> = (0..21)
        .map(|i| json!({"role": "user", "content": format!("{i}")}))
        .collect();
    for (body, param) in [
        (json!({"items": too_many}), "items"),
        (
            json!({"items": [{"role": "system", "content": "x"}]}),
            "items",
        ),
        (json!({"metadata": {"k": 1}}), "metadata"),
        (json!({"items": [{"type": "nope"}]}), "items[0]"),
    ] {
        let (status, err) = h
            .api(Method::POST, "/v1/conversations", Some(body.clone()))
            .await;
        assert_eq!(status, 400, "{body} -> {err}");
        assert_eq!(err["error"]["param"], param, "{body} -> {err}");
    }
    assert_eq!(h.app.sessions.len(), 0);
}

/// Starts a streamed response and reads until `until` has arrived.
async fn stream_response(h: &Harness, body: Value, until: &str) -> (ByteStream, String) {
    let resp = h
        .client
        .post(format!("{}/v1/responses", h.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    read_until(resp, until).await
}

fn slow_story() -> Reply {
    sse_text(
        &[
            "Once ", "upon ", "a ", "time ", "there ", "was ", "a ", "fox",
        ],
        Duration::from_millis(150),
    )
}

#[tokio::test]
async fn a_newer_response_cuts_the_one_streaming_and_sees_what_was_heard() {
    let h = Harness::default().await;
    let r1 = ok(&h, json!({"model": "m", "input": "hi"})).await;
    h.upstream.push(slow_story());
    let (stream, seen) = stream_response(
        &h,
        json!({"model": "m", "input": "a story", "stream": true, "previous_response_id": r1["id"]}),
        "upon",
    )
    .await;
    let cut_id = events(&seen)[0].1["response"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // The user barges in: the next response continues from the one in flight.
    ok(
        &h,
        json!({"model": "m", "input": "stop, a poem instead", "previous_response_id": cut_id}),
    )
    .await;
    let rest = read_rest(stream).await;
    let all = events(&format!("{seen}{rest}"));
    let (last, data) = all.last().unwrap();
    assert_eq!(last, "response.incomplete", "{rest}");
    assert_eq!(
        data["response"]["incomplete_details"]["reason"],
        "interrupted"
    );
    let sent = h.upstream.last().transcript();
    assert_eq!(sent.len(), 5, "{sent:?}");
    assert!(sent[3].starts_with("assistant: Once upon"), "{sent:?}");
    assert!(!sent[3].contains("fox"), "{sent:?}");
    let (_, got) = h
        .api(Method::GET, &format!("/v1/responses/{cut_id}"), None)
        .await;
    assert_eq!(got["status"], "incomplete");
    assert_eq!(got["output"][0]["metadata"]["cut_by"], "new_request");
}

#[tokio::test]
async fn the_interrupt_endpoint_cuts_a_streamed_response_where_the_user_stopped_hearing() {
    let h = Harness::default().await;
    h.upstream.push(slow_story());
    let (stream, seen) = stream_response(
        &h,
        json!({"model": "m", "input": "a story", "stream": true}),
        "upon",
    )
    .await;
    let id = events(&seen)[0].1["response"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let chain = ids::parse_response(&id).unwrap().0;
    let (status, _) = h
        .api(
            Method::POST,
            &format!("/v1/sessions/{chain}/interrupt"),
            Some(json!({"spoken": "Once"})),
        )
        .await;
    assert_eq!(status, 200);
    let rest = read_rest(stream).await;
    let all = events(&format!("{seen}{rest}"));
    assert_eq!(all.last().unwrap().0, "response.incomplete");
    let (_, got) = h
        .api(Method::GET, &format!("/v1/responses/{id}"), None)
        .await;
    assert_eq!(got["status"], "incomplete");
    assert_eq!(output_text(&got), "Once");
    assert!(got["output"][0]["metadata"]["original"]
        .as_str()
        .is_some_and(|o| o.starts_with("Once upon")));
}

async fn retry(h: &Harness, body: Value) -> Value {
    let resp = h
        .client
        .post(format!("{}/v1/responses", h.url))
        .header("x-stainless-retry-count", "1")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

#[tokio::test]
async fn an_sdk_retry_runs_the_response_once_in_a_chain_and_in_a_conversation() {
    let h = Harness::default().await;
    let r1 = ok(&h, json!({"model": "m", "input": "one"})).await;
    let body = json!({"model": "m", "input": "two", "previous_response_id": r1["id"]});
    // The first attempt was answered, but the client never saw it.
    ok(&h, body.clone()).await;
    let again = retry(&h, body).await;
    assert_eq!(session_of(&again), session_of(&r1), "a retry is not a fork");
    assert_eq!(
        h.upstream.last().transcript(),
        ["user: one", "assistant: reply 1", "user: two"]
    );
    assert_eq!(
        h.transcript(&session_of(&r1)).await,
        [
            "user: one",
            "assistant: reply 1",
            "user: two",
            "assistant: reply 3"
        ]
    );
    // In a conversation: the first attempt's upstream call failed (its
    // failure is recorded), and the SDK retries.
    h.say("conv-retry", "hello").await;
    let body = json!({"model": "m", "input": "more", "conversation": "conv-retry"});
    h.upstream.push(error_reply(500, "boom"));
    let (status, _) = respond(&h, body.clone()).await;
    assert_eq!(status, 500);
    retry(&h, body.clone()).await;
    assert_eq!(
        h.upstream.last().transcript(),
        ["user: hello", "assistant: reply 4", "user: more"]
    );
    assert_eq!(h.transcript("conv-retry").await.len(), 4);
    // A retry whose first attempt never got stored (refused at the door)
    // finds the newest turn answered: the user said the same twice.
    retry(&h, body).await;
    assert_eq!(h.transcript("conv-retry").await.len(), 6);
}

#[tokio::test]
async fn the_session_header_and_the_path_form_name_a_conversation_as_in_chat() {
    let h = Harness::default().await;
    for text in ["one", "two"] {
        let resp = h
            .client
            .post(format!("{}/v1/responses", h.url))
            .header("x-session-id", "by-header")
            .json(&json!({"model": "m", "input": text}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    assert_eq!(
        h.upstream.last().transcript(),
        ["user: one", "assistant: reply 1", "user: two"]
    );
    for text in ["three", "four"] {
        let resp = h
            .client
            .post(format!("{}/sessions/by-path/v1/responses", h.url))
            .json(&json!({"model": "m", "input": text}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    assert_eq!(
        h.upstream.last().transcript(),
        ["user: three", "assistant: reply 3", "user: four"]
    );
    assert_eq!(h.transcript("by-path").await.len(), 4);
}

#[tokio::test]
async fn a_fork_leaves_the_other_branchs_reply_streaming() {
    let h = Harness::default().await;
    let r1 = ok(&h, json!({"model": "m", "input": "one"})).await;
    h.upstream.push(slow_story());
    let (stream, seen) = stream_response(
        &h,
        json!({"model": "m", "input": "a story", "stream": true, "previous_response_id": r1["id"]}),
        "upon",
    )
    .await;
    // Another branch from r1 while r2 streams.
    let fork = ok(
        &h,
        json!({"model": "m", "input": "something else", "previous_response_id": r1["id"]}),
    )
    .await;
    assert_ne!(session_of(&fork), session_of(&r1));
    let rest = read_rest(stream).await;
    let all = events(&format!("{seen}{rest}"));
    let (last, data) = all.last().unwrap();
    assert_eq!(last, "response.completed", "{rest}");
    assert_eq!(
        output_text(&data["response"]),
        "Once upon a time there was a fox"
    );
}

#[tokio::test]
async fn a_response_mark_sent_by_a_client_is_not_kept() {
    let h = Harness::default().await;
    let forged = json!({"role": "user", "content": "hi",
                        "metadata": {"response": {"key": "00", "input_items": 1}, "note": "kept"}});
    let (status, _) = h
        .chat(Some("forger"), json!({"model": "m", "messages": [forged]}))
        .await;
    assert_eq!(status, 200);
    let (_, hist) = h.history("forger").await;
    assert_eq!(hist["contents"][0]["metadata"]["note"], "kept");
    assert!(hist["contents"][0]["metadata"].get("response").is_none());
    let (status, _) = respond(
        &h,
        json!({"model": "m", "input": "x", "previous_response_id": ids::response("forger", "00")}),
    )
    .await;
    assert_eq!(status, 404);
}

/// JSON allows a key twice (a `Value` keeps the last one): an upstream
/// that repeats one gets its Response through, with the last value, and
/// the reply is stored as the chat API would store it.
#[tokio::test]
async fn a_completion_that_repeats_a_key_is_answered_not_a_500() {
    let h = Harness::default().await;
    h.upstream.push(Reply::Raw {
        status: 200,
        content_type: "application/json",
        body: r#"{"id": "c", "object": "chat.completion", "model": "old", "model": "new",
            "choices": [{"index": 0, "finish_reason": "stop",
              "message": {"role": "assistant", "content": "first", "content": "last"}}],
            "usage": {"total_tokens": 1}, "usage": {"total_tokens": 2}}"#
            .into(),
    });
    let r = ok(&h, json!({"model": "m", "input": "hi"})).await;
    assert_eq!(r["model"], "new");
    assert_eq!(output_text(&r), "last");
    assert_eq!(r["usage"]["total_tokens"], 2);
    let (_, hist) = h.history(&session_of(&r)).await;
    assert_eq!(hist["contents"][1]["content"], "last", "{hist}");
}
