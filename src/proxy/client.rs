//! recall's HTTP client for its upstreams: hyper-util's pooled client over
//! rustls, with the environment's proxies.
//!
//! reqwest was this client before, and is built on the same pieces; its own
//! layers (request builder, URL handling, redirect policy, timeouts, proxy
//! matching and body wrapping, on every request) cost a large share of a
//! minimal proxy's instructions a request (docs/perf-journal.md, item 26).
//! What of them recall needs is done here once per upstream, or
//! once per connection: the TLS roots, ALPN, the proxy and the TCP settings
//! are reqwest's defaults, so that upstreams and proxies see what they saw.
//! Redirects are not followed: an API's answer is relayed as it is.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::header::USER_AGENT;
use axum::http::uri::Scheme;
use axum::http::{HeaderMap, HeaderValue, Request, Uri};
use bytes::Bytes;
use http_body_util::{BodyDataStream, BodyExt, Full};
use hyper::body::Incoming;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_rustls::{ConfigBuilderExt, HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tower_service::Service as _;

/// An upstream's answer, its head read and its body still to come.
pub type Response = axum::http::Response<Incoming>;

/// An answer's body as the pieces of data it arrives in.
pub type BodyStream = BodyDataStream<Incoming>;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

thread_local! {
    static SERVING_THREAD: Cell<usize> = const { Cell::new(0) };
}

/// Which serving thread this is, and so which of an upstream's client
/// pools it uses. 0 is the thread that accepts, and any thread that is not
/// a serving thread (a test's runtime, a blocking pool).
pub fn serving_thread() -> usize {
    SERVING_THREAD.with(Cell::get)
}

/// Said once by each serving thread as it starts (`server::threads`).
pub fn set_serving_thread(k: usize) {
    SERVING_THREAD.with(|i| i.set(k));
}

/// The request as sent: the body is always whole (a request recall made).
type Pooled = hyper_util::client::legacy::Client<Connector, Full<Bytes>>;

pub const USER_AGENT_VALUE: &str = concat!("recall/", env!("CARGO_PKG_VERSION"));

/// What every client of one upstream shares: built once, since building
/// rustls' configuration (the roots among it) is not cheap.
#[derive(Clone)]
pub struct Settings {
    tls: Arc<rustls::ClientConfig>,
    /// For the connection to an `https://` proxy itself, which is asked
    /// for a tunnel or a forward in HTTP/1, so offers no ALPN (as reqwest).
    tls_proxy: Arc<rustls::ClientConfig>,
    proxies: Option<Arc<Matcher>>,
    connect_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
#[error("TLS: {0}")]
pub struct TlsError(#[from] rustls::Error);

impl Settings {
    /// `proxies`: where connections go through a proxy; `None` for none
    /// (a `mock://` upstream, on loopback).
    pub fn new(proxies: Option<Matcher>, connect_timeout: Duration) -> Result<Self, TlsError> {
        // reqwest's `rustls-tls`: ring, TLS 1.2 and 1.3, the webpki roots.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_webpki_roots()
            .with_no_client_auth();
        let tls_proxy = Arc::new(tls.clone());
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self {
            tls: Arc::new(tls),
            tls_proxy,
            proxies: proxies.map(Arc::new),
            connect_timeout,
        })
    }

    /// The environment's proxies (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`,
    /// `NO_PROXY` and their lower-case forms), read as reqwest read them.
    pub fn env_proxies() -> Matcher {
        Matcher::from_system()
    }

    /// The `Proxy-Authorization` a request to `dst` carries: only a plain
    /// HTTP request forwarded by a proxy with credentials in its URL (a
    /// tunnel sends them in its CONNECT instead). An upstream's host is
    /// fixed, so this is asked once, not per request.
    pub fn forward_authorization(&self, dst: &Uri) -> Option<HeaderValue> {
        if dst.scheme() != Some(&Scheme::HTTP) {
            return None;
        }
        let proxy = self.proxies.as_ref()?.intercept(dst)?;
        match proxy.uri().scheme_str() {
            Some("http" | "https") => proxy.basic_auth().cloned(),
            _ => None,
        }
    }
}

/// A pooled client: its connections are kept alive for the next request.
pub struct Client {
    inner: Pooled,
}

impl Client {
    pub fn new(settings: &Settings) -> Self {
        let mut http = HttpConnector::new();
        // reqwest's TCP defaults.
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(settings.connect_timeout));
        http.set_keepalive(Some(Duration::from_secs(15)));
        http.set_keepalive_interval(Some(Duration::from_secs(15)));
        http.set_keepalive_retries(Some(3));
        #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
        http.set_tcp_user_timeout(Some(Duration::from_secs(30)));
        let connector = Connector {
            http,
            settings: settings.clone(),
        };
        let inner = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        Self { inner }
    }

    /// Sends `req` and waits for the answer's head.
    pub async fn request(&self, req: Request<Full<Bytes>>) -> Result<Response, SendError> {
        self.inner.request(req).await.map_err(SendError)
    }
}

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct SendError(hyper_util::client::legacy::Error);

impl SendError {
    /// The connection was not made in `connect_timeout_secs`.
    pub fn is_timeout(&self) -> bool {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&self.0);
        while let Some(e) = source {
            if e.is::<ConnectTimeout>()
                || e.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
                || e.downcast_ref::<hyper::Error>()
                    .is_some_and(hyper::Error::is_timeout)
            {
                return true;
            }
            source = e.source();
        }
        false
    }
}

