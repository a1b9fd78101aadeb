//! HTTP routes. Every route under `/v1/` is also served under
//! `/sessions/{session_id}/v1/`, for clients that can only set a base URL.

mod chat;
mod models;
mod sessions;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Uri};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use http_body_util::BodyExt;

use crate::app::App;
use crate::error::{ApiError, RequestError};

pub fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .nest("/v1", v1())
        .nest("/sessions/{session_id}/v1", v1())
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
}

fn v1() -> Router<Arc<App>> {
    Router::new()
        .route("/chat/completions", post(chat::completions))
        .route("/models", get(models::list))
        .route("/models/{*model}", get(models::retrieve))
        .route("/sessions/{id}/history", get(sessions::history))
        .route("/sessions/{id}/interrupt", post(sessions::interrupt))
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

/// Reads a request body of at most `limit` bytes.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let limited = http_body_util::Limited::new(body, limit);
    match limited.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(RequestError::TooLarge { limit }.into())
        }
        Err(e) => {
            Err(RequestError::invalid(format!("could not read the request body: {e}"), None).into())
        }
    }
}
