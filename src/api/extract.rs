//! What a handler takes from a request: its path and query parameters,
//! with OpenAI-shaped errors when they do not fit, and its body, within
//! the configured size and time.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use axum::body::HttpBody as _;
use axum::extract::path::ErrorKind;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequestParts, Path, Query};
use axum::http::request::Parts;
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;

use crate::error::{ApiError, RequestError};
use crate::server::app::App;

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
