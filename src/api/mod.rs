//! HTTP routes. Every route under `/v1/` is also served under
//! `/sessions/{session_id}/v1/`, for clients that can only set a base URL.

pub mod auth;
pub(crate) mod chat;
pub(crate) mod extract;
mod models;
pub mod observe;
pub mod responses;
pub(crate) mod sessions;
pub(crate) mod turn;
pub(crate) mod users;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, Uri};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post, put, MethodRouter};
use axum::Router;
use subtle::ConstantTimeEq;

pub use chat::{parse_request, ChatRequest};
pub(crate) use extract::{read_body, whole};
pub use extract::{PathParams, QueryParams};

use crate::api::auth::Access;
use crate::api::responses::conversations;
use crate::error::{ApiError, RequestError};
use crate::long_term::routes as records;
use crate::server::app::App;
use crate::summaries::routes as summary;

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
        ("/sessions/{id}/summary", put(summary::put_summary)),
        ("/sessions/{id}/summarize", post(summary::summarize)),
        ("/sessions/{id}/memory/extract", post(records::extract)),
        (
            "/users/{user}/memory/records",
            get(records::list_records).post(records::add_record),
        ),
        (
            "/users/{user}/memory/records/search",
            post(records::search_records),
        ),
        (
            "/users/{user}/memory/records/{id}",
            get(records::get_record).delete(records::delete_record),
        ),
        (
            "/users/{user}/memory",
            get(users::get_user_memory)
                .put(users::put_user_memory)
                .delete(users::delete_user_memory),
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
