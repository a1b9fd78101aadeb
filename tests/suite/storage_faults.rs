//! Storage writes that fail, through the real server: what the client is
//! told, what the history holds after, and what a restart finds.
//!
//! The faults are injected by `recall::store::faults` (the
//! `fault-injection` feature, on for this crate's tests only) inside the
//! writer's real units: SQLite's per-session savepoint or the whole
//! round's commit, Redis's per-session script call. These run on SQLite, or
//! on Redis when `RECALL_TEST_BACKEND=redis`.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use recall::store::faults::Faults;
use recall::store::Op;
use serde_json::{json, Value};

/// Where the sessions of one test live, across its restarts.
enum Backend {
    Sqlite(PathBuf),
    Redis { url: String, prefix: String },
}

fn backend(name: &str) -> Backend {
    let tag = format!("{name}-{}", std::process::id());
    match std::env::var("RECALL_TEST_BACKEND").as_deref() {
        Ok("redis") => Backend::Redis {
            url: std::env::var("RECALL_TEST_REDIS_URL")
                .expect("RECALL_TEST_BACKEND=redis needs RECALL_TEST_REDIS_URL"),
            prefix: format!("faults-{tag}"),
        },
        _ => {
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("recall-faults");
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join(format!("{tag}.db"));
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
            Backend::Sqlite(path)
        }
    }
}

impl Backend {
    fn section(&self) -> String {
        match self {
            Backend::Sqlite(path) => {
                format!(
                    "[storage]\nbackend = \"sqlite\"\npath = \"{}\"\n",
                    path.display()
                )
            }
            Backend::Redis { url, prefix } => format!(
                "[storage]\nbackend = \"redis\"\nurl = \"{url}\"\nkey_prefix = \"{prefix}\"\n"
            ),
        }
    }

    /// A recall on this storage in front of `upstream`.
    async fn start(&self, upstream: &MockUpstream, config: &str) -> Harness {
        let toml = format!(
            "{config}\n{}\n[[upstreams]]\nname = \"mock\"\nbase_url = \"{}\"\n",
            self.section(),
            upstream.base_url()
        );
        Harness::with_config(&toml, upstream.clone()).await
    }

    /// Stops `h` (its storage flushed) and starts another recall on the
    /// same storage: what it finds is what was stored.
    async fn restart(&self, h: Harness, config: &str) -> Harness {
        h.app.wind_down().await;
        let upstream = h.upstream.clone();
        drop(h);
        self.start(&upstream, config).await
    }
}

fn faults(h: &Harness) -> &Faults {
    h.app
        .policy
        .storage
        .faults()
        .expect("persistent storage has fault hooks")
}

/// Whether `op` stores a message of `role` whose text is `text`.
fn pushes(op: &Op, role: &'static str, text: Option<&'static str>) -> bool {
    matches!(op, Op::Push { message, .. }
        if message.role == role && text.is_none_or(|t| message.content == t))
}

/// What one request's client saw.
struct Answer {
    status: u16,
    retry_header: Option<String>,
    /// The JSON body, or the SSE text.
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }

    /// A 200 whose end arrived: for a stream, `[DONE]` and no error event.
    fn acknowledged(&self) -> bool {
        self.status == 200
            && !self.body.contains("\"error\"")
            && (self.body.contains("[DONE]") || self.json()["choices"].is_array())
    }

    /// The client was told storage failed: a 503 or a stream's error event.
    fn told_storage_failed(&self) -> bool {
        self.body.contains("storage_unavailable")
    }
}

