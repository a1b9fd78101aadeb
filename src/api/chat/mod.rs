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

pub(crate) mod one_pass;
mod open;
mod request;

use open::{open_turn, token_encoding, Admission};

use request::{
    bypass_cache, idempotency_key, label_user, one_streamed_choice, retrying, session_id, user_id,
    CACHE_HEADER,
};
pub(crate) use request::{parse_body, request_of, request_with};
pub use request::{parse_request, ChatRequest};

use super::auth::Access;
use super::observe::ServedBy;
use super::PathParams;
use crate::error::{ApiError, NotFound, RequestError};
use crate::memory::message::{Message, Role};
use crate::memory::reconcile;
use crate::memory::session::{self, Joins, Reply};
use crate::proxy::cache;
use crate::proxy::relay::{self, Exchange, Readings};
use crate::proxy::vendor::{self, TurnInfo};
use crate::server::app::App;

pub async fn completions(
    State(app): State<Arc<App>>,
    PathParams(path): PathParams,
    served: Option<Extension<ServedBy>>,
    // Whole rather than `HeaderMap` and `Body`: that extractor clones the
    // headers, where taking the request apart moves them.
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    let (axum::http::request::Parts { headers, .. }, body) = request.into_parts();
    let (arrival, bytes) = Arrival::read(&app, headers, body).await?;
    let (access, headers) = (&arrival.access, &arrival.headers);
    let ChatRequest { body, messages } =
        parse_request(&bytes, app.config.server.max_request_messages)?;
    let session_id = session_id(&app, &path, headers, &body)?;
    if session_id.is_some() {
        one_streamed_choice(&body)?;
    }
    let session = session_id.map(|id| Target {
        id: access.internal(&id).into_owned(),
        joins: Joining::Reconcile,
        missing: None,
    });
    let turn = Turn {
        arrival,
        body,
        messages,
        session,
        served: served.map(|Extension(s)| s),
        readings: None,
    };
    Ok(run(&app, turn).await?.response)
}

/// A request on the chat path as it arrived: whose it is, its headers
/// (the client's key taken out: it is recall's, and the upstream gets its
/// own or none), and when its body was read whole.
pub(crate) struct Arrival {
    pub access: Access,
    pub headers: HeaderMap,
    pub arrived: tokio::time::Instant,
}

impl Arrival {
    /// Everything before the body is parsed, and the body.
    pub(crate) async fn read(
        app: &App,
        mut headers: HeaderMap,
        body: Body,
    ) -> Result<(Self, bytes::Bytes), ApiError> {
        let access = app.client_access(&headers)?;
        if app.client_keys.is_some() {
            headers.remove(axum::http::header::AUTHORIZATION);
        }
        let bytes = super::read_body(app, body).await?;
        // The client's upload is its own pace: the proxy's time starts here.
        let arrived = tokio::time::Instant::now();
        let arrival = Self {
            access,
            headers,
            arrived,
        };
        Ok((arrival, bytes))
    }
}

/// A checked request, ready to run through the chat path: chat's own, or
/// one the Responses API translated.
pub(crate) struct Turn {
    pub arrival: Arrival,
    /// The body without `messages`.
    pub body: Map<String, Value>,
    pub messages: Vec<Message>,
    /// None: stateless, the client's messages are sent as they are.
    pub session: Option<Target>,
    pub served: Option<ServedBy>,
    /// Set when recall reads the answer again (`Readings`).
    pub readings: Option<Readings>,
}

/// The session a turn runs in, and how its messages join it.
pub(crate) struct Target {
    /// The internal id (`Access::internal`).
    pub id: String,
    pub joins: Joining,
    /// The session must exist (and for `Joining::After`, hold the
    /// response): else this is the answer, and nothing is created.
    pub missing: Option<NotFound>,
}

pub(crate) enum Joining {
    Reconcile,
    Append,
    /// After a response; if later messages follow it, the turn forks into
    /// a new session under `fork_to`.
    After {
        response: String,
        fork_to: String,
    },
    /// A session outside the store that starts from this history and
    /// records nothing.
    Unstored(Vec<Arc<Message>>),
}

/// A turn that ran: the response for the client, and where it went.
pub(crate) struct Ran {
    pub response: Response,
    /// The internal id of the session the turn ran in (a fork's, if it
    /// forked).
    pub session: Option<String>,
    /// The sequence number the reply is recorded at.
    pub reply_seq: u64,
}

