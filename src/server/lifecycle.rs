//! How sessions end: through the API, by idling past `ttl_secs`, or by
//! eviction when there are more than `max_sessions`. Each ended session
//! goes to the webhook whole, once.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::config::OnNewRequest;
use crate::memory::session::{EndWhen, Session};
use crate::server::app::App;
use crate::store::StorageError;
use crate::store::{Op, Wait};
use crate::summaries::carry;
use crate::webhook::{EndReason, Event};

/// How often idle sessions are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// Sessions ended per storage query.
const SWEEP_BATCH: usize = 1000;

/// Ends `session` through the API: a reply in flight is recorded first.
pub async fn end(
    app: &App,
    session: &Arc<Session>,
    reason: EndReason,
) -> Result<Option<Event>, StorageError> {
    end_when(app, session, reason, EndWhen::Always).await
}

/// Ends `session` if `when` still holds (checked under its lock), removes
/// it, waits until storage has forgotten it, and hands its memory to the
/// webhook. `None` if it had already ended or `when` no longer holds.
async fn end_when(
    app: &App,
    session: &Arc<Session>,
    reason: EndReason,
    when: EndWhen,
) -> Result<Option<Event>, StorageError> {
    let storage = &app.policy.storage;
    let mut claim = None;
    let mut session = Arc::clone(session);
    if storage.shared() {
        // Across replicas the lease decides who ends a session: the one
        // holding it, which then finds it gone if another ended it first.
        let wait = match when {
            EndWhen::Always => {
                session.settle(&app.policy, OnNewRequest::Interrupt).ok();
                Wait::Interrupt
            }
            _ => Wait::No,
        };
        let Some(c) = storage.claim(&session.id, wait).await? else {
            return Ok(None);
        };
        claim = Some(c);
        match app.sessions.find(&session.id, storage).await {
            Ok(Some(fresh)) => session = fresh,
            other => {
                let _ = claim.map(|c| storage.release(c));
                return other.map(|_| None);
            }
        }
    }
    let ended_at = app.policy.clock.now_ms();
    let event_of = |ended: &crate::memory::session::Ended| Event::SessionEnded {
        reason,
        session_id: session.id.clone(),
        turn_id: ended.turn_id,
        users: ended.users.clone(),
        created_at: session.created_ms,
        ended_at,
        system_messages: ended.system_messages.clone(),
        contents: ended.contents.clone(),
        summary: ended
            .remembered
            .summary
            .as_ref()
            .and_then(|s| serde_json::to_value(s.view()).ok()),
    };
    // With a webhook and durable storage, the event is kept in the same
    // write as the deletion: the memory leaves storage only as an event.
    // So is the carry-over, as a job that a stop does not lose.
    let keep = app.notifier.keeps() && storage.persistent();
    let kept_id = crate::webhook::new_event_id(ended_at);
    let carries = carrier(app).is_some();
    let job_id = storage.persistent().then(|| carry::new_job_id(ended_at));
    let leftover = |ended: &crate::memory::session::Ended| {
        carries
            .then(|| carry::Leftover::of(ended, session.created_ms))
            .flatten()
    };
    // Set by `also`, which runs only with durable storage.
    let mut left = None;
    let Some((ended, ticket)) = session.end(&app.policy, when, |ended| {
        let mut ops = Vec::new();
        if keep {
            let body = serde_json::to_string(&event_of(ended)).unwrap_or_default();
            ops.push(Op::KeepEvent {
                id: kept_id.clone(),
                body,
            });
        }
        left = leftover(ended);
        let job = left.as_ref().zip(job_id.as_deref());
        ops.extend(job.and_then(|(left, id)| left.keep(id)));
        ops
    }) else {
        let _ = claim.map(|c| storage.release(c));
        return Ok(None);
    };
    let _ = claim.map(|c| storage.release(c));
    app.sessions.remove(&session);
    // Announced, carried over and remembered only once storage has
    // forgotten it: a refused delete leaves the session stored (it is read
    // back on its next request), and ending it again announces it once.
    ticket.durable().await?;
    app.metrics.session_ended();
    let event = event_of(&ended);
    let left = left.or_else(|| leftover(&ended));
    if let (Some(summarizer), Some(left)) = (carrier(app), left) {
        carry::start(Arc::clone(summarizer), note_keeper(app), left, job_id);
    }
    if let Some(lt) = &app.long_term {
        crate::long_term::jobs::after_end(lt, &ended, session.created_ms, &session.id);
    }
    tracing::info!(session = %session.id, ?reason, "session ended");
    app.notifier
        .notify_kept(event.clone(), keep.then_some(kept_id));
    Ok(Some(event))
}