async fn send(h: &Harness, session: &str, messages: Value, stream: bool, retry: u32) -> Answer {
    let mut req = h
        .client
        .post(format!("{}/v1/chat/completions", h.url))
        .header("x-session-id", session)
        .json(&json!({"model": "m", "stream": stream, "messages": messages}));
    if retry > 0 {
        req = req.header("x-stainless-retry-count", retry.to_string());
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let retry_header = resp
        .headers()
        .get("x-should-retry")
        .map(|v| v.to_str().unwrap().to_owned());
    Answer {
        status,
        retry_header,
        body: resp.text().await.unwrap(),
    }
}

async fn say(h: &Harness, session: &str, text: &str, stream: bool, retry: u32) -> Answer {
    send(h, session, json!([user(text)]), stream, retry).await
}

/// The user messages of a transcript.
fn said(transcript: &[String]) -> Vec<String> {
    transcript
        .iter()
        .filter_map(|l| l.strip_prefix("user: ").map(str::to_owned))
        .collect()
}

/// Attempted, acknowledged, found, lost and duplicated turns of one
/// session, printed; lost and duplicated must be 0.
fn figures(test: &str, attempted: usize, acknowledged: &[&str], found: &[String]) {
    let lost = acknowledged
        .iter()
        .filter(|t| !found.iter().any(|f| f == *t))
        .count();
    let mut sorted = found.to_vec();
    sorted.sort();
    let before = sorted.len();
    sorted.dedup();
    let duplicated = before - sorted.len();
    eprintln!(
        "storage_faults {test}: attempted {attempted}, acknowledged {}, found {}, lost {lost}, duplicated {duplicated}",
        acknowledged.len(),
        found.len()
    );
    assert_eq!((lost, duplicated), (0, 0), "{found:?}");
}

fn check_503(a: &Answer) {
    assert_eq!(a.status, 503, "{}", a.body);
    let e = &a.json()["error"];
    assert_eq!(e["code"], "storage_unavailable", "{e}");
    assert_eq!(e["type"], "server_error");
    assert_eq!(a.retry_header.as_deref(), Some("true"));
}

/// The user's message is not stored: a 503, the history as it was, and
/// the SDK's retry runs the turn once (and it survives a restart).
#[tokio::test]
async fn a_failed_write_of_the_user_message_is_a_503_and_its_retry_runs_once() {
    for stream in [false, true] {
        let b = backend(&format!("user-write-{stream}"));
        let upstream = MockUpstream::start().await;
        let h = b.start(&upstream, "").await;
        assert!(say(&h, "u", "one", false, 0).await.acknowledged());
        let before = h.transcript("u").await;

        faults(&h).fail_batches(1, |op| pushes(op, "user", Some("two")));
        if stream {
            upstream.push(sse_text(&["a ", "stream"], Duration::ZERO));
        }
        let failed = say(&h, "u", "two", stream, 0).await;
        if stream {
            // The head went out before the write failed: the stream ends
            // with an error event in place of `[DONE]`.
            assert_eq!(failed.status, 200);
            assert!(failed.told_storage_failed(), "{}", failed.body);
            assert!(!failed.body.contains("[DONE]"), "{}", failed.body);
        } else {
            check_503(&failed);
        }
        assert_eq!(
            h.transcript("u").await,
            before,
            "the failed turn is not in the history"
        );

        let calls = upstream.received().len();
        let retried = say(&h, "u", "two", false, 1).await;
        assert!(retried.acknowledged(), "{}", retried.body);
        assert_eq!(upstream.received().len(), calls + 1, "the retry ran once");
        assert_eq!(
            upstream.last().transcript(),
            ["user: one", "assistant: reply 1", "user: two"]
        );
        let after = h.transcript("u").await;
        assert_eq!(said(&after), ["one", "two"]);
        assert_eq!(after.len(), 4, "{after:?}");

        let h = b.restart(h, "").await;
        let found = h.transcript("u").await;
        assert_eq!(found, after, "a restart finds what the client was told");
        figures(
            &format!("user_message_write_failed(stream={stream})"),
            3,
            &["one", "two"],
            &said(&found),
        );
    }
}

/// The reply's record is not stored: the client is not told the turn
/// happened, the history holds the user's message without a reply, and
/// the retry answers it once.
#[tokio::test]
async fn a_failed_write_of_the_reply_is_reported_and_the_history_stays_consistent() {
    for stream in [false, true] {
        let b = backend(&format!("reply-write-{stream}"));
        let upstream = MockUpstream::start().await;
        let h = b.start(&upstream, "").await;
        assert!(say(&h, "r", "one", false, 0).await.acknowledged());

        faults(&h).fail_batches(1, |op| pushes(op, "assistant", None));
        if stream {
            upstream.push(sse_text(&["lost ", "words"], Duration::ZERO));
        }
        let failed = say(&h, "r", "two", stream, 0).await;
        if stream {
            assert_eq!(failed.status, 200);
            assert!(failed.told_storage_failed(), "{}", failed.body);
            assert!(!failed.body.contains("[DONE]"), "{}", failed.body);
        } else {
            check_503(&failed);
        }
        // The user's message was stored before the reply failed.
        assert_eq!(
            h.transcript("r").await,
            ["user: one", "assistant: reply 1", "user: two"]
        );
        let calls = upstream.received().len();
        let retried = say(&h, "r", "two", false, 1).await;
        assert!(retried.acknowledged(), "{}", retried.body);
        assert_eq!(upstream.received().len(), calls + 1);
        let after = h.transcript("r").await;
        assert_eq!(said(&after), ["one", "two"]);
        assert_eq!(after.len(), 4, "{after:?}");
        assert!(!after.iter().any(|l| l.contains("lost words")), "{after:?}");

        let h = b.restart(h, "").await;
        let found = h.transcript("r").await;
        assert_eq!(found, after);
        figures(
            &format!("reply_write_failed(stream={stream})"),
            3,
            &["one", "two"],
            &said(&found),
        );
    }
}

/// Two sessions' writes in one round; one of them fails. The other is
/// stored and its client gets its answer.
#[tokio::test]
async fn a_failed_write_fails_only_its_own_session_in_the_round() {
    let b = backend("one-round");
    let upstream = MockUpstream::start().await;
    let h = std::sync::Arc::new(b.start(&upstream, "").await);
    // Loaded sessions: a session's first lookup waits for the writer.
    assert!(say(&h, "round-a", "hello a", false, 0).await.acknowledged());
    assert!(say(&h, "round-b", "hello b", false, 0).await.acknowledged());
    faults(&h).pause();
    let (ha, hb) = (h.clone(), h.clone());
    let a = tokio::spawn(async move { say(&ha, "round-a", "from a", false, 0).await });
    let bb = tokio::spawn(async move { say(&hb, "round-b", "from b", false, 0).await });
    // Both turns have queued their writes behind the paused writer.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while upstream.received().len() < 4 {
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    faults(&h).fail_session("round-a", 1);
    faults(&h).resume();
    let (a, bb) = (a.await.unwrap(), bb.await.unwrap());
    assert!(
        faults(&h).largest_round() >= 2,
        "both sessions were written in one round"
    );
    check_503(&a);
    assert!(bb.acknowledged(), "{}", bb.body);
    let found_b = h.transcript("round-b").await;
    assert_eq!(said(&found_b), ["hello b", "from b"]);
    assert_eq!(found_b.len(), 4, "{found_b:?}");
    // Session a holds what it held before the failed turn; its retry runs
    // the turn once.
    let found_a = h.transcript("round-a").await;
    assert_eq!(said(&found_a), ["hello a"]);
    assert!(say(&h, "round-a", "from a", false, 1).await.acknowledged());
    let found_a = said(&h.transcript("round-a").await);
    assert_eq!(found_a, ["hello a", "from a"]);
    eprintln!(
        "storage_faults one_round: {} batches in the round, session a failed, session b stored",
        faults(&h).largest_round()
    );
}

/// A session whose first write failed is found again after a restart with
/// what was stored since, and nothing else: no messages of the failed
/// write are mixed in, and none are left behind unloadable.
#[tokio::test]
async fn a_session_whose_first_write_failed_is_loadable_after_a_restart() {
    let b = backend("first-save");
    let upstream = MockUpstream::start().await;
    let h = b.start(&upstream, "").await;
    // The first write of `fresh`: its Save and its first message.
    faults(&h).fail_batches(1, |op| matches!(op, Op::Save { id, .. } if id == "fresh"));
    let failed = say(&h, "fresh", "first", false, 0).await;
    check_503(&failed);
    // The client does not retry: it goes on.
    assert!(say(&h, "fresh", "second", false, 0).await.acknowledged());
    assert!(say(&h, "fresh", "third", false, 0).await.acknowledged());
    let live = h.transcript("fresh").await;
    let h = b.restart(h, "").await;
    let found = h.transcript("fresh").await;
    assert_eq!(found, live);
    assert_eq!(said(&found), ["second", "third"]);
    // Every stored message row is in the history: none left over.
    let listed = h.app.policy.storage.list(None, 10, None).await.unwrap();
    let row = listed.iter().find(|l| l.id == "fresh").expect("listed");
    assert_eq!(row.message_count, found.len());
    figures("first_write_failed", 3, &["second", "third"], &said(&found));
}

/// A session busy in a tool loop stores its last activity on every turn,
/// though its turn number does not move: no sweeper takes it for idle.
#[tokio::test]
async fn a_tool_loop_stores_its_last_activity_every_turn() {
    let b = backend("tool-loop");
    let upstream = MockUpstream::start().await;
    let h = b.start(&upstream, "").await;
    let call = |n: usize| Reply::Json {
        status: 200,
        body: json!({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": null,
                    "tool_calls": [{"id": format!("call_{n}"), "type": "function",
                                    "function": {"name": "look", "arguments": "{}"}}]}}]}),
        headers: vec![],
    };
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    upstream.push(call(0));
    assert!(say(&h, "loop", "go", false, 0).await.acknowledged());
    let mut stored = Vec::new();
    for n in 0..5 {
        tokio::time::sleep(Duration::from_millis(30)).await;
        upstream.push(call(n + 1));
        let sent_at = now();
        let result =
            json!([{"role": "tool", "tool_call_id": format!("call_{n}"), "content": "ok"}]);
        assert!(send(&h, "loop", result, false, 0).await.acknowledged());
        let listed = h.app.policy.storage.list(None, 10, None).await.unwrap();
        let meta = &listed.iter().find(|l| l.id == "loop").expect("stored").meta;
        stored.push(meta.last_active_ms);
        assert!(
            meta.last_active_ms >= sent_at,
            "tool turn {n}: stored last activity {} is before the turn ({sent_at})",
            meta.last_active_ms
        );
    }
    eprintln!(
        "storage_faults tool_loop: 5 tool turns, stored last activity moved every turn: {stored:?}"
    );
}

