//! Streaming relay: events reach the client as they arrive, bytes unchanged,
//! and the accumulated reply is remembered.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};

#[tokio::test]
async fn events_are_relayed_as_they_arrive_and_the_reply_is_remembered() {
    let h = Harness::default().await;
    let gap = Duration::from_millis(400);
    h.upstream.push(sse_text(&["Hel", "lo ", "there"], gap));
    let started = Instant::now();
    let resp = h
        .post_chat(
            "st",
            json!({"model": "m", "stream": true, "stream_options": {"include_usage": true},
               "messages": [user("hi")]}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    // recall's own id, and the upstream's under its own name.
    assert!(resp.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .starts_with("req_"));
    assert_eq!(resp.headers()["x-upstream-request-id"], "req-upstream-sse");

    let mut body = resp.bytes_stream();
    let mut received = Vec::new();
    let mut first_content_at = None;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.unwrap();
        if first_content_at.is_none() && String::from_utf8_lossy(&chunk).contains("Hel") {
            first_content_at = Some(started.elapsed());
        }
        received.extend_from_slice(&chunk);
    }
    let total = started.elapsed();
    // The first piece came long before the three gaps of the whole reply.
    let first = first_content_at.expect("first delta");
    assert!(first < gap * 2, "first delta after {first:?}");
    assert!(total >= gap * 3, "whole stream in {total:?}");

    // The bytes are the upstream's own, with [DONE] last.
    let text = String::from_utf8(received).unwrap();
    let expected: String = [
        delta_event(json!({"role": "assistant", "content": ""})),
        delta_event(json!({"content": "Hel"})),
        delta_event(json!({"content": "lo "})),
        delta_event(json!({"content": "there"})),
        sse_tail(),
    ]
    .concat();
    assert_eq!(text, expected);
    assert!(text.trim_end().ends_with("data: [DONE]"));

    // stream_options passed through, and the reply is in memory.
    assert_eq!(
        h.upstream.last().body["stream_options"]["include_usage"],
        true
    );
    assert_eq!(
        h.transcript("st").await,
        ["user: hi", "assistant: Hello there"]
    );
    let (_, hist) = h.history("st").await;
    assert_eq!(hist["contents"][1]["metadata"]["source"], "llm");
    assert_eq!(hist["contents"][1]["turn_id"], 1);
    // Next turn sends the streamed reply back as history.
    h.say("st", "again").await;
    assert_eq!(
        h.upstream.last().transcript(),
        ["user: hi", "assistant: Hello there", "user: again"]
    );
}

#[tokio::test]
async fn streamed_tool_calls_are_accumulated() {
    let h = Harness::default().await;
    let z = Duration::ZERO;
    h.upstream.push(Reply::Sse {
        chunks: vec![
            (
                z,
                delta_event(json!({"role": "assistant", "content": null, "tool_calls": [
                {"index": 0, "id": "call_a", "type": "function",
                 "function": {"name": "get_weather", "arguments": ""}}]})),
            ),
            (
                z,
                delta_event(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\":"}}]}),
                ),
            ),
            (
                z,
                delta_event(
                    json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                 "function": {"name": "get_time", "arguments": "{}"}}]}),
                ),
            ),
            (
                z,
                delta_event(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]}),
                ),
            ),
            (z, sse_tail()),
        ],
    });
    let resp = h
        .post_chat(
            "tools",
            json!({"model": "m", "stream": true, "messages": [user("weather?")]}),
        )
        .await;
    resp.bytes().await.unwrap();
    let (_, hist) = h.history("tools").await;
    let reply = &hist["contents"][1];
    assert_eq!(reply["content"], Value::Null);
    assert_eq!(
        reply["tool_calls"],
        json!([
            {"id": "call_a", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
            {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
        ])
    );
}

/// Streaming several choices in a session is refused (recall records one
/// reply per turn); without a session the stream is relayed untouched, and
/// an upstream that streams several choices anyway is remembered by choice 0.
#[tokio::test]
async fn n_greater_than_one_streams_only_without_a_session() {
    let h = Harness::default().await;
    let z = Duration::ZERO;
    let (status, body) = h
        .chat(
            Some("n2"),
            json!({"model": "m", "n": 2, "stream": true, "messages": [user("q")]}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "n");
    assert!(h.upstream.received().is_empty());

    let chunk = |index: u64, text: &str| {
        let c = json!({"object": "chat.completion.chunk",
                       "choices": [{"index": index, "delta": {"content": text}, "finish_reason": null}]});
        (z, format!("data: {c}\n\n"))
    };
    let interleaved = vec![
        chunk(1, "B1 "),
        chunk(0, "A1 "),
        chunk(1, "B2"),
        chunk(0, "A2"),
        (z, sse_tail()),
    ];
    h.upstream.push(Reply::Sse {
        chunks: interleaved.clone(),
    });
    let resp = h
        .client
        .post(format!("{}/v1/chat/completions", h.url))
        .json(&json!({"model": "m", "n": 2, "stream": true, "messages": [user("q")]}))
        .send()
        .await
        .unwrap();
    let relayed = String::from_utf8(resp.bytes().await.unwrap().to_vec()).unwrap();
    assert!(
        relayed.contains("B2") && relayed.contains("A2"),
        "{relayed}"
    );
    assert_eq!(h.upstream.last().body["n"], 2);

    h.upstream.push(Reply::Sse {
        chunks: interleaved,
    });
    let resp = h
        .post_chat(
            "n1",
            json!({"model": "m", "stream": true, "messages": [user("q")]}),
        )
        .await;
    resp.bytes().await.unwrap();
    assert_eq!(h.transcript("n1").await, ["user: q", "assistant: A1 A2"]);
}

#[tokio::test]
async fn events_split_across_reads_are_put_back_together() {
    let h = Harness::default().await;
    let whole = [
        delta_event(json!({"role": "assistant", "content": "split "})),
        delta_event(json!({"content": "across reads"})),
        sse_tail(),
    ]
    .concat();
    // Cut the stream in awkward places: inside "data:", inside the JSON,
    // between the two newlines.
    let cuts = [3, 40, whole.find("\n\n").unwrap() + 1, whole.len() - 5];
    let mut chunks = Vec::new();
    let mut last = 0;
    for c in cuts {
        chunks.push((Duration::from_millis(20), whole[last..c].to_owned()));
        last = c;
    }
    chunks.push((Duration::from_millis(20), whole[last..].to_owned()));
    h.upstream.push(Reply::Sse { chunks });
    let resp = h
        .post_chat(
            "split",
            json!({"model": "m", "stream": true, "messages": [user("q")]}),
        )
        .await;
    assert_eq!(resp.text().await.unwrap(), whole);
    assert_eq!(
        h.transcript("split").await,
        ["user: q", "assistant: split across reads"]
    );
}

/// An upstream that breaks off inside an event: the client gets whole
/// events only, then recall's `stream_broken` event, each one readable
/// JSON (half an event relayed would join recall's into one event no SDK
/// can read). The record keeps what went out.
#[tokio::test]
async fn a_stream_broken_inside_an_event_gives_the_client_whole_events_only() {
    let h = Harness::default().await;
    let cut = delta_event(json!({"content": " and lost words"}));
    for (i, at) in [3, cut.len() / 2, cut.len() - 1].into_iter().enumerate() {
        h.upstream.push(Reply::Sse {
            chunks: vec![
                (
                    Duration::ZERO,
                    delta_event(json!({"role": "assistant", "content": "Heard"})),
                ),
                (Duration::from_millis(20), cut[..at].to_owned()),
                (Duration::from_millis(20), BREAK.to_owned()),
            ],
        });
        let session = format!("broken-inside-{i}");
        let resp = h
            .post_chat(
                &session,
                json!({"model": "m", "stream": true, "messages": [user("q")]}),
            )
            .await;
        let body = resp.bytes().await.unwrap();
        let mut parser = sse_parse::SseParser::new();
        parser.feed(&body);
        parser.finish();
        let events: Vec<Value> = std::iter::from_fn(|| parser.next_event())
            .map(|e| {
                serde_json::from_str(&e.data).unwrap_or_else(|_| panic!("not JSON: {}", e.data))
            })
            .collect();
        assert_eq!(events.len(), 2, "{}", String::from_utf8_lossy(&body));
        assert_eq!(events[0]["choices"][0]["delta"]["content"], "Heard");
        assert_eq!(events[1]["error"]["code"], "stream_broken");
        assert_eq!(
            h.transcript(&session).await,
            ["user: q", "assistant: Heard"]
        );
    }
}

#[tokio::test]
async fn a_streaming_request_answered_with_an_error_is_relayed_whole() {
    let h = Harness::default().await;
    h.upstream.push(error_reply(429, "slow down"));
    let resp = h
        .post_chat(
            "err",
            json!({"model": "m", "stream": true, "messages": [user("q")]}),
        )
        .await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["x-ratelimit-remaining-requests"], "99");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["message"], "slow down");
    assert_eq!(h.transcript("err").await, ["user: q"]);
}

