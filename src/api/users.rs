//! `/v1/users/{user}/memory`: a user's carried note, read, set and
//! forgotten (everywhere, with their long-term records), within the
//! caller's tenant; and the user a conversation's metadata names.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::{json, Value};

use crate::api::auth::Access;
use crate::api::sessions::{self, json_body, Target, Turns};
use crate::api::QueryParams;
use crate::error::{ApiError, NotFound, RequestError};
use crate::memory::summary::{self, Note};
use crate::server::app::App;

/// The user a `/v1/users/{user}/memory` request names: as the caller knows
/// them, and their note's key within the caller's tenant.
pub struct UserTarget {
    pub name: String,
    pub key: String,
}

impl<S: Send + Sync> FromRequestParts<S> for UserTarget {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let (name, access) = sessions::named(parts, state, "user", "user").await?;
        if name.trim().is_empty() || name.len() > 256 {
            return Err(
                RequestError::invalid("a user id is 1 to 256 characters", Some("user")).into(),
            );
        }
        Ok(UserTarget {
            key: access.internal(&name).into_owned(),
            name,
        })
    }
}

fn note_json(user: &str, note: &Note) -> Value {
    json!({"user": user, "note": note.text, "model": note.model, "updated_at": note.at_ms})
}

fn no_note(user: &UserTarget) -> ApiError {
    RequestError::ObjectNotFound(NotFound {
        what: "user memory",
        id: user.name.clone(),
        param: Some("user"),
        code: "user_memory_not_found",
    })
    .into()
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryQuery {
    format: Option<String>,
}

/// `GET /v1/users/{user}/memory[?format=text]`: the note the user's next
/// session starts with; as text, the note and the user's long-term facts
/// (newest first) in one block, as a turn's system messages frame them.
pub async fn get_user_memory(
    State(app): State<Arc<App>>,
    user: UserTarget,
    QueryParams(q): QueryParams<MemoryQuery>,
) -> Result<axum::response::Response, ApiError> {
    let text = match q.format.as_deref() {
        None | Some("json") => false,
        Some("text") => true,
        Some(_) => {
            return Err(
                RequestError::invalid("format must be `json` or `text`", Some("format")).into(),
            )
        }
    };
    let note = app
        .notes
        .get(&app.policy.storage, &user.key)
        .await?
        .filter(|n| !n.forgotten);
    if !text {
        return match note {
            Some(note) => Ok(Json(note_json(&user.name, &note)).into_response()),
            None => Err(no_note(&user)),
        };
    }
    let held = app.records.of(&app.policy.storage, &user.key).await?;
    let facts = crate::memory::long_term::recent(&held.records, held.records.len());
    let block = crate::memory::text::user_memory(
        note.as_ref().map(|n| {
            (
                app.config.memory.carry_over_template.as_str(),
                n.text.as_str(),
            )
        }),
        Some((app.config.long_term.template.as_str(), &facts)),
    );
    match block {
        Some(block) => Ok(sessions::text_response(block)),
        None => Err(no_note(&user)),
    }
}

/// `PUT /v1/users/{user}/memory` with `{"note": "..."}`: sets the note.
pub async fn put_user_memory(
    State(app): State<Arc<App>>,
    user: UserTarget,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    // The bound a model's note is held to.
    let max = app.config.memory.carry_over_max_chars.saturating_mul(2);
    let text = sessions::text_field(json_body(&app, body).await?, "note", max)?;
    let note = Note {
        text,
        model: summary::MANUAL.into(),
        at_ms: app.policy.clock.now_ms(),
        forgotten: false,
    };
    app.notes
        .put(&app.policy.storage, &user.key, &note)
        .durable()
        .await?;
    Ok(Json(note_json(&user.name, &note)))
}

/// `DELETE /v1/users/{user}/memory`: forgets the note, and with it every
/// copy sessions hold (the note they started with) and their carrying
/// into it when they end. What is left says when: a carry-over of a
/// session that began before (still running, or on another replica)
/// then writes nothing (`summarizer::carry`).
pub async fn delete_user_memory(
    State(app): State<Arc<App>>,
    user: UserTarget,
) -> Result<Json<Value>, ApiError> {
    let storage = &app.policy.storage;
    let had = app
        .notes
        .get(storage, &user.key)
        .await?
        .is_some_and(|n| !n.forgotten);
    // Long-term records first (a failure below leaves none behind), whether `[long_term]` is on now or not: they may
    // be from when it was.
    let records = app
        .records
        .forget(storage, &user.key, app.policy.clock.now_ms())
        .await?;
    let gone = Note::forgotten(app.policy.clock.now_ms());
    app.notes.put(storage, &user.key, &gone).durable().await?;
    let mut ids: Vec<String> = app
        .sessions
        .all()
        .iter()
        .filter(|s| s.remembered().user.as_deref() == Some(&user.key))
        .map(|s| s.id.clone())
        .collect();
    if storage.persistent() {
        // The users index names sessions by the user as they sent it.
        let mut after: Option<String> = None;
        loop {
            let page = storage
                .list(after.as_deref(), 500, Some(&user.name))
                .await?;
            let Some(last) = page.last() else { break };
            after = Some(last.id.clone());
            ids.extend(
                page.into_iter()
                    .filter(|l| l.meta.remembered.user.as_deref() == Some(&user.key))
                    .map(|l| l.id),
            );
        }
    }
    ids.sort();
    ids.dedup();
    let mut sessions = 0;
    for id in ids {
        let target = Target {
            name: id.clone(),
            id,
        };
        let key = user.key.clone();
        match sessions::write(&app, &target, false, Turns::Wait, |s| {
            s.forget_user(&app.policy, &key)
        })
        .await
        {
            Ok((_, true)) => sessions += 1,
            Ok((_, false)) => {}
            // Ended meanwhile: nothing of it is left to forget.
            Err(ApiError::Request(RequestError::SessionNotFound { .. })) => {}
            Err(e) => return Err(e),
        }
    }
    if !had && sessions == 0 && records == 0 {
        return Err(no_note(&user));
    }
    Ok(Json(json!({
        "user": user.name, "deleted": true, "sessions": sessions, "records": records,
    })))
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
