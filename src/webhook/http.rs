//! The HTTP webhook: a task per event, attempts under a limit, retries
//! with backoff, and kept events sent under a claim.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;

use super::sign::sign_with;
use super::*;
use crate::config::{SecretError, WebhookConfig};
use crate::metrics::Metrics;
use crate::store::{Kept, KeptClaim, Op, Storage, Taken};

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

impl Webhook {
    pub fn start(
        config: &WebhookConfig,
        url: &str,
        storage: Arc<Storage>,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Self>, WebhookError> {
        let secret = config.signing_key(|var| std::env::var(var).ok())?;
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
        let (claim, body) = match self.storage.take_kept(Kept::Event, id).await {
            Ok(Some(Taken { claim, body })) => (claim, body),
            // Delivered meanwhile, by another replica or an earlier holder.
            Ok(None) => return,
            Err(e) => return gave_up(&e),
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
            let _ = self.storage.release_kept(claim).await;
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
        claim: Option<&KeptClaim>,
    ) -> bool {
        let mut wait = self.backoff;
        for attempt in 0..=self.max_retries {
            if attempt > 0 {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_BACKOFF);
            }
            if claim.is_some_and(KeptClaim::lost) {
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
