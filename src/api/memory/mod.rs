//! Memory beyond the window, at the edge: the summary and the carried note
//! as the system messages a turn sends, the folds that run in the
//! background, and the session API's `summary` and `summarize`; users'
//! notes are in `users`, long-term memory in a turn in `long_term`, and
//! its records API in `records`.

pub(crate) mod long_term;
mod records;
mod users;

pub use records::{add_record, delete_record, extract, get_record, list_records, search_records};
pub use users::{delete_user_memory, get_user_memory, put_user_memory, UserTarget};

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use crate::api::auth::Access;
use crate::api::sessions::{self, existing, json_body, Target, Turns};
use crate::config::MemoryConfig;
use crate::error::{ApiError, RequestError};
use crate::memory::message::Message;
use crate::memory::session::{Applied, FoldNow, Refused, Session};
use crate::memory::summary::{self, Fold, Folded, Remembered};
use crate::memory::tokens::Encoding;
use crate::memory::window::Limits;
use crate::proxy::protocol::VendorRules;
use crate::server::app::App;
use crate::store::Wait;
use crate::summarizer::Summarizer;

/// After a fold gives up, the next waits this long.
const RETRY_AFTER_MS: i64 = 30_000;

/// The system messages memory adds to a turn, in order: the note carried
/// in from the user's last session, then the running summary; within
/// `max_tokens`, the summary first (it is this conversation's).
pub(crate) fn injected(config: &MemoryConfig, r: &Remembered) -> impl Iterator<Item = Message> {
    let mut left = config.max_tokens;
    let summary = r.summary.as_ref().and_then(|s| {
        summary::message_within(&config.summary_template, "{summary}", &s.text, &mut left)
    });
    let note = r
        .carried
        .as_deref()
        .and_then(|n| summary::message_within(&config.carry_over_template, "{note}", n, &mut left));
    note.into_iter().chain(summary)
}

/// Gives a session its user's note, if the user has one: called when the
/// session is made, before its first turn. A note that cannot be read is
/// logged and the session starts without it.
pub(crate) async fn carry_in(app: &App, session: &Session, key: &str, user: &str) {
    session.carry(key, user, note_of(app, key).await);
}

/// The text of user `key`'s note, if any; one that cannot be read is
/// logged and taken as none.
pub(crate) async fn note_of(app: &App, key: &str) -> Option<String> {
    match app.notes.get(&app.policy.storage, key).await {
        Ok(note) => note.and_then(|n| n.text().map(str::to_owned)),
        Err(e) => {
            tracing::warn!(error = %e, "a user's note could not be read");
            None
        }
    }
}

/// With `[memory] carry_over` or `[long_term]`, the user a conversation's `metadata.user`
/// names: their note's key, and the name as given.
pub(crate) fn metadata_user(
    app: &App,
    access: &Access,
    metadata: &serde_json::Map<String, Value>,
) -> Option<(String, String)> {
    let user = metadata.get("user")?.as_str()?;
    let remembers = app.config.memory.carry_over || app.config.long_term.enabled;
    (remembers && !user.trim().is_empty())
        .then(|| (access.internal(user).into_owned(), user.to_owned()))
}

/// Runs `fold` of session `id` in a task of its own; the turn that asked
/// for it goes on with the summary it has.
pub(crate) fn start_fold(app: &Arc<App>, id: &str, fold: Fold) {
    let Some(session) = app.sessions.get(id) else {
        return;
    };
    let Some(summarizer) = app.summarizer.clone() else {
        session.fold_ended(None);
        return;
    };
    let app = Arc::clone(app);
    let id = id.to_owned();
    tokio::spawn(async move {
        let mut running = Running {
            session,
            retry_after_ms: None,
        };
        if run_fold(&app, &summarizer, &id, fold, false).await.is_err() {
            running.retry_after_ms = Some(app.policy.clock.now_ms() + RETRY_AFTER_MS);
        }
    });
}

/// A fold under way: its session hears when it ends, however it ends.
struct Running {
    session: Arc<Session>,
    retry_after_ms: Option<i64>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.session.fold_ended(self.retry_after_ms);
    }
}

/// Asks the summary model for `fold`, and stores its answer through the
/// session. With `wait`, until it is stored; else a busy session on shared
/// storage may keep it for its next turn.
async fn run_fold(
    app: &App,
    summarizer: &Summarizer,
    id: &str,
    fold: Fold,
    wait: bool,
) -> Result<Applied, ApiError> {
    let written = summarizer.fold(&fold).await?;
    let folded = Folded {
        fold,
        text: written.text,
        model: summarizer.model_name().to_owned(),
        covered_tokens: written.covered_tokens,
        at_ms: app.policy.clock.now_ms(),
    };
    store(app, id, folded, wait).await
}

/// How long `store` waits for the right to store (then the answer is
/// dropped, as after a failed call).
const STORE_WITHIN: Duration = Duration::from_secs(30);

