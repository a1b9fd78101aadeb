//! The session API: an operator's (or the agent backend's) view of memory.
//! List, read, seed, append to, clear and end sessions; set their system
//! messages at runtime; tell recall what the user actually heard.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use serde_json::Value;

use super::QueryParams;
use crate::api::auth::Access;
use crate::config::OnNewRequest;
use crate::error::{ApiError, RequestError};
use crate::memory::message::{parse_messages, Message};
use crate::memory::session::{Refused, Session};
use crate::server::app::App;
use crate::store::{Claim, Ticket, Wait};

mod change;
mod read;

pub use change::*;
pub use read::*;

/// The session a request names in its path: `name` as the caller knows it,
/// `id` as it is kept (within the caller's tenant, see `auth`).
pub struct Target {
    pub id: String,
    pub name: String,
}

impl<S: Send + Sync> FromRequestParts<S> for Target {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let (name, access) = named(parts, state, "id", "session_id").await?;
        Ok(Target {
            id: access.internal(&name).into_owned(),
            name,
        })
    }
}

/// The path parameter `param` (`field` in an error) and whose request it
/// is (`Access`, set by the session API's middleware).
pub(crate) async fn named<S: Send + Sync>(
    parts: &mut Parts,
    state: &S,
    param: &str,
    field: &'static str,
) -> Result<(String, Access), ApiError> {
    let Path(params) = Path::<HashMap<String, String>>::from_request_parts(parts, state)
        .await
        .map_err(|e| RequestError::invalid(e.body_text(), Some(field)))?;
    let name = params.get(param).cloned().unwrap_or_default();
    let access = parts
        .extensions
        .get::<Access>()
        .cloned()
        .unwrap_or(Access::All);
    Ok((name, access))
}

pub(crate) async fn existing(app: &App, target: &Target) -> Result<Arc<Session>, ApiError> {
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
pub(crate) enum Turns {
    Interrupt,
    AsConfigured,
    Wait,
}

/// Applies a write to the session (made first when `create`), waits until
/// it is durable, and answers with the session and the write's result. A
/// session that ended under the write is looked up again. With shared
/// storage the write holds the session's lease, like a turn.
pub(crate) async fn write<T>(
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
        // The session API's own changes are not turns: what is left comes
        // only from a turn's `Joins`, which it never asks for.
        Refused::Ended | Refused::UnknownResponse | Refused::Fork(_) | Refused::NotEmpty => {
            RequestError::SessionNotFound {
                id: target.name.clone(),
            }
            .into()
        }
    }
}

pub(crate) async fn json_body(app: &App, body: Body) -> Result<Value, ApiError> {
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
/// A system or developer message after a conversation message is part of
/// the conversation, as on the chat path (and as the history shows it).
pub(crate) fn no_instructions(messages: &[Message]) -> Result<(), ApiError> {
    if crate::memory::message::leading_instructions(messages) == 0 {
        return Ok(());
    }
    Err(RequestError::invalid(
        format!(
            "messages[0] is a {} message: set those with PUT /v1/sessions/{{id}}/system_messages",
            messages[0].role
        ),
        Some("messages[0].role"),
    )
    .into())
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
