//! A chat model recall asks for itself (summaries, notes, facts):
//! `ChatModel`, and its implementation over a configured upstream (a
//! plain, non-streaming chat completion). `ModelError` is why any of
//! recall's own model calls gave nothing.

use std::sync::Arc;

use axum::http::{HeaderMap, Method};
use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::error::UpstreamError;
use crate::memory::long_term::Malformed;
use crate::memory::summary::Rejected;
use crate::proxy::client;
use crate::proxy::upstream::Upstream;

/// Longest answer body read from a model.
pub(super) const MAX_BODY: usize = 1024 * 1024;

/// Why a model recall called for itself gave nothing usable.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    #[error("the model answered {status}: {message}")]
    Status { status: u16, message: String },
    #[error("the model did not answer within {0} s")]
    Timeout(u64),
    #[error("the model's answer is not a chat completion: {0}")]
    NotACompletion(String),
    #[error("the model's answer is not a list of embeddings: {0}")]
    NotEmbeddings(String),
    #[error(transparent)]
    Rejected(#[from] Rejected),
    #[error(transparent)]
    Malformed(#[from] Malformed),
}

impl From<ModelError> for crate::error::ApiError {
    fn from(e: ModelError) -> Self {
        crate::error::ApiError::SummaryModel(e.to_string())
    }
}

/// A chat model that answers a list of messages with text.
pub trait ChatModel: Send + Sync {
    fn name(&self) -> &str;
    fn complete(&self, messages: Vec<Value>) -> BoxFuture<'_, Result<String, ModelError>>;
}

/// A chat model as an upstream serves it.
pub struct UpstreamChat {
    pub upstream: Arc<Upstream>,
    pub model: String,
}

impl ChatModel for UpstreamChat {
    fn name(&self) -> &str {
        &self.model
    }

    fn complete(&self, messages: Vec<Value>) -> BoxFuture<'_, Result<String, ModelError>> {
        Box::pin(async move {
            let body = json!({"model": self.model, "messages": messages, "stream": false});
            answer_text(&call(&self.upstream, None, &body).await?)
        })
    }
}

/// The body of a successful answer to `body` posted to the upstream's
/// chat completions, or with `path` to that path; an error status is an
/// error, with the upstream's message.
pub(super) async fn call(
    upstream: &Upstream,
    path: Option<&str>,
    body: &Value,
) -> Result<Vec<u8>, ModelError> {
    // A place under the upstream's `max_concurrent`: behind live requests
    // for a background job's call.
    let _slot = super::background::slot(upstream).await?;
    let body = body.to_string().into();
    let resp = match path {
        None => upstream.send_chat(&HeaderMap::new(), body).await?,
        Some(path) => {
            let headers = HeaderMap::new();
            upstream
                .send(Method::POST, path, &headers, Some(body))
                .await?
        }
    };
    let status = resp.status();
    let bytes = read(upstream, resp).await?;
    if !status.is_success() {
        return Err(ModelError::Status {
            status: status.as_u16(),
            message: error_message(&bytes),
        });
    }
    Ok(bytes)
}

async fn read(upstream: &Upstream, resp: client::Response) -> Result<Vec<u8>, ModelError> {
    let mut body = upstream.body(resp);
    let mut all = Vec::new();
    while let Some(piece) = body.next().await {
        let piece = piece.map_err(|e| ModelError::NotACompletion(e.to_string()))?;
        if all.len() + piece.len() > MAX_BODY {
            return Err(ModelError::NotACompletion(format!(
                "longer than {MAX_BODY} bytes"
            )));
        }
        all.extend_from_slice(&piece);
    }
    Ok(all)
}

/// The text of a chat completion's first choice.
pub(crate) fn answer_text(body: &[u8]) -> Result<String, ModelError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| ModelError::NotACompletion(e.to_string()))?;
    match &v["choices"][0]["message"]["content"] {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        other => Err(ModelError::NotACompletion(format!(
            "its content is {other}"
        ))),
    }
}

fn error_message(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned())
}
