//! The Responses API's open stage: the response's input joins the session
//! it continues, as `Continues` says (appended to a conversation or a
//! chain, after an older response, which forks when later messages follow
//! it, or on a copy outside the store for `store: false`), with the turn's
//! own pieces (`turn::begin_in`, `turn::opened`).

use std::sync::Arc;

use crate::api::turn::{self, Admission, Opened, Plan};
use crate::error::{ApiError, NotFound};
use crate::memory::message::Message;
use crate::memory::session::{Joins, Session, TurnRequest};
use crate::server::app::App;

/// The session a response runs in, and how its input joins it.
pub(super) struct Target {
    /// The internal id (`Access::internal`).
    pub id: String,
    pub continues: Continues,
    /// The session must exist (and for `Continues::After`, hold the
    /// response): else this is the answer, and nothing is created.
    pub missing: Option<NotFound>,
}

pub(super) enum Continues {
    /// A conversation, or a new chain.
    Append,
    /// After a response; if later messages follow it, the turn forks into
    /// a new session under `fork_to`.
    After { response: String, fork_to: String },
    /// A session outside the store that starts from this history and
    /// records nothing.
    Unstored(Vec<Arc<Message>>),
}

pub(super) async fn open(
    app: &Arc<App>,
    plan: &mut Plan,
    target: Target,
) -> Result<Opened, ApiError> {
    let mut admission = Admission::default();
    let conversation = std::mem::take(&mut plan.conversation);
    let Target {
        id,
        continues,
        missing,
    } = target;
    let missing = missing.as_ref();
    let (prepared, flight, id) = match continues {
        Continues::Append => {
            let turn = turn::request(app, plan, &conversation, Joins::Append).await;
            match turn::begin_in(app, &id, &turn, missing, &mut admission).await? {
                Ok((prepared, flight)) => (prepared, flight, id),
                // Only `Joins::After` forks.
                Err(_) => return Err(ApiError::Internal),
            }
        }
        Continues::After { response, fork_to } => {
            let after = turn::request(app, plan, &conversation, Joins::After(&response)).await;
            match turn::begin_in(app, &id, &after, missing, &mut admission).await? {
                Ok((prepared, flight)) => (prepared, flight, id),
                Err(history) => {
                    let fork = TurnRequest {
                        joins: Joins::Fork(&history),
                        ..after
                    };
                    match turn::begin_in(app, &fork_to, &fork, None, &mut admission).await? {
                        Ok((prepared, flight)) => (prepared, flight, fork_to),
                        Err(_) => return Err(ApiError::Internal),
                    }
                }
            }
        }
        Continues::Unstored(history) => {
            admission.take(app, || None)?;
            let turn = TurnRequest {
                place: admission.place(),
                ..turn::request(app, plan, &conversation, Joins::Fork(&history)).await
            };
            let session = Session::unstored(&id, turn.now_ms);
            match session.begin(&app.unstored, &turn) {
                Ok((prepared, flight)) => (prepared, Arc::new(flight), id),
                Err(refused) => {
                    tracing::error!(?refused, "a new unstored session refused its turn");
                    return Err(ApiError::Internal);
                }
            }
        }
    };
    Ok(turn::opened(app, prepared, flight, id, admission).await)
}