/// A session whose deletion storage refuses has not ended: nothing of it
/// is announced (`session_ended`) or carried into its user's note, and it
/// is still there; ending it again does both, once.
#[tokio::test]
async fn a_refused_delete_announces_and_carries_over_nothing() {
    let b = backend("refused-delete");
    let upstream = MockUpstream::start().await;
    let hook = WebhookReceiver::start(0).await;
    let config = format!(
        "[webhook]\nurl = \"{}\"\nretry_backoff_ms = 20\n\
         [memory]\nsummarize = true\ncarry_over = true\nsummary_model = \"{SUMMARIZER}\"\n",
        hook.url
    );
    let h = b.start(&upstream, &config).await;
    say_as(&h, None, "ada", "ending", "My name is Ada").await;
    faults(&h).fail_batches(
        1,
        |op| matches!(op, Op::Delete { id, .. } if id == "ending"),
    );
    let end = || async {
        h.client
            .delete(format!("{}/v1/sessions/ending", h.url))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    let note = || async {
        let r = h
            .client
            .get(format!("{}/v1/users/ada/memory", h.url))
            .send()
            .await
            .unwrap();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        v["note"].as_str().unwrap_or_default().to_owned()
    };
    assert_eq!(end().await, 503);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (heard, noted) = (hook.events().len(), note().await);
    assert_eq!(heard, 0, "an end storage refused was announced");
    assert_eq!(noted, "", "an end storage refused was carried over");
    let (status, _) = h.history("ending").await;
    assert_eq!(status, 200, "the session is still stored");

    assert_eq!(end().await, 200);
    hook.wait_for(Duration::from_secs(5), |e| e["session_id"] == "ending")
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while note().await.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no carry-over after the end"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(hook.events().len(), 1, "announced once");
    eprintln!("a refused delete: 503, {heard} events, note {noted:?}; then 200, 1 event, a note");
}
