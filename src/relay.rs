//! Calling the upstream, relaying its answer, and settling the reply.
//!
//! The call runs in a task of its own, not in the request handler. When the
//! client goes away, only the handler's future and the response body are
//! dropped; their guards settle the reply as interrupted at once, and the
//! task goes on reading the upstream (within the drain limits) to record
//! the complete original, or closes it at once when configured to.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::accumulate::{self, Event};
use crate::config::InterruptionConfig;
use crate::cut::CutWait;
use crate::error::{ApiError, RequestError, UpstreamError};
use crate::idle::BodyError;
use crate::inflight::InFlight;
use crate::metrics::Metrics;
use crate::storage::StorageError;
use crate::upstream::{relayed_response_headers, Upstream};

/// Chunks buffered between the upstream reader and a slow client.
const RELAY_BUFFER: usize = 64;

/// The largest SSE event taken from an upstream. A chat chunk is a few
/// hundred bytes; without a cap, an upstream that never ends its event
/// would grow the parser's buffer until the process ran out of memory.
const MAX_EVENT_BYTES: usize = 8 << 20;
/// The largest non-streaming answer taken from an upstream. A completion
/// is a few kilobytes; without a cap, an upstream that never ends its body
/// would grow it until the process ran out of memory.
const MAX_ANSWER_BYTES: usize = 64 << 20;
/// How long a stalled client may hold up the error event of a broken stream.
const ERROR_EVENT_WAIT: Duration = Duration::from_secs(10);

pub struct Exchange {
    pub upstream: Arc<Upstream>,
    pub client_headers: HeaderMap,
    pub body: Bytes,
    pub flight: Arc<InFlight>,
    pub drain: InterruptionConfig,
    pub metrics: Arc<Metrics>,
    /// When the client's request arrived: the proxy's own time is counted
    /// from here.
    pub arrived: Instant,
    /// Where to try once more when the call fails before its first byte,
    /// with the body made for that upstream.
    pub fallback: Option<(Arc<Upstream>, Bytes)>,
    /// The call's slot under `max_concurrent_upstream`, held to the end.
    pub slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// When the upstream was called and when its answer was in, for the
/// overhead metric: the time before the first and after the second is the
/// proxy's own.
struct Timing {
    called: Instant,
    answered: Instant,
}

impl Exchange {
    /// The chat completion call to the current upstream, until its head.
    async fn call(&self) -> Result<reqwest::Response, UpstreamError> {
        self.upstream
            .send_chat(&self.client_headers, self.body.clone())
            .await
    }

    fn answered(&self, called: Instant) -> Timing {
        let answered = Instant::now();
        self.metrics
            .upstream(&self.upstream.name, answered - called);
        Timing { called, answered }
    }