/// recall against an upstream that streams `first` alone, then `burst`
/// 300 ms later in one write; the frames its client got.
async fn relay_burst(
    first: &str,
    burst: &[String],
    end: bool,
    session: &str,
) -> (Harness, Vec<bytes::Bytes>) {
    let pieces = vec![
        (Duration::ZERO, vec![first.to_owned()]),
        (Duration::from_millis(300), burst.to_vec()),
    ];
    let addr = raw_upstream::burst_upstream(pieces, end).await;
    let h = Harness::with_config(
        &format!("[[upstreams]]\nname = \"bursty\"\nbase_url = \"http://{addr}/v1\"\n"),
        MockUpstream::start().await,
    )
    .await;
    let resp = h
        .post_chat(
            session,
            json!({"model": "m", "stream": true, "messages": [user("q")]}),
        )
        .await;
    let mut stream = resp.bytes_stream();
    let mut frames = Vec::new();
    while let Some(frame) = stream.next().await {
        frames.push(frame.unwrap());
    }
    (h, frames)
}

/// Events that reach recall together go to the client together: the same
/// bytes in a few writes, not one write per event. The first content goes
/// out alone, without waiting for what follows it.
#[tokio::test]
async fn events_that_arrive_together_go_out_together() {
    let first = delta_event(json!({"role": "assistant", "content": "Once"}));
    let burst: Vec<String> = (0..200)
        .map(|i| delta_event(json!({"content": format!(" w{i}")})))
        .chain([sse_tail()])
        .collect();
    let (h, frames) = relay_burst(&first, &burst, true, "burst").await;
    let body: Vec<u8> = frames.concat();
    let sent = [vec![first.clone()], burst].concat().concat();
    assert_eq!(String::from_utf8_lossy(&body), sent, "the bytes as sent");
    // hyper's client never joins two HTTP chunks into one frame.
    assert_eq!(frames[0], first.as_bytes(), "the first content went alone");
    // One frame per HTTP chunk or more without batching (202 chunks: the
    // first, 200 words, the tail's 3 events in one); the burst is one
    // write of 27 KB. Idle, 8 to 10 frames; on a loaded machine a chunk
    // read late goes alone, and up to 22 were seen.
    assert!(
        frames.len() <= 100,
        "{} frames for 202 chunks",
        frames.len()
    );
    let reply: String = (0..200).map(|i| format!(" w{i}")).collect();
    assert_eq!(
        h.transcript("burst").await,
        ["user: q".to_owned(), format!("assistant: Once{reply}")]
    );
}

