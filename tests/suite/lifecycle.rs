//! How sessions end (API, expiry, eviction) and what the webhook receives.

use crate::common;

use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use common::*;
use reqwest::Method;
use serde_json::{json, Value};

fn webhook_config(url: &str, secret_var: &str, extra: &str) -> String {
    format!("[webhook]\nurl = \"{url}\"\nsecret_env = \"{secret_var}\"\nretry_backoff_ms = 50\n{extra}\n")
}

/// Checks a delivery's Standard Webhooks headers (`webhook-id`,
/// `webhook-timestamp` close to now, and `webhook-signature` over both and
/// the body with `key`); returns its id and timestamp.
fn check_standard_headers(headers: &HeaderMap, body: &[u8], key: Option<&[u8]>) -> (String, i64) {
    let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
    let id = header("webhook-id").expect("webhook-id");
    assert!(id.starts_with("msg_"), "{id}");
    let timestamp: i64 = header("webhook-timestamp")
        .expect("webhook-timestamp")
        .parse()
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!((now - timestamp).abs() <= 5, "{timestamp} vs {now}");
    match key {
        Some(key) => assert_eq!(
            header("webhook-signature").as_deref(),
            Some(recall::webhook::sign(key, &id, timestamp, body).as_str())
        ),
        None => assert!(header("webhook-signature").is_none()),
    }
    assert!(headers.get("x-recall-signature").is_none());
    (id, timestamp)
}

#[tokio::test]
async fn ending_a_session_delivers_its_memory_signed() {
    std::env::set_var("RECALL_TEST_HOOK_SECRET_1", "hook-secret");
    let hook = WebhookReceiver::start(0).await;
    let h = Harness::start(
        &webhook_config(&hook.url, "RECALL_TEST_HOOK_SECRET_1", ""),
        "",
    )
    .await;
    h.api(
        Method::PUT,
        "/v1/sessions/e1/system_messages",
        Some(json!({"system_messages": [system("remember cats")]})),
    )
    .await;
    h.say("e1", "hello").await;
    let (status, record) = h.api(Method::POST, "/v1/sessions/e1/end", None).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["reason"], "ended");

    let (sig, body, event) = hook
        .wait_for(Duration::from_secs(3), |e| e["session_id"] == "e1")
        .await;
    assert_eq!(event["event"], "session_ended");
    assert_eq!(event["reason"], "ended");
    assert_eq!(event["system_messages"][0]["content"], "remember cats");
    assert_eq!(event["contents"].as_array().unwrap().len(), 2);
    assert_eq!(event["contents"][1]["content"], "reply 1");
    assert!(sig.is_some());
    let (headers, delivered) = hook.deliveries().remove(0);
    assert_eq!(delivered, body);
    check_standard_headers(&headers, &body, Some(b"hook-secret"));

    // The session is gone; the same id later starts afresh.
    assert_eq!(h.history("e1").await.0, 404);
    h.say("e1", "new start").await;
    assert_eq!(
        h.transcript("e1").await,
        ["user: new start", "assistant: reply 2"]
    );
    // DELETE ends it too.
    let (status, _) = h.api(Method::DELETE, "/v1/sessions/e1", None).await;
    assert_eq!(status, 200);
    hook.wait_for(Duration::from_secs(3), |e| {
        e["contents"][0]["content"] == "new start"
    })
    .await;
}

#[tokio::test]
async fn idle_sessions_expire_and_are_delivered() {
    let hook = WebhookReceiver::start(0).await;
    let config = format!(
        "[session]\nttl_secs = 1\n{}",
        webhook_config(&hook.url, "RECALL_TEST_UNSET", "")
    );
    let h = Harness::start(&config, "").await;
    h.say("idle", "hi").await;
    let said_at = Instant::now();
    let (_, _, event) = hook
        .wait_for(Duration::from_secs(5), |e| e["session_id"] == "idle")
        .await;
    assert_eq!(event["reason"], "expired");
    assert!(said_at.elapsed() >= Duration::from_secs(1));
    assert_eq!(h.history("idle").await.0, 404);
    // Unsigned when no secret is set.
    assert!(hook.events()[0].0.is_none());
}

