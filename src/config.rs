//! The TOML configuration: its shape, its defaults and the checks that run
//! before the server starts. Every key is documented in the README.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::mock::MockKind;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config file {path}: `{key}` {message}")]
    Invalid {
        path: PathBuf,
        key: String,
        message: String,
    },
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub session: SessionConfig,
    #[serde(default)]
    pub history: HistoryConfig,
    #[serde(default)]
    pub interruption: InterruptionConfig,
    #[serde(default)]
    pub storage: StorageConfig,
    #[serde(default)]
    pub webhook: WebhookConfig,
    #[serde(default)]
    pub cache: CacheConfig,
    #[serde(default)]
    pub admin: AdminConfig,
    #[serde(default)]
    pub auth: AuthConfig,
    #[serde(default)]
    pub log: LogConfig,
    #[serde(default)]
    pub system_messages: Vec<SystemMessage>,
    #[serde(default)]
    pub upstreams: Vec<UpstreamConfig>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub listen: String,
    pub max_body_bytes: usize,
    /// Upstream calls in flight at once (0 = no limit); past it, chat
    /// requests are answered 503 at once, before anything is stored.
    pub max_concurrent_upstream: usize,
    /// Largest total size of a request's header names and values.
    pub max_header_bytes: usize,
    /// On SIGTERM, how long replies in flight may take to finish before
    /// they are recorded as interrupted.
    pub shutdown_grace_secs: u64,
    /// How long a client may take to send its whole request body. A body
    /// that never ends would otherwise hold its connection and task forever.
    pub request_body_timeout_secs: u64,
    /// Most messages one chat request may carry. Every message is parsed,
    /// reconciled and may be stored, so a request of a million tiny
    /// messages is refused up front rather than written to storage.
    pub max_request_messages: usize,
    /// Threads serving requests; 0 = one per CPU. Each runs a runtime of
    /// its own and keeps its own upstream connections, and a connection
    /// stays on the thread it was handed to. Fewer than the CPUs leaves the
    /// rest to what shares the machine (the agent, a load generator).
    pub worker_threads: usize,
}

