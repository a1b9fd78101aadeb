//! Client keys: who may use recall, and that each key sees only its own
//! sessions through every endpoint.

use crate::common;

use common::*;
use serde_json::{json, Value};

const KEY_A: &str = "sk-client-a";
const KEY_B: &str = "sk-client-b";
const ADMIN: &str = "admin-secret";

/// A harness whose client keys and admin token live in variables of its
/// own (tests run in parallel in one process).
async fn keyed(tag: &str, upstream_extra: &str) -> Harness {
    let keys_var = format!("RECALL_TEST_KEYS_{tag}");
    let admin_var = format!("RECALL_TEST_ADMIN_{tag}");
    std::env::set_var(&keys_var, format!("{KEY_A}, {KEY_B}"));
    std::env::set_var(&admin_var, ADMIN);
    Harness::start(
        &format!("[auth]\napi_keys_env = \"{keys_var}\"\n[admin]\ntoken_env = \"{admin_var}\"\n"),
        upstream_extra,
    )
    .await
}

async fn chat_as(h: &Harness, key: Option<&str>, session: &str, text: &str) -> (u16, Value) {
    let mut req = h
        .client
        .post(format!("{}/v1/chat/completions", h.url))
        .header("x-session-id", session)
        .json(&json!({"model": "m", "messages": [user(text)]}));
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn api_as(
    h: &Harness,
    key: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = h
        .client
        .request(method, format!("{}/v1/sessions{path}", h.url))
        .bearer_auth(key);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn contents(history: &Value) -> Vec<String> {
    history["contents"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn chat_needs_a_client_key_and_the_upstream_never_sees_it() {
    let h = keyed("chat", "").await;
    let (status, body) = chat_as(&h, None, "s", "hi").await;
    assert_eq!(status, 401);
    assert_eq!(body["error"]["code"], "invalid_api_key");
    let (status, _) = chat_as(&h, Some("sk-not-a-client"), "s", "hi").await;
    assert_eq!(status, 401);
    assert!(h.upstream.received().is_empty());
    // A rejected request changed nothing.
    let (status, _) = api_as(&h, ADMIN, reqwest::Method::GET, "", None).await;
    assert_eq!(status, 200);

    h.upstream.push(completion("hello"));
    let (status, _) = chat_as(&h, Some(KEY_A), "s", "hi").await;
    assert_eq!(status, 200);
    assert!(
        h.upstream.last().headers.get("authorization").is_none(),
        "the client's key went upstream"
    );
}

#[tokio::test]
async fn the_upstream_gets_its_own_key() {
    std::env::set_var("RECALL_TEST_UPSTREAM_KEY_auth", "sk-upstream");
    let h = keyed("own", "api_key_env = \"RECALL_TEST_UPSTREAM_KEY_auth\"").await;
    h.upstream.push(completion("hello"));
    let (status, _) = chat_as(&h, Some(KEY_A), "s", "hi").await;
    assert_eq!(status, 200);
    assert_eq!(
        h.upstream.last().headers["authorization"],
        "Bearer sk-upstream"
    );
}

#[tokio::test]
async fn one_session_id_under_two_keys_is_two_sessions_through_every_endpoint() {
    use reqwest::Method;
    let h = keyed("iso", "").await;
    h.upstream.push(completion("A's answer"));
    assert_eq!(chat_as(&h, Some(KEY_A), "shared", "A speaks").await.0, 200);
    h.upstream.push(completion("B's answer"));
    assert_eq!(chat_as(&h, Some(KEY_B), "shared", "B speaks").await.0, 200);
    // B's turn was sent without A's.
    assert_eq!(h.upstream.last().transcript(), ["user: B speaks"]);

    // Each reads its own history, under the id it chose.
    let (status, a) = api_as(&h, KEY_A, Method::GET, "/shared/history", None).await;
    assert_eq!(status, 200);
    assert_eq!(a["session_id"], "shared");
    assert_eq!(contents(&a), ["A speaks", "A's answer"]);
    let (_, b) = api_as(&h, KEY_B, Method::GET, "/shared/history", None).await;
    assert_eq!(contents(&b), ["B speaks", "B's answer"]);

    // A session only A has: B can neither see nor touch it.
    h.upstream.push(completion("private"));
    assert_eq!(
        chat_as(&h, Some(KEY_A), "a-only", "secret plan").await.0,
        200
    );
    for (method, path, body) in [
        (Method::GET, "/a-only", None),
        (Method::GET, "/a-only/history", None),
        (Method::GET, "/a-only/system_messages", None),
        (Method::POST, "/a-only/interrupt", None),
        (Method::DELETE, "/a-only/history", None),
        (Method::POST, "/a-only/end", None),
        (Method::DELETE, "/a-only", None),
    ] {
        let (status, _) = api_as(&h, KEY_B, method.clone(), path, body).await;
        assert_eq!(status, 404, "{method} {path} as B");
    }
    // Writes that may create a session create B's own, never reach A's.
    let (status, _) = api_as(
        &h,
        KEY_B,
        Method::POST,
        "/a-only/messages",
        Some(json!({"messages": [assistant("B was here")]})),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = api_as(
        &h,
        KEY_B,
        Method::PUT,
        "/a-only/history",
        Some(json!({"messages": [user("B's seed")]})),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = api_as(
        &h,
        KEY_B,
        Method::PUT,
        "/a-only/system_messages",
        Some(json!({"system_messages": [system("B's rules")]})),
    )
    .await;
    assert_eq!(status, 200);
    let (_, a) = api_as(&h, KEY_A, Method::GET, "/a-only/history", None).await;
    assert_eq!(contents(&a), ["secret plan", "private"]);
    let (_, sys) = api_as(&h, KEY_A, Method::GET, "/a-only/system_messages", None).await;
    assert!(!sys.to_string().contains("B's rules"), "{sys}");

    // Lists show each key its own sessions, by their own ids.
    let (_, list_a) = api_as(&h, KEY_A, Method::GET, "", None).await;
    let ids = |list: &Value| -> Vec<String> {
        list["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(ids(&list_a), ["a-only", "shared"]);
    let (_, list_b) = api_as(&h, KEY_B, Method::GET, "", None).await;
    assert_eq!(ids(&list_b), ["a-only", "shared"]);

    // The admin sees all four, under their internal ids.
    let (_, all) = api_as(&h, ADMIN, Method::GET, "", None).await;
    let all = ids(&all);
    assert_eq!(all.len(), 4, "{all:?}");
    assert!(all
        .iter()
        .all(|id| id.len() > 17 && id.as_bytes()[16] == b':'));

    // A ending its session leaves B's of the same name alone.
    let (status, _) = api_as(&h, KEY_A, Method::POST, "/shared/end", None).await;
    assert_eq!(status, 200);
    let (status, b) = api_as(&h, KEY_B, Method::GET, "/shared/history", None).await;
    assert_eq!(status, 200);
    assert_eq!(contents(&b), ["B speaks", "B's answer"]);
}

#[tokio::test]
async fn the_session_api_needs_a_key_or_the_admin_token() {
    let h = keyed("api", "").await;
    let resp = h
        .client
        .get(format!("{}/v1/sessions", h.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let (status, _) = api_as(&h, "sk-wrong", reqwest::Method::GET, "", None).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn configured_but_missing_keys_stop_the_start() {
    let toml = "[auth]\napi_keys_env = \"RECALL_TEST_KEYS_NEVER_SET\"\n\
                [[upstreams]]\nname = \"u\"\nbase_url = \"http://127.0.0.1:9/v1\"\n";
    let config = recall::Config::parse(toml, std::path::Path::new("t.toml")).unwrap();
    let err = recall::App::new(config)
        .await
        .err()
        .expect("must not start");
    assert!(
        err.to_string().contains("RECALL_TEST_KEYS_NEVER_SET"),
        "{err}"
    );
}

async fn responses_as(h: &Harness, key: &str, body: Value) -> (u16, Value) {
    let resp = h
        .client
        .post(format!("{}/v1/responses", h.url))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn get_as(h: &Harness, key: &str, path: &str) -> (u16, Value) {
    let resp = h
        .client
        .get(format!("{}{path}", h.url))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_tenants_responses_and_conversations_are_a_404_to_another() {
    let h = keyed("responses", "").await;
    let (status, r) = responses_as(&h, KEY_A, json!({"model": "m", "input": "mine"})).await;
    assert_eq!(status, 200, "{r}");
    let id = r["id"].as_str().unwrap();
    let (status, _) = get_as(&h, KEY_A, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200);
    let (status, err) = get_as(&h, KEY_B, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 404, "{err}");
    let (status, _) = responses_as(
        &h,
        KEY_B,
        json!({"model": "m", "input": "x", "previous_response_id": id}),
    )
    .await;
    assert_eq!(status, 404);
    // A conversation of A's, by its id.
    chat_as(&h, Some(KEY_A), "a-talk", "hello").await;
    let (status, _) = get_as(&h, KEY_A, "/v1/conversations/a-talk").await;
    assert_eq!(status, 200);
    let (status, _) = get_as(&h, KEY_B, "/v1/conversations/a-talk").await;
    assert_eq!(status, 404);
    let (status, _) = responses_as(
        &h,
        KEY_B,
        json!({"model": "m", "input": "x", "conversation": "a-talk"}),
    )
    .await;
    assert_eq!(status, 404);
    // The admin reaches A's under its internal id, as on the session API;
    // without a key nothing is reached.
    let (status, _) = get_as(&h, "nope", &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 401);
}
