//! `[storage]` and `[session]`: where sessions are kept and when they end.

use serde::{Deserialize, Serialize};

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
