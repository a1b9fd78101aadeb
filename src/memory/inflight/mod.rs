//! A reply in flight, as a state machine: what has been relayed and
//! received, and what each thing that can happen to it means for its
//! record.
//!
//! Several parties may settle a reply, and the first one wins: the response
//! body when its last event has gone out (complete), the body's drop guard
//! when the client goes away, a newer request of the same session
//! (barge-in), the interrupt endpoint, and the exchange or the response
//! body when the upstream fails. The upstream may still be drained after
//! that, which changes the record's `original`.
//!
//! `InFlight::settle` takes what happened and returns what to write, a
//! `Record`; it never writes anything itself and holds no pointer to the
//! session. The session calls it under its own lock and applies the record
//! there (`Session::settle_reply`), so the record's place in the history
//! (`Ctx::next_seq`) and the turn's end are decided in one critical
//! section. This reply's own lock is a leaf: nothing else is locked under it.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::memory::interruption::{self, Spoken};
use crate::memory::message::Message;
use crate::memory::turns;
use crate::metrics::Cause;
use crate::proxy::accumulate::{Event, ReplyAccumulator};
use crate::proxy::cut::{Cut, CutWait};
use crate::proxy::gate::Place;
use crate::store::Ticket;

pub struct InFlight {
    turn_id: u64,
    /// Cut when the client no longer receives this reply: it went away, or
    /// the reply was interrupted. The response body ends; the exchange's
    /// task drains or closes the upstream.
    cut: Arc<Cut>,
    /// The turn's place under `max_concurrent_upstream`: a request that
    /// will cut this reply claims its slot (`proxy::gate`).
    place: Option<Arc<Place>>,
    progress: Mutex<Progress>,
}

#[derive(Default)]
struct Progress {
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
    /// Recorded as interrupted at `seq`, where later updates find it.
    Interrupted {
        seq: u64,
    },
    Failed,
}

/// Something that happened to the reply.
#[derive(Debug)]
pub enum Happened<'a> {
    /// The response body is about to release the reply's end (`[DONE]`,
    /// or the end of the stream).
    Delivered,
    /// The client no longer receives the reply: it left, a newer request
    /// barged in, the interrupt endpoint, another replica, a shutdown.
    /// `spoken` is what the user heard, when the agent says.
    Cut {
        spoken: Option<&'a Spoken>,
        cause: Cause,
    },
    /// A newer request under the reject policy: the reply is settled only
    /// if its last event already went out.
    Rejecting,
    /// A non-streaming reply arrived whole.
    Whole {
        reply: Message,
        finish_reason: Option<String>,
    },
    /// The stream broke off or ended early.
    Broke(&'a str),
    /// No reply came: an error status, a connection error, a timeout.
    /// `failure_message` is the configured text recorded in its place.
    Failed {
        error: &'a str,
        failure_message: Option<&'a str>,
    },
    /// The drain after a cut is over: whether the upstream reached the end
    /// of its reply, and whether it stopped early for a live request that
    /// needed its upstream slot (`max_concurrent`).
    Drained { complete: bool, yielded: bool },
}

/// Where the record goes, as the session knows it when it settles.
#[derive(Debug, Clone, Copy)]
pub struct Ctx {
    /// The sequence number a reply pushed now gets.
    pub next_seq: u64,
    pub now_ms: i64,
}

/// What the session writes for what happened.
pub enum Record {
    /// Nothing to write, and nothing to wait for.
    Nothing,
    /// Nothing to write; the reply's end waits for this (its record was
    /// written by someone else).
    Wait(Ticket),
    /// The reply is settled: its record (if any) is pushed at
    /// `Ctx::next_seq`, and the turn is free.
    Settle(Settle),
    /// A change to the record written before at `seq`.
    Update {
        seq: u64,
        change: Change,
        /// Set when a drain ended: whether it read the whole reply, and
        /// whether it yielded (for the drain metric).
        drained: Option<(bool, bool)>,
    },
}

