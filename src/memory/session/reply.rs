//! The relay's handle on a reply in flight: what the exchange and the
//! response body report goes through here to the session that records it.
//!
//! The session holds the `InFlight` (its `active` slot); this handle holds
//! the session. Nothing points back: the reply is plain state, and every
//! record is written by `Session::settle_reply`.

use std::sync::Arc;

use super::{Policy, Session};
use crate::memory::inflight::{Ctx, Happened, InFlight, OnComplete, Record};
use crate::memory::message::Message;
use crate::metrics::Cause;
use crate::proxy::accumulate::Event;
use crate::proxy::cut::CutWait;
use crate::store::{Claim, Ticket};

pub struct Reply {
    flight: Arc<InFlight>,
    /// `None` for a stateless request: nothing is recorded.
    owner: Option<(Arc<Session>, Arc<Policy>)>,
}

impl Reply {
    pub(super) fn new(flight: Arc<InFlight>, session: Arc<Session>, policy: Arc<Policy>) -> Self {
        Self {
            flight,
            owner: Some((session, policy)),
        }
    }

    /// A request without a session.
    pub fn stateless() -> Self {
        Self {
            flight: Arc::new(InFlight::new(0)),
            owner: None,
        }
    }

    pub fn records(&self) -> bool {
        self.owner.is_some()
    }

    /// Reports what happened; returns the record written for it (a cut
    /// reply's, for the interrupt endpoint) and when it is durable.
    fn report(&self, happened: Happened<'_>) -> (Option<Message>, Ticket) {
        match &self.owner {
            Some((session, policy)) => session.settle_reply(policy, &self.flight, happened),
            None => {
                let now_ms = crate::clock::now_ms();
                let ctx = Ctx {
                    next_seq: 0,
                    now_ms,
                };
                match self.flight.settle(happened, ctx) {
                    Record::Settle(s) => {
                        if let (Some((f, reason)), Some(reply)) = (s.on_complete, &s.reply) {
                            f(reply, reason.as_deref());
                        }
                        (None, s.opening)
                    }
                    Record::Wait(t) => (None, t),
                    Record::Nothing | Record::Update { .. } => (None, Ticket::ready()),
                }
            }
        }
    }

    // What the exchange and the body see of the reply.

    pub fn is_cut(&self) -> bool {
        self.flight.is_cut()
    }

    pub fn cut_wait(&self) -> CutWait {
        self.flight.cut_wait()
    }

    pub fn received_complete(&self) -> bool {
        self.flight.received_complete()
    }

    pub fn relayed_complete(&self) -> bool {
        self.flight.relayed_complete()
    }

    pub fn on_complete(&self, f: OnComplete) {
        self.flight.on_complete(f);
    }

    pub fn opened(&self, ticket: Ticket) {
        self.flight.opened(ticket);
    }

    /// The upstream's answer begins now: the record's timestamp.
    pub fn started(&self) {
        let now_ms = match &self.owner {
            Some((_, policy)) => policy.clock.now_ms(),
            None => crate::clock::now_ms(),
        };
        self.flight.started(now_ms);
    }

    pub fn on_received(&self, events: &[Event]) {
        self.flight.on_received(events);
    }

    pub fn on_passed(&self, events: &[Event]) {
        self.flight.on_passed(events);
    }

    /// Holds the session's lease with shared storage until the reply is
    /// recorded.
    pub fn hold(&self, claim: Claim) {
        if let Some((session, policy)) = &self.owner {
            session.hold_lease(policy, &self.flight, claim);
        }
    }

    // What happened to it.

    /// The body is about to release the reply's end: the ticket says when
    /// its record is durable; the end waits for it.
    pub fn delivered(&self) -> Ticket {
        self.report(Happened::Delivered).1
    }

    /// The client went away (its body or its request was dropped).
    pub fn client_gone(&self) {
        let (record, _) = self.report(Happened::Cut {
            spoken: None,
            cause: Cause::ClientGone,
        });
        if let (Some(_), Some((session, policy))) = (record, &self.owner) {
            // A request of the session soon after may make it a barge-in.
            session.await_next_request(policy);
        }
    }

    /// A non-streaming reply arrived whole. The ticket says when its
    /// record is durable; the body waits for it.
    pub fn completed_whole(&self, reply: Message, finish_reason: Option<String>) -> Ticket {
        self.report(Happened::Whole {
            reply,
            finish_reason,
        })
        .1
    }

    /// The stream broke off or ended early: what went out so far is
    /// recorded like an interruption, with the reason in `metadata.error`.
    pub fn broke(&self, error: &str) {
        self.report(Happened::Broke(error));
    }

    /// No reply came. The user's message stays; a configured failure
    /// message is recorded after it.
    pub fn failed(&self, error: &str) {
        let failure_message = self
            .owner
            .as_ref()
            .and_then(|(_, p)| p.history.failure_message.as_deref());
        self.report(Happened::Failed {
            error,
            failure_message,
        });
    }

    /// The drain after a cut is over.
    pub fn drained(&self, complete: bool) {
        self.report(Happened::Drained {
            complete,
            yielded: false,
        });
    }

    /// The drain was cut short for a live request that needed its upstream
    /// slot: `original` keeps what was read.
    pub fn drain_yielded(&self) {
        self.report(Happened::Drained {
            complete: false,
            yielded: true,
        });
    }
}
