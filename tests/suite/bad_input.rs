//! Every class of bad input in docs/reliability.md's "Bad input" table, one row
//! each: the answer is an OpenAI-shaped 4xx with a useful message (and
//! `param` where one applies), the stored history of the session is the
//! same afterwards, and the next request on that session still works.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How the bad request is sent.
enum Send {
    /// This body, as is, to `/v1/chat/completions` with the row's session
    /// in the header.
    Body(Vec<u8>),
    /// This body, as is, with no session header: the body names the session.
    Anonymous(Vec<u8>),
    /// A well-formed request that names its session with these header bytes.
    Header(&'static [u8]),
    /// A raw HTTP/1.1 request line target (not normalised by any client),
    /// with a good body.
    Path(String),
    /// A request whose body starts and never ends.
    Stalled(&'static str),
    /// This body, as is, to `PUT /v1/sessions/{session}/history`.
    PutHistory(Vec<u8>),
}

struct Row {
    name: &'static str,
    send: Send,
    status: u16,
    param: Option<&'static str>,
    code: Option<&'static str>,
    /// Words the message must hold, so that it says what is wrong.
    says: &'static str,
}

fn body(v: Value) -> Vec<u8> {
    v.to_string().into_bytes()
}

fn chat(messages: Value) -> Vec<u8> {
    body(json!({"model": "m", "messages": messages}))
}

fn nested(open: &str, close: &str, depth: usize) -> String {
    format!("{}{}", open.repeat(depth), close.repeat(depth))
}

fn rows() -> Vec<Row> {
    let call = json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]});
    let many: Vec<Value> = (0..100_000).map(|_| json!({"role": "user"})).collect();
    let just_over: Vec<Value> = (0..2049).map(|i| user(&i.to_string())).collect();
    let deep_arrays = format!(
        r#"{{"model": "m", "messages": [{{"role": "user", "content": "x", "metadata": {{"a": {}}}}}]}}"#,
        nested("[", "]", 100_000)
    );
    let deep_objects = format!(
        r#"{{"model": "m", "messages": [{{"role": "user", "content": "x", "metadata": {}}}]}}"#,
        nested(r#"{"a":"#, "}", 100_000).replacen(r#"{"a":}"#, r#"{"a":1}"#, 1)
    );
    let id_257 = "x".repeat(257);
    let id_129 = "x".repeat(129);
    vec![
        Row {
            name: "not JSON",
            send: Send::Body(br#"{"model": "m", "messages": ["#.to_vec()),
            status: 400,
            param: None,
            code: None,
            says: "not valid JSON",
        },
        Row {
            name: "JSON that is not an object",
            send: Send::Body(body(json!([user("q")]))),
            status: 400,
            param: None,
            code: None,
            says: "must be a JSON object",
        },
        Row {
            name: "messages missing",
            send: Send::Body(body(json!({"model": "m"}))),
            status: 400,
            param: Some("messages"),
            code: None,
            says: "missing required parameter",
        },
        Row {
            name: "messages empty",
            send: Send::Body(chat(json!([]))),
            status: 400,
            param: Some("messages"),
            code: Some("empty_array"),
            says: "empty array",
        },
        Row {
            name: "messages not an array",
            send: Send::Body(chat(user("q"))),
            status: 400,
            param: Some("messages"),
            code: None,
            says: "must be an array",
        },
        Row {
            name: "messages holding a non-object",
            send: Send::Body(chat(json!([user("q"), "hello"]))),
            status: 400,
            param: Some("messages[1]"),
            code: None,
            says: "must be an object",
        },
        Row {
            name: "unknown role",
            send: Send::Body(chat(json!([{"role": "wizard", "content": "x"}]))),
            status: 400,
            param: Some("messages[0].role"),
            code: None,
            says: "role must be one of",
        },
        Row {
            name: "role missing",
            send: Send::Body(chat(json!([{"content": "x"}]))),
            status: 400,
            param: Some("messages[0].role"),
            code: None,
            says: "role must be one of",
        },
        Row {
            name: "content a number",
            send: Send::Body(chat(json!([{"role": "user", "content": 5}]))),
            status: 400,
            param: Some("messages[0].content"),
            code: None,
            says: "a string or an array of content parts",
        },
        Row {
            name: "content an object",
            send: Send::Body(chat(json!([{"role": "system", "content": {"text": "x"}}, user("q")]))),
            status: 400,
            param: Some("messages[0].content"),
            code: None,
            says: "a string or an array of content parts",
        },
        Row {
            name: "content missing on a user message",
            send: Send::Body(chat(json!([{"role": "user"}]))),
            status: 400,
            param: Some("messages[0].content"),
            code: None,
            says: "is required",
        },
        Row {
            name: "content part that is not a part",
            send: Send::Body(chat(json!([{"role": "user", "content": [{"type": "text", "text": "a"}, 7]}]))),
            status: 400,
            param: Some("messages[0].content[1]"),
            code: None,
            says: "content part",
        },
        Row {
            name: "assistant content a boolean",
            send: Send::Body(chat(json!([{"role": "assistant", "content": true}, user("q")]))),
            status: 400,
            param: Some("messages[0].content"),
            code: None,
            says: "or null",
        },
        Row {
            name: "tool message without tool_call_id",
            send: Send::Body(chat(json!([user("q"), call, {"role": "tool", "content": "42"}]))),
            status: 400,
            param: Some("messages[2].tool_call_id"),
            code: None,
            says: "tool_call_id is required",
        },
        Row {
            name: "tool_call_id not a string",
            send: Send::Body(chat(json!([{"role": "tool", "tool_call_id": 7, "content": "42"}]))),
            status: 400,
            param: Some("messages[0]"),
            code: None,
            says: "invalid type",
        },
        Row {
            name: "invalid UTF-8 in the body",
            send: Send::Body(
                b"{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}"
                    .to_vec(),
            ),
            status: 400,
            param: None,
            code: None,
            says: "not valid JSON",
        },
        Row {
            name: "invalid UTF-8 in the session header",
            send: Send::Header(b"caf\xc3"),
            status: 400,
            param: Some("x-session-id"),
            code: None,
            says: "not valid text",
        },
        Row {
            name: "invalid UTF-8 in the path session id",
            send: Send::Path("/sessions/%FF%FE/v1/chat/completions".into()),
            status: 400,
            param: Some("session_id"),
            code: None,
            says: "UTF-8",
        },
        Row {
            name: "session id empty (header)",
            send: Send::Header(b""),
            status: 400,
            param: Some("x-session-id"),
            code: None,
            says: "empty",
        },
        Row {
            name: "session id empty (body)",
            send: Send::Anonymous(body(json!({"model": "m", "session_id": "", "messages": [user("q")]}))),
            status: 400,
            param: Some("session_id"),
            code: None,
            says: "empty",
        },
        Row {
            name: "session id not a string (body)",
            send: Send::Anonymous(body(json!({"model": "m", "session_id": 12, "messages": [user("q")]}))),
            status: 400,
            param: Some("session_id"),
            code: None,
            says: "must be a string",
        },
        Row {
            name: "session id over 256 bytes",
            send: Send::Anonymous(body(json!({"model": "m", "session_id": id_257, "messages": [user("q")]}))),
            status: 400,
            param: Some("session_id"),
            code: None,
            says: "257 bytes long",
        },
        Row {
            name: "session id over 128 bytes (recall's stricter rule)",
            send: Send::Path(format!("/sessions/{id_129}/v1/chat/completions")),
            status: 400,
            param: Some("session_id"),
            code: None,
            says: "129 bytes long",
        },
        Row {
            name: "session id with a control character (body)",
            send: Send::Anonymous(body(json!({"model": "m", "session_id": "a\u{1}b", "messages": [user("q")]}))),
            status: 400,
            param: Some("session_id"),
            code: None,
            says: "'\\u{1}' at byte 1",
        },
        Row {
            name: "session id with a control character (header)",
            send: Send::Header(b"a\tb"),
            status: 400,
            param: Some("x-session-id"),
            code: None,
            says: "'\\t' at byte 1",
        },
        Row {
            name: "session id with a control character (path)",
            send: Send::Path("/sessions/a%00b/v1/chat/completions".into()),
            status: 400,
            param: Some("session_id"),
            code: None,
            says: "at byte 1",
        },
        Row {
            name: "path session id `..`",
            send: Send::Path("/sessions/../v1/chat/completions".into()),
            status: 400,
            param: Some("session_id"),
            code: None,
            says: "`..`",
        },
        Row {
            name: "path session id with `..` inside",
            send: Send::Path("/sessions/a..b/v1/chat/completions".into()),
            status: 400,
            param: Some("session_id"),
            code: None,
            says: "`..`",
        },
        Row {
            name: "path session id with an encoded `/`",
            send: Send::Path("/sessions/a%2Fb/v1/chat/completions".into()),
            status: 400,
            param: Some("session_id"),
            code: None,
            says: "'/' at byte 1",
        },
        Row {
            name: "path session id with a literal `/` (no such route)",
            send: Send::Path("/sessions/a/b/v1/chat/completions".into()),
            status: 404,
            param: None,
            code: Some("unknown_url"),
            says: "unknown route",
        },
        Row {
            name: "huge number of messages (100,000)",
            send: Send::Body(chat(Value::Array(many))),
            status: 400,
            param: Some("messages"),
            code: Some("array_above_max_length"),
            says: "got an array with length 100000",
        },
        Row {
            name: "one message over server.max_request_messages",
            send: Send::Body(chat(Value::Array(just_over))),
            status: 400,
            param: Some("messages"),
            code: Some("array_above_max_length"),
            says: "maximum length 2048",
        },
        Row {
            name: "deeply nested arrays (100,000 levels)",
            send: Send::Body(deep_arrays.into_bytes()),
            status: 400,
            param: None,
            code: None,
            says: "recursion limit exceeded",
        },
        Row {
            name: "deeply nested objects (100,000 levels)",
            send: Send::Body(deep_objects.into_bytes()),
            status: 400,
            param: None,
            code: None,
            says: "recursion limit exceeded",
        },
        Row {
            name: "deeply nested body of the session API",
            send: Send::PutHistory(nested("[", "]", 100_000).into_bytes()),
            status: 400,
            param: None,
            code: None,
            says: "recursion limit exceeded",
        },
        Row {
            name: "n > 1 with streaming",
            send: Send::Body(body(
                json!({"model": "m", "n": 2, "stream": true, "messages": [user("q")]}),
            )),
            status: 400,
            param: Some("n"),
            code: None,
            says: "cannot be streamed",
        },
        Row {
            name: "body larger than server.max_body_bytes",
            send: Send::Body(chat(json!([user(&"x".repeat(5 * 1024 * 1024))]))),
            status: 413,
            param: None,
            code: Some("request_too_large"),
            says: "larger than",
        },
        Row {
            name: "headers larger than server.max_header_bytes",
            send: Send::Header(Box::leak(vec![b'a'; 40 * 1024].into_boxed_slice())),
            status: 431,
            param: None,
            code: Some("headers_too_large"),
            says: "server.max_header_bytes",
        },
        Row {
            name: "chunked body that never ends",
            send: Send::Stalled("transfer-encoding: chunked\r\n\r\nf\r\n{\"model\": \"m\", \r\n"),
            status: 408,
            param: None,
            code: Some("request_timeout"),
            says: "did not arrive within 1 s",
        },
        Row {
            name: "body shorter than its content-length",
            send: Send::Stalled("content-length: 100\r\n\r\n{\"model\": \"m\""),
            status: 408,
            param: None,
            code: Some("request_timeout"),
            says: "server.request_body_timeout_secs",
        },
    ]
}

/// Sends raw bytes and reads the answer until the server closes.
async fn raw_http(addr: &str, request: &[u8], keep_writing_open: bool) -> (u16, Value) {
    raw_http_in_pieces(addr, &[request], keep_writing_open).await
}

/// As `raw_http`, the request written piece by piece, 200 ms apart (so
/// that the server reads each on its own, even on a loaded machine).
async fn raw_http_in_pieces(addr: &str, pieces: &[&[u8]], keep_writing_open: bool) -> (u16, Value) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    for (i, piece) in pieces.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        stream.write_all(piece).await.unwrap();
        stream.flush().await.unwrap();
    }
    if !keep_writing_open {
        // Nothing more will come; the server may still answer.
        let _ = stream.flush().await;
    }
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut out))
        .await
        .expect("the server answered within 20 s")
        .unwrap();
    let text = String::from_utf8_lossy(&out);
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (
        status,
        serde_json::from_str(rest).unwrap_or(Value::String(rest.to_owned())),
    )
}

