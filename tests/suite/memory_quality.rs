//! What the LoCoMo evaluation (benches/memory) measures, held through the
//! real server: the user's own words as records with no model call, the
//! day each was said beside it, and a budget in tokens on what memory
//! adds to a call. The scripted mock is the embedding model.

use crate::common;

use common::*;
use reqwest::Method;
use serde_json::{json, Value};

/// 8 May 2023, 13:56 UTC, and 20 May 2023, 09:00 UTC.
const MAY_8: i64 = 1_683_554_160_000;
const MAY_20: i64 = 1_684_573_200_000;

/// Long-term memory with no extract model: the verbatim strategy.
fn verbatim(extra: &str) -> String {
    format!(
        "[long_term]\nenabled = true\nembedding_model = \"{EMBEDDER}\"\n\
         extract_every_turns = 1000\n{extra}\n"
    )
}

async fn turn(h: &Harness, session: &str, content: &str, timestamp: Option<i64>) {
    say_at(h, "ana", session, content, timestamp).await;
}

/// The facts message of the last turn the upstream received.
fn facts_sent(h: &Harness) -> Option<String> {
    let turn = h.upstream.turns().pop()?;
    turn.body["messages"]
        .as_array()?
        .iter()
        .filter_map(|m| m["content"].as_str())
        .find(|c| c.starts_with("Relevant facts about the user:"))
        .map(str::to_owned)
}

async fn records(h: &Harness) -> Vec<Value> {
    let (status, page) = h
        .api(Method::GET, "/v1/users/ana/memory/records?limit=100", None)
        .await;
    assert_eq!(status, 200, "{page}");
    let mut r = page["data"].as_array().unwrap().clone();
    r.sort_by_key(|r| r["said_at"].as_i64());
    r
}

