//! The LLM servers recall forwards to: routing by model, sending, and which
//! headers cross in each direction.

use std::sync::Arc;
use std::time::Duration;

use axum::http::header::{
    ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST, PROXY_AUTHORIZATION, USER_AGENT,
};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};
use bytes::Bytes;
use http_body_util::Full;
use wildmatch::WildMatch;

use crate::config::{MockKind, UpstreamConfig};
use crate::error::UpstreamError;
use crate::proxy::client::{self, BodyStream, Client, Response, Settings};
use crate::proxy::cut::Cut;
use crate::proxy::gate::{Gate, Slot};
use crate::proxy::idle::IdleLimit;
use crate::proxy::mock::{MockServer, Pace};
use crate::proxy::protocol::{Protocol, VendorRules};

/// Request headers a client sets that the upstream must see.
const FORWARDED_REQUEST_HEADERS: [HeaderName; 3] = [
    HeaderName::from_static("openai-organization"),
    HeaderName::from_static("openai-project"),
    HeaderName::from_static("openai-beta"),
];

pub struct Upstream {
    pub name: String,
    /// What the upstream speaks: the turn's path, body and answer shapes.
    pub protocol: Protocol,
    pub rules: VendorRules,
    /// Where a call that fails before its first byte is made once more.
    pub fallback: Option<String>,
    base_url: String,
    /// Where a turn goes (`{base_url}` and the protocol's path), parsed
    /// once: parsing it per request (IDNA and all) showed in the proxy's
    /// profile at full load.
    turn_url: Uri,
    /// `Bearer {key}`, marked sensitive so that it is never logged.
    authorization: Option<HeaderValue>,
    /// Basic credentials written into `base_url` (`https://user:pass@...`),
    /// sent when no key is: as reqwest took them from the URL.
    url_authorization: Option<HeaderValue>,
    patterns: Vec<WildMatch>,
    /// The configured headers, with recall's user agent, reqwest's
    /// `accept: */*` and (plain http) the `host` hyper would write where
    /// they set none, the API key's `authorization` and a forwarding
    /// proxy's credentials: every request's, built once.
    headers: HeaderMap,
    timeout: Duration,
    /// The longest silence allowed while reading an answer's body.
    read_timeout: Duration,
    /// One client (and so one connection pool) per serving thread, so
    /// that a request's upstream connection lives on its own thread.
    clients: Box<[Client]>,
    /// The built-in server this upstream calls, for a `mock://` base URL;
    /// it lives as long as the upstream.
    mock: Option<MockServer>,
    /// `max_concurrent`, when set.
    gate: Option<Arc<Gate>>,
}

#[derive(Debug, thiserror::Error)]
#[error("{name}: {message}")]
pub struct BuildError {
    name: String,
    message: String,
}

impl BuildError {
    pub fn new(name: &str, e: impl std::fmt::Display) -> Self {
        Self {
            name: name.to_owned(),
            message: e.to_string(),
        }
    }
}

