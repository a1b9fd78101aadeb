//! Calling the upstream, relaying its answer, and settling the reply.
//!
//! The exchange (the call, the answer, the drain) is one future. The
//! request's task runs it until the response head is ready; what is left
//! then (a stream's relay and drain) moves to a task of its own, and so
//! does all of it when the client goes away before the head. A client that
//! leaves drops only the handler's future and the response body; their
//! guards settle the reply as interrupted at once, and the exchange goes on
//! reading the upstream (within the drain limits) to record the complete
//! original, or closes it at once when configured to. A streamed answer is
//! read by its response body while the client takes it (`stream`).

mod batch;
mod boundary;
mod readings;
mod stream;

pub use readings::Readings;

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
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::config::InterruptionConfig;
use crate::error::{ApiError, RequestError, UpstreamError};
use crate::memory::session::Reply;
use crate::metrics::Metrics;
use crate::proxy::accumulate;
use crate::proxy::client;
use crate::proxy::cut::CutWait;
use crate::proxy::gate::{Acquire, Slot};
use crate::proxy::idle::BodyError;
use crate::proxy::upstream::{relayed_response_headers, Upstream};

/// The largest non-streaming answer taken from an upstream. A completion
/// is a few kilobytes; without a cap, an upstream that never ends its body
/// would grow it until the process ran out of memory.
const MAX_ANSWER_BYTES: usize = 64 << 20;

pub struct Exchange {
    pub upstream: Arc<Upstream>,
    pub client_headers: HeaderMap,
    pub body: Bytes,
    pub flight: Arc<Reply>,
    pub drain: InterruptionConfig,
    pub metrics: Arc<Metrics>,
    /// When the client's request arrived: the proxy's own time is counted
    /// from here.
    pub arrived: Instant,
    /// Where to try once more when the call fails before its first byte,
    /// with the body made for that upstream.
    pub fallback: Option<(Arc<Upstream>, Bytes)>,
    /// The call's slot under `max_concurrent_upstream`, or the wait for
    /// it (`App::upstream_slot`): awaited before the call, then held to
    /// the end, drain included.
    pub slot: Option<Acquire>,
    /// For an answer whose body is read again inside recall: what the
    /// relay read of it, handed along (`Readings`).
    pub readings: Option<Readings>,
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
    async fn call(&self) -> Result<client::Response, UpstreamError> {
        self.upstream
            .send_turn(&self.client_headers, self.body.clone())
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
    let (tx, mut rx) = oneshot::channel();
    // In the request's span, so that what the exchange logs names the request.
    let mut exchange = Detachable(Some(Box::pin(tracing::Instrument::in_current_span(run(
        exchange, tx,
    )))));
    // Dropped with this future when the client goes away before the head.
    let guard = GoneGuard(Some(Arc::clone(&flight)));
    let mut cut = flight.cut_wait();
    let head = std::future::poll_fn(|cx| {
        exchange.poll(cx);
        match Pin::new(&mut rx).poll(cx) {
            Poll::Ready(Ok(head)) => return Poll::Ready(head),
            Poll::Ready(Err(_)) if !flight.is_cut() => {
                tracing::error!("the exchange ended without an answer");
                flight.failed("internal error: the exchange ended without an answer");
                return Poll::Ready(Err(ApiError::Internal));
            }
            _ => {}
        }
        // Interrupted before the answer began (barge-in, interrupt endpoint).
        match Pin::new(&mut cut).poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(RequestError::Interrupted.into())),
            Poll::Pending => Poll::Pending,
        }
    })
    .await;
    guard.disarm();
    // The rest of the exchange (a stream's relay and drain) goes on alone.
    drop(exchange);
    head
}

/// The exchange, run by the request's own task until the response head is
/// ready, so that the head costs no hand-over between tasks. Whatever is
/// left of it when dropped (the head is out, or the client went away
/// before it) moves to a task of its own: a client that leaves never
/// cancels the upstream call.
struct Detachable(Option<Pin<Box<dyn Future<Output = ()> + Send>>>);

