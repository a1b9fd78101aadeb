//! Events recall tells the agent's backend about, and their delivery.
//!
//! Delivery never blocks a request: events go into a queue that a
//! background task drains, posting each one signed and retrying with
//! backoff. An event that cannot be delivered is logged whole, with its
//! session id, rather than dropped in silence.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, Semaphore};

use crate::config::WebhookConfig;
use crate::message::Message;
use crate::window::{TrimReason, TrimScope};

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
        contents: Vec<Message>,
    },
    HistoryTrimmed {
        session_id: String,
        removed_count: usize,
        reason: TrimReason,
        scope: TrimScope,
    },
}

impl Event {
    pub fn name(&self) -> &'static str {
        match self {
            Event::SessionEnded { .. } => "session_ended",
            Event::HistoryTrimmed { .. } => "history_trimmed",
        }
    }

    pub fn session_id(&self) -> &str {
        match self {
            Event::SessionEnded { session_id, .. } | Event::HistoryTrimmed { session_id, .. } => {
                session_id
            }
        }
    }
}

/// Where events go. Implementations must not block.
pub trait Notifier: Send + Sync {
    /// Whether `notify` would deliver events of this name, so callers can
    /// skip building them.
    fn wants(&self, event: &str) -> bool;
    fn notify(&self, event: Event);
}

/// No webhook configured: events are only logged.
pub struct LogOnly;

impl Notifier for LogOnly {
    fn wants(&self, event: &str) -> bool {
        event == "session_ended"
    }

    fn notify(&self, event: Event) {
        tracing::debug!(
            event = event.name(),
            session = event.session_id(),
            "no webhook configured"
        );
    }
}

/// Events waiting for delivery; past this the newest are logged and dropped.
const QUEUE: usize = 10_000;
/// Deliveries in progress at once.
const CONCURRENT: usize = 8;
/// Longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

pub struct Webhook {
    events: Vec<String>,
    tx: mpsc::Sender<Event>,
}

struct Delivery {
    url: String,
    secret: Option<Vec<u8>>,
    client: reqwest::Client,
    max_retries: u32,
    backoff: Duration,
}

impl Webhook {
    /// Starts the delivery task; must be called inside a tokio runtime.
    pub fn start(config: &WebhookConfig, url: &str) -> Result<Arc<Self>, reqwest::Error> {
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
            url: url.to_owned(),
            secret,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(config.timeout_secs))
                .user_agent(concat!("recall/", env!("CARGO_PKG_VERSION")))
                .build()?,
            max_retries: config.max_retries,
            backoff: Duration::from_millis(config.retry_backoff_ms),
        });
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(deliver_all(rx, delivery));
        Ok(Arc::new(Self {
            events: config.events.clone(),
            tx,
        }))
    }
}

impl Notifier for Webhook {
    fn wants(&self, event: &str) -> bool {
        self.events.iter().any(|e| e == event)
    }

    fn notify(&self, event: Event) {
        if !self.wants(event.name()) {
            return;
        }
        if let Err(e) = self.tx.try_send(event) {
            let event = match e {
                mpsc::error::TrySendError::Full(ev) | mpsc::error::TrySendError::Closed(ev) => ev,
            };
            let body = serde_json::to_string(&event).unwrap_or_default();
            tracing::error!(event = event.name(), session = event.session_id(), %body,
                "webhook queue full: event not delivered");
        }
    }
}

async fn deliver_all(mut rx: mpsc::Receiver<Event>, delivery: Arc<Delivery>) {
    let slots = Arc::new(Semaphore::new(CONCURRENT));
    while let Some(event) = rx.recv().await {
        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let delivery = Arc::clone(&delivery);
        tokio::spawn(async move {
            delivery.deliver(&event).await;
            drop(permit);
        });
    }
}

impl Delivery {
    async fn deliver(&self, event: &Event) {
        let body = match serde_json::to_vec(event) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(session = event.session_id(), error = %e, "webhook event not serialisable");
                return;
            }
        };
        let signature = self.secret.as_deref().map(|s| sign(s, &body));
        let mut wait = self.backoff;
        for attempt in 0..=self.max_retries {
            if attempt > 0 {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_BACKOFF);
            }
            let mut req = self
                .client
                .post(&self.url)
                .header("content-type", "application/json")
                .body(body.clone());
            if let Some(sig) = &signature {
                req = req.header("x-recall-signature", sig.as_str());
            }
            match req.send().await {
                Ok(resp) if resp.status().is_success() => {
                    tracing::debug!(
                        event = event.name(),
                        session = event.session_id(),
                        attempt,
                        "webhook delivered"
                    );
                    return;
                }
                Ok(resp) => {
                    tracing::warn!(event = event.name(), session = event.session_id(), attempt,
                        status = %resp.status(), "webhook refused the event");
                }
                Err(e) => {
                    tracing::warn!(event = event.name(), session = event.session_id(), attempt,
                        error = %e, "webhook unreachable");
                }
            }
        }
        tracing::error!(event = event.name(), session = event.session_id(),
            body = %String::from_utf8_lossy(&body),
            "webhook delivery failed after all retries; the event is in this log line");
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
