//! A reply in flight, and everything that can end it.
//!
//! Several parties may settle a reply, and the first one wins: the response
//! body when its last event has gone out (complete), the body's drop guard
//! when the client goes away, a newer request of the same session
//! (barge-in), the interrupt endpoint, and the exchange or the response
//! body when the upstream fails. Settling writes the record at once and
//! frees the session's turn. The upstream may still be drained after that;
//! the exchange's task then updates `original` on the record it finds by
//! sequence number.
//!
//! Lock order: a stream's reader slot (`relay::stream`), then this reply's
//! `progress` lock, then the session's state lock.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::accumulate::{Event, ReplyAccumulator};
use crate::cut::{Cut, CutWait};
use crate::interruption::{self, Spoken};
use crate::message::Message;
use crate::metrics::Cause;
use crate::session::{Policy, Session};
use crate::storage::{Claim, Ticket};
use crate::turns;

/// Writes a reply's record into its session.
pub struct Recorder {
    session: Arc<Session>,
    policy: Arc<Policy>,
}

impl Recorder {
    pub fn new(session: Arc<Session>, policy: Arc<Policy>) -> Self {
        Self { session, policy }
    }
}

pub struct InFlight {
    /// `None` for a stateless request: nothing is recorded.
    recorder: Option<Recorder>,
    turn_id: u64,
    /// Cut when the client no longer receives this reply: it went away, or
    /// the reply was interrupted. The response body ends; the exchange's
    /// task drains or closes the upstream.
    cut: Arc<Cut>,
    progress: Mutex<Progress>,
}

#[derive(Default)]
struct Progress {
    /// The session's lease with shared storage, given up once the record
    /// is written.
    claim: Option<Claim>,
    /// What was handed to the client's connection.
    relayed: ReplyAccumulator,
    /// What the upstream sent, once it differs from `relayed` (after a
    /// cut, or events held back at a break); until then `relayed` is it,
    /// and a streamed event is accumulated once, not twice.
    received: Option<ReplyAccumulator>,
    /// When the upstream's answer began, for the record's timestamp.
    started_ms: Option<i64>,
    outcome: Outcome,
    /// Called with the reply when it is recorded complete.
    on_complete: Option<OnComplete>,
    /// `finish_reason` of a non-streaming reply (a stream's is in `relayed`).
    finish_reason: Option<String>,
    /// When the turn's own messages are durable: the reply's record is not
    /// reported durable before them.
    opening: Ticket,
    /// When a reply whose last event went out was recorded complete by
    /// someone else than the body (a barge-in, a break after the end): the
    /// body's end still waits for it.
    end_durable: Option<Ticket>,
}

impl Progress {
    fn received(&self) -> &ReplyAccumulator {
        self.received.as_ref().unwrap_or(&self.relayed)
    }

    fn received_mut(&mut self) -> &mut ReplyAccumulator {
        self.received.get_or_insert_with(|| self.relayed.clone())
    }
}

/// What to do with a reply recorded complete (the answer cache stores it).
/// It gets the reply and choice 0's `finish_reason`.
pub type OnComplete = Box<dyn FnOnce(&Message, Option<&str>) + Send>;

#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
enum Outcome {
    #[default]
    Open,
    Complete,
    /// Recorded as interrupted; `seq` finds the record for later updates.
    Interrupted {
        seq: Option<u64>,
    },
    Failed,
}

impl InFlight {
    pub fn new(recorder: Option<Recorder>, turn_id: u64) -> Self {
        Self {
            recorder,
            turn_id,
            cut: Arc::default(),
            progress: Mutex::default(),
        }
    }

    pub fn stateless() -> Self {
        Self::new(None, 0)
    }

    pub fn records(&self) -> bool {
        self.recorder.is_some()
    }

    /// The client no longer receives this reply.
    pub fn is_cut(&self) -> bool {
        self.cut.is_cut()
    }

    /// Resolves when the client stops receiving this reply.
    pub fn cut_wait(&self) -> CutWait {
        self.cut.wait()
    }

