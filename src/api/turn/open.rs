//! Open: the turn's session found or created, its lease taken with shared
//! storage, and the turn begun in it (`begin_in`); a fold started if one
//! is due, and the user's long-term facts read (`opened`). Chat's `open`
//! reconciles the request with the history; the Responses API's own open
//! (`api/responses/open.rs`) appends, forks or copies with the same
//! pieces. A stateless turn opens no session and sends the client's
//! messages as they are.

use std::sync::Arc;

use super::Plan;
use crate::api::chat::request::{idempotency_key, retrying};
use crate::config::OnNewRequest;
use crate::error::{ApiError, NotFound, RequestError};
use crate::memory::message::Message;
use crate::memory::session::{self, Joins, Refused, Reply, TurnRequest};
use crate::memory::tokens::Encoding;
use crate::proxy::gate::{Acquire, Place};
use crate::server::app::App;
use crate::store::Wait;

/// A turn begun in its session (or stateless).
pub(crate) struct Opened {
    /// What the session sends and remembers for this turn.
    pub prepared: session::Prepared,
    /// The turn's reply: what records it.
    pub flight: Arc<Reply>,
    /// The internal id of the session the turn runs in (a fork's, if it
    /// forked); none when stateless.
    pub session: Option<String>,
    /// The user's long-term facts this turn sends, if any.
    pub facts: Option<Message>,
    /// The turn's upstream slot (`max_concurrent_upstream`), taken before
    /// anything is stored.
    pub admission: Admission,
}

/// Chat's open: the request reconciled with the session's history, or
/// stateless when it names no session.
pub(super) async fn open(app: &Arc<App>, plan: &mut Plan) -> Result<Opened, ApiError> {
    let mut admission = Admission::default();
    let conversation = std::mem::take(&mut plan.conversation);
    let Some(id) = plan.session.clone() else {
        // Stateless: the client manages its own history; send it as is.
        admission.take(app, || None)?;
        return Ok(Opened {
            prepared: session::Prepared::stateless(conversation),
            flight: Arc::new(Reply::stateless()),
            session: None,
            facts: None,
            admission,
        });
    };
    let turn = request(app, plan, &conversation, Joins::Reconcile).await;
    match begin_in(app, &id, &turn, None, &mut admission).await? {
        Ok((prepared, flight)) => Ok(opened(app, prepared, flight, id, admission).await),
        // Only `Joins::After` forks.
        Err(_) => Err(ApiError::Internal),
    }
}

/// What a session is asked to begin: the plan's `conversation`, joining
/// the history as `joins` says.
pub(crate) async fn request<'a>(
    app: &App,
    plan: &'a Plan,
    conversation: &'a [Message],
    joins: Joins<'a>,
) -> TurnRequest<'a> {
    TurnRequest {
        incoming: conversation,
        user: plan.user.as_deref(),
        memory_user: plan.memory_user.as_deref(),
        encoding: token_encoding(app, &plan.model).await,
        now_ms: plan.now_ms,
        retrying: retrying(&plan.headers),
        idempotency_key: idempotency_key(&plan.headers),
        rules: &plan.upstream.rules,
        fallback_rules: plan.fallback.as_ref().map(|f| &f.rules),
        joins,
        place: None,
    }
}

/// A turn begun in session `id`: the fold it made due started, the
/// user's message handed to the reply to wait for, the user's long-term
/// facts read.
pub(crate) async fn opened(
    app: &Arc<App>,
    mut prepared: session::Prepared,
    flight: Arc<Reply>,
    id: String,
    admission: Admission,
) -> Opened {
    tracing::Span::current().record("turn", prepared.turn_id);
    if let Some(fold) = prepared.fold.take() {
        crate::summaries::folds::start_fold(app, &id, fold);
    }
    // The upstream call does not wait for the user's message to be
    // stored: the two overlap, and the reply's end (what tells the client
    // the turn happened) waits for both.
    flight.opened(std::mem::take(&mut prepared.durable));
    let mut facts = None;
    if app.long_term.is_some() {
        // A read of the user's records, or an inline search: a client that
        // leaves meanwhile settles its reply like one that leaves during
        // the upstream call. Boxed: its state would otherwise grow every
        // turn's future.
        let gone = crate::relay::GoneGuard::armed(&flight);
        let due = std::mem::take(&mut prepared.long_term);
        facts = Box::pin(crate::long_term::for_turn::for_turn(app, &id, due)).await;
        gone.disarm();
    }
    Opened {
        prepared,
        flight,
        session: Some(id),
        facts,
        admission,
    }
}

/// A turn begun in its session: what it sends, and its reply.
pub(crate) type Begun = (session::Prepared, Arc<Reply>);

/// A turn's place under `max_concurrent_upstream` (`App::upstream_slot`),
/// taken once, just before the turn may cut its session's reply in
/// flight: a request refused for want of a slot has changed nothing, and
/// one that will cut the reply claims that reply's slot before it cuts.
#[derive(Default)]
pub(crate) struct Admission {
    taken: bool,
    slot: Option<Acquire>,
}

