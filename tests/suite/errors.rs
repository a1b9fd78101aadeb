//! Every error recall answers itself is OpenAI-shaped, has OpenAI's status,
//! and a rejected request changes nothing.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

fn assert_openai_error(body: &Value, kind: &str) {
    let err = body["error"]
        .as_object()
        .unwrap_or_else(|| panic!("not an error body: {body}"));
    for key in ["message", "type", "param", "code"] {
        assert!(err.contains_key(key), "missing {key} in {body}");
    }
    assert!(!err["message"].as_str().unwrap().is_empty());
    assert_eq!(err["type"], kind, "{body}");
}

async fn post_raw(h: &Harness, body: &'static str) -> (u16, Value) {
    let resp = h
        .client
        .post(format!("{}/v1/chat/completions", h.url))
        .header("x-session-id", "rejected")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

#[tokio::test]
async fn bad_request_bodies_are_400_and_change_nothing() {
    let h = Harness::default().await;
    let cases: &[(&str, Option<&str>)] = &[
        ("{not json", None),
        ("[1, 2]", None),
        (r#"{"model": "m"}"#, Some("messages")),
        (r#"{"model": "m", "messages": "hi"}"#, Some("messages")),
        (
            r#"{"model": "m", "messages": [{"content": "no role"}]}"#,
            Some("messages[0].role"),
        ),
        (
            r#"{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}"#,
            Some("messages[0].role"),
        ),
        (
            r#"{"model": "m", "messages": [{"role": "user", "content": "ok"}, 7]}"#,
            Some("messages[1]"),
        ),
        (
            r#"{"model": "m", "messages": [{"role": "user", "turn_id": -1}]}"#,
            Some("messages[0]"),
        ),
        (
            r#"{"messages": [{"role": "user", "content": "x"}]}"#,
            Some("model"),
        ),
        (
            r#"{"model": 5, "messages": [{"role": "user", "content": "x"}]}"#,
            Some("model"),
        ),
    ];
    for (body, param) in cases {
        let (status, resp) = post_raw(&h, body).await;
        assert_eq!(status, 400, "{body} -> {resp}");
        assert_openai_error(&resp, "invalid_request_error");
        assert_eq!(resp["error"]["param"].as_str(), *param, "{body} -> {resp}");
    }
    assert!(h.upstream.received().is_empty());
    assert!(
        h.app.sessions.is_empty(),
        "a rejected request created a session"
    );
}

#[tokio::test]
async fn bad_session_ids_are_rejected() {
    let h = Harness::default().await;
    for id in ["has space", "semi;colon", &"x".repeat(200)] {
        let (status, body) = h
            .chat(Some(id), json!({"model": "m", "messages": [user("q")]}))
            .await;
        assert_eq!(status, 400, "{id}");
        assert_openai_error(&body, "invalid_request_error");
    }
    let (status, _) = h
        .chat(
            None,
            json!({"model": "m", "session_id": 12, "messages": [user("q")]}),
        )
        .await;
    assert_eq!(status, 400);
    assert!(h.app.sessions.is_empty());
}

#[tokio::test]
async fn an_oversized_body_is_413() {
    let h = Harness::start("[server]\nmax_body_bytes = 1000\n", "").await;
    let big = "x".repeat(2000);
    let (status, body) = h
        .chat(Some("big"), json!({"model": "m", "messages": [user(&big)]}))
        .await;
    assert_eq!(status, 413);
    assert_openai_error(&body, "invalid_request_error");
    assert!(h.app.sessions.is_empty());
    // Just under the limit is fine.
    let (status, _) = h
        .chat(
            Some("big"),
            json!({"model": "m", "messages": [user("small")]}),
        )
        .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_model_no_upstream_serves_is_404() {
    let h = Harness::start("", "models = [\"llama-*\"]\n").await;
    let (status, body) = h
        .chat(
            Some("m"),
            json!({"model": "gpt-4o", "messages": [user("q")]}),
        )
        .await;
    assert_eq!(status, 404);
    assert_openai_error(&body, "invalid_request_error");
    assert_eq!(body["error"]["code"], "model_not_found");
    assert!(h.app.sessions.is_empty());
}

#[tokio::test]
async fn an_unreachable_upstream_is_502_and_the_message_is_kept() {
    // A port that was just free: nothing listens there.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let toml =
        format!("[[upstreams]]\nname = \"gone\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\n");
    let h = Harness::with_config(&toml, MockUpstream::start().await).await;
    let (status, body) = h
        .chat(
            Some("down"),
            json!({"model": "m", "messages": [user("hello?")]}),
        )
        .await;
    assert_eq!(status, 502);
    assert_openai_error(&body, "upstream_error");
    assert!(body["error"]["message"].as_str().unwrap().contains("gone"));
    assert_eq!(h.transcript("down").await, ["user: hello?"]);
}

#[tokio::test]
async fn a_slow_upstream_is_504() {
    let h = Harness::start("", "timeout_secs = 1\n").await;
    h.upstream.push(Reply::Hang);
    let started = Instant::now();
    let (status, body) = h
        .chat(Some("slow"), json!({"model": "m", "messages": [user("q")]}))
        .await;
    assert_eq!(status, 504);
    assert_openai_error(&body, "upstream_error");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(h.transcript("slow").await, ["user: q"]);
}

#[tokio::test]
async fn upstream_errors_are_relayed_with_their_status_and_body() {
    let h = Harness::default().await;
    let upstream_body = json!({"error": {"message": "Invalid 'temperature'", "type": "invalid_request_error",
                                         "param": "temperature", "code": "bad_value"}});
    h.upstream.push(Reply::Json {
        status: 400,
        body: upstream_body.clone(),
        headers: vec![("x-should-retry", "false")],
    });
    let (status, body) = h
        .chat(
            Some("e"),
            json!({"model": "m", "temperature": 9, "messages": [user("q")]}),
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(body, upstream_body);
}

#[tokio::test]
async fn unknown_routes_and_methods_get_openai_errors() {
    let h = Harness::default().await;
    let resp = h
        .client
        .get(format!("{}/v1/nothing", h.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    assert_openai_error(&resp.json().await.unwrap(), "invalid_request_error");
    let resp = h
        .client
        .get(format!("{}/v1/chat/completions", h.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
    assert_openai_error(&resp.json().await.unwrap(), "invalid_request_error");
    let resp = h
        .client
        .get(format!("{}/healthz", h.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[test]
fn a_bad_config_stops_start_up_naming_the_key_and_the_file() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("recall-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        ("unknown.toml", "[history]\nwindow_size = 3\n", "window_size"),
        ("type.toml", "[history]\nwindow_messages = \"many\"\n", "window_messages"),
        ("none.toml", "[server]\nlisten = \"127.0.0.1:0\"\n", "upstreams"),
        ("url.toml", "[[upstreams]]\nname = \"u\"\nbase_url = \"ftp://x\"\n", "upstreams[0].base_url"),
        (
            "window.toml",
            "[history]\nwindow_messages = 30\nmax_messages = 10\n[[upstreams]]\nname = \"u\"\nbase_url = \"http://x\"\n",
            "history.window_messages",
        ),
    ];
    for (file, text, key) in cases {
        let path = dir.join(file);
        std::fs::write(&path, text).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_recall"))
            .arg("--config")
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{file} started");
        assert!(stderr.contains(key), "{file}: {stderr}");
        assert!(stderr.contains(file), "{file}: {stderr}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_recall"))
        .arg("--config")
        .arg(dir.join("missing.toml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.toml"));
}

#[test]
fn the_cli_has_version_help_and_check() {
    let bin = env!("CARGO_BIN_EXE_recall");
    let out = std::process::Command::new(bin)
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("recall "));
    let out = std::process::Command::new(bin)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("recall check"));
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/config/recall.toml");
    let out = std::process::Command::new(bin)
        .args(["check", "--config", config])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("[storage]"));
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("recall-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[server]\nlisten = 5\n").unwrap();
    let out = std::process::Command::new(bin)
        .args(["check", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad.toml"));
}

#[tokio::test]
async fn readyz_answers_when_storage_does() {
    let h = Harness::default().await;
    let resp = h
        .client
        .get(format!("{}/readyz", h.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn oversized_headers_are_431_and_change_nothing() {
    let h = Harness::default().await;
    let resp = h
        .client
        .post(format!("{}/v1/chat/completions", h.url))
        .header("x-session-id", "big-headers")
        .header("x-padding", "p".repeat(40 * 1024))
        .json(&json!({"model": "m", "messages": [user("hi")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 431);
    let body: Value = resp.json().await.unwrap();
    assert_openai_error(&body, "invalid_request_error");
    assert_eq!(body["error"]["code"], "headers_too_large");
    assert!(h.upstream.received().is_empty());
    assert_eq!(h.history("big-headers").await.0, 404);
}
