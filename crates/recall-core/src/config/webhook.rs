//! `[webhook]`: where session events go.

use base64::Engine as _;
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

/// A signing secret that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    // The secret itself is never part of the message: errors are logged.
    #[error("names a variable ({var}) whose secret starts with `whsec_` but the rest is not base64 (standard alphabet, padding optional)")]
    NotBase64 { var: String },
    #[error("names a variable ({var}) whose `whsec_` secret decodes to no bytes")]
    Empty { var: String },
}

/// The base64 of `whsec_` secrets, as the Standard Webhooks libraries read
/// it: the standard alphabet, with or without padding.
const WHSEC: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

impl WebhookConfig {
    /// The HMAC key for `webhook-signature`: `None` when `secret_env` is unset
    /// or names an unset or empty variable (`lookup` reads variables). A
    /// secret that starts with `whsec_` is the base64 of the key (as the
    /// Standard Webhooks libraries take it); any other secret's bytes are the
    /// key.
    pub fn signing_key(
        &self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Vec<u8>>, SecretError> {
        let Some(var) = self.secret_env.as_deref() else {
            return Ok(None);
        };
        let Some(secret) = lookup(var).filter(|s| !s.is_empty()) else {
            return Ok(None);
        };
        let Some(encoded) = secret.strip_prefix("whsec_") else {
            return Ok(Some(secret.into_bytes()));
        };
        let key = WHSEC
            .decode(encoded)
            .map_err(|_| SecretError::NotBase64 { var: var.into() })?;
        if key.is_empty() {
            return Err(SecretError::Empty { var: var.into() });
        }
        Ok(Some(key))
    }
}