impl Upstream {
    /// Builds the upstream, and for a `mock://` base URL starts its mock
    /// server first.
    pub async fn start(c: &UpstreamConfig, threads: usize) -> Result<Self, BuildError> {
        let fail = |message: String| BuildError::new(&format!("upstream `{}`", c.name), message);
        let mock = match MockKind::from_base_url(&c.base_url) {
            None => None,
            Some(Err(e)) => return Err(fail(e.to_string())),
            Some(Ok(kind)) => Some(
                MockServer::start(kind, Pace::of(c))
                    .await
                    .map_err(|e| fail(format!("cannot start the mock upstream: {e}")))?,
            ),
        };
        // The mock is on loopback: an HTTP(S)_PROXY set for the real
        // upstreams must not carry it off the machine.
        let proxies = mock.is_none().then(Settings::env_proxies);
        let settings = Settings::new(proxies, Duration::from_secs(c.connect_timeout_secs))
            .map_err(|e| fail(e.to_string()))?;
        let clients = (0..threads.max(1))
            .map(|_| Client::new(&settings))
            .collect();
        let mut headers = HeaderMap::new();
        for (k, v) in &c.headers {
            let name = HeaderName::try_from(k.as_str()).map_err(|e| fail(e.to_string()))?;
            let value = HeaderValue::try_from(v.as_str()).map_err(|e| fail(e.to_string()))?;
            headers.insert(name, value);
        }
        let authorization = c
            .api_key_env
            .as_deref()
            .and_then(|var| std::env::var(var).ok())
            .filter(|k| !k.is_empty())
            .map(|key| {
                let mut v = HeaderValue::try_from(format!("Bearer {key}"))
                    .map_err(|_| fail("the API key is not a valid header value".into()))?;
                v.set_sensitive(true);
                Ok(v)
            })
            .transpose()?;
        let base_url = match &mock {
            Some(server) => server.base_url(),
            None => c.base_url.trim_end_matches('/').to_owned(),
        };
        let protocol = Protocol::of(c);
        let (turn_url, url_authorization) =
            request_uri(&format!("{base_url}{}", protocol.turn_path()))
                .map_err(|e| fail(format!("base_url: {e}")))?;
        // What reqwest added to every request unless it was set.
        headers
            .entry(USER_AGENT)
            .or_insert(HeaderValue::from_static(client::USER_AGENT_VALUE));
        headers
            .entry(ACCEPT)
            .or_insert(HeaderValue::from_static("*/*"));
        if let Some(auth) = settings.forward_authorization(&turn_url) {
            headers.entry(PROXY_AUTHORIZATION).or_insert(auth);
        }
        // hyper's client writes it on every HTTP/1 request that has none
        // (a `format!` for a port); every URI here has `base_url`'s
        // authority. Plain http only: over TLS the upstream may choose
        // HTTP/2, where hyper sends `:authority` and no `host`.
        if turn_url.scheme_str() == Some("http") {
            if let Some(host) = host_header(&turn_url) {
                headers.entry(HOST).or_insert(host);
            }
        }
        if let Some(key) = &authorization {
            headers.insert(AUTHORIZATION, key.clone());
        }
        Ok(Self {
            name: c.name.clone(),
            protocol,
            rules: VendorRules::from_config(c),
            fallback: c.fallback.clone(),
            base_url,
            turn_url,
            authorization,
            url_authorization,
            patterns: c.models.iter().map(|p| WildMatch::new(p)).collect(),
            headers,
            timeout: Duration::from_secs(c.timeout_secs),
            read_timeout: Duration::from_secs(c.read_timeout_secs),
            clients,
            mock,
            gate: (c.max_concurrent > 0).then(|| Gate::new(c.max_concurrent)),
        })
    }

    /// The URL requests go to: the configured one, or a mock's own.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The built-in server behind a `mock://` upstream, if this is one.
    pub fn mock(&self) -> Option<&MockServer> {
        self.mock.as_ref()
    }

    /// A slot for a live call under `max_concurrent` (none without a
    /// limit), waited for in order within `timeout_secs`.
    pub async fn slot(&self) -> Result<Option<Slot>, UpstreamError> {
        let Some(gate) = &self.gate else {
            return Ok(None);
        };
        tokio::time::timeout(self.timeout, gate.acquire())
            .await
            .map(Some)
            .map_err(|_| UpstreamError::Busy {
                upstream: self.name.clone(),
                limit: gate.limit(),
                secs: self.timeout.as_secs(),
            })
    }

    /// A slot for one of recall's own background calls under
    /// `max_concurrent` (none without a limit): given only while no live
    /// call waits, waited for within `within`. `ask` is cut when a live
    /// call needs the slot back; the holder must then drop it.
    pub async fn background_slot(
        &self,
        ask: Arc<Cut>,
        within: Duration,
    ) -> Result<Option<Slot>, UpstreamError> {
        let Some(gate) = &self.gate else {
            return Ok(None);
        };
        tokio::time::timeout(within, gate.background(ask))
            .await
            .map(Some)
            .map_err(|_| UpstreamError::Busy {
                upstream: self.name.clone(),
                limit: gate.limit(),
                secs: self.timeout.as_secs(),
            })
    }