impl ServerConfig {
    /// `worker_threads`, with 0 resolved to the number of CPUs.
    pub fn serving_threads(&self) -> usize {
        match self.worker_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            max_body_bytes: 4 * 1024 * 1024,
            max_concurrent_upstream: 1024,
            max_header_bytes: 32 * 1024,
            shutdown_grace_secs: 30,
            request_body_timeout_secs: 30,
            // The largest `messages` array Azure OpenAI accepts.
            max_request_messages: 2048,
            worker_threads: 0,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    pub backend: StorageBackend,
    /// SQLite: the database file.
    pub path: String,
    /// SQLite: `normal` survives a crash of the process, `full` also a
    /// power loss (an fsync per group commit).
    pub sync: SyncMode,
    /// Redis: e.g. `redis://127.0.0.1:6379`.
    pub url: Option<String>,
    /// Redis: prefix of every key and channel.
    pub key_prefix: String,
    /// Redis: how long a replica's claim on a session lasts unless renewed
    /// (a dead replica blocks a session at most this long).
    pub lease_ms: u64,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            backend: StorageBackend::Memory,
            path: "data/recall.db".into(),
            sync: SyncMode::Normal,
            url: None,
            key_prefix: "recall".into(),
            lease_ms: 10_000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageBackend {
    Memory,
    Sqlite,
    Redis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    Normal,
    Full,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionConfig {
    pub header: String,
    pub required: bool,
    /// Header naming the speaking user; stored as `metadata.user`.
    pub user_header: String,
    pub require_user: bool,
    /// A session idle this long ends (0 = never).
    pub ttl_secs: u64,
    /// Past this many sessions the least recently active one ends.
    pub max_sessions: usize,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            header: "x-session-id".into(),
            required: false,
            user_header: "x-user-id".into(),
            require_user: false,
            ttl_secs: 3600,
            max_sessions: 100_000,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookConfig {
    /// Where events are POSTed; unset = no webhook.
    pub url: Option<String>,
    /// Environment variable holding the signing secret (`webhook-signature`,
    /// HMAC-SHA256): a `whsec_` secret is the base64 of the key, any other
    /// is the key's bytes.
    pub secret_env: Option<String>,
    /// Which events are delivered: `session_ended`, `history_trimmed`,
    /// `history_rewritten`.
    pub events: Vec<String>,
    /// Attempts after the first before an event is given up (and logged).
    pub max_retries: u32,
    /// Delay before the first retry; it doubles with each retry.
    pub retry_backoff_ms: u64,
    pub timeout_secs: u64,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            url: None,
            secret_env: None,
            events: vec!["session_ended".into()],
            max_retries: 5,
            retry_backoff_ms: 500,
            timeout_secs: 10,
        }
    }
}

/// No model reads this many tokens: a larger `window_tokens` is a typo,
/// not a wish.
pub const MAX_WINDOW_TOKENS: usize = 100_000_000;

pub const WEBHOOK_EVENTS: &[&str] = &["session_ended", "history_trimmed", "history_rewritten"];

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Answer a repeated user message from memory instead of the upstream.
    pub exact_match: bool,
    pub scope: CacheScope,
    pub ttl_secs: u64,
    pub max_entries: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            exact_match: false,
            scope: CacheScope::Session,
            ttl_secs: 3600,
            max_entries: 10_000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheScope {
    Session,
    Global,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Environment variable holding the bearer token the `/v1/sessions`
    /// routes require. Unset variable: the routes are open.
    pub token_env: Option<String>,
}

/// Client keys: when either is set, chat requests need one of them as a
/// bearer token, and each key sees only its own sessions.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Environment variable holding the keys, comma-separated.
    pub api_keys_env: Option<String>,
    /// A file of keys, one per line (`#` starts a comment line).
    pub api_keys_file: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HistoryConfig {
    /// How many of the newest stored messages are sent upstream (0 = all).
    pub window_messages: usize,
    /// Upper bound on the characters of the history sent upstream (0 = none).
    pub window_chars: usize,
    /// Upper bound on the tokens of the history sent upstream, counted with
    /// the model's tokenizer (estimated for non-OpenAI models) (0 = none).
    pub window_tokens: usize,
    /// How many messages a session keeps (0 = all).
    pub max_messages: usize,
    /// Bytes of text a session keeps (`Message::byte_cost`), oldest
    /// dropped first, like `max_messages` (0 = no limit).
    pub max_bytes: usize,
    /// When set, a failed upstream call is recorded as an assistant message
    /// with this content and `metadata.source = "llm_failure"`.
    pub failure_message: Option<String>,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        Self {
            window_messages: 20,
            window_chars: 0,
            window_tokens: 0,
            max_messages: 1000,
            max_bytes: 4 * 1024 * 1024,
            failure_message: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct InterruptionConfig {
    /// Keep reading the upstream after the client has gone, to store the
    /// complete reply as `metadata.original`.
    pub capture_original: bool,
    pub drain_timeout_secs: u64,
    pub drain_max_bytes: usize,
    pub on_new_request: OnNewRequest,
}

impl Default for InterruptionConfig {
    fn default() -> Self {
        Self {
            capture_original: true,
            drain_timeout_secs: 30,
            drain_max_bytes: 1024 * 1024,
            on_new_request: OnNewRequest::Interrupt,
        }
    }
}

/// What a request does when its session still has a reply in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnNewRequest {
    /// Barge-in: the reply in flight is recorded as interrupted.
    Interrupt,
    /// The new request gets 409.
    Reject,
}

/// How an interrupted reply is shown to the model in later turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum InterruptedRendering {
    /// The text that went out, as stored.
    #[default]
    Truncated,
    /// The complete text the model generated.
    Original,
    /// The text that went out followed by a marker.
    Annotated,
}

/// What an upstream is sent of the conversational extension fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    /// OpenAI's fields only: `turn_id`, `timestamp` and `metadata` are
    /// stripped, as OpenAI rejects unknown fields.
    #[default]
    Openai,
    /// Every field, plus `turn_id`, `timestamp` and `interruptable`.
    Custom,
}

impl Vendor {
    pub fn as_str(self) -> &'static str {
        match self {
            Vendor::Openai => "openai",
            Vendor::Custom => "custom",
        }
    }
}

/// Which sequences of roles an upstream accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Roles {
    /// Any order (OpenAI and most servers).
    #[default]
    Any,
    /// User and assistant alternate, as strict chat templates (Mistral,
    /// Gemma) require: messages of one role in a row are merged.
    Alternate,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A `tracing` filter such as `info` or `recall=debug`; `RUST_LOG` wins.
    pub level: String,
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: "info".into(),
            format: LogFormat::Text,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SystemMessage {
    #[serde(default = "default_system_role")]
    pub role: String,
    pub content: String,
    #[serde(default)]
    pub name: Option<String>,
}

