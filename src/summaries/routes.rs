//! The session API's summary: `PUT /v1/sessions/{id}/summary` (set by
//! hand) and `POST /v1/sessions/{id}/summarize` (fold now).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::folds::{run_fold, Running};
use crate::api::sessions::{self, existing, json_body, text_field, Target, Turns};
use crate::error::{ApiError, RequestError};
use crate::memory::session::{Applied, FoldNow};
use crate::memory::tokens::Encoding;
use crate::memory::window::Limits;
use crate::proxy::protocol::VendorRules;
use crate::server::app::App;

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
