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

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use recall_core::memory::message::Message;
use recall_core::memory::reconcile::Rewrite;
use recall_core::memory::window::{TrimReason, TrimScope};

mod http;
mod sign;
#[cfg(test)]
mod tests;

pub use http::{Webhook, WebhookError};
pub use sign::{new_event_id, sign};

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
        /// The running summary when the session ended, as the session API
        /// shows it (`summary::View`).
        #[serde(skip_serializing_if = "Option::is_none")]
        summary: Option<serde_json::Value>,
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
