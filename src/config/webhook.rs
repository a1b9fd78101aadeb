//! `[webhook]`: where session events go.

use serde::{Deserialize, Serialize};

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

pub const WEBHOOK_EVENTS: &[&str] = &["session_ended", "history_trimmed", "history_rewritten"];
