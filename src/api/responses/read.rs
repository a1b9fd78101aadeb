//! `GET` and `DELETE /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`,
//! and the cursor pages the Responses and Conversations APIs list with.
//! A response is looked up in the session its id names, within the
//! caller's tenant: another tenant's id is a 404, as an unknown one is.

use std::sync::Arc;

use axum::extract::State;
use axum::Extension;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{ids, items};
use crate::api::auth::Access;
use crate::api::sessions::{self, Turns};
use crate::api::{PathParams, QueryParams};
use crate::error::{ApiError, NotFound, RequestError};
use crate::memory::chain::{self, Span};
use crate::memory::session::{History, Session};
use crate::server::app::App;

/// A response's session, as the caller names it and as it is kept.
pub(super) struct Found {
    pub session: Arc<Session>,
    pub target: sessions::Target,
    pub key: String,
}

fn not_found(id: &str) -> NotFound {
    NotFound {
        what: "Response",
        id: id.to_owned(),
        param: None,
        code: "response_not_found",
    }
}

fn access_of(access: Option<Extension<Access>>) -> Access {
    access.map_or(Access::All, |Extension(a)| a)
}

fn id_param(path: &std::collections::HashMap<String, String>) -> String {
    path.get("id").cloned().unwrap_or_default()
}

async fn find(app: &App, access: &Access, id: &str) -> Result<Found, ApiError> {
    let (name, key) = ids::parse_response(id).ok_or_else(|| not_found(id))?;
    let target = sessions::Target {
        id: access.internal(&name).into_owned(),
        name,
    };
    let session = app
        .sessions
        .find(&target.id, &app.policy.storage)
        .await?
        .ok_or_else(|| not_found(id))?;
    Ok(Found {
        session,
        target,
        key: key.to_owned(),
    })
}

/// The response the path names, with a copy of its session's history and
/// where it sits there.
async fn located(
    app: &App,
    access: Option<Extension<Access>>,
    path: &std::collections::HashMap<String, String>,
) -> Result<(Found, History, Span), ApiError> {
    let id = id_param(path);
    let found = find(app, &access_of(access), &id).await?;
    let history = found.session.snapshot();
    let span = chain::find(&history.messages, &found.key).ok_or_else(|| not_found(&id))?;
    Ok((found, history, span))
}

/// `GET /v1/responses/{id}`
pub async fn get(
    State(app): State<Arc<App>>,
    access: Option<Extension<Access>>,
    PathParams(path): PathParams,
) -> Result<Json<Value>, ApiError> {
    let (found, history, span) = located(&app, access, &path).await?;
    let newest = span.output.end == history.messages.len();
    items::response(
        &history.messages,
        history.first_seq,
        &span,
        &found.target.name,
        history.in_flight && newest,
    )
    .map(Json)
    .ok_or_else(|| not_found(&id_param(&path)).into())
}

/// `DELETE /v1/responses/{id}`: the response can no longer be read or
/// continued; the conversation it was part of keeps its messages.
pub async fn delete(
    State(app): State<Arc<App>>,
    access: Option<Extension<Access>>,
    PathParams(path): PathParams,
) -> Result<Json<Value>, ApiError> {
    let id = id_param(&path);
    let found = find(&app, &access_of(access), &id).await?;
    let key = found.key.as_str();
    let (_, forgot) = sessions::write(&app, &found.target, false, Turns::Wait, |s| {
        s.forget_response(&app.policy, key, app.policy.clock.now_ms())
    })
    .await?;
    if !forgot {
        return Err(not_found(&id).into());
    }
    Ok(Json(
        json!({"id": id, "object": "response", "deleted": true}),
    ))
}

#[derive(Debug, Deserialize)]
pub struct PageQuery {
    after: Option<String>,
    limit: Option<usize>,
    order: Option<String>,
}

/// `GET /v1/responses/{id}/input_items`: the items the response's input
/// added, newest first unless `order=asc`.
pub async fn input_items(
    State(app): State<Arc<App>>,
    access: Option<Extension<Access>>,
    PathParams(path): PathParams,
    QueryParams(q): QueryParams<PageQuery>,
) -> Result<Json<Value>, ApiError> {
    let (found, history, span) = located(&app, access, &path).await?;
    let list = span
        .input
        .flat_map(|i| {
            let seq = history.first_seq + i as u64;
            items::of_message(
                &history.messages[i],
                &ids::items_base(&found.target.name, seq),
            )
        })
        .collect();
    page(list, &q).map(Json)
}

/// One page of `items` (oldest first), as OpenAI's lists: `order`
/// (default `desc`), `after` an item id, `limit` 1 to 100 (default 20).
pub(super) fn page(mut items: Vec<Value>, q: &PageQuery) -> Result<Value, ApiError> {
    let limit = q.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(RequestError::invalid("`limit` must be from 1 to 100", Some("limit")).into());
    }
    match q.order.as_deref() {
        None | Some("desc") => items.reverse(),
        Some("asc") => {}
        Some(_) => {
            return Err(
                RequestError::invalid("`order` must be `asc` or `desc`", Some("order")).into(),
            )
        }
    }
    let start = match &q.after {
        None => 0,
        Some(after) => {
            items
                .iter()
                .position(|i| i["id"].as_str() == Some(after.as_str()))
                .ok_or_else(|| {
                    RequestError::invalid(format!("no item `{after}` in this list"), Some("after"))
                })?
                + 1
        }
    };
    let has_more = items.len() > start + limit;
    let data: Vec<Value> = items.into_iter().skip(start).take(limit).collect();
    Ok(json!({
        "object": "list",
        "first_id": data.first().map(|i| i["id"].clone()),
        "last_id": data.last().map(|i| i["id"].clone()),
        "has_more": has_more,
        "data": data,
    }))
}
