//! `POST /v1/chat/completions`: the request path, top to bottom.
//!
//! parse → route → session → reconcile + window → vendor rewrite → relay.
//! Everything that can reject the request happens before the session is
//! touched, so a rejected request changes nothing.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{Map, Value};

use crate::app::App;
use crate::error::{ApiError, RequestError};
use crate::inflight::InFlight;
use crate::message::{parse_messages, Message};
use crate::relay::{self, now_ms, Exchange};
use crate::session;
use crate::vendor::{self, TurnInfo};

pub async fn completions(
    State(app): State<Arc<App>>,
    path: Option<Path<HashMap<String, String>>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = super::read_body(body, app.config.server.max_body_bytes).await?;
    let mut body = parse_body(&bytes)?;
    let messages = take_messages(&mut body)?;
    let session_id = session_id(&app, path.as_ref().map(|p| &p.0), &headers, &body)?;
    let model = match body.get("model") {
        Some(Value::String(m)) => m.clone(),
        _ => {
            return Err(RequestError::invalid(
                "you must provide a model parameter (a string)",
                Some("model"),
            )
            .into())
        }
    };
    let upstream = app
        .upstreams
        .route(&model)
        .ok_or(RequestError::UnknownModel { model })?
        .clone();

    let (instructions, conversation): (Vec<Message>, Vec<Message>) =
        messages.into_iter().partition(Message::is_instruction);
    let all_instructions: Vec<Message> = app
        .instructions
        .iter()
        .cloned()
        .chain(instructions)
        .collect();
    let now = now_ms();

    let (window, turn, flight) = match &session_id {
        Some(id) => {
            let session = app.sessions.get_or_create(id);
            let (prepared, flight) = session
                .begin(&app.policy, &conversation, now)
                .map_err(|_| RequestError::Busy { id: id.clone() })?;
            let turn = TurnInfo {
                turn_id: prepared.turn_id,
            };
            (prepared.window, Some(turn), flight)
        }
        // Stateless: the client manages its own history; send it as is.
        None => (conversation, None, Arc::new(InFlight::stateless())),
    };

    vendor::rewrite(
        &upstream.rules,
        &mut body,
        &all_instructions,
        &window,
        turn,
        now,
    );
    let upstream_body = match serde_json::to_vec(&body) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "could not serialise the upstream body");
            flight.failed("internal error");
            return Err(ApiError::Internal);
        }
    };
    tracing::debug!(
        session = session_id.as_deref().unwrap_or("-"),
        upstream = %upstream.name,
        window = window.len(),
        "forwarding chat completion"
    );

    relay::start(Exchange {
        upstream,
        client_headers: headers,
        body: upstream_body.into(),
        flight,
        drain: app.config.interruption.clone(),
    })
    .await
}

fn parse_body(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(RequestError::invalid("the request body must be a JSON object", None).into()),
        Err(e) => Err(RequestError::invalid(
            format!("the request body is not valid JSON: {e}"),
            None,
        )
        .into()),
    }
}

/// Takes `messages` out of the body; `vendor::rewrite` puts the rewritten
/// list back in the same place.
fn take_messages(body: &mut Map<String, Value>) -> Result<Vec<Message>, ApiError> {
    match body.get_mut("messages") {
        Some(Value::Array(list)) => Ok(parse_messages(std::mem::take(list))?),
        Some(_) => {
            Err(RequestError::invalid("`messages` must be an array", Some("messages")).into())
        }
        None => Err(RequestError::invalid(
            "missing required parameter: `messages`",
            Some("messages"),
        )
        .into()),
    }
}

/// The session id: from the path form, else the configured header, else a
/// top-level `session_id` field in the body.
fn session_id(
    app: &App,
    path: Option<&HashMap<String, String>>,
    headers: &HeaderMap,
    body: &Map<String, Value>,
) -> Result<Option<String>, ApiError> {
    let header = &app.config.session.header;
    let found = if let Some(id) = path.and_then(|p| p.get("session_id")) {
        Some((id.clone(), "path"))
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
