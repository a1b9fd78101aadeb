//! Long-term memory per user: facts told in one session are
//! extracted in the background, stored with embeddings, and recalled by
//! meaning into a later session when relevant, never delaying a turn. The
//! scripted mock is the extract model (`EXTRACTOR`) and the embedding model
//! (`/embeddings`), with recall's own mock answers.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use reqwest::Method;
use serde_json::{json, Value};

const PEANUTS: &str = "I am allergic to peanuts";
const HANOI: &str = "I live in Hanoi";

/// Extraction runs when a test asks (`extract`), unless `extra` sets
/// `extract_every_turns`.
fn config(extra: &str) -> String {
    let every = if extra.contains("extract_every_turns") {
        ""
    } else {
        "extract_every_turns = 1000\n"
    };
    format!(
        "[long_term]\nenabled = true\nextract_model = \"{EXTRACTOR}\"\n\
         embedding_model = \"{EMBEDDER}\"\nattempts = 1\n{every}{extra}\n"
    )
}

async fn harness(extra: &str) -> Harness {
    Harness::start(&config(extra), "models = [\"*\"]").await
}

/// How long `say_as` took.
async fn timed(h: &Harness, user: &str, session: &str, text: &str) -> Duration {
    let started = Instant::now();
    say_as(h, None, user, session, text).await;
    started.elapsed()
}

async fn say(h: &Harness, user: &str, session: &str, text: &str) {
    say_as(h, None, user, session, text).await;
}

