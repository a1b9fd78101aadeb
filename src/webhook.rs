//! Events recall tells the agent's backend about, and their delivery.
//!
//! Delivery never blocks a request: each event is posted by a task of its
//! own, signed, and retried with backoff. An event that cannot be delivered
//! (or is still undelivered at shutdown) is logged whole, with its session
//! id, rather than dropped in silence.
//!
//! Deliveries follow Standard Webhooks (<https://www.standardwebhooks.com>):
//! `webhook-id` names the event (the same on every attempt, and for a kept
//! event its stored id, so the same after a restart too),
//! `webhook-timestamp` is the attempt's time in seconds, and
//! `webhook-signature` is `v1,` and the base64 HMAC-SHA256 of
//! `{id}.{timestamp}.{body}`.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use serde::Serialize;
use tokio::sync::Semaphore;

use crate::config::WebhookConfig;
use crate::memory::message::Message;
use crate::memory::reconcile::Rewrite;
use crate::memory::window::{TrimReason, TrimScope};
use crate::metrics::Metrics;
use crate::store::{EventClaim, KeptClaim, Op, Storage};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// Ended through the API.
    Ended,
    /// Idle past `session.ttl_secs`.
    Expired,
    /// The least recently active session when `max_sessions` was exceeded.
    Evicted,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    SessionEnded {
        reason: EndReason,
        session_id: String,
        turn_id: u64,
        users: Vec<String>,
        created_at: i64,
        ended_at: i64,
        system_messages: Vec<Message>,
        contents: Vec<Arc<Message>>,
    },
    HistoryTrimmed {
        session_id: String,
        removed_count: usize,
        reason: TrimReason,
        scope: TrimScope,
    },
    /// A request regenerated, edited or retried: these stored messages
    /// are superseded (kept, marked, and never sent again).
    HistoryRewritten {
        session_id: String,
        reason: Rewrite,
        turn_id: u64,
        superseded: Vec<Arc<Message>>,
    },
}

impl Event {
    pub fn name(&self) -> &'static str {
        match self {
            Event::SessionEnded { .. } => "session_ended",
            Event::HistoryTrimmed { .. } => "history_trimmed",
            Event::HistoryRewritten { .. } => "history_rewritten",
        }
    }

    pub fn session_id(&self) -> &str {
        match self {
            Event::SessionEnded { session_id, .. }
            | Event::HistoryTrimmed { session_id, .. }
            | Event::HistoryRewritten { session_id, .. } => session_id,
        }
    }
}

/// Where events go. Implementations must not block.
pub trait Notifier: Send + Sync {
    /// Whether `notify` would deliver events of this name, so callers can
    /// skip building them.
    fn wants(&self, event: &str) -> bool;
    fn notify(&self, event: Event) {
        self.notify_kept(event, None);
    }
    /// The same, for an event already kept in storage under `kept`: it is
    /// sent under that id (its `webhook-id`), by one replica at a time, and
    /// forgotten there once delivered.
    fn notify_kept(&self, event: Event, kept: Option<String>);
    /// Whether ended sessions' events should be kept in storage until
    /// delivered (there is somewhere to deliver them).
    fn keeps(&self) -> bool {
        false
    }
    /// At shutdown: waits up to `within` for deliveries under way, then
    /// logs whole whatever is still undelivered.
    fn drain(&self, within: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// No webhook configured: events are only logged.
pub struct LogOnly;

impl Notifier for LogOnly {
    fn wants(&self, event: &str) -> bool {
        event == "session_ended"
    }

    fn notify_kept(&self, event: Event, _: Option<String>) {
        tracing::debug!(
            event = event.name(),
            session = event.session_id(),
            "no webhook configured"
        );
    }

    fn drain(&self, _: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async {})
    }
}

/// Deliveries (attempts) in progress at once.
const CONCURRENT: usize = 8;
/// Longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Posts events to the webhook URL, each in its own task: attempts take a
/// slot among `CONCURRENT`, waits between attempts do not, so one dead
/// receiver's retries never hold up other events.
pub struct Webhook {
    events: Vec<String>,
    delivery: Arc<Delivery>,
}

struct Delivery {
    /// Where an event that cannot be delivered is kept for a later try.
    storage: Arc<Storage>,
    url: String,
    /// Signs deliveries, when a secret is configured.
    key: Option<ring::hmac::Key>,
    client: reqwest::Client,
    max_retries: u32,
    backoff: Duration,
    slots: Semaphore,
    /// Events not yet delivered nor given up, by number, so that a
    /// shutdown can log them whole.
    pending: Mutex<HashMap<u64, Event>>,
    next: AtomicU64,
    metrics: Arc<Metrics>,
    /// Ids of the kept events a task of this process is sending (or
    /// waiting to send), so that it never sends one twice at once.
    sending: Mutex<HashSet<String>>,
}

/// Why the webhook cannot start.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("`webhook.secret_env` {0}")]
    Secret(#[from] SecretError),
    #[error("cannot build its HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

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

impl Webhook {
    pub fn start(
        config: &WebhookConfig,
        url: &str,
        storage: Arc<Storage>,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Self>, WebhookError> {
        let secret = signing_key(config, |var| std::env::var(var).ok())?;
        if secret.is_none() {
            tracing::warn!(
                "webhook events are sent unsigned: webhook.secret_env names no set variable"
            );
        }
        let delivery = Arc::new(Delivery {
            storage,
            url: url.to_owned(),
            key: secret.map(|k| ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &k)),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(config.timeout_secs))
                // A redirect would be followed as a GET without the body:
                // the event would be lost while looking delivered.
                .redirect(reqwest::redirect::Policy::none())
                .user_agent(concat!("recall/", env!("CARGO_PKG_VERSION")))
                .build()?,
            max_retries: config.max_retries,
            backoff: Duration::from_millis(config.retry_backoff_ms),
            slots: Semaphore::new(CONCURRENT),
            pending: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            metrics,
            sending: Mutex::new(HashSet::new()),
        });
        let webhook = Arc::new(Self {
            events: config.events.clone(),
            delivery,
        });
        tokio::spawn(Arc::clone(&webhook.delivery).redeliver_kept());
        Ok(webhook)
    }
}

impl Notifier for Webhook {
    fn wants(&self, event: &str) -> bool {
        self.events.iter().any(|e| e == event)
    }

