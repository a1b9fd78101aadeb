//! The session API's reads: listings, a session's summary, its history
//! and its system messages.

use std::sync::Arc;

use axum::extract::State;
use axum::response::IntoResponse;
use axum::Extension;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::QueryParams;
use super::*;
use crate::api::auth::Access;
use crate::error::{ApiError, RequestError};
use crate::memory::session::Overview;
use crate::server::app::App;

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    limit: Option<usize>,
    after: Option<String>,
    user: Option<String>,
}

/// `GET /v1/sessions?limit=&after=&user=`: sessions in id order, paginated
/// like OpenAI's lists.
pub async fn list(
    State(app): State<Arc<App>>,
    access: Option<Extension<Access>>,
    QueryParams(q): QueryParams<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let access = access.map_or(Access::All, |Extension(a)| a);
    let limit = q.limit.unwrap_or(20).clamp(1, 1000);
    // Ids sort by tenant first: a tenant's sessions follow `<tenant>:`.
    let after = access.internal(q.after.as_deref().unwrap_or_default());
    let after = Some(after.as_ref()).filter(|a| !a.is_empty());
    let mut data: Vec<Overview> = if app.policy.storage.persistent() {
        let listed = app
            .policy
            .storage
            .list(after, limit + 1, q.user.as_deref())
            .await?;
        listed
            .into_iter()
            .filter(|l| access.show(&l.id).is_some())
            .map(|l| match app.sessions.get(&l.id) {
                // The working set knows whether a reply is in flight.
                Some(live) => live.overview(),
                None => Overview::from_listed(l),
            })
            .collect()
    } else {
        let mut sessions: Vec<_> = app
            .sessions
            .all()
            .into_iter()
            .filter(|s| access.show(&s.id).is_some())
            .filter(|s| after.is_none_or(|after| s.id.as_str() > after))
            .filter(|s| q.user.as_deref().is_none_or(|u| s.has_user(u)))
            .collect();
        sessions.sort_by(|a, b| a.id.cmp(&b.id));
        sessions
            .iter()
            .take(limit + 1)
            .map(|s| s.overview())
            .collect()
    };
    for s in &mut data {
        if let Some(shown) = access.show(&s.id) {
            s.id = shown.to_owned();
        }
    }
    let has_more = data.len() > limit;
    data.truncate(limit);
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "first_id": data.first().map(|s| s.id.clone()),
        "last_id": data.last().map(|s| s.id.clone()),
        "has_more": has_more,
    })))
}

/// `GET /v1/sessions/{id}`: one session's summary.
pub async fn get(State(app): State<Arc<App>>, target: Target) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(existing(&app, &target).await?.overview())))
}

#[derive(Debug, Deserialize)]
pub struct HistoryQuery {
    format: Option<String>,
    limit: Option<usize>,
    #[serde(default)]
    include_superseded: bool,
}

/// `GET /v1/sessions/{id}/history[?format=openai|text][&limit=N]
/// [&include_superseded=true]`: the stored messages, oldest first, with all
/// their fields (the extension fields too), or only OpenAI's fields, ready to pass
/// to a model, or as one text (`USER: ...`, `memory::text`). Messages a regenerate, an edit or a retry superseded are
/// left out unless asked for, and always from the OpenAI and text forms.
pub async fn history(
    State(app): State<Arc<App>>,
    target: Target,
    QueryParams(q): QueryParams<HistoryQuery>,
) -> Result<axum::response::Response, ApiError> {
    let (openai, text) = match q.format.as_deref() {
        None | Some("full") => (false, false),
        Some("openai") => (true, false),
        Some("text") => (false, true),
        Some(_) => {
            return Err(RequestError::invalid(
                "format must be `full`, `openai` or `text`",
                Some("format"),
            )
            .into())
        }
    };
    let session = existing(&app, &target).await?;
    let mut history = session.snapshot();
    let remembered = session.remembered();
    // The full form shows the running summary the window continues.
    let summary = remembered
        .summary
        .as_ref()
        .filter(|_| !openai)
        .map(|s| s.view());
    if openai || text || !q.include_superseded {
        history
            .messages
            .retain(|m| !crate::memory::interruption::is_superseded(m));
    }
    let skip = q
        .limit
        .map_or(0, |n| history.messages.len().saturating_sub(n));
    let newest = &history.messages[skip..];
    if text {
        return Ok(text_response(crate::memory::text::transcript(newest)));
    }
    // Written straight from the messages, so that their fields keep their
    // order (role first), as the README shows them.
    let body = if openai {
        let contents: Vec<Value> = newest.iter().map(|m| m.to_openai()).collect();
        serde_json::to_vec(&HistoryBody {
            session_id: &target.name,
            turn_id: history.turn_id,
            summary: None,
            contents: &contents,
        })
    } else {
        serde_json::to_vec(&HistoryBody {
            session_id: &target.name,
            turn_id: history.turn_id,
            summary,
            contents: newest,
        })
    };
    let body = body.map_err(|e| {
        tracing::error!(error = %e, "history not serialisable");
        ApiError::Internal
    })?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response())
}

/// Plain text, for `format=text`.
pub(crate) fn text_response(text: String) -> axum::response::Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

#[derive(serde::Serialize)]
struct HistoryBody<'a, T: serde::Serialize> {
    session_id: &'a str,
    turn_id: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    summary: Option<crate::memory::summary::View<'a>>,
    contents: &'a [T],
}

/// `GET /v1/sessions/{id}/system_messages`.
pub async fn system_messages(
    State(app): State<Arc<App>>,
    target: Target,
) -> Result<Json<Value>, ApiError> {
    let session = existing(&app, &target).await?;
    Ok(Json(json!({"system_messages": session.system_messages()})))
}
