//! Model listing, forwarded to the first upstream.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method};
use axum::response::Response;

use crate::app::App;
use crate::error::{ApiError, UpstreamError};
use crate::upstream::relayed_response_headers;

pub async fn list(State(app): State<Arc<App>>, headers: HeaderMap) -> Result<Response, ApiError> {
    forward(&app, "/models", &headers).await
}

pub async fn retrieve(
    State(app): State<Arc<App>>,
    Path(params): Path<std::collections::HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let model = params.get("model").map(String::as_str).unwrap_or_default();
    forward(&app, &format!("/models/{model}"), &headers).await
}

async fn forward(app: &App, path: &str, headers: &HeaderMap) -> Result<Response, ApiError> {
    let Some(upstream) = app.upstreams.first() else {
        return Err(ApiError::Internal);
    };
    let resp = upstream.send(Method::GET, path, headers, None).await?;
    let status = resp.status();
    let relayed = relayed_response_headers(resp.headers());
    let bytes = resp.bytes().await.map_err(|e| UpstreamError::Unreachable {
        upstream: upstream.name.clone(),
        reason: e.to_string(),
    })?;
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = status;
    *response.headers_mut() = relayed;
    Ok(response)
}