    /// The client's response head goes out now.
    fn responding(&self, t: &Timing, stream: bool) {
        let own = (t.called - self.arrived) + t.answered.elapsed();
        self.metrics.overhead(stream, own);
    }
}

type Head = Result<Response, ApiError>;

/// Starts the exchange and waits for the response to give the client.
pub async fn start(exchange: Exchange) -> Head {
    let flight = Arc::clone(&exchange.flight);
    let (tx, rx) = oneshot::channel();
    // In the request's span, so that what the task logs names the request.
    tokio::spawn(tracing::Instrument::in_current_span(run(exchange, tx)));
    // Dropped with this future when the client goes away before the head.
    let guard = GoneGuard(Some(Arc::clone(&flight)));
    let head = tokio::select! {
        head = rx => head.unwrap_or_else(|_| {
            tracing::error!("relay task ended without an answer");
            flight.failed("internal error: the relay task ended without an answer");
            Err(ApiError::Internal)
        }),
        // Interrupted before the answer began (barge-in, interrupt endpoint).
        _ = flight.cut_wait() => Err(RequestError::Interrupted.into()),
    };
    guard.disarm();
    head
}

/// Settles the reply as interrupted if dropped while armed.
struct GoneGuard(Option<Arc<InFlight>>);

impl GoneGuard {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for GoneGuard {
    fn drop(&mut self) {
        if let Some(flight) = self.0.take() {
            flight.client_gone();
        }
    }
}

async fn run(mut ex: Exchange, respond: oneshot::Sender<Head>) {
    let mut watch = CutWatch::new(&ex);
    let mut called = Instant::now();
    let mut outcome = watch.run(ex.call()).await;
    if let Some((fallback, body)) = ex.fallback.take() {
        let retry = match &outcome {
            Some(Err(UpstreamError::Unreachable { .. })) => true,
            Some(Ok(resp)) => resp.status().is_server_error(),
            _ => false,
        };
        if retry {
            tracing::warn!(upstream = %ex.upstream.name, fallback = %fallback.name,
                "upstream failed before answering; trying its fallback");
            ex.metrics.upstream_error(&ex.upstream.name);
            ex.upstream = fallback;
            ex.body = body;
            called = Instant::now();
            outcome = watch.run(ex.call()).await;
        }
    }
    let resp = match outcome {
        None => return ex.flight.drained(false),
        Some(Err(e)) => {
            tracing::warn!(upstream = %ex.upstream.name, error = %e, "upstream call failed");
            ex.metrics.upstream_error(&ex.upstream.name);
            ex.flight.failed(&e.to_string());
            let _ = respond.send(Err(e.into()));
            return;
        }
        Some(Ok(resp)) => resp,
    };
    ex.flight.started(now_ms());
    let status = resp.status();
    let headers = relayed_response_headers(resp.headers());
    let is_sse = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if status.is_success() && is_sse {
        let timing = ex.answered(called);
        stream(&ex, &mut watch, resp, status, headers, respond, timing).await;
    } else {
        whole(&ex, &mut watch, resp, status, headers, respond, called).await;
    }
}

/// A non-streaming answer, or any error answer: read it whole, relay it.
async fn whole(
    ex: &Exchange,
    watch: &mut CutWatch,
    resp: reqwest::Response,
    status: StatusCode,
    headers: HeaderMap,
    respond: oneshot::Sender<Head>,
    called: Instant,
) {
    let body = ex.upstream.body(resp);
    let bytes = match watch.run(read_whole(body, MAX_ANSWER_BYTES)).await {
        None => return ex.flight.drained(false),
        Some(Ok(b)) => b,
        Some(Err(e)) => {
            let err = match e {
                BodyError::Idle(_) => ex.upstream.timeout_error(),
                BodyError::TooLarge(_) => UpstreamError::Invalid {
                    upstream: ex.upstream.name.clone(),
                    reason: e.to_string(),
                },
                BodyError::Broke(e) => UpstreamError::Unreachable {
                    upstream: ex.upstream.name.clone(),
                    reason: format!("response body broke off: {e}"),
                },
            };
            ex.metrics.upstream_error(&ex.upstream.name);
            ex.flight.failed(&err.to_string());
            let _ = respond.send(Err(err.into()));
            return;
        }
    };
    let timing = ex.answered(called);
    let reply = status
        .is_success()
        .then(|| accumulate::completion_reply(&bytes))
        .flatten();
    match reply {
        Some((reply, reason)) => {
            // The body is released only once its record is durable.
            if let Err(e) = ex.flight.completed_whole(reply, reason).durable().await {
                tracing::error!(error = %e, "reply not stored");
                let _ = respond.send(Err(e.into()));
                return;
            }
        }
        None if status.is_success() => {
            // Relaying it would hand the SDK a 200 it cannot read.
            let kind = headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("no content type");
            let err = UpstreamError::Invalid {
                upstream: ex.upstream.name.clone(),
                reason: format!("a {kind} body without choices[0].message"),
            };
            tracing::warn!(error = %err, "upstream answer unusable");
            ex.metrics.upstream_error(&ex.upstream.name);
            ex.flight.failed(&err.to_string());
            let _ = respond.send(Err(err.into()));
            return;
        }
        None => {
            tracing::info!(upstream = %ex.upstream.name, %status, "upstream answered with an error");
            ex.metrics.upstream_error(&ex.upstream.name);
            ex.flight.failed(&format!(
                "upstream answered {status}: {}",
                error_message(&bytes)
            ));
        }
    }
    ex.responding(&timing, false);
    let _ = respond.send(Ok(response(status, headers, Body::from(bytes))));
}

/// The whole body, up to `max` bytes: most answers arrive in one piece,
/// which is kept as is.
async fn read_whole(
    mut body: impl futures_util::Stream<Item = Result<Bytes, BodyError>> + Unpin,
    max: usize,
) -> Result<Bytes, BodyError> {
    let Some(first) = body.next().await.transpose()? else {
        return Ok(Bytes::new());
    };
    if first.len() > max {
        return Err(BodyError::TooLarge(max));
    }
    let Some(second) = body.next().await.transpose()? else {
        return Ok(first);
    };
    let mut all = BytesMut::from(&first[..]);
    let mut piece = second;
    loop {
        if all.len() + piece.len() > max {
            return Err(BodyError::TooLarge(max));
        }
        all.extend_from_slice(&piece);
        match body.next().await.transpose()? {
            Some(next) => piece = next,
            None => return Ok(all.freeze()),
        }
    }
}

/// A streamed answer: every chunk goes to the client as it arrives, and
/// through the SSE parser into the record.
async fn stream(
    ex: &Exchange,
    watch: &mut CutWatch,
    resp: reqwest::Response,
    status: StatusCode,
    headers: HeaderMap,
    respond: oneshot::Sender<Head>,
    timing: Timing,
) {
    let (tx, rx) = mpsc::channel(RELAY_BUFFER);
    let body = RelayBody::new(rx, Arc::clone(&ex.flight));
    ex.responding(&timing, true);
    // If the handler is gone, the body is dropped here and its guard fires.
    let _ = respond.send(Ok(response(status, headers, Body::from_stream(body))));
    let mut first_token = true;

    let mut parser = sse_parse::SseParser::new().max_buffer(MAX_EVENT_BYTES);
    let mut upstream = ex.upstream.body(resp);
    let mut drained = 0usize;
    let end = loop {
        let bytes = match watch.run(upstream.next()).await {
            None => break End::Abandoned,
            Some(None) => break End::Finished,
            // A connection that fails after the reply's end lost nothing.
            Some(Some(Err(_))) if ex.flight.received_complete() => break End::Finished,
            Some(Some(Err(e))) => break End::Broke(format!("upstream stream broke off: {e}")),
            Some(Some(Ok(bytes))) => bytes,
        };
        parser.feed(&bytes);
        let mut events = Vec::new();
        while let Some(event) = parser.next_event() {
            events.push(Event::parse(&event.data));
        }
        if let Some(bad) = events.iter().position(|e| matches!(e, Event::Malformed)) {
            // An event the client's SDK could not parse either: the stream
            // is broken here. The events before it are received, not sent.
            events.truncate(bad);
            ex.flight.on_received(&events);
            break End::Broke("upstream sent an event that is not JSON".into());
        }
        if parser.overflows() > 0 {
            ex.flight.on_received(&events);
            break End::Broke(format!(
                "upstream sent an event larger than {} MiB",
                MAX_EVENT_BYTES >> 20
            ));
        }
        ex.flight.on_received(&events);
        if first_token && events.iter().any(Event::carries_content) {
            first_token = false;
            ex.metrics
                .first_token(&ex.upstream.name, timing.called.elapsed());
        }
        if watch.is_cut() {
            drained += bytes.len();
            if drained >= ex.drain.drain_max_bytes {
                break End::Abandoned;
            }
            continue;
        }
        tokio::select! {
            biased;
            _ = tx.send(Chunk { bytes, events, broke: None }) => {}
            _ = &mut watch.cut => {}
        }
    };
    match end {
        End::Finished if watch.is_cut() => ex.flight.drained(false),
        End::Finished => {
            // The body records the reply once its last chunk has gone out.
            if !ex.flight.received_complete() {
                let why = "upstream stream ended before the reply was complete";
                send_break(&tx, why, &ex.flight).await;
            }
        }
        End::Broke(why) => {
            tracing::warn!(upstream = %ex.upstream.name, error = %why, "upstream stream failed");
            ex.metrics.upstream_error(&ex.upstream.name);
            if watch.is_cut() || ex.flight.received_complete() {
                ex.flight.broke(&why);
            } else {
                send_break(&tx, &why, &ex.flight).await;
            }
        }
        End::Abandoned => ex.flight.drained(false),
    }
    // Dropping the upstream here closes its connection when it is unfinished.
}

enum End {
    Finished,
    Broke(String),
    /// Stopped reading: cut with `capture_original = false`, or the drain
    /// limits were reached.
    Abandoned,
}

/// Tells the client the stream broke, with an OpenAI-style error event
/// (which the SDKs raise as an exception). The break is settled by the
/// body when the event reaches it, after the chunks queued before it, so
/// the record holds exactly what the client was sent; if the event cannot
/// be handed over, it is settled here.
async fn send_break(tx: &mpsc::Sender<Chunk>, why: &str, flight: &InFlight) {
    let event = serde_json::json!({"error": {
        "message": why, "type": "upstream_error", "param": null, "code": "stream_broken"}});
    let chunk = Chunk {
        bytes: Bytes::from(format!("data: {event}\n\n")),
        events: Vec::new(),
        broke: Some(why.to_owned()),
    };
    // A client that stopped reading must not keep this task alive.
    let handed_over = tokio::select! {
        sent = tx.send(chunk) => sent.is_ok(),
        _ = flight.cut_wait() => false,
        _ = tokio::time::sleep(ERROR_EVENT_WAIT) => false,
    };
    if !handed_over {
        flight.broke(why);
    }
}

fn error_message(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned())
}

/// Waits on upstream I/O until the reply is cut; after the cut, either
/// stops at once (`capture_original = false`, or a stateless request) or
/// goes on until the drain deadline.
struct CutWatch {
    flight: Arc<InFlight>,
    /// One wait on the cut for the whole exchange, not a new one per chunk.
    cut: CutWait,
    capture: bool,
    drain_for: Duration,
    deadline: Option<Instant>,
}

impl CutWatch {
    fn new(ex: &Exchange) -> Self {
        Self {
            flight: Arc::clone(&ex.flight),
            cut: ex.flight.cut_wait(),
            capture: ex.drain.capture_original && ex.flight.records(),
            drain_for: Duration::from_secs(ex.drain.drain_timeout_secs),
            deadline: None,
        }
    }

