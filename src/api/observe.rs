//! What every request leaves behind: a request id, a tracing span, one log
//! line and its metrics; and the one check every request passes first, on
//! the size of its headers.
//!
//! The span is opened here and the handlers fill in what only they know
//! (`session`, `turn`, `upstream`) with `Span::current().record(..)`; the
//! relay task runs inside the same span, so its warnings carry them too.
//! Message contents and keys never go into a span or a line above `trace`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use tower_layer::Layer;
use tower_service::Service;
use tracing::field::Empty;
use tracing::instrument::{Instrument, Instrumented};

use crate::error::{ApiError, RequestError};
use crate::metrics::RequestLabels;
use crate::server::app::App;

/// The header a request id is read from and returned in. An upstream's own
/// `x-request-id` is relayed as `x-upstream-request-id`.
pub const REQUEST_ID: &str = "x-request-id";

/// Where the chat handler notes the upstream it chose, for the metrics'
/// `upstream` label: set on success and on error alike.
#[derive(Clone, Debug, Default)]
pub struct ServedBy(pub Arc<OnceLock<String>>);

impl ServedBy {
    pub fn note(&self, upstream: &str) {
        let _ = self.0.set(upstream.to_owned());
        tracing::Span::current().record("upstream", upstream);
    }
}

/// `observe` around every route. A service of its own rather than
/// `middleware::from_fn`, which for every request clones the route's boxed
/// service once more, boxes its own future and calls the route through
/// `Next`: this calls the route it holds and wraps the route's future
/// (docs/perf-journal.md, item 38).
#[derive(Clone)]
pub struct ObserveLayer(pub Arc<App>);

impl<S> Layer<S> for ObserveLayer {
    type Service = Observe<S>;

    fn layer(&self, inner: S) -> Observe<S> {
        Observe {
            inner,
            app: Arc::clone(&self.0),
        }
    }
}

#[derive(Clone)]
pub struct Observe<S> {
    inner: S,
    app: Arc<App>,
}

impl<S> Service<Request> for Observe<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Observed<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        let started = Instant::now();
        let id = client_request_id(request.headers()).unwrap_or_else(new_request_id);
        let route = route_label(request.extensions().get::<MatchedPath>());
        let quiet = matches!(route.as_str(), "/healthz" | "/readyz" | "/metrics");
        let span = tracing::info_span!(
            "request",
            id = %id,
            method = %request.method(),
            route = %route,
            session = Empty,
            turn = Empty,
            upstream = Empty,
            status = Empty,
            ms = Empty,
        );
        let served = ServedBy::default();
        request.extensions_mut().insert(served.clone());
        let (inner, refused) = match headers_too_large(&self.app, request.headers()) {
            Some(refused) => (None, Some(refused.into_response())),
            None => {
                let call = span.in_scope(|| self.inner.call(request));
                (Some(call.instrument(span.clone())), None)
            }
        };
        Observed {
            inner,
            refused,
            after: Some(After {
                app: Arc::clone(&self.app),
                started,
                id,
                route,
                quiet,
                span,
                served,
            }),
        }
    }
}

pin_project_lite::pin_project! {
    /// The route's answer, and what every request leaves behind once it
    /// is ready.
    pub struct Observed<F> {
        #[pin]
        inner: Option<Instrumented<F>>,
        // Headers too large: the route was not called.
        refused: Option<Response>,
        // Taken when the answer is ready.
        after: Option<After>,
    }
}

impl<F: Future<Output = Result<Response, Infallible>>> Future for Observed<F> {
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = match this.inner.as_pin_mut() {
            Some(inner) => match std::task::ready!(inner.poll(cx)) {
                Ok(response) => response,
                Err(never) => match never {},
            },
            None => this
                .refused
                .take()
                .expect("an observed future polled after it answered"),
        };
        let after = this
            .after
            .take()
            .expect("an observed future polled after it answered");
        Poll::Ready(Ok(after.answered(response)))
    }
}

/// What the request's line, metrics and id header need once it answers.
struct After {
    app: Arc<App>,
    started: Instant,
    id: String,
    route: String,
    quiet: bool,
    span: tracing::Span,
    served: ServedBy,
}

impl After {
    fn answered(self, mut response: Response) -> Response {
        let Self {
            app,
            started,
            id,
            route,
            quiet,
            span,
            served,
        } = self;
        let took = started.elapsed();
        let status = response.status().as_u16();
        let upstream = served.0.get().cloned().unwrap_or_default();
        span.record("status", status);
        span.record("ms", took.as_secs_f64() * 1000.0);
        span.in_scope(|| {
            if quiet {
                tracing::debug!("request answered");
            } else if status >= 500 {
                tracing::warn!("request answered");
            } else {
                tracing::info!("request answered");
            }
        });
        app.metrics.request(
            &RequestLabels {
                route,
                status,
                upstream,
            },
            took,
        );
        if let Ok(v) = HeaderValue::from_str(&id) {
            let headers = response.headers_mut();
            if let Some(theirs) = headers.remove(REQUEST_ID) {
                headers.insert("x-upstream-request-id", theirs);
            }
            headers.insert(REQUEST_ID, v);
        }
        response
    }
}

/// Headers past `max_header_bytes` are refused before any handler runs
/// (hyper's own limit is far higher and answers without OpenAI's shape).
/// Checked here rather than in a layer of its own: each middleware layer
/// is one more boxed service cloned for every request on every route.
fn headers_too_large(app: &App, headers: &HeaderMap) -> Option<ApiError> {
    let limit = app.config.server.max_header_bytes;
    let size: usize = headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len())
        .sum();
    (limit > 0 && size > limit).then(|| RequestError::HeadersTooLarge { limit }.into())
}

/// The route template, with the base-URL session form folded into the
/// plain one, so that labels stay few and hold no session ids.
fn route_label(matched: Option<&MatchedPath>) -> String {
    let Some(path) = matched.map(MatchedPath::as_str) else {
        return "unmatched".into();
    };
    path.strip_prefix("/sessions/{session_id}")
        .unwrap_or(path)
        .to_owned()
}

/// A client's own id is kept when it is short, visible ASCII: it goes into
/// logs and back into a header.
fn client_request_id(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(REQUEST_ID)?.to_str().ok()?;
    let ok = !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic());
    ok.then(|| v.to_owned())
}

/// Unique across restarts and replicas without a random draw per request:
/// a random prefix chosen once, and a counter.
fn new_request_id() -> String {
    static PREFIX: OnceLock<String> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let prefix = PREFIX.get_or_init(|| {
        use ring::rand::SecureRandom;
        let mut bytes = [0u8; 6];
        let _ = ring::rand::SystemRandom::new().fill(&mut bytes);
        hex::encode(bytes)
    });
    format!("req_{prefix}{:08x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_unique_and_client_ids_are_checked() {
        let a = new_request_id();
        let b = new_request_id();
        assert_ne!(a, b);
        assert!(a.starts_with("req_") && a.len() == 4 + 12 + 8, "{a}");
        let mut h = HeaderMap::new();
        h.insert(REQUEST_ID, HeaderValue::from_static("abc-123"));
        assert_eq!(client_request_id(&h).as_deref(), Some("abc-123"));
        h.insert(REQUEST_ID, HeaderValue::from_static("has space"));
        assert_eq!(client_request_id(&h), None);
        h.insert(REQUEST_ID, HeaderValue::from_str(&"x".repeat(129)).unwrap());
        assert_eq!(client_request_id(&h), None);
    }
}
