//! Test harness: a scripted mock upstream that records every request it
//! receives, and a real recall server on an ephemeral port in front of it.
#![allow(dead_code)]

pub mod raw_upstream;
pub mod tls;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use serde_json::{json, Value};

/// What the mock upstream answers to one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A JSON body with a status and extra headers.
    Json {
        status: u16,
        body: Value,
        headers: Vec<(&'static str, &'static str)>,
    },
    /// An SSE stream: each chunk is written after its delay.
    Sse { chunks: Vec<(Duration, String)> },
    /// A JSON body written in pieces, each after its delay.
    JsonInPieces { chunks: Vec<(Duration, String)> },
    /// Never answers.
    Hang,
    /// Any body with any content type.
    Raw {
        status: u16,
        content_type: &'static str,
        body: String,
    },
    /// Answers with the inner reply after a delay.
    Delayed(Duration, Box<Reply>),
}

/// A chunk that makes the mock's SSE stream fail (the connection is cut
/// mid-response, as when an upstream crashes).
pub const BREAK: &str = "\u{0}BREAK";

/// A request the mock upstream received.
#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Received {
    pub fn messages(&self) -> &Vec<Value> {
        self.body["messages"].as_array().expect("messages array")
    }

    /// `role: content` of every message, for compact assertions.
    pub fn transcript(&self) -> Vec<String> {
        self.messages()
            .iter()
            .map(|m| {
                format!(
                    "{}: {}",
                    m["role"].as_str().unwrap_or("?"),
                    text(&m["content"])
                )
            })
            .collect()
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "<null>".into(),
        other => other.to_string(),
    }
}

/// The model name the summary tests route to this mock as their summary
/// model: its requests are answered by `SummaryMode`, not the script.
pub const SUMMARIZER: &str = "summarizer";

/// How the mock answers requests for `SUMMARIZER`.
#[derive(Clone, Debug, Default)]
pub enum SummaryMode {
    /// `Known: a | b`: what the summary so far knew, then every `user:`
    /// line of the fold (a carry-over request: the note and the summary's
    /// items), in order and without repeats.
    #[default]
    Fold,
    /// The fold's answer, after a delay.
    Slow(Duration),
    /// This status, with an error body.
    Fail(u16),
    /// This text, whatever was asked.
    Text(String),
    /// This text, stopped at `max_tokens` (`finish_reason: "length"`).
    CutOff(String),
}

