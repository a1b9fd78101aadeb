//! Interruptions: what was said, what was cut off, and the complete
//! original, under client disconnects, barge-in and the interrupt endpoint.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const JOKE: [&str; 4] = [
    "Why did ",
    "the scarecrow ",
    "win an award? ",
    "He was outstanding.",
];
const JOKE_TEXT: &str = "Why did the scarecrow win an award? He was outstanding.";

fn interrupted(m: &Value) -> bool {
    m["metadata"]["interrupted"] == true
}

fn original_complete(m: &Value) -> bool {
    m["metadata"]["original_complete"] == true
}

#[tokio::test]
async fn a_client_that_goes_away_mid_stream_leaves_an_interrupted_record_with_the_whole_original() {
    let h = Harness::default().await;
    h.upstream.push(sse_text(&JOKE, Duration::from_millis(250)));
    let (stream, _) = stream_until(&h, "gone", "joke", "Why did").await;
    let dropped_at = Instant::now();
    drop(stream);

    // Recorded at once, before the upstream has finished.
    let record = wait_for(&h, "gone", 1, Duration::from_secs(2), interrupted).await;
    assert!(
        dropped_at.elapsed() < Duration::from_millis(500),
        "{:?}",
        dropped_at.elapsed()
    );
    assert_eq!(record["content"], "Why did ");
    assert_eq!(record["role"], "assistant");
    assert_eq!(record["turn_id"], 1);
    assert_eq!(record["metadata"]["source"], "llm");
    assert!(
        record["metadata"]["interrupt_timestamp"].as_i64().unwrap()
            >= record["timestamp"].as_i64().unwrap()
    );
    assert_eq!(record["metadata"]["original_complete"], false);

    // Then the drain completes the original.
    let record = wait_for(&h, "gone", 1, Duration::from_secs(5), original_complete).await;
    assert_eq!(record["metadata"]["original"], JOKE_TEXT);
    assert_eq!(record["content"], "Why did ");
    assert!(JOKE_TEXT.starts_with(record["content"].as_str().unwrap()));
    assert_eq!(
        h.upstream.streams_cut(),
        0,
        "the upstream was read to its end"
    );
}

