//! The built-in mock upstream (`base_url = "mock://echo"`): its OpenAI wire
//! format, its pace, and recall's memory and interruptions in front of it.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};

/// recall with one `mock://echo` upstream. The harness's scripted upstream
/// is started but not configured, so it must receive nothing.
async fn echo(config: &str, upstream_extra: &str) -> Harness {
    let toml = format!(
        "{config}\n[[upstreams]]\nname = \"echo\"\nbase_url = \"mock://echo\"\n{upstream_extra}\n"
    );
    Harness::with_config(&toml, MockUpstream::start().await).await
}

/// The `data:` payloads of an SSE body, in order; every event must be one.
fn events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data event: {e:?}"))
                .to_owned()
        })
        .collect()
}

fn parse_chunks(body: &str) -> Vec<Value> {
    let events = events(body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{body}");
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

/// The text of the content chunks (those whose delta has content and no
/// role), one entry per chunk.
fn content_pieces(chunks: &[Value]) -> Vec<String> {
    chunks
        .iter()
        .filter(|c| c["choices"][0]["delta"].get("role").is_none())
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .map(str::to_owned)
        .collect()
}

async fn stream_text(h: &Harness, session: &str, body: Value) -> (String, Duration) {
    let started = Instant::now();
    let resp = h.post_chat(session, body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let text = resp.text().await.unwrap();
    (text, started.elapsed())
}

#[tokio::test]
async fn a_non_streaming_request_gets_the_echo_as_a_chat_completion() {
    let h = echo("", "").await;
    let (status, body) = h
        .chat(
            Some("plain"),
            json!({"model": "any-model", "messages": [user("Hello there")]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "any-model");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["message"]["role"], "assistant");
    let text = "You said: \"Hello there\" I see nothing you said before that. \
                I received 1 message (1 user).";
    assert_eq!(choice["message"]["content"], text);
    // Usage counts words: 2 received, 17 answered.
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 2, "completion_tokens": 17, "total_tokens": 19})
    );
    assert_eq!(h.transcript("plain").await[1], format!("assistant: {text}"));
    assert!(h.upstream.received().is_empty());
}

#[tokio::test]
async fn a_streamed_reply_is_well_formed_openai_sse() {
    let h = echo("", "mock_chunk_delay_ms = 0\n").await;
    let ask = |usage: bool| {
        json!({"model": "m", "stream": true, "stream_options": {"include_usage": usage},
               "messages": [user("Stream this")]})
    };
    let (body, _) = stream_text(&h, "sse", ask(true)).await;
    let chunks = parse_chunks(&body);
    let id = &chunks[0]["id"];
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk", "{c}");
        assert_eq!(&c["id"], id, "one id for the whole reply");
        assert_eq!(c["model"], "m");
    }
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": "", "refusal": null})
    );
    let n = chunks.len();
    let finish = &chunks[n - 2]["choices"][0];
    assert_eq!(finish["finish_reason"], "stop");
    assert_eq!(finish["delta"], json!({}));
    assert_eq!(chunks[n - 1]["choices"], json!([]));
    assert_eq!(chunks[n - 1]["usage"]["completion_tokens"], 17);
    // Before the last chunk, usage is there and null, as OpenAI sends it.
    assert!(chunks[..n - 1].iter().all(|c| c["usage"].is_null()));
    for c in &chunks[1..n - 2] {
        assert!(c["choices"][0]["finish_reason"].is_null(), "{c}");
    }
    let text = "You said: \"Stream this\" I see nothing you said before that. \
                I received 1 message (1 user).";
    let pieces = content_pieces(&chunks);
    assert_eq!(pieces.len(), 17, "one word a chunk: {pieces:?}");
    assert_eq!(pieces.concat(), text);

    // Without include_usage: no usage chunk and no usage field.
    let (body, _) = stream_text(&h, "sse2", ask(false)).await;
    let chunks = parse_chunks(&body);
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
    // What recall remembered is what was streamed.
    assert_eq!(h.transcript("sse").await[1], format!("assistant: {text}"));
}

