//! `/v1/users/{user}/memory/records`: a user's long-term records, listed,
//! read, searched by meaning, added by hand and deleted, within the
//! caller's tenant; and `POST /v1/sessions/{id}/memory/extract`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{Extracted, LongTerm};
use crate::api::extract::{PathParams, QueryParams};
use crate::api::sessions::{existing, json_body, text_field, Target};
use crate::api::users::UserTarget;
use crate::error::{ApiError, NotFound, RequestError};
use crate::memory::long_term::{self as lt, Record};
use crate::memory::session::ExtractNow;
use crate::server::app::App;

/// The bounds on a search's `limit`.
const LIMITS: std::ops::RangeInclusive<u64> = 5..=200;

fn record_json(user: &str, r: &Record) -> Value {
    json!({
        "id": r.id, "object": "memory.record", "text": r.text, "strategy": r.strategy,
        "namespace": r.namespace, "user": user, "session": r.session,
        "said_at": r.said_at, "superseded_by": r.superseded_by, "valid_to": r.valid_to,
        "created_at": r.created_at, "updated_at": r.updated_at, "recalled_at": r.recalled_at,
    })
}

fn enabled(app: &App) -> Result<&Arc<LongTerm>, ApiError> {
    app.long_term.as_ref().ok_or_else(|| {
        RequestError::invalid(
            "long-term memory is off: set [long_term] enabled, extract_model and embedding_model",
            None,
        )
        .into()
    })
}

fn no_record(id: &str) -> ApiError {
    RequestError::ObjectNotFound(NotFound {
        what: "memory record",
        id: id.to_owned(),
        param: Some("id"),
        code: "memory_record_not_found",
    })
    .into()
}

fn record_id(path: &PathParams) -> String {
    path.0.get("id").cloned().unwrap_or_default()
}

/// A field of a search body: absent, or a number within `range`.
fn number(
    body: &Map<String, Value>,
    key: &str,
    range: (f64, f64),
    integer: bool,
) -> Result<Option<f64>, ApiError> {
    let Some(v) = body.get(key) else {
        return Ok(None);
    };
    let (lo, hi) = range;
    let kind = if integer { "an integer" } else { "a number" };
    match v.as_f64() {
        Some(x) if (lo..=hi).contains(&x) && (!integer || x.fract() == 0.0) => Ok(Some(x)),
        _ => Err(RequestError::invalid(
            format!("`{key}` must be {kind} from {lo} to {hi}, inclusive"),
            Some(key),
        )
        .into()),
    }
}

fn string<'b>(body: &'b Map<String, Value>, key: &str) -> Result<Option<&'b str>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => {
            Err(RequestError::invalid(format!("`{key}` must be a string"), Some(key)).into())
        }
    }
}

async fn object_body(app: &App, body: Body) -> Result<Map<String, Value>, ApiError> {
    match json_body(app, body).await? {
        Value::Object(o) => Ok(o),
        _ => Err(RequestError::invalid("the body must be a JSON object", None).into()),
    }
}