/// The request path from the route on: session, reconcile + window,
/// vendor rewrite, relay.
pub(crate) async fn run(app: &Arc<App>, turn: Turn) -> Result<Ran, ApiError> {
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
        readings,
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
    if let Some(target) = &session {
        tracing::Span::current().record("session", target.id.as_str());
    }

    // The system and developer messages before the conversation steer this
    // request; one the client placed inside it stays where it is.
    let mut instructions = messages;
    let mut conversation =
        instructions.split_off(crate::memory::message::leading_instructions(&instructions));
    if let Some(user) = &user {
        label_user(&mut conversation, user);
    }
    let now = app.policy.clock.now_ms();

    let fallback = app.upstreams.fallback_of(&upstream).cloned();
    let memory_user = user
        .as_deref()
        .filter(|_| app.config.memory.carry_over || app.config.long_term.enabled)
        .map(|u| access.internal(u).into_owned());
    // The user's long-term facts this turn sends, if any.
    let mut facts = None;
    // The turn's upstream slot (`max_concurrent_upstream`), taken before
    // anything is stored.
    let mut admission = Admission::default();
    let (prepared, flight, ran_in) = match session {
        Some(target) => {
            let turn = session::TurnRequest {
                incoming: &conversation,
                user: user.as_deref(),
                memory_user: memory_user.as_deref(),
                encoding: token_encoding(app, &model).await,
                now_ms: now,
                retrying: retrying(&headers),
                idempotency_key: idempotency_key(&headers),
                rules: &upstream.rules,
                fallback_rules: fallback.as_ref().map(|f| &f.rules),
                joins: Joins::Reconcile,
                place: None,
            };
            let (mut prepared, flight, ran_in) =
                open_turn(app, target, turn, &mut admission).await?;
            if let Some(fold) = prepared.fold.take() {
                crate::api::memory::start_fold(app, &ran_in, fold);
            }
            // The upstream call does not wait for the user's message to be
            // stored: the two overlap, and the reply's end (what tells the
            // client the turn happened) waits for both.
            flight.opened(std::mem::take(&mut prepared.durable));
            if app.long_term.is_some() {
                // A read of the user's records, or an inline search: a
                // client that leaves meanwhile settles its reply like one
                // that leaves during the upstream call. Boxed: its state
                // would otherwise grow every turn's future.
                let gone = crate::proxy::relay::GoneGuard::armed(&flight);
                let due = std::mem::take(&mut prepared.long_term);
                facts = Box::pin(crate::api::memory::long_term::for_turn(app, &ran_in, due)).await;
                gone.disarm();
            }
            (prepared, flight, Some(ran_in))
        }
        // Stateless: the client manages its own history; send it as is.
        None => {
            admission.take(app, || None)?;
            (
                session::Prepared::stateless(conversation),
                Arc::new(Reply::stateless()),
                None,
            )
        }
    };
    let session::Prepared {
        turn_id,
        window,
        fallback_window,
        system_messages,
        incarnation,
        rewrite,
        reply_seq,
        remembered,
        ..
    } = prepared;
    let session_id = ran_in;
    let turn = session_id.as_ref().map(|_| TurnInfo {
        turn_id,
        summary: remembered.summary.as_deref(),
    });
    if turn.is_some() {
        tracing::Span::current().record("turn", turn_id);
    }
    let all_instructions: Vec<Message> = app
        .instructions
        .iter()
        .cloned()
        .chain(system_messages)
        .chain(crate::api::memory::injected(
            &app.config.memory,
            &remembered,
        ))
        .chain(facts)
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
    let ran = |response| Ran {
        response,
        session: session_id.clone(),
        reply_seq,
    };
    // A regenerate asks for another answer than the one it superseded,
    // which the cache may hold; its new answer is cached in its place.
    let regenerate = rewrite == Some(reconcile::Rewrite::Regenerate);
    if let Some(key) = cache_key.filter(|_| !bypass_cache(&headers) && !regenerate) {
        let answer = app.cache.as_ref().and_then(|c| c.get(&key));
        app.metrics.cache_lookup(answer.is_some());
        if let Some(answer) = answer {
            return Ok(ran(
                answer_from_cache(&flight, &body, &model, &answer, now).await?
            ));
        }
    }
    if let (Some(key), Some(_)) = (cache_key, &app.cache) {
        let app = Arc::clone(app);
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
        slot: admission.into_slot(),
        readings,
    })
    .await?;
    if cache_key.is_some() {
        response
            .headers_mut()
            .insert(CACHE_HEADER, HeaderValue::from_static("miss"));
    }
    Ok(ran(response))
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
