//! Standard Webhooks signing: the key from the configured secret, event
//! ids, and `webhook-signature`.

use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine as _;

use crate::config::WebhookConfig;

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

/// The HMAC key for `webhook-signature`: `None` when `secret_env` is unset
/// or names an unset or empty variable (`lookup` reads variables). A
/// secret that starts with `whsec_` is the base64 of the key (as the
/// Standard Webhooks libraries take it); any other secret's bytes are the
/// key.
pub fn signing_key(
    config: &WebhookConfig,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Option<Vec<u8>>, SecretError> {
    let Some(var) = config.secret_env.as_deref() else {
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

/// A new event id for `webhook-id`: `msg_`, the time in ms (hex, so that
/// kept events list oldest first) and 64 random bits.
pub fn new_event_id(at_ms: i64) -> String {
    static FALLBACK: AtomicU64 = AtomicU64::new(0);
    let mut bytes = [0u8; 8];
    let random = match ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
    {
        Ok(()) => u64::from_le_bytes(bytes),
        // No system randomness: still unique within this process.
        Err(_) => FALLBACK.fetch_add(1, Ordering::Relaxed) ^ (u64::from(std::process::id()) << 32),
    };
    format!("msg_{at_ms:x}{random:016x}")
}

/// The Standard Webhooks `webhook-signature` value: `v1,` and the base64
/// of HMAC-SHA256(key, "{id}.{timestamp}.{body}").
pub fn sign(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    sign_with(
        &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key),
        id,
        timestamp,
        body,
    )
}

pub(super) fn sign_with(key: &ring::hmac::Key, id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = ring::hmac::Context::with_key(key);
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let tag = mac.sign();
    let mut out = String::from("v1,");
    base64::engine::general_purpose::STANDARD.encode_string(tag.as_ref(), &mut out);
    out
}