async fn send(h: &Harness, session: &str, how: &Send) -> (u16, Value) {
    let addr = h.url.trim_start_matches("http://");
    match how {
        Send::Body(bytes) | Send::Anonymous(bytes) => {
            let mut req = h
                .client
                .post(format!("{}/v1/chat/completions", h.url))
                .header("content-type", "application/json")
                .body(bytes.clone());
            if let Send::Body(_) = how {
                req = req.header("x-session-id", session);
            }
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json().await.unwrap_or(Value::Null))
        }
        Send::Header(value) => {
            let resp = h
                .client
                .post(format!("{}/v1/chat/completions", h.url))
                .header(
                    "x-session-id",
                    reqwest::header::HeaderValue::from_bytes(value).unwrap(),
                )
                .json(&json!({"model": "m", "messages": [user("q")]}))
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json().await.unwrap_or(Value::Null))
        }
        Send::Path(target) => {
            let b = json!({"model": "m", "messages": [user("q")]}).to_string();
            let req = format!(
                "POST {target} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{b}",
                b.len()
            );
            raw_http(addr, req.as_bytes(), false).await
        }
        Send::Stalled(rest) => {
            let req = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\nx-session-id: {session}\r\ncontent-type: application/json\r\nconnection: close\r\n{rest}"
            );
            raw_http(addr, req.as_bytes(), true).await
        }
        Send::PutHistory(bytes) => {
            let resp = h
                .client
                .put(format!("{}/v1/sessions/{session}/history", h.url))
                .header("content-type", "application/json")
                .body(bytes.clone())
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json().await.unwrap_or(Value::Null))
        }
    }
}