#[tokio::test]
async fn streaming_follows_the_configured_pace() {
    let ask = |text: &str| json!({"model": "m", "stream": true, "messages": [user(text)]});
    let h = echo("", "mock_chunk_delay_ms = 20\nmock_words_per_chunk = 4\n").await;
    let (body, elapsed) = stream_text(&h, "paced", ask("one two")).await;
    let pieces = content_pieces(&parse_chunks(&body));
    // 17 words, 4 a chunk, each chunk after 20 ms.
    assert_eq!(pieces.len(), 5, "{pieces:?}");
    assert!(pieces[..4]
        .iter()
        .all(|p| p.split_whitespace().count() == 4));
    assert!(elapsed >= Duration::from_millis(100), "{elapsed:?}");

    // Without a delay, a long reply comes at once.
    let h = echo("", "mock_chunk_delay_ms = 0\n").await;
    let long = vec!["word"; 300].join(" ");
    let (body, elapsed) = stream_text(&h, "fast", ask(&long)).await;
    assert!(content_pieces(&parse_chunks(&body)).len() > 300);
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
}

#[tokio::test]
async fn the_echo_shows_what_recall_remembered_and_what_the_window_sent() {
    let h = echo(
        "[history]\nwindow_messages = 4\nmax_messages = 10\n\
         [[system_messages]]\ncontent = \"Be brief.\"\n",
        "",
    )
    .await;
    // The client sends only its newest message each turn.
    assert_eq!(
        h.say("mem", "My name is Ada.").await,
        "You said: \"My name is Ada.\" I see nothing you said before that. \
         I received 2 messages (1 system, 1 user)."
    );
    assert_eq!(
        h.say("mem", "What is my name?").await,
        "You said: \"What is my name?\" Before that you said: \"My name is Ada.\" \
         I received 4 messages (1 system, 2 user, 1 assistant)."
    );
    // The third turn's window of 4 no longer holds the first message, and
    // starts with a user message.
    assert_eq!(
        h.say("mem", "And now?").await,
        "You said: \"And now?\" Before that you said: \"What is my name?\" \
         I received 4 messages (1 system, 2 user, 1 assistant)."
    );
    assert_eq!(h.transcript("mem").await.len(), 6);
}

type ByteStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>;

