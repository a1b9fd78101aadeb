//! A chat model recall asks for itself (summaries, notes, facts):
//! `ChatModel`, and its implementation over a configured upstream (the
//! call its protocol writes: not streamed, bounded by `max_tokens`, with a
//! `response_format` when an answer of a shape is asked for). `ModelError`
//! is why any of recall's own model calls gave nothing.

use std::sync::Arc;

use axum::http::{HeaderMap, Method};
use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use serde_json::Value;

use super::structured::{self, Format, Formats, Shape};
use crate::config::StructuredOutput;
use crate::error::UpstreamError;
use crate::metrics::Metrics;
use crate::proxy::client;
use crate::proxy::protocol::Protocol;
use crate::proxy::upstream::Upstream;
use recall_core::memory::long_term::Malformed;
use recall_core::memory::summary::Rejected;

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
    #[error("the local embedding model failed: {0}")]
    Local(String),
    #[error("strategy {0:?} needs long_term.extract_model, and none is configured")]
    NoExtractModel(String),
}

impl From<ModelError> for crate::error::ApiError {
    fn from(e: ModelError) -> Self {
        crate::error::ApiError::SummaryModel(e.to_string())
    }
}

/// What recall asks a chat model for.
#[derive(Debug, Clone)]
pub struct Ask {
    pub messages: Vec<Value>,
    /// The longest answer, in the model's tokens: a background call never
    /// holds a model for as long as it likes.
    pub max_tokens: u32,
    /// The answer's shape; none: plain text.
    pub shape: Option<Shape>,
}

/// A model's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub text: String,
    /// The model stopped at `max_tokens` (`finish_reason: "length"`): the
    /// text is not all it meant to write.
    pub cut_off: bool,
}

/// A chat model that answers a list of messages with text.
pub trait ChatModel: Send + Sync {
    fn name(&self) -> &str;
    fn complete<'a>(&'a self, ask: &'a Ask) -> BoxFuture<'a, Result<Answer, ModelError>>;
}

/// A chat model as an upstream serves it.
pub struct UpstreamChat {
    upstream: Arc<Upstream>,
    model: String,
    /// How this upstream takes a shape, as configured or learnt.
    formats: Formats,
    metrics: Arc<Metrics>,
}

impl UpstreamChat {
    pub fn new(
        upstream: Arc<Upstream>,
        model: String,
        structured: StructuredOutput,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            upstream,
            model,
            formats: Formats::new(structured),
            metrics,
        }
    }

    async fn ask(&self, ask: &Ask, response_format: Option<Value>) -> Result<Answer, ModelError> {
        let protocol = self.upstream.protocol;
        let body = protocol.ask_body(&self.model, &ask.messages, ask.max_tokens, response_format);
        answer(protocol, &call(&self.upstream, None, body).await?)
    }

    /// `ask` with its shape asked for the way the upstream takes, stepping
    /// down at once on a refusal: the model did not fail, the request did.
    async fn ask_shaped(&self, ask: &Ask, shape: &Shape) -> Result<Answer, ModelError> {
        let mut format = self.formats.current();
        loop {
            let (status, message) = match self.ask(ask, format.response_format(shape)).await {
                Err(ModelError::Status { status, message }) => (status, message),
                other => return other,
            };
            let step = structured::refused(format, status, &message)
                .then(|| self.formats.step_down(format))
                .flatten();
            let Some(step) = step else {
                return Err(ModelError::Status { status, message });
            };
            self.metrics
                .memory
                .structured_step_down(&self.upstream.name, format.label());
            if step.moved {
                tracing::warn!(
                    upstream = %self.upstream.name,
                    model = %self.model,
                    refused = format.label(),
                    next = step.next.label(),
                    status,
                    error = %message,
                    "the upstream refused this response_format; asking the next way from now on (pin it with structured_output)"
                );
            }
            format = step.next;
        }
    }
}

impl ChatModel for UpstreamChat {
    fn name(&self) -> &str {
        &self.model
    }

    fn complete<'a>(&'a self, ask: &'a Ask) -> BoxFuture<'a, Result<Answer, ModelError>> {
        Box::pin(async move {
            match &ask.shape {
                Some(shape) if self.formats.current() != Format::Plain => {
                    self.ask_shaped(ask, shape).await
                }
                _ => self.ask(ask, None).await,
            }
        })
    }
}

/// The body of a successful answer to `body` posted to the upstream's
/// turn URL (parsed once, when the upstream started), or with `path` to
/// that path (one its protocol names); an error status is an error, with
/// the upstream's message.
pub(super) async fn call(
    upstream: &Upstream,
    path: Option<&str>,
    body: Vec<u8>,
) -> Result<Vec<u8>, ModelError> {
    // A place under the upstream's `max_concurrent`: behind live requests
    // for a background job's call.
    let _slot = super::background::slot(upstream).await?;
    let body = body.into();
    let headers = HeaderMap::new();
    let resp = match path {
        None => upstream.send_turn(&headers, body).await?,
        Some(path) => {
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

/// The answer's text, as its protocol reads it, and whether it stopped
/// at `max_tokens`.
pub(crate) fn answer(protocol: Protocol, body: &[u8]) -> Result<Answer, ModelError> {
    let said = protocol
        .read_said(body)
        .map_err(ModelError::NotACompletion)?;
    Ok(Answer {
        text: said.text,
        cut_off: said.cut_off,
    })
}

/// The longest error text kept from an answer that is not JSON.
const ERROR_CHARS: usize = 500;

/// What an error answer says: OpenAI's `error.message` (with its `param`),
/// a bare `message` (vLLM), FastAPI's `detail`, or the body's start.
fn error_message(body: &[u8]) -> String {
    let raw = || String::from_utf8_lossy(&body[..body.len().min(ERROR_CHARS)]).into_owned();
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return raw();
    };
    let error = &v["error"];
    let message = error["message"]
        .as_str()
        .or_else(|| error.as_str())
        .or_else(|| v["message"].as_str())
        .map(str::to_owned)
        .or_else(|| (!v["detail"].is_null()).then(|| v["detail"].to_string()));
    match (message, error["param"].as_str()) {
        (Some(m), Some(param)) => format!("{m} (param: {param})"),
        (Some(m), None) => m,
        (None, _) => raw(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_answer_says_what_its_server_says() {
        // OpenAI's shape, with the field it names.
        let openai = br#"{"error": {"message": "Invalid parameter", "type": "invalid_request_error", "param": "response_format", "code": null}}"#;
        assert_eq!(
            error_message(openai),
            "Invalid parameter (param: response_format)"
        );
        // vLLM's bare message, a plain string error, FastAPI's detail.
        let vllm = br#"{"object": "error", "message": "bad type", "type": "BadRequestError", "code": 400}"#;
        assert_eq!(error_message(vllm), "bad type");
        assert_eq!(error_message(br#"{"error": "overloaded"}"#), "overloaded");
        let fastapi = br#"{"detail": [{"loc": ["body", "response_format", "type"]}]}"#;
        assert_eq!(
            error_message(fastapi),
            r#"[{"loc":["body","response_format","type"]}]"#
        );
        // Not JSON: its start.
        let html = "<html>".repeat(200);
        assert_eq!(error_message(html.as_bytes()), html[..ERROR_CHARS]);
    }
}
