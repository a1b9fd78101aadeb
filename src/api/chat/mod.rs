//! `POST /v1/chat/completions`: the request parsed and checked, then run
//! as a turn (`api::turn`: route → open → instructions → cache → send).

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use axum::Extension;

pub(crate) mod request;

use request::{one_streamed_choice, session_id};
pub(crate) use request::{parse_body, request_with};
pub use request::{parse_request, ChatRequest};

use super::observe::ServedBy;
use super::turn::{run, Arrival, Turn};
use super::PathParams;
use crate::error::ApiError;
use crate::server::app::App;

pub async fn completions(
    State(app): State<Arc<App>>,
    PathParams(path): PathParams,
    served: Option<Extension<ServedBy>>,
    // Whole rather than `HeaderMap` and `Body`: that extractor clones the
    // headers, where taking the request apart moves them.
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    let (axum::http::request::Parts { headers, .. }, body) = request.into_parts();
    let (arrival, bytes) = Arrival::read(&app, headers, body).await?;
    let (access, headers) = (&arrival.access, &arrival.headers);
    let ChatRequest { body, messages } =
        parse_request(&bytes, app.config.server.max_request_messages)?;
    let session_id = session_id(&app, &path, headers, &body)?;
    if session_id.is_some() {
        one_streamed_choice(&body)?;
    }
    let session = session_id.map(|id| access.internal(&id).into_owned());
    let turn = Turn {
        arrival,
        body,
        messages,
        session,
        served: served.map(|Extension(s)| s),
    };
    Ok(run(&app, turn).await?.response)
}
