//! The session API: an operator's (or the agent backend's) view of memory.
//! List, read, seed, append to, clear and end sessions; set their system
//! messages at runtime; tell recall what the user actually heard.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::response::IntoResponse;
use axum::Extension;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::QueryParams;
use crate::api::auth::Access;
use crate::config::OnNewRequest;
use crate::error::{ApiError, RequestError};
use crate::memory::interruption::Spoken;
use crate::memory::lifecycle;
use crate::memory::message::{parse_messages, Message};
use crate::memory::session::{Interrupted, Refused, Session, Summary};
use crate::server::app::App;
use crate::store::{Claim, Ticket, Wait};
use crate::webhook::{EndReason, Event};

/// The session a request names in its path: `name` as the caller knows it,
/// `id` as it is kept (within the caller's tenant, see `auth`).
pub struct Target {
    pub id: String,
    pub name: String,
}

impl<S: Send + Sync> FromRequestParts<S> for Target {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(params) = Path::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(|e| RequestError::invalid(e.body_text(), Some("session_id")))?;
        let name = params.get("id").cloned().unwrap_or_default();
        let access = parts
            .extensions
            .get::<Access>()
            .cloned()
            .unwrap_or(Access::All);
        Ok(Target {
            id: access.internal(&name).into_owned(),
            name,
        })
    }
}

async fn existing(app: &App, target: &Target) -> Result<Arc<Session>, ApiError> {
    app.sessions
        .find(&target.id, &app.policy.storage)
        .await?
        .ok_or_else(|| {
            RequestError::SessionNotFound {
                id: target.name.clone(),
            }
            .into()
        })
}

/// For writes that may start a session (seeding memory before the first
/// turn); the id is checked like a chat request's.
async fn existing_or_new(app: &App, target: &Target) -> Result<Arc<Session>, ApiError> {
    crate::memory::session::validate_id(&target.name)
        .map_err(|m| RequestError::invalid(m, Some("session_id")))?;
    let (session, created) = app
        .sessions
        .open(&target.id, &app.policy.storage, app.policy.clock.now_ms())
        .await?;
    if created {
        app.session_created();
    }
    Ok(session)
}

/// How a write treats a reply in flight: interrupt it (an operator's
/// write wins), follow `on_new_request` (like a new turn), or wait for it.
#[derive(Clone, Copy)]
enum Turns {
    Interrupt,
    AsConfigured,
    Wait,
}

/// Applies a write to the session (made first when `create`), waits until
/// it is durable, and answers with the session and the write's result. A
/// session that ended under the write is looked up again. With shared
/// storage the write holds the session's lease, like a turn.
async fn write<T>(
    app: &App,
    target: &Target,
    create: bool,
    turns: Turns,
    op: impl Fn(&Arc<Session>) -> Result<(T, Ticket), Refused>,
) -> Result<(Arc<Session>, T), ApiError> {
    let storage = &app.policy.storage;
    loop {
        let claim = if storage.shared() {
            let local = app.sessions.get(&target.id);
            let wait = match turns {
                Turns::Interrupt => Wait::Interrupt,
                Turns::Wait => Wait::Patiently,
                Turns::AsConfigured => match app.policy.on_new_request {
                    OnNewRequest::Interrupt => Wait::Interrupt,
                    OnNewRequest::Reject => Wait::No,
                },
            };
            if let (Some(local), true) = (local, wait != Wait::Patiently) {
                let policy = match wait {
                    Wait::No => OnNewRequest::Reject,
                    _ => OnNewRequest::Interrupt,
                };
                local
                    .settle(&app.policy, policy)
                    .map_err(|r| refused(target, r))?;
            }
            let busy = || RequestError::Busy {
                id: target.name.clone(),
            };
            Some(storage.claim(&target.id, wait).await?.ok_or_else(busy)?)
        } else {
            None
        };
        let session = if create {
            existing_or_new(app, target).await
        } else {
            existing(app, target).await
        };
        let release = |claim: Option<Claim>| claim.map(|c| storage.release(c));
        let session = match session {
            Ok(s) => s,
            Err(e) => {
                release(claim);
                return Err(e);
            }
        };
        match op(&session) {
            Ok((value, ticket)) => {
                release(claim);
                ticket.durable().await?;
                return Ok((session, value));
            }
            Err(Refused::Ended) => {
                release(claim);
                continue;
            }
            Err(r) => {
                release(claim);
                return Err(refused(target, r));
            }
        }
    }
}

fn refused(target: &Target, r: Refused) -> ApiError {
    match r {
        Refused::Busy => RequestError::Busy {
            id: target.name.clone(),
        }
        .into(),
        Refused::Ended => RequestError::SessionNotFound {
            id: target.name.clone(),
        }
        .into(),
    }
}

async fn json_body(app: &App, body: Body) -> Result<Value, ApiError> {
    let bytes = super::read_body(app, body).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        RequestError::invalid(format!("the request body is not valid JSON: {e}"), None).into()
    })
}

