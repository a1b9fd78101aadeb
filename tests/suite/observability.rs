//! Metrics, request ids and logs: what an operator sees of recall.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

async fn metrics(h: &Harness) -> String {
    let resp = h
        .client
        .get(format!("{}/metrics", h.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    resp.text().await.unwrap()
}

/// The value of the sample whose line starts with `series` (name and
/// labels exactly as rendered).
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {series} in:\n{text}"))
}

#[tokio::test]
async fn metric_families_with_known_labels_are_there_at_zero_before_any_event() {
    let h = Harness::default().await;
    let text = metrics(&h).await;
    for series in [
        "recall_interruptions_total{cause=\"new_request\"}",
        "recall_interruptions_total{cause=\"shutdown\"}",
        "recall_trimmed_messages_total{scope=\"window\",reason=\"max_tokens\"}",
        "recall_trimmed_messages_total{scope=\"history\",reason=\"max_bytes\"}",
        "recall_superseded_messages_total{reason=\"regenerate\"}",
        "recall_drains_total{outcome=\"yielded\"}",
        "recall_background_yields_total{job=\"fold\"}",
        "recall_cache_lookups_total{outcome=\"hit\"}",
        "recall_webhook_deliveries_total{outcome=\"failed\"}",
        "recall_upstream_errors_total{upstream=\"mock\"}",
    ] {
        assert_eq!(sample(&text, series), 0.0, "{series}");
    }
    // Only the pairs that can happen: a window is never cut for bytes.
    assert!(
        !text.contains("scope=\"window\",reason=\"max_bytes\""),
        "{text}"
    );
}

#[tokio::test]
async fn metrics_count_requests_interruptions_sessions_and_the_proxys_own_time() {
    let h = Harness::default().await;
    h.upstream.push(completion("one"));
    h.say("m1", "hello").await;
    h.upstream
        .push(sse_text(&["two ", "parts"], Duration::ZERO));
    let resp = h
        .post_chat(
            "m1",
            json!({"model": "m", "stream": true, "messages": [user("again")]}),
        )
        .await;
    resp.text().await.unwrap();

    // A barge-in: a slow stream cut off by the next request.
    h.upstream
        .push(sse_text(&["slow ", "reply"], Duration::from_millis(500)));
    h.upstream.push(completion("after"));
    let slow = h
        .post_chat(
            "m2",
            json!({"model": "m", "stream": true, "messages": [user("tell me")]}),
        )
        .await;
    let mut slow = slow.bytes_stream();
    use futures_util::StreamExt;
    slow.next().await;
    h.say("m2", "stop").await;
    while slow.next().await.is_some() {}

    // The base-URL session form counts under the same route.
    h.upstream.push(completion("form"));
    let resp = h
        .client
        .post(format!("{}/sessions/m3/v1/chat/completions", h.url))
        .json(&json!({"model": "m", "messages": [user("hi")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // A rejected request.
    let (status, _) = h.chat(Some("m1"), json!({"messages": [user("x")]})).await;
    assert_eq!(status, 400);

    let text = metrics(&h).await;
    let chat = "recall_requests_total{route=\"/v1/chat/completions\"";
    assert_eq!(
        sample(&text, &format!("{chat},status=\"200\",upstream=\"mock\"}}")),
        5.0
    );
    assert_eq!(
        sample(&text, &format!("{chat},status=\"400\",upstream=\"\"}}")),
        1.0
    );
    assert_eq!(
        sample(&text, "recall_interruptions_total{cause=\"new_request\"}"),
        1.0
    );
    assert_eq!(sample(&text, "recall_active_sessions"), 3.0);
    // m1: 2 turns; m2: the cut reply and a turn; m3: 1 turn.
    assert_eq!(sample(&text, "recall_stored_messages"), 10.0);
    assert_eq!(
        sample(&text, "recall_overhead_seconds_count{stream=\"false\"}"),
        3.0
    );
    assert_eq!(
        sample(&text, "recall_overhead_seconds_count{stream=\"true\"}"),
        2.0
    );
    // The cut-off stream had sent no content yet (its drain may have by now).
    assert!(
        sample(
            &text,
            "recall_upstream_time_to_first_token_seconds_count{upstream=\"mock\"}"
        ) >= 1.0
    );
    assert!(text.contains("recall_request_duration_seconds_bucket{"));
    if std::env::var("RECALL_TEST_BACKEND").as_deref() == Ok("sqlite") {
        assert!(
            sample(
                &text,
                "recall_storage_write_duration_seconds_count{backend=\"sqlite\"}"
            ) >= 1.0
        );
    }
    assert!(text.ends_with("# EOF\n"));
    // No session id ever becomes a label.
    assert!(!text.contains("m1") && !text.contains("m3"), "{text}");
}

#[tokio::test]
async fn a_request_id_is_kept_from_the_client_or_made_and_always_returned() {
    let h = Harness::default().await;
    h.upstream.push(completion("a"));
    let resp = h
        .client
        .post(format!("{}/v1/chat/completions", h.url))
        .header("x-session-id", "rid")
        .header("x-request-id", "client-chosen-42")
        .json(&json!({"model": "m", "messages": [user("hi")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-request-id"], "client-chosen-42");

    let mut seen = std::collections::HashSet::new();
    for _ in 0..3 {
        let resp = h
            .client
            .get(format!("{}/v1/nothing-here", h.url))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 404);
        let id = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
        assert!(id.starts_with("req_"), "{id}");
        assert!(seen.insert(id));
    }
}

/// The recall binary with its log lines collected.
struct Logged {
    child: Child,
    url: String,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Logged {
    fn start(config: &str, env: &[(&str, &str)]) -> Self {
        let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("recall-obs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("recall.toml");
        std::fs::write(&path, config).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_recall"));
        cmd.arg("--config")
            .arg(&path)
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        for pipe in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let (lines, tx) = (Arc::clone(&lines), tx.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    if let Some(at) = line.find("127.0.0.1:") {
                        let addr: String = line[at..]
                            .chars()
                            .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
                            .collect();
                        let _ = tx.send(addr);
                    }
                    lines.lock().unwrap().push(line);
                }
            });
        }
        let addr = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("recall printed no address");
        Self {
            child,
            url: format!("http://{addr}"),
            lines,
        }
    }

    fn log(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn json_logs_carry_the_request_span_and_never_contents_or_keys() {
    if std::env::var("RECALL_TEST_BACKEND").as_deref() == Ok("redis") {
        return;
    }
    let upstream = MockUpstream::start().await;
    upstream.push(completion("A SECRET ANSWER"));
    upstream.push(sse_text(&["STREAMED ", "SECRET"], Duration::ZERO));
    // A webhook nobody listens on, so that its failures are logged too.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_port = dead.local_addr().unwrap().port();
    drop(dead);
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[log]\nformat = \"json\"\nlevel = \"debug\"\n\
         [storage]\nbackend = \"memory\"\n\
         [admin]\ntoken_env = \"OBS_ADMIN\"\n\
         [auth]\napi_keys_env = \"OBS_CLIENT_KEYS\"\n\
         [webhook]\nurl = \"http://127.0.0.1:{dead_port}/hook\"\nsecret_env = \"OBS_HOOK_SECRET\"\n\
         max_retries = 0\n\
         [[upstreams]]\nname = \"mock\"\nbase_url = \"{}\"\napi_key_env = \"OBS_UPSTREAM_KEY\"\n",
        upstream.base_url()
    );
    let recall = Logged::start(
        &config,
        &[
            ("OBS_UPSTREAM_KEY", "sk-upstream-key-0451"),
            ("OBS_CLIENT_KEYS", "sk-client-key-9876"),
            ("OBS_ADMIN", "admin-token-1234"),
            ("OBS_HOOK_SECRET", "hook-secret-5678"),
            ("RUST_LOG", "debug,hyper=info,reqwest=info,h2=info"),
        ],
    );
    let client = reqwest::Client::new();
    for stream in [false, true] {
        let resp = client
            .post(format!("{}/v1/chat/completions", recall.url))
            .header("x-session-id", "logs-1")
            .header("authorization", "Bearer sk-client-key-9876")
            .json(&json!({"model": "m", "stream": stream,
                          "messages": [user("MY PRIVATE QUESTION")]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.text().await.unwrap();
    }
    assert_eq!(
        upstream.last().headers["authorization"],
        "Bearer sk-upstream-key-0451"
    );
    // The admin ends the session: its event goes to the dead webhook.
    let resp = client
        .post(format!("{}/v1/sessions", recall.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
    let resp = client
        .get(format!("{}/v1/sessions", recall.url))
        .bearer_auth("admin-token-1234")
        .send()
        .await
        .unwrap();
    let listed: Value = resp.json().await.unwrap();
    let internal = listed["data"][0]["id"].as_str().unwrap().to_owned();
    let resp = client
        .post(format!("{}/v1/sessions/{internal}/end", recall.url))
        .bearer_auth("admin-token-1234")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // The log line of a request is written when it is answered; the
    // webhook's failure soon after.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = recall.log();
    for secret in [
        "MY PRIVATE QUESTION",
        "SECRET ANSWER",
        "STREAMED",
        "sk-client-key-9876",
        "sk-upstream-key-0451",
        "admin-token-1234",
        "hook-secret-5678",
    ] {
        assert!(
            !log.iter().any(|l| l.contains(secret)),
            "{secret} was logged:\n{}",
            log.join("\n")
        );
    }
    let answered: Vec<Value> = log
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["fields"]["message"] == "request answered")
        .collect();
    let chats: Vec<&Value> = answered
        .iter()
        .filter(|l| l["span"]["route"] == "/v1/chat/completions")
        .collect();
    assert_eq!(chats.len(), 2, "{}", log.join("\n"));
    assert!(
        log.iter().any(|l| l.contains("webhook")),
        "the webhook's failure was not logged:\n{}",
        log.join("\n")
    );
    for line in chats {
        let span = &line["span"];
        // Internal ids: the client key's tenant, then the session's id.
        assert!(
            span["session"].as_str().unwrap().ends_with(":logs-1"),
            "{line}"
        );
        assert_eq!(span["upstream"], "mock", "{line}");
        assert_eq!(span["route"], "/v1/chat/completions", "{line}");
        assert_eq!(span["status"], 200, "{line}");
        assert!(span["turn"].as_u64().is_some(), "{line}");
        assert!(span["ms"].as_f64().is_some(), "{line}");
        assert!(span["id"].as_str().unwrap().starts_with("req_"), "{line}");
    }
}
