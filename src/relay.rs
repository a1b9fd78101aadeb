//! Calling the upstream and relaying its answer, then recording the reply.
//!
//! The call runs in a task of its own, not in the request handler: when the
//! client goes away the handler's future is dropped, but the task keeps
//! reading the upstream so that the reply is still recorded (and the turn
//! lock is released only once it is).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot};

use crate::accumulate::{self, ReplyAccumulator};
use crate::app::App;
use crate::error::{ApiError, UpstreamError};
use crate::session::Turn;
use crate::upstream::{relayed_response_headers, Upstream};

/// Chunks buffered between the upstream reader and a slow client.
const RELAY_BUFFER: usize = 64;

pub struct Exchange {
    pub app: Arc<App>,
    pub upstream: Arc<Upstream>,
    pub client_headers: HeaderMap,
    pub body: Bytes,
    /// The open turn of the session, or `None` for a stateless request.
    pub turn: Option<Turn>,
}

type Head = Result<Response, ApiError>;

/// Starts the exchange and waits for the response to give the client.
pub async fn start(exchange: Exchange) -> Head {
    let (tx, rx) = oneshot::channel();
    tokio::spawn(run(exchange, tx));
    rx.await.unwrap_or_else(|_| {
        tracing::error!("relay task ended without an answer");
        Err(ApiError::Internal)
    })
}

async fn run(ex: Exchange, respond: oneshot::Sender<Head>) {
    let sent = ex
        .upstream
        .send(
            Method::POST,
            "/chat/completions",
            &ex.client_headers,
            Some(ex.body.clone()),
        )
        .await;
    let resp = match sent {
        Ok(resp) => resp,
        Err(e) => {
            tracing::warn!(upstream = %ex.upstream.name, error = %e, "upstream call failed");
            // The user's message is already in the history; it stays.
            let _ = respond.send(Err(e.into()));
            return;
        }
    };
    let status = resp.status();
    let headers = relayed_response_headers(resp.headers());
    let is_sse = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if status.is_success() && is_sse {
        stream(ex, resp, status, headers, respond).await;
    } else {
        whole(ex, resp, status, headers, respond).await;
    }
}

/// A non-streaming answer, or any error answer: read it whole, relay it.
async fn whole(
    ex: Exchange,
    resp: reqwest::Response,
    status: StatusCode,
    headers: HeaderMap,
    respond: oneshot::Sender<Head>,
) {
    let bytes = match resp.bytes().await {
        Ok(b) => b,
        Err(e) => {
            let err = if e.is_timeout() {
                ex.upstream.timeout_error()
            } else {
                UpstreamError::Unreachable {
                    upstream: ex.upstream.name.clone(),
                    reason: format!("response body broke off: {e}"),
                }
            };
            let _ = respond.send(Err(err.into()));
            return;
        }
    };
    if !status.is_success() {
        tracing::info!(upstream = %ex.upstream.name, %status, "upstream answered with an error");
    }
    if let Some(turn) = ex.turn {
        let reply = status
            .is_success()
            .then(|| serde_json::from_slice(&bytes).ok())
            .flatten()
            .and_then(|body| accumulate::message_from_completion(&body));
        if let Some(reply) = reply {
            turn.record_reply(reply, &ex.app.config.history, &ex.app.counters, now_ms());
        }
    }
    let _ = respond.send(Ok(response(status, headers, Body::from(bytes))));
}

/// A streamed answer: every chunk goes to the client as it arrives, and
/// through the SSE parser into the accumulator for the record.
async fn stream(
    ex: Exchange,
    resp: reqwest::Response,
    status: StatusCode,
    headers: HeaderMap,
    respond: oneshot::Sender<Head>,
) {
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(RELAY_BUFFER);
    let body = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async {
        rx.recv().await.map(|item| (item, rx))
    }));
    let mut client_open = respond.send(Ok(response(status, headers, body))).is_ok();

    let mut parser = sse_parse::SseParser::new();
    let mut acc = ReplyAccumulator::default();
    let mut upstream = resp.bytes_stream();
    while let Some(chunk) = upstream.next().await {
        match chunk {
            Ok(bytes) => {
                parser.feed(&bytes);
                while let Some(event) = parser.next_event() {
                    acc.push_data(&event.data);
                }
                if client_open && tx.send(Ok(bytes)).await.is_err() {
                    client_open = false;
                    tracing::debug!("client went away mid-stream; reading the rest of the reply");
                }
            }
            Err(e) => {
                tracing::warn!(upstream = %ex.upstream.name, error = %e, "upstream stream broke off");
                if client_open {
                    let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                }
                break;
            }
        }
    }
    drop(tx);
    if let Some(turn) = ex.turn {
        if !acc.is_empty() {
            turn.record_reply(
                acc.to_message(),
                &ex.app.config.history,
                &ex.app.counters,
                now_ms(),
            );
        }
    }
}

fn response(status: StatusCode, headers: HeaderMap, body: Body) -> Response {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    *r.headers_mut() = headers;
    r
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
