//! A turn's opening: the reply still in flight settled, the request
//! reconciled with the history, its new messages stored, old ones
//! trimmed, and the window the upstream is sent.

use std::sync::{Arc, MutexGuard};

use super::state::State;
use super::{shared, Policy, Reply, Session};
use crate::config::OnNewRequest;
use crate::memory::chain::{self, Continue};
use crate::memory::inflight::{Happened, InFlight};
use crate::memory::interruption::{self, Closed, Spoken};
use crate::memory::long_term::session::LongTermDue;
use crate::memory::message::Message;
use crate::memory::reconcile::{self, Hints, Reconciled, Rewrite};
use crate::memory::render;
use crate::memory::summary::{Fold, Remembered};
use crate::memory::tokens::Encoding;
use crate::memory::turns;
use crate::memory::window::{self, Limits, TrimReason, TrimScope};
use crate::metrics::Cause;
use crate::proxy::gate::Place;
use crate::proxy::protocol::VendorRules;
use crate::store::{Op, Ticket};
use crate::webhook::Event;

/// A request's turn, as the session needs it.
pub struct TurnRequest<'a> {
    /// The request's messages, instructions taken out.
    pub incoming: &'a [Message],
    pub user: Option<&'a str>,
    /// With `[memory] carry_over` or `[long_term]`: the user's key
    /// (tenant-scoped): their note, which the session's end folds into,
    /// and their long-term records.
    pub memory_user: Option<&'a str>,
    /// How the model the turn is sent to counts tokens.
    pub encoding: Encoding,
    pub now_ms: i64,
    /// The client says it retries (`x-stainless-retry-count` above 0).
    pub retrying: bool,
    pub idempotency_key: Option<&'a str>,
    /// How the upstream sees the history, and its fallback if it has one.
    pub rules: &'a VendorRules,
    pub fallback_rules: Option<&'a VendorRules>,
    /// How the messages join the history.
    pub joins: Joins<'a>,
    /// The request's place under `max_concurrent_upstream`, kept by its
    /// reply in flight for a later request that will cut it.
    pub place: Option<&'a Arc<Place>>,
}