#[tokio::test]
async fn without_capture_the_upstream_is_closed_at_once() {
    let h = Harness::start("[interruption]\ncapture_original = false\n", "").await;
    h.upstream.push(sse_text(&JOKE, Duration::from_millis(300)));
    let (stream, _) = stream_until(&h, "nocap", "joke", "Why did").await;
    drop(stream);
    let record = wait_for(&h, "nocap", 1, Duration::from_secs(2), interrupted).await;
    let deadline = Instant::now() + Duration::from_millis(600);
    while h.upstream.streams_cut() == 0 {
        assert!(
            Instant::now() < deadline,
            "the upstream stream was not closed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(record["metadata"]["original_complete"], false);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (_, hist) = h.history("nocap").await;
    let record = &hist["contents"][1];
    assert_eq!(record["metadata"]["original"], "Why did ");
    assert_eq!(record["metadata"]["original_complete"], false);
}

#[tokio::test]
async fn the_drain_stops_at_its_limits() {
    let h = Harness::start("[interruption]\ndrain_timeout_secs = 1\n", "").await;
    h.upstream.push(sse_text(
        &["a", "b", "c", "d", "e", "f"],
        Duration::from_millis(400),
    ));
    let (stream, _) = stream_until(&h, "lim", "q", "\"a\"").await;
    drop(stream);
    let started = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(3);
    while h.upstream.streams_cut() == 0 {
        assert!(Instant::now() < deadline, "the drain did not stop");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );
    let record = wait_for(&h, "lim", 1, Duration::from_secs(1), |m| {
        m["metadata"]["original"]
            .as_str()
            .is_some_and(|o| o.len() >= 2)
    })
    .await;
    assert_eq!(record["metadata"]["original_complete"], false);
    let original = record["metadata"]["original"].as_str().unwrap();
    assert!(
        original.starts_with("ab") && original.len() < 6,
        "{original}"
    );
}

#[tokio::test]
async fn a_reply_whose_last_event_went_out_is_complete_even_if_the_client_hangs_up() {
    for round in 0..10 {
        let h = Harness::default().await;
        h.upstream
            .push(sse_text(&["all ", "of ", "it"], Duration::from_millis(5)));
        let (stream, _) = stream_until(&h, "done", "q", "[DONE]").await;
        drop(stream);
        // The next request right away, as an agent would send it.
        h.say("done", "next").await;
        let (_, hist) = h.history("done").await;
        let reply = &hist["contents"][1];
        assert_eq!(reply["content"], "all of it", "round {round}: {hist}");
        assert!(
            reply["metadata"].get("interrupted").is_none(),
            "round {round}: {hist}"
        );
        assert_eq!(hist["contents"].as_array().unwrap().len(), 4);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn barge_in_settles_the_old_reply_first_and_never_waits_for_its_drain() {
    for round in 0..10 {
        let h = Harness::default().await;
        let gap = Duration::from_millis(150);
        h.upstream.push(sse_text(&JOKE, gap));
        let (stream_a, _) = stream_until(&h, "barge", "joke?", "Why did").await;
        // The user talks over the bot: B arrives while A is still streaming.
        let sent_at = Instant::now();
        let (status, body) = h
            .chat(
                Some("barge"),
                json!({"model": "m", "messages": [user("story instead")]}),
            )
            .await;
        let b_took = sent_at.elapsed();
        assert_eq!(status, 200, "round {round}: {body}");
        // A's remaining drain is ~3 gaps; B did not wait for it.
        assert!(b_took < gap * 2, "round {round}: B took {b_took:?}");
        // A's client sees its stream end, without [DONE].
        let rest = read_rest(stream_a).await;
        assert!(!rest.contains("[DONE]"), "round {round}: {rest}");

        let (_, hist) = h.history("barge").await;
        let c = hist["contents"].as_array().unwrap();
        let roles: Vec<&str> = c.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(
            roles,
            ["user", "assistant", "user", "assistant"],
            "round {round}: {hist}"
        );
        assert_eq!(c[0]["content"], "joke?");
        assert_eq!(c[1]["content"], "Why did ");
        assert!(interrupted(&c[1]));
        assert_eq!(c[2]["content"], "story instead");
        assert!(c[3]
            .get("metadata")
            .is_some_and(|m| m.get("interrupted").is_none()));
        let turns: Vec<u64> = c.iter().map(|m| m["turn_id"].as_u64().unwrap()).collect();
        assert_eq!(turns, [1, 1, 2, 2]);
        // B's upstream window already held A's interrupted reply.
        assert_eq!(
            h.upstream.last().transcript(),
            ["user: joke?", "assistant: Why did ", "user: story instead"]
        );
        // And A's original is completed in the background.
        let a = wait_for(&h, "barge", 1, Duration::from_secs(3), original_complete).await;
        assert_eq!(a["metadata"]["original"], JOKE_TEXT);
    }
}

#[tokio::test]
async fn a_barge_in_drains_the_old_upstream_even_while_its_client_has_stopped_reading() {
    // The old client keeps its connection but reads nothing more: once the
    // socket buffers between it and recall are full, recall no longer
    // relays A's chunks. The cut must still start A's drain at once, not
    // when that client next reads or goes away.
    // No history limit drops A; the window keeps A out of B's upstream call.
    let config = "[interruption]\ndrain_max_bytes = 67108864\n[history]\nmax_bytes = 0\nwindow_chars = 1000\n";
    let h = Harness::start(config, "").await;
    let filler = "x".repeat(16 * 1024);
    let mut pieces = vec!["Why did "];
    pieces.extend(std::iter::repeat_n(filler.as_str(), 1_500));
    h.upstream.push(sse_text(&pieces, Duration::ZERO));
    let full_len = pieces.iter().map(|p| p.len()).sum::<usize>();
    let (stalled, _) = stream_until(&h, "stall", "joke?", "Why did").await;
    // Long enough for A's 24 MB to fill every buffer on the way.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let (status, body) = h
        .chat(
            Some("stall"),
            json!({"model": "m", "messages": [user("never mind")]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let a = wait_for(&h, "stall", 1, Duration::from_secs(20), original_complete).await;
    assert!(interrupted(&a));
    assert_eq!(a["metadata"]["original"].as_str().unwrap().len(), full_len);
    assert!(
        a["content"].as_str().unwrap().len() < full_len,
        "the stalled client was sent all of A"
    );
    assert_eq!(
        h.upstream.streams_cut(),
        0,
        "A's upstream was read to its end"
    );
    drop(stalled);
}

#[tokio::test]
async fn reject_mode_answers_409_and_changes_nothing() {
    let h = Harness::start("[interruption]\non_new_request = \"reject\"\n", "").await;
    h.upstream.push(sse_text(&JOKE, Duration::from_millis(100)));
    let (stream_a, _) = stream_until(&h, "rej", "joke?", "Why did").await;
    let resp = h
        .post_chat(
            "rej",
            json!({"model": "m", "messages": [user("too early")]}),
        )
        .await;
    assert_eq!(resp.status(), 409);
    assert_eq!(resp.headers()["x-should-retry"], "false");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "session_busy");
    assert_eq!(h.transcript("rej").await, ["user: joke?"]);
    // A goes on undisturbed and is recorded whole.
    let rest = read_rest(stream_a).await;
    assert!(rest.contains("[DONE]"));
    let a = wait_for(&h, "rej", 1, Duration::from_secs(2), |m| {
        m["role"] == "assistant"
    })
    .await;
    assert_eq!(a["content"], JOKE_TEXT);
    assert!(!interrupted(&a));
    h.say("rej", "now").await;
    assert_eq!(h.transcript("rej").await.len(), 4);
}

async fn post_interrupt(h: &Harness, session: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = h
        .client
        .post(format!("{}/v1/sessions/{session}/interrupt", h.url));
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

#[tokio::test]
async fn the_interrupt_endpoint_cuts_the_reply_in_flight_to_what_was_spoken() {
    let h = Harness::default().await;
    h.upstream.push(sse_text(&JOKE, Duration::from_millis(150)));
    let (stream, _) = stream_until(&h, "ep", "joke?", "scarecrow").await;
    let (status, body) = post_interrupt(&h, "ep", Some(json!({"spoken": "Why did the"}))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["interrupted"], "in_flight");
    assert_eq!(body["message"]["content"], "Why did the");
    // The stream is cut off for the client.
    let rest = read_rest(stream).await;
    assert!(!rest.contains("[DONE]"));
    let record = wait_for(&h, "ep", 1, Duration::from_secs(3), original_complete).await;
    assert_eq!(record["content"], "Why did the");
    assert_eq!(record["metadata"]["original"], JOKE_TEXT);
    assert!(interrupted(&record));
}

#[tokio::test]
async fn the_interrupt_endpoint_marks_the_latest_stored_reply() {
    let h = Harness::default().await;
    h.upstream
        .push(completion("Once upon a time there was a knight."));
    h.say("st", "story").await;
    let (status, body) = post_interrupt(&h, "st", Some(json!({"spoken_chars": 16}))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["interrupted"], "stored");
    let (_, hist) = h.history("st").await;
    let m = &hist["contents"][1];
    assert_eq!(m["content"], "Once upon a time");
    assert_eq!(
        m["metadata"]["original"],
        "Once upon a time there was a knight."
    );
    assert_eq!(m["metadata"]["original_complete"], true);
    assert!(m["metadata"]["interrupt_timestamp"].is_i64());

    // Errors: no reply, unknown session, a body that says both things.
    h.upstream.push(error_reply(500, "down"));
    h.chat(
        Some("fresh"),
        json!({"model": "m", "messages": [user("anyone?")]}),
    )
    .await;
    let (status, body) = post_interrupt(&h, "fresh", None).await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (404, json!("nothing_to_interrupt"))
    );
    let (status, _) = post_interrupt(&h, "nobody", None).await;
    assert_eq!(status, 404);
    let (status, _) =
        post_interrupt(&h, "st", Some(json!({"spoken": "a", "spoken_chars": 1}))).await;
    assert_eq!(status, 400);
    let (status, _) = post_interrupt(&h, "st", Some(json!({"heard": "a"}))).await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn a_client_resending_a_shortened_reply_corrects_what_was_heard() {
    let h = Harness::default().await;
    h.upstream.push(completion("The quick brown fox jumps."));
    h.say("short", "tell me").await;
    let (status, _) = h
        .chat(
            Some("short"),
            json!({"model": "m", "messages": [user("tell me"), assistant("The quick"), user("what?")]}),
        )
        .await;
    assert_eq!(status, 200);
    let (_, hist) = h.history("short").await;
    let c = hist["contents"].as_array().unwrap();
    assert_eq!(c.len(), 4);
    assert_eq!(c[1]["content"], "The quick");
    assert_eq!(c[1]["metadata"]["original"], "The quick brown fox jumps.");
    assert!(interrupted(&c[1]));
    assert_eq!(c[2]["content"], "what?");

    // A client that drops the interrupted reply entirely: no duplicates.
    let (status, _) = h
        .chat(Some("short"), json!({"model": "m", "messages": [user("tell me"), user("what?"), assistant("reply 2"), user("ok")]}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        h.transcript("short").await,
        [
            "user: tell me",
            "assistant: The quick",
            "user: what?",
            "assistant: reply 2",
            "user: ok",
            "assistant: reply 3"
        ]
    );
}

#[tokio::test]
async fn interrupted_replies_are_shown_to_each_upstream_as_configured() {
    let cases = [
        ("openai", "truncated", "The quick"),
        ("openai", "original", "The quick brown fox."),
        ("openai", "annotated", "The quick [interrupted by user]"),
        ("custom", "truncated", "The quick"),
        ("custom", "original", "The quick brown fox."),
        ("custom", "annotated", "The quick [interrupted by user]"),
    ];
    for (vendor, mode, expected) in cases {
        let h = Harness::start(
            "",
            &format!("vendor = \"{vendor}\"\ninterrupted = \"{mode}\"\n"),
        )
        .await;
        h.upstream.push(completion("The quick brown fox."));
        h.say("r", "go").await;
        post_interrupt(&h, "r", Some(json!({"spoken": "The quick"}))).await;
        h.say("r", "next").await;
        let sent = h.upstream.last();
        let reply = &sent.messages()[1];
        assert_eq!(reply["content"], expected, "{vendor}/{mode}");
        if vendor == "custom" {
            assert_eq!(reply["metadata"]["original"], "The quick brown fox.");
            assert_eq!(reply["metadata"]["interrupted"], true);
        } else {
            assert!(reply.get("metadata").is_none(), "{vendor}/{mode}: {reply}");
        }
    }
}

#[tokio::test]
async fn a_cancelled_non_streaming_request_is_recorded_as_interrupted() {
    let h = Harness::default().await;
    h.upstream.push(Reply::Delayed(
        Duration::from_millis(600),
        Box::new(completion("Late but whole.")),
    ));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(150))
        .build()
        .unwrap();
    let result = client
        .post(format!("{}/v1/chat/completions", h.url))
        .header("x-session-id", "ns")
        .json(&json!({"model": "m", "messages": [user("slow one")]}))
        .send()
        .await;
    assert!(result.is_err(), "the client should have given up");
    let record = wait_for(&h, "ns", 1, Duration::from_secs(1), interrupted).await;
    assert_eq!(record["content"], "");
    let record = wait_for(&h, "ns", 1, Duration::from_secs(3), original_complete).await;
    assert_eq!(record["metadata"]["original"], "Late but whole.");
    // The model does not see an empty reply next turn.
    h.say("ns", "hello?").await;
    assert_eq!(
        h.upstream.last().transcript(),
        ["user: slow one", "user: hello?"]
    );
}

#[tokio::test]
async fn failures_keep_the_user_message_and_record_the_failure_message() {
    let h = Harness::start(
        "[history]\nfailure_message = \"Sorry, something went wrong.\"\n",
        "",
    )
    .await;
    h.upstream.push(error_reply(500, "boom"));
    let (status, _) = h
        .chat(Some("f"), json!({"model": "m", "messages": [user("hi")]}))
        .await;
    assert_eq!(status, 500);
    let (_, hist) = h.history("f").await;
    let fail = &hist["contents"][1];
    assert_eq!(fail["content"], "Sorry, something went wrong.");
    assert_eq!(fail["metadata"]["source"], "llm_failure");
    assert!(fail["metadata"]["error"].as_str().unwrap().contains("boom"));
    assert_eq!(fail["turn_id"], 1);
    // The SDK's automatic retry of the same message does not duplicate it,
    // and supersedes the failure record.
    h.say("f", "hi").await;
    assert_eq!(h.transcript("f").await, ["user: hi", "assistant: reply 2"]);
    let (_, all) = h
        .api(
            reqwest::Method::GET,
            "/v1/sessions/f/history?include_superseded=true",
            None,
        )
        .await;
    let fail = &all["contents"][1];
    assert_eq!(fail["metadata"]["source"], "llm_failure");
    assert_eq!(fail["metadata"]["superseded"], true);
}

#[tokio::test]
async fn a_stream_that_breaks_is_recorded_like_an_interruption_with_the_error() {
    let h = Harness::default().await;
    let z = Duration::from_millis(20);
    h.upstream.push(Reply::Sse {
        chunks: vec![
            (
                z,
                delta_event(json!({"role": "assistant", "content": "Half a "})),
            ),
            (z, delta_event(json!({"content": "sentence"}))),
            (z, BREAK.to_owned()),
        ],
    });
    let resp = h
        .post_chat(
            "brk",
            json!({"model": "m", "stream": true, "messages": [user("q")]}),
        )
        .await;
    let text = resp.text().await.unwrap();
    assert!(
        text.contains("Half a ") && text.contains("\"error\""),
        "{text}"
    );
    let (_, hist) = h.history("brk").await;
    let m = &hist["contents"][1];
    assert_eq!(m["content"], "Half a sentence");
    assert!(interrupted(m));
    assert_eq!(m["metadata"]["original_complete"], false);
    assert!(
        m["metadata"]["error"]
            .as_str()
            .unwrap()
            .contains("broke off"),
        "{m}"
    );

    // A stream that just stops without finishing counts the same way.
    h.upstream.push(Reply::Sse {
        chunks: vec![(
            z,
            delta_event(json!({"role": "assistant", "content": "Cut"})),
        )],
    });
    let resp = h
        .post_chat(
            "brk",
            json!({"model": "m", "stream": true, "messages": [user("again")]}),
        )
        .await;
    resp.text().await.unwrap();
    let (_, hist) = h.history("brk").await;
    let m = &hist["contents"][3];
    assert_eq!(m["content"], "Cut");
    assert!(
        m["metadata"]["error"]
            .as_str()
            .unwrap()
            .contains("ended before"),
        "{m}"
    );
}

#[tokio::test]
async fn tool_call_deltas_relayed_before_the_cut_are_kept() {
    let h = Harness::default().await;
    let gap = Duration::from_millis(200);
    h.upstream.push(Reply::Sse {
        chunks: vec![
            (
                Duration::ZERO,
                delta_event(json!({"role": "assistant", "content": null, "tool_calls": [
                {"index": 0, "id": "call_1", "type": "function",
                 "function": {"name": "lookup", "arguments": "{\"q\":"}}]})),
            ),
            (
                gap,
                delta_event(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"x\"}"}}]}),
                ),
            ),
            (Duration::ZERO, sse_tail()),
        ],
    });
    let (stream, _) = stream_until(&h, "tc", "look it up", "call_1").await;
    drop(stream);
    let record = wait_for(&h, "tc", 1, Duration::from_secs(2), original_complete).await;
    assert!(interrupted(&record));
    assert_eq!(record["tool_calls"][0]["id"], "call_1");
    assert_eq!(record["tool_calls"][0]["function"]["arguments"], "{\"q\":");
    assert_eq!(
        record["metadata"]["original_tool_calls"][0]["function"]["arguments"],
        "{\"q\":\"x\"}"
    );
    // The unanswered, half-made call is not shown to the model next turn.
    h.say("tc", "never mind").await;
    assert_eq!(
        h.upstream.last().transcript(),
        ["user: look it up", "user: never mind"]
    );
}

#[tokio::test]
async fn a_connection_that_fails_after_done_loses_nothing() {
    let h = Harness::default().await;
    let z = Duration::from_millis(10);
    h.upstream.push(Reply::Sse {
        chunks: vec![
            (
                z,
                delta_event(json!({"role": "assistant", "content": "All of it"})),
            ),
            (z, sse_tail()),
            (Duration::from_millis(200), BREAK.to_owned()),
        ],
    });
    let resp = h
        .post_chat(
            "d",
            json!({"model": "m", "stream": true, "messages": [user("q")]}),
        )
        .await;
    let text = resp.text().await.unwrap();
    assert!(
        !text[text.find("[DONE]").unwrap()..].contains("error"),
        "{text}"
    );
    let (_, hist) = h.history("d").await;
    let reply = &hist["contents"][1];
    assert_eq!(reply["content"], "All of it");
    assert!(reply["metadata"].get("interrupted").is_none(), "{reply}");
}

#[tokio::test]
async fn an_original_cut_short_by_the_upstream_is_not_called_complete() {
    let h = Harness::default().await;
    h.upstream.push(Reply::Sse {
        chunks: vec![
            (
                Duration::ZERO,
                delta_event(json!({"role": "assistant", "content": "Why "})),
            ),
            // No finish chunk and no [DONE]: the upstream just ends.
            (
                Duration::from_millis(300),
                delta_event(json!({"content": "did"})),
            ),
        ],
    });
    let (stream, _) = stream_until(&h, "tr", "q", "Why").await;
    drop(stream);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (_, hist) = h.history("tr").await;
    let m = &hist["contents"][1];
    assert_eq!(m["metadata"]["original"], "Why did");
    assert_eq!(m["metadata"]["original_complete"], false, "{m}");
}

#[tokio::test]
async fn the_failure_message_is_not_shown_to_the_model() {
    let h = Harness::start("[history]\nfailure_message = \"Sorry.\"\n", "").await;
    h.upstream.push(error_reply(500, "boom"));
    h.chat(Some("f"), json!({"model": "m", "messages": [user("hi")]}))
        .await;
    h.say("f", "hi").await;
    assert_eq!(h.upstream.last().transcript(), ["user: hi"]);
}

/// Chunks that arrive just before a break are still queued for the client
/// when the upstream fails; the record must hold what the client got, not
/// only what had been handed to its connection when the break was seen.
/// The upstream here writes 8 MB of chunks and closes the connection, and
/// the client waits before reading: the chunks are still queued inside
/// recall (socket buffers full) when the break is seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_stream_records_exactly_what_the_client_received() {
    let mut events = vec![delta_event(json!({"role": "assistant", "content": ""}))];
    let piece = "x".repeat(20_000);
    for _ in 0..400 {
        events.push(delta_event(json!({"content": piece})));
    }
    // In one write, with no terminating chunk: the connection just ends.
    let addr = raw_upstream::burst_upstream(vec![(Duration::ZERO, events)], false).await;
    let h = Harness::with_config(
        &format!("[[upstreams]]\nname = \"crashy\"\nbase_url = \"http://{addr}/v1\"\n"),
        MockUpstream::start().await,
    )
    .await;
    for i in 0..3 {
        let session = format!("brk-fast-{i}");
        let resp = h
            .post_chat(
                &session,
                json!({"model": "m", "stream": true, "messages": [user("q")]}),
            )
            .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let text = resp.text().await.unwrap();
        assert!(
            text.contains("stream_broken"),
            "{}",
            &text[text.len() - 300..]
        );
        let received: String = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter_map(|v| {
                v["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect();
        assert_eq!(received.len(), 8_000_000);
        let (_, hist) = h.history(&session).await;
        let m = &hist["contents"][1];
        let stored = m["content"].as_str().unwrap_or_default();
        assert_eq!(stored.len(), received.len(), "run {i}");
        assert!(interrupted(m), "{}", m["metadata"]);
    }
}

/// A series of `GET /metrics`, as a number.
async fn counted(h: &Harness, cause: &str) -> f64 {
    let text = h.metrics().await;
    let series = format!("recall_interruptions_total{{cause=\"{cause}\"}}");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str())?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {series} in:\n{text}"))
}

/// What storage holds of a session's message (nothing to read with memory
/// storage, whose history is the server's).
async fn stored_cause(h: &Harness, session: &str, index: usize) -> Option<String> {
    let loaded = h.app.policy.storage.load(session).await.unwrap()?;
    let m = &loaded.messages[index];
    Some(m.meta_str("cut_by").unwrap_or_default().to_owned())
}

const CLOSE_WINDOW: &str = "[interruption]\nbarge_in_after_close_ms = 1000\n";

/// Pipecat cancels the stream when its user barges in, and sends the next
/// turn only after the close: recall records the close as `client_gone`
/// at once, and the request that follows within `barge_in_after_close_ms`
/// makes it a barge-in, in the history, in storage and in the metrics,
/// counted once.
#[tokio::test]
async fn a_request_soon_after_its_client_closed_the_stream_makes_the_close_a_barge_in() {
    let h = Harness::start(CLOSE_WINDOW, "").await;
    h.upstream.push(sse_text(&JOKE, Duration::from_millis(250)));
    let (stream, _) = stream_until(&h, "pipe", "joke", "Why did").await;
    drop(stream);
    let record = wait_for(&h, "pipe", 1, Duration::from_secs(2), interrupted).await;
    assert_eq!(record["metadata"]["cut_by"], "client_gone");
    assert_eq!(
        counted(&h, "client_gone").await,
        0.0,
        "not counted before it is known"
    );

    h.say("pipe", "a story instead").await;
    let (_, hist) = h.history("pipe").await;
    let record = &hist["contents"][1];
    assert_eq!(record["metadata"]["cut_by"], "new_request", "{record}");
    assert_eq!(record["content"], "Why did ");
    assert_eq!(h.transcript("pipe").await.len(), 4);
    if let Some(cause) = stored_cause(&h, "pipe", 1).await {
        assert_eq!(cause, "new_request", "storage holds the corrected cause");
    }
    assert_eq!(counted(&h, "new_request").await, 1.0);
    assert_eq!(counted(&h, "client_gone").await, 0.0);

    // The drain's late original keeps the cause; the wait for a request
    // ends and counts nothing more.
    let record = wait_for(&h, "pipe", 1, Duration::from_secs(5), original_complete).await;
    assert_eq!(record["metadata"]["original"], JOKE_TEXT);
    assert_eq!(record["metadata"]["cut_by"], "new_request");
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    assert_eq!(counted(&h, "new_request").await, 1.0);
    assert_eq!(counted(&h, "client_gone").await, 0.0);
    if let Some(cause) = stored_cause(&h, "pipe", 1).await {
        assert_eq!(cause, "new_request");
    }
}

/// A client that closes and does not come back within the window left:
/// counted as `client_gone` once the wait ends, and a later request
/// changes nothing.
#[tokio::test]
async fn a_close_with_no_request_after_it_stays_client_gone_and_is_counted_once() {
    let h = Harness::start("[interruption]\nbarge_in_after_close_ms = 200\n", "").await;
    h.upstream.push(sse_text(&JOKE, Duration::from_millis(100)));
    let (stream, _) = stream_until(&h, "left", "joke", "Why did").await;
    drop(stream);
    wait_for(&h, "left", 1, Duration::from_secs(2), interrupted).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while counted(&h, "client_gone").await == 0.0 {
        assert!(Instant::now() < deadline, "the close was never counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.say("left", "hello again").await;
    let (_, hist) = h.history("left").await;
    assert_eq!(hist["contents"][1]["metadata"]["cut_by"], "client_gone");
    assert_eq!(counted(&h, "client_gone").await, 1.0);
    assert_eq!(counted(&h, "new_request").await, 0.0);
}

/// A request after the window, or the same request again (a retry), is no
/// barge-in; the close is counted when that request reads it.
#[tokio::test]
async fn a_retry_soon_after_a_close_is_no_barge_in() {
    let h = Harness::start(CLOSE_WINDOW, "").await;
    h.upstream.push(sse_text(&JOKE, Duration::from_millis(250)));
    let (stream, _) = stream_until(&h, "retry", "joke", "Why did").await;
    drop(stream);
    wait_for(&h, "retry", 1, Duration::from_secs(2), interrupted).await;
    h.say("retry", "joke").await;
    let path = "/v1/sessions/retry/history?include_superseded=true";
    let (_, all) = h.api(reqwest::Method::GET, path, None).await;
    let cut = &all["contents"][1];
    assert_eq!(cut["metadata"]["cut_by"], "client_gone", "{all}");
    assert_eq!(cut["metadata"]["superseded_by"], "retry", "{all}");
    assert_eq!(counted(&h, "client_gone").await, 1.0);
    assert_eq!(counted(&h, "new_request").await, 0.0);
}
