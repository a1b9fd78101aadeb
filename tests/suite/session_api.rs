//! The session API: seeding, reading, appending, resetting and ending
//! sessions, runtime system messages, users, and admin auth.

use crate::common;

use common::*;
use reqwest::Method;
use serde_json::{json, Value};

#[tokio::test]
async fn seeded_history_is_what_the_model_sees_first() {
    let h = Harness::default().await;
    let (status, body) = h
        .api(
            Method::PUT,
            "/v1/sessions/seed/history",
            Some(json!({"contents": [
                {"role": "user", "content": "What's your name?"},
                {"role": "assistant", "content": "I'm Doubao.", "metadata": {"source": "import"}},
            ]})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["message_count"], 2);
    h.say("seed", "Tell me a story.").await;
    assert_eq!(
        h.upstream.last().transcript(),
        [
            "user: What's your name?",
            "assistant: I'm Doubao.",
            "user: Tell me a story."
        ]
    );
    let (_, hist) = h.history("seed").await;
    let turns: Vec<u64> = hist["contents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["turn_id"].as_u64().unwrap())
        .collect();
    assert_eq!(turns, [1, 1, 2, 2]);
    assert_eq!(hist["contents"][1]["metadata"]["source"], "import");

    // `messages` works as the key too, and replaces everything.
    let (status, _) = h
        .api(
            Method::PUT,
            "/v1/sessions/seed/history",
            Some(json!({"messages": [user("fresh")]})),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(h.transcript("seed").await, ["user: fresh"]);
}

#[tokio::test]
async fn seeding_is_validated_like_chat_messages() {
    let h = Harness::default().await;
    for (body, param) in [
        (
            json!({"contents": [{"role": "robot", "content": "x"}]}),
            "messages[0].role",
        ),
        (json!({"contents": [system("no")]}), "messages[0].role"),
        (json!({"contents": "x"}), "contents"),
        (json!({}), "contents"),
    ] {
        let (status, resp) = h
            .api(Method::PUT, "/v1/sessions/v/history", Some(body.clone()))
            .await;
        assert_eq!(status, 400, "{body} -> {resp}");
        assert_eq!(resp["error"]["param"], param, "{body} -> {resp}");
    }
    let (status, _) = h
        .api(
            Method::PUT,
            "/v1/sessions/bad%20id/history",
            Some(json!({"contents": []})),
        )
        .await;
    assert_eq!(status, 400);
    assert!(h.app.sessions.is_empty());
}

#[tokio::test]
async fn appended_messages_take_turns_and_sources() {
    let h = Harness::default().await;
    let (status, body) = h
        .api(
            Method::POST,
            "/v1/sessions/greet/messages",
            Some(json!({"messages": [
                {"role": "assistant", "content": "How can I help you today?", "metadata": {"source": "greeting"}}
            ]})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["messages"][0]["turn_id"], 1);
    h.say("greet", "A joke?").await;
    let (_, body) = h
        .api(
            Method::POST,
            "/v1/sessions/greet/messages",
            Some(json!({"messages": [assistant("Are you still there?")]})),
        )
        .await;
    assert_eq!(body["messages"][0]["metadata"]["source"], "command");
    let (_, hist) = h.history("greet").await;
    let view: Vec<(u64, &str)> = hist["contents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["turn_id"].as_u64().unwrap(),
                m["metadata"]["source"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        view,
        [(1, "greeting"), (2, "message"), (2, "llm"), (3, "command")]
    );
    // The model saw the greeting before the user's question.
    assert_eq!(
        h.upstream.last().transcript(),
        ["assistant: How can I help you today?", "user: A joke?"]
    );
}

#[tokio::test]
async fn history_can_be_read_for_a_model_and_limited() {
    let h = Harness::default().await;
    h.say("r", "one").await;
    h.say("r", "two").await;
    let (status, body) = h
        .api(
            Method::GET,
            "/v1/sessions/r/history?format=openai&limit=2",
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        body["contents"],
        json!([{"role": "user", "content": "two"}, {"role": "assistant", "content": "reply 2"}])
    );
    let (_, body) = h
        .api(Method::GET, "/v1/sessions/r/history?limit=1", None)
        .await;
    assert_eq!(body["contents"].as_array().unwrap().len(), 1);
    assert_eq!(body["contents"][0]["metadata"]["source"], "llm");
    let (status, _) = h
        .api(Method::GET, "/v1/sessions/r/history?format=xml", None)
        .await;
    assert_eq!(status, 400);
    // As text, for frameworks that take memory as a string.
    let (status, body) = h
        .api(Method::GET, "/v1/sessions/r/history?format=text", None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        "USER: one\n\nASSISTANT: reply 1\n\nUSER: two\n\nASSISTANT: reply 2"
    );
    let (_, body) = h
        .api(
            Method::GET,
            "/v1/sessions/r/history?format=text&limit=1",
            None,
        )
        .await;
    assert_eq!(body, "ASSISTANT: reply 2");
}

#[tokio::test]
async fn clearing_keeps_the_session_and_its_system_messages() {
    let h = Harness::default().await;
    h.say("c", "hello").await;
    h.api(
        Method::PUT,
        "/v1/sessions/c/system_messages",
        Some(json!({"system_messages": [system("The user likes cats.")]})),
    )
    .await;
    let (status, body) = h.api(Method::DELETE, "/v1/sessions/c/history", None).await;
    assert_eq!((status, body["deleted"].clone()), (200, json!(2)));
    let (_, hist) = h.history("c").await;
    assert_eq!(hist["contents"], json!([]));
    assert_eq!(hist["turn_id"], 0);
    h.say("c", "again").await;
    assert_eq!(
        h.upstream.last().transcript(),
        ["system: The user likes cats.", "user: again"]
    );
}

#[tokio::test]
async fn system_messages_change_at_runtime_and_sit_between_config_and_request() {
    let h = Harness::start("[[system_messages]]\ncontent = \"config\"\n", "").await;
    // Set before the first turn: long-term memory injected into a new session.
    let (status, body) = h
        .api(
            Method::PUT,
            "/v1/sessions/s/system_messages",
            Some(json!({"system_messages": [system("Summary: likes jazz.")]})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    h.chat(
        Some("s"),
        json!({"model": "m", "messages": [system("request"), user("hi")]}),
    )
    .await;
    assert_eq!(
        h.upstream.last().transcript(),
        [
            "system: config",
            "system: Summary: likes jazz.",
            "system: request",
            "user: hi"
        ]
    );
    h.api(
        Method::PUT,
        "/v1/sessions/s/system_messages",
        Some(json!({"system_messages": [{"role": "developer", "content": "Now speak French."}]})),
    )
    .await;
    h.say("s", "next").await;
    assert_eq!(
        h.upstream.last().transcript()[1],
        "developer: Now speak French."
    );
    let (_, body) = h
        .api(Method::GET, "/v1/sessions/s/system_messages", None)
        .await;
    assert_eq!(body["system_messages"][0]["content"], "Now speak French.");
    let (status, _) = h
        .api(
            Method::PUT,
            "/v1/sessions/s/system_messages",
            Some(json!({"system_messages": [user("x")]})),
        )
        .await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn sessions_are_listed_with_pagination_and_by_user() {
    let h = Harness::default().await;
    for (id, user_id) in [("a", "u1"), ("b", "u2"), ("c", "u1")] {
        let resp = h
            .client
            .post(format!("{}/v1/chat/completions", h.url))
            .header("x-session-id", id)
            .header("x-user-id", user_id)
            .json(&json!({"model": "m", "messages": [user("hi")]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    let (_, page) = h.api(Method::GET, "/v1/sessions?limit=2", None).await;
    let ids: Vec<&str> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(page["has_more"], true);
    assert_eq!(page["data"][0]["message_count"], 2);
    assert_eq!(page["data"][0]["turn_id"], 1);
    assert!(
        page["data"][0]["created_at"].as_i64().unwrap()
            <= page["data"][0]["last_active_at"].as_i64().unwrap()
    );
    let (_, next) = h
        .api(Method::GET, "/v1/sessions?limit=2&after=b", None)
        .await;
    assert_eq!(next["data"][0]["id"], "c");
    assert_eq!(next["has_more"], false);
    let (_, mine) = h.api(Method::GET, "/v1/sessions?user=u1", None).await;
    let ids: Vec<&str> = mine["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "c"]);
    // Who said it is in the record.
    let (_, hist) = h.history("b").await;
    assert_eq!(hist["contents"][0]["metadata"]["user"], "u2");
    let (status, summary) = h.api(Method::GET, "/v1/sessions/b", None).await;
    assert_eq!((status, summary["users"].clone()), (200, json!(["u2"])));
}

#[tokio::test]
async fn require_user_rejects_requests_without_the_header() {
    let h = Harness::start(
        "[session]\nrequire_user = true\nuser_header = \"x-caller\"\n",
        "",
    )
    .await;
    let (status, body) = h
        .chat(Some("s"), json!({"model": "m", "messages": [user("hi")]}))
        .await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("x-caller"),
        "{body}"
    );
    assert!(h.app.sessions.is_empty());
    // A message that names its user already keeps it.
    let resp = h
        .client
        .post(format!("{}/v1/chat/completions", h.url))
        .header("x-session-id", "s")
        .header("x-caller", "alice")
        .json(&json!({"model": "m", "messages": [
            {"role": "user", "content": "hi", "metadata": {"user": "bob"}}, user("and me")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (_, hist) = h.history("s").await;
    assert_eq!(hist["contents"][0]["metadata"]["user"], "bob");
    assert_eq!(hist["contents"][1]["metadata"]["user"], "alice");
}

#[tokio::test]
async fn unknown_sessions_are_404_everywhere_reads_happen() {
    let h = Harness::default().await;
    for (method, path) in [
        (Method::GET, "/v1/sessions/none"),
        (Method::GET, "/v1/sessions/none/history"),
        (Method::DELETE, "/v1/sessions/none/history"),
        (Method::GET, "/v1/sessions/none/system_messages"),
        (Method::POST, "/v1/sessions/none/end"),
        (Method::DELETE, "/v1/sessions/none"),
        (Method::POST, "/v1/sessions/none/interrupt"),
    ] {
        let (status, body) = h.api(method.clone(), path, None).await;
        assert_eq!(status, 404, "{method} {path}: {body}");
        assert_eq!(
            body["error"]["code"], "session_not_found",
            "{method} {path}"
        );
    }
}

#[tokio::test]
async fn the_admin_token_guards_the_session_api_only() {
    std::env::set_var("RECALL_TEST_ADMIN_TOKEN", "s3cret");
    let h = Harness::start("[admin]\ntoken_env = \"RECALL_TEST_ADMIN_TOKEN\"\n", "").await;
    h.say("guarded", "hi").await;
    let (status, body) = h.api(Method::GET, "/v1/sessions", None).await;
    assert_eq!(status, 401);
    assert_eq!(body["error"]["code"], "invalid_api_key");
    for token in ["wrong", "s3cre", "s3cret0"] {
        let resp = h
            .client
            .get(format!("{}/v1/sessions/guarded/history", h.url))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401, "{token}");
    }
    let resp = h
        .client
        .get(format!("{}/sessions/x/v1/sessions/guarded/history", h.url))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["contents"].as_array().unwrap().len(), 2);
}
