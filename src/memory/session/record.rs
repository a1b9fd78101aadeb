//! A reply's record: what happened to the reply in flight, applied to
//! the session under its lock (`settle_reply`), and the interrupt
//! endpoint's mark on a stored reply.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::state::State;
use super::{Policy, Session};
use crate::memory::inflight::{Ctx, Happened, InFlight, Record, Settled};
use crate::memory::interruption::{self, Spoken};
use crate::memory::message::Message;
use crate::metrics::Cause;
use crate::store::{Claim, Ticket};

/// `Session::uncounted_close` when every close is counted.
pub(super) const UNCOUNTED: u64 = u64::MAX;

/// How long past `barge_in_after_close_ms` a close waits to be counted as
/// a client that left, so that a request that arrived within it, and is
/// still on its way to the session, is read first.
const CLOSE_SLACK: Duration = Duration::from_secs(1);

/// What the interrupt endpoint did.
#[derive(Debug)]
pub enum Interrupted {
    /// The reply in flight was cut off; this is its record.
    InFlight(Message, Ticket),
    /// The newest stored reply was marked; the ticket says when durable.
    Stored(Message, Ticket),
    NothingToInterrupt,
}

impl Session {
    /// Applies what happened to `flight`, a reply of this session: writes
    /// its record, frees the turn when it is settled. Returns the record
    /// written (a cut reply's) and when it is durable.
    pub(crate) fn settle_reply(
        &self,
        policy: &Policy,
        flight: &InFlight,
        happened: Happened<'_>,
    ) -> (Option<Message>, Ticket) {
        let mut st = self.state();
        self.settle_locked(&mut st, policy, flight, happened)
    }

    pub(super) fn settle_locked(
        &self,
        st: &mut State,
        policy: &Policy,
        flight: &InFlight,
        happened: Happened<'_>,
    ) -> (Option<Message>, Ticket) {
        let ctx = Ctx {
            next_seq: st.first_seq + st.messages.len() as u64,
            now_ms: policy.clock.now_ms(),
        };
        match flight.settle(happened, ctx) {
            Record::Nothing => (None, Ticket::ready()),
            Record::Wait(ticket) => (None, ticket),
            Record::Settle(settle) => {
                if let Settled::Interrupted(cause) = settle.kind {
                    if cause == Cause::ClientGone && policy.barge_in_after_close_ms > 0 {
                        // Counted once the next request, or the wait for
                        // one, says what the close was (`read_close`).
                        self.hold_count(policy, ctx.next_seq);
                    } else {
                        policy.metrics.interrupted(cause);
                    }
                }
                if let (Some((f, reason)), Some(reply)) = (settle.on_complete, &settle.reply) {
                    // The answer cache's own lock is a leaf.
                    f(reply, reason.as_deref());
                }
                self.touch(ctx.now_ms);
                let mut ops = Vec::new();
                let record = settle.reply.map(|m| {
                    let record = m.clone();
                    st.push_message(Arc::new(m));
                    ops.push(self.push_op(st, st.messages.len() - 1));
                    record
                });
                self.trim(st, policy, &mut ops);
                let mut lease = None;
                if st
                    .active
                    .as_deref()
                    .is_some_and(|a| std::ptr::eq(a, flight))
                {
                    st.active = None;
                    lease = st.lease.take().map(|claim| *claim);
                }
                let mut ticket = settle.opening.and(self.persist(st, policy, ops));
                if let Some(claim) = lease {
                    // Queued after the record, so the next holder reads it.
                    let _ = policy.storage.release(claim);
                }
                if settle.end_waits {
                    flight.end_waits_for(std::mem::take(&mut ticket));
                }
                (record, ticket)
            }
            Record::Update {
                seq,
                change,
                drained,
            } => {
                if let Some((complete, yielded)) = drained {
                    policy.metrics.drained(complete, yielded);
                }
                (None, self.update_late(st, seq, policy, |m| change.apply(m)))
            }
        }
    }

    /// The close of the reply at `seq` is counted when its cause is known;
    /// an earlier one still uncounted was a client that left.
    fn hold_count(&self, policy: &Policy, seq: u64) {
        let earlier = self.uncounted_close.swap(seq, Ordering::AcqRel);
        if earlier != UNCOUNTED {
            policy.metrics.interrupted(Cause::ClientGone);
        }
    }