async fn call(
    h: &Harness,
    key: Option<&str>,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = h.client.request(method, format!("{}{path}", h.url));
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

/// Runs extraction of `session` now, which must succeed.
async fn extract(h: &Harness, session: &str) -> Value {
    let path = format!("/v1/sessions/{session}/memory/extract");
    let (status, body) = call(h, None, Method::POST, &path, None).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// `user`'s records, newest first (every page).
async fn records(h: &Harness, key: Option<&str>, user: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut after = String::new();
    loop {
        let path = format!("/v1/users/{user}/memory/records?limit=100{after}");
        let (status, page) = call(h, key, Method::GET, &path, None).await;
        assert_eq!(status, 200, "{page}");
        out.extend(page["data"].as_array().unwrap().iter().cloned());
        if page["has_more"] != true {
            return out;
        }
        after = format!("&after={}", page["last_id"].as_str().unwrap());
    }
}

fn texts(records: &[Value]) -> Vec<String> {
    let mut t: Vec<String> = records
        .iter()
        .map(|r| r["text"].as_str().unwrap().to_owned())
        .collect();
    t.sort();
    t
}

/// Waits until session `session`'s next turn holds the result of a search
/// (not the user's newest records it starts with), and returns its facts.
async fn searched(h: &Harness, session: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, s) = h
            .api(Method::GET, &format!("/v1/sessions/{session}"), None)
            .await;
        assert_eq!(status, 200, "{s}");
        if s["recalled"]["searched"] == true {
            return s["recalled"]["facts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["text"].as_str().unwrap().to_owned())
                .collect();
        }
        assert!(
            Instant::now() < deadline,
            "no search result for {session}: {s}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The facts system message of the last turn the upstream received, if any.
fn facts_sent(h: &Harness) -> Option<String> {
    let turn = h
        .upstream
        .turns()
        .pop()
        .expect("no turn reached the upstream");
    turn.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "system")
        .filter_map(|m| m["content"].as_str())
        .find(|c| c.starts_with("Relevant facts about the user:"))
        .map(str::to_owned)
}

/// The user tells two facts; the next session's related question brings
/// back the one it is about, and an unrelated question neither.
async fn told_then_asked(extra: &str) -> Harness {
    let h = harness(extra).await;
    say(&h, "ana", "s1", &format!("{PEANUTS}. {HANOI}.")).await;
    extract(&h, "s1").await;
    assert_eq!(texts(&records(&h, None, "ana").await), vec![PEANUTS, HANOI]);
    h
}

#[tokio::test]
async fn a_fact_told_in_one_session_is_recalled_in_the_next_when_relevant() {
    let h = told_then_asked("retrieve = \"prefetch\"").await;
    // A new session starts with the user's newest records.
    say(&h, "ana", "s2", "What snack should I bring?").await;
    let first = facts_sent(&h).expect("a new session starts with the user's records");
    assert!(first.contains(PEANUTS) && first.contains(HANOI), "{first}");
    // The search after the question replaces them for the next turn.
    assert_eq!(searched(&h, "s2").await, vec![PEANUTS]);
    say(&h, "ana", "s2", "Thanks.").await;
    let sent = facts_sent(&h).expect("the related fact is sent");
    assert!(sent.contains(PEANUTS) && !sent.contains(HANOI), "{sent}");

    // An unrelated question recalls nothing.
    say(&h, "ana", "s3", "Can you recommend some music?").await;
    assert!(searched(&h, "s3").await.is_empty());
    say(&h, "ana", "s3", "Jazz maybe.").await;
    assert_eq!(facts_sent(&h), None);
}

/// The `/embeddings` requests the upstream has received.
fn embedding_calls(h: &Harness) -> usize {
    h.upstream
        .received()
        .iter()
        .filter(|r| r.path.ends_with("/embeddings"))
        .count()
}

/// Vectors come as base64 unless the config asks for floats (a server
/// that refuses base64); either way the same facts are stored and recalled.
#[tokio::test]
async fn embeddings_are_asked_for_as_base64_or_as_configured_and_read_either_way() {
    for (extra, format) in [("", "base64"), ("embedding_encoding = \"float\"", "float")] {
        let h = told_then_asked(extra).await;
        say(&h, "ana", "s2", "What snack should I bring?").await;
        assert_eq!(searched(&h, "s2").await, vec![PEANUTS], "{format}");
        let asked: Vec<Value> = h
            .upstream
            .received()
            .iter()
            .filter(|r| r.path.ends_with("/embeddings"))
            .map(|r| r.body["encoding_format"].clone())
            .collect();
        assert!(!asked.is_empty());
        assert!(asked.iter().all(|f| f == format), "{asked:?}");
    }
    let bad = recall::Config::parse(
        &config("embedding_encoding = \"binary\""),
        std::path::Path::new("t.toml"),
    );
    let Err(why) = bad else {
        panic!("an unknown encoding is accepted")
    };
    let why = why.to_string();
    assert!(
        why.contains("embedding_encoding") || why.contains("binary"),
        "{why}"
    );
}

#[tokio::test]
async fn a_user_with_no_records_costs_no_embedding_call() {
    let h = harness("").await;
    // A new user's turns are searched, and there is nothing to rank.
    say(&h, "ana", "s1", &format!("{PEANUTS}.")).await;
    assert!(searched(&h, "s1").await.is_empty());
    say(&h, "ana", "s1", "What snack should I bring?").await;
    assert!(searched(&h, "s1").await.is_empty());
    let (status, found) = call(
        &h,
        None,
        Method::POST,
        "/v1/users/ana/memory/records/search",
        Some(json!({"query": "peanuts"})),
    )
    .await;
    assert_eq!(status, 200, "{found}");
    assert_eq!(found["data"], json!([]), "{found}");
    assert_eq!(embedding_calls(&h), 0);

    // Once they have a record, a search embeds its query.
    extract(&h, "s1").await;
    let stored = embedding_calls(&h);
    assert!(stored > 0, "the extracted fact was embedded");
    say(&h, "ana", "s2", "What snack should I bring?").await;
    assert_eq!(searched(&h, "s2").await, vec![PEANUTS]);
    assert!(embedding_calls(&h) > stored, "the question was embedded");
}

#[tokio::test]
async fn inline_retrieval_sends_the_related_fact_in_the_same_turn() {
    let h = told_then_asked("retrieve = \"inline\"\ninline_timeout_ms = 2000").await;
    say(&h, "ana", "s2", "What snack should I bring?").await;
    let sent = facts_sent(&h).expect("the related fact is sent at once");
    assert!(sent.contains(PEANUTS) && !sent.contains(HANOI), "{sent}");
    // Too slow an embedding model: the turn goes on with what it had.
    let h2 = told_then_asked("retrieve = \"inline\"\ninline_timeout_ms = 100").await;
    h2.upstream
        .embeddings(LongTermMode::Slow(Duration::from_secs(2)));
    let took = timed(&h2, "ana", "s2", "What snack should I bring?").await;
    assert!(
        took < Duration::from_millis(1500),
        "the turn waited {took:?}"
    );
    let sent = facts_sent(&h2).expect("the user's newest records");
    assert!(sent.contains(HANOI), "{sent}");
}

#[tokio::test]
async fn a_repeated_fact_updates_its_record_instead_of_adding_one() {
    let h = harness("").await;
    say(&h, "ana", "s1", &format!("{PEANUTS}.")).await;
    extract(&h, "s1").await;
    let before = records(&h, None, "ana").await;
    assert_eq!(before.len(), 1);
    say(&h, "ana", "s2", &format!("{PEANUTS}!")).await;
    let done = extract(&h, "s2").await;
    assert_eq!(
        (done["added"].as_u64(), done["updated"].as_u64()),
        (Some(0), Some(1)),
        "{done}"
    );
    let after = records(&h, None, "ana").await;
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(after[0]["id"], before[0]["id"]);
    assert_eq!(after[0]["session"], "s2");
    assert!(h
        .metrics()
        .await
        .contains("recall_long_term_records_total{change=\"updated\"} 1"));
}

#[tokio::test]
async fn a_custom_strategy_extracts_with_its_prompt_into_its_namespace() {
    let h = harness(
        "[[long_term.strategies]]\nname = \"health\"\ntype = \"custom\"\n\
         prompt = \"List the user's allergies and conditions.\"\nnamespace = \"/health/{user}\"\n\
         [[long_term.strategies]]\nname = \"prefs\"\ntype = \"user_preference\"\n",
    )
    .await;
    say(&h, "ana", "s1", &format!("{PEANUTS}.")).await;
    extract(&h, "s1").await;
    let asked = h.upstream.extraction_requests();
    let prompts: Vec<String> = asked
        .iter()
        .map(|r| {
            r.body["messages"][0]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert!(
        prompts
            .iter()
            .any(|p| p.starts_with("List the user's allergies and conditions.")),
        "{prompts:?}"
    );
    assert!(
        prompts.iter().any(|p| p.contains("preferences")),
        "{prompts:?}"
    );
    let all = records(&h, None, "ana").await;
    let mut spaces: Vec<(String, String)> = all
        .iter()
        .map(|r| {
            (
                r["strategy"].as_str().unwrap().to_owned(),
                r["namespace"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    spaces.sort();
    assert_eq!(
        spaces,
        vec![
            ("health".to_owned(), "/health/ana".to_owned()),
            ("prefs".to_owned(), "/strategies/prefs/users/ana".to_owned()),
        ]
    );
    let (status, page) = call(
        &h,
        None,
        Method::GET,
        "/v1/users/ana/memory/records?namespace=/health/ana",
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(page["data"].as_array().unwrap().len(), 1, "{page}");
    // Both namespaces hold the fact; a turn sends it once.
    say(&h, "ana", "s2", "What snack should I bring?").await;
    assert_eq!(searched(&h, "s2").await, vec![PEANUTS]);
}

#[tokio::test]
async fn slow_models_never_delay_a_turn() {
    let h = harness("extract_every_turns = 1").await;
    h.upstream
        .extractions(LongTermMode::Slow(Duration::from_secs(2)));
    h.upstream
        .embeddings(LongTermMode::Slow(Duration::from_secs(2)));
    let mut slowest = Duration::ZERO;
    for (i, text) in [PEANUTS, HANOI, "What snack should I bring?"]
        .iter()
        .enumerate()
    {
        slowest = slowest.max(timed(&h, "ana", &format!("s{}", i / 2), text).await);
    }
    // Each turn started an extraction and a search that take 2 s or more.
    assert!(
        slowest < Duration::from_millis(1500),
        "a turn waited {slowest:?}"
    );
    // They did run, and stored what was said.
    extract(&h, "s0").await;
    assert_eq!(texts(&records(&h, None, "ana").await), vec![PEANUTS, HANOI]);
}

#[tokio::test]
async fn a_failing_or_malformed_extraction_stores_nothing() {
    let h = harness("").await;
    for (i, mode) in [
        LongTermMode::Fail(500),
        LongTermMode::Text("I could not find any facts.".into()),
        LongTermMode::Text("[{\"fact\": \"no text field\"}]".into()),
    ]
    .into_iter()
    .enumerate()
    {
        h.upstream.extractions(mode);
        let session = format!("s{i}");
        say(&h, "ana", &session, &format!("{PEANUTS}.")).await;
        let path = format!("/v1/sessions/{session}/memory/extract");
        let (status, body) = call(&h, None, Method::POST, &path, None).await;
        assert_eq!(status, 502, "{body}");
        assert_eq!(body["error"]["code"], "extraction_failed", "{body}");
        assert!(records(&h, None, "ana").await.is_empty());
    }
    let metrics = h.metrics().await;
    assert!(
        metrics.contains("recall_long_term_jobs_total{job=\"extract\",outcome=\"malformed\"} 2"),
        "{metrics}"
    );
    // The messages were not marked extracted: a working model gets them.
    h.upstream.extractions(LongTermMode::Echo);
    extract(&h, "s0").await;
    assert_eq!(texts(&records(&h, None, "ana").await), vec![PEANUTS]);
}

/// A model told to remember a long list (or answering at length) does not
/// set how much one extraction embeds and stores: its first
/// `max_facts_per_answer` distinct facts are, the rest counted.
#[tokio::test]
async fn an_answer_longer_than_max_facts_per_answer_stores_its_first_facts() {
    let h = harness("max_facts_per_answer = 5").await;
    let many: Vec<String> = (0..60).map(|i| format!("likes w{i}x and v{i}y")).collect();
    h.upstream
        .extractions(LongTermMode::Text(serde_json::to_string(&many).unwrap()));
    say(&h, "ana", "s1", &format!("{PEANUTS}.")).await;
    // An extraction that fails stores nothing and counts nothing: it is
    // tried again, with the same answer's facts.
    h.upstream.embeddings(LongTermMode::Fail(500));
    let path = "/v1/sessions/s1/memory/extract";
    let (status, body) = call(&h, None, Method::POST, path, None).await;
    assert_eq!(status, 502, "{body}");
    let metrics = h.metrics().await;
    assert!(
        metrics.contains("recall_long_term_facts_left_out_total{reason=\"over_max_facts\"} 0\n"),
        "{metrics}"
    );
    h.upstream.embeddings(LongTermMode::Echo);
    let done = extract(&h, "s1").await;
    assert_eq!(
        (&done["facts"], &done["added"], &done["left_out"]),
        (&json!(5), &json!(5), &json!(55)),
        "{done}"
    );
    assert_eq!(texts(&records(&h, None, "ana").await), texts_of(&many[..5]));
    let embedded: Vec<usize> = h
        .upstream
        .received()
        .iter()
        .filter(|r| r.path.ends_with("/embeddings"))
        .filter_map(|r| r.body["input"].as_array().map(Vec::len))
        .collect();
    // The facts' calls (the one that failed, the one stored) carry the kept
    // ones only; a search's query, one input, may come too.
    let facts_calls: Vec<&usize> = embedded.iter().filter(|&&n| n > 1).collect();
    assert_eq!(facts_calls, [&5, &5], "{embedded:?}");
    let metrics = h.metrics().await;
    assert!(
        metrics.contains("recall_long_term_facts_left_out_total{reason=\"over_max_facts\"} 55\n"),
        "{metrics}"
    );
    let upstream =
        "[[upstreams]]\nname = \"m\"\nbase_url = \"http://127.0.0.1:1/v1\"\nmodels = [\"*\"]\n";
    let text = |n: usize| {
        format!(
            "{upstream}{}",
            config(&format!("max_facts_per_answer = {n}"))
        )
    };
    let parse = |n| recall::Config::parse(&text(n), std::path::Path::new("t.toml"));
    assert!(parse(1).is_ok(), "{:?}", parse(1).err());
    let zero = parse(0).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        zero.contains("max_facts_per_answer"),
        "0 is refused: {zero:?}"
    );
}

/// An embedding model refuses an input past its limit: a fact that long
/// is not stored (an extraction holding it would fail on every attempt),
/// a turn's query is cut to its end, and a search's is refused.
#[tokio::test]
async fn no_text_too_long_to_embed_is_sent_to_the_embedding_model() {
    let h = harness("max_facts_per_answer = 1").await;
    let long = format!("likes {}", "green tea ".repeat(300));
    // An answer of nothing but a long fact stores nothing and is done:
    // asked again, the model would answer the same.
    h.upstream
        .extractions(LongTermMode::Text(json!([long]).to_string()));
    say(&h, "ana", "s0", &format!("{PEANUTS}.")).await;
    let done = extract(&h, "s0").await;
    assert_eq!(
        (&done["added"], &done["too_long"]),
        (&json!(0), &json!(1)),
        "{done}"
    );
    assert_eq!(embedding_calls(&h), 0);
    let again = extract(&h, "s0").await;
    assert_eq!(
        (&again["facts"], &again["too_long"]),
        (&json!(0), &json!(0)),
        "{again}"
    );
    let answer = json!([long, PEANUTS, long]).to_string();
    h.upstream.extractions(LongTermMode::Text(answer));
    say(&h, "ana", "s1", &format!("{PEANUTS}.")).await;
    let done = extract(&h, "s1").await;
    assert_eq!(
        (&done["added"], &done["too_long"], &done["left_out"]),
        (&json!(1), &json!(1), &json!(0)),
        "the long fact takes no place among the one allowed: {done}"
    );
    assert_eq!(texts(&records(&h, None, "ana").await), vec![PEANUTS]);
    let metrics = h.metrics().await;
    let counted = "recall_long_term_facts_left_out_total{reason=\"too_long\"} 2\n";
    assert!(metrics.contains(counted), "{metrics}");
    // A turn's query is cut to its end (here a first message alone; the
    // unit test has a reply before it).
    let asked = format!("{} What snack should I bring?", "so ".repeat(1000));
    say(&h, "ana", "s2", &asked).await;
    assert_eq!(searched(&h, "s2").await, vec![PEANUTS]);
    let inputs: Vec<String> = h
        .upstream
        .received()
        .iter()
        .filter(|r| r.path.ends_with("/embeddings"))
        .flat_map(|r| r.body["input"].as_array().cloned().unwrap_or_default())
        .map(|t| t.as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(
        inputs.iter().all(|t| t.chars().count() <= 2000),
        "{inputs:?}"
    );
    let query = inputs.last().unwrap();
    assert!(
        query.ends_with("so so What snack should I bring?"),
        "{query}"
    );
    // A search's query is the caller's: too long, it is refused, with no
    // call made.
    let calls = embedding_calls(&h);
    let search = "/v1/users/ana/memory/records/search";
    for (n, status) in [(2001, 400), (2000, 200)] {
        let body = json!({"query": "a".repeat(n)});
        let (got, err) = call(&h, None, Method::POST, search, Some(body)).await;
        assert_eq!(got, status, "{n} characters: {err}");
        if status == 400 {
            assert_eq!(err["error"]["param"], "query", "{err}");
            assert_eq!(embedding_calls(&h), calls);
        }
    }
}

fn texts_of(facts: &[String]) -> Vec<String> {
    let mut t = facts.to_vec();
    t.sort();
    t
}

#[tokio::test]
async fn search_limits_and_thresholds_are_validated() {
    let h = told_then_asked("").await;
    let search = |body: Value| {
        let h = &h;
        async move {
            call(
                h,
                None,
                Method::POST,
                "/v1/users/ana/memory/records/search",
                Some(body),
            )
            .await
        }
    };
    for (body, param) in [
        (json!({"query": "snack", "limit": 4}), "limit"),
        (json!({"query": "snack", "limit": 201}), "limit"),
        (json!({"query": "snack", "limit": 5.5}), "limit"),
        (
            json!({"query": "snack", "score_threshold": -0.01}),
            "score_threshold",
        ),
        (
            json!({"query": "snack", "score_threshold": 1.01}),
            "score_threshold",
        ),
        (
            json!({"query": "snack", "score_threshold": "0.5"}),
            "score_threshold",
        ),
        (json!({"limit": 5}), "query"),
    ] {
        let (status, err) = search(body.clone()).await;
        assert_eq!(status, 400, "{body}: {err}");
        assert_eq!(err["error"]["param"], param, "{err}");
    }
    for body in [
        json!({"query": "What snack should I bring?", "limit": 5, "score_threshold": 0}),
        json!({"query": "What snack should I bring?", "limit": 200, "score_threshold": 1}),
    ] {
        let (status, found) = search(body.clone()).await;
        assert_eq!(status, 200, "{body}: {found}");
    }
    let (_, found) =
        search(json!({"query": "What snack should I bring?", "limit": 5, "score_threshold": 0}))
            .await;
    let data = found["data"].as_array().unwrap();
    assert_eq!(data.len(), 2, "{found}");
    assert_eq!(data[0]["text"], PEANUTS);
    let (top, next) = (
        data[0]["score"].as_f64().unwrap(),
        data[1]["score"].as_f64().unwrap(),
    );
    assert!(top >= 0.5 && next < 0.5 && top > next, "{found}");
    let (_, found) = search(json!({"query": "What snack should I bring?"})).await;
    assert_eq!(
        found["data"].as_array().unwrap().len(),
        1,
        "the default threshold leaves Hanoi out: {found}"
    );
}

#[tokio::test]
async fn a_record_can_be_deleted_and_a_user_forgotten() {
    let h = told_then_asked("").await;
    let all = records(&h, None, "ana").await;
    let hanoi = all.iter().find(|r| r["text"] == HANOI).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/v1/users/ana/memory/records/{hanoi}");
    assert_eq!(call(&h, None, Method::GET, &path, None).await.0, 200);
    let (status, gone) = call(&h, None, Method::DELETE, &path, None).await;
    assert_eq!((status, &gone["deleted"]), (200, &json!(true)), "{gone}");
    assert_eq!(call(&h, None, Method::GET, &path, None).await.0, 404);
    assert_eq!(call(&h, None, Method::DELETE, &path, None).await.0, 404);
    assert_eq!(texts(&records(&h, None, "ana").await), vec![PEANUTS]);

    // A live session holds the peanut fact; forgetting the user drops it.
    say(&h, "ana", "s2", "What snack should I bring?").await;
    assert_eq!(searched(&h, "s2").await, vec![PEANUTS]);
    let (status, forgot) = call(&h, None, Method::DELETE, "/v1/users/ana/memory", None).await;
    assert_eq!(status, 200, "{forgot}");
    assert_eq!(forgot["records"], 1, "{forgot}");
    assert!(records(&h, None, "ana").await.is_empty());
    say(&h, "ana", "s2", "Anything else?").await;
    assert_eq!(facts_sent(&h), None);
    // The session that began before does not write the user back, even
    // when it ends (its end extracts what is left).
    extract(&h, "s2").await;
    let ended = h.api(Method::DELETE, "/v1/sessions/s2", None).await;
    assert_eq!(ended.0, 200, "{ended:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(records(&h, None, "ana").await.is_empty());
    assert_eq!(
        call(&h, None, Method::DELETE, "/v1/users/ana/memory", None)
            .await
            .0,
        404
    );
}

#[tokio::test]
async fn a_session_end_extracts_what_is_left() {
    let h = harness("extract_every_turns = 10").await;
    say(&h, "ana", "s1", &format!("{PEANUTS}.")).await;
    assert!(records(&h, None, "ana").await.is_empty(), "not due yet");
    let ended = h.api(Method::DELETE, "/v1/sessions/s1", None).await;
    assert_eq!(ended.0, 200, "{ended:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while records(&h, None, "ana").await.is_empty() {
        assert!(Instant::now() < deadline, "the end extracted nothing");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(texts(&records(&h, None, "ana").await), vec![PEANUTS]);
}

#[tokio::test]
async fn records_stay_within_their_tenant() {
    const KEY_A: &str = "sk-lt-a";
    const KEY_B: &str = "sk-lt-b";
    let var = "RECALL_TEST_LONG_TERM_KEYS";
    std::env::set_var(var, format!("{KEY_A}, {KEY_B}"));
    let h = harness(&format!("[auth]\napi_keys_env = \"{var}\"\n")).await;
    say_as(&h, Some(KEY_A), "ana", "s1", &format!("{PEANUTS}.")).await;
    let path = "/v1/sessions/s1/memory/extract";
    let (status, body) = call(&h, Some(KEY_A), Method::POST, path, None).await;
    assert_eq!(status, 200, "{body}");
    let mine = records(&h, Some(KEY_A), "ana").await;
    assert_eq!(mine.len(), 1);
    // Shown as the tenant knows them: no tenant in the namespace or session.
    assert_eq!(
        mine[0]["namespace"], "/strategies/semantic/users/ana",
        "{mine:?}"
    );
    assert_eq!(
        (&mine[0]["user"], &mine[0]["session"]),
        (&json!("ana"), &json!("s1"))
    );
    // The other tenant's "ana" is someone else.
    assert!(records(&h, Some(KEY_B), "ana").await.is_empty());
    say_as(&h, Some(KEY_B), "ana", "s2", "What snack should I bring?").await;
    assert_eq!(facts_sent(&h), None);
    let (status, found) = call(
        &h,
        Some(KEY_B),
        Method::POST,
        "/v1/users/ana/memory/records/search",
        Some(json!({"query": "snack", "score_threshold": 0})),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(found["data"], json!([]));
    let id = records(&h, Some(KEY_A), "ana").await[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/v1/users/ana/memory/records/{id}");
    assert_eq!(call(&h, Some(KEY_B), Method::GET, &path, None).await.0, 404);
    assert_eq!(
        call(&h, Some(KEY_B), Method::DELETE, &path, None).await.0,
        404
    );
    assert_eq!(records(&h, Some(KEY_A), "ana").await.len(), 1);
}

#[tokio::test]
async fn records_survive_a_restart_on_sqlite() {
    if std::env::var("RECALL_TEST_BACKEND").as_deref() == Ok("redis") {
        return;
    }
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("recall-long-term-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("restart.db");
    let _ = std::fs::remove_file(&db);
    let toml = config(&format!(
        "[storage]\nbackend = \"sqlite\"\npath = \"{}\"",
        db.display()
    ));
    let first = Harness::start(&toml, "models = [\"*\"]").await;
    say(&first, "ana", "s1", &format!("{PEANUTS}. {HANOI}.")).await;
    extract(&first, "s1").await;
    let before = records(&first, None, "ana").await;
    first.app.wind_down().await;

    let second = Harness::start(&toml, "models = [\"*\"]").await;
    assert_eq!(records(&second, None, "ana").await, before);
    say(&second, "ana", "s2", "What snack should I bring?").await;
    assert_eq!(searched(&second, "s2").await, vec![PEANUTS]);
}

#[tokio::test]
async fn two_redis_replicas_share_records() {
    if let Ok(url) = std::env::var("RECALL_TEST_REDIS_URL") {
        two_replicas_share_records(&url, "one").await;
    }
}

/// On a cluster, a user's records are under one hash tag: the scripts
/// that change them run in its slot.
#[tokio::test]
async fn two_redis_cluster_replicas_share_records() {
    if let Ok(url) = std::env::var("RECALL_TEST_REDIS_CLUSTER_URL") {
        two_replicas_share_records(&url, "cluster").await;
    }
}

async fn two_replicas_share_records(url: &str, tag: &str) {
    let prefix = format!("lt{tag}{}", std::process::id());
    let toml = config(&format!(
        "[storage]\nbackend = \"redis\"\nurl = \"{url}\"\nkey_prefix = \"{prefix}\""
    ));
    let a = Harness::start(&toml, "models = [\"*\"]").await;
    let b = Harness::start(&toml, "models = [\"*\"]").await;
    say(&a, "ana", "s1", &format!("{PEANUTS}. {HANOI}.")).await;
    extract(&a, "s1").await;
    // Replica b reads what a stored (its cache is checked against Redis).
    assert_eq!(texts(&records(&b, None, "ana").await), vec![PEANUTS, HANOI]);
    say(&b, "ana", "s2", "What snack should I bring?").await;
    assert_eq!(searched(&b, "s2").await, vec![PEANUTS]);
    // A delete through b is seen by a.
    let hanoi = records(&b, None, "ana")
        .await
        .into_iter()
        .find(|r| r["text"] == HANOI)
        .unwrap();
    let path = format!(
        "/v1/users/ana/memory/records/{}",
        hanoi["id"].as_str().unwrap()
    );
    assert_eq!(call(&b, None, Method::DELETE, &path, None).await.0, 200);
    assert_eq!(texts(&records(&a, None, "ana").await), vec![PEANUTS]);
    // And a fact a stores again through a second session updates b's view.
    say(&a, "ana", "s3", &format!("{PEANUTS}!")).await;
    let done = extract(&a, "s3").await;
    assert_eq!(done["updated"], 1, "{done}");
    assert_eq!(records(&b, None, "ana").await.len(), 1);
}

#[tokio::test]
async fn an_extraction_running_when_the_user_is_forgotten_writes_nothing_back() {
    let h = harness("extract_every_turns = 1").await;
    h.upstream
        .extractions(LongTermMode::Slow(Duration::from_millis(800)));
    say(&h, "ana", "s1", &format!("{PEANUTS}.")).await;
    // The turn started an extraction, which answers after the delete.
    let (status, forgot) = call(&h, None, Method::DELETE, "/v1/users/ana/memory", None).await;
    assert_eq!(status, 200, "{forgot}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(h.upstream.extraction_requests().len(), 1);
    assert!(records(&h, None, "ana").await.is_empty());
    // A session that begins after the delete remembers again.
    h.upstream.extractions(LongTermMode::Echo);
    say(&h, "ana", "s2", &format!("{HANOI}.")).await;
    extract(&h, "s2").await;
    assert_eq!(texts(&records(&h, None, "ana").await), vec![HANOI]);
}

#[tokio::test]
async fn each_user_of_a_session_gets_their_own_facts() {
    let h = told_then_asked("").await;
    say(&h, "ana", "s2", "What snack should I bring?").await;
    assert_eq!(searched(&h, "s2").await, vec![PEANUTS]);
    // Bob speaks in the same session: none of Ana's facts go with his turn.
    say(&h, "bob", "s2", "What snack should I bring?").await;
    assert_eq!(facts_sent(&h), None);
    extract(&h, "s2").await;
    assert!(records(&h, None, "bob").await.is_empty());
    assert_eq!(texts(&records(&h, None, "ana").await), vec![PEANUTS, HANOI]);
}

#[tokio::test]
async fn messages_that_leave_the_history_are_still_extracted() {
    let h = Harness::start(
        &format!(
            "[history]\nwindow_messages = 2\nmax_messages = 2\n{}",
            config("")
        ),
        "models = [\"*\"]",
    )
    .await;
    for fact in [PEANUTS, HANOI, "I play the piano"] {
        say(&h, "ana", "s1", &format!("{fact}.")).await;
    }
    let (_, history) = h.history("s1").await;
    assert_eq!(
        history["contents"].as_array().unwrap().len(),
        2,
        "{history}"
    );
    extract(&h, "s1").await;
    assert_eq!(
        texts(&records(&h, None, "ana").await),
        vec![PEANUTS, HANOI, "I play the piano"]
    );
}

/// The `response_format` of each extraction request, by its type
/// (`"none"` without one).
fn formats_asked(h: &Harness) -> Vec<String> {
    h.upstream
        .extraction_requests()
        .iter()
        .map(|r| match &r.body["response_format"] {
            Value::Null => "none".to_owned(),
            f => f["type"].as_str().unwrap_or("?").to_owned(),
        })
        .collect()
}

/// The value of the metric line `name{labels}`, 0 when absent.
async fn metric(h: &Harness, line: &str) -> f64 {
    let text = h.metrics().await;
    text.lines()
        .find_map(|l| l.strip_prefix(line)?.trim().parse().ok())
        .unwrap_or(0.0)
}

const FAILED: &str = "recall_long_term_jobs_total{job=\"extract\",outcome=\"failed\"}";
const MALFORMED: &str = "recall_long_term_jobs_total{job=\"extract\",outcome=\"malformed\"}";

fn step_downs(refused: &str) -> String {
    format!("recall_structured_output_step_downs_total{{upstream=\"mock\",refused=\"{refused}\"}}")
}

/// An extraction asks for its shape by a strict JSON schema, within a
/// derived `max_tokens`, so that a grammar-constrained server cannot
/// answer prose.
#[tokio::test]
async fn extraction_asks_for_a_strict_json_schema_within_max_tokens() {
    let h = told_then_asked("").await;
    let asked = h.upstream.extraction_requests();
    assert_eq!(asked.len(), 1);
    let body = &asked[0].body;
    assert_eq!(
        body["response_format"],
        json!({"type": "json_schema", "json_schema": {
            "name": "facts", "strict": true,
            "schema": {
                "type": "object",
                "properties": {"facts": {"type": "array", "items": {
                    "type": "object",
                    "properties": {"text": {"type": "string"}},
                    "required": ["text"], "additionalProperties": false}}},
                "required": ["facts"], "additionalProperties": false}}})
    );
    // 50 facts (max_facts_per_answer) of 24 tokens, + 32.
    assert_eq!(body["max_tokens"], 50 * 24 + 32, "{body}");
    // The prompt says the same shape in words.
    let system = body["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains(r#"{"facts": [{"text": "..."}]}"#),
        "{system}"
    );

    // The key, when set, is what is sent.
    let h = told_then_asked("extract_max_tokens = 300").await;
    assert_eq!(h.upstream.extraction_requests()[0].body["max_tokens"], 300);
}

/// llama-cpp-python's server refuses `json_schema` (a 500 wrapping a
/// validation error that names `response_format`) but takes `json_object`
/// with the schema: the extraction asks that way at once, stores the
/// facts, counts no failure, and the next extraction starts there.
#[tokio::test]
async fn a_server_refusing_json_schema_is_asked_with_json_object_and_remembered() {
    let h = harness("").await;
    h.upstream
        .refuse_formats(&["json_schema"], llama_cpp_python_refusal);
    say(&h, "ana", "s1", &format!("{PEANUTS}.")).await;
    extract(&h, "s1").await;
    assert_eq!(formats_asked(&h), ["json_schema", "json_object"]);
    let asked = h.upstream.extraction_requests();
    let schema = &asked[0].body["response_format"]["json_schema"]["schema"];
    assert_eq!(
        asked[1].body["response_format"],
        json!({"type": "json_object", "schema": schema})
    );
    assert_eq!(texts(&records(&h, None, "ana").await), vec![PEANUTS]);

    say(&h, "ana", "s2", &format!("{HANOI}.")).await;
    extract(&h, "s2").await;
    assert_eq!(
        formats_asked(&h),
        ["json_schema", "json_object", "json_object"]
    );
    assert_eq!(texts(&records(&h, None, "ana").await), vec![PEANUTS, HANOI]);
    assert_eq!(metric(&h, &step_downs("json_schema")).await, 1.0);
    assert_eq!(metric(&h, FAILED).await, 0.0);
    assert_eq!(metric(&h, MALFORMED).await, 0.0);
}

/// A server that refuses both ways is asked plainly (the prompt alone),
/// at once, and from then on.
#[tokio::test]
async fn a_server_refusing_both_ways_is_asked_plainly() {
    let h = harness("").await;
    h.upstream
        .refuse_formats(&["json_schema", "json_object"], openai_refusal);
    say(&h, "ana", "s1", &format!("{PEANUTS}.")).await;
    extract(&h, "s1").await;
    assert_eq!(formats_asked(&h), ["json_schema", "json_object", "none"]);
    let plain = &h.upstream.extraction_requests()[2].body;
    assert!(plain.get("response_format").is_none(), "{plain}");
    assert_eq!(plain["max_tokens"], 50 * 24 + 32);
    say(&h, "ana", "s2", &format!("{HANOI}.")).await;
    extract(&h, "s2").await;
    assert_eq!(formats_asked(&h)[3..], ["none"]);
    assert_eq!(texts(&records(&h, None, "ana").await), vec![PEANUTS, HANOI]);
    assert_eq!(metric(&h, &step_downs("json_schema")).await, 1.0);
    assert_eq!(metric(&h, &step_downs("json_object")).await, 1.0);
    assert_eq!(metric(&h, FAILED).await, 0.0);
}

/// `structured_output` pins the way: it is asked first, and a refusal of
/// a pinned way is a failure, not a step down.
#[tokio::test]
async fn structured_output_pins_the_way_asked() {
    for (pinned, first) in [("json_object", "json_object"), ("none", "none")] {
        let h = Harness::start(
            &config(""),
            &format!("models = [\"*\"]\nstructured_output = \"{pinned}\""),
        )
        .await;
        say(&h, "ana", "s1", &format!("{PEANUTS}.")).await;
        extract(&h, "s1").await;
        assert_eq!(formats_asked(&h), [first], "{pinned}");
        assert_eq!(texts(&records(&h, None, "ana").await), vec![PEANUTS]);
    }
    let h = Harness::start(
        &config(""),
        "models = [\"*\"]\nstructured_output = \"json_schema\"",
    )
    .await;
    h.upstream
        .refuse_formats(&["json_schema"], llama_cpp_python_refusal);
    say(&h, "ana", "s1", &format!("{PEANUTS}.")).await;
    let (status, body) = call(
        &h,
        None,
        Method::POST,
        "/v1/sessions/s1/memory/extract",
        None,
    )
    .await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(formats_asked(&h), ["json_schema"]);
    assert_eq!(metric(&h, FAILED).await, 1.0);
    assert_eq!(metric(&h, &step_downs("json_schema")).await, 0.0);
}

/// A 500 that does not name the field (an overloaded server) is the
/// model's failure: no step down, and the next extraction asks with
/// `json_schema` again.
#[tokio::test]
async fn an_unrelated_server_error_is_no_refusal() {
    let h = harness("").await;
    h.upstream.extractions(LongTermMode::Fail(500));
    say(&h, "ana", "s1", &format!("{PEANUTS}.")).await;
    let (status, body) = call(
        &h,
        None,
        Method::POST,
        "/v1/sessions/s1/memory/extract",
        None,
    )
    .await;
    assert_eq!(status, 502, "{body}");
    h.upstream.extractions(LongTermMode::Echo);
    extract(&h, "s1").await;
    assert_eq!(formats_asked(&h), ["json_schema", "json_schema"]);
    assert_eq!(metric(&h, FAILED).await, 1.0);
    assert_eq!(metric(&h, &step_downs("json_schema")).await, 0.0);
}

/// A model asked plainly may wrap its JSON in prose; the facts inside are
/// stored. One stopped at `max_tokens` keeps its whole facts; one with
/// none whole is malformed.
#[tokio::test]
async fn facts_among_prose_or_before_a_cut_are_stored() {
    let h = harness("").await;
    h.upstream.extractions(LongTermMode::Text(format!(
        "Sure! Here are the facts: {{\"facts\": [{{\"text\": \"{PEANUTS}\"}}]}} Let me know."
    )));
    say(&h, "ana", "s1", "I have a peanut problem.").await;
    extract(&h, "s1").await;
    assert_eq!(texts(&records(&h, None, "ana").await), vec![PEANUTS]);

    h.upstream.extractions(LongTermMode::CutOff(format!(
        "{{\"facts\": [{{\"text\": \"{HANOI}\"}}, {{\"text\": \"I have two daugh"
    )));
    say(&h, "ana", "s2", "I live somewhere.").await;
    let done = extract(&h, "s2").await;
    assert_eq!(done["added"], 1, "{done}");
    assert_eq!(texts(&records(&h, None, "ana").await), vec![PEANUTS, HANOI]);

    h.upstream.extractions(LongTermMode::CutOff(
        "{\"facts\": [{\"text\": \"I am".into(),
    ));
    say(&h, "ana", "s3", "More.").await;
    let (status, body) = call(
        &h,
        None,
        Method::POST,
        "/v1/sessions/s3/memory/extract",
        None,
    )
    .await;
    assert_eq!(status, 502, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_tokens")),
        "{body}"
    );
    assert_eq!(metric(&h, MALFORMED).await, 1.0);
}

/// `GET /v1/users/{user}/memory?format=text`: the note and the facts in one
/// block, framed as a turn's system messages frame them, for frameworks
/// that take memory as a string.
#[tokio::test]
async fn a_users_memory_reads_as_one_text() {
    let h = harness("").await;
    let (status, _) = h
        .api(Method::GET, "/v1/users/tam/memory?format=text", None)
        .await;
    assert_eq!(status, 404);
    for text in [HANOI, PEANUTS] {
        let (status, body) = h
            .api(
                Method::POST,
                "/v1/users/tam/memory/records",
                Some(json!({"text": text})),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = h
        .api(Method::GET, "/v1/users/tam/memory?format=text", None)
        .await;
    assert_eq!(status, 200, "{body}");
    // Newest first, each with the day it was said (when it was added).
    let listed = records(&h, None, "tam").await;
    let day = |text: &str| {
        let r = listed.iter().find(|r| r["text"] == text).unwrap();
        recall::memory::long_term::day(r["said_at"].as_i64().unwrap()).unwrap()
    };
    assert_eq!(
        body,
        format!(
            "Relevant facts about the user:\n- ({}) {PEANUTS}\n- ({}) {HANOI}",
            day(PEANUTS),
            day(HANOI)
        )
    );
    let (status, _) = h
        .api(
            Method::PUT,
            "/v1/users/tam/memory",
            Some(json!({"note": "Tam likes tea."})),
        )
        .await;
    assert_eq!(status, 200);
    let (_, body) = h
        .api(Method::GET, "/v1/users/tam/memory?format=text", None)
        .await;
    assert_eq!(
        body,
        format!(
            "Previously, the user talked about: Tam likes tea.\n\n\
             Relevant facts about the user:\n- ({}) {PEANUTS}\n- ({}) {HANOI}",
            day(PEANUTS),
            day(HANOI)
        )
    );
    // The JSON form is as it was; another format is refused.
    let (_, note) = h.api(Method::GET, "/v1/users/tam/memory", None).await;
    assert_eq!(note["note"], "Tam likes tea.");
    let (status, _) = h
        .api(Method::GET, "/v1/users/tam/memory?format=xml", None)
        .await;
    assert_eq!(status, 400);
}