#[tokio::test]
async fn past_max_sessions_the_least_recently_active_is_evicted() {
    let hook = WebhookReceiver::start(0).await;
    let config = format!(
        "[session]\nmax_sessions = 2\n{}",
        webhook_config(&hook.url, "RECALL_TEST_UNSET", "")
    );
    let h = Harness::start(&config, "").await;
    h.say("old", "1").await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    h.say("mid", "2").await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    h.say("old", "3").await; // "old" is now more recent than "mid"
    tokio::time::sleep(Duration::from_millis(5)).await;
    h.say("new", "4").await;
    let (_, _, event) = hook
        .wait_for(Duration::from_secs(3), |e| e["reason"] == "evicted")
        .await;
    assert_eq!(event["session_id"], "mid");
    assert_eq!(h.history("mid").await.0, 404);
    assert_eq!(h.history("old").await.0, 200);
    assert_eq!(h.app.sessions.len(), 2);
}

#[tokio::test]
async fn the_webhook_is_retried_until_it_accepts() {
    let hook = WebhookReceiver::start(2).await;
    let h = Harness::start(&webhook_config(&hook.url, "RECALL_TEST_UNSET", ""), "").await;
    h.say("retry", "hi").await;
    let started = Instant::now();
    let (status, _) = h.api(Method::POST, "/v1/sessions/retry/end", None).await;
    assert_eq!(status, 200);
    // Ending did not wait for the webhook.
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "{:?}",
        started.elapsed()
    );
    hook.wait_for(Duration::from_secs(5), |e| e["session_id"] == "retry")
        .await;
    assert_eq!(hook.attempts(), 3);
    assert_eq!(hook.events().len(), 1);
    // Every attempt carries the event's one id, and a timestamp of its own.
    let (headers, body) = hook.deliveries().remove(0);
    let (id, _) = check_standard_headers(&headers, &body, None);
    let ids: Vec<String> = hook
        .tried()
        .iter()
        .map(|h| h["webhook-id"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, [id.clone(), id.clone(), id]);
}

/// A `whsec_` secret is the base64 of the key, as the Standard Webhooks
/// libraries read it; every event has an id of its own.
#[tokio::test]
async fn a_whsec_secret_signs_with_its_decoded_key() {
    // base64("hook-key-bytes")
    std::env::set_var(
        "RECALL_TEST_HOOK_SECRET_WHSEC",
        "whsec_aG9vay1rZXktYnl0ZXM=",
    );
    let hook = WebhookReceiver::start(0).await;
    let h = Harness::start(
        &webhook_config(&hook.url, "RECALL_TEST_HOOK_SECRET_WHSEC", ""),
        "",
    )
    .await;
    for id in ["w1", "w2"] {
        h.say(id, "hi").await;
        h.api(Method::DELETE, &format!("/v1/sessions/{id}"), None)
            .await;
        hook.wait_for(Duration::from_secs(3), |e| e["session_id"] == id)
            .await;
    }
    let ids: Vec<String> = hook
        .deliveries()
        .iter()
        .map(|(headers, body)| check_standard_headers(headers, body, Some(b"hook-key-bytes")).0)
        .collect();
    assert_ne!(ids[0], ids[1]);
}

/// A `whsec_` secret that is not base64 stops start-up, naming the key
/// (and not the secret).
#[test]
fn a_whsec_secret_that_is_not_base64_is_a_config_error() {
    std::env::set_var("RECALL_TEST_HOOK_SECRET_BAD", "whsec_not*base64");
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(format!("bad-whsec-{}.toml", std::process::id()));
    std::fs::write(
        &path,
        "[webhook]\nurl = \"http://127.0.0.1:9/hook\"\nsecret_env = \"RECALL_TEST_HOOK_SECRET_BAD\"\n\
         [[upstreams]]\nname = \"m\"\nbase_url = \"mock://echo\"\nmodels = [\"*\"]\n",
    )
    .unwrap();
    let err = recall::Config::load(&path).unwrap_err().to_string();
    assert!(err.contains("`webhook.secret_env`"), "{err}");
    assert!(err.contains("RECALL_TEST_HOOK_SECRET_BAD"), "{err}");
    assert!(!err.contains("not*base64"), "{err}");
}

