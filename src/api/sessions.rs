//! Reading a session's memory.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Value};

use crate::app::App;
use crate::error::{ApiError, RequestError};

/// `GET /v1/sessions/{id}/history`: the stored messages, oldest first, with
/// all their fields (seed 000's short-term memory shape).
pub async fn history(
    State(app): State<Arc<App>>,
    Path(params): Path<std::collections::HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let id = params.get("id").map(String::as_str).unwrap_or_default();
    let session = app
        .sessions
        .get(id)
        .ok_or_else(|| RequestError::SessionNotFound { id: id.to_owned() })?;
    let state = session.snapshot();
    Ok(Json(json!({
        "session_id": session.id,
        "turn_id": state.turn_id,
        "contents": state.messages,
    })))
}
