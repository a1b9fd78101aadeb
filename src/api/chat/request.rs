//! What a chat request says, read and checked before anything is
//! touched: its body (`parse_request`, the core's), the session it names, the user
//! speaking, and what its headers ask of recall (a retry, the cache).

use std::collections::HashMap;

use axum::http::HeaderMap;
use serde_json::{Map, Value};

use crate::error::{ApiError, RequestError};
use crate::memory::message::Message;
use crate::memory::session;
use crate::server::app::App;

pub use recall_core::chat::request::{parse_body, parse_request, request_with, ChatRequest};

/// The official SDKs number their retries in `x-stainless-retry-count`.
pub(crate) fn retrying(headers: &HeaderMap) -> bool {
    headers
        .get("x-stainless-retry-count")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u32>().ok())
        .is_some_and(|n| n > 0)
}

/// A client that sends the same `Idempotency-Key` again retries.
pub(crate) fn idempotency_key(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .filter(|k| !k.is_empty())
}

/// Seed 000's `metadata.user`: who said each user message, unless the
/// client already said.
pub(crate) fn label_user(conversation: &mut [Message], user: &str) {
    for m in conversation.iter_mut().filter(|m| m.role == "user") {
        m.metadata_mut()
            .insert_default("user", || Value::String(user.to_owned()));
    }
}

pub(crate) const CACHE_HEADER: &str = "x-recall-cache";

pub(crate) fn bypass_cache(headers: &HeaderMap) -> bool {
    headers
        .get(CACHE_HEADER)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"bypass"))
}

/// The user speaking, from the configured user header.
pub(crate) fn user_id(app: &App, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let header = &app.config.session.user_header;
    match headers.get(header.as_str()) {
        Some(v) => match v.to_str() {
            Ok(id) if !id.trim().is_empty() && id.len() <= 256 => Ok(Some(id.trim().to_owned())),
            _ => Err(RequestError::invalid(
                format!("the `{header}` header must be 1 to 256 characters of text"),
                Some(header),
            )
            .into()),
        },
        None if app.config.session.require_user => Err(RequestError::invalid(
            format!("a user id is required: send the `{header}` header"),
            Some(header),
        )
        .into()),
        None => Ok(None),
    }
}

/// With a session, a streamed reply is recorded as the text that went out
/// to the client, which for a barge-in is what the user heard. With
/// `n > 1` several choices stream interleaved and no single text went
/// out, so such a request is refused rather than recorded wrongly. (A
/// request without a session records nothing and is passed through.)
pub(super) fn one_streamed_choice(body: &Map<String, Value>) -> Result<(), ApiError> {
    let streamed = body.get("stream") == Some(&Value::Bool(true));
    let n = body.get("n").and_then(Value::as_f64).unwrap_or(1.0);
    if streamed && n > 1.0 {
        return Err(RequestError::invalid(
            "`n` greater than 1 cannot be streamed in a session: recall records one reply per turn (send `stream: false`, or no session id)",
            Some("n"),
        )
        .into());
    }
    Ok(())
}

/// The session id: from the path form, else the configured header, else a
/// top-level `session_id` field in the body.
pub(super) fn session_id(
    app: &App,
    path: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &Map<String, Value>,
) -> Result<Option<String>, ApiError> {
    let header = &app.config.session.header;
    let found = if let Some(id) = path.get("session_id") {
        Some((id.clone(), "session_id"))
    } else if let Some(value) = headers.get(header.as_str()) {
        let id = value.to_str().map_err(|_| {
            RequestError::invalid(
                format!("the `{header}` header is not valid text"),
                Some(header),
            )
        })?;
        Some((id.to_owned(), header.as_str()))
    } else {
        match body.get("session_id") {
            None | Some(Value::Null) => None,
            Some(Value::String(id)) => Some((id.clone(), "session_id")),
            Some(_) => {
                return Err(RequestError::invalid(
                    "`session_id` must be a string",
                    Some("session_id"),
                )
                .into())
            }
        }
    };
    match found {
        Some((id, from)) => {
            session::validate_id(&id).map_err(|msg| RequestError::invalid(msg, Some(from)))?;
            Ok(Some(id))
        }
        None if app.config.session.required => Err(RequestError::SessionRequired {
            header: header.clone(),
        }
        .into()),
        None => Ok(None),
    }
}
