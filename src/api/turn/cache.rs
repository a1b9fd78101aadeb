//! Cache: a turn the exact-match cache can answer is answered from it
//! (and recorded like any reply); one it could answer later registers its
//! reply to be kept.

use std::sync::Arc;

use axum::body::Body;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::open::Opened;
use super::Plan;
use crate::api::chat::request::{bypass_cache, CACHE_HEADER};
use crate::error::ApiError;
use crate::memory::message::{Message, Role};
use crate::memory::reconcile;
use crate::memory::session::Reply;
use crate::proxy::cache::Key;
use crate::server::app::App;

pub(super) enum Looked {
    /// The answer, recorded.
    Hit(Response),
    /// Send the turn; with a key, its answer is cached under it.
    Miss(Option<Key>),
}

pub(super) async fn look_up(
    app: &Arc<App>,
    plan: &Plan,
    opened: &Opened,
    instructions: &[Message],
) -> Result<Looked, ApiError> {
    let Some(cache) = &app.cache else {
        return Ok(Looked::Miss(None));
    };
    let scope = opened
        .session
        .as_deref()
        .map(|id| (id, opened.prepared.incarnation));
    let Some(key) = cache.key(
        plan.access.partition(),
        scope,
        &plan.model,
        instructions,
        opened.prepared.window.last().map(|m| &**m),
        &plan.body,
    ) else {
        return Ok(Looked::Miss(None));
    };
    // A regenerate asks for another answer than the one it superseded,
    // which the cache may hold; its new answer is cached in its place.
    let regenerate = opened.prepared.rewrite == Some(reconcile::Rewrite::Regenerate);
    if !bypass_cache(&plan.headers) && !regenerate {
        let answer = cache.get(&key);
        app.metrics.cache_lookup(answer.is_some());
        if let Some(answer) = answer {
            return Ok(Looked::Hit(
                answer_from_cache(plan, &opened.flight, &answer).await?,
            ));
        }
    }
    let app = Arc::clone(app);
    opened
        .flight
        .on_complete(Box::new(move |reply, finish_reason| {
            if let Some(cache) = &app.cache {
                cache.put(key, reply, finish_reason);
            }
        }));
    Ok(Looked::Miss(Some(key)))
}

/// Answers from the cache, in the shape the client asked for (the
/// upstream's protocol says what that is), and records the answer like any
/// reply (`metadata.source = "cache"`).
async fn answer_from_cache(
    plan: &Plan,
    flight: &Reply,
    answer: &str,
) -> Result<Response, ApiError> {
    let mut reply = Message::new(Role::Assistant, answer);
    reply
        .metadata_mut()
        .insert("source", Value::String("cache".into()));
    flight.started();
    flight
        .completed_whole(reply, Some("stop".into()))
        .durable()
        .await?;
    let body = &plan.body;
    let protocol = plan.upstream.protocol;
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let mut response = if stream {
        let usage = body
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let sse = protocol.given_stream(&plan.model, answer, plan.now_ms, usage);
        let mut r = Response::new(Body::from(sse));
        r.headers_mut().insert(
            "content-type",
            HeaderValue::from_static("text/event-stream"),
        );
        r
    } else {
        axum::Json(protocol.given_answer(&plan.model, answer, plan.now_ms)).into_response()
    };
    response
        .headers_mut()
        .insert(CACHE_HEADER, HeaderValue::from_static("hit"));
    Ok(response)
}
