//! The evaluation's upstream: it answers a replayed turn with the line
//! the other speaker said next, and hands the request of a question (what
//! recall sent, memory and all) to the evaluation. And the answering
//! model, when one is configured: any OpenAI-compatible server.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::locomo::Question;

#[derive(Default)]
struct Script {
    /// The reply to the next turn; none: the next request is a question.
    next: Mutex<Option<String>>,
    question: Mutex<Option<oneshot::Sender<Value>>>,
}

pub struct Replay {
    pub addr: SocketAddr,
    script: Arc<Script>,
}

impl Replay {
    pub async fn start() -> Self {
        let script = Arc::new(Script::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the replay upstream");
        let addr = listener.local_addr().expect("its address");
        let app = axum::Router::new()
            .fallback(axum::routing::post(answer))
            .with_state(Arc::clone(&script));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, script }
    }

    /// The next turn is answered with `text`.
    pub fn reply_next(&self, text: &str) {
        *self.script.next.lock().expect("script") = Some(text.to_owned());
    }

    /// What the upstream is sent while `ask` runs (a question).
    pub async fn capture<F, Fut>(&self, ask: F) -> Value
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = ()>,
    {
        let (tx, rx) = oneshot::channel();
        *self.script.next.lock().expect("script") = None;
        *self.script.question.lock().expect("script") = Some(tx);
        ask().await;
        rx.await.expect("the question reached the upstream")
    }
}

async fn answer(State(script): State<Arc<Script>>, Json(body): Json<Value>) -> Json<Value> {
    let next = script.next.lock().expect("script").take();
    let text = match next {
        Some(line) => line,
        None => {
            if let Some(tx) = script.question.lock().expect("script").take() {
                let _ = tx.send(body.clone());
            }
            "I am not sure.".to_owned()
        }
    };
    Json(json!({
        "id": "chatcmpl-replay", "object": "chat.completion", "created": 0,
        "model": body["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }))
}

/// The answering model (and the judge, when one is named).
pub struct Answerer {
    url: String,
    model: String,
    judge: Option<String>,
    key: Option<String>,
    client: reqwest::Client,
}

const ANSWER: &str = "Answer the user's question from what you know of them, in a short \
phrase (a few words, a date or a name). If you do not know, say so.";

const JUDGE: &str = "You grade an answer to a question about a conversation. Given the \
question, the gold answer and the answer, reply with one word: CORRECT if the answer means \
the same as the gold answer (dates may be written differently), else WRONG.";

impl Answerer {
    pub fn new(url: String, model: String, judge: Option<String>, key: Option<String>) -> Self {
        Self {
            url: url.trim_end_matches('/').to_owned(),
            model,
            judge,
            key,
            client: reqwest::Client::new(),
        }
    }

    async fn complete(&self, model: &str, messages: Vec<Value>) -> String {
        let body =
            json!({"model": model, "messages": messages, "temperature": 0, "max_tokens": 64});
        let mut req = self
            .client
            .post(format!("{}/chat/completions", self.url))
            .json(&body);
        if let Some(k) = &self.key {
            req = req.bearer_auth(k);
        }
        match req.send().await {
            Ok(r) => match r.json::<Value>().await {
                Ok(v) => v["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap_or_default()
                    .trim()
                    .to_owned(),
                Err(e) => {
                    eprintln!("\nmemory eval: the answering model's answer: {e}");
                    String::new()
                }
            },
            Err(e) => {
                eprintln!("\nmemory eval: the answering model: {e}");
                String::new()
            }
        }
    }

    /// The model's answer to the question at the end of `messages` (what
    /// recall sent), and the judge's verdict.
    pub async fn answer(&self, messages: &[Value], q: &Question) -> (String, Option<bool>) {
        let mut m = vec![json!({"role": "system", "content": ANSWER})];
        m.extend(messages.iter().cloned());
        let answer = self.complete(&self.model, m).await;
        let Some(judge) = &self.judge else {
            return (answer, None);
        };
        let asked = format!(
            "Question: {}\nGold answer: {}\nAnswer: {answer}",
            q.question, q.answer
        );
        let verdict = self
            .complete(
                judge,
                vec![
                    json!({"role": "system", "content": JUDGE}),
                    json!({"role": "user", "content": asked}),
                ],
            )
            .await;
        (answer, Some(verdict.to_uppercase().starts_with("CORRECT")))
    }
}