    fn keeps(&self) -> bool {
        self.wants("session_ended")
    }

    fn notify_kept(&self, event: Event, kept: Option<String>) {
        if !self.wants(event.name()) {
            return;
        }
        let n = self.delivery.next.fetch_add(1, Ordering::Relaxed);
        self.delivery.pending().insert(n, event.clone());
        let delivery = Arc::clone(&self.delivery);
        tokio::spawn(async move {
            delivery.deliver(&event, kept).await;
            delivery.pending().remove(&n);
        });
    }

    fn drain(&self, within: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + within;
            while !self.delivery.pending().is_empty() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            for event in self.delivery.pending().values() {
                // Contents only at trace: logs must not hold conversations.
                let body = serde_json::to_string(event).unwrap_or_default();
                tracing::error!(
                    event = event.name(),
                    session = event.session_id(),
                    "webhook event undelivered at shutdown (its body is logged at trace level)"
                );
                tracing::trace!(event = event.name(), session = event.session_id(), %body,
                    "undelivered webhook event");
            }
        })
    }
}

impl Delivery {
    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Event>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sending(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.sending.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn deliver(&self, event: &Event, already_kept: Option<String>) {
        let (name, session) = (event.name(), event.session_id());
        if let Some(id) = already_kept {
            self.send_kept(&id, name, session).await;
            return;
        }
        let body = match serde_json::to_vec(event) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(session, error = %e, "webhook event not serialisable");
                return;
            }
        };
        let id = new_event_id(crate::clock::now_ms());
        // A session's memory is kept in storage until it is delivered, so
        // that neither a receiver that is down nor a restart loses it.
        if self.storage.persistent() && matches!(event, Event::SessionEnded { .. }) {
            let op = Op::KeepEvent {
                id: id.clone(),
                body: String::from_utf8_lossy(&body).into_owned(),
            };
            if self.storage.submit(vec![op]).durable().await.is_ok() {
                self.send_kept(&id, name, session).await;
                return;
            }
        }
        if self.post(&id, &body, name, session, None).await {
            return;
        }
        tracing::error!(
            event = name,
            session,
            "webhook delivery failed after all retries (its body is logged at trace level)"
        );
        tracing::trace!(event = name, session, body = %String::from_utf8_lossy(&body),
            "undelivered webhook event");
    }

    /// Sends the kept event `id`, as stored, under its claim, and forgets
    /// it once delivered. While another replica holds the claim, waits
    /// until that one delivers it (then there is nothing to do) or lets go.
    async fn send_kept(&self, id: &str, name: &str, session: &str) {
        // One task per kept event in this process: a second is not needed.
        if !self.sending().insert(id.to_owned()) {
            return;
        }
        self.send_kept_claimed(id, name, session).await;
        self.sending().remove(id);
    }

    async fn send_kept_claimed(&self, id: &str, name: &str, session: &str) {
        let gave_up = |e: &dyn std::fmt::Display| {
            tracing::warn!(event = name, session, id, error = %e,
                "cannot send a kept webhook event now; it stays kept and is sent again after a restart");
        };
        let claim = loop {
            match self.storage.claim_kept_event(id).await {
                Ok(KeptClaim::Ours(claim)) => break claim,
                Ok(KeptClaim::Theirs(left)) => {
                    // Another replica is sending it. Look again when its
                    // claim would lapse, in case that replica died.
                    tokio::time::sleep(left.clamp(CLAIM_POLL_MIN, CLAIM_POLL_MAX)).await;
                    match self.storage.kept_event(id).await {
                        Ok(Some(_)) => continue,
                        Ok(None) => return, // delivered by the other replica
                        Err(e) => return gave_up(&e),
                    }
                }
                Err(e) => return gave_up(&e),
            }
        };
        // Read under the claim: what an earlier holder delivered is gone.
        let body = match self.storage.kept_event(id).await {
            Ok(Some(body)) => body,
            Ok(None) => {
                let _ = self.storage.release_kept_event(claim).await;
                return;
            }
            Err(e) => {
                let _ = self.storage.release_kept_event(claim).await;
                return gave_up(&e);
            }
        };
        let sent = self
            .post(id, body.as_bytes(), name, session, Some(&claim))
            .await;
        if sent {
            // Forgotten before the claim goes, so that whoever claims it
            // next finds nothing to send.
            let forgotten = self
                .storage
                .submit(vec![Op::ForgetEvent { id: id.to_owned() }])
                .durable()
                .await;
            if let Err(e) = forgotten {
                tracing::warn!(event = name, session, id, error = %e,
                    "a delivered webhook event could not be forgotten: it may be sent again (same webhook-id)");
            }
        } else if !claim.lost() {
            tracing::error!(event = name, session, id,
                "webhook delivery failed after all retries; the event is kept in storage and sent again after a restart");
        }
        if !claim.lost() {
            let _ = self.storage.release_kept_event(claim).await;
        }
    }

    /// Events kept by an earlier run (or by another replica): each is sent
    /// again (with retries) and forgotten once delivered.
    async fn redeliver_kept(self: Arc<Self>) {
        let kept = match self.storage.kept_events().await {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(error = %e, "could not read kept webhook events");
                return;
            }
        };
        for (id, _) in kept {
            let delivery = Arc::clone(&self);
            tokio::spawn(async move { delivery.send_kept(&id, "kept", &id).await });
        }
    }

    /// Posts one body with retries under webhook-id `id`; whether it was
    /// accepted. Under a claim, stops once the claim is lost (another
    /// replica may be sending it by then).
    async fn post(
        &self,
        id: &str,
        body: &[u8],
        name: &str,
        session: &str,
        claim: Option<&EventClaim>,
    ) -> bool {
        let mut wait = self.backoff;
        for attempt in 0..=self.max_retries {
            if attempt > 0 {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_BACKOFF);
            }
            if claim.is_some_and(EventClaim::lost) {
                tracing::warn!(
                    event = name,
                    session,
                    id,
                    attempt,
                    "the claim on a kept webhook event lapsed: another replica may send it"
                );
                return false;
            }
            let Ok(_slot) = self.slots.acquire().await else {
                break;
            };
            // Each attempt has its own timestamp, so its own signature.
            let timestamp = crate::clock::now_ms().div_euclid(1000);
            let mut req = self
                .client
                .post(&self.url)
                .header("content-type", "application/json")
                .header("webhook-id", id)
                .header("webhook-timestamp", timestamp.to_string())
                .body(body.to_vec());
            if let Some(key) = &self.key {
                req = req.header("webhook-signature", sign_with(key, id, timestamp, body));
            }
            let sent = req.send().await;
            self.metrics
                .webhook_attempt(sent.as_ref().is_ok_and(|r| r.status().is_success()));
            match sent {
                Ok(resp) if resp.status().is_success() => {
                    tracing::debug!(event = name, session, attempt, "webhook delivered");
                    return true;
                }
                Ok(resp) => {
                    tracing::warn!(event = name, session, attempt,
                        status = %resp.status(), "webhook refused the event");
                }
                Err(e) => {
                    tracing::warn!(event = name, session, attempt, error = %e, "webhook unreachable");
                }
            }
        }
        false
    }
}

/// Shortest and longest wait before looking again at a kept event another
/// replica is sending.
const CLAIM_POLL_MIN: Duration = Duration::from_millis(50);
const CLAIM_POLL_MAX: Duration = Duration::from_secs(5);

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

fn sign_with(key: &ring::hmac::Key, id: &str, timestamp: i64, body: &[u8]) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(secret: &str) -> Result<Option<Vec<u8>>, SecretError> {
        let config = WebhookConfig {
            secret_env: Some("HOOK_SECRET".into()),
            ..WebhookConfig::default()
        };
        signing_key(&config, |var| {
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
        assert!(signing_key(&WebhookConfig::default(), |_| None)
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
}
