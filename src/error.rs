//! Errors recall itself answers with, split by whose fault they are, and
//! mapped in this one place to OpenAI's error body and status.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

pub use recall_core::error::{NotFound, RequestError};

impl From<NotFound> for ApiError {
    fn from(n: NotFound) -> Self {
        RequestError::ObjectNotFound(n).into()
    }
}

/// The upstream could not be reached or did not answer in time. An upstream
/// that answers with an error status is not this: its answer is relayed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream `{upstream}` is unreachable: {reason}")]
    Unreachable { upstream: String, reason: String },
    #[error("upstream `{upstream}` did not answer within {secs} s")]
    Timeout { upstream: String, secs: u64 },
    /// A success status with a body that is not a chat completion.
    #[error(
        "upstream `{upstream}` answered with something that is not a chat completion: {reason}"
    )]
    Invalid { upstream: String, reason: String },
    #[error("upstream `{upstream}` had no free slot (max_concurrent = {limit}) within {secs} s")]
    Busy {
        upstream: String,
        limit: usize,
        secs: u64,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// A bug in recall, not anybody's input; details are in the log.
    #[error("internal error in recall")]
    Internal,
    /// Storage did not take a write, or (Redis) took it on a node whose
    /// replicas did not have it in time. The session is reloaded from
    /// storage before its next request, so its history holds what was
    /// stored: nothing of this request, or (when only the reply's record
    /// failed) its own messages without a reply, which a retry does not
    /// repeat; a turn not replicated may be whole in it, or gone after a
    /// failover, and a retry runs it again in place of the reply.
    #[error("{}", storage_message(.0))]
    Storage(#[from] crate::store::StorageError),
    #[error("recall is at its limit of {limit} upstream calls at once (server.max_concurrent_upstream); retry shortly")]
    Overloaded { limit: usize },
    /// The summary model wrote nothing that could be kept (why, from
    /// `models::ModelError`).
    #[error("{0}; the summary is unchanged")]
    SummaryModel(String),
    /// The extract or embedding model failed a job run on request: no
    /// record was stored or changed.
    #[error("{0}; no memory record was stored")]
    LongTermModel(String),
}

impl UpstreamError {
    /// Whether this is the upstream failing, for its error count: a full
    /// gate (`Busy`) is recall's own limit.
    pub fn is_the_upstreams(&self) -> bool {
        !matches!(self, UpstreamError::Busy { .. })
    }
}

impl ApiError {
    pub(crate) fn parts(
        &self,
    ) -> (
        StatusCode,
        &'static str,
        Option<String>,
        Option<&'static str>,
    ) {
        use RequestError as R;
        match self {
            ApiError::Request(e) => match e {
                R::Invalid { param, code, .. } => (
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    param.clone(),
                    *code,
                ),
                R::BodyTimeout { .. } => (
                    StatusCode::REQUEST_TIMEOUT,
                    "invalid_request_error",
                    None,
                    Some("request_timeout"),
                ),
                R::TooLarge { .. } => (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "invalid_request_error",
                    None,
                    Some("request_too_large"),
                ),
                R::HeadersTooLarge { .. } => (
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    "invalid_request_error",
                    None,
                    Some("headers_too_large"),
                ),
                R::SessionRequired { .. } => (
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    Some("session_id".into()),
                    Some("session_required"),
                ),
                R::UnknownModel { .. } => (
                    StatusCode::NOT_FOUND,
                    "invalid_request_error",
                    Some("model".into()),
                    Some("model_not_found"),
                ),
                R::SessionNotFound { .. } => (
                    StatusCode::NOT_FOUND,
                    "invalid_request_error",
                    Some("session_id".into()),
                    Some("session_not_found"),
                ),
                R::ObjectNotFound(NotFound { param, code, .. }) => (
                    StatusCode::NOT_FOUND,
                    "invalid_request_error",
                    param.map(str::to_owned),
                    Some(*code),
                ),
                R::Interrupted => (
                    StatusCode::CONFLICT,
                    "invalid_request_error",
                    None,
                    Some("interrupted"),
                ),
                R::Busy { .. } => (
                    StatusCode::CONFLICT,
                    "invalid_request_error",
                    Some("session_id".into()),
                    Some("session_busy"),
                ),
                R::NothingToInterrupt { .. } => (
                    StatusCode::NOT_FOUND,
                    "invalid_request_error",
                    None,
                    Some("nothing_to_interrupt"),
                ),
                R::Unauthorized | R::NoClientKey => (
                    StatusCode::UNAUTHORIZED,
                    "invalid_request_error",
                    None,
                    Some("invalid_api_key"),
                ),
                R::MethodNotAllowed { .. } => (
                    StatusCode::METHOD_NOT_ALLOWED,
                    "invalid_request_error",
                    None,
                    Some("method_not_allowed"),
                ),
                R::NoRoute { .. } => (
                    StatusCode::NOT_FOUND,
                    "invalid_request_error",
                    None,
                    Some("unknown_url"),
                ),
            },
            ApiError::Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                None,
                None,
            ),
            ApiError::Storage(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                None,
                Some("storage_unavailable"),
            ),
            ApiError::Overloaded { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                None,
                Some("overloaded"),
            ),
            ApiError::SummaryModel(_) => (
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                None,
                Some("summary_failed"),
            ),
            ApiError::LongTermModel(_) => (
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                None,
                Some("extraction_failed"),
            ),
            ApiError::Upstream(e) => match e {
                UpstreamError::Unreachable { .. } => (
                    StatusCode::BAD_GATEWAY,
                    "upstream_error",
                    None,
                    Some("upstream_unreachable"),
                ),
                UpstreamError::Timeout { .. } => (
                    StatusCode::GATEWAY_TIMEOUT,
                    "upstream_error",
                    None,
                    Some("upstream_timeout"),
                ),
                UpstreamError::Invalid { .. } => (
                    StatusCode::BAD_GATEWAY,
                    "upstream_error",
                    None,
                    Some("upstream_invalid_response"),
                ),
                // Nothing was sent: a retry later may find a slot.
                UpstreamError::Busy { .. } => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "upstream_error",
                    None,
                    Some("upstream_busy"),
                ),
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, kind, param, code) = self.parts();
        let body = json!({"error": {
            "message": self.to_string(),
            "type": kind,
            "param": param,
            "code": code,
        }});
        let mut response = (status, axum::Json(body)).into_response();
        // The OpenAI SDKs obey `x-should-retry`. Gateway errors are worth a
        // retry; a 409 about turn order is not (they retry 409 by default).
        let retry = match self {
            ApiError::Upstream(_) | ApiError::Storage(_) | ApiError::Overloaded { .. } => {
                Some("true")
            }
            ApiError::Request(RequestError::Interrupted | RequestError::Busy { .. }) => {
                Some("false")
            }
            _ => None,
        };
        if let Some(v) = retry {
            response
                .headers_mut()
                .insert("x-should-retry", HeaderValue::from_static(v));
        }
        if matches!(self, ApiError::Overloaded { .. }) {
            response
                .headers_mut()
                .insert("retry-after", HeaderValue::from_static("1"));
        }
        response
    }
}

impl From<recall_core::memory::message::MessageError> for ApiError {
    fn from(e: recall_core::memory::message::MessageError) -> Self {
        RequestError::from(e).into()
    }
}

/// What a client is told when storage failed a request: which store (and
/// node), and what the session's history now holds.
fn storage_message(e: &crate::store::StorageError) -> String {
    use crate::store::StorageError as E;
    let what = match e {
        E::NotStored(why) => why.clone(),
        E::NotReplicated(why) => {
            return format!(
                "{why}; this request did not complete: the session's history holds \
                 the turn unless a failover drops it, and a retry of it runs it again \
                 in place of the reply you did not get"
            )
        }
        E::Node { .. } => e.to_string(),
        E::Sqlite(_) | E::Dir { .. } => format!("the SQLite store failed ({e})"),
        E::Redis(_) => format!("the Redis store failed ({e})"),
        E::Corrupt(_) | E::Stopped | E::Failed(_) | E::Task(_) => format!("storage failed ({e})"),
    };
    format!(
        "{what}; the turn was not stored: this request did not complete, the session's \
         history holds at most its messages and never its reply, and a retry of it runs it once"
    )
}
