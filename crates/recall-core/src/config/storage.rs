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
    /// Redis: e.g. `redis://127.0.0.1:6379`, or a cluster's nodes as
    /// `redis+cluster://host:port,host:port` (see `redis_target`).
    pub url: Option<String>,
    /// Redis: prefix of every key and channel.
    pub key_prefix: String,
    /// Redis: how long a replica's claim on a session lasts unless renewed
    /// (a dead replica blocks a session at most this long).
    pub lease_ms: u64,
    /// Redis: how many replicas of the written node must have a turn's
    /// writes before it is answered (`WAIT`), so that a failover loses
    /// nothing acknowledged. Unset: 1 when the Redis or the cluster reports
    /// replicas at start, else 0.
    pub min_replicas: Option<u32>,
    /// Redis: how long a write waits for `min_replicas`; past it the turn
    /// gets a 503 that says the write reached the node but not its
    /// replicas.
    pub replica_ack_timeout_ms: u64,
    /// Redis: how long one command may take before it counts as failed
    /// (a turn on a node that does not answer waits at most this long).
    pub timeout_ms: u64,
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
            min_replicas: None,
            replica_ack_timeout_ms: 1_000,
            timeout_ms: 10_000,
        }
    }
}

/// What `storage.url` names: one Redis, or the nodes a Redis Cluster
/// client starts from (it learns the others from them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    Single(String),
    /// One `redis://[user:password@]host:port` URL per node given.
    Cluster(Vec<String>),
}

const CLUSTER_SCHEME: &str = "redis+cluster://";

impl StorageConfig {
    /// Parses `url`: `redis://...` or `rediss://...` for one Redis,
    /// `redis+cluster://[user:password@]host:port[,host:port...]` for a
    /// cluster. The error says what is wrong, for `storage.url`.
    pub fn redis_target(&self) -> Result<RedisTarget, String> {
        let Some(url) = self.url.as_deref() else {
            return Err("is required when storage.backend = \"redis\"".into());
        };
        if url.starts_with("redis://") || url.starts_with("rediss://") {
            return Ok(RedisTarget::Single(url.to_owned()));
        }
        let Some(rest) = url.strip_prefix(CLUSTER_SCHEME) else {
            return Err(
                "must be a redis:// URL, or redis+cluster://host:port,host:port for a cluster"
                    .into(),
            );
        };
        // The credentials, if any, apply to every node.
        let (auth, hosts) = match rest.rsplit_once('@') {
            Some((auth, hosts)) => (format!("{auth}@"), hosts),
            None => (String::new(), rest),
        };
        let hosts = hosts.trim_end_matches('/');
        let mut nodes = Vec::new();
        for node in hosts.split(',') {
            let ok = node.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty() && !host.contains(['/', '?']) && port.parse::<u16>().is_ok()
            });
            if !ok {
                return Err(format!(
                    "names a cluster node {node:?} that is not host:port (redis+cluster://host:port,host:port)"
                ));
            }
            nodes.push(format!("redis://{auth}{node}"));
        }
        Ok(RedisTarget::Cluster(nodes))
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
