//! `max_concurrent` on an upstream: the requests recall has open to it at
//! once, live turns first. The mock here serves one request at a time, as
//! llama.cpp's server does with its one slot: a barge-in must not wait for
//! the drain of the reply it cut, live requests past the limit wait in
//! order instead of piling up inside the server, and recall's own
//! background calls (here long-term memory's) come after them all.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use reqwest::Method;
use serde_json::{json, Value};

#[tokio::test]
async fn a_barge_in_takes_the_only_slot_from_the_drain_of_the_reply_it_cut() {
    // Without the limit, B's request would queue inside the one-slot
    // server behind A's drain: 6 s of reply nobody hears.
    let h = Harness::start(
        "[interruption]\ndrain_timeout_secs = 60\n",
        "max_concurrent = 1\n",
    )
    .await;
    h.upstream.serve_one_at_a_time();
    h.upstream.push(long_reply(300, Duration::from_millis(20)));
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
    println!("the barge-in was answered after {waited:?}; A had 6 s of reply left");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "Sure, what about?"
    );
    // Coarse: only shows that B did not wait for A's drain (6 s).
    assert!(
        waited < Duration::from_secs(2),
        "the barge-in waited {waited:?}"
    );

    let record = wait_for(&h, "voice", 1, Duration::from_secs(10), drain_over).await;
    assert_eq!(record["metadata"]["interrupted"], true);
    assert_eq!(record["metadata"]["cut_by"], "new_request");
    assert_eq!(record["metadata"]["original_complete"], false);
    assert_eq!(record["metadata"]["error"], "drain_yielded");
    let heard = record["content"].as_str().unwrap();
    let original = record["metadata"]["original"].as_str().unwrap();
    assert!(heard.starts_with("Once upon a time"), "{heard}");
    assert!(original.starts_with(heard), "{original} / {heard}");
    assert_eq!(h.upstream.streams_cut(), 1, "A's stream was closed");
    assert_eq!(h.upstream.peak_open(), 1);
    // B's turn follows A's record; nothing else was stored.
    assert_eq!(
        h.transcript("voice").await.len(),
        4,
        "{:?}",
        h.transcript("voice").await
    );
    let metrics = h.metrics().await;
    assert!(
        metrics.contains("drains_total{outcome=\"yielded\"} 1"),
        "{metrics}"
    );
    drop(a);
}

#[tokio::test]
async fn a_drain_nobody_waits_for_keeps_its_slot_and_records_the_whole_original() {
    let h = Harness::start(
        "[interruption]\ndrain_timeout_secs = 60\n",
        "max_concurrent = 1\n",
    )
    .await;
    h.upstream.serve_one_at_a_time();
    h.upstream.push(long_reply(20, Duration::from_millis(10)));
    let a = stream_until(&h, "alone", "tell me a story", "Once upon")
        .await
        .0;
    drop(a);
    let record = wait_for(&h, "alone", 1, Duration::from_secs(10), drain_over).await;
    assert_eq!(record["metadata"]["original_complete"], true);
    assert!(record["metadata"]["error"].is_null(), "{record}");
    assert_eq!(h.upstream.streams_cut(), 0);
}

#[tokio::test]
async fn live_requests_past_the_limit_wait_in_order_and_each_is_answered() {
    let h = Harness::start("", "max_concurrent = 2\n").await;
    let n = 6;
    // Each reply holds its slot for 360 ms, and requests arrive 80 ms
    // apart: four of them wait, in an order no scheduling jitter of a
    // loaded machine reverses.
    for _ in 0..n {
        h.upstream.push(long_reply(12, Duration::from_millis(30)));
    }
    let mut calls = Vec::new();
    for i in 0..n {
        let h = &h;
        calls.push(async move {
            // Sent in order, a little apart.
            tokio::time::sleep(Duration::from_millis(80 * i as u64)).await;
            let resp = h
                .post_chat(
                    &format!("s{i}"),
                    json!({"model": "m", "stream": true, "messages": [user(&format!("q{i}"))]}),
                )
                .await;
            (resp.status(), resp.text().await.unwrap())
        });
    }
    let results = futures_util::future::join_all(calls).await;
    let answered = results
        .iter()
        .filter(|(s, body)| *s == 200 && body.contains("[DONE]"))
        .count();
    println!(
        "attempted {n}, answered {answered}, upstream peak {}",
        h.upstream.peak_open()
    );
    assert_eq!(answered, n, "{results:?}");
    assert_eq!(h.upstream.peak_open(), 2);
    let order: Vec<String> = h
        .upstream
        .received()
        .iter()
        .map(|r| r.transcript().last().cloned().unwrap_or_default())
        .collect();
    let expected: Vec<String> = (0..n).map(|i| format!("user: q{i}")).collect();
    assert_eq!(order, expected, "the upstream got them out of order");
}

