//! Folds of a session's running summary, run in the background for the
//! turn that made one due (`start_fold`) or for the session API's
//! `summarize` (`routes`), and stored through the session.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Summarizer;
use crate::error::{ApiError, RequestError};
use crate::memory::session::{Applied, Refused, Session};
use crate::memory::summary::{Fold, Folded};
use crate::server::app::App;
use crate::store::Wait;

/// After a fold gives up, the next waits this long.
const RETRY_AFTER_MS: i64 = 30_000;

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
pub(super) struct Running {
    pub session: Arc<Session>,
    pub retry_after_ms: Option<i64>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.session.fold_ended(self.retry_after_ms);
    }
}

/// Asks the summary model for `fold`, and stores its answer through the
/// session. With `wait`, until it is stored; else a busy session on shared
/// storage may keep it for its next turn.
pub(super) async fn run_fold(
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