    /// How long a call may wait for a slot, and then for the response
    /// headers (`timeout_secs`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn serves(&self, model: &str) -> bool {
        self.patterns.iter().any(|p| p.matches(model))
    }

    /// Sends a request and waits for the response headers. `path` is relative
    /// to the base URL, e.g. `/models`.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        client_headers: &HeaderMap,
        body: Option<Bytes>,
    ) -> Result<Response, UpstreamError> {
        let (uri, _) = request_uri(&format!("{}{}", self.base_url, path)).map_err(|e| {
            UpstreamError::Unreachable {
                upstream: self.name.clone(),
                reason: format!("bad URL: {e}"),
            }
        })?;
        self.send_to(method, &uri, client_headers, body).await
    }

    /// Sends a turn (a body `protocol.turn_body` wrote) and waits for the
    /// response headers.
    pub async fn send_turn(
        &self,
        client_headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response, UpstreamError> {
        self.send_to(Method::POST, &self.turn_url, client_headers, Some(body))
            .await
    }

    async fn send_to(
        &self,
        method: Method,
        uri: &Uri,
        client_headers: &HeaderMap,
        body: Option<Bytes>,
    ) -> Result<Response, UpstreamError> {
        // `clients` is never empty: `start` builds at least one.
        let client = &self.clients[super::client::serving_thread() % self.clients.len()];
        let mut headers = self.request_headers(client_headers);
        let body = match body {
            Some(body) => {
                headers.append(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                Full::new(body)
            }
            None => Full::default(),
        };
        let mut req = Request::new(body);
        *req.method_mut() = method;
        *req.headers_mut() = headers;
        *req.uri_mut() = uri.clone();
        match tokio::time::timeout(self.timeout, client.request(req)).await {
            Err(_) => Err(self.timeout_error()),
            Ok(Err(e)) if e.is_timeout() => Err(self.timeout_error()),
            Ok(Err(e)) => Err(UpstreamError::Unreachable {
                upstream: self.name.clone(),
                reason: format!("error sending request for url ({uri}): {}", error_chain(&e)),
            }),
            Ok(Ok(resp)) => Ok(resp),
        }
    }

    /// The answer's body, ending in an error once the upstream has been
    /// silent for `read_timeout_secs`.
    pub fn body(&self, resp: Response) -> IdleLimit<BodyStream> {
        IdleLimit::new(client::body(resp), self.read_timeout)
    }

    pub fn timeout_error(&self) -> UpstreamError {
        UpstreamError::Timeout {
            upstream: self.name.clone(),
            secs: self.timeout.as_secs(),
        }
    }

    /// An API key's `authorization` is in `headers` already; without one,
    /// the client's goes through.
    fn request_headers(&self, client: &HeaderMap) -> HeaderMap {
        let mut out = self.headers.clone();
        if self.authorization.is_none() {
            if let Some(v) = client.get(AUTHORIZATION) {
                out.insert(AUTHORIZATION, v.clone());
            } else if let Some(v) = &self.url_authorization {
                // Under a configured `authorization` header, as reqwest.
                out.entry(AUTHORIZATION).or_insert_with(|| v.clone());
            }
        }
        for name in &FORWARDED_REQUEST_HEADERS {
            if let Some(v) = client.get(name) {
                out.insert(name.clone(), v.clone());
            }
        }
        out
    }
}

/// The `host` hyper's client writes for `uri` on HTTP/1: the port only
/// where it is not the scheme's own.
fn host_header(uri: &Uri) -> Option<HeaderValue> {
    let host = uri.host()?;
    let default = if uri.scheme_str() == Some("https") {
        443
    } else {
        80
    };
    match uri.port_u16() {
        Some(port) if port != default => HeaderValue::try_from(format!("{host}:{port}")).ok(),
        _ => HeaderValue::try_from(host).ok(),
    }
}

/// Response headers relayed to the client: the ones the OpenAI SDKs and
/// agents read (request id, rate limits, retry hints, processing time).
pub fn relayed_response_headers(upstream: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in upstream {
        let n = name.as_str();
        if n == "x-request-id" {
            // recall's own request id takes this name on the response.
            out.append("x-upstream-request-id", value.clone());
        } else if n == "content-type"
            || n == "retry-after"
            || n == "retry-after-ms"
            || n == "x-should-retry"
            || n.starts_with("openai-")
            || n.starts_with("x-ratelimit-")
        {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

/// The client's top-level message hides the cause ("client error
/// (Connect)"); the chain says what actually happened (connection refused,
/// DNS, TLS).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// A request's URI from a URL, and the Basic credentials the URL held.
/// Parsed as a URL first, as reqwest did: the host lower-cased and
/// IDNA-encoded, characters a URI refuses percent-encoded, dot segments
/// resolved.
fn request_uri(text: &str) -> Result<(Uri, Option<HeaderValue>), String> {
    let mut url = url::Url::parse(text).map_err(|e| e.to_string())?;
    let mut authorization = None;
    if !url.username().is_empty() || url.password().is_some() {
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        let user = decode(url.username());
        let password = url.password().map(decode).unwrap_or_default();
        let encoded = base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            format!("{user}:{password}"),
        );
        let mut v = HeaderValue::try_from(format!("Basic {encoded}")).map_err(|e| e.to_string())?;
        v.set_sensitive(true);
        authorization = Some(v);
        // Both always succeed on an http(s) URL; the URI refuses user info.
        let _ = url.set_username("");
        let _ = url.set_password(None);
    }
    url.set_fragment(None);
    let uri = Uri::try_from(url.as_str()).map_err(|e| e.to_string())?;
    Ok((uri, authorization))
}

/// All configured upstreams, in config order.
pub struct Upstreams {
    list: Vec<Arc<Upstream>>,
}

impl Upstreams {
    /// Builds every upstream, starting the mock servers of `mock://` ones;
    /// must be called inside a tokio runtime.
    pub async fn start(configs: &[UpstreamConfig], threads: usize) -> Result<Self, BuildError> {
        let mut list = Vec::with_capacity(configs.len());
        for c in configs {
            list.push(Arc::new(Upstream::start(c, threads).await?));
        }
        Ok(Self { list })
    }

    /// The first upstream whose model patterns match.
    pub fn route(&self, model: &str) -> Option<&Arc<Upstream>> {
        self.list.iter().find(|u| u.serves(model))
    }

    pub fn first(&self) -> Option<&Arc<Upstream>> {
        self.list.first()
    }

    /// The upstream a failed call to `u` is made once more on.
    pub fn fallback_of(&self, u: &Upstream) -> Option<&Arc<Upstream>> {
        let name = u.fallback.as_deref()?;
        self.list.iter().find(|o| o.name == name)
    }

    /// In config order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Upstream>> {
        self.list.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(name: &str, models: &[&str]) -> UpstreamConfig {
        let text = format!(
            "name = {name:?}\nbase_url = \"http://127.0.0.1:9/v1/\"\nmodels = {models:?}\n"
        );
        toml::from_str(&text).unwrap()
    }

    #[tokio::test]
    async fn first_matching_pattern_wins() {
        let ups = Upstreams::start(
            &[
                upstream("local", &["llama-*", "qwen?"]),
                upstream("openai", &["*"]),
            ],
            1,
        )
        .await
        .unwrap();
        assert_eq!(ups.route("llama-3").unwrap().name, "local");
        assert_eq!(ups.route("qwen2").unwrap().name, "local");
        assert_eq!(ups.route("qwen25").unwrap().name, "openai");
        let only = Upstreams::start(&[upstream("local", &["llama-*"])], 1)
            .await
            .unwrap();
        assert!(only.route("gpt-4o").is_none());
    }

    #[test]
    fn host_is_what_hypers_client_writes() {
        for (url, host) in [
            ("http://127.0.0.1:9/v1/chat/completions", "127.0.0.1:9"),
            (
                "https://api.openai.com/v1/chat/completions",
                "api.openai.com",
            ),
            ("http://llm.local:80/v1", "llm.local"),
            ("https://llm.local:443/v1", "llm.local"),
            ("http://llm.local:443/v1", "llm.local:443"),
            ("https://llm.local:8443/v1", "llm.local:8443"),
            ("http://[::1]:8080/v1", "[::1]:8080"),
        ] {
            let (uri, _) = request_uri(url).unwrap();
            assert_eq!(host_header(&uri).unwrap(), host, "{url}");
        }
    }

    /// A server that answers `{}` to each request and hands over the
    /// request's head.
    async fn heads() -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = conn.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buf[..n]);
                        let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") else {
                            continue;
                        };
                        let head = String::from_utf8_lossy(&seen[..end]).to_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length: "))
                            .map_or(0, |n| n.trim().parse().unwrap());
                        if seen.len() < end + 4 + length {
                            continue;
                        }
                        seen.drain(..end + 4 + length);
                        let _ = tx.send(head);
                        let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                                      content-length: 2\r\n\r\n{}";
                        if conn.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (format!("127.0.0.1:{port}"), rx)
    }

    fn host_lines(head: &str) -> Vec<&str> {
        head.lines().filter(|l| l.starts_with("host:")).collect()
    }

    #[tokio::test]
    async fn the_host_sent_is_the_one_hypers_client_writes() {
        let (addr, mut rx) = heads().await;
        let port = addr.rsplit(':').next().unwrap();
        for base in [
            format!("http://{addr}/v1"),
            format!("http://localhost:{port}/v1"),
        ] {
            let hyper =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build_http::<Full<Bytes>>();
            let uri: Uri = format!("{base}/chat/completions").parse().unwrap();
            let mut req = Request::new(Full::new(Bytes::from_static(b"{}")));
            *req.method_mut() = Method::POST;
            *req.uri_mut() = uri;
            hyper.request(req).await.unwrap();
            let theirs = rx.recv().await.unwrap();

            let config: UpstreamConfig =
                toml::from_str(&format!("name = \"u\"\nbase_url = \"{base}\"\n")).unwrap();
            let ours = Upstream::start(&config, 1).await.unwrap();
            ours.send_turn(&HeaderMap::new(), Bytes::from_static(b"{}"))
                .await
                .unwrap();
            let ours = rx.recv().await.unwrap();
            assert_eq!(host_lines(&ours), host_lines(&theirs), "{base}");
            assert_eq!(host_lines(&ours).len(), 1, "{ours}");
        }
    }

    #[tokio::test]
    async fn configured_host_and_authorization_headers_keep_their_precedence() {
        let text = "name = \"u\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
                    [headers]\nhost = \"llm.internal\"\nauthorization = \"Bearer configured\"\n";
        let config: UpstreamConfig = toml::from_str(text).unwrap();
        let u = Upstream::start(&config, 1).await.unwrap();
        let sent = u.request_headers(&HeaderMap::new());
        assert_eq!(sent[HOST], "llm.internal");
        assert_eq!(sent[AUTHORIZATION], "Bearer configured");
        // A client's authorization goes through over a configured one, as
        // before; an API key would replace both.
        let mut client = HeaderMap::new();
        client.insert(AUTHORIZATION, HeaderValue::from_static("Bearer client"));
        let sent = u.request_headers(&client);
        assert_eq!(sent[AUTHORIZATION], "Bearer client");
        assert_eq!(sent.get_all(HOST).iter().count(), 1);
        // Over TLS the upstream may answer in HTTP/2, which has no `host`.
        let tls: UpstreamConfig =
            toml::from_str("name = \"t\"\nbase_url = \"https://127.0.0.1:9/v1\"\n").unwrap();
        let tls = Upstream::start(&tls, 1).await.unwrap();
        assert!(tls.request_headers(&HeaderMap::new()).get(HOST).is_none());
    }

    #[tokio::test]
    async fn a_key_replaces_the_clients_authorization_and_the_client_s_goes_through_without_one() {
        let mut client = HeaderMap::new();
        client.insert(AUTHORIZATION, HeaderValue::from_static("Bearer client"));
        client.insert("openai-project", HeaderValue::from_static("p1"));
        client.insert("x-other", HeaderValue::from_static("no"));
        let var = "RECALL_TEST_UPSTREAM_KEY_HEADERS";
        std::env::set_var(var, "sk-configured");
        let mut keyed = upstream("keyed", &["*"]);
        keyed.api_key_env = Some(var.into());
        let keyed = Upstream::start(&keyed, 1).await.unwrap();
        let plain = Upstream::start(&upstream("plain", &["*"]), 1)
            .await
            .unwrap();
        let sent = keyed.request_headers(&client);
        assert_eq!(sent[AUTHORIZATION], "Bearer sk-configured");
        assert_eq!(sent["openai-project"], "p1");
        assert_eq!(sent[HOST], "127.0.0.1:9");
        assert!(sent.get("x-other").is_none());
        let sent = plain.request_headers(&client);
        assert_eq!(sent[AUTHORIZATION], "Bearer client");
        assert_eq!(sent.get_all(AUTHORIZATION).iter().count(), 1);
    }

    #[test]
    fn relays_only_client_relevant_headers() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("x-request-id", "r1"),
            ("openai-processing-ms", "5"),
            ("x-ratelimit-remaining-tokens", "9"),
            ("retry-after", "1"),
            ("content-type", "text/event-stream"),
            ("content-length", "10"),
            ("set-cookie", "a=b"),
            ("connection", "close"),
        ] {
            h.insert(k, HeaderValue::from_static(v));
        }
        let out = relayed_response_headers(&h);
        let mut names: Vec<_> = out.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "content-type",
                "openai-processing-ms",
                "retry-after",
                "x-ratelimit-remaining-tokens",
                "x-upstream-request-id"
            ]
        );
    }
}
