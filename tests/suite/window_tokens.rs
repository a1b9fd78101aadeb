//! `[history] window_tokens`: what the upstream receives from a long
//! history, counted with the model's tokenizer or, for a model recall does
//! not know, estimated from characters.

use crate::common;

use common::*;
use recall::memory::window::{TrimReason, TrimScope};
use reqwest::Method;
use serde_json::{json, Value};

/// "hello <word>" is 2 tokens in o200k_base and cl100k_base, and 9 to 12
/// characters (3 tokens by the estimate).
const WORDS: [&str; 16] = [
    "world", "there", "again", "friend", "people", "river", "moon", "team", "bird", "fish", "tree",
    "city", "sun", "sky", "cat", "dog",
];

const CONFIG: &str = "[history]\nwindow_messages = 100\nwindow_tokens = 30\n\n\
    [[system_messages]]\ncontent = \"A system prompt is not history: it is never counted.\"\n";

async fn seed(h: &Harness, session: &str) -> Vec<String> {
    let messages: Vec<Value> = WORDS
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let text = format!("hello {w}");
            if i % 2 == 0 {
                user(&text)
            } else {
                assistant(&text)
            }
        })
        .collect();
    let (status, body) = h
        .api(
            Method::PUT,
            &format!("/v1/sessions/{session}/history"),
            Some(json!({ "messages": messages })),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    h.transcript(session).await
}

async fn ask(h: &Harness, session: &str, model: &str) -> Vec<String> {
    let (status, body) = h
        .chat(
            Some(session),
            json!({"model": model, "messages": [user("hello world")]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    h.upstream.last().transcript()
}

#[tokio::test]
async fn a_long_history_is_cut_to_the_newest_messages_within_the_token_bound() {
    let h = Harness::start(CONFIG, "").await;
    let system = "system: A system prompt is not history: it is never counted.";
    for model in ["gpt-4o", "gpt-4o-mini", "gpt-3.5-turbo"] {
        let stored = seed(&h, model).await;
        assert_eq!(stored.len(), 16);
        // Every message is 3 + 1 (role) + 2 = 6 tokens: five fit in 30.
        let mut expected = vec![system.to_owned()];
        expected.extend(stored[12..].iter().cloned());
        expected.push("user: hello world".into());
        assert_eq!(ask(&h, model, model).await, expected, "{model}");
    }
    assert!(
        h.app
            .metrics
            .trimmed(TrimScope::Window, TrimReason::MaxTokens)
            >= 3 * 12
    );
}

#[tokio::test]
async fn an_unknown_model_is_bounded_by_characters_over_four() {
    let h = Harness::start(CONFIG, "").await;
    let stored = seed(&h, "llama").await;
    // A user message is 3 + 1 ("user") + 3 = 7, an assistant's 3 + 3 + 3 = 9:
    // 7 + 9 + 7 fit in 30, one more assistant message would not.
    assert_eq!(
        ask(&h, "llama", "llama-3.1-8b-instruct").await,
        [
            "system: A system prompt is not history: it is never counted.",
            &stored[14],
            &stored[15],
            "user: hello world",
        ]
    );
}

#[tokio::test]
async fn a_user_message_over_the_bound_is_sent_alone() {
    let h = Harness::start(CONFIG, "").await;
    seed(&h, "long").await;
    let long = "many words in one long question ".repeat(10);
    let (status, body) = h
        .chat(
            Some("long"),
            json!({"model": "gpt-4o", "messages": [user(&long)]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        h.upstream.last().transcript(),
        [
            "system: A system prompt is not history: it is never counted.".to_owned(),
            format!("user: {long}"),
        ]
    );
}