/// What is wrong with the answer to a rejected request, if anything.
fn check_answer(row: &Row, status: u16, body: &Value) -> Option<String> {
    if status != row.status {
        return Some(format!("status {status}, not {}: {body}", row.status));
    }
    let Some(err) = body["error"].as_object() else {
        return Some(format!("not an OpenAI error body: {body}"));
    };
    for key in ["message", "type", "param", "code"] {
        if !err.contains_key(key) {
            return Some(format!("no `{key}` in {body}"));
        }
    }
    if err["type"] != "invalid_request_error" {
        return Some(format!("type is not invalid_request_error: {body}"));
    }
    if err["param"].as_str() != row.param {
        return Some(format!("param is not {:?}: {body}", row.param));
    }
    if err["code"].as_str() != row.code {
        return Some(format!("code is not {:?}: {body}", row.code));
    }
    let message = err["message"].as_str().unwrap_or_default();
    if !message.contains(row.says) {
        return Some(format!("message does not say {:?}: {message}", row.says));
    }
    None
}

#[tokio::test]
async fn every_class_of_bad_input_is_an_openai_4xx_and_changes_nothing() {
    let h = Harness::start("[server]\nrequest_body_timeout_secs = 1\n", "").await;
    let mut failures = Vec::new();
    for (i, row) in rows().iter().enumerate() {
        let session = format!("row-{i}");
        h.say(&session, "before").await;
        let (_, before) = h.history(&session).await;
        let sessions_before = h.app.sessions.len();
        let calls_before = h.upstream.received().len();

        let started = Instant::now();
        let (status, answer) = send(&h, &session, &row.send).await;
        let took = started.elapsed();
        if let Some(problem) = check_answer(row, status, &answer) {
            failures.push(format!("{}: {problem}", row.name));
        }
        if took > Duration::from_secs(10) {
            failures.push(format!("{}: answered after {took:?}", row.name));
        }

        let (_, after) = h.history(&session).await;
        if after != before {
            failures.push(format!("{}: history changed to {after}", row.name));
        }
        if h.app.sessions.len() != sessions_before {
            failures.push(format!("{}: a session was created", row.name));
        }
        if h.upstream.received().len() != calls_before {
            failures.push(format!("{}: the upstream was called", row.name));
        }
        // The process is up and the session works on.
        h.say(&session, "after").await;
        let transcript = h.transcript(&session).await;
        if transcript.len() != 4 || transcript[2] != "user: after" {
            failures.push(format!("{}: follow-up stored {transcript:?}", row.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} rows failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Nesting up to serde_json's limit is accepted, forwarded, stored (through
/// the backend `RECALL_TEST_BACKEND` picks) and read back without
/// overflowing a stack: the deepest request that gets past the parser.
#[tokio::test]
async fn nesting_just_under_the_limit_goes_through() {
    let h = Harness::default().await;
    // body, messages, message, metadata: 4 levels; 120 more arrays.
    let deep: Value = serde_json::from_str(&nested("[", "]", 120)).unwrap();
    let (status, body) = h
        .chat(
            Some("deep"),
            json!({"model": "m", "messages": [{"role": "user", "content": "x", "metadata": {"a": deep}}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(h.upstream.last().transcript(), ["user: x"]);
    let (status, history) = h.history("deep").await;
    assert_eq!(status, 200);
    assert_eq!(history["contents"][0]["metadata"]["a"], deep);
    h.say("deep", "more").await;
}

/// A body that arrives in pieces (a slow client, chunked encoding) is
/// read whole, as one that arrives at once: recall takes a body that
/// comes in one frame as it is, and gathers any other.
#[tokio::test]
async fn a_body_sent_in_pieces_is_read_whole() {
    let h = Harness::default().await;
    let addr = h.url.trim_start_matches("http://");
    let body = json!({"model": "m", "messages": [user("sent in pieces")]}).to_string();
    let (a, b) = body.split_at(body.len() / 2);
    let request = |session: &str, framing: &str| {
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\nx-session-id: {session}\r\ncontent-type: application/json\r\nconnection: close\r\n{framing}\r\n\r\n"
        )
    };
    let by_length = request("by-length", &format!("content-length: {}", body.len()));
    let chunked = request("chunked", "transfer-encoding: chunked");
    let (chunk_a, chunk_b) = (
        format!("{:x}\r\n{a}\r\n", a.len()),
        format!("{:x}\r\n{b}\r\n0\r\n\r\n", b.len()),
    );
    for (session, pieces) in [
        (
            "by-length",
            [by_length.as_bytes(), a.as_bytes(), b.as_bytes()],
        ),
        (
            "chunked",
            [chunked.as_bytes(), chunk_a.as_bytes(), chunk_b.as_bytes()],
        ),
    ] {
        let (status, answer) = raw_http_in_pieces(addr, &pieces, false).await;
        assert_eq!(status, 200, "{session}: {answer}");
        assert_eq!(
            h.upstream.last().transcript(),
            ["user: sent in pieces"],
            "{session}"
        );
        let (_, history) = h.history(session).await;
        assert_eq!(
            history["contents"][0]["content"], "sent in pieces",
            "{session}"
        );
    }
}

/// Deep nesting from the upstream (an SSE event, a completion body) is
/// beyond what recall parses: it is handled like any unreadable upstream
/// answer (a broken stream, a 502), not a crash, and the session goes on.
#[tokio::test]
async fn deeply_nested_upstream_answers_do_not_overflow() {
    let h = Harness::default().await;
    let deep = nested("[", "]", 100_000);
    h.upstream.push(Reply::Sse {
        chunks: vec![
            (Duration::ZERO, delta_event(json!({"content": "ok"}))),
            (Duration::ZERO, format!("data: {deep}\n\n")),
            (Duration::ZERO, sse_tail()),
        ],
    });
    let resp = h
        .post_chat(
            "deep-up",
            json!({"model": "m", "stream": true, "messages": [user("q")]}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let relayed = String::from_utf8(resp.bytes().await.unwrap().to_vec()).unwrap();
    assert!(relayed.contains("stream_broken"), "{relayed}");
    let transcript = h.transcript("deep-up").await;
    assert_eq!(transcript, ["user: q", "assistant: ok"]);

    let deep_completion = format!(r#"{{"choices": [{{"index": 0, "message": {deep}}}]}}"#);
    h.upstream.push(Reply::Raw {
        status: 200,
        content_type: "application/json",
        body: deep_completion,
    });
    let (status, body) = h
        .chat(
            Some("deep-up"),
            json!({"model": "m", "messages": [user("again")]}),
        )
        .await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["error"]["type"], "upstream_error");
    assert_eq!(
        h.transcript("deep-up").await,
        ["user: q", "assistant: ok", "user: again"]
    );
    h.say("deep-up", "still here").await;
}

/// A model id in `GET /v1/models/{id}` goes into the upstream URL with the
/// upstream's key: ids that would walk that URL are refused; `org/model`
/// ids are forwarded.
#[tokio::test]
async fn model_ids_that_walk_the_upstream_url_are_refused() {
    let h = Harness::default().await;
    let addr = h.url.trim_start_matches("http://").to_owned();
    for target in [
        "/v1/models/..%2F..%2Fadmin",
        "/v1/models/gpt/../../admin",
        "/v1/models/a%3Fb",
        "/v1/models/%2E%2E",
        "/v1/models/%FF",
    ] {
        let req = format!("GET {target} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
        let (status, body) = raw_http(&addr, req.as_bytes(), false).await;
        assert_eq!(status, 400, "{target}: {body}");
        assert_eq!(body["error"]["param"], "model", "{target}: {body}");
    }
    assert!(h.upstream.received().is_empty());
    let resp = h
        .client
        .get(format!("{}/v1/models/meta-llama/Llama-3-8B", h.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(h.upstream.last().path, "/v1/models/meta-llama/Llama-3-8B");
}

/// A session API query string that does not fit its fields gets recall's
/// OpenAI-shaped 400, not the framework's plain-text one.
#[tokio::test]
async fn a_bad_query_string_is_an_openai_400() {
    let h = Harness::default().await;
    h.say("q", "hi").await;
    for path in ["/v1/sessions?limit=many", "/v1/sessions/q/history?limit=-1"] {
        let resp = h
            .client
            .get(format!("{}{path}", h.url))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "{path}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("query string"),
            "{body}"
        );
    }
}
