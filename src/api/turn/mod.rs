//! A turn, in named stages: chat's handler and the Responses API's each
//! parse their own request into a [`Turn`], and take it through
//!
//!   route → open → instructions → cache → send
//!
//! over one [`Plan`], each stage a function of its own file. Chat's
//! [`run`] opens by reconciling the request with the session's history;
//! the Responses API opens its own way (a chain, a fork, a copy outside
//! the store) with the same pieces ([`begin_in`], [`opened`]) and then
//! runs the same stages after open ([`after_open`]). What a turn
//! records, its reply, is written by the flight `open` begins, as the
//! relay (or a cache hit) completes it. Everything that can reject the
//! request happens before the session is touched, so a rejected request
//! changes nothing.

use std::sync::Arc;

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{Map, Value};

mod cache;
mod instructions;
mod open;
mod route;
mod send;

pub(crate) use open::{begin_in, opened, request, Admission, Opened};
pub(crate) use route::{route, Plan};

use super::auth::Access;
use super::observe::ServedBy;
use crate::error::ApiError;
use crate::memory::message::Message;
use crate::relay::Readings;
use crate::server::app::App;

/// A request on a turn's path as it arrived: whose it is, its headers
/// (the client's key taken out: it is recall's, and the upstream gets its
/// own or none), and when its body was read whole.
pub(crate) struct Arrival {
    pub access: Access,
    pub headers: HeaderMap,
    pub arrived: tokio::time::Instant,
}

impl Arrival {
    /// Everything before the body is parsed, and the body.
    pub(crate) async fn read(
        app: &App,
        mut headers: HeaderMap,
        body: Body,
    ) -> Result<(Self, bytes::Bytes), ApiError> {
        let access = app.client_access(&headers)?;
        if app.client_keys.is_some() {
            headers.remove(axum::http::header::AUTHORIZATION);
        }
        let bytes = super::read_body(app, body).await?;
        // The client's upload is its own pace: the proxy's time starts here.
        let arrived = tokio::time::Instant::now();
        let arrival = Self {
            access,
            headers,
            arrived,
        };
        Ok((arrival, bytes))
    }
}

/// A checked request, ready to run: chat's own, or one the Responses API
/// translated.
pub(crate) struct Turn {
    pub arrival: Arrival,
    /// The body without `messages`.
    pub body: Map<String, Value>,
    pub messages: Vec<Message>,
    /// The internal id (`Access::internal`) of the session the turn runs
    /// in; none: stateless, the client's messages are sent as they are.
    pub session: Option<String>,
    pub served: Option<ServedBy>,
}

/// A turn that ran: the response for the client, and where it went.
pub(crate) struct Ran {
    pub response: Response,
    /// The internal id of the session the turn ran in (a fork's, if it
    /// forked).
    pub session: Option<String>,
    /// The sequence number the reply is recorded at.
    pub reply_seq: u64,
}

/// Chat's turn, stage by stage: route → open (reconciled with the
/// session's history) → the stages after open.
pub(crate) async fn run(app: &Arc<App>, turn: Turn) -> Result<Ran, ApiError> {
    let mut plan = route(app, turn)?;
    let opened = open::open(app, &mut plan).await?;
    after_open(app, plan, opened, None).await
}

/// The stages after a turn's session is open: instructions → cache →
/// send. The Responses API composes its own open with these; `readings`
/// is where the relay keeps what it parsed, for a caller that reads the
/// answer again.
pub(crate) async fn after_open(
    app: &Arc<App>,
    mut plan: Plan,
    mut opened: Opened,
    readings: Option<Readings>,
) -> Result<Ran, ApiError> {
    let instructions = instructions::assemble(app, &mut plan, &mut opened);
    let (session, reply_seq) = (opened.session.clone(), opened.prepared.reply_seq);
    let response = match cache::look_up(app, &plan, &opened, &instructions).await? {
        cache::Looked::Hit(response) => response,
        cache::Looked::Miss(key) => {
            send::send(app, plan, opened, instructions, key, readings).await?
        }
    };
    Ok(Ran {
        response,
        session,
        reply_seq,
    })
}
