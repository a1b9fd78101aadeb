//! The built-in mock upstream, `base_url = "mock://echo"`: recall answers
//! that upstream itself, with no network and no key, for demos and tests.
//!
//! The mock is a small OpenAI-compatible HTTP server on 127.0.0.1 with an
//! ephemeral port, started with the upstream that uses it and stopped when
//! that upstream is dropped. The upstream then calls it like any other, so
//! a mock reply takes the same path as a real one: the relay, SSE parsing,
//! interruptions and draining all run unchanged.

pub use recall_core::exchange::{echo, embed};

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::config::{MockKind, UpstreamConfig, DEFAULT_CHUNK_DELAY_MS, DEFAULT_WORDS_PER_CHUNK};

/// How fast a mock streams: `words_per_chunk` words per content chunk, each
/// chunk after `chunk_delay`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    pub chunk_delay: Duration,
    pub words_per_chunk: usize,
}

impl Pace {
    pub fn of(c: &UpstreamConfig) -> Self {
        Self {
            chunk_delay: Duration::from_millis(
                c.mock_chunk_delay_ms.unwrap_or(DEFAULT_CHUNK_DELAY_MS),
            ),
            words_per_chunk: c.mock_words_per_chunk.unwrap_or(DEFAULT_WORDS_PER_CHUNK),
        }
    }
}

/// A running mock server. Dropping it stops accepting connections; replies
/// already streaming run to their end.
#[derive(Debug)]
pub struct MockServer {
    addr: SocketAddr,
    pace: Pace,
    task: tokio::task::AbortHandle,
}

impl MockServer {
    /// Binds 127.0.0.1 on an ephemeral port and starts serving; must be
    /// called inside a tokio runtime.
    pub async fn start(kind: MockKind, pace: Pace) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let router = router(kind, pace);
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                tracing::error!(error = %e, "mock upstream stopped");
            }
        })
        .abort_handle();
        tracing::debug!(%addr, ?kind, ?pace, "mock upstream started");
        Ok(Self { addr, pace, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn pace(&self) -> Pace {
        self.pace
    }

    /// The base URL recall's upstream client calls.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Echo {
    pace: Pace,
    /// Numbers the completions' ids, so each reply has its own.
    next_id: AtomicU64,
}

fn router(kind: MockKind, pace: Pace) -> Router {
    // One kind for now; a second one gets its own handler here.
    match kind {
        MockKind::Echo => {}
    }
    let state = Arc::new(Echo {
        pace,
        next_id: AtomicU64::new(1),
    });
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .route("/v1/models/{*model}", get(model))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "the echo mock has no such route") })
        .with_state(state)
}

const MODEL_ID: &str = "mock-echo";

fn model_object(id: &str) -> Value {
    json!({"id": id, "object": "model", "created": 0, "owned_by": "recall"})
}

async fn models() -> Response {
    axum::Json(json!({"object": "list", "data": [model_object(MODEL_ID)]})).into_response()
}

/// Any model name is served: the echo does not depend on it.
async fn model(axum::extract::Path(id): axum::extract::Path<String>) -> Response {
    axum::Json(model_object(&id)).into_response()
}

fn error(status: StatusCode, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": "invalid_request_error",
                                "param": null, "code": null}});
    (status, axum::Json(body)).into_response()
}

/// `/v1/embeddings`: `input` a string or a list of them; the mock's
/// embeddings (`embed::embedding`) in the `encoding_format` asked for.
async fn embeddings(body: Bytes) -> Response {
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, "the body is not JSON");
    };
    let inputs: Vec<&str> = match &request["input"] {
        Value::String(s) => vec![s.as_str()],
        Value::Array(list) if list.iter().all(Value::is_string) => {
            list.iter().filter_map(Value::as_str).collect()
        }
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "`input` must be a string or a list of strings",
            )
        }
    };
    let words: usize = inputs.iter().map(|t| echo::words(t)).sum();
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let v = embed::encoded(&embed::embedding(t), &request["encoding_format"]);
            json!({"object": "embedding", "index": i, "embedding": v})
        })
        .collect();
    axum::Json(json!({
        "object": "list", "data": data,
        "model": request["model"].as_str().unwrap_or(MODEL_ID),
        "usage": {"prompt_tokens": words, "total_tokens": words},
    }))
    .into_response()
}