impl Admission {
    /// Takes the place, unless it is taken; `cutting`: the place of the
    /// reply in flight this turn will cut.
    pub(crate) fn take(
        &mut self,
        app: &App,
        cutting: impl FnOnce() -> Option<Arc<Place>>,
    ) -> Result<(), ApiError> {
        if !self.taken {
            self.slot = app.upstream_slot(cutting)?;
            self.taken = true;
        }
        Ok(())
    }

    pub(crate) fn place(&self) -> Option<&Arc<Place>> {
        self.slot.as_ref()?.place()
    }

    /// The slot for the exchange, if the limit is on.
    pub(super) fn into_slot(self) -> Option<Acquire> {
        self.slot
    }
}

/// Begins a turn in session `id`, creating the session if needed (unless
/// `missing` says it must exist). A session that ended while this request
/// held it is looked up again (and so started anew). `Err(history)`: the
/// turn forks from that history, and its place under
/// `max_concurrent_upstream` is given back.
pub(crate) async fn begin_in(
    app: &App,
    id: &str,
    turn: &TurnRequest<'_>,
    missing: Option<&NotFound>,
    admission: &mut Admission,
) -> Result<Result<Begun, Vec<Arc<Message>>>, ApiError> {
    let now = turn.now_ms;
    let busy = || ApiError::from(RequestError::Busy { id: id.to_owned() });
    let storage = &app.policy.storage;
    loop {
        // A turn that forks leaves the branch it forks from as it is: it
        // is decided before anything below settles or interrupts the
        // branch's reply in flight, here or on another replica. (`begin`
        // decides again under the lease, and may still fork.)
        if matches!(turn.joins, Joins::After(_)) {
            if let Some(session) = app.sessions.find(id, storage).await? {
                if let Some(history) = session.fork_point(turn) {
                    return Ok(Err(history));
                }
            }
        }
        // Nothing below happens without an upstream slot, and a turn
        // cuts the reply in flight here: it may take that reply's slot.
        admission.take(app, || app.sessions.get(id)?.reply_place())?;
        let turn = &TurnRequest {
            place: admission.place(),
            ..*turn
        };
        // This process's own reply is settled first: with shared storage
        // before the other replicas' (a turn never waits on its own
        // process's lease), and after a failed write before the session
        // is reloaded from storage (`Store::find`).
        if storage.shared() || storage.needs_reload(id) {
            if let Some(local) = app.sessions.get(id) {
                match local.settle(&app.policy, app.policy.on_new_request) {
                    Ok(()) | Err(Refused::Ended) => {}
                    Err(_) => return Err(busy()),
                }
            }
        }
        let claim = if storage.shared() {
            let wait = match app.policy.on_new_request {
                OnNewRequest::Interrupt => Wait::Interrupt,
                OnNewRequest::Reject => Wait::No,
            };
            Some(storage.claim(id, wait).await?.ok_or_else(busy)?)
        } else {
            None
        };
        let release = |claim: Option<crate::store::Claim>| {
            if let Some(claim) = claim {
                let _ = storage.release(claim);
            }
        };
        // With shared storage this reads what the previous holder wrote.
        let found = match missing {
            Some(missing) => match app.sessions.find(id, storage).await {
                Ok(Some(s)) => Ok((s, false)),
                Ok(None) => {
                    release(claim);
                    return Err(missing.clone().into());
                }
                Err(e) => Err(e),
            },
            None => app.sessions.open(id, storage, now).await,
        };
        let (session, created) = match found {
            Ok(found) => found,
            Err(e) => {
                release(claim);
                return Err(e.into());
            }
        };
        if created {
            app.session_created();
            if let (Some(key), Some(user), true) =
                (turn.memory_user, turn.user, app.config.memory.carry_over)
            {
                crate::summaries::turn::carry_in(app, &session, key, user).await;
            }
        }
        match session.begin(&app.policy, turn) {
            Ok((prepared, flight)) => {
                let flight = Arc::new(flight);
                if let Some(claim) = claim {
                    flight.hold(claim);
                }
                return Ok(Ok((prepared, flight)));
            }
            Err(refused) => {
                release(claim);
                match refused {
                    Refused::Busy => return Err(busy()),
                    Refused::Ended => continue,
                    Refused::Fork(history) => {
                        // A fork leaves the reply in flight as it is: it
                        // must not count on that reply's slot.
                        *admission = Admission::default();
                        return Ok(Err(history));
                    }
                    Refused::UnknownResponse => {
                        return Err(match missing {
                            Some(m) => m.clone().into(),
                            None => ApiError::Internal,
                        })
                    }
                    Refused::NotEmpty => {
                        tracing::error!(
                            session = id,
                            "a fork's new session already holds messages"
                        );
                        return Err(ApiError::Internal);
                    }
                }
            }
        }
    }
}

/// How the turn's window counts tokens. The first turn for a model family
/// builds its tokenizer, on a blocking thread rather than an async worker
/// or under the session's lock; without `window_tokens` nothing is built.
pub(super) async fn token_encoding(app: &App, model: &str) -> Encoding {
    if app.policy.history.window_tokens == 0 {
        return Encoding::default();
    }
    let encoding = Encoding::for_model(model);
    if !encoding.is_ready() {
        // Fails only if building panicked; counting would then try again.
        let _ = tokio::task::spawn_blocking(move || encoding.load()).await;
    }
    encoding
}