fn default_system_role() -> String {
    "system".into()
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    pub name: String,
    pub base_url: String,
    /// Environment variable holding the API key. When it is unset or empty the
    /// client's own `Authorization` header is forwarded instead.
    #[serde(default)]
    pub api_key_env: Option<String>,
    #[serde(default)]
    pub vendor: Vendor,
    #[serde(default = "default_models")]
    pub models: Vec<String>,
    /// Extra top-level body fields removed before the request goes upstream.
    #[serde(default)]
    pub strip_fields: Vec<String>,
    /// Sent as the top-level `interruptable` field in vendor "custom" mode.
    #[serde(default = "default_true")]
    pub interruptable: bool,
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_secs: u64,
    /// Time allowed until the upstream's response headers arrive (the
    /// first byte).
    #[serde(default = "default_timeout", alias = "first_byte_timeout_secs")]
    pub timeout_secs: u64,
    /// Longest silence allowed between two reads of the response body
    /// (between two chunks of a stream).
    #[serde(default = "default_read_timeout", alias = "idle_timeout_secs")]
    pub read_timeout_secs: u64,
    /// Another upstream's name: a call that cannot connect, or that gets a
    /// 5xx before any byte of an answer, is made once more there.
    #[serde(default)]
    pub fallback: Option<String>,
    /// Static headers added to every upstream request (e.g. Azure's `api-key`).
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub interrupted: InterruptedRendering,
    #[serde(default = "default_marker")]
    pub interrupted_marker: String,
    /// What the upstream's chat template accepts of roles in a row.
    #[serde(default)]
    pub roles: Roles,
    /// The most requests recall has open to this upstream at once (0: no
    /// limit). Live turns come first: a drain of a cut reply holds a slot
    /// only while no live request waits.
    #[serde(default)]
    pub max_concurrent: usize,
    /// `mock://` upstreams only: the wait before each streamed content
    /// chunk. Unset: `mock::DEFAULT_CHUNK_DELAY_MS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mock_chunk_delay_ms: Option<u64>,
    /// `mock://` upstreams only: words per streamed content chunk. Unset:
    /// `mock::DEFAULT_WORDS_PER_CHUNK`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mock_words_per_chunk: Option<usize>,
}

fn default_marker() -> String {
    " [interrupted by user]".into()
}

fn default_models() -> Vec<String> {
    vec!["*".into()]
}
fn default_true() -> bool {
    true
}
fn default_connect_timeout() -> u64 {
    10
}
fn default_timeout() -> u64 {
    120
}
fn default_read_timeout() -> u64 {
    120
}

impl UpstreamConfig {
    pub fn is_custom(&self) -> bool {
        self.vendor == Vendor::Custom
    }

    /// Whether `base_url` names a built-in mock (valid or not).
    pub fn is_mock(&self) -> bool {
        MockKind::from_base_url(&self.base_url).is_some()
    }
}