/// Reads a streamed reply until `pieces` content chunks have arrived.
async fn read_until(stream: &mut ByteStream, pieces: usize) {
    let mut seen = String::new();
    while content_pieces(&seen_chunks(&seen)).len() < pieces {
        let chunk = stream.next().await.expect("stream ended early").unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
}

/// The complete chunks of a partly read SSE body.
fn seen_chunks(seen: &str) -> Vec<Value> {
    seen.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter_map(|e| serde_json::from_str(e).ok())
        .collect()
}

async fn wait_for_original(h: &Harness, session: &str, index: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, hist) = h.history(session).await;
        let m = &hist["contents"][index];
        if m["metadata"]["original_complete"] == true {
            return m.clone();
        }
        assert!(Instant::now() < deadline, "no complete original: {hist}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const TELL: &str = "Tell me a story";
const TELL_ECHO: &str =
    "You said: \"Tell me a story\" I see nothing you said before that. I received 1 message (1 user).";

#[tokio::test]
async fn barge_in_mid_stream_records_the_cut_reply_with_its_original() {
    let h = echo("", "mock_chunk_delay_ms = 30\n").await;
    let resp = h
        .post_chat(
            "barge",
            json!({"model": "m", "stream": true, "messages": [user(TELL)]}),
        )
        .await;
    let mut stream: ByteStream = Box::pin(resp.bytes_stream());
    read_until(&mut stream, 3).await;

    // The next user turn while the reply streams.
    let reply = h.say("barge", "Stop, a joke instead").await;
    assert!(
        reply.starts_with(&format!(
            "You said: \"Stop, a joke instead\" Before that you said: \"{TELL}\""
        )),
        "{reply}"
    );
    // The cut reply was part of the window the mock received.
    assert!(
        reply.ends_with("I received 3 messages (2 user, 1 assistant)."),
        "{reply}"
    );
    let mut rest = String::new();
    while let Some(Ok(chunk)) = stream.next().await {
        rest.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(!rest.contains("[DONE]"), "the cut stream ended: {rest}");

    let record = wait_for_original(&h, "barge", 1).await;
    assert_eq!(record["metadata"]["interrupted"], true);
    assert_eq!(record["metadata"]["original"], TELL_ECHO);
    let content = record["content"].as_str().unwrap();
    assert!(
        !content.is_empty() && content.len() < TELL_ECHO.len() && TELL_ECHO.starts_with(content),
        "{content}"
    );
}

#[tokio::test]
async fn the_interrupt_endpoint_cuts_a_mock_reply_to_what_was_spoken() {
    let h = echo("", "mock_chunk_delay_ms = 30\n").await;
    let resp = h
        .post_chat(
            "cut",
            json!({"model": "m", "stream": true, "messages": [user(TELL)]}),
        )
        .await;
    let mut stream: ByteStream = Box::pin(resp.bytes_stream());
    read_until(&mut stream, 2).await;
    let (status, body) = h
        .api(
            reqwest::Method::POST,
            "/v1/sessions/cut/interrupt",
            Some(json!({"spoken": "You said:"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["interrupted"], "in_flight");
    let record = wait_for_original(&h, "cut", 1).await;
    assert_eq!(record["content"], "You said:");
    assert_eq!(record["metadata"]["interrupted"], true);
    assert_eq!(record["metadata"]["original"], TELL_ECHO);
}

#[tokio::test]
async fn a_mock_runs_only_where_configured() {
    let h = Harness::default().await;
    for u in h.app.upstreams.iter() {
        assert!(u.mock().is_none());
        assert_eq!(u.base_url(), h.upstream.base_url());
    }

    let h = echo("", "").await;
    let u = h.app.upstreams.first().unwrap();
    let mock = u.mock().expect("a mock server");
    assert!(mock.addr().ip().is_loopback());
    assert_eq!(u.base_url(), format!("http://{}/v1", mock.addr()));
    // The model list is forwarded to the mock like any upstream's.
    let models: Value = h
        .client
        .get(format!("{}/v1/models", h.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "mock-echo");
}

#[test]
fn an_unknown_mock_host_stops_start_up_naming_the_key_and_the_file() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("recall-mock-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("parrot.toml");
    std::fs::write(
        &path,
        "[[upstreams]]\nname = \"p\"\nbase_url = \"mock://parrot\"\n",
    )
    .unwrap();
    for check in [false, true] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_recall"));
        if check {
            cmd.arg("check");
        }
        let out = cmd.arg("--config").arg(&path).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        for needle in [
            "upstreams[0].base_url",
            "parrot.toml",
            "mock://parrot",
            "mock://echo",
        ] {
            assert!(stderr.contains(needle), "{needle}: {stderr}");
        }
    }
}

const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config/demo.toml");

#[test]
fn recall_check_accepts_the_demo_config_and_shows_the_pace() {
    let out = Command::new(env!("CARGO_BIN_EXE_recall"))
        .args(["check", "--config", DEMO])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("base_url = \"mock://echo\""), "{stdout}");
    assert!(stdout.contains("mock_chunk_delay_ms = 100"), "{stdout}");
}

/// The quickstart: the demo config starts with no key and answers from the
/// mock, and the start-up line says so.
#[tokio::test]
async fn the_demo_config_starts_and_answers() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_recall"))
        .args(["--config", DEMO])
        .env("RECALL_LISTEN", "127.0.0.1:0")
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .env_remove("OPENAI_API_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    // Reads on after the start-up line, so that recall never writes to a
    // closed or full pipe.
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            if l.contains("recall listening") {
                let _ = tx.send(l);
            }
        }
    });
    let Ok(line) = rx.recv_timeout(Duration::from_secs(20)) else {
        let _ = child.kill();
        panic!("recall did not start listening");
    };
    let addr = line
        .split("addr=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_default()
        .to_owned();
    let answer = reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("x-session-id", "demo")
        .json(&json!({"model": "gpt-4o-mini", "messages": [user("Hi")]}))
        .send()
        .await;
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        line.contains(
            "echo [openai] * -> mock://echo (built in, no network: served at http://127.0.0.1:"
        ) && line.contains("streaming 1 word every 100 ms)"),
        "{line}"
    );
    let body: Value = answer.unwrap().json().await.unwrap();
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "You said: \"Hi\" I see nothing you said before that. \
         I received 2 messages (1 system, 1 user)."
    );
}

/// README's "Memory beyond the window": with config/demo-memory.toml, the
/// mock still names the user after 30 turns with a window of 6.
#[tokio::test]
async fn the_memory_demo_still_names_the_user_after_thirty_turns() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/demo-memory.toml");
    let text = std::fs::read_to_string(path).unwrap();
    // Its own [storage] and mock: the harness's upstream is never called.
    let h = Harness::with_config(&text, MockUpstream::start().await).await;
    h.say("demo", "My name is Ada.").await;
    for i in 1..=30 {
        h.say("demo", &format!("Tell me about topic {i}.")).await;
        // Folds run in the background; the demo's reader types slower.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let answer = h.say("demo", "What is my name?").await;
    assert!(
        answer.contains(
            "My notes say: Summary of the conversation so far: The user said: My name is Ada;"
        ),
        "{answer}"
    );
}

/// README's "Long-term memory": with config/demo-long-term.toml, a fact
/// told in one session is recalled in the next when it is relevant, and
/// not when it is not.
#[tokio::test]
async fn the_long_term_demo_recalls_a_fact_in_the_next_session_when_relevant() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/demo-long-term.toml");
    let text = std::fs::read_to_string(path).unwrap();
    let h = Harness::with_config(&text, MockUpstream::start().await).await;
    let say = |session: &'static str, text: &'static str| {
        let h = &h;
        async move {
            let resp = h
                .client
                .post(format!("{}/v1/chat/completions", h.url))
                .header("x-session-id", session)
                .header("x-user-id", "ana")
                .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}]}))
                .send()
                .await
                .unwrap();
            let body: Value = resp.json().await.unwrap();
            body["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    say("monday", "I am allergic to peanuts. I live in Hanoi.").await;
    let (status, _) = h
        .api(reqwest::Method::DELETE, "/v1/sessions/monday", None)
        .await;
    assert_eq!(status, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, page) = h
            .api(reqwest::Method::GET, "/v1/users/ana/memory/records", None)
            .await;
        if page["data"].as_array().is_some_and(|d| d.len() == 2) {
            break;
        }
        assert!(Instant::now() < deadline, "{page}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let answer = say("tuesday", "What snack should I bring?").await;
    // Each fact with the day it was said.
    let today = recall::memory::long_term::day(recall::clock::now_ms()).unwrap();
    assert!(
        answer.ends_with(&format!(
            "My notes say: Relevant facts about the user:\n- ({today}) I am allergic to peanuts"
        )),
        "{answer}"
    );
    let answer = say("wednesday", "Can you recommend some music?").await;
    assert!(!answer.contains("My notes say"), "{answer}");
}

/// The mock stops at a request's `max_tokens` (its tokens are words) and
/// says so, streamed or not, as a model does.
#[tokio::test]
async fn the_mock_stops_at_max_tokens() {
    let h = echo("", "mock_chunk_delay_ms = 0\n").await;
    let (status, body) = h
        .chat(
            Some("short"),
            json!({"model": "m", "max_tokens": 3, "messages": [user("Hello there")]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "You said: \"Hello"
    );
    assert_eq!(body["usage"]["completion_tokens"], 3);
    let (body, _) = stream_text(
        &h,
        "short2",
        json!({"model": "m", "stream": true, "max_completion_tokens": 2,
               "messages": [user("Stream this")]}),
    )
    .await;
    let chunks = parse_chunks(&body);
    assert_eq!(content_pieces(&chunks).concat(), "You said:");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
}

/// recall's extraction request, `response_format` and `max_tokens`
/// included, gets the facts in the shape its schema asks for.
#[tokio::test]
async fn the_mock_answers_an_extraction_in_the_schemas_shape() {
    use recall::memory::long_term::headings::EXTRACT_HEADING;
    use recall::memory::long_term::{facts_schema, FACTS_SCHEMA_NAME};
    let h = echo("", "").await;
    let u = h.app.upstreams.first().unwrap();
    let asked = format!("{EXTRACT_HEADING}\nuser: I am allergic to peanuts. What now?\n");
    let body: Value = h
        .client
        .post(format!("{}/chat/completions", u.base_url()))
        .json(&json!({
            "model": "m", "max_tokens": 100,
            "messages": [{"role": "system", "content": "Find facts."},
                         {"role": "user", "content": asked}],
            "response_format": {"type": "json_schema", "json_schema": {
                "name": FACTS_SCHEMA_NAME, "strict": true, "schema": facts_schema()}},
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let content = body["choices"][0]["message"]["content"].as_str().unwrap();
    let facts: Value = serde_json::from_str(content).unwrap();
    assert_eq!(
        facts,
        json!({"facts": [{"text": "I am allergic to peanuts"}]})
    );
}
