//! Events recall tells the agent's backend about, and their delivery.
//!
//! Delivery never blocks a request: each event is posted by a task of its
//! own, signed, and retried with backoff. An event that cannot be delivered
//! (or is still undelivered at shutdown) is logged whole, with its session
//! id, rather than dropped in silence.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Semaphore;

use crate::config::WebhookConfig;
use crate::memory::message::Message;
use crate::memory::reconcile::Rewrite;
use crate::memory::window::{TrimReason, TrimScope};
use crate::metrics::Metrics;
use crate::store::{Op, Storage};

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
    secret: Option<Vec<u8>>,
    client: reqwest::Client,
    max_retries: u32,
    backoff: Duration,
    slots: Semaphore,
    /// Events not yet delivered nor given up, by number, so that a
    /// shutdown can log them whole.
    pending: Mutex<HashMap<u64, Event>>,
    next: AtomicU64,
    metrics: Arc<Metrics>,
}

impl Webhook {
    pub fn start(
        config: &WebhookConfig,
        url: &str,
        storage: Arc<Storage>,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Self>, reqwest::Error> {
        let secret = config
            .secret_env
            .as_deref()
            .and_then(|var| std::env::var(var).ok())
            .filter(|s| !s.is_empty())
            .map(String::into_bytes);
        if secret.is_none() {
            tracing::warn!(
                "webhook events are sent unsigned: webhook.secret_env names no set variable"
            );
        }
        let delivery = Arc::new(Delivery {
            storage,
            url: url.to_owned(),
            secret,
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

    async fn deliver(&self, event: &Event, already_kept: Option<String>) {
        let body = match serde_json::to_vec(event) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(session = event.session_id(), error = %e, "webhook event not serialisable");
                return;
            }
        };
        let text = String::from_utf8_lossy(&body).into_owned();
        // A session's memory is kept in storage until it is delivered, so
        // that neither a receiver that is down nor a restart loses it.
        let kept_ok = already_kept.is_some();
        let kept = match already_kept {
            Some(id) => Some(id),
            None if self.storage.persistent() && matches!(event, Event::SessionEnded { .. }) => {
                let id = format!("{:x}-{}", crate::clock::now_ms(), event.session_id());
                let op = Op::KeepEvent {
                    id: id.clone(),
                    body: text.clone(),
                };
                self.storage
                    .submit(vec![op])
                    .durable()
                    .await
                    .ok()
                    .map(|()| id)
            }
            None => None,
        };
        let kept_ok = kept_ok || kept.is_some();
        if self.post(&body, event.name(), event.session_id()).await {
            if let (Some(id), true) = (kept, kept_ok) {
                let _ = self
                    .storage
                    .submit(vec![Op::ForgetEvent { id }])
                    .durable()
                    .await;
            }
            return;
        }
        if kept_ok {
            tracing::error!(event = event.name(), session = event.session_id(),
                "webhook delivery failed after all retries; the event is kept in storage and sent again after a restart");
            return;
        }
        tracing::error!(
            event = event.name(),
            session = event.session_id(),
            "webhook delivery failed after all retries (its body is logged at trace level)"
        );
        tracing::trace!(event = event.name(), session = event.session_id(), body = %text,
            "undelivered webhook event");
    }

    /// Events kept by an earlier run: each is sent again (with retries) and
    /// forgotten once delivered.
    async fn redeliver_kept(self: Arc<Self>) {
        let kept = match self.storage.kept_events().await {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(error = %e, "could not read kept webhook events");
                return;
            }
        };
        for (id, body) in kept {
            let delivery = Arc::clone(&self);
            tokio::spawn(async move {
                // With shared storage, every replica reads the kept events:
                // the one that takes an event sends it.
                if !matches!(delivery.storage.take_kept_event(&id).await, Ok(true)) {
                    return;
                }
                let sent = delivery.post(body.as_bytes(), "kept", &id).await;
                let op = if sent {
                    Op::ForgetEvent { id }
                } else {
                    Op::KeepEvent { id, body }
                };
                let _ = delivery.storage.submit(vec![op]).durable().await;
            });
        }
    }

    /// Posts one body with retries; whether it was accepted.
    async fn post(&self, body: &[u8], name: &str, session: &str) -> bool {
        let signature = self.secret.as_deref().map(|s| sign(s, body));
        let mut wait = self.backoff;
        for attempt in 0..=self.max_retries {
            if attempt > 0 {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_BACKOFF);
            }
            let Ok(_slot) = self.slots.acquire().await else {
                break;
            };
            let mut req = self
                .client
                .post(&self.url)
                .header("content-type", "application/json")
                .body(body.to_vec());
            if let Some(sig) = &signature {
                req = req.header("x-recall-signature", sig.as_str());
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

/// `sha256=<hex HMAC-SHA256 of body>`, as sent in `x-recall-signature`.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let tag = ring::hmac::sign(&key, body);
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256=");
    for byte in tag.as_ref() {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_matches_rfc_4231_test_case_2() {
        let sig = sign(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            sig,
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
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
