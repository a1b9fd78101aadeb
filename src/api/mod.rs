//! HTTP routes. Every route under `/v1/` is also served under
//! `/sessions/{session_id}/v1/`, for clients that can only set a base URL.

pub mod auth;
pub(crate) mod chat;
pub(crate) mod memory;
mod models;
pub mod observe;
pub mod responses;
pub(crate) mod sessions;
pub(crate) mod turn;

use std::sync::Arc;
use std::time::Duration;

use std::collections::HashMap;

use axum::body::Body;
use axum::body::HttpBody as _;
use axum::extract::path::ErrorKind;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{Method, Uri};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post, put, MethodRouter};
use axum::Router;
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use subtle::ConstantTimeEq;

pub use chat::{parse_request, ChatRequest};

use crate::api::auth::Access;
use crate::api::responses::conversations;
use crate::error::{ApiError, RequestError};
use crate::server::app::App;

/// The API's routes, and `beside` them routes served under the same
/// layers and fallbacks (the console's).
pub fn routes(app: &Arc<App>, beside: Router<Arc<App>>) -> Router<Arc<App>> {
    let mut router = Router::new()
        .merge(beside)
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics));
    // Each `/v1` route is registered under both prefixes rather than
    // nested: a nested route rebuilds the request's URI and inserts its
    // prefix into the extensions on every request (docs/perf-journal.md, item 29).
    for (path, route) in v1(app) {
        router = router
            .route(&format!("/v1{path}"), route.clone())
            .route(&format!("/sessions/{{session_id}}/v1{path}"), route);
    }
    router
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(observe::ObserveLayer(Arc::clone(app)))
}

/// The routes under `/v1`, by their path below it.
fn v1(app: &Arc<App>) -> Vec<(&'static str, MethodRouter<Arc<App>>)> {
    let guarded = |route: MethodRouter<Arc<App>>| {
        route.route_layer(middleware::from_fn_with_state(
            Arc::clone(app),
            session_api_access,
        ))
    };
    let session_api = [
        ("/sessions", get(sessions::list)),
        ("/sessions/{id}", get(sessions::get).delete(sessions::end)),
        ("/sessions/{id}/end", post(sessions::end)),
        (
            "/sessions/{id}/history",
            get(sessions::history)
                .put(sessions::replace_history)
                .delete(sessions::clear_history),
        ),
        ("/sessions/{id}/messages", post(sessions::append)),
        (
            "/sessions/{id}/system_messages",
            get(sessions::system_messages).put(sessions::set_system_messages),
        ),
        ("/sessions/{id}/interrupt", post(sessions::interrupt)),
        ("/sessions/{id}/summary", put(memory::put_summary)),
        ("/sessions/{id}/summarize", post(memory::summarize)),
        ("/sessions/{id}/memory/extract", post(memory::extract)),
        (
            "/users/{user}/memory/records",
            get(memory::list_records).post(memory::add_record),
        ),
        (
            "/users/{user}/memory/records/search",
            post(memory::search_records),
        ),
        (
            "/users/{user}/memory/records/{id}",
            get(memory::get_record).delete(memory::delete_record),
        ),
        (
            "/users/{user}/memory",
            get(memory::get_user_memory)
                .put(memory::put_user_memory)
                .delete(memory::delete_user_memory),
        ),
        (
            "/responses/{id}",
            get(responses::get).delete(responses::delete),
        ),
        ("/responses/{id}/input_items", get(responses::input_items)),
        ("/conversations", post(conversations::create)),
        (
            "/conversations/{id}",
            get(conversations::get)
                .post(conversations::update)
                .delete(conversations::delete),
        ),
        (
            "/conversations/{id}/items",
            get(conversations::list_items).post(conversations::add_items),
        ),
        (
            "/conversations/{id}/items/{item_id}",
            get(conversations::get_item).delete(conversations::delete_item),
        ),
    ];
    let mut routes = vec![
        ("/chat/completions", post(chat::completions)),
        ("/responses", post(responses::create)),
        ("/models", get(models::list)),
        ("/models/{*model}", get(models::retrieve)),
    ];
    routes.extend(session_api.map(|(path, route)| (path, guarded(route))));
    routes
}

