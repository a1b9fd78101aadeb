//! A streamed answer.
//!
//! While the client reads, the response body reads the upstream itself: a
//! chunk is read, parsed and handed to hyper in the client's connection
//! task, with no channel of recall's and no second task to wake (chunks
//! that come in a burst wait a turn for the next, `batch.rs`). The
//! exchange's task sleeps meanwhile. When the reply is cut (the client
//! left, a barge-in, the interrupt endpoint, a shutdown), that task takes
//! the reader from the body, even from a body the client no longer polls,
//! and drains the rest of the upstream within the drain limits.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use sse_parse::SseParser;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::batch::{Batch, Next};
use super::boundary::EventBoundary;
use super::{response, CutWatch, Exchange, Head, Readings, Timing};
use crate::memory::session::Reply;
use crate::metrics::Metrics;
use crate::proxy::accumulate::Event;
use crate::proxy::client;
use crate::proxy::cut::CutWait;
use crate::proxy::idle::BodyError;
use crate::proxy::protocol::Protocol;
use crate::proxy::upstream::Upstream;
use crate::store::StorageError;

/// The largest SSE event taken from an upstream. A chat chunk is a few
/// hundred bytes; without a cap, an upstream that never ends its event
/// would grow the parser's buffer until the process ran out of memory.
const MAX_EVENT_BYTES: usize = 8 << 20;

/// A frame's bytes and the events parsed from them.
type Frame = (Bytes, Vec<Event>);

/// Gives the client its streamed response, then waits for it to end. If the
/// reply is cut first, drains the upstream.
pub(super) async fn relay(
    ex: &Exchange,
    watch: &mut CutWatch,
    resp: client::Response,
    status: StatusCode,
    headers: HeaderMap,
    respond: oneshot::Sender<Head>,
    timing: Timing,
) {
    let reader = Arc::new(Mutex::new(Some(Reader::new(
        ex.upstream.body(resp),
        ex.upstream.protocol,
    ))));
    let (body_gone, gone) = oneshot::channel::<()>();
    let body = RelayBody {
        reader: Arc::clone(&reader),
        cut: ex.flight.cut_wait(),
        flight: Arc::clone(&ex.flight),
        upstream: Arc::clone(&ex.upstream),
        metrics: Arc::clone(&ex.metrics),
        called: timing.called,
        first_token: true,
        readings: ex.readings.clone(),
        batch: Batch::default(),
        closing: None,
        holding: None,
        ended: false,
        _gone: body_gone,
    };
    ex.responding(&timing, true);
    // If the handler is gone, the body is dropped here and its guard fires.
    let _ = respond.send(Ok(response(status, headers, Body::from_stream(body))));
    tokio::select! {
        _ = &mut watch.cut => {}
        _ = gone => {}
    }
    if !ex.flight.is_cut() {
        // The body ended the reply; dropping the reader here closes an
        // upstream that is still open (after an error event, say).
        return;
    }
    let Some(reader) = lock(&reader).take() else {
        return;
    };
    drain(ex, watch, reader).await;
}

/// After a cut: reads on until the upstream ends or the drain limits are
/// reached, for the record's `original`, or stops at once when configured
/// to. Dropping the reader closes the upstream.
async fn drain<S>(ex: &Exchange, watch: &mut CutWatch, mut reader: Reader<S>)
where
    S: Stream<Item = Result<Bytes, BodyError>> + Unpin,
{
    let flight = &ex.flight;
    let mut drained = 0usize;
    loop {
        let step = watch
            .run(std::future::poll_fn(|cx| reader.poll_step(cx, flight)))
            .await;
        match step {
            None => return watch.stopped(),
            Some(Step::Finished) => return flight.drained(false),
            Some(Step::Chunk(bytes, events)) => {
                flight.on_received(&events);
                drained += bytes.len();
                if drained >= ex.drain.drain_max_bytes {
                    return flight.drained(false);
                }
            }
            Some(Step::Broke(why, events)) => {
                flight.on_received(&events);
                tracing::warn!(upstream = %ex.upstream.name, error = %why, "upstream stream failed");
                ex.metrics.upstream_error(&ex.upstream.name);
                return flight.broke(&why);
            }
        }
    }
}

/// The upstream's body, the SSE parser over it, and what of it may go to
/// the client yet (whole events).
struct Reader<S> {
    body: S,
    /// How the events' data is read.
    protocol: Protocol,
    parser: SseParser,
    boundary: EventBoundary,
}

/// What one read of the upstream gave.
enum Step {
    /// Bytes to relay as they are, ending between events, and the events
    /// completed in them.
    Chunk(Bytes, Vec<Event>),
    /// The stream is over.
    Finished,
    /// The stream broke here: why, and the events received before the
    /// break in this read (not to be relayed: their bytes hold the break).
    /// An event begun and not finished before it never went out.
    Broke(String, Vec<Event>),
}

