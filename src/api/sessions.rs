//! Reading a session's memory, and telling recall what the user heard.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::app::App;
use crate::error::{ApiError, RequestError};
use crate::interruption::Spoken;
use crate::relay::now_ms;
use crate::session::{Interrupted, Session};

fn session(app: &App, params: &HashMap<String, String>) -> Result<Arc<Session>, ApiError> {
    let id = params.get("id").map(String::as_str).unwrap_or_default();
    Ok(app
        .sessions
        .get(id)
        .ok_or_else(|| RequestError::SessionNotFound { id: id.to_owned() })?)
}

/// `GET /v1/sessions/{id}/history`: the stored messages, oldest first, with
/// all their fields (seed 000's short-term memory shape).
pub async fn history(
    State(app): State<Arc<App>>,
    Path(params): Path<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let session = session(&app, &params)?;
    let history = session.snapshot();
    Ok(Json(json!({
        "session_id": session.id,
        "turn_id": history.turn_id,
        "contents": history.messages,
    })))
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
    Path(params): Path<HashMap<String, String>>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let bytes = super::read_body(body, app.config.server.max_body_bytes).await?;
    let parsed: InterruptBody = if bytes.iter().all(u8::is_ascii_whitespace) {
        InterruptBody::default()
    } else {
        serde_json::from_slice(&bytes).map_err(|e| {
            RequestError::invalid(
                format!(
                    "the body must be {{\"spoken\": text}} or {{\"spoken_chars\": number}}: {e}"
                ),
                None,
            )
        })?
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
    let session = session(&app, &params)?;
    let (was, record) = match session.interrupt(spoken.as_ref(), now_ms()) {
        Interrupted::InFlight(m) => ("in_flight", m),
        Interrupted::Stored(m) => ("stored", m),
        Interrupted::NothingToInterrupt => {
            return Err(RequestError::NothingToInterrupt {
                id: session.id.clone(),
            }
            .into())
        }
    };
    Ok(Json(json!({
        "session_id": session.id,
        "interrupted": was,
        "message": record,
    })))
}