/// With `[memory] carry_over`, the model that folds what an ended session
/// leaves into its user's note, in the background.
fn carrier(app: &App) -> Option<&Arc<crate::summaries::Summarizer>> {
    app.summarizer
        .as_ref()
        .filter(|_| app.config.memory.carry_over)
}

/// Runs the carry-overs that an earlier run kept and did not finish.
pub fn resume_carry_overs(app: &App) {
    if let Some(summarizer) = carrier(app).filter(|_| app.policy.storage.persistent()) {
        carry::resume(Arc::clone(summarizer), note_keeper(app));
    }
}

/// Ends idle sessions and evicts the least active ones past the limit.
/// Woken early by `wake` when a new session takes the count over it.
pub async fn sweeper(app: Arc<App>, wake: Arc<Notify>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(SWEEP_EVERY) => {}
            _ = wake.notified() => {}
        }
        if let Err(e) = sweep(&app, app.policy.clock.now_ms()).await {
            tracing::warn!(error = %e, "session sweep failed; trying again shortly");
        }
    }
}

pub async fn sweep(app: &App, now: i64) -> Result<(), StorageError> {
    let ttl_ms = (app.config.session.ttl_secs as i64).saturating_mul(1000);
    if ttl_ms > 0 {
        let cutoff = now.saturating_sub(ttl_ms);
        for session in idle(app, cutoff).await? {
            end_when(
                app,
                &session,
                EndReason::Expired,
                EndWhen::IdleBefore(cutoff),
            )
            .await?;
        }
    }
    let max = app.config.session.max_sessions;
    let count = if app.policy.storage.persistent() {
        app.policy.storage.count().await?
    } else {
        app.sessions.len()
    };
    if count > max {
        for session in least_active(app, count - max).await? {
            end_when(app, &session, EndReason::Evicted, EndWhen::NotBusy).await?;
        }
    }
    Ok(())
}

async fn idle(app: &App, cutoff: i64) -> Result<Vec<Arc<Session>>, StorageError> {
    if !app.policy.storage.persistent() {
        return Ok(app.sessions.idle_since(cutoff));
    }
    let ids = app.policy.storage.idle(cutoff, SWEEP_BATCH).await?;
    load_all(app, ids).await
}

async fn least_active(app: &App, n: usize) -> Result<Vec<Arc<Session>>, StorageError> {
    if !app.policy.storage.persistent() {
        return Ok(app.sessions.least_active(n));
    }
    let ids = app.policy.storage.least_active(n.min(SWEEP_BATCH)).await?;
    load_all(app, ids).await
}

async fn load_all(app: &App, ids: Vec<String>) -> Result<Vec<Arc<Session>>, StorageError> {
    let mut sessions = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(s) = app.sessions.find(&id, &app.policy.storage).await? {
            sessions.push(s);
        }
    }
    Ok(sessions)
}

/// On shutdown with nothing durable behind memory, every session would be
/// lost: end them all, so that the webhook gets their memory.
pub async fn end_all(app: &App) {
    if app.policy.storage.persistent() {
        return;
    }
    for session in app.sessions.all() {
        if let Err(e) = end(app, &session, EndReason::Ended).await {
            tracing::warn!(session = %session.id, error = %e, "could not end session at shutdown");
        }
    }
}

/// Where a carry-over keeps its note, and the time it writes it at.
fn note_keeper(app: &App) -> carry::Keep {
    carry::Keep {
        notes: Arc::clone(&app.notes),
        storage: Arc::clone(&app.policy.storage),
        clock: app.policy.clock.clone(),
    }
}