impl<S> Reader<S>
where
    S: Stream<Item = Result<Bytes, BodyError>> + Unpin,
{
    fn new(body: S, protocol: Protocol) -> Self {
        Self {
            body,
            protocol,
            parser: SseParser::new().max_buffer(MAX_EVENT_BYTES),
            boundary: EventBoundary::new(),
        }
    }

    fn poll_step(&mut self, cx: &mut Context<'_>, flight: &Reply) -> Poll<Step> {
        loop {
            let bytes = match std::task::ready!(self.body.poll_next_unpin(cx)) {
                None => return Poll::Ready(Step::Finished),
                // A connection that fails after the reply's end lost nothing.
                Some(Err(_)) if flight.received_complete() => return Poll::Ready(Step::Finished),
                Some(Err(e)) => {
                    let why = format!("upstream stream broke off: {e}");
                    return Poll::Ready(Step::Broke(why, Vec::new()));
                }
                Some(Ok(bytes)) => bytes,
            };
            self.parser.feed(&bytes);
            let mut events = Vec::new();
            while let Some(event) = self.parser.next_event() {
                events.push(self.protocol.stream_event(&event.data));
            }
            if let Some(bad) = events.iter().position(|e| matches!(e, Event::Malformed)) {
                // An event the client's SDK could not parse either.
                events.truncate(bad);
                let why = "upstream sent an event that is not JSON".to_owned();
                return Poll::Ready(Step::Broke(why, events));
            }
            let whole = self.boundary.complete(bytes);
            if self.parser.overflows() > 0 || self.boundary.held() > MAX_EVENT_BYTES {
                let why = format!(
                    "upstream sent an event larger than {} MiB",
                    MAX_EVENT_BYTES >> 20
                );
                return Poll::Ready(Step::Broke(why, events));
            }
            if let Some(whole) = whole {
                return Poll::Ready(Step::Chunk(whole, events));
            }
            // No event ends in these bytes: nothing to give out yet.
            debug_assert!(events.is_empty(), "events parsed from held bytes");
        }
    }
}

/// The streamed response body. What it reads counts as relayed (what it
/// holds in its batch goes out next, even on a cut; only a client that
/// leaves while a batch waits misses it). The reply's end (`[DONE]`, or the
/// end of the stream) settles it as complete and is held back until its
/// record is durable. Dropped before the end (the client went away), it
/// settles the reply as interrupted.
struct RelayBody<S> {
    /// Shared with the exchange's task, which takes it on a cut.
    reader: Arc<Mutex<Option<Reader<S>>>>,
    cut: CutWait,
    flight: Arc<Reply>,
    upstream: Arc<Upstream>,
    metrics: Arc<Metrics>,
    /// When the upstream was called, for the time to the first token.
    called: Instant,
    first_token: bool,
    /// Where the events of each frame go, for a reader that wants them.
    readings: Option<Readings>,
    /// Chunks read but not handed out yet: the ones ready together go as
    /// one frame (`batch.rs`).
    batch: Batch,
    /// The error event that ends a broken stream, after the batch: the
    /// reply is settled already.
    closing: Option<Bytes>,
    /// The end, waiting for its record to be durable: the last chunk and
    /// its events (or `None` for the end of the stream) and the
    /// durability future.
    holding: Option<(Option<Frame>, Durable)>,
    ended: bool,
    /// Dropped with the body: wakes the exchange's task.
    _gone: oneshot::Sender<()>,
}

type Durable = Pin<Box<dyn Future<Output = Result<(), StorageError>> + Send>>;

impl<S> RelayBody<S> {
    /// Records what went out like an interruption, with the reason, and
    /// tells the client the stream broke with an OpenAI-style error event
    /// (which the SDKs raise as an exception), once the batch is out.
    fn break_off(&mut self, why: &str) {
        self.flight.broke(why);
        let event = serde_json::json!({"error": {
            "message": why, "type": "upstream_error", "param": null, "code": "stream_broken"}});
        self.closing = Some(Bytes::from(format!("data: {event}\n\n")));
    }

    /// The upstream's stream is over (`broke`: why, if it broke): settled
    /// at once, since nothing more can be relayed; what the client is sent
    /// follows the batch.
    fn upstream_ended(&mut self, broke: Option<String>) {
        if !self.flight.relayed_complete() {
            let why = broke
                .as_deref()
                .unwrap_or("upstream stream ended before the reply was complete");
            return self.break_off(why);
        }
        if let Some(why) = broke {
            // The client has had the reply's end: it lacks nothing.
            self.flight.broke(&why);
        }
        self.hold_end(None);
    }

