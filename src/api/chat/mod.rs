//! `POST /v1/chat/completions`: the request path, top to bottom.
//!
//! parse → route → session → reconcile + window → vendor rewrite → relay.
//! Everything that can reject the request happens before the session is
//! touched, so a rejected request changes nothing.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde_json::{Map, Value};

mod request;

use request::{
    bypass_cache, idempotency_key, label_user, one_streamed_choice, retrying, session_id, user_id,
    CACHE_HEADER,
};
pub use request::{parse_request, ChatRequest};

use super::observe::ServedBy;
use super::PathParams;
use crate::config::OnNewRequest;
use crate::error::{ApiError, RequestError};
use crate::memory::message::{Message, Role};
use crate::memory::reconcile;
use crate::memory::session::{self, Refused, Reply};
use crate::memory::tokens::Encoding;
use crate::proxy::cache;
use crate::proxy::relay::{self, Exchange};
use crate::proxy::vendor::{self, TurnInfo};
use crate::server::app::App;
use crate::store::Wait;

pub async fn completions(
    State(app): State<Arc<App>>,
    PathParams(path): PathParams,
    served: Option<Extension<ServedBy>>,
    mut headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let access = app.client_access(&headers)?;
    // Taken before anything is stored: a request turned away changes nothing.
    let slot = app.upstream_slot()?;
    if app.client_keys.is_some() {
        // The client's key is recall's; the upstream gets its own or none.
        headers.remove(axum::http::header::AUTHORIZATION);
    }
    let bytes = super::read_body(&app, body).await?;
    // The client's upload is its own pace: the proxy's time starts here.
    let arrived = tokio::time::Instant::now();
    let ChatRequest { body, messages } =
        parse_request(&bytes, app.config.server.max_request_messages)?;
    let session_id = session_id(&app, &path, &headers, &body)?;
    if session_id.is_some() {
        one_streamed_choice(&body)?;
    }
    let session_id = session_id.map(|id| access.internal(&id).into_owned());
    let user = user_id(&app, &headers)?;
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
    if let Some(Extension(served)) = &served {
        served.note(&upstream.name);
    }
    if let Some(id) = &session_id {
        tracing::Span::current().record("session", id.as_str());
    }

    let (instructions, mut conversation): (Vec<Message>, Vec<Message>) =
        messages.into_iter().partition(Message::is_instruction);
    if let Some(user) = &user {
        label_user(&mut conversation, user);
    }
    let now = app.policy.clock.now_ms();

    let fallback = app.upstreams.fallback_of(&upstream).cloned();
    let prepared = match &session_id {
        Some(id) => {
            let turn = session::TurnRequest {
                incoming: &conversation,
                user: user.as_deref(),
                encoding: token_encoding(&app, &model).await,
                now_ms: now,
                retrying: retrying(&headers),
                idempotency_key: idempotency_key(&headers),
                rules: &upstream.rules,
                fallback_rules: fallback.as_ref().map(|f| &f.rules),
            };
            let (mut prepared, flight) = open_turn(&app, id, &turn).await?;
            // The upstream call does not wait for the user's message to be
            // stored: the two overlap, and the reply's end (what tells the
            // client the turn happened) waits for both.
            flight.opened(std::mem::take(&mut prepared.durable));
            (prepared, flight)
        }
        // Stateless: the client manages its own history; send it as is.
        None => (
            session::Prepared::stateless(conversation),
            Arc::new(Reply::stateless()),
        ),
    };
    let (
        session::Prepared {
            turn_id,
            window,
            fallback_window,
            system_messages,
            incarnation,
            rewrite,
            ..
        },
        flight,
    ) = prepared;
    let turn = session_id.as_ref().map(|_| TurnInfo { turn_id });
    if turn.is_some() {
        tracing::Span::current().record("turn", turn_id);
    }
    let all_instructions: Vec<Message> = app
        .instructions
        .iter()
        .cloned()
        .chain(system_messages)
        .chain(instructions)
        .collect();

    let scope = session_id.as_deref().map(|id| (id, incarnation));
    let cache_key = app.cache.as_ref().and_then(|c| {
        c.key(
            access.partition(),
            scope,
            &model,
            &all_instructions,
            window.last().map(|m| &**m),
            &body,
        )
    });
    // A regenerate asks for another answer than the one it superseded,
    // which the cache may hold; its new answer is cached in its place.
    let regenerate = rewrite == Some(reconcile::Rewrite::Regenerate);
    if let Some(key) = cache_key.filter(|_| !bypass_cache(&headers) && !regenerate) {
        let answer = app.cache.as_ref().and_then(|c| c.get(&key));
        app.metrics.cache_lookup(answer.is_some());
        if let Some(answer) = answer {
            return answer_from_cache(&flight, &body, &model, &answer, now).await;
        }
    }
    if let (Some(key), Some(_)) = (cache_key, &app.cache) {
        let app = Arc::clone(&app);
        flight.on_complete(Box::new(move |reply, finish_reason| {
            if let Some(cache) = &app.cache {
                cache.put(key, reply, finish_reason);
            }
        }));
    }

    let upstream_body = match vendor::rewrite(
        &upstream.rules,
        &body,
        &all_instructions,
        &window,
        turn,
        now,
    ) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "could not serialise the upstream body");
            flight.failed("internal error");
            return Err(ApiError::Internal);
        }
    };
    tracing::debug!(window = window.len(), "forwarding chat completion");
    // The body for the fallback upstream is made now, for its vendor mode;
    // it is used only if the first call fails before its first byte.
    let fallback = fallback.and_then(|fb| {
        let window = fallback_window.as_ref().unwrap_or(&window);
        let body = vendor::rewrite(&fb.rules, &body, &all_instructions, window, turn, now).ok()?;
        Some((fb, bytes::Bytes::from(body)))
    });

    let mut response = relay::start(Exchange {
        upstream,
        client_headers: headers,
        body: upstream_body.into(),
        flight,
        drain: app.config.interruption.clone(),
        metrics: Arc::clone(&app.metrics),
        arrived,
        fallback,
        slot,
    })
    .await?;
    if cache_key.is_some() {
        response
            .headers_mut()
            .insert(CACHE_HEADER, HeaderValue::from_static("miss"));
    }
    Ok(response)
}

