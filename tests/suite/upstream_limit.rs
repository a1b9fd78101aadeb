//! `[server] max_concurrent_upstream`: the upstream calls recall has in
//! flight at once, drains included. Past it a request is refused at once
//! (503, nothing stored) unless a slot can come to it: a drain gives its
//! slot up to a live request, and a barge-in takes the slot of the reply
//! it cuts, so the user is never refused for the reply they talk over.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use recall::api::responses::ids;
use serde_json::{json, Value};

const ONE_SLOT: &str = "[server]\nmax_concurrent_upstream = 1\n\
                        [interruption]\ndrain_timeout_secs = 60\n";

/// 6 s of reply.
fn story() -> Reply {
    long_reply(300, Duration::from_millis(20))
}

/// The record of a reply cut by `cut_by` whose drain gave its slot up to
/// a live request.
fn assert_yielded(record: &Value, cut_by: &str) {
    assert_eq!(record["metadata"]["interrupted"], true, "{record}");
    assert_eq!(record["metadata"]["cut_by"], cut_by, "{record}");
    assert_eq!(record["metadata"]["original_complete"], false, "{record}");
    assert_eq!(record["metadata"]["error"], "drain_yielded", "{record}");
    let heard = record["content"].as_str().unwrap();
    let original = record["metadata"]["original"].as_str().unwrap();
    assert!(heard.starts_with("Once upon a time"), "{heard}");
    assert!(original.starts_with(heard), "{original} / {heard}");
}

/// Streams a reply in `session` until it has begun, then leaves: the
/// reply is recorded as cut and its drain holds the slot.
async fn leave_draining(h: &Harness, session: &str) {
    drop(
        stream_until(h, session, "tell me a story", "Once upon")
            .await
            .0,
    );
    wait_for(h, session, 1, Duration::from_secs(5), |m| {
        m["metadata"]["interrupted"] == true
    })
    .await;
    // The drain's task takes over the upstream once it sees the cut.
    tokio::time::sleep(Duration::from_millis(200)).await;
}

async fn respond_in(h: &Harness, session: &str, body: Value) -> reqwest::Response {
    h.client
        .post(format!("{}/v1/responses", h.url))
        .header("x-session-id", session)
        .json(&body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_barge_in_takes_the_slot_of_the_reply_it_cuts() {
    let h = Harness::start(ONE_SLOT, "").await;
    h.upstream.push(story());
    h.upstream.push(completion("Sure, what about?"));
    let a = stream_until(&h, "voice", "tell me a story", "Once upon")
        .await
        .0;

    let sent = Instant::now();
    let (status, body) = h
        .chat(
            Some("voice"),
            json!({"model": "m", "messages": [user("actually, a joke")]}),
        )
        .await;
    let waited = sent.elapsed();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "Sure, what about?"
    );
    // Coarse: B did not wait for A's drain (6 s).
    assert!(
        waited < Duration::from_secs(2),
        "the barge-in waited {waited:?}"
    );

    let record = wait_for(&h, "voice", 1, Duration::from_secs(10), drain_over).await;
    assert_yielded(&record, "new_request");
    assert_eq!(h.upstream.streams_cut(), 1, "A's stream was closed");
    let stored = h.transcript("voice").await;
    assert_eq!(stored.len(), 4, "{stored:?}");
    assert_eq!(stored[3], "assistant: Sure, what about?");
    let metrics = h.metrics().await;
    assert!(
        metrics.contains("drains_total{outcome=\"yielded\"} 1"),
        "{metrics}"
    );
    drop(a);
}

#[tokio::test]
async fn a_barge_in_through_the_responses_api_takes_the_slot_of_the_response_it_cuts() {
    let h = Harness::start(ONE_SLOT, "").await;
    h.upstream.push(story());
    h.upstream.push(completion("A poem, then."));
    let resp = h
        .client
        .post(format!("{}/v1/responses", h.url))
        .json(&json!({"model": "m", "input": "tell me a story", "stream": true}))
        .send()
        .await
        .unwrap();
    let (a, seen) = read_until(resp, "Once upon").await;
    let data = seen
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .expect("an event");
    let first: Value = serde_json::from_str(data).unwrap();
    let cut_id = first["response"]["id"].as_str().unwrap().to_owned();
    let chain = ids::parse_response(&cut_id).unwrap().0;

    let (status, r) = h
        .respond(json!({"model": "m", "input": "stop, a poem", "previous_response_id": cut_id}))
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["status"], "completed", "{r}");

    let record = wait_for(&h, &chain, 1, Duration::from_secs(10), drain_over).await;
    assert_yielded(&record, "new_request");
    assert_eq!(h.upstream.streams_cut(), 1);
    let stored = h.transcript(&chain).await;
    assert_eq!(stored.len(), 4, "{stored:?}");
    drop(a);
}