    fn progress(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The upstream has sent the end of its reply.
    pub fn received_complete(&self) -> bool {
        self.progress().received().is_complete()
    }

    /// The end of the reply has been handed to the client's connection.
    pub fn relayed_complete(&self) -> bool {
        self.progress().relayed.is_complete()
    }

    /// Registers what to do with the reply once it is recorded complete
    /// (the answer cache stores it).
    pub fn on_complete(&self, f: OnComplete) {
        self.progress().on_complete = Some(f);
    }

    /// Holds the session's claim until the reply is recorded.
    pub fn hold(&self, claim: Claim) {
        let mut p = self.progress();
        if p.outcome == Outcome::Open {
            p.claim = Some(claim);
        } else if let Some(r) = &self.recorder {
            let _ = r.policy.storage.release(claim);
        }
    }

    /// The ticket of the messages that opened this turn.
    pub fn opened(&self, ticket: Ticket) {
        let mut p = self.progress();
        let earlier = std::mem::take(&mut p.opening);
        p.opening = earlier.and(ticket);
    }

    pub fn started(&self, at_ms: i64) {
        self.progress().started_ms.get_or_insert(at_ms);
    }

    pub fn on_received(&self, events: &[Event]) {
        if events.is_empty() {
            return;
        }
        let mut p = self.progress();
        let received = p.received_mut();
        for e in events {
            received.push(e);
        }
    }

    /// Events received and handed to the client's connection at once.
    pub fn on_passed(&self, events: &[Event]) {
        let mut p = self.progress();
        let p = &mut *p;
        for e in events {
            p.relayed.push(e);
            if let Some(received) = p.received.as_mut() {
                received.push(e);
            }
        }
    }

    /// The response body is about to release the reply's end (`[DONE]`,
    /// or the end of the stream): the reply is complete. The ticket says
    /// when its record is durable; the end waits for it.
    pub fn delivered(&self) -> Ticket {
        let mut p = self.progress();
        if p.outcome != Outcome::Open {
            return p.end_durable.take().unwrap_or_default();
        }
        let reply = p.relayed.to_message();
        self.record(&mut p, Some(reply), Outcome::Complete).1
    }

    /// Records a reply whose last event went out as complete, for the
    /// body's `delivered` to wait on.
    fn record_delivered(&self, p: &mut Progress) {
        let reply = p.relayed.to_message();
        let (_, ticket) = self.record(p, Some(reply), Outcome::Complete);
        p.end_durable = Some(ticket);
    }

    /// The client went away (its body or its request was dropped).
    pub fn client_gone(&self) {
        self.interrupt(None, Cause::ClientGone);
    }

    /// Cuts the reply off for the client and records it as interrupted,
    /// with `spoken` as its content when given. Returns the record, or
    /// `None` when the reply was already settled. A reply whose last event
    /// already went out is complete, not interrupted.
    pub fn interrupt(&self, spoken: Option<&Spoken>, cause: Cause) -> Option<(Message, Ticket)> {
        let mut p = self.progress();
        if p.outcome != Outcome::Open {
            return None;
        }
        if p.relayed.is_complete() {
            self.record_delivered(&mut p);
            return None;
        }
        let record = interruption::interrupted_reply(
            p.relayed.to_message(),
            &p.received().to_message(),
            p.received().is_complete(),
            crate::relay::now_ms(),
            spoken,
            cause.label(),
        );
        let (seq, ticket) = self.record(
            &mut p,
            Some(record.clone()),
            Outcome::Interrupted { seq: None },
        );
        p.outcome = Outcome::Interrupted { seq };
        if let Some(r) = &self.recorder {
            r.policy.metrics.interrupted(cause);
        }
        // Only now that the record is queued: the client's response ends
        // on the cut, and a shutdown waiting for it must find the record
        // ahead of its final flush.
        self.cut.cut();
        Some((self.stamped(record, p.started_ms), ticket))
    }

    /// For the reject policy: settles the reply as complete if its last
    /// event already went out. Returns whether it is settled.
    pub fn settle_if_delivered(&self) -> bool {
        let mut p = self.progress();
        match p.outcome {
            Outcome::Open if p.relayed.is_complete() => {
                self.record_delivered(&mut p);
                true
            }
            Outcome::Open => false,
            _ => true,
        }
    }

    /// A non-streaming reply arrived whole. The ticket says when its
    /// record is durable; the body waits for it.
    pub fn completed_whole(&self, reply: Message, finish_reason: Option<String>) -> Ticket {
        let mut p = self.progress();
        p.finish_reason = finish_reason;
        match p.outcome {
            Outcome::Open => self.record(&mut p, Some(reply), Outcome::Complete).1,
            Outcome::Interrupted { seq } => {
                self.update(seq, |m| interruption::set_original(m, &reply, true))
            }
            _ => Ticket::ready(),
        }
    }

    /// The stream broke off or ended early. What went out so far is
    /// recorded like an interruption, with the reason in `metadata.error`.
    pub fn broke(&self, error: &str) {
        let mut p = self.progress();
        match p.outcome {
            // The last event went out before the connection failed.
            Outcome::Open if p.relayed.is_complete() => self.record_delivered(&mut p),
            Outcome::Open if p.relayed.is_empty() && p.received().is_empty() => {
                drop(p);
                self.failed(error);
            }
            Outcome::Open => {
                let mut record = interruption::interrupted_reply(
                    p.relayed.to_message(),
                    &p.received().to_message(),
                    false,
                    crate::relay::now_ms(),
                    None,
                    interruption::CUT_BY_UPSTREAM,
                );
                interruption::set_error(&mut record, error);
                let (seq, _) =
                    self.record(&mut p, Some(record), Outcome::Interrupted { seq: None });
                p.outcome = Outcome::Interrupted { seq };
            }
            Outcome::Interrupted { seq } => {
                let full = p.received().to_message();
                self.update(seq, |m| {
                    interruption::set_original(m, &full, false);
                    interruption::set_error(m, error);
                });
            }
            _ => {}
        }
    }

    /// No reply came: error status, connection error, timeout. The user's
    /// message stays; a configured failure message is recorded after it.
    pub fn failed(&self, error: &str) {
        let mut p = self.progress();
        match p.outcome {
            Outcome::Open => {
                let reply = self.recorder.as_ref().and_then(|r| {
                    let text = r.policy.history.failure_message.as_deref()?;
                    Some(interruption::failure_reply(text, error))
                });
                self.record(&mut p, reply, Outcome::Failed);
            }
            Outcome::Interrupted { seq } => {
                self.update(seq, |m| interruption::set_error(m, error));
            }
            _ => {}
        }
    }

    /// The drain after a cut is over: `complete` says whether the upstream
    /// reached the end of its reply.
    pub fn drained(&self, complete: bool) {
        self.drain_over(complete, None);
    }

    /// The drain was cut short for a live request that needed its
    /// upstream slot (`max_concurrent`): `original` keeps what was read.
    pub fn drain_yielded(&self) {
        self.drain_over(false, Some(interruption::DRAIN_YIELDED));
    }

    fn drain_over(&self, complete: bool, error: Option<&str>) {
        let p = self.progress();
        if let Outcome::Interrupted { seq } = p.outcome {
            let full = p.received().to_message();
            let complete = complete || p.received().is_complete();
            if let Some(r) = &self.recorder {
                r.policy.metrics.drained(complete, error.is_some());
            }
            self.update(seq, |m| {
                interruption::set_original(m, &full, complete);
                if let (Some(error), false) = (error, complete) {
                    interruption::set_error(m, error);
                }
            });
        }
    }

    fn stamped(&self, mut reply: Message, started_ms: Option<i64>) -> Message {
        let at = started_ms.unwrap_or_else(crate::relay::now_ms);
        turns::stamp_reply(&mut reply, self.turn_id, at);
        reply
    }

    /// Writes the record and frees the session's turn. Returns the
    /// record's sequence number, and when it is durable.
    fn record(
        &self,
        p: &mut Progress,
        reply: Option<Message>,
        outcome: Outcome,
    ) -> (Option<u64>, Ticket) {
        p.outcome = outcome;
        let opening = std::mem::take(&mut p.opening);
        if let (Outcome::Complete, Some(reply), Some(f)) = (outcome, &reply, p.on_complete.take()) {
            let reason = p
                .finish_reason
                .clone()
                .or_else(|| p.relayed.finish_reason.clone());
            f(reply, reason.as_deref());
        }
        let Some(recorder) = self.recorder.as_ref() else {
            return (None, opening);
        };
        let reply = reply.map(|r| self.stamped(r, p.started_ms));
        let (seq, ticket) = recorder.session.finish(self, reply, &recorder.policy);
        if let Some(claim) = p.claim.take() {
            // Queued after the record, so the next holder reads it.
            let _ = recorder.policy.storage.release(claim);
        }
        (seq, opening.and(ticket))
    }

    fn update(&self, seq: Option<u64>, change: impl FnOnce(&mut Message)) -> Ticket {
        match (&self.recorder, seq) {
            (Some(recorder), Some(seq)) => recorder.session.update(seq, &recorder.policy, change),
            _ => Ticket::ready(),
        }
    }
}