#[tokio::test]
async fn the_users_own_words_are_records_dated_when_said_with_no_model_call() {
    let h = Harness::start(&verbatim(""), "models = [\"*\"]").await;
    turn(&h, "s1", "I am allergic to peanuts.", Some(MAY_8)).await;
    turn(&h, "s1", "Thanks!", Some(MAY_8 + 60_000)).await;
    turn(&h, "s1", "I live in Hanoi.", Some(MAY_20)).await;
    let (status, done) = h
        .api(Method::POST, "/v1/sessions/s1/memory/extract", None)
        .await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["added"], 2, "{done}");

    // Each sentence that says something, as said, when it was said.
    let stored = records(&h).await;
    let seen: Vec<(&str, i64, &str, &str)> = stored
        .iter()
        .map(|r| {
            (
                r["text"].as_str().unwrap(),
                r["said_at"].as_i64().unwrap(),
                r["session"].as_str().unwrap(),
                r["strategy"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("I am allergic to peanuts.", MAY_8, "s1", "verbatim"),
            ("I live in Hanoi.", MAY_20, "s1", "verbatim"),
        ]
    );
    // No model was asked to remember: the upstream saw the three turns
    // and nothing else (embeddings aside).
    let chats = h
        .upstream
        .received()
        .into_iter()
        .filter(|r| r.path.ends_with("/chat/completions"))
        .count();
    assert_eq!(chats, 3);

    // A new session's question is sent the fact it is about, with its day.
    turn(&h, "s2", "What snack should I bring?", None).await;
    let sent = facts_sent(&h).expect("the fact is sent with the question");
    assert_eq!(
        sent,
        "Relevant facts about the user:\n- (8 May 2023) I am allergic to peanuts."
    );
}

#[tokio::test]
async fn records_seeded_through_the_session_api_take_the_timestamps_given() {
    let h = Harness::start(&verbatim(""), "models = [\"*\"]").await;
    let (status, body) = h
        .api(
            Method::POST,
            "/v1/sessions/seeded/messages",
            Some(json!({"messages": [
                {"role": "user", "content": "I adopted a puppy named Rex.", "timestamp": MAY_8},
                {"role": "assistant", "content": "Congratulations!", "timestamp": MAY_8 + 1},
            ]})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // The session API names no user: the records go to the session's
    // user once a turn names one.
    turn(
        &h,
        "seeded",
        "I walk him every morning before work.",
        Some(MAY_20),
    )
    .await;
    let (status, done) = h
        .api(Method::POST, "/v1/sessions/seeded/memory/extract", None)
        .await;
    assert_eq!(status, 200, "{done}");
    let stored = records(&h).await;
    let dated: Vec<(&str, i64)> = stored
        .iter()
        .map(|r| (r["text"].as_str().unwrap(), r["said_at"].as_i64().unwrap()))
        .collect();
    assert_eq!(
        dated,
        [
            ("I adopted a puppy named Rex.", MAY_8),
            ("I walk him every morning before work.", MAY_20),
        ]
    );
}

/// Approximate tokens of a text, as the budget counts them.
fn approx_tokens(text: &str) -> usize {
    text.len().div_ceil(4)
}

#[tokio::test]
async fn the_facts_sent_fit_the_token_budget_best_first() {
    let foods = [
        "I am allergic to peanuts and to every kind of tree nut, badly",
        "I cook dinner for my family every evening after work",
        "My favourite food is sushi, and pizza comes second",
        "I drink green tea in the morning and coffee after lunch",
    ];
    let mut ranked: Vec<String> = Vec::new();
    for budget in [1000, 45] {
        let h = Harness::start(
            &verbatim(&format!("max_tokens = {budget}")),
            "models = [\"*\"]",
        )
        .await;
        for text in foods {
            let (status, body) = h
                .api(
                    Method::POST,
                    "/v1/users/ana/memory/records",
                    Some(json!({"text": text, "said_at": MAY_8})),
                )
                .await;
            assert_eq!(status, 200, "{body}");
        }
        turn(&h, "q", "What food should I bring for a snack?", None).await;
        let sent = facts_sent(&h).expect("facts are sent");
        let lines: Vec<String> = sent.lines().skip(1).map(str::to_owned).collect();
        println!(
            "budget {budget}: {} tokens, {} facts",
            approx_tokens(&sent),
            lines.len()
        );
        if ranked.is_empty() {
            // A budget they all fit in: every fact, best first.
            assert_eq!(lines.len(), foods.len(), "{sent}");
            ranked = lines;
            continue;
        }
        assert!(approx_tokens(&sent) <= budget, "{sent}");
        // Filled in rank order; a fact too long for what is left is
        // passed over for a shorter one after it.
        let mut left = budget - approx_tokens("Relevant facts about the user:\n");
        let mut expected = Vec::new();
        for line in &ranked {
            let cost = approx_tokens(line) + 1;
            if cost <= left {
                left -= cost;
                expected.push(line.clone());
            }
        }
        assert!(!expected.is_empty() && expected.len() < foods.len());
        assert_eq!(lines, expected);
    }
}

#[tokio::test]
async fn a_long_note_is_cut_to_the_memory_budget() {
    let config =
        format!("[memory]\ncarry_over = true\nsummary_model = \"{SUMMARIZER}\"\nmax_tokens = 50\n");
    let h = Harness::start(&config, "models = [\"*\"]").await;
    let note = format!(
        "Ana lives in Hanoi. {}",
        "She told a long story. ".repeat(100)
    );
    let (status, body) = h
        .api(
            Method::PUT,
            "/v1/users/ana/memory",
            Some(json!({"note": note})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    turn(&h, "next", "Hello again.", None).await;
    let sent = h.upstream.turns().pop().unwrap();
    let carried = sent.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .find(|c| c.starts_with("Previously, the user talked about:"))
        .expect("the note is carried in")
        .to_owned();
    println!(
        "note sent: {} tokens of {}",
        approx_tokens(&carried),
        approx_tokens(&note)
    );
    assert!(approx_tokens(&carried) <= 50, "{carried}");
    assert!(
        carried.starts_with("Previously, the user talked about: Ana lives in Hanoi.")
            && carried.ends_with(" ..."),
        "{carried}"
    );
}

#[tokio::test]
async fn a_fact_that_changed_supersedes_the_old_one_and_the_history_keeps_both() {
    // The user's own words, and the facts an extract model writes.
    for extract in ["", "extract_model = \"extractor\"\n"] {
        let h = Harness::start(&verbatim(extract), "models = [\"*\"]").await;
        turn(&h, "monday", "I live in Paris.", Some(MAY_8)).await;
        let (status, done) = h
            .api(Method::POST, "/v1/sessions/monday/memory/extract", None)
            .await;
        assert_eq!(
            (status, done["superseded"].as_u64()),
            (200, Some(0)),
            "{done}"
        );
        turn(&h, "friday", "I moved to Berlin last week.", Some(MAY_20)).await;
        let (status, done) = h
            .api(Method::POST, "/v1/sessions/friday/memory/extract", None)
            .await;
        assert_eq!(
            (status, done["superseded"].as_u64()),
            (200, Some(1)),
            "{done}"
        );

        // Only Berlin is current, and only Berlin is sent.
        let current = records(&h).await;
        let texts: Vec<&str> = current
            .iter()
            .map(|r| r["text"].as_str().unwrap())
            .collect();
        assert_eq!(texts.len(), 1, "{extract}: {texts:?}");
        assert!(texts[0].contains("Berlin"), "{texts:?}");
        turn(&h, "sunday", "Where do I live now?", None).await;
        let sent = facts_sent(&h).expect("the current fact is sent");
        assert!(sent.contains("Berlin") && !sent.contains("Paris"), "{sent}");

        // The history shows both: Paris superseded by Berlin, from when
        // Berlin was said.
        let (status, page) = h
            .api(
                Method::GET,
                "/v1/users/ana/memory/records?include_superseded=true",
                None,
            )
            .await;
        assert_eq!(status, 200, "{page}");
        let all = page["data"].as_array().unwrap();
        assert_eq!(all.len(), 2, "{page}");
        let paris = all
            .iter()
            .find(|r| r["text"].as_str().unwrap().contains("Paris"))
            .unwrap();
        let berlin = all
            .iter()
            .find(|r| r["text"].as_str().unwrap().contains("Berlin"))
            .unwrap();
        assert_eq!(paris["superseded_by"], berlin["id"], "{page}");
        assert_eq!(paris["valid_to"], json!(MAY_20), "{page}");
        assert_eq!(berlin["superseded_by"], Value::Null, "{page}");

        // Searching finds no superseded record; deleting the user's memory
        // deletes every record, superseded or not.
        let (status, found) = h
            .api(
                Method::POST,
                "/v1/users/ana/memory/records/search",
                Some(json!({"query": "Paris", "score_threshold": 0.0})),
            )
            .await;
        assert_eq!(status, 200, "{found}");
        assert!(
            found["data"]
                .as_array()
                .unwrap()
                .iter()
                .all(|r| r["superseded_by"].is_null()),
            "{found}"
        );
        let (status, _) = h.api(Method::DELETE, "/v1/users/ana/memory", None).await;
        assert!(status == 200 || status == 204, "{status}");
        let (_, page) = h
            .api(
                Method::GET,
                "/v1/users/ana/memory/records?include_superseded=true",
                None,
            )
            .await;
        assert_eq!(page["data"].as_array().map(Vec::len), Some(0), "{page}");
    }
}