/// Takes the message list under one of `keys` from a JSON object body.
fn message_list(body: Value, keys: &[&str]) -> Result<Vec<Message>, ApiError> {
    let Value::Object(mut obj) = body else {
        return Err(RequestError::invalid(
            format!("the body must be an object with `{}`", keys[0]),
            None,
        )
        .into());
    };
    let Some(list) = keys.iter().find_map(|k| obj.remove(*k)) else {
        return Err(RequestError::invalid(format!("missing `{}`", keys[0]), Some(keys[0])).into());
    };
    let Value::Array(list) = list else {
        return Err(RequestError::invalid(
            format!("`{}` must be an array", keys[0]),
            Some(keys[0]),
        )
        .into());
    };
    Ok(parse_messages(list)?)
}

/// History holds the conversation; instructions go to `system_messages`.
fn no_instructions(messages: &[Message]) -> Result<(), ApiError> {
    match messages.iter().position(Message::is_instruction) {
        Some(i) => Err(RequestError::invalid(
            format!("messages[{i}] is a {} message: set those with PUT /v1/sessions/{{id}}/system_messages", messages[i].role),
            Some(&format!("messages[{i}].role")),
        )
        .into()),
        None => Ok(()),
    }
}

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
    let mut data: Vec<Summary> = if app.policy.storage.persistent() {
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
                Some(live) => live.summary(),
                None => Summary::from_listed(l),
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
            .map(|s| s.summary())
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
    Ok(Json(json!(existing(&app, &target).await?.summary())))
}

#[derive(Debug, Deserialize)]
pub struct HistoryQuery {
    format: Option<String>,
    limit: Option<usize>,
    #[serde(default)]
    include_superseded: bool,
}