pub struct Settle {
    /// The record, stamped with the turn's id and the answer's start.
    pub reply: Option<Message>,
    pub kind: Settled,
    /// Set when the reply is complete and something waits for it.
    pub on_complete: Option<(OnComplete, Option<String>)>,
    /// The turn's own messages: the record is durable only after them.
    pub opening: Ticket,
    /// The reply's end (the body's `Delivered`) waits for this record,
    /// not the caller: the session hands the ticket back (`end_waits_for`).
    pub end_waits: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    Complete,
    Interrupted(Cause),
    /// Cut off by the upstream (a broken stream).
    Broken,
    Failed,
}

/// A change to an interrupted reply's record.
#[derive(Debug)]
pub enum Change {
    /// What the upstream sent in all (the drain read on, or broke).
    Original {
        full: Message,
        complete: bool,
        error: Option<String>,
    },
    Error(String),
}

impl Change {
    pub fn apply(self, m: &mut Message) {
        match self {
            Change::Original {
                full,
                complete,
                error,
            } => {
                interruption::set_original(m, &full, complete);
                if let (Some(error), false) = (error, complete) {
                    interruption::set_error(m, &error);
                }
            }
            Change::Error(error) => interruption::set_error(m, &error),
        }
    }
}

impl InFlight {
    pub fn new(turn_id: u64) -> Self {
        Self::with_place(turn_id, None)
    }

    /// A reply whose upstream call holds or waits for `place`.
    pub fn with_place(turn_id: u64, place: Option<Arc<Place>>) -> Self {
        Self {
            turn_id,
            cut: Arc::default(),
            place,
            progress: Mutex::default(),
        }
    }