async fn chat(State(echo): State<Arc<Echo>>, body: Bytes) -> Response {
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, "the body is not JSON");
    };
    let Some(messages) = request["messages"].as_array() else {
        return error(StatusCode::BAD_REQUEST, "`messages` must be an array");
    };
    let max_tokens = request["max_completion_tokens"]
        .as_u64()
        .or_else(|| request["max_tokens"].as_u64());
    let (text, finish_reason) = echo::within(echo::reply(messages), max_tokens);
    let reply = Reply {
        id: format!(
            "chatcmpl-mock-{}",
            echo.next_id.fetch_add(1, Ordering::Relaxed)
        ),
        created: unix_secs(),
        model: request["model"].as_str().unwrap_or(MODEL_ID).to_owned(),
        usage: usage(echo::prompt_words(messages), echo::words(&text)),
        text,
        finish_reason,
    };
    let request_id = reply.id.replacen("chatcmpl", "req", 1);
    let mut response = if request["stream"].as_bool().unwrap_or(false) {
        let include_usage = request["stream_options"]["include_usage"]
            .as_bool()
            .unwrap_or(false);
        stream(reply, include_usage, echo.pace)
    } else {
        axum::Json(reply.completion()).into_response()
    };
    if let Ok(v) = request_id.parse() {
        response.headers_mut().insert("x-request-id", v);
    }
    response
}

/// One echo answer, in either wire form.
struct Reply {
    id: String,
    created: u64,
    model: String,
    text: String,
    finish_reason: &'static str,
    usage: Value,
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion,
           "total_tokens": prompt + completion})
}

impl Reply {
    fn completion(&self) -> Value {
        json!({
            "id": self.id, "object": "chat.completion", "created": self.created,
            "model": self.model, "system_fingerprint": null,
            "choices": [{"index": 0, "logprobs": null, "finish_reason": self.finish_reason,
                         "message": {"role": "assistant", "content": self.text,
                                     "refusal": null, "annotations": []}}],
            "usage": self.usage,
        })
    }

    /// One `data:` event. As OpenAI does, every chunk carries `usage: null`
    /// when the client asked for usage, and the last one has the numbers.
    fn chunk(&self, choices: Value, usage: Option<&Value>) -> Bytes {
        let mut chunk = json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model, "system_fingerprint": null, "choices": choices,
        });
        if let Some(usage) = usage {
            chunk["usage"] = usage.clone();
        }
        Bytes::from(format!("data: {chunk}\n\n"))
    }
}

fn choice(delta: Value, finish_reason: Option<&str>) -> Value {
    json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}])
}

/// The SSE stream: a role chunk at once, each content chunk after the
/// pace's delay, then the finish chunk, the usage chunk if asked for, and
/// `[DONE]`.
fn stream(reply: Reply, include_usage: bool, pace: Pace) -> Response {
    let null = include_usage.then_some(&Value::Null);
    let mut events = vec![(
        Duration::ZERO,
        reply.chunk(
            choice(
                json!({"role": "assistant", "content": "", "refusal": null}),
                None,
            ),
            null,
        ),
    )];
    for piece in echo::pieces(&reply.text, pace.words_per_chunk) {
        let delta = json!({"content": piece});
        events.push((pace.chunk_delay, reply.chunk(choice(delta, None), null)));
    }
    events.push((
        Duration::ZERO,
        reply.chunk(choice(json!({}), Some(reply.finish_reason)), null),
    ));
    if include_usage {
        events.push((Duration::ZERO, reply.chunk(json!([]), Some(&reply.usage))));
    }
    events.push((Duration::ZERO, Bytes::from_static(b"data: [DONE]\n\n")));
    let body = futures_util::stream::iter(events).then(|(delay, event)| async move {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Ok::<_, std::convert::Infallible>(event)
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "cannot build the stream"))
}

fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
