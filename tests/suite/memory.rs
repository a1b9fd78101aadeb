//! Multi-turn memory through the real server: what the upstream receives and
//! what the history endpoint shows.

use crate::common;

use common::*;
use serde_json::{json, Value};

#[tokio::test]
async fn delta_client_gets_the_conversation_remembered() {
    let h = Harness::default().await;
    assert_eq!(h.say("s1", "hi").await, "reply 1");
    assert_eq!(h.say("s1", "how are you?").await, "reply 2");
    assert_eq!(h.say("s1", "bye").await, "reply 3");

    let sent = h.upstream.received();
    assert_eq!(sent[0].transcript(), ["user: hi"]);
    assert_eq!(
        sent[2].transcript(),
        [
            "user: hi",
            "assistant: reply 1",
            "user: how are you?",
            "assistant: reply 2",
            "user: bye"
        ]
    );

    let (_, hist) = h.history("s1").await;
    assert_eq!(hist["session_id"], "s1");
    assert_eq!(hist["turn_id"], 3);
    let contents = hist["contents"].as_array().unwrap();
    assert_eq!(contents.len(), 6);
    let turns: Vec<u64> = contents
        .iter()
        .map(|m| m["turn_id"].as_u64().unwrap())
        .collect();
    assert_eq!(turns, [1, 1, 2, 2, 3, 3]);
    let sources: Vec<&str> = contents
        .iter()
        .map(|m| m["metadata"]["source"].as_str().unwrap())
        .collect();
    assert_eq!(
        sources,
        ["message", "llm", "message", "llm", "message", "llm"]
    );
    assert!(contents
        .iter()
        .all(|m| m["timestamp"].as_i64().unwrap() > 1_600_000_000_000));
}