    pub fn place(&self) -> Option<&Arc<Place>> {
        self.place.as_ref()
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

    /// The ticket of a record written for the body's end by someone else.
    pub fn end_waits_for(&self, ticket: Ticket) {
        self.progress().end_durable = Some(ticket);
    }

    /// The text handed to the client so far (what the console shows live).
    pub fn relayed_text(&self) -> String {
        self.progress().relayed.content().to_owned()
    }

    /// Whether the reply is settled (its record decided).
    pub fn is_settled(&self) -> bool {
        self.progress().outcome != Outcome::Open
    }

    /// What `happened` means for the record. Only the session calls this
    /// (under its lock, so that `ctx` holds until the record is applied),
    /// or the relay for a stateless request, which records nothing.
    pub fn settle(&self, happened: Happened<'_>, ctx: Ctx) -> Record {
        let mut p = self.progress();
        let record = match happened {
            Happened::Delivered => match p.outcome {
                Outcome::Open => self.complete(&mut p, None, false, ctx),
                _ => p.end_durable.take().map_or(Record::Nothing, Record::Wait),
            },
            Happened::Cut { spoken, cause } => self.cut_off(&mut p, spoken, cause, ctx),
            Happened::Rejecting => match p.outcome {
                Outcome::Open if p.relayed.is_complete() => self.complete(&mut p, None, true, ctx),
                _ => Record::Nothing,
            },
            Happened::Whole {
                reply,
                finish_reason,
            } => {
                p.finish_reason = finish_reason;
                match p.outcome {
                    Outcome::Open => self.complete(&mut p, Some(reply), false, ctx),
                    Outcome::Interrupted { seq } => Record::Update {
                        seq,
                        change: Change::Original {
                            full: reply,
                            complete: true,
                            error: None,
                        },
                        drained: None,
                    },
                    _ => Record::Nothing,
                }
            }
            Happened::Broke(error) => self.broke(&mut p, error, ctx),
            Happened::Failed {
                error,
                failure_message,
            } => match p.outcome {
                Outcome::Open => {
                    let reply =
                        failure_message.map(|text| interruption::failure_reply(text, error));
                    self.settled(&mut p, reply, Settled::Failed, ctx)
                }
                Outcome::Interrupted { seq } => Record::Update {
                    seq,
                    change: Change::Error(error.to_owned()),
                    drained: None,
                },
                _ => Record::Nothing,
            },
            Happened::Drained { complete, yielded } => match p.outcome {
                Outcome::Interrupted { seq } => {
                    let complete = complete || p.received().is_complete();
                    Record::Update {
                        seq,
                        change: Change::Original {
                            full: p.received().to_message(),
                            complete,
                            error: yielded.then(|| interruption::DRAIN_YIELDED.to_owned()),
                        },
                        drained: Some((complete, yielded)),
                    }
                }
                _ => Record::Nothing,
            },
        };
        drop(p);
        if matches!(
            &record,
            Record::Settle(Settle {
                kind: Settled::Interrupted(_),
                ..
            })
        ) {
            // Once the record is decided. Whoever acts on the cut (a drain,
            // the client's next turn) goes through the session, whose lock
            // the caller holds until the record is applied.
            self.cut.cut();
        }
        record
    }

    /// A cut: recorded as interrupted with what went out, or as complete
    /// if its last event already went out.
    fn cut_off(&self, p: &mut Progress, spoken: Option<&Spoken>, cause: Cause, ctx: Ctx) -> Record {
        if p.outcome != Outcome::Open {
            return Record::Nothing;
        }
        if p.relayed.is_complete() {
            return self.complete(p, None, true, ctx);
        }
        let record = interruption::interrupted_reply(
            p.relayed.to_message(),
            &p.received().to_message(),
            p.received().is_complete(),
            ctx.now_ms,
            spoken,
            cause.label(),
        );
        self.settled(p, Some(record), Settled::Interrupted(cause), ctx)
    }

    fn broke(&self, p: &mut Progress, error: &str, ctx: Ctx) -> Record {
        match p.outcome {
            // The last event went out before the connection failed.
            Outcome::Open if p.relayed.is_complete() => self.complete(p, None, true, ctx),
            Outcome::Open if p.relayed.is_empty() && p.received().is_empty() => {
                self.settled(p, None, Settled::Failed, ctx)
            }
            Outcome::Open => {
                let mut record = interruption::interrupted_reply(
                    p.relayed.to_message(),
                    &p.received().to_message(),
                    false,
                    ctx.now_ms,
                    None,
                    interruption::CUT_BY_UPSTREAM,
                );
                interruption::set_error(&mut record, error);
                self.settled(p, Some(record), Settled::Broken, ctx)
            }
            Outcome::Interrupted { seq } => Record::Update {
                seq,
                change: Change::Original {
                    full: p.received().to_message(),
                    complete: false,
                    error: Some(error.to_owned()),
                },
                drained: None,
            },
            _ => Record::Nothing,
        }
    }

    /// The reply is complete: `reply` when it came whole, else what was
    /// relayed. `end_waits` when someone else than the body settles it.
    fn complete(
        &self,
        p: &mut Progress,
        reply: Option<Message>,
        end_waits: bool,
        ctx: Ctx,
    ) -> Record {
        let reply = reply.unwrap_or_else(|| p.relayed.to_message());
        let reason = p
            .finish_reason
            .clone()
            .or_else(|| p.relayed.finish_reason.clone());
        let on_complete = p.on_complete.take().map(|f| (f, reason));
        match self.settled(p, Some(reply), Settled::Complete, ctx) {
            Record::Settle(mut s) => {
                s.on_complete = on_complete;
                s.end_waits = end_waits;
                Record::Settle(s)
            }
            other => other,
        }
    }

    fn settled(&self, p: &mut Progress, reply: Option<Message>, kind: Settled, ctx: Ctx) -> Record {
        p.outcome = match kind {
            Settled::Complete => Outcome::Complete,
            Settled::Failed => Outcome::Failed,
            Settled::Interrupted(_) | Settled::Broken => Outcome::Interrupted { seq: ctx.next_seq },
        };
        let at = p.started_ms.unwrap_or(ctx.now_ms);
        let reply = reply.map(|mut r| {
            turns::stamp_reply(&mut r, self.turn_id, at);
            r
        });
        Record::Settle(Settle {
            reply,
            kind,
            on_complete: None,
            opening: std::mem::take(&mut p.opening),
            end_waits: false,
        })
    }
}

#[cfg(test)]
mod tests;