#[tokio::test]
async fn a_request_that_finds_no_slot_within_its_timeout_gets_a_503_that_says_so() {
    let h = Harness::start("", "max_concurrent = 1\ntimeout_secs = 1\n").await;
    h.upstream.push(long_reply(10, Duration::from_millis(300)));
    let a = stream_until(&h, "first", "tell me a story", "Once upon")
        .await
        .0;
    let (status, body) = h
        .chat(
            Some("second"),
            json!({"model": "m", "messages": [user("hello")]}),
        )
        .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "upstream_busy");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_concurrent = 1"),
        "{body}"
    );
    // Only A reached the upstream; B's message is kept, as for any failed call.
    assert_eq!(h.upstream.received().len(), 1);
    assert_eq!(h.transcript("second").await, ["user: hello"]);
    drop(a);
}

#[tokio::test]
async fn a_request_barged_in_while_it_waits_for_a_slot_is_never_sent() {
    let h = Harness::start("", "max_concurrent = 1\n").await;
    h.upstream.push(long_reply(20, Duration::from_millis(30)));
    h.upstream.push(completion("Sure."));
    let mut first = stream_until(&h, "other", "tell me a story", "Once upon")
        .await
        .0;
    let reader = tokio::spawn(async move { while first.next().await.is_some() {} });

    // B waits for the slot; the user talks over it before it was sent.
    let waiting = {
        let (client, url) = (h.client.clone(), h.url.clone());
        tokio::spawn(async move {
            client
                .post(format!("{url}/v1/chat/completions"))
                .header("x-session-id", "voice")
                .json(&json!({"model": "m", "messages": [user("what time is it")]}))
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let (status, body) = h
        .chat(
            Some("voice"),
            json!({"model": "m", "messages": [user("no, the date")]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "Sure.");
    assert_ne!(waiting.await.unwrap(), 200);
    reader.await.unwrap();

    let sent: Vec<String> = h
        .upstream
        .received()
        .iter()
        .map(|r| r.transcript().last().cloned().unwrap_or_default())
        .collect();
    assert_eq!(sent, ["user: tell me a story", "user: no, the date"]);
    let stored = h.transcript("voice").await;
    assert_eq!(
        stored.first().map(String::as_str),
        Some("user: what time is it")
    );
    assert_eq!(stored.last().map(String::as_str), Some("assistant: Sure."));
}

#[tokio::test]
async fn a_full_upstream_hands_the_request_to_its_fallback() {
    let upstream = MockUpstream::start().await;
    let url = upstream.base_url();
    let toml = format!(
        "[[upstreams]]\nname = \"local\"\nbase_url = \"{url}\"\nmax_concurrent = 1\n\
         timeout_secs = 1\nfallback = \"backup\"\n\
         [[upstreams]]\nname = \"backup\"\nbase_url = \"{url}\"\nmodels = [\"backup-only\"]\n"
    );
    let h = Harness::with_config(&toml, upstream).await;
    h.upstream.push(long_reply(10, Duration::from_millis(300)));
    h.upstream.push(completion("From the backup."));
    let a = stream_until(&h, "first", "tell me a story", "Once upon")
        .await
        .0;
    let (status, body) = h
        .chat(
            Some("second"),
            json!({"model": "m", "messages": [user("hello")]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "From the backup.");
    assert_eq!(h.upstream.received().len(), 2);
    drop(a);
}

/// Long-term memory with the mock as its models, extracting only when a
/// session ends, with one attempt per job: a yield counted as a failed
/// attempt would give up and store nothing.
const LONG_TERM: &str = "[long_term]\nenabled = true\nextract_model = \"extractor\"\n\
    embedding_model = \"embedder\"\nattempts = 1\nextract_every_turns = 1000\n";

const ONE_SLOT: &str = "models = [\"*\"]\nmax_concurrent = 1\n";

/// What the mock's extraction takes, when slow: far longer than a live
/// turn here.
const BACKGROUND: Duration = Duration::from_secs(5);

const PEANUTS: &str = "I am allergic to peanuts";

async fn timed<F: std::future::Future>(f: F) -> Duration {
    let started = Instant::now();
    f.await;
    started.elapsed()
}

/// `user`'s long-term records.
async fn records(h: &Harness, user: &str) -> Vec<Value> {
    let path = format!("/v1/users/{user}/memory/records?limit=100");
    let (status, page) = h.api(Method::GET, &path, None).await;
    assert_eq!(status, 200, "{page}");
    page["data"].as_array().unwrap().clone()
}

/// Waits until `user` has a record.
async fn stored(h: &Harness, user: &str) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found = records(h, user).await;
        if !found.is_empty() {
            return found;
        }
        assert!(Instant::now() < deadline, "nothing was extracted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of the metric line `name` (labels included).
async fn metric(h: &Harness, name: &str) -> u64 {
    let text = h.metrics().await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// What the upstream received, in order: `extract`, `embed`, or a turn's
/// last message.
fn sent(h: &Harness) -> Vec<String> {
    h.upstream
        .received()
        .iter()
        .map(|r| {
            if r.path.ends_with("/embeddings") {
                "embed".to_owned()
            } else if r.body["model"] == EXTRACTOR {
                "extract".to_owned()
            } else {
                r.transcript().last().cloned().unwrap_or_default()
            }
        })
        .collect()
}

#[tokio::test]
async fn a_background_call_in_flight_gives_the_only_slot_to_a_live_turn_and_is_made_again() {
    let h = Harness::start(LONG_TERM, ONE_SLOT).await;
    h.upstream.serve_one_at_a_time();
    say_as(&h, None, "ana", "s1", &format!("{PEANUTS}.")).await;
    let alone = timed(h.say("other", "hello")).await;

    // The session's end extracts its facts: a call that holds the one slot
    // (recall's and the server's) for 5 s.
    h.upstream.extractions(LongTermMode::Slow(BACKGROUND));
    let ended = h.api(Method::DELETE, "/v1/sessions/s1", None).await;
    assert_eq!(ended.0, 200, "{ended:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.upstream.extraction_requests().is_empty() {
        assert!(Instant::now() < deadline, "the extraction was never sent");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Made again, it is answered at once.
    h.upstream.extractions(LongTermMode::Echo);
    let with = timed(h.say("other", "and now?")).await;
    println!(
        "a live turn on a one-slot upstream: {alone:?} alone, {with:?} while an extraction \
         of {BACKGROUND:?} was in flight"
    );
    // Coarse: only shows that the live turn did not wait for the extraction.
    assert!(with < BACKGROUND / 3, "the live turn waited {with:?}");

    // The extraction was cut, counted, made again and stored once.
    let records = stored(&h, "ana").await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["text"], PEANUTS);
    assert_eq!(
        sent(&h),
        [
            &format!("user: {PEANUTS}."),
            "user: hello",
            "extract",
            "user: and now?",
            "extract",
            "embed",
        ]
    );
    let yields = "recall_background_yields_total{job=\"extract\"}";
    assert_eq!(metric(&h, yields).await, 1);
    let jobs = |outcome: &str| {
        format!("recall_long_term_jobs_total{{job=\"extract\",outcome=\"{outcome}\"}}")
    };
    assert_eq!(metric(&h, &jobs("stored")).await, 1);
    assert_eq!(
        metric(&h, &jobs("failed")).await,
        0,
        "a yield is no failed attempt"
    );
    assert_eq!(metric(&h, &jobs("gave_up")).await, 0);
    assert_eq!(h.upstream.peak_open(), 1);
}

/// A live turn sent while a streamed reply holds the one slot: how long
/// it takes. With `due`, a session's end first leaves an extraction
/// waiting for that slot too.
async fn behind_a_stream(h: &Harness, run: &str, due: Option<&str>) -> Duration {
    h.upstream.push(long_reply(40, Duration::from_millis(30)));
    let (first, _) = stream_until(h, &format!("{run}-story"), "tell me a story", "Once upon").await;
    let reader = tokio::spawn(read_rest(first));
    if let Some(session) = due {
        let ended = h
            .api(Method::DELETE, &format!("/v1/sessions/{session}"), None)
            .await;
        assert_eq!(ended.0, 200, "{ended:?}");
    }
    // The extraction, if any, waits for the slot before the live turn does.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let took = timed(h.say(&format!("{run}-live"), "what time is it?")).await;
    reader.await.unwrap();
    took
}

#[tokio::test]
async fn a_live_turn_goes_before_the_background_jobs_due_on_a_one_slot_upstream() {
    let h = Harness::start(LONG_TERM, ONE_SLOT).await;
    h.upstream.serve_one_at_a_time();
    say_as(&h, None, "ana", "s1", &format!("{PEANUTS}.")).await;
    h.upstream.extractions(LongTermMode::Slow(BACKGROUND));
    let alone = behind_a_stream(&h, "alone", None).await;
    let with = behind_a_stream(&h, "due", Some("s1")).await;
    println!(
        "a live turn behind a streamed reply on a one-slot upstream: {alone:?} alone, \
         {with:?} with an extraction of {BACKGROUND:?} due ({:.2}x)",
        with.as_secs_f64() / alone.as_secs_f64()
    );
    // Coarse: only shows that the live turn did not wait for the extraction.
    assert!(with < BACKGROUND / 2, "the live turn waited {with:?}");
    // It went first, and nothing had to yield; the extraction then ran.
    assert_eq!(stored(&h, "ana").await.len(), 1);
    let order = sent(&h);
    assert_eq!(
        order[order.len() - 4..],
        [
            "user: tell me a story",
            "user: what time is it?",
            "extract",
            "embed"
        ],
        "{order:?}"
    );
    assert_eq!(
        metric(&h, "recall_background_yields_total{job=\"extract\"}").await,
        0
    );
}
