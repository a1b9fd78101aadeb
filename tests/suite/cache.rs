//! The exact-match answer cache.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

async fn ask(
    h: &Harness,
    session: &str,
    text: &str,
    extra: &[(&str, &str)],
) -> (u16, Option<String>, Value) {
    let mut req = h
        .client
        .post(format!("{}/v1/chat/completions", h.url))
        .header("x-session-id", session)
        .json(&json!({"model": "m", "messages": [user(text)]}));
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let cache = resp
        .headers()
        .get("x-recall-cache")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, cache, resp.json().await.unwrap())
}

#[tokio::test]
async fn a_repeated_question_is_answered_from_the_cache() {
    let h = Harness::start("[cache]\nexact_match = true\n", "").await;
    h.upstream.push(completion("We open at nine."));
    let (_, cache, first) = ask(&h, "c", "When do you open?", &[]).await;
    assert_eq!(cache.as_deref(), Some("miss"));
    assert_eq!(
        first["choices"][0]["message"]["content"],
        "We open at nine."
    );
    h.say("c", "Thanks").await;
    let calls = h.upstream.received().len();

    let (status, cache, hit) = ask(&h, "c", "When do you open?", &[]).await;
    assert_eq!((status, cache.as_deref()), (200, Some("hit")));
    assert_eq!(hit["object"], "chat.completion");
    assert_eq!(hit["choices"][0]["message"]["content"], "We open at nine.");
    assert_eq!(
        h.upstream.received().len(),
        calls,
        "the upstream was called"
    );
    assert_eq!(h.app.metrics.cache_hits(), 1);

    // Recorded like any reply, marked as coming from the cache.
    let (_, hist) = h.history("c").await;
    let c = hist["contents"].as_array().unwrap();
    assert_eq!(c.len(), 6);
    assert_eq!(c[5]["content"], "We open at nine.");
    assert_eq!(c[5]["metadata"]["source"], "cache");
    assert_eq!(c[5]["turn_id"], c[4]["turn_id"]);

    // Other sessions do not share a session-scoped cache.
    let (_, cache, _) = ask(&h, "other", "When do you open?", &[]).await;
    assert_eq!(cache.as_deref(), Some("miss"));
    // Bypass asks the upstream.
    let calls = h.upstream.received().len();
    let (_, cache, _) = ask(
        &h,
        "c",
        "When do you open?",
        &[("x-recall-cache", "bypass")],
    )
    .await;
    assert_ne!(cache.as_deref(), Some("hit"));
    assert_eq!(h.upstream.received().len(), calls + 1);
}

