//! `[server]`, `[admin]`, `[auth]` and `[log]`: how recall listens and who may call it.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub listen: String,
    pub max_body_bytes: usize,
    /// Upstream calls in flight at once, drains included (0 = no limit).
    /// Past it, a request takes the slot of a drain (asked to yield), or a
    /// barge-in the slot of the reply it cuts; a request no slot can come
    /// to is answered 503 at once, before anything is stored.
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