/// `GET /v1/sessions/{id}/history[?format=openai][&limit=N]
/// [&include_superseded=true]`: the stored messages, oldest first, with all
/// their fields (seed 000's shape), or only OpenAI's fields, ready to pass
/// to a model. Messages a regenerate, an edit or a retry superseded are
/// left out unless asked for, and always from the OpenAI form.
pub async fn history(
    State(app): State<Arc<App>>,
    target: Target,
    QueryParams(q): QueryParams<HistoryQuery>,
) -> Result<axum::response::Response, ApiError> {
    let openai = match q.format.as_deref() {
        None | Some("full") => false,
        Some("openai") => true,
        Some(_) => {
            return Err(
                RequestError::invalid("format must be `full` or `openai`", Some("format")).into(),
            )
        }
    };
    let session = existing(&app, &target).await?;
    let mut history = session.snapshot();
    if openai || !q.include_superseded {
        history
            .messages
            .retain(|m| !crate::memory::interruption::is_superseded(m));
    }
    let skip = q
        .limit
        .map_or(0, |n| history.messages.len().saturating_sub(n));
    let newest = &history.messages[skip..];
    // Written straight from the messages, so that their fields keep their
    // order (role first), as seed 000 shows them.
    let body = if openai {
        let contents: Vec<Value> = newest.iter().map(|m| m.to_openai()).collect();
        serde_json::to_vec(&HistoryBody {
            session_id: &target.name,
            turn_id: history.turn_id,
            contents: &contents,
        })
    } else {
        serde_json::to_vec(&HistoryBody {
            session_id: &target.name,
            turn_id: history.turn_id,
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

#[derive(serde::Serialize)]
struct HistoryBody<'a, T: serde::Serialize> {
    session_id: &'a str,
    turn_id: u64,
    contents: &'a [T],
}

/// `PUT /v1/sessions/{id}/history` with `{"contents": [...]}` (or
/// `"messages"`): replaces the history; a session's initial memory.
pub async fn replace_history(
    State(app): State<Arc<App>>,
    target: Target,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let body = json_body(&app, body).await?;
    let messages = message_list(body, &["contents", "messages"])?;
    no_instructions(&messages)?;
    let (_, count) = write(&app, &target, true, Turns::Interrupt, |s| {
        s.replace_history(&app.policy, messages.clone(), app.policy.clock.now_ms())
    })
    .await?;
    Ok(Json(
        json!({"session_id": target.name, "message_count": count}),
    ))
}

/// `POST /v1/sessions/{id}/messages` with `{"messages": [...]}`: appends
/// without calling the model (a greeting, a command, a silence reminder).
pub async fn append(
    State(app): State<Arc<App>>,
    target: Target,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let body = json_body(&app, body).await?;
    let messages = message_list(body, &["messages"])?;
    no_instructions(&messages)?;
    let (_, stored) = write(&app, &target, true, Turns::AsConfigured, |s| {
        s.append_messages(&app.policy, messages.clone(), app.policy.clock.now_ms())
    })
    .await?;
    Ok(Json(json!({"session_id": target.name, "messages": stored})))
}

/// `DELETE /v1/sessions/{id}/history`: clears the history (seed 003's
/// reset); the session and its system messages stay.
pub async fn clear_history(
    State(app): State<Arc<App>>,
    target: Target,
) -> Result<Json<Value>, ApiError> {
    let (_, cleared) = write(&app, &target, false, Turns::Interrupt, |s| {
        s.clear_history(&app.policy, app.policy.clock.now_ms())
    })
    .await?;
    Ok(Json(json!({"session_id": target.name, "deleted": cleared})))
}

/// `GET /v1/sessions/{id}/system_messages`.
pub async fn system_messages(
    State(app): State<Arc<App>>,
    target: Target,
) -> Result<Json<Value>, ApiError> {
    let session = existing(&app, &target).await?;
    Ok(Json(json!({"system_messages": session.system_messages()})))
}

/// `PUT /v1/sessions/{id}/system_messages` with `{"system_messages": [...]}`:
/// instructions sent after the configured ones, from the next call on.
pub async fn set_system_messages(
    State(app): State<Arc<App>>,
    target: Target,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let body = json_body(&app, body).await?;
    let messages = message_list(body, &["system_messages"])?;
    if let Some(i) = messages.iter().position(|m| !m.is_instruction()) {
        return Err(RequestError::invalid(
            "system_messages may only hold system or developer messages",
            Some(&format!("system_messages[{i}].role")),
        )
        .into());
    }
    let (session, ()) = write(&app, &target, true, Turns::Wait, |s| {
        let ticket =
            s.set_system_messages(&app.policy, messages.clone(), app.policy.clock.now_ms())?;
        Ok(((), ticket))
    })
    .await?;
    Ok(Json(json!({"system_messages": session.system_messages()})))
}

/// `POST /v1/sessions/{id}/end` and `DELETE /v1/sessions/{id}`: ends the
/// session and hands its memory to the webhook; answers with that record.
pub async fn end(
    State(app): State<Arc<App>>,
    target: Target,
) -> Result<axum::response::Response, ApiError> {
    let session = existing(&app, &target).await?;
    match lifecycle::end(&app, &session, EndReason::Ended).await? {
        // Written straight from the event, as the webhook receives it.
        Some(event @ Event::SessionEnded { .. }) => {
            let body = serde_json::to_vec(&event).map_err(|_| ApiError::Internal)?;
            Ok((
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                body,
            )
                .into_response())
        }
        _ => Err(RequestError::SessionNotFound {
            id: target.name.clone(),
        }
        .into()),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct InterruptBody {
    spoken: Option<String>,
    spoken_chars: Option<usize>,
}

/// `POST /v1/sessions/{id}/interrupt`, optionally with `{"spoken": "..."}`
/// or `{"spoken_chars": N}`: the user cut the bot off, having heard that
/// much. The reply in flight is cut off for its client and recorded as
/// interrupted; with no reply in flight, the newest stored reply is marked.
pub async fn interrupt(
    State(app): State<Arc<App>>,
    target: Target,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let body = json_body(&app, body).await?;
    let parsed: InterruptBody = match body {
        Value::Null => InterruptBody::default(),
        other => serde_json::from_value(other).map_err(|e| {
            RequestError::invalid(
                format!(
                    "the body must be {{\"spoken\": text}} or {{\"spoken_chars\": number}}: {e}"
                ),
                None,
            )
        })?,
    };
    let spoken = match parsed {
        InterruptBody {
            spoken: Some(_),
            spoken_chars: Some(_),
        } => {
            return Err(RequestError::invalid(
                "give either `spoken` or `spoken_chars`, not both",
                Some("spoken"),
            )
            .into())
        }
        InterruptBody {
            spoken: Some(text), ..
        } => Some(Spoken::Text(text)),
        InterruptBody {
            spoken_chars: Some(n),
            ..
        } => Some(Spoken::Chars(n)),
        _ => None,
    };
    let storage = &app.policy.storage;
    let local = app.sessions.get(&target.id).filter(|s| s.is_busy());
    // With shared storage the reply may stream on another replica: taking
    // the lease asks that replica to cut it off and record it first.
    let claim = match (&local, storage.shared()) {
        (None, true) => Some(
            storage
                .claim(&target.id, Wait::Interrupt)
                .await?
                .ok_or_else(|| RequestError::Busy {
                    id: target.name.clone(),
                })?,
        ),
        _ => None,
    };
    let session = match existing(&app, &target).await {
        Ok(s) => s,
        Err(e) => {
            let _ = claim.map(|c| storage.release(c));
            return Err(e);
        }
    };
    let outcome = session.interrupt(&app.policy, spoken.as_ref(), app.policy.clock.now_ms());
    let _ = claim.map(|c| storage.release(c));
    let (was, record, ticket) = match outcome {
        Interrupted::InFlight(m, t) => ("in_flight", m, t),
        Interrupted::Stored(m, t) => ("stored", m, t),
        Interrupted::NothingToInterrupt => {
            return Err(RequestError::NothingToInterrupt {
                id: target.name.clone(),
            }
            .into())
        }
    };
    ticket.durable().await?;
    Ok(Json(json!({
        "session_id": target.name,
        "interrupted": was,
        "message": record,
    })))
}