/// `POST .../records/search` with `{"query", "limit", "score_threshold",
/// "namespace"}`: the records most like `query`, best first, each with
/// its cosine similarity as `score`.
pub async fn search_records(
    State(app): State<Arc<App>>,
    user: UserTarget,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let long_term = enabled(&app)?;
    let body = object_body(&app, body).await?;
    // What a turn's recall embeds is cut to this length; a caller is
    // told, since the embedding model would refuse a text past its own.
    let query = text_field(Value::Object(body.clone()), "query", lt::MAX_QUERY_CHARS)?;
    let (lo, hi) = (*LIMITS.start() as f64, *LIMITS.end() as f64);
    let limit =
        number(&body, "limit", (lo, hi), true)?.map_or(long_term.config.limit, |x| x as usize);
    let threshold = number(&body, "score_threshold", (0.0, 1.0), false)?
        .map_or(long_term.config.score_threshold, |x| x as f32);
    let namespace = string(&body, "namespace")?;
    let found = long_term
        .search(&user.key, &query, limit, threshold, namespace)
        .await?;
    let data: Vec<Value> = found
        .iter()
        .map(|(r, score)| {
            let mut v = record_json(&user.name, r);
            v["score"] = json!(score);
            v
        })
        .collect();
    Ok(Json(json!({"object": "list", "data": data})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    limit: Option<usize>,
    after: Option<String>,
    namespace: Option<String>,
    include_superseded: Option<bool>,
}

/// `GET .../records?limit=&after=&namespace=&include_superseded=`: newest
/// (last updated) first, in pages of `limit` (1 to 100, default 20) after
/// the record `after`; superseded records only with `include_superseded=true`.
pub async fn list_records(
    State(app): State<Arc<App>>,
    user: UserTarget,
    QueryParams(q): QueryParams<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = q.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(RequestError::invalid("`limit` must be from 1 to 100", Some("limit")).into());
    }
    let held = app.records.of(&app.policy.storage, &user.key).await?;
    let mut all: Vec<&Record> = held
        .records
        .iter()
        .map(|r| &**r)
        .filter(|r| q.namespace.as_ref().is_none_or(|ns| &r.namespace == ns))
        .filter(|r| q.include_superseded == Some(true) || lt::supersede::current(r))
        .collect();
    all.sort_by(|a, b| b.updated_at.cmp(&a.updated_at).then(b.id.cmp(&a.id)));
    let start = match &q.after {
        Some(after) => all
            .iter()
            .position(|r| &r.id == after)
            .map(|i| i + 1)
            .ok_or_else(|| {
                RequestError::invalid("`after` names no record of this list", Some("after"))
            })?,
        None => 0,
    };
    let page: Vec<Value> = all
        .iter()
        .skip(start)
        .take(limit)
        .map(|r| record_json(&user.name, r))
        .collect();
    let has_more = all.len() > start + page.len();
    Ok(Json(json!({
        "object": "list",
        "first_id": page.first().map(|r| r["id"].clone()),
        "last_id": page.last().map(|r| r["id"].clone()),
        "has_more": has_more,
        "data": page,
    })))
}

/// `GET .../records/{id}`.
pub async fn get_record(
    State(app): State<Arc<App>>,
    user: UserTarget,
    path: PathParams,
) -> Result<Json<Value>, ApiError> {
    let id = record_id(&path);
    let held = app.records.of(&app.policy.storage, &user.key).await?;
    let r = held
        .records
        .iter()
        .find(|r| r.id == id)
        .ok_or_else(|| no_record(&id))?;
    Ok(Json(record_json(&user.name, r)))
}

/// `DELETE .../records/{id}`.
pub async fn delete_record(
    State(app): State<Arc<App>>,
    user: UserTarget,
    path: PathParams,
) -> Result<Json<Value>, ApiError> {
    let id = record_id(&path);
    if !app
        .records
        .delete(&app.policy.storage, &user.key, &id)
        .await?
    {
        return Err(no_record(&id));
    }
    Ok(Json(
        json!({"id": id, "object": "memory.record.deleted", "deleted": true}),
    ))
}

/// `POST .../records` with `{"text", "strategy", "said_at"}` (the last two
/// optional): stores a fact as an extraction would (embedded; an update
/// of a record it is close to), dated `said_at` (Unix ms) or now.
pub async fn add_record(
    State(app): State<Arc<App>>,
    user: UserTarget,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let long_term = enabled(&app)?;
    let body = object_body(&app, body).await?;
    let text = text_field(Value::Object(body.clone()), "text", lt::MAX_FACT_CHARS)?
        .trim()
        .to_owned();
    let strategies = long_term.strategies();
    let strategy = match string(&body, "strategy")? {
        None => strategies.first(),
        Some(name) => strategies.iter().find(|s| s.name == name),
    }
    .ok_or_else(|| {
        RequestError::invalid("`strategy` names no configured strategy", Some("strategy"))
    })?;
    let said_at = match number(&body, "said_at", (0.0, crate::clock::LAST_MS as f64), true)? {
        Some(ms) => ms as i64,
        None => app.policy.clock.now_ms(),
    };
    let done = long_term
        .add(&user.key, &user.name, text, Some(said_at), strategy)
        .await?;
    let held = app.records.of(&app.policy.storage, &user.key).await?;
    let stored = held
        .records
        .iter()
        .find(|r| done.ids.first() == Some(&r.id))
        .ok_or(ApiError::Internal)?;
    let mut v = record_json(&user.name, stored);
    v["updated"] = json!(done.updated > 0);
    Ok(Json(v))
}

/// `POST /v1/sessions/{id}/memory/extract`: extracts every message not
/// extracted yet into the session's user's records, now, and answers when
/// they are stored (after an extraction already running here, if any).
pub async fn extract(State(app): State<Arc<App>>, target: Target) -> Result<Json<Value>, ApiError> {
    let long_term = enabled(&app)?;
    let deadline = tokio::time::Instant::now()
        + std::time::Duration::from_secs(long_term.config.timeout_secs.saturating_mul(4));
    loop {
        if tokio::time::Instant::now() >= deadline {
            return Err(RequestError::Busy { id: target.name }.into());
        }
        let session = existing(&app, &target).await?;
        let ex = match session.extract_now() {
            Ok(ExtractNow::Start(ex)) => ex,
            Ok(ExtractNow::Nothing) => {
                return Ok(Json(extracted(&target.name, &Extracted::default())))
            }
            Ok(ExtractNow::Running) | Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let done = crate::long_term::jobs::extract(Arc::clone(long_term), Some(session), ex)
            .await
            .map_err(|_| ApiError::Internal)??;
        return Ok(Json(extracted(&target.name, &done)));
    }
}

/// The extract endpoint's answer: what the extraction did.
fn extracted(session: &str, done: &Extracted) -> Value {
    json!({
        "session_id": session, "facts": done.facts, "added": done.added,
        "updated": done.updated, "evicted": done.evicted, "left_out": done.left_out,
        "too_long": done.too_long, "superseded": done.superseded, "stale": done.stale,
    })
}
