//! The TOML configuration: its shape, its defaults and the checks that run
//! before the server starts. Every key is documented in docs/configuration.md.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod console;
mod long_term;
mod memory;
mod mock;
mod server;
mod storage;
mod summary;
#[cfg(test)]
mod tests;
mod upstream;
mod validate;
mod webhook;

pub use console::*;
pub use long_term::*;
pub use memory::*;
pub use mock::*;
pub use server::*;
pub use storage::*;
pub use summary::*;
pub use upstream::*;
pub use webhook::*;

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
    pub memory: MemoryConfig,
    #[serde(default)]
    pub long_term: LongTermConfig,
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
    pub console: ConsoleConfig,
    #[serde(default)]
    pub log: LogConfig,
    #[serde(default)]
    pub system_messages: Vec<SystemMessage>,
    #[serde(default)]
    pub upstreams: Vec<UpstreamConfig>,
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
        config
            .webhook
            .signing_key(|var| std::env::var(var).ok())
            .map_err(|e| ConfigError::Invalid {
                path: path.to_owned(),
                key: "webhook.secret_env".into(),
                message: e.to_string(),
            })?;
        Ok(config)
    }

    /// Whether the files the config names on this machine are there: what
    /// `recall check` and startup check beyond `load`, which takes a config
    /// whose files are not in place yet (the shipped ones name a model
    /// folder the repository does not hold).
    pub fn check_files(&self, path: &Path) -> Result<(), ConfigError> {
        if let Some(dir) = self.long_term.local_embedder() {
            long_term::local_folder(dir).map_err(|message| ConfigError::Invalid {
                path: path.to_owned(),
                key: "long_term.embedding_model".into(),
                message,
            })?;
        }
        Ok(())
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
                u.mock_chunk_delay_ms.get_or_insert(DEFAULT_CHUNK_DELAY_MS);
                u.mock_words_per_chunk
                    .get_or_insert(DEFAULT_WORDS_PER_CHUNK);
            }
        }
        toml::to_string_pretty(&shown).unwrap_or_else(|e| format!("# cannot print: {e}"))
    }

    /// Parses and validates config text; `path` only names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let config = Self::parse_unchecked(text, path)?;
        config.validate(path)?;
        // The signing secret lives in the environment, so it is checked
        // here rather than in `validate` (which reads the text alone).
        config
            .webhook
            .signing_key(|var| std::env::var(var).ok())
            .map_err(|e| ConfigError::Invalid {
                path: path.to_owned(),
                key: "webhook.secret_env".into(),
                message: e.to_string(),
            })?;
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
}
