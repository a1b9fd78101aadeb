//! The errors of a request the client got wrong: plain data here, mapped
//! to OpenAI's status and error body in one place, the server's
//! `error.rs`. Nothing was changed by a request refused with one.

use crate::memory::message::MessageError;

/// The client sent something recall cannot act on. Nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("{message}")]
    Invalid {
        message: String,
        param: Option<String>,
        /// OpenAI's machine-readable reason, where it has one for the case.
        code: Option<&'static str>,
    },
    #[error("request body is larger than the {limit} bytes allowed (server.max_body_bytes)")]
    TooLarge { limit: usize },
    #[error("request headers are larger than the {limit} bytes allowed (server.max_header_bytes)")]
    HeadersTooLarge { limit: usize },
    /// The client stopped sending its body (or sends it too slowly): the
    /// connection is not held open for it.
    #[error("the request body did not arrive within {secs} s (server.request_body_timeout_secs)")]
    BodyTimeout { secs: u64 },
    #[error("a session id is required: send the `{header}` header, use the /sessions/{{session_id}}/v1/ path, or set `session_id` in the body")]
    SessionRequired { header: String },
    #[error("The model `{model}` does not exist or no upstream serves it")]
    UnknownModel { model: String },
    #[error("session `{id}` not found")]
    SessionNotFound { id: String },
    #[error("{0}")]
    ObjectNotFound(NotFound),
    #[error("unknown route {method} {path}")]
    NoRoute { method: String, path: String },
    #[error("this reply was interrupted by a newer request or the interrupt endpoint")]
    Interrupted,
    #[error(
        "session `{id}` already has a reply in flight ([interruption] on_new_request = \"reject\")"
    )]
    Busy { id: String },
    #[error("session `{id}` has no assistant reply to interrupt")]
    NothingToInterrupt { id: String },
    #[error(
        "the session API needs `Authorization: Bearer <token>`: the admin token ([admin] token_env), or a client key ([auth])"
    )]
    Unauthorized,
    #[error("this recall needs one of its client keys as `Authorization: Bearer <key>` ([auth])")]
    NoClientKey,
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
}

/// A Responses or Conversations API object (`what`: "Response",
/// "Previous response", "Conversation", "Item") that does not exist, or
/// belongs to another tenant (the same answer, so ids are not probed).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{what} with id '{id}' not found.")]
pub struct NotFound {
    pub what: &'static str,
    pub id: String,
    pub param: Option<&'static str>,
    pub code: &'static str,
}

impl RequestError {
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> Self {
        RequestError::Invalid {
            message: message.into(),
            param: param.map(str::to_owned),
            code: None,
        }
    }

    /// `invalid` with OpenAI's `code` for the case (`empty_array`, ...).
    pub fn invalid_code(
        message: impl Into<String>,
        param: Option<&str>,
        code: &'static str,
    ) -> Self {
        RequestError::Invalid {
            message: message.into(),
            param: param.map(str::to_owned),
            code: Some(code),
        }
    }
}

impl From<MessageError> for RequestError {
    fn from(e: MessageError) -> Self {
        let param = e.param();
        RequestError::invalid(e.to_string(), Some(&param))
    }
}