#[tokio::test]
async fn full_resend_client_causes_no_duplicates() {
    let h = Harness::default().await;
    let mut convo = vec![user("one")];
    for i in 1..=3 {
        let (status, body) = h
            .chat(
                Some("resend"),
                json!({"model": "m", "messages": convo.clone()}),
            )
            .await;
        assert_eq!(status, 200);
        convo.push(body["choices"][0]["message"].clone());
        convo.push(user(&format!("next {i}")));
    }
    // The upstream saw exactly the conversation, once.
    let last = h.upstream.last();
    assert_eq!(
        last.transcript(),
        [
            "user: one",
            "assistant: reply 1",
            "user: next 1",
            "assistant: reply 2",
            "user: next 2"
        ]
    );
    assert_eq!(
        h.transcript("resend").await,
        [
            "user: one",
            "assistant: reply 1",
            "user: next 1",
            "assistant: reply 2",
            "user: next 2",
            "assistant: reply 3"
        ]
    );
    // A client that resends only a recent slice appends only what is new.
    let (status, _) = h
        .chat(
            Some("resend"),
            json!({"model": "m", "messages": [user("next 2"), assistant("reply 3"), user("last")]}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(h.transcript("resend").await.len(), 8);
}

#[tokio::test]
async fn system_messages_come_first_in_order_and_are_not_stored() {
    let h = Harness::start(
        "[[system_messages]]\ncontent = \"config one\"\n\n[[system_messages]]\nrole = \"developer\"\ncontent = \"config two\"\n",
        "",
    )
    .await;
    h.say("sys", "first").await;
    let (status, _) = h
        .chat(
            Some("sys"),
            json!({"model": "m", "messages": [system("from request"), user("second")]}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        h.upstream.last().transcript(),
        [
            "system: config one",
            "developer: config two",
            "system: from request",
            "user: first",
            "assistant: reply 1",
            "user: second"
        ]
    );
    assert_eq!(
        h.transcript("sys").await,
        [
            "user: first",
            "assistant: reply 1",
            "user: second",
            "assistant: reply 2"
        ]
    );
}

fn developer(text: &str) -> Value {
    json!({"role": "developer", "content": text})
}

const NOTE: &str = "Your reply was cut off: ask the user to repeat.";

/// A framework that resends its whole context adds a one-off note after a
/// reply (Pipecat, when a barge-in yields no transcript) and keeps it in
/// every later request: it is stored once, in its place, and sent there,
/// never as a standing instruction ahead of the history.
#[tokio::test]
async fn a_note_inside_the_conversation_keeps_its_place() {
    let h = Harness::start("[[system_messages]]\ncontent = \"config\"\n", "").await;
    let prompt = system("Be kind.");
    let mut context = vec![prompt.clone(), user("joke?")];
    let (status, _) = h
        .chat(Some("note"), json!({"model": "m", "messages": context}))
        .await;
    assert_eq!(status, 200);
    context.extend([assistant("reply 1"), developer(NOTE)]);
    let (status, _) = h
        .chat(Some("note"), json!({"model": "m", "messages": context}))
        .await;
    assert_eq!(status, 200);
    let in_place = [
        "system: config",
        "system: Be kind.",
        "user: joke?",
        "assistant: reply 1",
        &format!("developer: {NOTE}"),
    ];
    assert_eq!(h.upstream.last().transcript(), in_place);
    context.extend([assistant("reply 2"), user("a story")]);
    let (status, _) = h
        .chat(Some("note"), json!({"model": "m", "messages": context}))
        .await;
    assert_eq!(status, 200);
    let mut expected: Vec<String> = in_place.iter().map(|s| s.to_string()).collect();
    expected.extend(["assistant: reply 2".into(), "user: a story".into()]);
    assert_eq!(h.upstream.last().transcript(), expected);
    assert_eq!(
        h.transcript("note").await,
        [
            "user: joke?",
            "assistant: reply 1",
            &format!("developer: {NOTE}"),
            "assistant: reply 2",
            "user: a story",
            "assistant: reply 3"
        ]
    );
    // A delta client's next turn sees it in its place too.
    h.say("note", "the end?").await;
    let sent = h.upstream.last().transcript();
    let note = format!("developer: {NOTE}");
    let head = ["system: config", "user: joke?", "assistant: reply 1", &note];
    assert_eq!(sent[..4], head);
    assert_eq!(sent.len(), 8, "{sent:?}");
}

/// Once the window starts after the note, it goes with the messages
/// around it; it never moves to the top.
#[tokio::test]
async fn a_note_leaves_the_window_with_its_neighbours() {
    let h = Harness::start("[history]\nwindow_messages = 3\n", "").await;
    let mut context = vec![user("joke?"), assistant("reply 0"), developer(NOTE)];
    h.upstream.push(completion("Say again?"));
    let (status, _) = h
        .chat(Some("w"), json!({"model": "m", "messages": context}))
        .await;
    assert_eq!(status, 200);
    context.extend([assistant("Say again?"), user("a story")]);
    let (status, _) = h
        .chat(Some("w"), json!({"model": "m", "messages": context}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(h.upstream.last().transcript(), ["user: a story"]);
    assert_eq!(h.transcript("w").await.len(), 6);
}

#[tokio::test]
async fn window_by_count_sends_only_the_newest_messages() {
    let h = Harness::start(
        "[history]\nwindow_messages = 3\nmax_messages = 5\n[[system_messages]]\ncontent = \"sys\"\n",
        "",
    )
    .await;
    for t in ["a", "b", "c", "d"] {
        h.say("w", t).await;
    }
    assert_eq!(
        h.upstream.last().transcript(),
        ["system: sys", "user: c", "assistant: reply 3", "user: d"]
    );
    assert!(h.app.metrics.trimmed_sent() > 0);
    // The session keeps at most five messages, oldest dropped first.
    let kept = h.transcript("w").await;
    assert_eq!(
        kept,
        [
            "assistant: reply 2",
            "user: c",
            "assistant: reply 3",
            "user: d",
            "assistant: reply 4"
        ]
    );
    assert!(h.app.metrics.trimmed_kept() >= 3);
}

#[tokio::test]
async fn window_by_chars_bounds_the_history_but_keeps_the_newest_user_message() {
    let h = Harness::start("[history]\nwindow_chars = 20\n", "").await;
    h.upstream.push(completion("0123456789"));
    h.say("c", "abcdefghij").await; // 10 + 10 chars
    h.say("c", "xyz").await;
    // 3 + 10 fit in 20; adding "abcdefghij" would not, and a window that
    // is cut starts with a user message.
    assert_eq!(h.upstream.last().transcript(), ["user: xyz"]);
    let long = "L".repeat(50);
    h.say("c", &long).await;
    assert_eq!(h.upstream.last().transcript(), [format!("user: {long}")]);
}

fn tool_result(id: &str, text: &str) -> Value {
    json!({"role": "tool", "tool_call_id": id, "content": text})
}

#[tokio::test]
async fn tool_call_groups_are_never_split() {
    let h = Harness::start("[history]\nwindow_messages = 3\n", "").await;
    h.say("t", "hello").await;
    // The agent's tool loop: the model asks for two tools, the agent answers.
    h.upstream.push(Reply::Json {
        status: 200,
        body: json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "time", "arguments": "{}"}}]}}]}),
        headers: vec![],
    });
    h.say("t", "weather and time?").await;
    let (status, _) = h
        .chat(
            Some("t"),
            json!({"model": "m", "messages": [tool_result("c1", "sunny"), tool_result("c2", "noon")]}),
        )
        .await;
    assert_eq!(status, 200);
    // The turn in progress is four messages: over the limit of three, but a
    // tool loop is sent whole, from the question that started it.
    assert_eq!(
        h.upstream.last().transcript(),
        [
            "user: weather and time?",
            "assistant: <null>",
            "tool: sunny",
            "tool: noon"
        ]
    );
    let stored = h.history("t").await.1;
    let call = &stored["contents"][3];
    assert_eq!(call["tool_calls"][1]["id"], "c2");
    assert_eq!(call["turn_id"], stored["contents"][2]["turn_id"]);
    assert_eq!(stored["contents"][4]["turn_id"], call["turn_id"]);

    // A full-resend client that includes the tool loop causes no duplicates.
    let (status, _) = h
        .chat(
            Some("t"),
            json!({"model": "m", "messages": [
                user("weather and time?"), stored["contents"][3].clone(),
                tool_result("c1", "sunny"), tool_result("c2", "noon"),
                assistant("reply 3"), user("thanks")]}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(h.transcript("t").await.len(), 9);
    // Three messages would start at the second tool result, and a window
    // that is cut starts with a user message.
    assert_eq!(h.upstream.last().transcript(), ["user: thanks"]);
}

#[tokio::test]
async fn the_session_id_can_come_from_path_header_or_body() {
    let h = Harness::default().await;
    let resp = h
        .client
        .post(format!("{}/sessions/p1/v1/chat/completions", h.url))
        .json(&json!({"model": "m", "messages": [user("via path")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    h.chat(
        None,
        json!({"model": "m", "session_id": "b1", "messages": [user("via body")]}),
    )
    .await;
    h.say("h1", "via header").await;
    assert_eq!(h.transcript("p1").await[0], "user: via path");
    assert_eq!(h.transcript("b1").await[0], "user: via body");
    assert_eq!(h.transcript("h1").await[0], "user: via header");
    // The body field is recall's, not OpenAI's: it does not go upstream.
    assert!(h.upstream.received()[1].body.get("session_id").is_none());

    // The path form wins over the header, and its history route works too.
    let resp = h
        .client
        .post(format!("{}/sessions/p1/v1/chat/completions", h.url))
        .header("x-session-id", "h1")
        .json(&json!({"model": "m", "messages": [user("again")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(h.transcript("p1").await.len(), 4);
    let via_prefix: Value = h
        .client
        .get(format!("{}/sessions/p1/v1/sessions/h1/history", h.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(via_prefix["session_id"], "h1");
}

#[tokio::test]
async fn without_a_session_nothing_is_remembered() {
    let h = Harness::default().await;
    let convo =
        json!({"model": "m", "messages": [user("a"), assistant("b"), user("c")], "turn_id": 4});
    let (status, _) = h.chat(None, convo.clone()).await;
    assert_eq!(status, 200);
    h.chat(None, convo).await;
    assert_eq!(
        h.upstream.last().transcript(),
        ["user: a", "assistant: b", "user: c"]
    );
    assert!(h.upstream.last().body.get("turn_id").is_none());
    assert!(h.app.sessions.is_empty());
}

#[tokio::test]
async fn session_required_rejects_requests_without_one() {
    let h = Harness::start(
        "[session]\nrequired = true\nheader = \"x-agent-session\"\n",
        "",
    )
    .await;
    let (status, body) = h
        .chat(None, json!({"model": "m", "messages": [user("a")]}))
        .await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("x-agent-session"),
        "{body}"
    );
    assert!(h.upstream.received().is_empty());
    // The configured header is the one that counts.
    let resp = h
        .client
        .post(format!("{}/v1/chat/completions", h.url))
        .header("x-agent-session", "ok")
        .json(&json!({"model": "m", "messages": [user("a")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(h.transcript("ok").await.len(), 2);
}

#[tokio::test]
async fn unknown_session_history_is_404() {
    let h = Harness::default().await;
    let (status, body) = h.history("nope").await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "session_not_found");
}

#[tokio::test]
async fn a_failed_call_keeps_the_users_message_and_a_retry_does_not_duplicate_it() {
    let h = Harness::default().await;
    h.say("f", "first").await;
    h.upstream.push(error_reply(503, "overloaded"));
    let (status, body) = h
        .chat(
            Some("f"),
            json!({"model": "m", "messages": [user("second")]}),
        )
        .await;
    assert_eq!(status, 503);
    assert_eq!(body["error"]["message"], "overloaded");
    assert_eq!(
        h.transcript("f").await,
        ["user: first", "assistant: reply 1", "user: second"]
    );
    // The client retries the same message.
    h.say("f", "second").await;
    assert_eq!(
        h.transcript("f").await,
        [
            "user: first",
            "assistant: reply 1",
            "user: second",
            "assistant: reply 3"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_sessions_stay_isolated() {
    let h = std::sync::Arc::new(Harness::default().await);
    let mut tasks = Vec::new();
    for s in 0..16 {
        let h = std::sync::Arc::clone(&h);
        tasks.push(tokio::spawn(async move {
            let id = format!("iso-{s}");
            for t in 0..5 {
                h.say(&id, &format!("{id} says {t}")).await;
            }
            id
        }));
    }
    for task in tasks {
        let id = task.await.unwrap();
        let (_, hist) = h.history(&id).await;
        let contents = hist["contents"].as_array().unwrap();
        assert_eq!(contents.len(), 10);
        for (i, m) in contents.iter().enumerate() {
            if i % 2 == 0 {
                assert_eq!(m["content"], format!("{id} says {}", i / 2));
            } else {
                assert_eq!(m["role"], "assistant");
            }
        }
    }
    // Every upstream request carried only its own session's messages.
    for r in h.upstream.received() {
        let msgs = r.messages();
        let owner = msgs[0]["content"]
            .as_str()
            .unwrap()
            .split(' ')
            .next()
            .unwrap();
        for m in msgs.iter().filter(|m| m["role"] == "user") {
            assert!(m["content"].as_str().unwrap().starts_with(owner));
        }
    }
}

/// Requests racing in one session interrupt each other (barge-in is the
/// default), but the history always pairs each user message with its reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_in_one_session_keep_turn_order() {
    for round in 0..20 {
        let h = std::sync::Arc::new(Harness::default().await);
        let tasks: Vec<_> = (0..4)
            .map(|i| {
                let h = std::sync::Arc::clone(&h);
                tokio::spawn(async move {
                    let body = json!({"model": "m", "messages": [user(&format!("m{i}"))]});
                    h.chat(Some("same"), body).await.0
                })
            })
            .collect();
        for t in tasks {
            let status = t.await.unwrap();
            assert!(status == 200 || status == 409, "round {round}: {status}");
        }
        let (_, hist) = h.history("same").await;
        let contents = hist["contents"].as_array().unwrap();
        assert_eq!(contents.len(), 8, "round {round}: {hist}");
        for (n, pair) in contents.chunks(2).enumerate() {
            assert_eq!(pair[0]["role"], "user", "round {round}: {hist}");
            assert_eq!(pair[1]["role"], "assistant", "round {round}: {hist}");
            assert_eq!(pair[0]["turn_id"], n as u64 + 1);
            assert_eq!(pair[1]["turn_id"], n as u64 + 1);
        }
    }
}

#[tokio::test]
async fn a_full_resend_client_after_trimming_adds_no_duplicates() {
    let h = Harness::start("[history]\nmax_messages = 6\nwindow_messages = 6\n", "").await;
    let mut conv = vec![];
    for i in 0..6 {
        conv.push(user(&format!("u{i}")));
        let (status, body) = h
            .chat(Some("t"), json!({"model": "m", "messages": conv.clone()}))
            .await;
        assert_eq!(status, 200);
        conv.push(assistant(
            body["choices"][0]["message"]["content"].as_str().unwrap(),
        ));
    }
    assert_eq!(
        h.transcript("t").await,
        [
            "user: u3",
            "assistant: reply 4",
            "user: u4",
            "assistant: reply 5",
            "user: u5",
            "assistant: reply 6"
        ]
    );
    let (_, hist) = h.history("t").await;
    assert_eq!(hist["turn_id"], 6);
    assert_eq!(hist["contents"][1]["metadata"]["source"], "llm");
}

#[tokio::test]
async fn an_absurd_client_turn_id_does_not_break_the_session() {
    let h = Harness::default().await;
    let (status, _) = h
        .chat(Some("o"), json!({"model": "m", "messages": [{"role": "user", "content": "a", "turn_id": u64::MAX}]}))
        .await;
    assert_eq!(status, 200);
    h.say("o", "b").await;
    assert_eq!(h.transcript("o").await.len(), 4);
}

#[tokio::test]
async fn a_session_keeps_at_most_max_bytes_oldest_dropped_first() {
    use recall::memory::window::{TrimReason, TrimScope};
    let h = Harness::start(
        "[history]\nwindow_messages = 0\nmax_messages = 0\nmax_bytes = 1000\n",
        "",
    )
    .await;
    let text = |c: char| c.to_string().repeat(300);
    for c in ['a', 'b', 'c', 'd'] {
        h.upstream
            .push(completion(&c.to_ascii_uppercase().to_string()));
        h.say("bytes", &text(c)).await;
    }
    let (_, hist) = h.history("bytes").await;
    let kept: Vec<&str> = hist["contents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    let held: usize = kept.iter().map(|t| t.len()).sum();
    assert!(held <= 1000, "{held} bytes kept: {kept:?}");
    // The newest turns stay; the oldest went first.
    assert_eq!(kept.last(), Some(&"D"));
    assert!(kept.contains(&text('d').as_str()) && kept.contains(&text('c').as_str()));
    assert!(!kept.contains(&text('a').as_str()));
    assert!(
        h.app
            .metrics
            .trimmed(TrimScope::History, TrimReason::MaxBytes)
            >= 1
    );

    // A single message over the bound is kept alone: the newest turn is
    // never dropped.
    h.upstream.push(completion("big answer"));
    h.say("bytes", &"z".repeat(5000)).await;
    assert_eq!(
        h.transcript("bytes").await,
        [
            format!("user: {}", "z".repeat(5000)),
            "assistant: big answer".into()
        ]
    );
}