/// Stores a fold's answer in session `id` and waits until it is durable.
/// With shared storage a change needs the session's lease: a turn here
/// lends its own; else the lease is taken if no replica holds it. Failing
/// both, the answer is kept for the session's next turn, and with `wait`
/// the lease is tried again shortly (a patient wait for it would lose
/// every race to the next turn of a busy session).
async fn store(app: &App, id: &str, folded: Folded, wait: bool) -> Result<Applied, ApiError> {
    let storage = &app.policy.storage;
    let gone = || ApiError::from(RequestError::SessionNotFound { id: id.to_owned() });
    let shared = storage.shared();
    let (until, at_ms) = (folded.fold.until, folded.at_ms);
    let session = app.sessions.find(id, storage).await?.ok_or_else(gone)?;
    let (applied, ticket) = session
        .offer_fold(&app.policy, folded, shared)
        .map_err(|_| gone())?;
    ticket.durable().await?;
    if applied != Applied::Pending {
        return Ok(applied);
    }
    let deadline = Instant::now() + STORE_WITHIN;
    loop {
        if !session.has_pending() {
            // A turn stored it, or found it stale.
            let now = session.remembered().summary;
            return Ok(match now {
                Some(s) if s.until == until && s.at_ms == at_ms => Applied::Stored(*s),
                _ => Applied::Stale,
            });
        }
        if let Some(claim) = storage.claim(id, Wait::No).await? {
            let found = app.sessions.find(id, storage).await;
            let stored = match found {
                Ok(Some(s)) if Arc::ptr_eq(&s, &session) => s.store_pending(&app.policy),
                Ok(_) => Err(Refused::Ended),
                Err(e) => {
                    drop(storage.release(claim));
                    return Err(e.into());
                }
            };
            drop(storage.release(claim));
            return match stored {
                Ok(Some((applied, ticket))) => {
                    ticket.durable().await?;
                    Ok(applied)
                }
                Ok(None) => continue,
                Err(_) => Err(gone()),
            };
        }
        if !wait {
            return Ok(Applied::Pending);
        }
        if Instant::now() >= deadline {
            return Err(RequestError::Busy { id: id.to_owned() }.into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The window the session API measures a summary against: the first
/// upstream's rendering, the configured limits, tokens estimated.
fn window_of(app: &App) -> Result<(VendorRules, Limits), ApiError> {
    // A config has at least one upstream.
    let rules = app
        .upstreams
        .first()
        .map(|u| u.rules.clone())
        .ok_or(ApiError::Internal)?;
    Ok((rules, Limits::of(&app.policy.history, Encoding::Approx)))
}

/// `PUT /v1/sessions/{id}/summary` with `{"summary": "..."}`: sets the
/// running summary by hand; it covers the messages before the window.
pub async fn put_summary(
    State(app): State<Arc<App>>,
    target: Target,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let max = app.config.memory.summary_max_chars;
    let text = text_field(json_body(&app, body).await?, "summary", max)?;
    let (rules, limits) = window_of(&app)?;
    let now = app.policy.clock.now_ms();
    let (_, stored) = sessions::write(&app, &target, false, Turns::Wait, |s| {
        s.set_summary(&app.policy, text.clone(), &rules, limits, now)
    })
    .await?;
    Ok(Json(
        json!({"session_id": target.name, "summary": stored.view()}),
    ))
}

/// The non-empty string of at most `max` characters under `key` of an
/// object body: what the model's own answer would have to be.
pub(crate) fn text_field(body: Value, key: &str, max: usize) -> Result<String, ApiError> {
    let Value::Object(mut o) = body else {
        let message = format!("the body must be an object with `{key}`");
        return Err(RequestError::invalid(message, None).into());
    };
    let text = match o.remove(key) {
        Some(Value::String(s)) if !s.trim().is_empty() => s,
        _ => {
            let message = format!("`{key}` must be a non-empty string");
            return Err(RequestError::invalid(message, Some(key)).into());
        }
    };
    let n = text.chars().count();
    if n > max {
        let message = format!("`{key}` is {n} characters long, more than the {max} allowed");
        return Err(RequestError::invalid(message, Some(key)).into());
    }
    Ok(text)
}

/// `POST /v1/sessions/{id}/summarize`: folds every message outside the
/// window that the summary does not cover, now, and answers when the new
/// summary is stored (after a fold already running here, if any).
pub async fn summarize(
    State(app): State<Arc<App>>,
    target: Target,
) -> Result<Json<Value>, ApiError> {
    let Some(summarizer) = app.summarizer.clone() else {
        return Err(RequestError::invalid(
            "summaries need [memory] summary_model, with summarize or carry_over on",
            None,
        )
        .into());
    };
    let (rules, limits) = window_of(&app)?;
    let mut folded = 0;
    loop {
        let session = existing(&app, &target).await?;
        let fold = match session.fold_now(&rules, limits) {
            Ok(FoldNow::Start(fold)) => fold,
            Ok(FoldNow::Covered) => break,
            Ok(FoldNow::Running) => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
            // Ended meanwhile: looked up again (a new one, or a 404).
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                continue;
            }
        };
        let running = Running {
            session,
            retry_after_ms: None,
        };
        let n = fold.messages.len();
        let applied = run_fold(&app, &summarizer, &target.id, fold, true).await;
        drop(running);
        match applied? {
            Applied::Stored(_) => {
                folded += n;
                break;
            }
            // Replaced meanwhile: fold again from the new summary.
            Applied::Stale | Applied::Pending => continue,
        }
    }
    let session = existing(&app, &target).await?;
    let remembered = session.remembered();
    Ok(Json(json!({
        "session_id": target.name,
        "folded_messages": folded,
        "summary": remembered.summary.as_ref().map(|s| s.view()),
    })))
}
