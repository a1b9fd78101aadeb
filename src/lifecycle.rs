//! How sessions end: through the API, by idling past `ttl_secs`, or by
//! eviction when there are more than `max_sessions`. Each ended session
//! goes to the webhook whole.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::app::App;
use crate::relay::now_ms;
use crate::session::Session;
use crate::webhook::{EndReason, Event};

/// How often idle sessions are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Ends `session`: removes it, and hands its memory to the webhook.
/// Returns the event, or `None` if it had already ended.
pub fn end(app: &App, session: &Arc<Session>, reason: EndReason) -> Option<Event> {
    let ended = session.end()?;
    app.sessions.remove(session);
    app.counters.session_ended();
    let event = Event::SessionEnded {
        reason,
        session_id: session.id.clone(),
        turn_id: ended.turn_id,
        users: ended.users,
        created_at: session.created_ms,
        ended_at: now_ms(),
        system_messages: ended.system_messages,
        contents: ended.contents,
    };
    tracing::info!(session = %session.id, ?reason, "session ended");
    app.notifier.notify(event.clone());
    Some(event)
}

/// Ends idle sessions and evicts the least active ones past the limit.
/// Woken early by `wake` when a new session takes the count over it.
pub async fn sweeper(app: Arc<App>, wake: Arc<Notify>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(SWEEP_EVERY) => {}
            _ = wake.notified() => {}
        }
        sweep(&app, now_ms());
    }
}

pub fn sweep(app: &App, now: i64) {
    let ttl_ms = (app.config.session.ttl_secs as i64).saturating_mul(1000);
    if ttl_ms > 0 {
        for session in app.sessions.idle_since(now.saturating_sub(ttl_ms)) {
            end(app, &session, EndReason::Expired);
        }
    }
    let max = app.config.session.max_sessions;
    let over = app.sessions.len().saturating_sub(max);
    if over > 0 {
        for session in app.sessions.least_active(over) {
            end(app, &session, EndReason::Evicted);
        }
    }
}