impl Detachable {
    /// A panic in the exchange drops it, as it would end a task of its
    /// own, rather than the client's connection: the handler then finds no
    /// answer and answers 500.
    fn poll(&mut self, cx: &mut Context<'_>) {
        let Some(mut exchange) = self.0.take() else {
            return;
        };
        let polled =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| exchange.as_mut().poll(cx)));
        if let Ok(Poll::Pending) = polled {
            self.0 = Some(exchange);
        }
    }
}

impl Drop for Detachable {
    fn drop(&mut self) {
        if let Some(exchange) = self.0.take() {
            // Outside a runtime the exchange ends here, and a runtime
            // shutting down drops what is spawned on it; either way the
            // guards have settled the reply, and only a drain is lost.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(exchange);
            }
        }
    }
}

/// Settles the reply as interrupted if dropped while armed: the client
/// left while its request waited.
pub(crate) struct GoneGuard(Option<Arc<Reply>>);

impl GoneGuard {
    pub(crate) fn armed(flight: &Arc<Reply>) -> Self {
        Self(Some(Arc::clone(flight)))
    }

    pub(crate) fn disarm(mut self) {
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
    let global = ex.slot.take();
    let mut watch = CutWatch::new(&ex, global);
    let mut called = Instant::now();
    let mut outcome = watch.call(&ex).await;
    if let Some((fallback, body)) = ex.fallback.take() {
        let retry = match &outcome {
            Some(Err(UpstreamError::Unreachable { .. } | UpstreamError::Busy { .. })) => true,
            Some(Ok(resp)) => resp.status().is_server_error(),
            _ => false,
        };
        if retry {
            tracing::warn!(upstream = %ex.upstream.name, fallback = %fallback.name,
                "upstream failed before answering; trying its fallback");
            if !matches!(&outcome, Some(Err(e)) if !e.is_the_upstreams()) {
                ex.metrics.upstream_error(&ex.upstream.name);
            }
            // The failed answer's connection closes before its slot passes on.
            drop(outcome.take());
            ex.upstream = fallback;
            ex.body = body;
            called = Instant::now();
            outcome = watch.call(&ex).await;
        }
    }
    let resp = match outcome {
        None => return watch.stopped(),
        Some(Err(e)) => {
            tracing::warn!(upstream = %ex.upstream.name, error = %e, "upstream call failed");
            if e.is_the_upstreams() {
                ex.metrics.upstream_error(&ex.upstream.name);
            }
            ex.flight.failed(&e.to_string());
            let _ = respond.send(Err(e.into()));
            return;
        }
        Some(Ok(resp)) => resp,
    };
    ex.flight.started();
    let status = resp.status();
    let headers = relayed_response_headers(resp.headers());
    let is_sse = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if status.is_success() && is_sse {
        let timing = ex.answered(called);
        stream::relay(&ex, &mut watch, resp, status, headers, respond, timing).await;
    } else {
        whole(&ex, &mut watch, resp, status, headers, respond, called).await;
    }
}

/// A non-streaming answer, or any error answer: read it whole, relay it.
async fn whole(
    ex: &Exchange,
    watch: &mut CutWatch,
    resp: client::Response,
    status: StatusCode,
    headers: HeaderMap,
    respond: oneshot::Sender<Head>,
    called: Instant,
) {
    let body = ex.upstream.body(resp);
    let bytes = match watch.run(read_whole(body, MAX_ANSWER_BYTES)).await {
        None => return watch.stopped(),
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
    let read = status
        .is_success()
        .then(|| {
            ex.upstream
                .protocol
                .read_whole(&bytes, ex.readings.is_some())
        })
        .flatten();
    match read {
        Some(accumulate::CompletionRead {
            reply,
            reason,
            parts,
        }) => {
            if let Some(to) = &ex.readings {
                to.put_whole(&bytes, parts);
            }
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

fn error_message(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned())
}

/// Waits on upstream I/O until the reply is cut; after the cut, either
/// stops at once (`capture_original = false`, or a stateless request) or
/// goes on until the drain deadline, or until a live request needs an
/// upstream slot it holds.
struct CutWatch {
    flight: Arc<Reply>,
    /// One wait on the cut for the whole exchange, not a new one per chunk.
    cut: CutWait,
    capture: bool,
    drain_for: Duration,
    deadline: Option<Instant>,
    /// The call's slot under `max_concurrent_upstream` until it comes.
    global_wait: Option<Acquire>,
    /// That slot, held to the end of the exchange, drain included.
    global: Option<Slot>,
    /// The call's slot under the upstream's `max_concurrent`, held to the
    /// end of the exchange, drain included.
    slot: Option<Slot>,
    /// While draining with a slot: resolves when a live request asks for
    /// one of them.
    asked_back: Option<AskedBack>,
    yielded: bool,
}

impl CutWatch {
    fn new(ex: &Exchange, global: Option<Acquire>) -> Self {
        Self {
            flight: Arc::clone(&ex.flight),
            cut: ex.flight.cut_wait(),
            capture: ex.drain.capture_original && ex.flight.records(),
            drain_for: Duration::from_secs(ex.drain.drain_timeout_secs),
            deadline: None,
            global_wait: global,
            global: None,
            slot: None,
            asked_back: None,
            yielded: false,
        }
    }

    fn is_cut(&self) -> bool {
        self.flight.is_cut()
    }

    /// The chat call to the exchange's current upstream, once it has its
    /// slots. `None` when abandoned.
    async fn call(&mut self, ex: &Exchange) -> Option<Result<client::Response, UpstreamError>> {
        // The slot of the upstream tried before (a fallback's first try).
        self.slot = None;
        // A reply cut before its call is made (a barge-in while it waited
        // for a slot, or before a fallback) has nothing to drain: nobody
        // will hear it, and it must not queue for a slot or ask a drain
        // to yield one.
        if self.is_cut() {
            return None;
        }
        if let Some(global) = self.global_wait.take() {
            // A slot on its way: free, or from a drain asked to yield
            // (maybe the reply this turn cut).
            let global = tokio::select! {
                biased;
                slot = global => slot,
                _ = &mut self.cut => return None,
            };
            self.global = Some(global);
        }
        let wait = ex.upstream.slot();
        tokio::pin!(wait);
        let slot = tokio::select! {
            biased;
            slot = &mut wait => slot,
            _ = &mut self.cut => return None,
        };
        match slot {
            // Cut as the slot came: it passes on unused.
            Ok(_) if self.is_cut() => return None,
            Ok(slot) => self.slot = slot,
            Err(e) => return Some(Err(e)),
        }
        self.run(ex.call()).await
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
            self.asked_back = AskedBack::of(&mut self.global, &mut self.slot);
        }
        let deadline = self.deadline?;
        let Some(asked_back) = self.asked_back.as_mut() else {
            return tokio::time::timeout_at(deadline, fut).await.ok();
        };
        if self.yielded {
            return None;
        }
        // The ask first: an upstream that always has data ready would
        // otherwise never let go.
        tokio::select! {
            biased;
            _ = asked_back => {
                self.yielded = true;
                None
            }
            out = tokio::time::timeout_at(deadline, fut) => out.ok(),
        }
    }

    /// The exchange stopped reading after a cut: records why.
    fn stopped(&self) {
        if self.yielded {
            self.flight.drain_yielded();
        } else {
            self.flight.drained(false);
        }
    }
}

/// A drain's slots asked back: by `max_concurrent_upstream`'s gate or by
/// the upstream's, whichever asks first. The drain stops once, and lets
/// go of both.
struct AskedBack([Option<CutWait>; 2]);

impl AskedBack {
    /// Tells each gate that the holder drains; `None` without a slot.
    fn of(global: &mut Option<Slot>, upstream: &mut Option<Slot>) -> Option<Self> {
        if global.is_none() && upstream.is_none() {
            return None;
        }
        Some(Self([
            global.as_mut().map(Slot::draining),
            upstream.as_mut().map(Slot::draining),
        ]))
    }
}

impl Future for AskedBack {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let asked = self
            .get_mut()
            .0
            .iter_mut()
            .flatten()
            .any(|ask| Pin::new(ask).poll(cx).is_ready());
        if asked {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

fn response(status: StatusCode, headers: HeaderMap, body: Body) -> Response {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    *r.headers_mut() = headers;
    r
}