    fn is_cut(&self) -> bool {
        self.flight.is_cut()
    }

    /// `None` when the wait was abandoned.
    async fn run<F: Future>(&mut self, fut: F) -> Option<F::Output> {
        tokio::pin!(fut);
        if self.deadline.is_none() {
            if !self.is_cut() {
                tokio::select! {
                    biased;
                    out = &mut fut => return Some(out),
                    _ = &mut self.cut => {}
                }
            }
            if !self.capture {
                return None;
            }
            self.deadline = Some(Instant::now() + self.drain_for);
        }
        let deadline = self.deadline?;
        tokio::time::timeout_at(deadline, fut).await.ok()
    }
}

/// A chunk of the upstream's bytes and the events completed in it.
struct Chunk {
    bytes: Bytes,
    events: Vec<Event>,
    /// The upstream broke off here; `bytes` is the error event.
    broke: Option<String>,
}

/// The streamed response body. What it hands to the connection counts as
/// relayed. The reply's end (`[DONE]`, or the end of the stream) settles it
/// as complete and is held back until its record is durable. Dropped before
/// the end (the client went away), it settles the reply as interrupted.
struct RelayBody {
    rx: mpsc::Receiver<Chunk>,
    cut: CutWait,
    flight: Arc<InFlight>,
    /// The end, waiting for its record to be durable: the last chunk (or
    /// `None` for the end of the stream) and the durability future.
    holding: Option<(Option<Bytes>, Durable)>,
    ended: bool,
}

type Durable = Pin<Box<dyn Future<Output = Result<(), StorageError>> + Send>>;

impl RelayBody {
    fn new(rx: mpsc::Receiver<Chunk>, flight: Arc<InFlight>) -> Self {
        Self {
            rx,
            cut: flight.cut_wait(),
            flight,
            holding: None,
            ended: false,
        }
    }
}

impl futures_util::Stream for RelayBody {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if self.ended {
                return Poll::Ready(None);
            }
            if let Some((_, durable)) = self.holding.as_mut() {
                let stored = std::task::ready!(durable.as_mut().poll(cx));
                let (last, _) = self
                    .holding
                    .take()
                    .unwrap_or((None, Box::pin(async { Ok(()) })));
                if let Err(e) = stored {
                    // The client must not be told the reply is complete
                    // when it was not stored: an error event instead.
                    tracing::error!(error = %e, "reply not stored; its end is not sent");
                    let event = serde_json::json!({"error": {
                        "message": format!("the reply could not be stored: {e}"),
                        "type": "server_error", "param": null, "code": "storage_unavailable"}});
                    self.ended = true;
                    return Poll::Ready(Some(Ok(Bytes::from(format!("data: {event}\n\n")))));
                }
                return match last {
                    Some(bytes) => Poll::Ready(Some(Ok(bytes))),
                    None => {
                        self.ended = true;
                        Poll::Ready(None)
                    }
                };
            }
            if Pin::new(&mut self.cut).poll(cx).is_ready() {
                self.ended = true;
                return Poll::Ready(None);
            }
            match std::task::ready!(self.rx.poll_recv(cx)) {
                Some(chunk) => {
                    self.flight.on_relayed(&chunk.events);
                    if let Some(why) = &chunk.broke {
                        self.flight.broke(why);
                        return Poll::Ready(Some(Ok(chunk.bytes)));
                    }
                    if !chunk.events.contains(&Event::Done) {
                        return Poll::Ready(Some(Ok(chunk.bytes)));
                    }
                    let durable = self.flight.delivered().boxed();
                    self.holding = Some((Some(chunk.bytes), durable));
                }
                None => {
                    let durable = self.flight.delivered().boxed();
                    self.holding = Some((None, durable));
                }
            }
        }
    }
}

impl Drop for RelayBody {
    fn drop(&mut self) {
        if !self.ended {
            self.flight.client_gone();
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
