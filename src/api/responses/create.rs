//! `POST /v1/responses`: a Responses request run through the chat path.
//!
//! translate → the session it continues (a chain, a conversation, or
//! nothing kept) → its input marked as the response → the turn's stages
//! with this API's own open (`open.rs`): route → open → instructions →
//! cache → send (window, vendor mode, interruptions, cache, metrics) →
//! the answer translated back. Everything that can reject the request happens before
//! the session is touched.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;
use serde_json::{Map, Value};

use super::ids;
use super::open::{Continues, Target};
use super::request::translate;
use super::response::{Echo, ECHOED};
use crate::api::auth::Access;
use crate::api::chat;
use crate::api::observe::ServedBy;
use crate::api::turn::{self, Arrival, Turn};
use crate::api::PathParams;
use crate::error::{ApiError, NotFound, RequestError};
use crate::memory::chain;
use crate::memory::message::ResponseMark;
use crate::memory::session;
use crate::relay::Readings;
use crate::server::app::App;

pub async fn create(
    State(app): State<Arc<App>>,
    PathParams(path): PathParams,
    served: Option<Extension<ServedBy>>,
    // Whole rather than `HeaderMap` and `Body`: that extractor clones the
    // headers, where taking the request apart moves them.
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    let (axum::http::request::Parts { headers, .. }, body) = request.into_parts();
    let (arrival, bytes) = Arrival::read(&app, headers, body).await?;
    let body = chat::parse_body(&bytes)?;
    // By the body's few keys: looking up each of the ten echoed ones cost
    // a turn about 2.4k instructions more (docs/perf-journal.md, item 42).
    let fields: Map<String, Value> = body
        .iter()
        .filter(|(k, _)| ECHOED.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let instructions = body
        .get("instructions")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let mut t = translate(body)?;
    let chat::ChatRequest {
        body: chat_body,
        mut messages,
    } = chat::request_with(
        std::mem::take(&mut t.chat),
        std::mem::take(&mut t.messages),
        app.config.server.max_request_messages,
    )?;
    let access = arrival.access.clone();
    let conversation = match (
        &t.conversation,
        named_session(&app, &path, &arrival.headers)?,
    ) {
        (Some(id), _) => Some((id.clone(), true)),
        (None, Some(id)) if t.previous_response_id.is_none() => Some((id, false)),
        _ => None,
    };

    let now_ms = app.policy.clock.now_ms();
    let key = ids::new_key();
    // The input's leading system and developer messages (and `instructions`)
    // steer this response only; the rest is its input, stored.
    let leading = crate::memory::message::leading_instructions(&messages);
    let input_items = messages.len() - leading;
    let Some(first) = messages.get_mut(leading) else {
        return Err(RequestError::invalid(
            "`input` must hold at least one message or function call output",
            Some("input"),
        )
        .into());
    };
    chain::mark(
        first,
        ResponseMark {
            key: key.clone(),
            input_items: input_items as u64,
            created_at: now_ms / 1000,
            model: model.clone(),
            previous_response_id: t.previous_response_id.clone(),
            conversation: conversation.as_ref().map(|(id, _)| id.clone()),
            instructions: instructions.clone(),
            metadata: t.metadata.clone(),
            fields: fields.clone(),
        },
    );

    let target = target(
        &app,
        &access,
        t.previous_response_id.as_deref(),
        t.store,
        conversation.as_ref(),
    )
    .await?;
    let turn = Turn {
        arrival,
        body: chat_body,
        messages,
        session: Some(target.id.clone()),
        served: served.map(|Extension(s)| s),
    };
    // The turn's stages, with this API's own open; the relay keeps what
    // it parsed of the answer for the translation back.
    let mut plan = turn::route(&app, turn)?;
    let opened = super::open::open(&app, &mut plan, target).await?;
    let readings = Readings::default();
    let ran = turn::after_open(&app, plan, opened, Some(readings.clone())).await?;
    let internal = ran.session.unwrap_or_default();
    let session = access.show(&internal).unwrap_or(&internal);
    let echo = Echo {
        id: ids::response(session, &key),
        items: ids::items_base(session, ran.reply_seq),
        created_at: now_ms / 1000,
        previous_response_id: t.previous_response_id,
        conversation: conversation.map(|(id, _)| id),
        instructions,
        metadata: t.metadata,
        store: t.store,
        fields,
    };
    super::answer::translate(ran.response, echo, &model, t.stream, readings).await
}

/// The session the path form (`/sessions/{id}/v1/responses`) or the
/// session header names, as chat's do: a conversation, created on first
/// use, for a client configured once for chat.
fn named_session(
    app: &App,
    path: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<Option<String>, ApiError> {
    let header = app.config.session.header.as_str();
    let (id, param) = match (path.get("session_id"), headers.get(header)) {
        (Some(id), _) => (id.clone(), "session_id"),
        (None, Some(v)) => {
            let id = v.to_str().map_err(|_| {
                RequestError::invalid(
                    format!("the `{header}` header is not valid text"),
                    Some(header),
                )
            })?;
            (id.to_owned(), header)
        }
        (None, None) => return Ok(None),
    };
    session::validate_id(&id).map_err(|msg| RequestError::invalid(msg, Some(param)))?;
    Ok(Some(id))
}

/// Where the response runs: its conversation, the chain of its previous
/// response (or a fork of it), a new chain, or, with `store: false`, a
/// session outside the store that starts from what it continues.
async fn target(
    app: &App,
    access: &Access,
    previous: Option<&str>,
    store: bool,
    conversation: Option<&(String, bool)>,
) -> Result<Target, ApiError> {
    let conversation_missing = |id: &str| NotFound {
        what: "Conversation",
        id: id.to_owned(),
        param: Some("conversation"),
        code: "conversation_not_found",
    };
    let (id, joins, missing) = if let Some((id, must_exist)) = conversation {
        session::validate_id(id).map_err(|_| conversation_missing(id))?;
        let missing = must_exist.then(|| conversation_missing(id));
        (access.internal(id).into_owned(), None, missing)
    } else if let Some(previous) = previous {
        let missing = NotFound {
            what: "Previous response",
            id: previous.to_owned(),
            param: Some("previous_response_id"),
            code: "previous_response_not_found",
        };
        let (session, key) = ids::parse_response(previous).ok_or_else(|| missing.clone())?;
        (
            access.internal(&session).into_owned(),
            Some(key.to_owned()),
            Some(missing),
        )
    } else {
        let id = ids::new_session("chain");
        (access.internal(&id).into_owned(), None, None)
    };
    if !store {
        // Nothing is kept: the turn runs on a copy of what it continues.
        // A session named by the path or the header may not exist yet.
        let history = match app.sessions.find(&id, &app.policy.storage).await? {
            Some(session) => match session.branch(joins.as_deref()) {
                Some(history) => history,
                None => return Err(missing.clone().map_or(ApiError::Internal, Into::into)),
            },
            None => match missing {
                Some(missing) => return Err(missing.into()),
                None => Vec::new(),
            },
        };
        let unstored = access.internal(&ids::new_session("unstored")).into_owned();
        return Ok(Target {
            id: unstored,
            continues: Continues::Unstored(history),
            missing: None,
        });
    }
    let joins = match joins {
        Some(response) => Continues::After {
            response,
            fork_to: access.internal(&ids::new_session("chain")).into_owned(),
        },
        None => Continues::Append,
    };
    Ok(Target {
        id,
        continues: joins,
        missing,
    })
}