/// The body of an answer, piece by piece.
pub fn body(resp: Response) -> BodyStream {
    resp.into_body().into_data_stream()
}

#[derive(Debug, thiserror::Error)]
#[error("no connection within {} s (connect_timeout_secs)", .0.as_secs())]
struct ConnectTimeout(Duration);

/// Makes the connections: directly, through an HTTP proxy, or tunnelled
/// through one. Called per new connection only.
#[derive(Clone)]
struct Connector {
    http: HttpConnector,
    settings: Settings,
}

impl tower_service::Service<Uri> for Connector {
    type Response = Conn;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Conn, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let this = self.clone();
        // The whole of it, proxy and TLS handshake included, as reqwest.
        let limit = self.settings.connect_timeout;
        Box::pin(async move {
            match tokio::time::timeout(limit, this.connect(dst)).await {
                Ok(conn) => conn,
                Err(_) => Err(ConnectTimeout(limit).into()),
            }
        })
    }
}

impl Connector {
    async fn connect(self, dst: Uri) -> Result<Conn, BoxError> {
        let Settings {
            tls,
            tls_proxy,
            proxies,
            ..
        } = self.settings;
        let Some(proxy) = proxies.as_ref().and_then(|m| m.intercept(&dst)) else {
            let io = HttpsConnector::from((self.http, tls)).call(dst).await?;
            return Ok(Conn::new(MaybeHttpsStream::Http(io), false));
        };
        // A proxy of another scheme (socks) fails here with the scheme named.
        let mut to_proxy = HttpsConnector::from((self.http, tls_proxy));
        if dst.scheme() != Some(&Scheme::HTTPS) {
            // Plain HTTP is forwarded: requests go in absolute form.
            let io = to_proxy.call(proxy.uri().clone()).await?;
            return Ok(Conn::new(MaybeHttpsStream::Http(io), true));
        }
        let mut tunnel = Tunnel::new(proxy.uri().clone(), to_proxy);
        if let Some(auth) = proxy.basic_auth() {
            tunnel = tunnel.with_auth(auth.clone());
        }
        let mut headers = HeaderMap::new();
        headers.insert(USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE));
        tunnel = tunnel.with_headers(headers);
        let io = HttpsConnector::from((tunnel, tls)).call(dst).await?;
        Ok(Conn::new(io, false))
    }
}

/// A connection as the pool holds it: to the upstream, or to a proxy that
/// forwards (`forwarded`), or TLS inside a proxy's tunnel.
struct Conn {
    io: MaybeHttpsStream<MaybeHttpsStream<TokioIo<TcpStream>>>,
    forwarded: bool,
}

impl Conn {
    fn new(io: MaybeHttpsStream<MaybeHttpsStream<TokioIo<TcpStream>>>, forwarded: bool) -> Self {
        Self { io, forwarded }
    }
}

impl Connection for Conn {
    fn connected(&self) -> Connected {
        // `proxy(true)` is what makes the pool send absolute-form URIs.
        self.io.connected().proxy(self.forwarded)
    }
}

impl Read for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl Write for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(proxy: &str) -> Settings {
        let proxies = Matcher::builder().all(proxy).no("localhost").build();
        Settings::new(Some(proxies), Duration::from_secs(1)).unwrap()
    }

    #[test]
    fn offers_http2_to_upstreams_but_not_to_proxies() {
        let s = settings("http://127.0.0.1:9");
        assert_eq!(s.tls.alpn_protocols, [&b"h2"[..], &b"http/1.1"[..]]);
        assert!(s.tls_proxy.alpn_protocols.is_empty());
    }

    #[test]
    fn only_a_forwarded_request_carries_the_proxys_credentials() {
        let s = settings("http://user:secret@127.0.0.1:9");
        let auth = |uri: &'static str| s.forward_authorization(&Uri::from_static(uri));
        assert_eq!(
            auth("http://api.example/v1").unwrap(),
            "Basic dXNlcjpzZWNyZXQ="
        );
        // A tunnel sends them on its CONNECT; NO_PROXY hosts go direct.
        assert!(auth("https://api.example/v1").is_none());
        assert!(auth("http://localhost/v1").is_none());
        assert!(settings("http://127.0.0.1:9")
            .forward_authorization(&Uri::from_static("http://api.example/v1"))
            .is_none());
    }
}
