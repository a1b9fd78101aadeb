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
//! usage: naive_hop --upstream URL [--listen ADDR] [--threads N]
//!
//!   --upstream URL  base URL up to and including `/v1` (NAIVE_HOP_UPSTREAM)
//!   --listen ADDR   default 127.0.0.1:8081 (NAIVE_HOP_LISTEN)
//!   --threads N     tokio worker threads; 0 = one per CPU, the default
//!                   (NAIVE_HOP_THREADS)

use std::process::ExitCode;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{json, Value};

// As recall's binary does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SYSTEM: &str = "You are a helpful assistant.";

struct Hop {
    client: reqwest::Client,
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
    let mut upstream = hop
        .client
        .post(&hop.url)
        .header(CONTENT_TYPE, "application/json")
        .body(body);
    if let Some(auth) = headers.get(AUTHORIZATION) {
        upstream = upstream.header(AUTHORIZATION, auth);
    }
    let answer = match upstream.send().await {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    };
    let mut reply = Response::builder().status(answer.status());
    if let Some(kind) = answer.headers().get(CONTENT_TYPE) {
        reply = reply.header(CONTENT_TYPE, kind);
    }
    let body = if stream {
        Body::from_stream(answer.bytes_stream())
    } else {
        match answer.bytes().await {
            Ok(b) => Body::from(b),
            Err(e) => return (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
        }
    };
    reply
        .body(body)
        .unwrap_or_else(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response())
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
    let client = match reqwest::Client::builder().build() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("naive_hop: {e}");
            return ExitCode::from(1);
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
