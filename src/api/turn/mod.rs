//! A turn, in named stages: chat's handler and the Responses API's each
//! parse their own request into a [`Turn`], and [`run`] takes it through
//!
//!   route → open → instructions → cache → send
//!
//! over one [`Plan`], each stage a function of its own file. What a turn
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

pub(crate) use route::Plan;

use super::auth::Access;
use super::observe::ServedBy;
use crate::error::{ApiError, NotFound};
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
    /// None: stateless, the client's messages are sent as they are.
    pub session: Option<Target>,
    pub served: Option<ServedBy>,
    /// Set when recall reads the answer again (`Readings`).
    pub readings: Option<Readings>,
}

/// The session a turn runs in, and how its messages join it.
pub(crate) struct Target {
    /// The internal id (`Access::internal`).
    pub id: String,
    pub joins: Joining,
    /// The session must exist (and for `Joining::After`, hold the
    /// response): else this is the answer, and nothing is created.
    pub missing: Option<NotFound>,
}

pub(crate) enum Joining {
    Reconcile,
    Append,
    /// After a response; if later messages follow it, the turn forks into
    /// a new session under `fork_to`.
    After {
        response: String,
        fork_to: String,
    },
    /// A session outside the store that starts from this history and
    /// records nothing.
    Unstored(Vec<Arc<Message>>),
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

/// The turn, stage by stage.
pub(crate) async fn run(app: &Arc<App>, turn: Turn) -> Result<Ran, ApiError> {
    let mut plan = route::route(app, turn)?;
    let mut opened = open::open(app, &mut plan).await?;
    let instructions = instructions::assemble(app, &mut plan, &mut opened);
    let (session, reply_seq) = (opened.session.clone(), opened.prepared.reply_seq);
    let response = match cache::look_up(app, &plan, &opened, &instructions).await? {
        cache::Looked::Hit(response) => response,
        cache::Looked::Miss(key) => send::send(app, plan, opened, instructions, key).await?,
    };
    Ok(Ran {
        response,
        session,
        reply_seq,
    })
}
