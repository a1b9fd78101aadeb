//! Send: the turn's body written in the upstream's protocol (and the
//! fallback's, ready in case the first call fails before its first byte),
//! and the relay of the answer, which completes the turn's reply.

use std::sync::Arc;

use axum::http::HeaderValue;
use axum::response::Response;

use super::open::Opened;
use super::Plan;
use crate::api::chat::request::CACHE_HEADER;
use crate::error::ApiError;
use crate::memory::message::Message;
use crate::proxy::cache::Key;
use crate::proxy::protocol::TurnInfo;
use crate::relay::{self, Exchange, Readings};
use crate::server::app::App;

pub(super) async fn send(
    app: &App,
    plan: Plan,
    opened: Opened,
    instructions: Vec<Message>,
    cache_key: Option<Key>,
    readings: Option<Readings>,
) -> Result<Response, ApiError> {
    let Plan {
        headers,
        arrived,
        body,
        upstream,
        fallback,
        now_ms: now,
        ..
    } = plan;
    let Opened {
        prepared,
        flight,
        session,
        admission,
        ..
    } = opened;
    let turn = session.as_ref().map(|_| TurnInfo {
        turn_id: prepared.turn_id,
        summary: prepared.remembered.summary.as_deref(),
    });
    let window = &prepared.window;
    let upstream_body =
        match upstream
            .protocol
            .turn_body(&upstream.rules, &body, &instructions, window, turn, now)
        {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "could not serialise the upstream body");
                flight.failed("internal error");
                return Err(ApiError::Internal);
            }
        };
    tracing::debug!(window = window.len(), "forwarding chat completion");
    // The body for the fallback upstream is made now, for its protocol and
    // vendor mode; it is used only if the first call fails before its
    // first byte.
    let fallback = fallback.and_then(|fb| {
        let window = prepared.fallback_window.as_ref().unwrap_or(window);
        let body = fb
            .protocol
            .turn_body(&fb.rules, &body, &instructions, window, turn, now)
            .ok()?;
        Some((fb, bytes::Bytes::from(body)))
    });
    let mut response = relay::start(Exchange {
        upstream,
        client_headers: headers,
        body: upstream_body.into(),
        flight,
        drain: app.config.interruption.clone(),
        metrics: Arc::clone(&app.metrics),
        arrived,
        fallback,
        slot: admission.into_slot(),
        readings,
    })
    .await?;
    if cache_key.is_some() {
        response
            .headers_mut()
            .insert(CACHE_HEADER, HeaderValue::from_static("miss"));
    }
    Ok(response)
}