#[tokio::test]
async fn live_requests_take_the_slots_of_other_sessions_drains() {
    let h = Harness::start(
        "[server]\nmax_concurrent_upstream = 2\n[interruption]\ndrain_timeout_secs = 60\n",
        "",
    )
    .await;
    h.upstream.push(story());
    h.upstream.push(story());
    h.upstream.push(story());
    h.upstream.push(completion("Hello."));
    leave_draining(&h, "gone-1").await;
    leave_draining(&h, "gone-2").await;

    // Chat takes the oldest drain's slot, and keeps it while it streams.
    let resp = h
        .post_chat(
            "chat",
            json!({"model": "m", "stream": true, "messages": [user("hi")]}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let (b, _) = read_until(resp, "Once upon").await;
    let record = wait_for(&h, "gone-1", 1, Duration::from_secs(5), drain_over).await;
    assert_yielded(&record, "client_gone");

    // The Responses API takes the other.
    let resp = respond_in(&h, "responses", json!({"model": "m", "input": "hi"})).await;
    assert_eq!(resp.status(), 200);
    let record = wait_for(&h, "gone-2", 1, Duration::from_secs(5), drain_over).await;
    assert_yielded(&record, "client_gone");
    assert_eq!(h.upstream.streams_cut(), 2);
    assert_eq!(h.transcript("responses").await.len(), 2);
    drop(b);
}

#[tokio::test]
async fn with_only_live_replies_past_the_limit_requests_are_refused_at_once_and_change_nothing() {
    let h = Harness::start(ONE_SLOT, "").await;
    h.upstream.push(long_reply(10, Duration::from_millis(100)));
    let (a, seen) = stream_until(&h, "live", "tell me a story", "Once upon").await;
    let sessions = h.app.sessions.len();

    let (status, body) = h
        .chat(
            Some("other"),
            json!({"model": "m", "messages": [user("hi")]}),
        )
        .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "overloaded");
    let stateless = h
        .client
        .post(format!("{}/v1/chat/completions", h.url))
        .json(&json!({"model": "m", "messages": [user("hi")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(stateless.status(), 503);
    assert_eq!(stateless.headers()["retry-after"], "1");
    let resp = respond_in(&h, "conversation", json!({"model": "m", "input": "hi"})).await;
    assert_eq!(resp.status(), 503);
    let (status, body) = h.respond(json!({"model": "m", "input": "hi"})).await;
    assert_eq!(status, 503, "{body}");

    for session in ["other", "conversation"] {
        assert_eq!(h.history(session).await.0, 404, "{session} was created");
    }
    assert_eq!(
        h.app.sessions.len(),
        sessions,
        "a refused request opened a session"
    );
    assert_eq!(h.upstream.received().len(), 1);
    // The live reply was not touched.
    let rest = read_rest(a).await;
    assert!(format!("{seen}{rest}").contains("[DONE]"));
    let stored = h.transcript("live").await;
    assert_eq!(stored.len(), 2, "{stored:?}");
    let (_, history) = h.history("live").await;
    assert!(history["contents"][1]["metadata"]["interrupted"].is_null());
}

#[tokio::test]
async fn a_barge_in_refused_by_the_reject_policy_leaves_the_reply_its_slot() {
    let h = Harness::start(
        "[server]\nmax_concurrent_upstream = 1\n\
         [interruption]\ndrain_timeout_secs = 60\non_new_request = \"reject\"\n",
        "",
    )
    .await;
    h.upstream.push(long_reply(20, Duration::from_millis(20)));
    let a = stream_until(&h, "voice", "tell me a story", "Once upon")
        .await
        .0;
    let (status, body) = h
        .chat(
            Some("voice"),
            json!({"model": "m", "messages": [user("a joke")]}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(h.transcript("voice").await, ["user: tell me a story"]);
    // Its claim on the reply's slot went with it: the reply, cut by its
    // client, drains to its end with nobody to yield to.
    drop(a);
    let record = wait_for(&h, "voice", 1, Duration::from_secs(10), drain_over).await;
    assert_eq!(record["metadata"]["original_complete"], true, "{record}");
    assert_eq!(h.upstream.streams_cut(), 0);
}

#[tokio::test]
async fn a_drain_asked_back_by_both_limits_yields_once() {
    let h = Harness::start(ONE_SLOT, "max_concurrent = 1\n").await;
    h.upstream.serve_one_at_a_time();
    h.upstream.push(story());
    h.upstream.push(completion("Sure."));
    let a = stream_until(&h, "voice", "tell me a story", "Once upon")
        .await
        .0;
    let (status, body) = h
        .chat(
            Some("voice"),
            json!({"model": "m", "messages": [user("a joke")]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let record = wait_for(&h, "voice", 1, Duration::from_secs(10), drain_over).await;
    assert_yielded(&record, "new_request");
    assert_eq!(h.upstream.peak_open(), 1);
    assert_eq!(h.upstream.streams_cut(), 1);
    let metrics = h.metrics().await;
    assert!(
        metrics.contains("drains_total{outcome=\"yielded\"} 1"),
        "{metrics}"
    );
    // Both slots are free again.
    h.upstream.push(completion("Again."));
    assert_eq!(h.say("other", "hello").await, "Again.");
    drop(a);
}
