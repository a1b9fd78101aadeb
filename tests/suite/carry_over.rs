//! Carry-over: what a user said in a session that ended reaches their next
//! session as a note, and no other user's or tenant's. The scripted mock is
//! the summary model (`SUMMARIZER`).

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use reqwest::Method;
use serde_json::{json, Value};

const KEY_A: &str = "sk-carry-a";
const KEY_B: &str = "sk-carry-b";

fn config(extra: &str) -> String {
    format!(
        "[history]\nwindow_messages = 4\n\
         [memory]\nsummarize = true\ncarry_over = true\nsummary_model = \"{SUMMARIZER}\"\n\
         summary_every_messages = 2\n{extra}\n\
         [[system_messages]]\ncontent = \"You are kind.\"\n"
    )
}

async fn harness(extra: &str) -> Harness {
    Harness::start(&config(extra), "models = [\"*\"]").await
}

async fn memory_as(
    h: &Harness,
    key: Option<&str>,
    method: Method,
    user: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = h
        .client
        .request(method, format!("{}/v1/users/{user}/memory", h.url));
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Sets `user`'s note through the memory API, which must take it.
async fn put_note(h: &Harness, user: &str, note: &str) -> Value {
    let body = json!({"note": note});
    let (status, put) = memory_as(h, None, Method::PUT, user, Some(body)).await;
    assert_eq!(status, 200, "{put}");
    put
}

/// Waits until `user` has a note, and returns it.
async fn note(h: &Harness, key: Option<&str>, user: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, n) = memory_as(h, key, Method::GET, user, None).await;
        if status == 200 {
            return n;
        }
        assert_eq!(status, 404, "{n}");
        assert!(Instant::now() < deadline, "no note for {user}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The system messages of the newest chat request upstream.
fn system_sent(h: &Harness) -> Vec<String> {
    h.upstream
        .split()
        .1
        .pop()
        .unwrap()
        .transcript()
        .into_iter()
        .filter(|m| m.starts_with("system: "))
        .collect()
}

#[tokio::test]
async fn a_users_next_session_starts_with_what_they_said_and_nobody_elses_does() {
    let h = harness("").await;
    say_as(&h, None, "ada", "first", "My name is Ada").await;
    say_as(&h, None, "ada", "first", "I live in Lisbon").await;
    say_as(&h, None, "ada", "first", "What time is it?").await;
    say_as(&h, None, "bob", "bobs", "I am Bob").await;
    let (status, _) = h.api(Method::DELETE, "/v1/sessions/first", None).await;
    assert_eq!(status, 200);
    let n = note(&h, None, "ada").await;
    // The last turn (still in the window when it ended) is carried too.
    assert_eq!(
        n["note"],
        "Known: My name is Ada | I live in Lisbon | What time is it?"
    );
    assert_eq!(n["model"], SUMMARIZER);

    say_as(&h, None, "ada", "second", "Hello again").await;
    let sent = system_sent(&h);
    assert_eq!(
        sent,
        [
            "system: You are kind.",
            "system: Previously, the user talked about: Known: My name is Ada | I live in Lisbon | What time is it?",
        ]
    );
    let (_, s) = h.api(Method::GET, "/v1/sessions/second", None).await;
    assert!(s["carried_note"].as_str().unwrap().contains("Ada"), "{s}");
    // Another user's new session, and a session with no user, get nothing.
    say_as(&h, None, "carl", "carls", "Hi").await;
    assert_eq!(system_sent(&h), ["system: You are kind."]);
    h.say("anonymous", "Hi").await;
    assert_eq!(system_sent(&h), ["system: You are kind."]);
    // Bob's session has not ended: he has no note yet.
    let (status, _) = memory_as(&h, None, Method::GET, "bob", None).await;
    assert_eq!(status, 404);

    // Ada's second session folds into the note she has.
    say_as(&h, None, "ada", "second", "I like tea").await;
    h.api(Method::DELETE, "/v1/sessions/second", None).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = note(&h, None, "ada").await;
        if n["note"].as_str().unwrap().contains("I like tea") {
            assert!(
                n["note"]
                    .as_str()
                    .unwrap()
                    .starts_with("Known: My name is Ada"),
                "{n}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "{n}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn notes_stay_within_their_tenant() {
    let keys_var = "RECALL_TEST_KEYS_CARRY";
    std::env::set_var(keys_var, format!("{KEY_A}, {KEY_B}"));
    let h = harness(&format!("[auth]\napi_keys_env = \"{keys_var}\"\n")).await;
    say_as(&h, Some(KEY_A), "ada", "s1", "My name is Ada").await;
    let (status, _) = h
        .client
        .delete(format!("{}/v1/sessions/s1", h.url))
        .bearer_auth(KEY_A)
        .send()
        .await
        .map(|r| (r.status().as_u16(), ()))
        .unwrap();
    assert_eq!(status, 200);
    note(&h, Some(KEY_A), "ada").await;
    // The other tenant's "ada" is someone else.
    let (status, _) = memory_as(&h, Some(KEY_B), Method::GET, "ada", None).await;
    assert_eq!(status, 404);
    say_as(&h, Some(KEY_B), "ada", "s2", "Hi").await;
    assert_eq!(system_sent(&h), ["system: You are kind."]);
    // Without a key, the memory API is refused.
    let (status, _) = memory_as(&h, None, Method::GET, "ada", None).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn the_memory_api_reads_edits_and_forgets_a_note_everywhere() {
    let h = harness("").await;
    let (status, _) = memory_as(&h, None, Method::GET, "ada", None).await;
    assert_eq!(status, 404);
    let put = put_note(&h, "ada", "Ada likes tea.").await;
    assert_eq!(put["model"], "manual");
    assert_eq!(note(&h, None, "ada").await["note"], "Ada likes tea.");
    for bad in [
        json!({}),
        json!({"note": ""}),
        json!({"note": 1}),
        json!("x"),
    ] {
        let (status, _) = memory_as(&h, None, Method::PUT, "ada", Some(bad)).await;
        assert_eq!(status, 400);
    }
    // A session that starts now carries it.
    say_as(&h, None, "ada", "live", "Hello").await;
    assert!(system_sent(&h)
        .contains(&"system: Previously, the user talked about: Ada likes tea.".to_owned()));

    let (status, d) = memory_as(&h, None, Method::DELETE, "ada", None).await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(d["sessions"], 1);
    let (status, _) = memory_as(&h, None, Method::GET, "ada", None).await;
    assert_eq!(status, 404);
    // The live session's copy is gone too, and its end writes no new note.
    let (_, s) = h.api(Method::GET, "/v1/sessions/live", None).await;
    assert!(s.get("carried_note").is_none(), "{s}");
    say_as(&h, None, "ada", "live", "Still here").await;
    assert_eq!(system_sent(&h), ["system: You are kind."]);
    h.api(Method::DELETE, "/v1/sessions/live", None).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _) = memory_as(&h, None, Method::GET, "ada", None).await;
    assert_eq!(status, 404);
    let (status, _) = memory_as(&h, None, Method::DELETE, "ada", None).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn an_expired_session_is_carried_over_and_a_failing_model_writes_no_note() {
    let h = harness("summary_attempts = 1\n[session]\nttl_secs = 1").await;
    say_as(&h, None, "ada", "idle", "My name is Ada").await;
    let n = note(&h, None, "ada").await;
    assert_eq!(n["note"], "Known: My name is Ada");

    h.upstream.summaries(SummaryMode::Fail(500));
    say_as(&h, None, "eve", "idle2", "My name is Eve").await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (status, _) = memory_as(&h, None, Method::GET, "eve", None).await;
    assert_eq!(status, 404);
    let metrics = h.metrics().await;
    assert!(
        metrics.contains("recall_summary_jobs_total{job=\"fold\",outcome=\"gave_up\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_conversation_whose_metadata_names_the_user_carries_over() {
    let h = harness("").await;
    put_note(&h, "ada", "Ada likes tea.").await;
    let (status, c) = h
        .api(
            Method::POST,
            "/v1/conversations",
            Some(json!({"metadata": {"user": "ada"}})),
        )
        .await;
    assert_eq!(status, 200, "{c}");
    let conv = c["id"].as_str().unwrap();
    h.respond_ok(json!({"model": "gpt-test", "conversation": conv, "input": "Hi"}))
        .await;
    assert!(system_sent(&h)
        .contains(&"system: Previously, the user talked about: Ada likes tea.".to_owned()));
}

#[tokio::test]
async fn a_delete_during_a_carry_over_is_not_written_over() {
    let h = harness("").await;
    put_note(&h, "ada", "Ada likes tea.").await;
    say_as(&h, None, "ada", "racing", "My name is Ada").await;
    // The session's last fold takes 500 ms; the memory is deleted meanwhile.
    h.upstream
        .summaries(SummaryMode::Slow(Duration::from_millis(500)));
    h.api(Method::DELETE, "/v1/sessions/racing", None).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, _) = memory_as(&h, None, Method::DELETE, "ada", None).await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, n) = memory_as(&h, None, Method::GET, "ada", None).await;
    assert_eq!(status, 404, "{n}");
    // A session that begins after the delete carries over as usual.
    h.upstream.summaries(SummaryMode::Fold);
    say_as(&h, None, "ada", "later", "I like coffee").await;
    h.api(Method::DELETE, "/v1/sessions/later", None).await;
    assert_eq!(note(&h, None, "ada").await["note"], "Known: I like coffee");
}

/// A note asks for at most `carry_over_max_tokens` (unset: the longest
/// note kept, twice `carry_over_max_chars`, / 3 rounded up, + 64).
#[tokio::test]
async fn notes_are_bounded_by_max_tokens() {
    use recall::memory::summary::headings::CARRY_HEADING;
    for (extra, max_tokens) in [
        ("", (2 * 2000_u32).div_ceil(3) + 64),
        ("carry_over_max_chars = 300", (2 * 300_u32).div_ceil(3) + 64),
        ("carry_over_max_tokens = 99", 99),
    ] {
        let h = harness(extra).await;
        say_as(&h, None, "ada", "first", "My name is Ada").await;
        h.api(Method::DELETE, "/v1/sessions/first", None).await;
        note(&h, None, "ada").await;
        let notes: Vec<Value> = h
            .upstream
            .split()
            .0
            .into_iter()
            .filter(|r| {
                r.messages()
                    .last()
                    .and_then(|m| m["content"].as_str())
                    .is_some_and(|c| c.contains(CARRY_HEADING))
            })
            .map(|r| r.body)
            .collect();
        assert_eq!(notes.len(), 1, "{extra}");
        assert_eq!(notes[0]["max_tokens"], max_tokens, "{extra}");
        assert!(notes[0].get("response_format").is_none());
    }
}

/// A user's note is written by compare-and-set on every backend: of two
/// carry-overs that read the same note (two sessions of the user ending
/// at once, on one replica or two), the second's write is refused, and so
/// is one over a note deleted since; that carry-over folds again on what
/// is there now.
#[tokio::test]
async fn a_note_is_written_only_over_the_note_it_was_folded_from() {
    use recall::memory::summary::Note;
    let h = harness("").await;
    let (notes, storage) = (&h.app.notes, &h.app.policy.storage);
    let note = |text: &str| Note {
        text: text.into(),
        model: "m".into(),
        at_ms: 1,
        forgotten: false,
    };
    let first = note("first");
    notes
        .put_if(storage, "cas", &first, None)
        .unwrap()
        .durable()
        .await
        .unwrap();
    // Both read `first`; one writes, then the other.
    let read = notes.get(storage, "cas").await.unwrap();
    assert_eq!(read.as_ref(), Some(&first));
    let a = notes
        .put_if(storage, "cas", &note("a"), read.as_ref())
        .unwrap();
    a.durable().await.unwrap();
    let b = notes
        .put_if(storage, "cas", &note("b"), read.as_ref())
        .unwrap();
    let refused = b.durable().await.expect_err("written over a's note");
    assert!(recall::store::note_changed(&refused), "{refused}");
    assert_eq!(notes.get(storage, "cas").await.unwrap(), Some(note("a")));
    // A note that did not exist when read, and does now.
    let c = notes.put_if(storage, "cas", &note("c"), None).unwrap();
    assert!(recall::store::note_changed(&c.durable().await.unwrap_err()));
    // A delete (the memory API writes unconditionally) since the read.
    let read = notes.get(storage, "cas").await.unwrap();
    let gone = Note {
        forgotten: true,
        ..note("")
    };
    notes.put(storage, "cas", &gone).durable().await.unwrap();
    let d = notes
        .put_if(storage, "cas", &note("d"), read.as_ref())
        .unwrap();
    assert!(recall::store::note_changed(&d.durable().await.unwrap_err()));
    assert_eq!(notes.get(storage, "cas").await.unwrap(), Some(gone));
}