/// The mock summary model's answer to a fold or carry-over request.
pub fn fold_answer(request: &Value) -> String {
    let asked = request["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default();
    let mut known: Vec<String> = Vec::new();
    let mut add = |item: &str| {
        let item = item.trim();
        if !item.is_empty() && !known.iter().any(|k| k == item) {
            known.push(item.to_owned());
        }
    };
    for line in asked.lines() {
        if let Some(items) = line.strip_prefix("Known: ") {
            items.split(" | ").for_each(&mut add);
        } else if let Some(said) = line.strip_prefix("user: ") {
            add(said);
        }
    }
    format!("Known: {}", known.join(" | "))
}

/// The model names the long-term tests route to this mock as their
/// extract and embedding models: answered by `LongTermMode`s, not the
/// script, with recall's own mock answers (`recall::proxy::mock::embed`).
pub const EXTRACTOR: &str = "extractor";
pub const EMBEDDER: &str = "embedder";

/// How requests for `EXTRACTOR` or `EMBEDDER` are answered.
#[derive(Clone, Debug, Default)]
pub enum LongTermMode {
    /// The user's statements as facts; the mock's embeddings.
    #[default]
    Echo,
    /// The same, after a delay.
    Slow(Duration),
    /// This status, with an error body.
    Fail(u16),
    /// This text as the extraction answer (embeddings as `Echo`).
    Text(String),
    /// This text as the extraction answer, stopped at `max_tokens`
    /// (`finish_reason: "length"`).
    CutOff(String),
}

/// What llama-cpp-python's server (0.3.36) answers a chat request whose
/// `response_format` has a type it does not take (`json_schema`), as
/// captured from it: a 500 wrapping a validation error.
pub fn llama_cpp_python_refusal(kind: &str) -> (u16, Value) {
    let message = format!(
        "1 validation error:\n  {{'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), \
         'msg': \"Input should be 'text' or 'json_object'\", 'input': '{kind}', \
         'ctx': {{'expected': \"'text' or 'json_object'\"}}}}\n\n  \
         File \"/root/.cache/recall-ci/llama-venv/lib/python3.11/site-packages/llama_cpp/server/app.py\", \
         line 376, in create_chat_completion\n    POST /v1/chat/completions"
    );
    (
        500,
        json!({"error": {"message": message, "type": "internal_server_error",
                         "param": null, "code": null}}),
    )
}

/// What OpenAI answers a model that takes no structured output: a 400
/// naming the field.
pub fn openai_refusal(kind: &str) -> (u16, Value) {
    let message = format!(
        "Invalid parameter: 'response_format' of type '{kind}' is not supported with this model."
    );
    (
        400,
        json!({"error": {"message": message, "type": "invalid_request_error",
                         "param": "response_format", "code": null}}),
    )
}

/// How the extract model answers a `response_format` it refuses: given
/// the type refused, the status and body.
pub type Refusal = fn(&str) -> (u16, Value);

#[derive(Default)]
struct MockState {
    summary_mode: Mutex<SummaryMode>,
    extract_mode: Mutex<LongTermMode>,
    /// The `response_format` types the extract model refuses, and how.
    refused_formats: Mutex<(Vec<&'static str>, Option<Refusal>)>,
    embed_mode: Mutex<LongTermMode>,
    script: Mutex<VecDeque<Reply>>,
    received: Mutex<Vec<Received>>,
    /// Streams whose body was dropped before its last chunk was written.
    streams_cut: AtomicUsize,
    calls: AtomicUsize,
    /// Set: requests are answered one at a time, as by a server with one
    /// slot (llama.cpp's default); a stream holds it until its body ends
    /// or its client closes the connection.
    one_slot: Mutex<Option<Arc<tokio::sync::Semaphore>>>,
    /// Requests being answered now (a stream until its body is dropped),
    /// and the most seen at once.
    open: AtomicUsize,
    peak: AtomicUsize,
}

#[derive(Clone)]
pub struct MockUpstream {
    pub addr: SocketAddr,
    state: Arc<MockState>,
}

impl MockUpstream {
    pub async fn start() -> Self {
        let state = Arc::new(MockState::default());
        let router = axum::Router::new()
            .fallback(mock_handler)
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        Self { addr, state }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Queues the answers to the next requests, in order. When the queue is
    /// empty the mock answers with a completion "reply N" (N counts calls).
    pub fn push(&self, reply: Reply) {
        self.state.script.lock().unwrap().push_back(reply);
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    pub fn last(&self) -> Received {
        self.received()
            .pop()
            .expect("the upstream received no request")
    }

    pub fn streams_cut(&self) -> usize {
        self.state.streams_cut.load(Ordering::SeqCst)
    }

    /// From now on, answers one request at a time.
    pub fn serve_one_at_a_time(&self) {
        *self.state.one_slot.lock().unwrap() = Some(Arc::new(tokio::sync::Semaphore::new(1)));
    }

    /// The most requests this upstream was answering at once.
    pub fn peak_open(&self) -> usize {
        self.state.peak.load(Ordering::SeqCst)
    }

    /// How requests for `SUMMARIZER` are answered from now on.
    pub fn summaries(&self, mode: SummaryMode) {
        *self.state.summary_mode.lock().unwrap() = mode;
    }

    /// How requests for `EXTRACTOR` are answered from now on.
    pub fn extractions(&self, mode: LongTermMode) {
        *self.state.extract_mode.lock().unwrap() = mode;
    }

    /// From now on, an extraction request whose `response_format` is of
    /// one of `kinds` is answered with `refusal`.
    pub fn refuse_formats(&self, kinds: &[&'static str], refusal: Refusal) {
        *self.state.refused_formats.lock().unwrap() = (kinds.to_vec(), Some(refusal));
    }

    /// How `/embeddings` requests are answered from now on.
    pub fn embeddings(&self, mode: LongTermMode) {
        *self.state.embed_mode.lock().unwrap() = mode;
    }

    /// The chat requests of clients' turns: not the summary or extract
    /// model's, nor embeddings.
    pub fn turns(&self) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| {
                r.path.ends_with("/chat/completions")
                    && r.body["model"] != SUMMARIZER
                    && r.body["model"] != EXTRACTOR
            })
            .collect()
    }

    /// The requests for `EXTRACTOR`.
    pub fn extraction_requests(&self) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| r.body["model"] == EXTRACTOR)
            .collect()
    }

    /// The requests for `SUMMARIZER`, and the others.
    pub fn split(&self) -> (Vec<Received>, Vec<Received>) {
        self.received()
            .into_iter()
            .partition(|r| r.body["model"] == SUMMARIZER)
    }
}

/// A request being answered: counted open until dropped (with the
/// response body, for a stream), holding the one slot if there is one.
struct Open {
    state: Arc<MockState>,
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Open {
    async fn begin(state: &Arc<MockState>) -> Self {
        let one_slot = state.one_slot.lock().unwrap().clone();
        let slot = match one_slot {
            Some(s) => Some(s.acquire_owned().await.unwrap()),
            None => None,
        };
        let now = state.open.fetch_add(1, Ordering::SeqCst) + 1;
        state.peak.fetch_max(now, Ordering::SeqCst);
        Self {
            state: Arc::clone(state),
            _slot: slot,
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.state.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The answer to an extraction or embeddings request, per its mode.
async fn long_term_answer(state: &MockState, path: &str, body: &Value) -> Option<Response> {
    let embeddings = path.ends_with("/embeddings");
    let mode = if embeddings {
        state.embed_mode.lock().unwrap().clone()
    } else if body["model"] == EXTRACTOR {
        state.extract_mode.lock().unwrap().clone()
    } else {
        return None;
    };
    if !embeddings {
        let (refused, refusal) = state.refused_formats.lock().unwrap().clone();
        let kind = body["response_format"]["type"].as_str().unwrap_or_default();
        if let (Some(refusal), true) = (refusal, refused.contains(&kind)) {
            let (status, body) = refusal(kind);
            return Some(json_response(status, body, &[]));
        }
    }
    match &mode {
        LongTermMode::Slow(d) => tokio::time::sleep(*d).await,
        LongTermMode::Fail(status) => {
            let error =
                json!({"error": {"message": "long-term model down", "type": "server_error"}});
            return Some(json_response(*status, error, &[]));
        }
        _ => {}
    }
    if embeddings {
        let inputs: Vec<String> = match &body["input"] {
            Value::String(s) => vec![s.clone()],
            Value::Array(a) => a
                .iter()
                .map(|v| v.as_str().unwrap_or_default().to_owned())
                .collect(),
            _ => Vec::new(),
        };
        let data: Vec<Value> = inputs
            .iter()
            .enumerate()
            .map(|(i, t)| {
                use recall::proxy::mock::embed;
                let v = embed::encoded(&embed::embedding(t), &body["encoding_format"]);
                json!({"object": "embedding", "index": i, "embedding": v})
            })
            .collect();
        let body = json!({"object": "list", "data": data, "model": EMBEDDER,
                          "usage": {"prompt_tokens": 1, "total_tokens": 1}});
        return Some(json_response(200, body, &[]));
    }
    let asked = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default();
    let (answer, finish) = match mode {
        LongTermMode::Text(t) => (t, "stop"),
        LongTermMode::CutOff(t) => (t, "length"),
        _ => (recall::proxy::mock::embed::facts(asked), "stop"),
    };
    let Reply::Json {
        status,
        body,
        headers,
    } = completion_ending(&answer, finish)
    else {
        unreachable!()
    };
    Some(json_response(status, body, &headers))
}

async fn mock_handler(
    State(state): State<Arc<MockState>>,
    uri: Uri,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let open = Open::begin(&state).await;
    let n = state.calls.fetch_add(1, Ordering::SeqCst) + 1;
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let summary_request = (body["model"] == SUMMARIZER).then(|| body.clone());
    let body_copy = body.clone();
    state.received.lock().unwrap().push(Received {
        path: uri.path().to_owned(),
        headers,
        body,
    });
    if let Some(response) = long_term_answer(&state, uri.path(), &body_copy).await {
        return response;
    }
    if let Some(request) = summary_request {
        let mode = state.summary_mode.lock().unwrap().clone();
        let mut finish = "stop";
        let answer = match mode {
            SummaryMode::Fold => fold_answer(&request),
            SummaryMode::Slow(d) => {
                tokio::time::sleep(d).await;
                fold_answer(&request)
            }
            SummaryMode::CutOff(t) => {
                finish = "length";
                t
            }
            SummaryMode::Fail(status) => {
                return json_response(
                    status,
                    json!({"error": {"message": "summary model down", "type": "server_error"}}),
                    &[],
                )
            }
            SummaryMode::Text(t) => t,
        };
        let Reply::Json {
            status,
            body,
            headers,
        } = completion_ending(&answer, finish)
        else {
            unreachable!()
        };
        return json_response(status, body, &headers);
    }
    if uri.path().ends_with("/models") {
        return json_response(
            200,
            json!({"object": "list", "data": [{"id": "mock-model"}]}),
            &[],
        );
    }
    let mut reply = state.script.lock().unwrap().pop_front();
    while let Some(Reply::Delayed(delay, inner)) = reply {
        tokio::time::sleep(delay).await;
        reply = Some(*inner);
    }
    match reply.unwrap_or_else(|| completion(&format!("reply {n}"))) {
        Reply::Delayed(..) => unreachable!(),
        Reply::Json {
            status,
            body,
            headers,
        } => json_response(status, body, &headers),
        Reply::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            json_response(500, Value::Null, &[])
        }
        Reply::Sse { chunks } => sse_response(chunks, state, open),
        Reply::JsonInPieces { chunks } => {
            let mut r = sse_response(chunks, state, open);
            r.headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            r
        }
        Reply::Raw {
            status,
            content_type,
            body,
        } => Response::builder()
            .status(StatusCode::from_u16(status).unwrap())
            .header("content-type", content_type)
            .body(Body::from(body))
            .unwrap(),
    }
}

fn json_response(status: u16, body: Value, headers: &[(&str, &str)]) -> Response {
    let mut b = Response::builder()
        .status(StatusCode::from_u16(status).unwrap())
        .header("content-type", "application/json")
        .header("x-request-id", "req-upstream-1")
        .header("openai-processing-ms", "7")
        .header("x-ratelimit-remaining-requests", "99");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Body::from(body.to_string())).unwrap()
}

/// Counts a stream as cut when its body is dropped before the last chunk.
struct CutGuard {
    state: Arc<MockState>,
    finished: bool,
    _open: Open,
}

impl Drop for CutGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.state.streams_cut.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn sse_response(chunks: Vec<(Duration, String)>, state: Arc<MockState>, open: Open) -> Response {
    let guard = CutGuard {
        state,
        finished: false,
        _open: open,
    };
    let stream = futures_util::stream::unfold(
        (VecDeque::from(chunks), guard),
        |(mut chunks, mut guard)| async move {
            let (delay, chunk) = chunks.pop_front()?;
            tokio::time::sleep(delay).await;
            if chunk == BREAK {
                guard.finished = true;
                let err = std::io::Error::other("upstream crashed");
                return Some((Err(err), (VecDeque::new(), guard)));
            }
            if chunks.is_empty() {
                guard.finished = true;
            }
            Some((Ok::<_, std::io::Error>(chunk), (chunks, guard)))
        },
    );
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("x-request-id", "req-upstream-sse")
        .body(Body::from_stream(stream))
        .unwrap()
}

/// A non-streaming completion whose reply is `content`.
pub fn completion(content: &str) -> Reply {
    completion_ending(content, "stop")
}

/// A non-streaming completion whose reply is `content`, ending for
/// `finish_reason`.
pub fn completion_ending(content: &str, finish_reason: &str) -> Reply {
    Reply::Json {
        status: 200,
        body: json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "mock-model",
            "choices": [{"index": 0, "finish_reason": finish_reason,
                         "message": {"role": "assistant", "content": content, "refusal": null}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        }),
        headers: vec![],
    }
}

pub fn error_reply(status: u16, message: &str) -> Reply {
    Reply::Json {
        status,
        body: json!({"error": {"message": message, "type": "server_error", "param": null, "code": null}}),
        headers: vec![],
    }
}

/// One `data:` event of a chat.completion.chunk with a choice-0 delta.
pub fn delta_event(delta: Value) -> String {
    let chunk = json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1,
                       "model": "mock-model",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": null}]});
    format!("data: {chunk}\n\n")
}

/// A streamed text reply, one delta per piece, each after `delay`, then a
/// finish chunk, a usage chunk with `choices: []`, and `[DONE]`.
pub fn sse_text(pieces: &[&str], delay: Duration) -> Reply {
    let mut chunks = vec![(
        Duration::ZERO,
        delta_event(json!({"role": "assistant", "content": ""})),
    )];
    for p in pieces {
        chunks.push((delay, delta_event(json!({"content": p}))));
    }
    chunks.push((Duration::ZERO, sse_tail()));
    Reply::Sse { chunks }
}

/// A reply that takes `n * gap` to stream whole.
pub fn long_reply(n: usize, gap: Duration) -> Reply {
    let mut pieces = vec!["Once upon a time"];
    pieces.extend(std::iter::repeat_n(" and then", n));
    sse_text(&pieces, gap)
}

/// The drain ended: it read the whole reply, or it gave up and said why.
pub fn drain_over(m: &serde_json::Value) -> bool {
    m["metadata"]["original_complete"] == true || m["metadata"]["error"].is_string()
}

pub fn sse_tail() -> String {
    let finish = json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1,
                        "model": "mock-model",
                        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
    let usage = json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1,
                       "model": "mock-model", "choices": [],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}});
    format!("data: {finish}\n\ndata: {usage}\n\ndata: [DONE]\n\n")
}

