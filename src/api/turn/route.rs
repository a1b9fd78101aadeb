//! Route: which upstream serves the turn's model, for which user, and the
//! client's instructions taken apart from its conversation. The plan the
//! later stages read.

use std::sync::Arc;

use axum::http::HeaderMap;
use serde_json::{Map, Value};

use super::{Arrival, Turn};
use crate::api::auth::Access;
use crate::api::chat::request::{label_user, user_id};
use crate::error::{ApiError, RequestError};
use crate::memory::message::{leading_instructions, Message};
use crate::proxy::upstream::Upstream;
use crate::server::app::App;

/// A turn routed: what every later stage reads (and `open` takes the
/// conversation and the target from).
pub(crate) struct Plan {
    pub access: Access,
    pub headers: HeaderMap,
    pub arrived: tokio::time::Instant,
    /// The body without `messages`.
    pub body: Map<String, Value>,
    pub model: String,
    pub upstream: Arc<Upstream>,
    /// Where a call that fails before its first byte is made once more.
    pub fallback: Option<Arc<Upstream>>,
    /// The user the headers name.
    pub user: Option<String>,
    /// Whose carried note and long-term facts the turn reads (the user,
    /// internal to the client's tenant), when memory is on.
    pub memory_user: Option<String>,
    /// The system and developer messages before the conversation: they
    /// steer this request. One the client placed inside it stays there.
    pub instructions: Vec<Message>,
    pub conversation: Vec<Message>,
    /// The internal id of the session the turn runs in; none: stateless.
    pub session: Option<String>,
    pub now_ms: i64,
}

pub(crate) fn route(app: &App, turn: Turn) -> Result<Plan, ApiError> {
    let Turn {
        arrival: Arrival {
            access,
            headers,
            arrived,
        },
        body,
        messages,
        session,
        served,
    } = turn;
    let user = user_id(app, &headers)?;
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
        .ok_or_else(|| RequestError::UnknownModel {
            model: model.clone(),
        })?
        .clone();
    if let Some(served) = &served {
        served.note(&upstream.name);
    }
    if let Some(id) = &session {
        tracing::Span::current().record("session", id.as_str());
    }
    let mut instructions = messages;
    let mut conversation = instructions.split_off(leading_instructions(&instructions));
    if let Some(user) = &user {
        label_user(&mut conversation, user);
    }
    let fallback = app.upstreams.fallback_of(&upstream).cloned();
    let memory_user = user
        .as_deref()
        .filter(|_| app.config.memory.carry_over || app.config.long_term.enabled)
        .map(|u| access.internal(u).into_owned());
    Ok(Plan {
        access,
        headers,
        arrived,
        body,
        model,
        upstream,
        fallback,
        user,
        memory_user,
        instructions,
        conversation,
        session,
        now_ms: app.policy.clock.now_ms(),
    })
}