/// Begins a turn in session `id`, creating the session if needed. A session
/// that ended while this request held it is looked up again (and so
/// started anew).
async fn open_turn(
    app: &App,
    id: &str,
    turn: &session::TurnRequest<'_>,
) -> Result<(session::Prepared, Arc<Reply>), ApiError> {
    let now = turn.now_ms;
    let busy = || ApiError::from(RequestError::Busy { id: id.to_owned() });
    let storage = &app.policy.storage;
    loop {
        // This process's own reply is settled first: with shared storage
        // before the other replicas' (a turn never waits on its own
        // process's lease), and after a failed write before the session
        // is reloaded from storage (`Store::find`).
        if storage.shared() || storage.needs_reload(id) {
            if let Some(local) = app.sessions.get(id) {
                match local.settle(&app.policy, app.policy.on_new_request) {
                    Ok(()) | Err(Refused::Ended) => {}
                    Err(Refused::Busy) => return Err(busy()),
                }
            }
        }
        let claim = if storage.shared() {
            let wait = match app.policy.on_new_request {
                OnNewRequest::Interrupt => Wait::Interrupt,
                OnNewRequest::Reject => Wait::No,
            };
            Some(storage.claim(id, wait).await?.ok_or_else(busy)?)
        } else {
            None
        };
        // With shared storage this reads what the previous holder wrote.
        let (session, created) = app.sessions.open(id, storage, now).await?;
        if created {
            app.session_created();
        }
        match session.begin(&app.policy, turn) {
            Ok((prepared, flight)) => {
                let flight = Arc::new(flight);
                if let Some(claim) = claim {
                    flight.hold(claim);
                }
                return Ok((prepared, flight));
            }
            Err(refused) => {
                if let Some(claim) = claim {
                    let _ = storage.release(claim);
                }
                match refused {
                    Refused::Busy => return Err(busy()),
                    Refused::Ended => continue,
                }
            }
        }
    }
}

/// How the turn's window counts tokens. The first turn for a model family
/// builds its tokenizer, on a blocking thread rather than an async worker
/// or under the session's lock; without `window_tokens` nothing is built.
async fn token_encoding(app: &App, model: &str) -> Encoding {
    if app.policy.history.window_tokens == 0 {
        return Encoding::default();
    }
    let encoding = Encoding::for_model(model);
    if !encoding.is_ready() {
        // Fails only if building panicked; counting would then try again.
        let _ = tokio::task::spawn_blocking(move || encoding.load()).await;
    }
    encoding
}

/// Answers from the cache, in the shape the client asked for, and records
/// the answer like any reply (`metadata.source = "cache"`).
async fn answer_from_cache(
    flight: &Reply,
    body: &Map<String, Value>,
    model: &str,
    answer: &str,
    now: i64,
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
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let mut response = if stream {
        let usage = body
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let sse = cache::sse_body(model, answer, now, usage);
        let mut r = Response::new(Body::from(sse));
        r.headers_mut().insert(
            "content-type",
            HeaderValue::from_static("text/event-stream"),
        );
        r
    } else {
        axum::Json(cache::completion_body(model, answer, now)).into_response()
    };
    response
        .headers_mut()
        .insert(CACHE_HEADER, HeaderValue::from_static("hit"));
    Ok(response)
}
