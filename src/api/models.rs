//! Model listing, forwarded to the first upstream.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method};
use axum::response::Response;

use super::PathParams;
use crate::error::{ApiError, RequestError, UpstreamError};
use crate::proxy::upstream::relayed_response_headers;
use crate::server::app::App;

pub async fn list(State(app): State<Arc<App>>, headers: HeaderMap) -> Result<Response, ApiError> {
    forward(&app, "/models", &headers).await
}

pub async fn retrieve(
    State(app): State<Arc<App>>,
    PathParams(params): PathParams,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let model = params.get("model").map(String::as_str).unwrap_or_default();
    check_model_path(model)?;
    forward(&app, &format!("/models/{model}"), &headers).await
}

/// The model id goes into the upstream URL, sent with the upstream's API
/// key. Ids may hold `/` (`org/model` at many vendors), but a `.` or `..`
/// segment would walk the URL up out of `/models` (URLs normalise them,
/// percent-encoded or not), and `?`, `#`, `%` or `\` would change what the
/// URL means: such ids are refused rather than rewritten.
fn check_model_path(model: &str) -> Result<(), ApiError> {
    let bad_segment = model
        .split('/')
        .any(|s| s.is_empty() || s == "." || s == "..");
    let bad_char = model
        .chars()
        .any(|c| !c.is_ascii_graphic() || matches!(c, '?' | '#' | '%' | '\\'));
    if bad_segment || bad_char {
        return Err(RequestError::invalid(
            "the model id in the path must be visible ASCII without `?`, `#`, `%` or `\\`, and no `.`, `..` or empty segment",
            Some("model"),
        )
        .into());
    }
    Ok(())
}

async fn forward(app: &App, path: &str, headers: &HeaderMap) -> Result<Response, ApiError> {
    let Some(upstream) = app.upstreams.first() else {
        return Err(ApiError::Internal);
    };
    let resp = upstream.send(Method::GET, path, headers, None).await?;
    let status = resp.status();
    let relayed = relayed_response_headers(resp.headers());
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .map(http_body_util::Collected::to_bytes)
        .map_err(|e| UpstreamError::Unreachable {
            upstream: upstream.name.clone(),
            reason: e.to_string(),
        })?;
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = status;
    *response.headers_mut() = relayed;
    Ok(response)
}
