//! Vendor modes as the upstream sees them: the exact fields of the body and
//! of each message, plus the headers that cross.

use crate::common;

use std::collections::BTreeSet;

use common::*;
use serde_json::{json, Value};

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// A request carrying every kind of field a client might send.
fn rich_request() -> Value {
    json!({
        "model": "m", "temperature": 0.3, "tools": [{"type": "function", "function": {"name": "f"}}],
        "response_format": {"type": "text"}, "metadata": {"app": "demo"}, "user": "end-user-1",
        "store": false, "x_vendor_knob": 7, "x_private": "secret",
        "session_id": "ignored-header-wins", "turn_id": 99, "timestamp": 1, "interruptable": false,
        "messages": [
            {"role": "system", "content": "req sys", "x_note": 1},
            {"role": "user", "content": "hello", "name": "bob", "turn_id": 7,
             "metadata": {"source": "asr", "user": "user123"}, "x_field": true}
        ]
    })
}

#[tokio::test]
async fn openai_mode_sends_only_openai_fields() {
    let h = Harness::start(
        "[[system_messages]]\ncontent = \"cfg\"\n",
        "vendor = \"openai\"\nstrip_fields = [\"x_private\"]\n",
    )
    .await;
    let (status, _) = h.chat(Some("v"), rich_request()).await;
    assert_eq!(status, 200);
    let body = h.upstream.last().body;
    assert_eq!(
        keys(&body),
        set(&[
            "model",
            "temperature",
            "tools",
            "response_format",
            "metadata",
            "user",
            "store",
            "x_vendor_knob",
            "messages"
        ])
    );
    assert_eq!(body["metadata"], json!({"app": "demo"}));
    assert_eq!(
        body["messages"],
        json!([
            {"role": "system", "content": "cfg"},
            {"role": "system", "content": "req sys"},
            {"role": "user", "content": "hello", "name": "bob"}
        ])
    );
    // The second turn sends stored history the same way: no extensions.
    h.say("v", "next").await;
    for m in h.upstream.last().messages() {
        let allowed = set(&[
            "role",
            "content",
            "name",
            "tool_calls",
            "tool_call_id",
            "refusal",
        ]);
        assert!(keys(m).is_subset(&allowed), "{m}");
    }
    // Yet memory keeps what the client sent.
    let (_, hist) = h.history("v").await;
    assert_eq!(hist["contents"][0]["turn_id"], 7);
    assert_eq!(
        hist["contents"][0]["metadata"],
        json!({"source": "asr", "user": "user123"})
    );
    assert_eq!(hist["contents"][0]["x_field"], true);
    assert_eq!(hist["contents"][1]["turn_id"], 7);
}

#[tokio::test]
async fn custom_mode_forwards_every_field_and_adds_turn_fields() {
    let h = Harness::start("", "vendor = \"custom\"\ninterruptable = false\n").await;
    let (status, _) = h.chat(Some("c"), rich_request()).await;
    assert_eq!(status, 200);
    h.say("c", "and then?").await;
    let body = h.upstream.last().body;
    assert_eq!(body["turn_id"], 8);
    assert_eq!(body["interruptable"], false);
    assert!(body["timestamp"].as_i64().unwrap() > 1_600_000_000_000);
    assert_eq!(
        body["x_private"],
        Value::Null,
        "fields of the first request do not leak"
    );
    let msgs = body["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3);
    let first = &msgs[0];
    assert_eq!(
        keys(first),
        set(&[
            "role",
            "content",
            "name",
            "turn_id",
            "timestamp",
            "metadata",
            "x_field"
        ])
    );
    assert_eq!(
        first["metadata"],
        json!({"source": "asr", "user": "user123"})
    );
    assert_eq!(msgs[1]["metadata"]["source"], "llm");
    assert_eq!(msgs[1]["turn_id"], 7);
    assert_eq!(msgs[2]["turn_id"], 8);
    assert_eq!(msgs[2]["metadata"]["source"], "message");

    // And the first request's top-level fields went through untouched.
    let first_body = &h.upstream.received()[0].body;
    for k in [
        "temperature",
        "tools",
        "response_format",
        "metadata",
        "user",
        "store",
        "x_vendor_knob",
        "x_private",
        "session_id",
    ] {
        assert_eq!(first_body[k], rich_request()[k], "{k}");
    }
}

#[tokio::test]
async fn headers_cross_as_openai_clients_expect() {
    let h = Harness::default().await;
    let resp = h
        .client
        .post(format!("{}/v1/chat/completions", h.url))
        .header("authorization", "Bearer client-key")
        .header("openai-organization", "org-1")
        .header("openai-project", "proj-1")
        .header("x-session-id", "hdr")
        .header("x-unrelated", "no")
        .json(&json!({"model": "m", "messages": [user("q")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    for (k, v) in [
        ("x-upstream-request-id", "req-upstream-1"),
        ("openai-processing-ms", "7"),
        ("x-ratelimit-remaining-requests", "99"),
    ] {
        assert_eq!(resp.headers()[k], v, "{k}");
    }
    assert!(resp.headers().contains_key("x-request-id"));
    let got = h.upstream.last().headers;
    assert_eq!(got["authorization"], "Bearer client-key");
    assert_eq!(got["openai-organization"], "org-1");
    assert_eq!(got["openai-project"], "proj-1");
    assert!(got.get("x-unrelated").is_none());
    assert!(got.get("x-session-id").is_none());
}

#[tokio::test]
async fn a_configured_api_key_replaces_the_clients() {
    std::env::set_var("RECALL_TEST_KEY_VENDOR", "server-key");
    let h = Harness::start(
        "",
        "api_key_env = \"RECALL_TEST_KEY_VENDOR\"\nheaders = { \"x-extra\" = \"1\" }\n",
    )
    .await;
    let resp = h
        .client
        .post(format!("{}/v1/chat/completions", h.url))
        .header("authorization", "Bearer client-key")
        .json(&json!({"model": "m", "messages": [user("q")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let got = h.upstream.last().headers;
    assert_eq!(got["authorization"], "Bearer server-key");
    assert_eq!(got["x-extra"], "1");
}

#[tokio::test]
async fn models_are_routed_by_glob_to_the_first_matching_upstream() {
    let local = MockUpstream::start().await;
    let cloud = MockUpstream::start().await;
    let toml = format!(
        "[[upstreams]]\nname = \"local\"\nbase_url = \"{}\"\nmodels = [\"llama-*\"]\nvendor = \"custom\"\n\
         [[upstreams]]\nname = \"cloud\"\nbase_url = \"{}\"\nmodels = [\"*\"]\n",
        local.base_url(),
        cloud.base_url()
    );
    let h = Harness::with_config(&toml, local.clone()).await;
    h.chat(
        Some("r"),
        json!({"model": "llama-3", "messages": [user("a")]}),
    )
    .await;
    h.chat(
        Some("r"),
        json!({"model": "gpt-4o", "messages": [user("b")]}),
    )
    .await;
    assert_eq!(local.received().len(), 1);
    assert_eq!(cloud.received().len(), 1);
    assert!(local.last().body.get("turn_id").is_some());
    assert!(cloud.last().body.get("turn_id").is_none());
    // Memory is per session, not per upstream.
    assert_eq!(
        cloud.last().transcript(),
        ["user: a", "assistant: reply 1", "user: b"]
    );
    // /v1/models goes to the first upstream, also under the session prefix.
    for path in ["/v1/models", "/sessions/r/v1/models"] {
        let list: Value = h
            .client
            .get(format!("{}{path}", h.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(list["data"][0]["id"], "mock-model");
    }
    assert_eq!(local.last().path, "/v1/models");
}
