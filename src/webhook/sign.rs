//! Standard Webhooks signing: event ids and `webhook-signature` (the key
//! is the config's, `WebhookConfig::signing_key`).

use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine as _;

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