/// How a request's messages join the history.
#[derive(Debug, Clone, Copy)]
pub enum Joins<'a> {
    /// Chat: the client sends its conversation, and `reconcile` finds
    /// what is new in it.
    Reconcile,
    /// The Responses API on a conversation: every message is new.
    Append,
    /// The Responses API after response `id`: appended when nothing
    /// follows it, else refused with the history to fork (`Refused::Fork`).
    After(&'a str),
    /// A fork's first turn: a new session that starts from this history.
    Fork(&'a [Arc<Message>]),
}

/// What a turn sends upstream, decided when its messages were appended.
#[derive(Debug)]
pub struct Prepared {
    pub turn_id: u64,
    /// What the upstream is sent after the instructions (`render`).
    pub window: Vec<Arc<Message>>,
    /// The same for the fallback upstream, rendered for it.
    pub fallback_window: Option<Vec<Arc<Message>>>,
    pub system_messages: Vec<Message>,
    /// Changes when the history is reset or replaced (see `State`).
    pub incarnation: u64,
    /// Resolves when the appended messages are durable.
    pub durable: Ticket,
    /// Stored messages this request superseded, and why.
    pub rewrite: Option<Rewrite>,
    /// The sequence number the reply will be recorded at.
    pub reply_seq: u64,
    /// The running summary and the carried note, sent after the session's
    /// system messages.
    pub remembered: Remembered,
    /// A fold of the running summary due now, for the caller to start.
    pub fold: Option<Fold>,
    /// The user's long-term facts to send, and the jobs due now.
    pub long_term: LongTermDue,
}

impl Prepared {
    /// A request without a session: its own messages are the window.
    pub fn stateless(conversation: Vec<Message>) -> Self {
        Self {
            turn_id: 0,
            window: shared(conversation),
            fallback_window: None,
            system_messages: Vec::new(),
            incarnation: 0,
            durable: Ticket::ready(),
            rewrite: None,
            reply_seq: 0,
            remembered: Remembered::default(),
            fold: None,
            long_term: LongTermDue::default(),
        }
    }
}

/// Why a turn could not begin.
#[derive(Debug, PartialEq)]
pub enum Refused {
    /// A reply is in flight and the policy is to reject.
    Busy,
    /// The session ended meanwhile; look it up again.
    Ended,
    /// `Joins::After` a response this session does not hold.
    UnknownResponse,
    /// `Joins::After` a response that later messages follow: the new
    /// response goes to a new session that starts from this history.
    Fork(Vec<Arc<Message>>),
    /// `Joins::Fork` into a session that already holds messages.
    NotEmpty,
}

impl Session {
    /// Opens a turn: settles the reply still in flight (if any), merges the
    /// client's conversation into the history, and decides what the
    /// upstream is sent.
    pub fn begin(
        self: &Arc<Self>,
        policy: &Arc<Policy>,
        req: &TurnRequest<'_>,
    ) -> Result<(Prepared, Reply), Refused> {
        let st = self.state();
        // Decided before the reply in flight is settled: a fork leaves the
        // branch it forks from, and its reply, as they are. A retry's
        // earlier attempt is named by sequence number, which the settling
        // (a push, maybe a trim) does not move.
        let mut retry_seq = None;
        if !st.ended {
            match self.continuation(&st, req) {
                None => {}
                Some(Continue::Unknown) => return Err(Refused::UnknownResponse),
                Some(Continue::Fork { end }) => {
                    return Err(Refused::Fork(st.messages[..end].to_vec()))
                }
                Some(Continue::Append { retry_from }) => {
                    retry_seq = retry_from.map(|i| st.first_seq + i as u64);
                }
            }
            if matches!(req.joins, Joins::Fork(_)) && (!st.messages.is_empty() || st.first_seq > 0)
            {
                return Err(Refused::NotEmpty);
            }
        }
        let mut st = self.settled_from(st, policy, policy.on_new_request)?;
        if let Some(user) = req.user {
            if !st.users.iter().any(|u| u == user) {
                st.users.push(user.to_owned());
                st.meta_changed();
            }
        }
        if let Some(key) = req.memory_user {
            st.carried_into(key);
        }
        self.touch(req.now_ms);
        let prepared = self.append(&mut st, policy, req, retry_seq);
        let flight = Arc::new(InFlight::with_place(prepared.turn_id, req.place.cloned()));
        st.active = Some(Arc::clone(&flight));
        Ok((
            prepared,
            Reply::new(flight, Arc::clone(self), Arc::clone(policy)),
        ))
    }

    /// Settles the reply in flight in this process, if any, as `policy`
    /// says; with shared storage this comes before claiming the session,
    /// so that a turn never waits on its own process's lease.
    pub fn settle(&self, policy: &Policy, on_new: OnNewRequest) -> Result<(), Refused> {
        self.settled(policy, on_new).map(drop)
    }

    /// Settles the reply in flight, if any, as `on_new` says, and returns
    /// the state with no reply in flight.
    pub(super) fn settled(
        &self,
        policy: &Policy,
        on_new: OnNewRequest,
    ) -> Result<MutexGuard<'_, State>, Refused> {
        self.settled_from(self.state(), policy, on_new)
    }

    fn settled_from<'s>(
        &'s self,
        mut st: MutexGuard<'s, State>,
        policy: &Policy,
        on_new: OnNewRequest,
    ) -> Result<MutexGuard<'s, State>, Refused> {
        if st.ended {
            return Err(Refused::Ended);
        }
        let Some(active) = st.active.clone() else {
            return Ok(st);
        };
        let happened = match on_new {
            OnNewRequest::Interrupt => Happened::Cut {
                spoken: None,
                cause: Cause::NewRequest,
            },
            OnNewRequest::Reject => Happened::Rejecting,
        };
        self.settle_locked(&mut st, policy, &active, happened);
        if !active.is_settled() {
            return Err(Refused::Busy);
        }
        // Settled replies give up the slot; a reply settled before this
        // request came (its record written) never holds it.
        st.active = None;
        Ok(st)
    }

    /// `retry_seq`: where an earlier attempt of this Responses API request
    /// begins, which gives way to it.
    pub(super) fn append(
        &self,
        st: &mut State,
        policy: &Policy,
        req: &TurnRequest<'_>,
        retry_seq: Option<u64>,
    ) -> Prepared {
        let now_ms = req.now_ms;
        let incoming = req.incoming;
        let mut ops = Vec::new();
        let same_key = req
            .idempotency_key
            .is_some_and(|k| st.last_key.as_deref() == Some(k));
        let hints = Hints {
            front_dropped: st.first_seq > 0,
            retry: req.retrying || same_key,
        };
        if let Some(folded) = st.pending.take() {
            // Under this turn's lease: written with its batch.
            self.apply_fold(st, policy, *folded);
        }
        if let Joins::Fork(history) = req.joins {
            // Pointers to the branch's messages: they are stored again
            // under the new session once, here, and shared in memory.
            let from = st.messages.len();
            for m in history {
                st.push_message(Arc::clone(m));
            }
            st.turn_id = history.iter().filter_map(|m| m.turn_id).max().unwrap_or(0);
            ops.extend((from..st.messages.len()).map(|i| self.push_op(st, i)));
        }
        let (rewrite, new_from) = match req.joins {
            Joins::Reconcile => {
                let found = reconcile::reconcile(&st.messages, incoming, hints);
                let rewrite = self.apply(st, policy, &found, incoming.len(), now_ms, &mut ops);
                (rewrite, found.new_from(incoming.len()))
            }
            // The Responses API sends only what is new; a retry's earlier
            // attempt gives way to it.
            Joins::Append | Joins::After(_) => {
                let from = retry_seq
                    .and_then(|seq| seq.checked_sub(st.first_seq))
                    .map(|i| i as usize)
                    .filter(|&i| i < st.messages.len());
                let rewrite = from.and_then(|from| {
                    self.supersede_from(st, policy, from, Rewrite::Retry, now_ms, &mut ops)
                });
                (rewrite, 0)
            }
            Joins::Fork(_) => (None, 0),
        };
        if !matches!(req.joins, Joins::Fork(_)) {
            self.read_close(st, policy, rewrite == Some(Rewrite::Retry), &mut ops);
        }
        st.last_key = req.idempotency_key.map(str::to_owned);
        let mut new = incoming[new_from..].to_vec();
        st.turn_id = turns::stamp_client_messages(&mut new, st.turn_id, st.last_visible(), now_ms);
        let from = st.messages.len();
        st.extend_messages(new);
        ops.extend((from..st.messages.len()).map(|i| self.push_op(st, i)));
        let appended_seq = st.first_seq + from as u64;
        self.trim(st, policy, &mut ops);
        let long_term = if policy.long_term.enabled {
            let new_from = appended_seq.saturating_sub(st.first_seq) as usize;
            let every = policy.long_term.extract_every_turns;
            self.long_term_due(st, every, new_from, req.memory_user)
        } else {
            LongTermDue::default()
        };

        let limits = Limits::of(&policy.history, req.encoding);
        let reach = self.reach(st, policy);
        let sent = render::outbound_reaching(&st.messages, req.rules, limits, reach);
        let fold = self.after_window(st, policy, &sent, req.encoding, now_ms);
        let from = st.first_seq + sent.start as u64;
        if let Some(reason) = sent.reason {
            policy
                .metrics
                .add_trimmed(TrimScope::Window, reason, sent.start);
            if from != st.window_from {
                self.trimmed(policy, TrimScope::Window, reason, sent.start);
            }
        }
        st.window_from = from;
        // Rendered again only if the fallback sees messages differently.
        let fallback_window = req
            .fallback_rules
            .filter(|rules| !rules.renders_like(req.rules))
            .map(|rules| render::outbound_reaching(&st.messages, rules, limits, reach).messages);
        Prepared {
            turn_id: st.turn_id,
            window: sent.messages,
            fallback_window,
            system_messages: st.system_messages.clone(),
            incarnation: st.incarnation,
            durable: self.persist(st, policy, ops),
            rewrite,
            reply_seq: st.first_seq + st.messages.len() as u64,
            remembered: st.remembered.clone(),
            fold,
            long_term,
        }
    }

    /// Carries out what `reconcile` decided of the stored messages: the
    /// replies the client resent shortened are marked as heard, and those
    /// a regenerate, an edit or a retry replaced are superseded (the
    /// reason is returned when any were).
    pub(super) fn apply(
        &self,
        st: &mut State,
        policy: &Policy,
        found: &Reconciled,
        sent: usize,
        now_ms: i64,
        ops: &mut Vec<Op>,
    ) -> Option<Rewrite> {
        let superseded_from = found.superseded_from().unwrap_or(st.messages.len());
        for (i, heard) in &found.shortened {
            if *i < superseded_from {
                st.edit_message(*i, |m| {
                    interruption::mark_stored(
                        m,
                        Some(&Spoken::Text(heard.clone())),
                        now_ms,
                        Cause::NewRequest.label(),
                    )
                });
                ops.push(self.set_op(st, *i));
            }
        }
        let reason = found.rewrite(&st.messages, sent)?;
        self.supersede_from(st, policy, superseded_from, reason, now_ms, ops)
    }

    /// This request follows a reply its client closed mid-reply, maybe: if
    /// soon enough and not to run that turn again, the close was the user
    /// barging in (a client that cancels before it sends the next turn),
    /// and the record says so, in storage too. The close is counted here,
    /// once, as what it was (`count_close`).
    fn read_close(&self, st: &mut State, policy: &Policy, retry: bool, ops: &mut Vec<Op>) {
        // The clock under the lock: the wait for a request ends by it too.
        let now_ms = policy.clock.now_ms();
        let window = policy.barge_in_after_close_ms;
        if let Some(i) = st.messages.len().checked_sub(1) {
            let read = interruption::after_close(&st.messages[i], now_ms, window, retry);
            if read == Some(Closed::BargeIn) {
                st.edit_message(i, interruption::barged_in);
                ops.push(self.set_op(st, i));
                let seq = st.first_seq + i as u64;
                self.count_close(policy, seq, Cause::NewRequest);
                tracing::debug!(session = %self.id, seq, "a close followed by a request: a barge-in");
            }
        }
        if let Some(seq) = self.uncounted_close() {
            self.count_close(policy, seq, Cause::ClientGone);
        }
    }

    /// What a Responses API turn does to this history (`chain::continues`);
    /// `None` for the other turns.
    fn continuation(&self, st: &State, req: &TurnRequest<'_>) -> Option<Continue> {
        let after = match req.joins {
            Joins::After(key) => Some(key),
            Joins::Append => None,
            Joins::Reconcile | Joins::Fork(_) => return None,
        };
        let same_key = req
            .idempotency_key
            .is_some_and(|k| st.last_key.as_deref() == Some(k));
        let retrying = req.retrying || same_key;
        Some(chain::continues(
            &st.messages,
            after,
            req.incoming,
            retrying,
        ))
    }

    /// The history a Responses API turn after response `key` forks from,
    /// if it forks: asked before the session's lease is taken, so that a
    /// fork never interrupts the branch it leaves (`begin` asks again).
    pub fn fork_point(&self, req: &TurnRequest<'_>) -> Option<Vec<Arc<Message>>> {
        let st = self.state();
        match self.continuation(&st, req)? {
            Continue::Fork { end } => Some(st.messages[..end].to_vec()),
            Continue::Unknown | Continue::Append { .. } => None,
        }
    }

    /// Supersedes the messages from `from` on (but the session API's), for
    /// `reason`; returns it when any were.
    fn supersede_from(
        &self,
        st: &mut State,
        policy: &Policy,
        from: usize,
        reason: Rewrite,
        now_ms: i64,
        ops: &mut Vec<Op>,
    ) -> Option<Rewrite> {
        let mut gone = Vec::new();
        for i in from..st.messages.len() {
            let m = &st.messages[i];
            if !interruption::is_superseded(m) && !interruption::from_the_session_api(m) {
                st.edit_message(i, |m| {
                    interruption::supersede(m, now_ms);
                    // Why, for whoever reads the history (the console's labels).
                    m.metadata_mut().insert(
                        interruption::SUPERSEDED_BY,
                        serde_json::Value::String(reason.label().into()),
                    );
                });
                ops.push(self.set_op(st, i));
                gone.push(Arc::clone(&st.messages[i]));
            }
        }
        if gone.is_empty() {
            return None;
        }
        // The summary told of what was replaced: it no longer holds.
        let seq = st.first_seq + from as u64;
        if st
            .remembered
            .summary
            .as_ref()
            .is_some_and(|s| seq < s.until)
        {
            st.remembered.reset();
            st.meta_changed();
        }
        policy.metrics.superseded(reason.label(), gone.len());
        tracing::debug!(session = %self.id, reason = reason.label(), superseded = gone.len(),
            "history rewritten");
        if policy.notifier.wants("history_rewritten") {
            policy.notifier.notify(Event::HistoryRewritten {
                session_id: self.id.clone(),
                reason,
                turn_id: st.turn_id,
                superseded: gone,
            });
        }
        Some(reason)
    }

    pub(super) fn trim(&self, st: &mut State, policy: &Policy, ops: &mut Vec<Op>) {
        let by_count = window::keep_start(&st.messages, policy.history.max_messages);
        let by_bytes = window::keep_start_bytes(&st.messages, st.bytes, policy.history.max_bytes);
        let (drop, reason) = if by_bytes > by_count {
            (by_bytes, TrimReason::MaxBytes)
        } else {
            (by_count, TrimReason::MaxMessages)
        };
        if drop > 0 {
            if policy.long_term.enabled {
                st.long_term.hold_back(&st.messages[..drop], st.first_seq);
            }
            st.drop_oldest(drop);
            let from = st.first_seq;
            st.first_seq += drop as u64;
            ops.push(Op::DropBefore {
                id: self.id.clone(),
                from,
                seq: st.first_seq,
            });
            policy.metrics.add_trimmed(TrimScope::History, reason, drop);
            self.trimmed(policy, TrimScope::History, reason, drop);
        }
    }

    /// Logs a trim, and tells the webhook when it asks to know.
    pub(super) fn trimmed(&self, policy: &Policy, scope: TrimScope, reason: TrimReason, n: usize) {
        tracing::debug!(session = %self.id, ?scope, ?reason, removed = n, "history trimmed");
        if policy.notifier.wants("history_trimmed") {
            policy.notifier.notify(Event::HistoryTrimmed {
                session_id: self.id.clone(),
                removed_count: n,
                reason,
                scope,
            });
        }
    }
}