#[tokio::test]
async fn trims_are_counted_and_delivered_when_asked_for() {
    let hook = WebhookReceiver::start(0).await;
    let config = format!(
        "[history]\nwindow_messages = 2\nmax_messages = 3\nwindow_chars = 0\n{}",
        webhook_config(
            &hook.url,
            "RECALL_TEST_UNSET",
            "events = [\"history_trimmed\"]"
        )
    );
    let h = Harness::start(&config, "").await;
    h.say("t", "one").await;
    h.say("t", "two").await;
    let (_, _, window) = hook
        .wait_for(Duration::from_secs(3), |e| {
            e["event"] == "history_trimmed" && e["scope"] == "window"
        })
        .await;
    assert_eq!(window["session_id"], "t");
    assert_eq!(window["reason"], "max_messages");
    // Two messages would start with the reply to "one": the window starts
    // at "two", a user message.
    assert_eq!(window["removed_count"], 2);
    let (_, _, kept) = hook
        .wait_for(Duration::from_secs(3), |e| {
            e["event"] == "history_trimmed" && e["scope"] == "history"
        })
        .await;
    assert_eq!(kept["reason"], "max_messages");
    use recall::memory::window::{TrimReason, TrimScope};
    assert!(
        h.app
            .metrics
            .trimmed(TrimScope::Window, TrimReason::MaxMessages)
            >= 1
    );
    assert!(
        h.app
            .metrics
            .trimmed(TrimScope::History, TrimReason::MaxMessages)
            >= 1
    );
    // session_ended was not asked for.
    h.api(Method::POST, "/v1/sessions/t/end", None).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(hook
        .events()
        .iter()
        .all(|e| e.2["event"] == "history_trimmed"));

    // By characters.
    let hook = WebhookReceiver::start(0).await;
    let config = format!(
        "[history]\nwindow_chars = 12\n{}",
        webhook_config(
            &hook.url,
            "RECALL_TEST_UNSET",
            "events = [\"history_trimmed\"]"
        )
    );
    let h = Harness::start(&config, "").await;
    h.say("c", "0123456789").await;
    h.say("c", "abc").await;
    let (_, _, chars) = hook
        .wait_for(Duration::from_secs(3), |e| e["reason"] == "max_chars")
        .await;
    assert_eq!(chars["scope"], "window");
}

#[tokio::test]
async fn ending_a_session_mid_reply_records_the_reply_first() {
    let hook = WebhookReceiver::start(0).await;
    let h = Harness::start(&webhook_config(&hook.url, "RECALL_TEST_UNSET", ""), "").await;
    h.upstream.push(sse_text(
        &["Once ", "upon ", "a time"],
        Duration::from_millis(200),
    ));
    let resp = h
        .post_chat(
            "mid",
            json!({"model": "m", "stream": true, "messages": [user("story")]}),
        )
        .await;
    let mut stream = resp.bytes_stream();
    use futures_util::StreamExt;
    let mut seen = String::new();
    while !seen.contains("Once") {
        seen.push_str(&String::from_utf8_lossy(
            &stream.next().await.unwrap().unwrap(),
        ));
    }
    let (status, record) = h.api(Method::POST, "/v1/sessions/mid/end", None).await;
    assert_eq!(status, 200);
    let reply = &record["contents"][1];
    assert_eq!(reply["content"], "Once ");
    assert_eq!(reply["metadata"]["interrupted"], true);
    hook.wait_for(Duration::from_secs(3), |e| e["session_id"] == "mid")
        .await;
}

#[tokio::test]
async fn eviction_never_cuts_a_reply_in_flight() {
    let hook = WebhookReceiver::start(0).await;
    let config = format!(
        "[session]\nmax_sessions = 1\n{}",
        webhook_config(&hook.url, "RECALL_TEST_UNSET", "")
    );
    let h = Harness::start(&config, "").await;
    h.upstream
        .push(sse_text(&["a ", "b ", "c"], Duration::from_millis(300)));
    let resp = h
        .post_chat(
            "streaming",
            json!({"model": "m", "stream": true, "messages": [user("go")]}),
        )
        .await;
    // A second session takes the count over the limit while the first streams.
    h.say("newcomer", "hi").await;
    let text = resp.text().await.unwrap();
    assert!(text.contains("[DONE]"), "{text}");
    assert_eq!(
        h.transcript("streaming").await,
        ["user: go", "assistant: a b c"]
    );
}