/// An upstream that crashes right after a burst: the client gets the
/// whole burst, then recall's `stream_broken` event; the record keeps what
/// the client got and why it stopped.
#[tokio::test]
async fn a_burst_then_a_crash_gives_the_client_the_burst_then_the_error() {
    let first = delta_event(json!({"role": "assistant", "content": "Once"}));
    let burst: Vec<String> = (0..100)
        .map(|i| delta_event(json!({"content": format!(" w{i}")})))
        .collect();
    let (h, frames) = relay_burst(&first, &burst, false, "crash").await;
    let body = String::from_utf8(frames.concat()).unwrap();
    let sent = [vec![first], burst].concat().concat();
    let rest = body.strip_prefix(&sent).unwrap_or_else(|| panic!("{body}"));
    let error: Value = serde_json::from_str(
        rest.strip_prefix("data: ")
            .and_then(|r| r.strip_suffix("\n\n"))
            .unwrap_or_else(|| panic!("{rest}")),
    )
    .unwrap();
    assert_eq!(error["error"]["code"], "stream_broken");
    let reply: String = (0..100).map(|i| format!(" w{i}")).collect();
    assert_eq!(
        h.transcript("crash").await,
        ["user: q".to_owned(), format!("assistant: Once{reply}")]
    );
    let (_, history) = h.history("crash").await;
    let stored = &history["contents"][1];
    assert!(
        stored["metadata"]["error"].is_string(),
        "the record says why it stopped: {stored}"
    );
}