    /// Counts the close of the reply at `seq` as `cause`, unless it was
    /// counted already: exactly one count per close.
    pub(super) fn count_close(&self, policy: &Policy, seq: u64, cause: Cause) {
        let taken = self.uncounted_close.compare_exchange(
            seq,
            UNCOUNTED,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if taken.is_ok() {
            policy.metrics.interrupted(cause);
        }
    }

    /// The reply whose close is not counted yet, if any.
    pub(super) fn uncounted_close(&self) -> Option<u64> {
        let seq = self.uncounted_close.load(Ordering::Acquire);
        (seq != UNCOUNTED).then_some(seq)
    }

    /// After a client closed its reply: if no request of the session comes
    /// within `barge_in_after_close_ms` (and a moment more, so that a
    /// request read just inside it decides first), the client left.
    pub(crate) fn await_next_request(self: &Arc<Self>, policy: &Arc<Policy>) {
        let Some(seq) = self.uncounted_close() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.count_close(policy, seq, Cause::ClientGone);
            return;
        };
        let wait = Duration::from_millis(policy.barge_in_after_close_ms) + CLOSE_SLACK;
        let (session, policy) = (Arc::clone(self), Arc::clone(policy));
        runtime.spawn(async move {
            tokio::time::sleep(wait).await;
            session.count_close(&policy, seq, Cause::ClientGone);
        });
    }

    /// Holds the session's lease while `flight` is its reply in flight;
    /// a reply already recorded gives it up at once.
    pub(crate) fn hold_lease(&self, policy: &Policy, flight: &InFlight, claim: Claim) {
        let mut st = self.state();
        if st
            .active
            .as_deref()
            .is_some_and(|a| std::ptr::eq(a, flight))
        {
            st.lease = Some(Box::new(claim));
        } else {
            let _ = policy.storage.release(claim);
        }
    }

    /// Changes a reply's record after it was written (a drain's end, a
    /// break), if it is still stored.
    pub(super) fn update_late(
        &self,
        st: &mut State,
        seq: u64,
        policy: &Policy,
        change: impl FnOnce(&mut Message),
    ) -> Ticket {
        let Some(index) = seq
            .checked_sub(st.first_seq)
            .and_then(|i| usize::try_from(i).ok())
            .filter(|&i| i < st.messages.len())
        else {
            return Ticket::ready();
        };
        st.edit_message(index, change);
        // Only the fields learnt late: with shared storage, another replica
        // may have changed the message since this one recorded it.
        let op = self.late_op(st, index);
        self.persist(st, policy, vec![op])
    }

    /// Cuts off the reply in flight, if any (another replica asks, or a
    /// shutdown). Returns whether there was one to cut.
    pub fn cut_in_flight(&self, policy: &Policy, cause: Cause) -> bool {
        let mut st = self.state();
        let Some(active) = st.active.clone() else {
            return false;
        };
        let happened = Happened::Cut {
            spoken: None,
            cause,
        };
        self.settle_locked(&mut st, policy, &active, happened)
            .0
            .is_some()
    }

    /// The agent says its user interrupted the bot: cut off the reply in
    /// flight, or mark the newest stored reply.
    pub fn interrupt(&self, policy: &Policy, spoken: Option<&Spoken>, now_ms: i64) -> Interrupted {
        let mut st = self.state();
        if let Some(active) = st.active.clone() {
            let cut = Happened::Cut {
                spoken,
                cause: Cause::Endpoint,
            };
            if let (Some(record), ticket) = self.settle_locked(&mut st, policy, &active, cut) {
                return Interrupted::InFlight(record, ticket);
            }
        }
        // Only the reply that ends the history: an older one was answered
        // by later turns, and a failure record was never said by the model.
        let Some(last) = st.messages.len().checked_sub(1).filter(|&i| {
            let m = &st.messages[i];
            m.role == "assistant" && !interruption::is_failure(m) && !interruption::is_superseded(m)
        }) else {
            return Interrupted::NothingToInterrupt;
        };
        let record = st.edit_message(last, |m| {
            interruption::mark_stored(m, spoken, now_ms, Cause::Endpoint.label());
            m.clone()
        });
        let op = self.set_op(&st, last);
        Interrupted::Stored(record, self.persist(&mut st, policy, vec![op]))
    }
}
