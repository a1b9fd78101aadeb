//! Signing and events.

use super::*;
use crate::config::{SecretError, WebhookConfig};

fn key_of(secret: &str) -> Result<Option<Vec<u8>>, SecretError> {
    let config = WebhookConfig {
        secret_env: Some("HOOK_SECRET".into()),
        ..WebhookConfig::default()
    };
    config.signing_key(|var| {
        assert_eq!(var, "HOOK_SECRET");
        Some(secret.to_owned())
    })
}

/// The Standard Webhooks test vector (the spec's Python library's
/// `test_sign_function`; the `standardwebhooks` 1.1.0 package on PyPI
/// signs it the same).
#[test]
fn signature_matches_the_standard_webhooks_test_vector() {
    let key = key_of("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
        .unwrap()
        .unwrap();
    assert_eq!(
        sign(
            &key,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#
        ),
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    );
}

/// A plain secret's bytes are the key: the same signature as its
/// `whsec_` + base64 form (computed with `standardwebhooks` 1.1.0:
/// `Webhook(b"hook-secret").sign("msg_plain", 1700000000, body)`).
#[test]
fn a_plain_secret_is_the_key_itself() {
    let body = br#"{"event":"session_ended"}"#;
    let expected = "v1,euZot+ygLH//1vi2F2pto+bZjziwIpJ8c+oJq3q2+Yc=";
    for secret in ["hook-secret", "whsec_aG9vay1zZWNyZXQ="] {
        let key = key_of(secret).unwrap().unwrap();
        assert_eq!(key, b"hook-secret");
        assert_eq!(sign(&key, "msg_plain", 1_700_000_000, body), expected);
    }
}

#[test]
fn whsec_secrets_decode_with_or_without_padding_and_bad_ones_are_refused() {
    assert_eq!(key_of("whsec_aGk=").unwrap().unwrap(), b"hi");
    assert_eq!(key_of("whsec_aGk").unwrap().unwrap(), b"hi");
    let bad = key_of("whsec_not base64!").unwrap_err().to_string();
    assert!(
        bad.contains("HOOK_SECRET") && !bad.contains("not base64!"),
        "{bad}"
    );
    assert!(matches!(key_of("whsec_"), Err(SecretError::Empty { .. })));
    // Unset or empty: unsigned.
    assert!(key_of("").unwrap().is_none());
    assert!(WebhookConfig::default()
        .signing_key(|_| None)
        .unwrap()
        .is_none());
}

#[test]
fn event_ids_are_unique_and_sort_by_time() {
    let (a, b) = (new_event_id(0x18f0000000), new_event_id(0x18f0000000));
    assert!(
        a.starts_with("msg_18f0000000") && a.len() == 4 + 10 + 16,
        "{a}"
    );
    assert_ne!(a, b);
    assert!(new_event_id(0x18f0000001) > a);
}

#[test]
fn events_serialise_with_their_name() {
    let e = Event::HistoryTrimmed {
        session_id: "s".into(),
        removed_count: 2,
        reason: TrimReason::MaxChars,
        scope: TrimScope::Window,
    };
    assert_eq!(
        serde_json::to_value(&e).unwrap(),
        serde_json::json!({"event": "history_trimmed", "session_id": "s",
                           "removed_count": 2, "reason": "max_chars", "scope": "window"})
    );
}