/// Who may use the session API, and on which sessions: the admin token
/// (`[admin] token_env`, compared in constant time) reaches every session;
/// a client key (`[auth]`) reaches its own; with neither configured the API
/// is open. The handlers find the answer in the request's `Access`.
async fn session_api_access(
    State(app): State<Arc<App>>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let access = match bearer_access(&app, request.headers()) {
        Some(access) => access,
        None if app.admin_token.is_some() || app.client_keys.is_some() => {
            return Err(RequestError::Unauthorized.into())
        }
        None => Access::All,
    };
    request.extensions_mut().insert(access);
    Ok(next.run(request).await)
}

/// Whom a bearer header names: the admin token (`[admin] token_env`),
/// which reaches every session, or a client key (`[auth]`), its own.
/// Compared as digests, so that neither the bytes nor the length of the
/// token show in the time taken.
pub(crate) fn bearer_access(app: &App, headers: &axum::http::HeaderMap) -> Option<Access> {
    let given = crate::api::auth::bearer(headers)?;
    let admin = app.admin_token.as_ref().is_some_and(|token| {
        let digest = crate::api::auth::ClientKeys::digest_of;
        bool::from(digest(given).ct_eq(&digest(token)))
    });
    if admin {
        return Some(Access::All);
    }
    app.client_keys
        .as_ref()?
        .tenant(headers)
        .map(Access::Tenant)
}

/// Ready to serve: the config is loaded (it is, or the process would not
/// run) and storage answers.
async fn ready(State(app): State<Arc<App>>) -> Response {
    use axum::response::IntoResponse;
    match app.policy.storage.count().await {
        Ok(_) => (axum::http::StatusCode::OK, "ready").into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "not ready: storage unavailable");
            ApiError::Storage(e).into_response()
        }
    }
}

/// Prometheus text format. The session figures are counted at each scrape
/// (one short lock per session), not kept on the request path.
async fn metrics(State(app): State<Arc<App>>) -> Response {
    use axum::response::IntoResponse;
    let sessions = app.sessions.all();
    let messages: usize = sessions.iter().map(|s| s.message_count()).sum();
    let text = app.metrics.render(sessions.len(), messages);
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    RequestError::NoRoute {
        method: method.to_string(),
        path: uri.path().to_owned(),
    }
    .into()
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    RequestError::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().to_owned(),
    }
    .into()
}

/// The path's parameters (`{session_id}`, `{model}`), percent-decoded. A
/// parameter that does not decode to UTF-8 gets recall's OpenAI-shaped 400,
/// naming it in `param`, not axum's plain-text one, like every other bad
/// input.
pub struct PathParams(pub HashMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for PathParams {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Option::<Path<HashMap<String, String>>>::from_request_parts(parts, state).await {
            Ok(params) => Ok(PathParams(params.map(|p| p.0).unwrap_or_default())),
            Err(rejection) => {
                let param = match &rejection {
                    PathRejection::FailedToDeserializePathParams(e) => match e.kind() {
                        ErrorKind::InvalidUtf8InPathParam { key } => Some(key.clone()),
                        _ => None,
                    },
                    _ => None,
                };
                Err(RequestError::invalid(
                    format!("the URL path is invalid: {}", rejection.body_text()),
                    param.as_deref(),
                )
                .into())
            }
        }
    }
}

/// A query string (`?limit=...`) deserialised into `T`, with an
/// OpenAI-shaped 400 naming the problem when it does not fit.
pub struct QueryParams<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(q)) => Ok(QueryParams(q)),
            Err(rejection) => Err(RequestError::invalid(
                format!("the query string is invalid: {}", rejection.body_text()),
                None,
            )
            .into()),
        }
    }
}