#[tokio::test]
async fn a_streaming_hit_is_sent_as_sse() {
    let h = Harness::start("[cache]\nexact_match = true\nscope = \"global\"\n", "").await;
    h.upstream.push(completion("Nine to five."));
    ask(&h, "a", "Hours?", &[]).await;
    let resp = h
        .client
        .post(format!("{}/v1/chat/completions", h.url))
        .header("x-session-id", "b")
        .json(
            &json!({"model": "m", "stream": true, "stream_options": {"include_usage": true},
                      "messages": [user("Hours?")]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-recall-cache"], "hit");
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let text = resp.text().await.unwrap();
    assert!(text.contains("\"content\":\"Nine to five.\""), "{text}");
    assert!(text.contains("\"choices\":[]"), "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"));
    assert_eq!(h.upstream.received().len(), 1);
    assert_eq!(
        h.transcript("b").await,
        ["user: Hours?", "assistant: Nine to five."]
    );
}

#[tokio::test]
async fn the_cache_key_includes_model_and_instructions() {
    let h = Harness::start("[cache]\nexact_match = true\n", "").await;
    ask(&h, "k", "Same words", &[]).await;
    let (status, _) = h
        .chat(
            Some("k"),
            json!({"model": "m", "messages": [system("be terse"), user("Same words")]}),
        )
        .await;
    assert_eq!(status, 200);
    let (status, _) = h
        .chat(
            Some("k"),
            json!({"model": "other", "messages": [user("Same words")]}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(h.upstream.received().len(), 3);
    // Requests with tools are never answered from the cache.
    let body = json!({"model": "m", "tools": [{"type": "function", "function": {"name": "f"}}],
                      "messages": [user("Same words")]});
    h.chat(Some("k"), body).await;
    assert_eq!(h.upstream.received().len(), 4);
}

#[tokio::test]
async fn interrupted_and_failed_replies_are_never_cached() {
    let h = Harness::start("[cache]\nexact_match = true\n", "").await;
    // Interrupted: the client goes away mid-stream.
    h.upstream
        .push(sse_text(&["Par", "tial"], Duration::from_millis(200)));
    let resp = h
        .client
        .post(format!("{}/v1/chat/completions", h.url))
        .header("x-session-id", "i")
        .json(&json!({"model": "m", "stream": true, "messages": [user("Tell me")]}))
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    use futures_util::StreamExt;
    let mut seen = String::new();
    while !seen.contains("Par") {
        seen.push_str(&String::from_utf8_lossy(
            &stream.next().await.unwrap().unwrap(),
        ));
    }
    drop(stream);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (_, cache, _) = ask(&h, "i", "Tell me", &[]).await;
    assert_eq!(cache.as_deref(), Some("miss"));

    // Failed: an error answer is not an answer.
    h.upstream.push(error_reply(500, "down"));
    let (status, _, _) = ask(&h, "f", "Tell me", &[]).await;
    assert_eq!(status, 500);
    let (_, cache, _) = ask(&h, "f", "Tell me", &[]).await;
    assert_eq!(cache.as_deref(), Some("miss"));
}

#[tokio::test]
async fn answers_are_not_shared_without_a_session_nor_after_a_reset_or_an_end() {
    let h = Harness::start("[cache]\nexact_match = true\n", "").await;
    // No session, session scope: nothing to scope answers by.
    for _ in 0..2 {
        let (status, body) = h
            .chat(
                None,
                json!({"model": "m", "messages": [user("my balance?")]}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(h.upstream.received().len(), 2);

    ask(&h, "reuse", "my balance?", &[]).await;
    h.client
        .delete(format!("{}/v1/sessions/reuse/history", h.url))
        .send()
        .await
        .unwrap();
    let (_, cache, _) = ask(&h, "reuse", "my balance?", &[]).await;
    assert_eq!(cache.as_deref(), Some("miss"), "an answer survived a reset");
    h.client
        .post(format!("{}/v1/sessions/reuse/end", h.url))
        .send()
        .await
        .unwrap();
    let (_, cache, _) = ask(&h, "reuse", "my balance?", &[]).await;
    assert_eq!(
        cache.as_deref(),
        Some("miss"),
        "an answer survived the session"
    );
}

#[tokio::test]
async fn request_parameters_and_truncated_answers_keep_answers_apart() {
    let h = Harness::start("[cache]\nexact_match = true\n", "").await;
    ask(&h, "p", "Describe it", &[]).await;
    let (status, _) = h
        .chat(
            Some("p"),
            json!({"model": "m", "response_format": {"type": "json_object"},
                   "messages": [user("Describe it")]}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        h.upstream.received().len(),
        2,
        "a JSON-mode request got a text answer"
    );

    h.upstream.push(Reply::Json {
        status: 200,
        body: json!({"choices": [{"index": 0, "finish_reason": "length",
                                  "message": {"role": "assistant", "content": "It is a lo"}}]}),
        headers: vec![],
    });
    ask(&h, "t", "Long story", &[]).await;
    let (_, cache, _) = ask(&h, "t", "Long story", &[]).await;
    assert_eq!(
        cache.as_deref(),
        Some("miss"),
        "a truncated answer was cached"
    );
}

#[tokio::test]
async fn a_regenerate_gets_a_new_answer_not_the_cached_one_it_replaces() {
    let h = Harness::start("[cache]\nexact_match = true\n", "").await;
    h.upstream.push(completion("Hello!"));
    h.upstream.push(completion("We open at nine."));
    h.upstream.push(completion("Nine in the morning."));
    let send = |messages: Vec<Value>| {
        let h = &h;
        async move {
            let resp = h
                .post_chat("regen", json!({"model": "m", "messages": messages}))
                .await;
            let cache = resp.headers().get("x-recall-cache").cloned();
            let body: Value = resp.json().await.unwrap();
            (cache, body["choices"][0]["message"]["content"].clone())
        }
    };
    send(vec![user("hi")]).await;
    let asked = vec![user("hi"), assistant("Hello!"), user("When do you open?")];
    let (cache, first) = send(asked.clone()).await;
    assert_eq!(cache.unwrap(), "miss");
    assert_eq!(first, "We open at nine.");

    // The UI's regenerate button: the same conversation again.
    let (cache, again) = send(asked).await;
    assert_eq!(again, "Nine in the morning.", "answered from the cache");
    assert_eq!(
        cache.unwrap(),
        "miss",
        "a regenerate does not look the cache up"
    );
    assert_eq!(h.upstream.received().len(), 3);
    assert_eq!(
        h.transcript("regen").await,
        [
            "user: hi",
            "assistant: Hello!",
            "user: When do you open?",
            "assistant: Nine in the morning."
        ]
    );
}