#[tokio::test]
async fn a_redirecting_webhook_is_a_failed_delivery() {
    // The receiver answers 308 to everything: nothing may count as delivered.
    let router = axum::Router::new().fallback(|| async {
        (
            axum::http::StatusCode::PERMANENT_REDIRECT,
            [("location", "http://127.0.0.1:9/elsewhere")],
        )
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = {
        let hits = std::sync::Arc::clone(&hits);
        router.layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let hits = std::sync::Arc::clone(&hits);
                async move {
                    hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    next.run(req).await
                }
            },
        ))
    };
    tokio::spawn(async move { axum::serve(listener, counted).await });
    let h = Harness::start(
        &webhook_config(&url, "RECALL_TEST_UNSET", "max_retries = 2"),
        "",
    )
    .await;
    h.say("r", "hi").await;
    h.api(Method::POST, "/v1/sessions/r/end", None).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        hits.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "every attempt is retried"
    );
}

#[tokio::test]
async fn a_regenerate_is_reported_and_the_ended_session_delivers_what_it_superseded_marked() {
    std::env::set_var("RECALL_TEST_HOOK_SECRET_RW", "hook-secret");
    let hook = WebhookReceiver::start(0).await;
    let events = "events = [\"session_ended\", \"history_rewritten\"]";
    let h = Harness::start(
        &webhook_config(&hook.url, "RECALL_TEST_HOOK_SECRET_RW", events),
        "",
    )
    .await;
    h.chat(Some("rw"), json!({"model": "m", "messages": [user("hi")]}))
        .await;
    let conversation = json!({"model": "m",
        "messages": [user("hi"), assistant("reply 1"), user("and then?")]});
    h.chat(Some("rw"), conversation.clone()).await;
    // Regenerate: the same conversation again.
    let (status, _) = h.chat(Some("rw"), conversation).await;
    assert_eq!(status, 200);

    let (_, _, event) = hook
        .wait_for(Duration::from_secs(3), |e| {
            e["event"] == "history_rewritten"
        })
        .await;
    assert_eq!(event["session_id"], "rw");
    assert_eq!(event["reason"], "regenerate");
    let gone = event["superseded"].as_array().unwrap();
    assert_eq!(gone.len(), 1, "{event}");
    assert_eq!(gone[0]["content"], "reply 2");
    assert_eq!(gone[0]["metadata"]["superseded"], true);

    // Never part of the OpenAI form, nor of the history by default.
    let (_, openai) = h
        .api(Method::GET, "/v1/sessions/rw/history?format=openai", None)
        .await;
    let sent: Vec<&Value> = openai["contents"].as_array().unwrap().iter().collect();
    assert_eq!(sent.len(), 4, "{openai}");
    assert!(sent.iter().all(|m| m["content"] != "reply 2"), "{openai}");
    assert_eq!(h.transcript("rw").await.len(), 4);
    let metrics = h.metrics().await;
    assert!(
        metrics.contains("superseded_messages_total{reason=\"regenerate\"} 1"),
        "{metrics}"
    );

    // The memory delivered at the end keeps it, marked, where it was.
    h.api(Method::POST, "/v1/sessions/rw/end", None).await;
    let (_, _, ended) = hook
        .wait_for(Duration::from_secs(3), |e| e["event"] == "session_ended")
        .await;
    let contents = ended["contents"].as_array().unwrap();
    let shown: Vec<(String, bool)> = contents
        .iter()
        .map(|m| {
            (
                m["content"].as_str().unwrap_or_default().to_owned(),
                m["metadata"]["superseded"] == true,
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("hi".into(), false),
            ("reply 1".into(), false),
            ("and then?".into(), false),
            ("reply 2".into(), true),
            ("reply 3".into(), false),
        ]
    );
}