/// Reads a request body of at most `server.max_body_bytes`, which must
/// arrive whole within `server.request_body_timeout_secs`: a client that
/// never finishes its body (a chunked upload left open) gets a 408 instead
/// of holding its connection and this task for ever.
pub(crate) async fn read_body(app: &App, body: Body) -> Result<Bytes, ApiError> {
    let limit = app.config.server.max_body_bytes;
    let secs = app.config.server.request_body_timeout_secs;
    let read = tokio::time::timeout(Duration::from_secs(secs), whole(body, limit)).await;
    let Ok(read) = read else {
        return Err(RequestError::BodyTimeout { secs }.into());
    };
    match read {
        Ok(bytes) => Ok(bytes),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(RequestError::TooLarge { limit }.into())
        }
        Err(e) => {
            Err(RequestError::invalid(format!("could not read the request body: {e}"), None).into())
        }
    }
}

/// A body's bytes, at most `limit` of them (else a
/// `http_body_util::LengthLimitError`). A body that comes in one frame
/// (most requests, and every answer the relay read whole) is taken as it
/// is, where `collect` would queue its frames and copy them out.
pub(crate) async fn whole(body: Body, limit: usize) -> Result<Bytes, BoxError> {
    let mut body = http_body_util::Limited::new(body, limit);
    let first = match body.frame().await {
        Some(frame) => frame?.into_data().unwrap_or_default(),
        None => return Ok(Bytes::new()),
    };
    if body.is_end_stream() {
        return Ok(first);
    }
    let rest = body.collect().await?.to_bytes();
    // A chunked body in one chunk, or an end that came as a frame of its own.
    if rest.is_empty() {
        return Ok(first);
    }
    if first.is_empty() {
        return Ok(rest);
    }
    let mut all = BytesMut::with_capacity(first.len() + rest.len());
    all.extend_from_slice(&first);
    all.extend_from_slice(&rest);
    Ok(all.freeze())
}

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::LengthLimitError;

    fn in_frames(frames: &[&'static str]) -> Body {
        let frames: Vec<Result<Bytes, std::io::Error>> = frames
            .iter()
            .map(|f| Ok(Bytes::from_static(f.as_bytes())))
            .collect();
        Body::from_stream(futures_util::stream::iter(frames))
    }

    #[tokio::test]
    async fn a_body_in_one_frame_is_taken_as_it_is() {
        let bytes = Bytes::from_static(b"{\"model\": \"m\"}");
        let read = whole(Body::from(bytes.clone()), 100).await.unwrap();
        assert_eq!(read, bytes);
        assert_eq!(read.as_ptr(), bytes.as_ptr(), "not copied");
        assert_eq!(whole(Body::empty(), 100).await.unwrap(), Bytes::new());
    }

    #[tokio::test]
    async fn a_body_in_frames_is_gathered_in_order() {
        let read = whole(in_frames(&["{\"a\"", ": 1,", " \"b\": 2}"]), 100).await;
        assert_eq!(read.unwrap(), Bytes::from_static(b"{\"a\": 1, \"b\": 2}"));
        let read = whole(in_frames(&["", "x", ""]), 100).await;
        assert_eq!(read.unwrap(), Bytes::from_static(b"x"));
        // Data, then an end of its own: the data is still taken as it is.
        let data = "{\"model\": \"m\"}";
        let read = whole(in_frames(&[data, ""]), 100).await.unwrap();
        assert_eq!(read.as_ptr(), data.as_ptr(), "not copied");
    }

    #[tokio::test]
    async fn the_limit_holds_in_the_first_frame_and_across_frames() {
        for frames in [&["0123456789ab"][..], &["01234", "56789", "ab"]] {
            let err = whole(in_frames(frames), 10).await.unwrap_err();
            assert!(err.is::<LengthLimitError>(), "{frames:?}: {err}");
        }
        let exact = whole(in_frames(&["01234", "56789"]), 10).await;
        assert_eq!(exact.unwrap(), Bytes::from_static(b"0123456789"));
    }
}
