//! Memory beyond the window: the running summary, through the real server,
//! with the scripted mock as the summary model (`SUMMARIZER`). Asserted on
//! what the upstream received and what is stored.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use reqwest::Method;
use serde_json::{json, Value};

/// `[history]` and `[memory]` for these tests: a window of 6, a fold every
/// `every` messages, then whatever `extra` adds.
fn config(every: usize, extra: &str) -> String {
    format!(
        "[history]\nwindow_messages = 6\nmax_messages = 1000\n\
         [memory]\nsummarize = true\nsummary_model = \"{SUMMARIZER}\"\n\
         summary_every_messages = {every}\n{extra}\n\
         [[system_messages]]\ncontent = \"You are kind.\"\n"
    )
}

async fn harness(every: usize, extra: &str) -> Harness {
    Harness::start(&config(every, extra), "models = [\"*\"]").await
}

/// The running summary `GET /v1/sessions/{id}` shows, if any.
async fn summary(h: &Harness, session: &str) -> Option<Value> {
    let (status, s) = h
        .api(Method::GET, &format!("/v1/sessions/{session}"), None)
        .await;
    assert_eq!(status, 200, "{s}");
    s.get("summary").cloned()
}

/// Folds everything outside the window now (`POST .../summarize`), after
/// any fold under way, and returns the summary: what the tests compare
/// against, whatever the background folds of fast turns got to.
async fn settle(h: &Harness, session: &str) -> Value {
    let (status, r) = h
        .api(
            Method::POST,
            &format!("/v1/sessions/{session}/summarize"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{r}");
    r["summary"].clone()
}

/// Waits until the session's summary covers up to `last_seq` at least.
async fn summary_through(h: &Harness, session: &str, last_seq: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(s) = summary(h, session).await {
            if s["last_seq"].as_u64().is_some_and(|n| n >= last_seq) {
                return s;
            }
        }
        assert!(Instant::now() < deadline, "no summary through {last_seq}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of the metric line `name` (labels included).
async fn metric(h: &Harness, name: &str) -> f64 {
    let text = h.metrics().await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// The chat requests the upstream received (not the summary model's).
fn chats(h: &Harness) -> Vec<Received> {
    h.upstream.split().1
}

fn content(m: &Value) -> &str {
    m["content"].as_str().unwrap_or_default()
}

/// Every `fact 0` to `fact {upto}` said so far is in what the upstream was
/// sent: in the window, or in the summary (`Known: ...`) right after
/// recall's system message. Returns the count of messages sent.
fn assert_within_reach(sent: &Received, upto: usize) -> usize {
    let messages = sent.messages();
    assert_eq!(content(&messages[0]), "You are kind.");
    let summary = messages
        .iter()
        .filter(|m| m["role"] == "system")
        .find_map(|m| content(m).strip_prefix("Summary of the conversation so far: "))
        .unwrap_or("");
    if !summary.is_empty() {
        assert!(content(&messages[1]).starts_with("Summary of the conversation so far: "));
    }
    let window: Vec<&str> = messages
        .iter()
        .filter(|m| m["role"] == "user")
        .map(content)
        .collect();
    for j in 0..=upto {
        let fact = format!("fact {j}");
        let in_summary = summary
            .strip_prefix("Known: ")
            .is_some_and(|k| k.split(" | ").any(|f| f == fact));
        assert!(
            in_summary || window.contains(&fact.as_str()),
            "{fact} is neither in the window {window:?} nor in the summary {summary:?}"
        );
    }
    messages.len()
}

#[tokio::test]
async fn a_sixty_turn_session_keeps_every_fact_within_reach() {
    let h = harness(4, "").await;
    let mut longest = 0;
    for i in 0..60 {
        h.say("long", &format!("fact {i}")).await;
        longest = longest.max(assert_within_reach(&chats(&h).pop().unwrap(), i));
    }
    // The window stayed small (120 messages were said): the summary
    // carried the rest. Loose bounds: on a loaded machine a fold may take
    // a few turns, which the window reaches back over meanwhile.
    assert!(longest <= 1 + 1 + 6 + 24, "a window of {longest} messages");
    let (folds, _) = h.upstream.split();
    assert!(folds.len() >= 5, "{} folds", folds.len());
    // Every fold's model request is recall's prompt with the new messages.
    let asked = content(&folds[0].messages()[1]).to_owned();
    assert!(
        asked.contains("Messages to fold in:\nuser: fact 0\nassistant: reply"),
        "{asked}"
    );
    // The stored summary covers up to a window's start, and says who wrote it.
    let s = summary(&h, "long").await.unwrap();
    assert_eq!(s["model"], SUMMARIZER);
    assert!(s["last_seq"].as_u64().unwrap() >= 60, "{s}");
    let metrics = h.metrics().await;
    assert!(
        metrics.contains("recall_summary_jobs_total{job=\"fold\",outcome=\"stored\"}"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_summary_and_a_note_survive_a_restart() {
    if std::env::var("RECALL_TEST_BACKEND").as_deref() == Ok("redis") {
        return;
    }
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("recall-summaries-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("restart.db");
    let _ = std::fs::remove_file(&db);
    let toml = config(
        2,
        &format!(
            "carry_over = true\n[storage]\nbackend = \"sqlite\"\npath = \"{}\"",
            db.display()
        ),
    );
    let first = Harness::start(&toml, "models = [\"*\"]").await;
    for i in 0..6 {
        first.say("kept", &format!("fact {i}")).await;
    }
    let before = settle(&first, "kept").await;
    first
        .api(
            Method::PUT,
            "/v1/users/ada/memory",
            Some(json!({"note": "Ada likes tea."})),
        )
        .await;
    first.app.wind_down().await;

    let second = Harness::start(&toml, "models = [\"*\"]").await;
    assert_eq!(summary(&second, "kept").await.unwrap(), before);
    let (status, note) = second.api(Method::GET, "/v1/users/ada/memory", None).await;
    assert_eq!(status, 200, "{note}");
    assert_eq!(note["note"], "Ada likes tea.");
    second.say("kept", "fact 6").await;
    assert_within_reach(&chats(&second).pop().unwrap(), 6);
}

#[tokio::test]
async fn replicas_hand_a_session_over_in_the_middle_of_a_fold() {
    let Ok(url) = std::env::var("RECALL_TEST_REDIS_URL") else {
        return;
    };
    let toml = format!(
        "{}\n[storage]\nbackend = \"redis\"\nurl = \"{url}\"\nkey_prefix = \"sum{}\"\nlease_ms = 1000\n\
         [[upstreams]]\nname = \"mock\"\nbase_url = \"{{base}}\"\nmodels = [\"*\"]\n",
        config(2, ""),
        std::process::id()
    );
    let upstream = MockUpstream::start().await;
    let toml = toml.replace("{base}", &upstream.base_url());
    let a = Harness::with_config(&toml, upstream.clone()).await;
    let b = Harness::with_config(&toml, upstream.clone()).await;
    // Folds take 300 ms: each replica's turns go on while the other's
    // fold is under way, and answers come to a replica that no longer
    // holds the session.
    upstream.summaries(SummaryMode::Slow(Duration::from_millis(300)));
    let mut fact = 0;
    for round in 0..6 {
        let replica = if round % 2 == 0 { &a } else { &b };
        for _ in 0..5 {
            replica.say("handed", &format!("fact {fact}")).await;
            assert_within_reach(&upstream.split().1.pop().unwrap(), fact);
            fact += 1;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // Whatever fold won, the one summary both replicas show covers a prefix
    // of the conversation with every fact in it, in order.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (sa, sb) = (
        summary(&a, "handed").await.unwrap(),
        summary(&b, "handed").await.unwrap(),
    );
    assert_eq!(sa, sb);
    let last = sa["last_seq"].as_u64().unwrap() as usize;
    let facts = last.div_ceil(2);
    let expected: Vec<String> = (0..facts).map(|i| format!("fact {i}")).collect();
    assert_eq!(sa["text"], format!("Known: {}", expected.join(" | ")));
    a.say("handed", &format!("fact {fact}")).await;
    assert_within_reach(&upstream.split().1.pop().unwrap(), fact);
}

#[tokio::test]
async fn the_summary_goes_between_the_sessions_system_messages_and_the_requests() {
    let h = harness(2, "").await;
    for i in 0..6 {
        h.say("order", &format!("fact {i}")).await;
    }
    settle(&h, "order").await;
    h.api(
        Method::PUT,
        "/v1/sessions/order/system_messages",
        Some(json!({"system_messages": [system("Runtime note.")]})),
    )
    .await;
    let (status, _) = h
        .chat(
            Some("order"),
            json!({"model": "gpt-test", "messages": [system("Request's own."), user("next")]}),
        )
        .await;
    assert_eq!(status, 200);
    let sent = chats(&h).pop().unwrap().transcript();
    assert_eq!(sent[0], "system: You are kind.");
    assert_eq!(sent[1], "system: Runtime note.");
    assert!(
        sent[2].starts_with("system: Summary of the conversation so far: Known: fact 0"),
        "{sent:?}"
    );
    assert_eq!(sent[3], "system: Request's own.");
    assert_eq!(sent[4].split(':').next(), Some("user"));
}

#[tokio::test]
async fn a_slow_summary_model_never_delays_a_turn() {
    let h = harness(2, "").await;
    h.upstream
        .summaries(SummaryMode::Slow(Duration::from_secs(2)));
    let mut slowest = Duration::ZERO;
    for i in 0..8 {
        let started = Instant::now();
        h.say("slow", &format!("fact {i}")).await;
        slowest = slowest.max(started.elapsed());
    }
    // A fold was asked for while the turns went on; none waited for it.
    assert!(!h.upstream.split().0.is_empty());
    assert!(
        slowest < Duration::from_millis(1000),
        "a turn took {slowest:?}"
    );
    // It lands later, and the next turn sends it.
    let s = summary_through(&h, "slow", 1).await;
    h.say("slow", "after").await;
    let sent = chats(&h).pop().unwrap().transcript();
    let shown = format!(
        "system: Summary of the conversation so far: {}",
        s["text"].as_str().unwrap()
    );
    assert!(sent.contains(&shown), "{sent:?}");
}

#[tokio::test]
async fn a_failing_summary_model_leaves_turns_working_and_the_summary_intact() {
    let h = harness(2, "summary_attempts = 1\nsummary_max_chars = 200").await;
    for i in 0..6 {
        h.say("down", &format!("fact {i}")).await;
    }
    // Everything foldable folded: no fold is left under way when the
    // model goes down.
    let before = settle(&h, "down").await;
    for mode in [
        SummaryMode::Fail(500),
        SummaryMode::Text("   ".into()),
        SummaryMode::Text("x".repeat(201)),
        // Stopped at max_tokens: short enough, but not all it meant to say.
        SummaryMode::CutOff("Known: fact 0 | fact".into()),
    ] {
        h.upstream.summaries(mode.clone());
        // The failed fold waits 30 s before the next; the endpoint asks now.
        for i in 0..4 {
            h.say("down", &format!("more {i}")).await;
        }
        let (status, e) = h
            .api(Method::POST, "/v1/sessions/down/summarize", None)
            .await;
        assert_eq!(status, 502, "{mode:?}: {e}");
        assert_eq!(e["error"]["code"], "summary_failed");
        assert_eq!(summary(&h, "down").await.unwrap(), before, "{mode:?}");
    }
    // Every turn was answered and kept; the window reached back meanwhile.
    let last = chats(&h).pop().unwrap().transcript();
    assert!(last.contains(&"user: more 0".to_owned()), "{last:?}");
    assert!(
        metric(
            &h,
            "recall_summary_jobs_total{job=\"fold\",outcome=\"failed\"}"
        )
        .await
            >= 3.0
    );
    // Back up: the next fold takes everything the summary missed.
    h.upstream.summaries(SummaryMode::Fold);
    let (status, r) = h
        .api(Method::POST, "/v1/sessions/down/summarize", None)
        .await;
    assert_eq!(status, 200, "{r}");
    let text = r["summary"]["text"].as_str().unwrap();
    assert!(text.contains("fact 0") && text.contains("more 0"), "{text}");
}

#[tokio::test]
async fn the_session_api_sets_folds_shows_and_resets_the_summary() {
    let h = harness(100, "").await;
    for i in 0..8 {
        h.say("api", &format!("fact {i}")).await;
    }
    // Not due yet (every 100): nothing folded.
    assert!(h.upstream.split().0.is_empty());
    assert_eq!(summary(&h, "api").await, None);
    let (status, r) = h
        .api(Method::POST, "/v1/sessions/api/summarize", None)
        .await;
    assert_eq!(status, 200, "{r}");
    // 16 messages, a window of 6 from the newest user message: 10 folded.
    assert_eq!(r["folded_messages"], 10);
    assert_eq!(r["summary"]["last_seq"], 9);
    assert_eq!(
        r["summary"]["text"],
        "Known: fact 0 | fact 1 | fact 2 | fact 3 | fact 4"
    );
    // The history shows it, ahead of the messages.
    let (_, history) = h.history("api").await;
    assert_eq!(history["summary"], r["summary"]);
    // Nothing more to fold: the same summary.
    let (_, again) = h
        .api(Method::POST, "/v1/sessions/api/summarize", None)
        .await;
    assert_eq!(again["folded_messages"], 0);
    assert_eq!(again["summary"], r["summary"]);

    let (status, put) = h
        .api(
            Method::PUT,
            "/v1/sessions/api/summary",
            Some(json!({"summary": "Ada, who likes tea."})),
        )
        .await;
    assert_eq!(status, 200, "{put}");
    assert_eq!(put["summary"]["model"], "manual");
    assert_eq!(put["summary"]["last_seq"], 9);
    h.say("api", "hello").await;
    let sent = chats(&h).pop().unwrap().transcript();
    assert_eq!(
        sent[1],
        "system: Summary of the conversation so far: Ada, who likes tea."
    );
    // Bad bodies change nothing.
    for bad in [
        json!({}),
        json!({"summary": ""}),
        json!({"summary": 3}),
        json!([1]),
    ] {
        let (status, _) = h
            .api(Method::PUT, "/v1/sessions/api/summary", Some(bad))
            .await;
        assert_eq!(status, 400);
    }
    assert_eq!(
        summary(&h, "api").await.unwrap()["text"],
        "Ada, who likes tea."
    );
    let (status, _) = h
        .api(
            Method::PUT,
            "/v1/sessions/nobody/summary",
            Some(json!({"summary": "x"})),
        )
        .await;
    assert_eq!(status, 404);
    // Clearing the history forgets the summary.
    h.api(Method::DELETE, "/v1/sessions/api/history", None)
        .await;
    assert_eq!(summary(&h, "api").await, None);
    h.say("api", "fresh").await;
    let sent = chats(&h).pop().unwrap().transcript();
    assert_eq!(sent, ["system: You are kind.", "user: fresh"]);
}

#[tokio::test]
async fn vendor_custom_gets_the_summary_as_a_field_too() {
    let h = Harness::start(&config(2, ""), "models = [\"*\"]\nvendor = \"custom\"").await;
    for i in 0..6 {
        h.say("custom", &format!("fact {i}")).await;
    }
    let s = settle(&h, "custom").await;
    h.say("custom", "next").await;
    let sent = chats(&h).pop().unwrap();
    assert_eq!(sent.body["recall_summary"]["text"], s["text"]);
    assert!(sent.body["recall_summary"]["last_seq"].as_u64().unwrap() >= 3);
}

#[tokio::test]
async fn an_ended_sessions_webhook_carries_its_summary() {
    let hook = WebhookReceiver::start(0).await;
    let extra = format!("[webhook]\nurl = \"{}\"\n", hook.url);
    let h = harness(2, &extra).await;
    for i in 0..6 {
        h.say("ends", &format!("fact {i}")).await;
    }
    let s = settle(&h, "ends").await;
    let (status, _) = h.api(Method::DELETE, "/v1/sessions/ends", None).await;
    assert_eq!(status, 200);
    let (_, _, ended) = hook
        .wait_for(Duration::from_secs(5), |e| e["event"] == "session_ended")
        .await;
    assert_eq!(ended["summary"]["text"], s["text"]);
}

#[tokio::test]
async fn a_summary_too_far_behind_leaves_a_counted_gap_and_the_plain_window() {
    let h = harness(2, "summary_attempts = 1\nsummary_max_lag_messages = 4").await;
    h.upstream.summaries(SummaryMode::Fail(500));
    for i in 0..8 {
        h.say("gap", &format!("fact {i}")).await;
    }
    // 16 messages, a window of 6 from the newest user message: more than
    // 4 uncovered outside it, so the plain window goes, and the gap counts.
    let sent = chats(&h).pop().unwrap().transcript();
    assert_eq!(sent.len(), 1 + 5, "{sent:?}");
    assert!(metric(&h, "recall_summary_gaps_total").await >= 1.0);
    assert_eq!(summary(&h, "gap").await, None);
}

#[tokio::test]
async fn replacing_the_history_resets_the_summary_and_the_note_comes_before_it() {
    let h = harness(2, "carry_over = true").await;
    h.api(
        Method::PUT,
        "/v1/users/ada/memory",
        Some(json!({"note": "Ada likes tea."})),
    )
    .await;
    let say = |text: String| {
        let h = &h;
        async move {
            let resp = h
                .client
                .post(format!("{}/v1/chat/completions", h.url))
                .header("x-session-id", "reset")
                .header("x-user-id", "ada")
                .json(&json!({"model": "gpt-test", "messages": [user(&text)]}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
        }
    };
    for i in 0..6 {
        say(format!("fact {i}")).await;
    }
    settle(&h, "reset").await;
    say("next".into()).await;
    let sent = chats(&h).pop().unwrap().transcript();
    assert_eq!(sent[0], "system: You are kind.");
    assert_eq!(
        sent[1],
        "system: Previously, the user talked about: Ada likes tea."
    );
    assert!(
        sent[2].starts_with("system: Summary of the conversation so far: Known: fact 0"),
        "{sent:?}"
    );
    let (status, _) = h
        .api(
            Method::PUT,
            "/v1/sessions/reset/history",
            Some(json!({"contents": [user("seeded"), assistant("ok")]})),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(summary(&h, "reset").await, None);
    say("after".into()).await;
    let sent = chats(&h).pop().unwrap().transcript();
    assert_eq!(
        sent,
        [
            "system: You are kind.",
            "system: Previously, the user talked about: Ada likes tea.",
            "user: seeded",
            "assistant: ok",
            "user: after",
        ]
    );
}

/// Every fold asks for at most `summary_max_tokens` (unset: 4,000
/// characters / 3 + 64), as plain text, and a fold cut off there is not
/// stored as a summary.
#[tokio::test]
async fn folds_are_bounded_by_max_tokens_and_a_cut_off_one_is_not_stored() {
    for (extra, max_tokens) in [("", 1398), ("summary_max_tokens = 250", 250)] {
        let h = harness(2, extra).await;
        for i in 0..6 {
            h.say("bounded", &format!("fact {i}")).await;
        }
        settle(&h, "bounded").await;
        let folds = h.upstream.split().0;
        assert!(!folds.is_empty());
        for f in &folds {
            assert_eq!(f.body["max_tokens"], max_tokens, "{extra}: {}", f.body);
            assert!(f.body.get("response_format").is_none(), "{}", f.body);
        }
    }

    let h = harness(2, "summary_attempts = 1").await;
    h.upstream
        .summaries(SummaryMode::CutOff("Known: fact 0 | fact 1 | fa".into()));
    for i in 0..6 {
        h.say("cut", &format!("fact {i}")).await;
    }
    let (status, e) = h
        .api(Method::POST, "/v1/sessions/cut/summarize", None)
        .await;
    assert_eq!(status, 502, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_tokens")),
        "{e}"
    );
    assert_eq!(summary(&h, "cut").await, None);
}