impl Config {
    /// Reads, parses and validates a config file.
    /// Reads, parses and validates a config file, after applying the
    /// environment overrides `RECALL_LISTEN` (server.listen) and
    /// `RECALL_STORAGE_PATH` (storage.path), which containers set.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut config = Self::parse_unchecked(&text, path)?;
        if let Ok(listen) = std::env::var("RECALL_LISTEN") {
            config.server.listen = listen;
        }
        if let Ok(db) = std::env::var("RECALL_STORAGE_PATH") {
            config.storage.path = db;
        }
        config.validate(path)?;
        // The signing secret lives in the environment, so it is checked
        // here rather than in `validate` (which reads the text alone).
        crate::webhook::signing_key(&config.webhook, |var| std::env::var(var).ok()).map_err(
            |e| ConfigError::Invalid {
                path: path.to_owned(),
                key: "webhook.secret_env".into(),
                message: e.to_string(),
            },
        )?;
        Ok(config)
    }

    /// The config as TOML, with static upstream header values (which may
    /// hold keys) masked: what `recall check` prints.
    pub fn masked_toml(&self) -> String {
        let mut shown = self.clone();
        for u in &mut shown.upstreams {
            for v in u.headers.values_mut() {
                *v = "***".into();
            }
            // The mock's pace is left unset to tell mock upstreams apart
            // from others; shown here as it takes effect.
            if u.is_mock() {
                u.mock_chunk_delay_ms
                    .get_or_insert(crate::mock::DEFAULT_CHUNK_DELAY_MS);
                u.mock_words_per_chunk
                    .get_or_insert(crate::mock::DEFAULT_WORDS_PER_CHUNK);
            }
        }
        toml::to_string_pretty(&shown).unwrap_or_else(|e| format!("# cannot print: {e}"))
    }

    /// Parses and validates config text; `path` only names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let config = Self::parse_unchecked(text, path)?;
        config.validate(path)?;
        Ok(config)
    }

    fn parse_unchecked(text: &str, path: &Path) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })
    }

    pub fn listen_addr(&self) -> Result<SocketAddr, std::net::AddrParseError> {
        self.server.listen.parse()
    }

    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: &str| ConfigError::Invalid {
            path: path.to_owned(),
            key: key.to_owned(),
            message: message.to_owned(),
        };
        if self.listen_addr().is_err() {
            return Err(invalid(
                "server.listen",
                "must be an address such as \"127.0.0.1:8080\"",
            ));
        }
        if self.server.max_body_bytes == 0 {
            return Err(invalid("server.max_body_bytes", "must be greater than 0"));
        }
        if self.server.request_body_timeout_secs == 0 {
            return Err(invalid(
                "server.request_body_timeout_secs",
                "must be at least 1",
            ));
        }
        if self.server.max_request_messages == 0 {
            return Err(invalid("server.max_request_messages", "must be at least 1"));
        }
        if self.server.worker_threads > 1024 {
            return Err(invalid(
                "server.worker_threads",
                "must be at most 1024 (0 = one per CPU)",
            ));
        }
        for (key, name) in [
            ("session.header", &self.session.header),
            ("session.user_header", &self.session.user_header),
        ] {
            if axum::http::HeaderName::try_from(name.as_str()).is_err() {
                return Err(invalid(key, "is not a valid HTTP header name"));
            }
        }
        if self.storage.backend == StorageBackend::Redis {
            match &self.storage.url {
                Some(url) if url.starts_with("redis://") || url.starts_with("rediss://") => {}
                _ => {
                    return Err(invalid(
                        "storage.url",
                        "must be a redis:// URL when storage.backend = \"redis\"",
                    ))
                }
            }
            if self.storage.lease_ms < 100 {
                return Err(invalid("storage.lease_ms", "must be at least 100"));
            }
        }
        if self.storage.backend == StorageBackend::Sqlite && self.storage.path.trim().is_empty() {
            return Err(invalid("storage.path", "must name the database file"));
        }
        if self.session.max_sessions == 0 {
            return Err(invalid("session.max_sessions", "must be at least 1"));
        }
        if let Some(url) = &self.webhook.url {
            if !is_http_url(url) {
                return Err(invalid(
                    "webhook.url",
                    &format!("({url:?}) must be an http(s) URL"),
                ));
            }
        }
        for e in &self.webhook.events {
            if !WEBHOOK_EVENTS.contains(&e.as_str()) {
                return Err(invalid(
                    "webhook.events",
                    &format!("({e:?}) must be one of {WEBHOOK_EVENTS:?}"),
                ));
            }
        }
        if self.webhook.timeout_secs == 0 {
            return Err(invalid("webhook.timeout_secs", "must be at least 1"));
        }
        if self.cache.exact_match && (self.cache.max_entries == 0 || self.cache.ttl_secs == 0) {
            return Err(invalid(
                "cache.max_entries",
                "and cache.ttl_secs must be greater than 0 when the cache is on",
            ));
        }
        let h = &self.history;
        if h.max_messages != 0 && (h.window_messages == 0 || h.window_messages > h.max_messages) {
            return Err(invalid(
                "history.window_messages",
                &format!(
                    "({}) must not be larger than history.max_messages ({}); 0 means no limit",
                    h.window_messages, h.max_messages
                ),
            ));
        }
        if h.window_tokens > MAX_WINDOW_TOKENS {
            return Err(invalid(
                "history.window_tokens",
                &format!(
                    "({}) is larger than any model's context (at most {MAX_WINDOW_TOKENS}); 0 means no limit",
                    h.window_tokens
                ),
            ));
        }
        let int = &self.interruption;
        if int.capture_original && (int.drain_timeout_secs == 0 || int.drain_max_bytes == 0) {
            return Err(invalid(
                "interruption.drain_timeout_secs",
                "and drain_max_bytes must be greater than 0 (set capture_original = false instead)",
            ));
        }
        for (i, m) in self.system_messages.iter().enumerate() {
            if m.role != "system" && m.role != "developer" {
                return Err(invalid(
                    &format!("system_messages[{i}].role"),
                    "must be \"system\" or \"developer\"",
                ));
            }
        }
        if self.upstreams.is_empty() {
            return Err(invalid(
                "upstreams",
                "needs at least one [[upstreams]] entry",
            ));
        }
        for (i, u) in self.upstreams.iter().enumerate() {
            let key = |k: &str| format!("upstreams[{i}].{k}");
            if u.name.trim().is_empty() {
                return Err(invalid(&key("name"), "must not be empty"));
            }
            match MockKind::from_base_url(&u.base_url) {
                Some(Err(e)) => return Err(invalid(&key("base_url"), &e.to_string())),
                Some(Ok(_)) => {
                    validate_mock_pace(u).map_err(|(k, message)| invalid(&key(k), &message))?
                }
                None if !is_http_url(&u.base_url) => {
                    return Err(invalid(
                        &key("base_url"),
                        &format!(
                            "({:?}) must be an http(s) URL or \"{}\"",
                            u.base_url,
                            crate::mock::ECHO_URL
                        ),
                    ))
                }
                None => {
                    // The pace keys would be silently ignored here.
                    for (k, set) in [
                        ("mock_chunk_delay_ms", u.mock_chunk_delay_ms.is_some()),
                        ("mock_words_per_chunk", u.mock_words_per_chunk.is_some()),
                    ] {
                        if set {
                            return Err(invalid(&key(k), "applies only to a mock:// base_url"));
                        }
                    }
                }
            }
            if u.models.is_empty() {
                return Err(invalid(&key("models"), "must list at least one pattern"));
            }
            if u.timeout_secs == 0 || u.connect_timeout_secs == 0 || u.read_timeout_secs == 0 {
                return Err(invalid(
                    &key("timeout_secs"),
                    "timeouts must be at least 1 second",
                ));
            }
            if let Some(f) = &u.fallback {
                if f == &u.name || !self.upstreams.iter().any(|o| &o.name == f) {
                    return Err(invalid(
                        &key("fallback"),
                        &format!("({f:?}) must name another upstream"),
                    ));
                }
            }
            for (name, value) in &u.headers {
                if axum::http::HeaderName::try_from(name.as_str()).is_err()
                    || axum::http::HeaderValue::try_from(value.as_str()).is_err()
                {
                    return Err(invalid(
                        &key(&format!("headers.{name}")),
                        "is not a valid header",
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The mock's pace keys: the failing key (relative to the upstream) and why.
fn validate_mock_pace(u: &UpstreamConfig) -> Result<(), (&'static str, String)> {
    if u.mock_words_per_chunk == Some(0) {
        return Err(("mock_words_per_chunk", "must be at least 1".into()));
    }
    let delay_ms = u
        .mock_chunk_delay_ms
        .unwrap_or(crate::mock::DEFAULT_CHUNK_DELAY_MS);
    if delay_ms >= u.read_timeout_secs.saturating_mul(1000) {
        return Err((
            "mock_chunk_delay_ms",
            format!(
                "({delay_ms}) must be shorter than read_timeout_secs ({} s), or every stream times out",
                u.read_timeout_secs
            ),
        ));
    }
    Ok(())
}

fn is_http_url(text: &str) -> bool {
    reqwest::Url::parse(text)
        .is_ok_and(|url| matches!(url.scheme(), "http" | "https") && url.has_host())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("test.toml"))
    }

    const UPSTREAM: &str = "[[upstreams]]\nname = \"a\"\nbase_url = \"http://127.0.0.1:1/v1\"\n";

    #[test]
    fn minimal_config_gets_defaults() {
        let c = parse(UPSTREAM).unwrap();
        assert_eq!(c.history.window_messages, 20);
        assert_eq!(c.history.max_messages, 1000);
        assert_eq!(c.history.window_tokens, 0);
        assert_eq!(c.session.header, "x-session-id");
        assert_eq!(c.upstreams[0].vendor, Vendor::Openai);
        assert_eq!(c.upstreams[0].models, vec!["*"]);
        assert!(c.upstreams[0].interruptable);
    }

    #[test]
    fn every_config_in_the_config_directory_is_valid() {
        let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config"));
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let c = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
                // What `recall check` prints parses back to the same config.
                let again = Config::parse(&c.masked_toml(), &path).unwrap();
                assert_eq!(again.upstreams.len(), c.upstreams.len());
                seen += 1;
            }
        }
        assert!(seen >= 1);
    }

    #[test]
    fn errors_name_the_key_and_file() {
        let e = parse(&format!("[history]\nwindow_mesages = 3\n{UPSTREAM}"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("window_mesages") && e.contains("test.toml"),
            "{e}"
        );

        let e = parse("[history]\nwindow_messages = \"x\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("window_messages"), "{e}");

        let e = parse("").unwrap_err().to_string();
        assert!(e.contains("upstreams"), "{e}");

        let e = parse("[[upstreams]]\nname = \"a\"\nbase_url = \"not a url\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("upstreams[0].base_url"), "{e}");

        let e = parse(&format!(
            "[history]\nwindow_messages = 50\nmax_messages = 10\n{UPSTREAM}"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("history.window_messages"), "{e}");

        let e = parse(&format!("[server]\nlisten = \"nowhere\"\n{UPSTREAM}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("server.listen"), "{e}");

        let e = parse(&format!("[server]\nworker_threads = 100000\n{UPSTREAM}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("server.worker_threads"), "{e}");
        let one = parse(&format!("[server]\nworker_threads = 1\n{UPSTREAM}")).unwrap();
        assert_eq!(one.server.worker_threads, 1);
    }

    #[test]
    fn a_vendor_mode_recall_does_not_know_is_an_error_not_openai() {
        let upstream = |vendor: &str| {
            format!(
                "[[upstreams]]\nname = \"a\"\nbase_url = \"http://x/v1\"\nvendor = \"{vendor}\"\n"
            )
        };
        let e = parse(&upstream("Custom")).unwrap_err().to_string();
        assert!(e.contains("vendor") && e.contains("Custom"), "{e}");
        assert!(e.contains("openai") && e.contains("custom"), "{e}");
        assert!(parse(&upstream("custom")).unwrap().upstreams[0].is_custom());
        assert!(!parse(&upstream("openai")).unwrap().upstreams[0].is_custom());
    }

    #[test]
    fn a_mock_upstream_is_checked_like_any_other() {
        let mock = |extra: &str| {
            parse(&format!(
                "[[upstreams]]\nname = \"m\"\nbase_url = \"mock://echo\"\n{extra}"
            ))
        };
        let c = mock("mock_chunk_delay_ms = 0\nmock_words_per_chunk = 3\n").unwrap();
        assert_eq!(c.upstreams[0].mock_words_per_chunk, Some(3));
        // `recall check` shows the pace in effect, defaults included.
        let shown = mock("").unwrap().masked_toml();
        assert!(shown.contains("mock_chunk_delay_ms = 40"), "{shown}");
        assert!(shown.contains("mock_words_per_chunk = 1"), "{shown}");

        let e = parse("[[upstreams]]\nname = \"m\"\nbase_url = \"mock://parrot\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("upstreams[0].base_url")
                && e.contains("mock://parrot")
                && e.contains("mock://echo")
                && e.contains("test.toml"),
            "{e}"
        );
        let e = mock("mock_words_per_chunk = 0\n").unwrap_err().to_string();
        assert!(e.contains("upstreams[0].mock_words_per_chunk"), "{e}");
        let e = mock("read_timeout_secs = 1\nmock_chunk_delay_ms = 1000\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("upstreams[0].mock_chunk_delay_ms"), "{e}");
        let e = parse(&format!("{UPSTREAM}mock_chunk_delay_ms = 5\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("upstreams[0].mock_chunk_delay_ms") && e.contains("mock://"),
            "{e}"
        );
    }

    #[test]
    fn window_tokens_is_checked_and_shown_by_check() {
        let c = parse(&format!("[history]\nwindow_tokens = 8000\n{UPSTREAM}")).unwrap();
        assert_eq!(c.history.window_tokens, 8000);
        assert!(c.masked_toml().contains("window_tokens = 8000"));
        let e = parse(&format!(
            "[history]\nwindow_tokens = 1000000000\n{UPSTREAM}"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("history.window_tokens"), "{e}");
        let e = parse(&format!("[history]\nwindow_tokens = -1\n{UPSTREAM}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("window_tokens"), "{e}");
    }

    #[test]
    fn unlimited_window_needs_unlimited_max() {
        assert!(parse(&format!(
            "[history]\nwindow_messages = 0\nmax_messages = 0\n{UPSTREAM}"
        ))
        .is_ok());
        assert!(parse(&format!("[history]\nwindow_messages = 0\n{UPSTREAM}")).is_err());
    }
}