    /// A frame of the upstream's, with the events parsed from it.
    fn pass(
        &self,
        bytes: Bytes,
        events: Vec<Event>,
    ) -> Poll<Option<Result<Bytes, std::io::Error>>> {
        if let Some(to) = &self.readings {
            to.put_frame(&bytes, events);
        }
        Poll::Ready(Some(Ok(bytes)))
    }

    /// The batch, as one frame, if it holds anything.
    fn hand_out(&mut self) -> Option<Poll<Option<Result<Bytes, std::io::Error>>>> {
        let (bytes, events) = self.batch.take()?;
        Some(self.pass(bytes, events))
    }

    /// The reply's end goes out once its record is durable.
    fn hold_end(&mut self, last: Option<Frame>) {
        let durable = self.flight.delivered().boxed();
        self.holding = Some((last, durable));
    }

    fn poll_held(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, std::io::Error>>> {
        let Some((last, durable)) = self.holding.as_mut() else {
            return Poll::Ready(None);
        };
        let stored = std::task::ready!(durable.as_mut().poll(cx));
        let last = last.take();
        self.holding = None;
        if let Err(e) = stored {
            // The client must not be told the reply is complete when it
            // was not stored: an error event instead.
            tracing::error!(error = %e, "reply not stored; its end is not sent");
            let event = serde_json::json!({"error": {
                "message": format!("the reply could not be stored: {e}"),
                "type": "server_error", "param": null, "code": "storage_unavailable"}});
            self.ended = true;
            return Poll::Ready(Some(Ok(Bytes::from(format!("data: {event}\n\n")))));
        }
        match last {
            Some((bytes, events)) => self.pass(bytes, events),
            None => {
                self.ended = true;
                Poll::Ready(None)
            }
        }
    }
}

impl<S> Stream for RelayBody<S>
where
    S: Stream<Item = Result<Bytes, BodyError>> + Unpin,
{
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if this.ended {
                return Poll::Ready(None);
            }
            if this.holding.is_some() {
                return this.poll_held(cx);
            }
            if let Some(event) = this.closing.take() {
                this.ended = true;
                return Poll::Ready(Some(Ok(event)));
            }
            if Pin::new(&mut this.cut).poll(cx).is_ready() {
                // The batch is accounted as relayed already: it goes out.
                if let Some(out) = this.hand_out() {
                    return out;
                }
                this.ended = true;
                return Poll::Ready(None);
            }
            // What a step read is accounted for under the reader's lock, so
            // that a drain taking the reader over after a cut never
            // accounts for a later chunk first.
            let mut slot = lock(&this.reader);
            let Some(reader) = slot.as_mut() else {
                drop(slot);
                if let Some(out) = this.hand_out() {
                    return out;
                }
                this.ended = true;
                return Poll::Ready(None);
            };
            let Poll::Ready(step) = reader.poll_step(cx, &this.flight) else {
                drop(slot);
                return match this.batch.nothing_ready() {
                    None => Poll::Pending,
                    Some(Next::LookAgain) => {
                        cx.waker().wake_by_ref();
                        Poll::Pending
                    }
                    Some(Next::HandOut) => this.hand_out().unwrap_or(Poll::Pending),
                };
            };
            match step {
                Step::Chunk(bytes, events) => {
                    this.flight.on_passed(&events);
                    drop(slot);
                    let content_went_out = !this.first_token;
                    if this.first_token && events.iter().any(Event::carries_content) {
                        this.first_token = false;
                        this.metrics
                            .first_token(&this.upstream.name, this.called.elapsed());
                    }
                    if events.contains(&Event::Done) {
                        // The end waits for its record; what came before it
                        // does not.
                        this.hold_end(Some((bytes, events)));
                    } else {
                        let now = std::time::Instant::now();
                        match this.batch.push(bytes, events, content_went_out, now) {
                            Next::HandOut => {}
                            Next::LookAgain => {
                                // Taking this chunk woke the upstream
                                // connection's task; once it has read what
                                // else arrived, this body looks again.
                                cx.waker().wake_by_ref();
                                return Poll::Pending;
                            }
                        }
                    }
                }
                Step::Finished => {
                    drop(slot);
                    this.upstream_ended(None);
                }
                Step::Broke(why, events) => {
                    this.flight.on_received(&events);
                    // Nothing past a break is read, not even by a drain.
                    *slot = None;
                    drop(slot);
                    tracing::warn!(upstream = %this.upstream.name, error = %why, "upstream stream failed");
                    this.metrics.upstream_error(&this.upstream.name);
                    this.upstream_ended(Some(why));
                }
            }
            // The batch goes out before anything that ends the stream.
            if let Some(out) = this.hand_out() {
                return out;
            }
        }
    }
}

impl<S> Drop for RelayBody<S> {
    fn drop(&mut self) {
        // A broken stream whose error event is still to go out is settled.
        if !self.ended && self.closing.is_none() {
            self.flight.client_gone();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