/// The `[storage]` section for the backend under test, chosen by
/// `RECALL_TEST_BACKEND` (`memory` when unset; `sqlite`; `redis` with
/// `RECALL_TEST_REDIS_URL`). Every harness gets storage of its own.
pub fn storage_section() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::SeqCst);
    let tag = format!("{}-{n}", std::process::id());
    match std::env::var("RECALL_TEST_BACKEND").as_deref() {
        Ok("sqlite") => {
            let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("recall-tests");
            format!(
                "[storage]\nbackend = \"sqlite\"\npath = \"{}\"\n",
                dir.join(format!("{tag}.db")).display()
            )
        }
        Ok("redis") => {
            let url = std::env::var("RECALL_TEST_REDIS_URL")
                .expect("RECALL_TEST_BACKEND=redis needs RECALL_TEST_REDIS_URL");
            format!("[storage]\nbackend = \"redis\"\nurl = \"{url}\"\nkey_prefix = \"t{tag}\"\n")
        }
        _ => String::new(),
    }
}

/// Sends `text` in `session` as `user` (the `x-user-id` header), with
/// client key `key` if given; the turn must succeed.
pub async fn say_as(
    h: &Harness,
    key: Option<&str>,
    user: &str,
    session: &str,
    text: &str,
) -> Value {
    let mut req = h
        .client
        .post(format!("{}/v1/chat/completions", h.url))
        .header("x-session-id", session)
        .header("x-user-id", user)
        .json(&json!({"model": "gpt-test", "messages": [{"role": "user", "content": text}]}));
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

/// Sends `text` in `session` as `user`, with the message's `timestamp`
/// (Unix ms) when given; the turn must succeed.
pub async fn say_at(h: &Harness, user: &str, session: &str, text: &str, timestamp: Option<i64>) {
    let mut m = json!({"role": "user", "content": text});
    if let Some(t) = timestamp {
        m["timestamp"] = json!(t);
    }
    let resp = h
        .client
        .post(format!("{}/v1/chat/completions", h.url))
        .header("x-session-id", session)
        .header("x-user-id", user)
        .json(&json!({"model": "gpt-test", "messages": [m]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

/// A recall server in front of a mock upstream.
pub struct Harness {
    pub url: String,
    pub upstream: MockUpstream,
    pub app: Arc<recall::App>,
    pub client: reqwest::Client,
}

impl Harness {
    /// Starts recall with the given TOML (without `[[upstreams]]`) and one
    /// upstream pointing at a fresh mock, with `upstream_extra` lines added.
    pub async fn start(config: &str, upstream_extra: &str) -> Self {
        let upstream = MockUpstream::start().await;
        let toml = format!(
            "{config}\n[[upstreams]]\nname = \"mock\"\nbase_url = \"{}\"\n{upstream_extra}\n",
            upstream.base_url()
        );
        Self::with_config(&toml, upstream).await
    }

    pub async fn with_config(toml: &str, upstream: MockUpstream) -> Self {
        let toml = if toml.contains("[storage]") {
            toml.to_owned()
        } else {
            format!("{toml}\n{}", storage_section())
        };
        let config = recall::Config::parse(&toml, std::path::Path::new("test.toml"))
            .unwrap_or_else(|e| panic!("{e}"));
        let app = recall::App::new(config).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let served = Arc::clone(&app);
        tokio::spawn(async move { recall::serve(listener, served, std::future::pending()).await });
        Self {
            url,
            upstream,
            app,
            client: reqwest::Client::new(),
        }
    }

    pub async fn default() -> Self {
        Self::start("", "").await
    }

    /// What `GET /metrics` renders.
    pub async fn metrics(&self) -> String {
        let resp = self.client.get(format!("{}/metrics", self.url)).send();
        resp.await.unwrap().text().await.unwrap()
    }

    /// POSTs a chat completion for `session` (header form) and returns the
    /// status and the parsed body.
    pub async fn chat(&self, session: Option<&str>, body: Value) -> (u16, Value) {
        let mut req = self
            .client
            .post(format!("{}/v1/chat/completions", self.url))
            .json(&body);
        if let Some(s) = session {
            req = req.header("x-session-id", s);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// POSTs to `/v1/responses` and returns the status and the parsed body.
    pub async fn respond(&self, body: Value) -> (u16, Value) {
        let resp = self
            .client
            .post(format!("{}/v1/responses", self.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// `respond`, which must answer 200: the Response.
    pub async fn respond_ok(&self, body: Value) -> Value {
        let (status, r) = self.respond(body).await;
        assert_eq!(status, 200, "{r}");
        r
    }

    /// POSTs a chat completion for `session` (header form) and returns the
    /// response as it is, for tests that read it chunk by chunk.
    pub async fn post_chat(&self, session: &str, body: Value) -> reqwest::Response {
        self.client
            .post(format!("{}/v1/chat/completions", self.url))
            .header("x-session-id", session)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// Sends one user message in `session` and returns the reply text.
    pub async fn say(&self, session: &str, text: &str) -> String {
        let (status, body) = self
            .chat(
                Some(session),
                json!({"model": "gpt-test", "messages": [{"role": "user", "content": text}]}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    pub async fn history(&self, session: &str) -> (u16, Value) {
        let resp = self
            .client
            .get(format!("{}/v1/sessions/{session}/history", self.url))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap())
    }

    /// `role: content` of every stored message.
    pub async fn transcript(&self, session: &str) -> Vec<String> {
        let (status, h) = self.history(session).await;
        assert_eq!(status, 200, "{h}");
        h["contents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| format!("{}: {}", m["role"].as_str().unwrap(), text(&m["content"])))
            .collect()
    }
}

pub fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

pub fn assistant(text: &str) -> Value {
    json!({"role": "assistant", "content": text})
}

pub fn system(text: &str) -> Value {
    json!({"role": "system", "content": text})
}

/// A webhook receiver that records what it is sent; it answers 500 to the
/// first `fail_first` deliveries.
#[derive(Clone)]
pub struct WebhookReceiver {
    pub url: String,
    state: Arc<ReceiverState>,
}

#[derive(Default)]
struct ReceiverState {
    fail_first: AtomicUsize,
    attempts: AtomicUsize,
    /// How long each answer takes.
    delay: Mutex<Duration>,
    received: Mutex<Vec<(HeaderMap, Vec<u8>)>>,
    /// Every attempt's headers, refused ones included.
    tried: Mutex<Vec<HeaderMap>>,
}

impl WebhookReceiver {
    pub async fn start(fail_first: usize) -> Self {
        Self::start_slow(fail_first, Duration::ZERO).await
    }

    /// The same, taking `delay` to answer each attempt.
    pub async fn start_slow(fail_first: usize, delay: Duration) -> Self {
        let state = Arc::new(ReceiverState::default());
        state.fail_first.store(fail_first, Ordering::SeqCst);
        *state.delay.lock().unwrap() = delay;
        let router = axum::Router::new()
            .fallback(
                |State(state): State<Arc<ReceiverState>>,
                 headers: HeaderMap,
                 body: axum::body::Bytes| async move {
                    state.attempts.fetch_add(1, Ordering::SeqCst);
                    state.tried.lock().unwrap().push(headers.clone());
                    let delay = *state.delay.lock().unwrap();
                    tokio::time::sleep(delay).await;
                    let failing = state
                        .fail_first
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                    if failing {
                        return StatusCode::INTERNAL_SERVER_ERROR;
                    }
                    state
                        .received
                        .lock()
                        .unwrap()
                        .push((headers, body.to_vec()));
                    StatusCode::OK
                },
            )
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await });
        Self { url, state }
    }

    pub fn attempts(&self) -> usize {
        self.state.attempts.load(Ordering::SeqCst)
    }

    /// Every attempt's headers, in order, refused ones included.
    pub fn tried(&self) -> Vec<HeaderMap> {
        self.state.tried.lock().unwrap().clone()
    }

    /// Accepted deliveries: headers and body.
    pub fn deliveries(&self) -> Vec<(HeaderMap, Vec<u8>)> {
        self.state.received.lock().unwrap().clone()
    }

    /// Delivered events, parsed, with their `webhook-signature` header.
    pub fn events(&self) -> Vec<(Option<String>, Vec<u8>, Value)> {
        self.state
            .received
            .lock()
            .unwrap()
            .iter()
            .map(|(h, body)| {
                let sig = h
                    .get("webhook-signature")
                    .map(|v| v.to_str().unwrap().to_owned());
                (sig, body.clone(), serde_json::from_slice(body).unwrap())
            })
            .collect()
    }

    /// Waits until an event satisfying `pred` has been delivered.
    pub async fn wait_for(
        &self,
        within: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> (Option<String>, Vec<u8>, Value) {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(e) = self.events().into_iter().find(|(_, _, v)| pred(v)) {
                return e;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no matching webhook event; got {:?}",
                self.events()
                    .iter()
                    .map(|e| e.2.clone())
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Harness {
    /// A request to the session API, with an optional bearer token.
    pub async fn api(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self.client.request(method, format!("{}{path}", self.url));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }
}

/// A streamed response body as the tests read it.
pub type ByteStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>;

/// Starts a streaming request and reads until `until` has arrived; returns
/// the rest of the stream and what was read.
pub async fn stream_until(
    h: &Harness,
    session: &str,
    text: &str,
    until: &str,
) -> (ByteStream, String) {
    let resp = h
        .post_chat(
            session,
            json!({"model": "m", "stream": true, "messages": [user(text)]}),
        )
        .await;
    read_until(resp, until).await
}

/// Reads a streamed response (which must be a 200) until `until` has
/// arrived; returns the rest of the stream and what was read.
pub async fn read_until(resp: reqwest::Response, until: &str) -> (ByteStream, String) {
    assert_eq!(resp.status(), 200);
    let mut stream: ByteStream = Box::pin(resp.bytes_stream());
    let mut seen = String::new();
    while !seen.contains(until) {
        let chunk = futures_util::StreamExt::next(&mut stream)
            .await
            .expect("stream ended early")
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    (stream, seen)
}

pub async fn read_rest(mut stream: ByteStream) -> String {
    let mut out = String::new();
    while let Some(Ok(chunk)) = futures_util::StreamExt::next(&mut stream).await {
        out.push_str(&String::from_utf8_lossy(&chunk));
    }
    out
}

/// Polls the history until `pred` holds for the message at `index`.
pub async fn wait_for(
    h: &Harness,
    session: &str,
    index: usize,
    within: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = std::time::Instant::now() + within;
    loop {
        let (status, hist) = h.history(session).await;
        if status == 200 {
            if let Some(m) = hist["contents"].get(index) {
                if pred(m) {
                    return m.clone();
                }
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting on {session}[{index}]: {hist}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
