//! The session API's writes: replace, append, clear, system messages,
//! end, and what the user heard (interrupt).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::*;
use crate::error::{ApiError, RequestError};
use crate::memory::interruption::Spoken;
use crate::memory::session::Interrupted;
use crate::server::app::App;
use crate::server::lifecycle;
use crate::store::Wait;
use crate::webhook::{EndReason, Event};

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
    Ok(Json(
        json!({"session_id": target.name, "messages": stored.messages}),
    ))
}

/// `DELETE /v1/sessions/{id}/history`: clears the history (a reset);
/// the session and its system messages stay.
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
