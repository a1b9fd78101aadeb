//! The naive hop: the load benchmark's reference proxy (benches/load.rs,
//! BENCHMARKS.md). Built on what recall is built on (axum, reqwest with
//! rustls, tokio, serde_json, mimalloc), it does the least a proxy that
//! touches the request can do: for `POST /v1/chat/completions` it reads the
//! body, parses it as JSON, inserts one system message at the front of
//! `messages`, serialises it again and sends it upstream on a keep-alive
//! client. The answer's status and content type are passed through; a
//! streamed answer (`"stream": true`) is relayed chunk by chunk as it
//! arrives, any other is read whole and sent on (as recall does). Nothing
//! else: no sessions, no storage, no routing, no logging.
//!
//! It is an example of the package, not a binary, so that it never ships;
//! the benchmark builds it (`cargo build --profile bench --example
//! naive_hop`) and runs it as a process of its own.
//!
//! usage: naive_hop --upstream URL [--listen ADDR] [--threads N] [--client C]
//!
//!   --upstream URL  base URL up to and including `/v1` (NAIVE_HOP_UPSTREAM)
//!   --listen ADDR   default 127.0.0.1:8081 (NAIVE_HOP_LISTEN)
//!   --threads N     tokio worker threads; 0 = one per CPU, the default
//!                   (NAIVE_HOP_THREADS)
//!   --client C      `reqwest` (the default, as recall) or `hyper-util`:
//!                   hyper-util's pooled client, which reqwest is built on,
//!                   without reqwest's layers (plain HTTP only; an
//!                   experiment, docs/perf-journal.md item 26)

use std::process::ExitCode;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{json, Value};

// As recall's binary does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SYSTEM: &str = "You are a helpful assistant.";

/// hyper-util's pooled client, on plain HTTP.
type Pooled = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    http_body_util::Full<Bytes>,
>;

enum Client {
    Reqwest(reqwest::Client),
    HyperUtil(Box<Pooled>),
}

struct Hop {
    client: Client,
    /// The upstream's `.../chat/completions`.
    url: String,
}

async fn chat(State(hop): State<Arc<Hop>>, headers: HeaderMap, body: Bytes) -> Response {
    let mut request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let Some(messages) = request.get_mut("messages").and_then(Value::as_array_mut) else {
        return (StatusCode::BAD_REQUEST, "no messages").into_response();
    };
    messages.insert(0, json!({"role": "system", "content": SYSTEM}));
    let stream = request.get("stream").and_then(Value::as_bool) == Some(true);
    let body = match serde_json::to_vec(&request) {
        Ok(b) => b,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let auth = headers.get(AUTHORIZATION);
    let answer = match &hop.client {
        Client::Reqwest(client) => reqwest_call(client, &hop.url, auth, body, stream).await,
        Client::HyperUtil(client) => hyper_util_call(client, &hop.url, auth, body, stream).await,
    };
    let (status, kind, body) = match answer {
        Ok(a) => a,
        Err(e) => return (StatusCode::BAD_GATEWAY, e).into_response(),
    };
    let mut reply = Response::builder().status(status);
    if let Some(kind) = kind {
        reply = reply.header(CONTENT_TYPE, kind);
    }
    reply
        .body(body)
        .unwrap_or_else(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response())
}

/// The answer's status, content type and body (streamed as it arrives, or
/// read whole).
type Answer = Result<(StatusCode, Option<HeaderValue>, Body), String>;

async fn reqwest_call(
    client: &reqwest::Client,
    url: &str,
    auth: Option<&HeaderValue>,
    body: Vec<u8>,
    stream: bool,
) -> Answer {
    let mut upstream = client
        .post(url)
        .header(CONTENT_TYPE, "application/json")
        .body(body);
    if let Some(auth) = auth {
        upstream = upstream.header(AUTHORIZATION, auth);
    }
    let answer = upstream.send().await.map_err(|e| e.to_string())?;
    let (status, kind) = (answer.status(), answer.headers().get(CONTENT_TYPE).cloned());
    let body = if stream {
        Body::from_stream(answer.bytes_stream())
    } else {
        Body::from(answer.bytes().await.map_err(|e| e.to_string())?)
    };
    Ok((status, kind, body))
}

async fn hyper_util_call(
    client: &Pooled,
    url: &str,
    auth: Option<&HeaderValue>,
    body: Vec<u8>,
    stream: bool,
) -> Answer {
    let mut upstream = axum::http::Request::post(url).header(CONTENT_TYPE, "application/json");
    if let Some(auth) = auth {
        upstream = upstream.header(AUTHORIZATION, auth);
    }
    let upstream = upstream
        .body(http_body_util::Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let answer = client.request(upstream).await.map_err(|e| e.to_string())?;
    let (status, kind) = (answer.status(), answer.headers().get(CONTENT_TYPE).cloned());
    let body = if stream {
        Body::new(answer.into_body())
    } else {
        let whole = http_body_util::BodyExt::collect(answer.into_body())
            .await
            .map_err(|e| e.to_string())?;
        Body::from(whole.to_bytes())
    };
    Ok((status, kind, body))
}

/// `--name VALUE`, else the environment variable `var`.
fn setting(args: &[String], name: &str, var: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| std::env::var(var).ok())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let Some(upstream) = setting(&args, "--upstream", "NAIVE_HOP_UPSTREAM") else {
        eprintln!("naive_hop: --upstream URL (or NAIVE_HOP_UPSTREAM) is required");
        return ExitCode::from(2);
    };
    let listen =
        setting(&args, "--listen", "NAIVE_HOP_LISTEN").unwrap_or_else(|| "127.0.0.1:8081".into());
    let threads = match setting(&args, "--threads", "NAIVE_HOP_THREADS").map(|t| t.parse()) {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            eprintln!("naive_hop: --threads takes a number");
            return ExitCode::from(2);
        }
    };
    // 0 resolved as recall resolves `[server] worker_threads = 0`.
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let client = match setting(&args, "--client", "NAIVE_HOP_CLIENT").as_deref() {
        None | Some("reqwest") => match reqwest::Client::builder().build() {
            Ok(c) => Client::Reqwest(c),
            Err(e) => {
                eprintln!("naive_hop: {e}");
                return ExitCode::from(1);
            }
        },
        Some("hyper-util") => Client::HyperUtil(Box::new(
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http(),
        )),
        Some(other) => {
            eprintln!("naive_hop: --client is reqwest or hyper-util, not {other}");
            return ExitCode::from(2);
        }
    };
    let hop = Arc::new(Hop {
        client,
        url: format!("{}/chat/completions", upstream.trim_end_matches('/')),
    });
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("naive_hop: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let served = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&listen).await?;
        // Nagle's algorithm would hold small SSE chunks back (recall and
        // nginx set TCP_NODELAY too).
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(chat))
            .with_state(hop);
        axum::serve(listener, app).await
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("naive_hop: {e}");
            ExitCode::from(1)
        }
    }
}
