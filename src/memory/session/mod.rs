//! Sessions: each one's history, its current turn, and the reply in flight.
//!
//! All of a session's state sits behind one short-lived sync lock, held
//! only to read or change the history, never across an await. Turns are
//! serialised by the `active` slot: a request claims it when it appends its
//! messages, and the reply's `InFlight` gives it up when the reply is
//! recorded (complete, interrupted or failed). A request that finds the slot
//! taken interrupts that reply (barge-in) or is rejected, as configured;
//! it never waits for the old reply's upstream to be drained.
//!
//! Every change to a session is made here, under its lock: a reply's
//! record too. The reply in flight decides what its record is
//! (`InFlight::settle` returns a `Record`); `settle_reply` applies it.

mod admin;
mod reply;
mod store;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub use admin::{EndWhen, Ended, Summary};
pub use reply::Reply;
pub use store::Store;

use crate::clock::Clock;
use crate::config::{HistoryConfig, OnNewRequest};
use crate::memory::inflight::{Ctx, Happened, InFlight, Record, Settled};
use crate::memory::interruption::{self, Spoken};
use crate::memory::message::Message;
use crate::memory::reconcile::{self, Hints, Reconciled, Rewrite};
use crate::memory::render;
use crate::memory::tokens::Encoding;
use crate::memory::turns;
use crate::memory::window::{self, Limits, TrimReason, TrimScope};
use crate::metrics::{Cause, Metrics};
use crate::proxy::vendor::VendorRules;
use crate::store::{Claim, Loaded, Meta, Op, Storage, Ticket};
use crate::webhook::{Event, Notifier};

/// Longest session id, in bytes (all its characters are ASCII).
pub const MAX_ID_LEN: usize = 128;

/// Session ids are chosen by clients, so they are checked, never defaulted.
/// They name sessions in URLs (`/v1/sessions/{id}`), storage keys and log
/// lines, so they are short and plain: 1 to 128 of `A-Z a-z 0-9 - _ . : @`,
/// and neither `.` nor anything with `..` in it, which URL clients rewrite
/// as path steps (a session so named could not be reached by its URL).
/// The message says what is wrong, without echoing a long or binary id.
pub fn validate_id(id: &str) -> Result<(), String> {
    const RULE: &str = "a session id is 1 to 128 characters of A-Z a-z 0-9 - _ . : @";
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "-_.:@".contains(c);
    if id.is_empty() {
        return Err(format!("{RULE}; this one is empty"));
    }
    if id.len() > MAX_ID_LEN {
        return Err(format!("{RULE}; this one is {} bytes long", id.len()));
    }
    if let Some((at, c)) = id.char_indices().find(|&(_, c)| !ok_char(c)) {
        return Err(format!("{RULE}; this one has {c:?} at byte {at}"));
    }
    if id == "." || id.contains("..") {
        return Err(format!("{RULE}, and not `.` or anything with `..` in it"));
    }
    Ok(())
}

/// The parts of the config that govern memory, shared by every session.
pub struct Policy {
    pub history: HistoryConfig,
    pub on_new_request: OnNewRequest,
    pub metrics: Arc<Metrics>,
    pub notifier: Arc<dyn Notifier>,
    pub storage: Arc<Storage>,
    /// What sessions and records read the time from.
    pub clock: Clock,
}

pub struct Session {
    pub id: String,
    pub created_ms: i64,
    last_active_ms: AtomicI64,
    state: Mutex<State>,
}

struct State {
    turn_id: u64,
    /// Shared, so that a window or a storage op is a pointer copy and
    /// dropping old messages moves pointers, not messages.
    messages: Vec<Arc<Message>>,
    /// Sequence number of `messages[0]`: it grows as old messages are
    /// dropped, so a message keeps its number while it is stored.
    first_seq: u64,
    active: Option<Arc<InFlight>>,
    /// The session's lease with shared storage, held while `active` is
    /// and given up right after the reply's record.
    lease: Option<Claim>,
    /// Per-session instructions, sent after the configured ones.
    system_messages: Vec<Message>,
    /// Users seen speaking in this session (the user header).
    users: Vec<String>,
    /// Set when the session ends; a request still holding it starts anew.
    ended: bool,
    incarnation: u64,
    /// Where the last window sent upstream began (by sequence number), so
    /// that a trim event is sent when it moves, not on every turn.
    window_from: u64,
    /// What the messages hold, by `Message::byte_cost`, kept up to date
    /// with every change so that `max_bytes` never sums a whole history.
    bytes: usize,
    /// What storage holds of the meta, so that a turn writes only what it
    /// changed.
    saved: Saved,
    /// The last turn's `Idempotency-Key`: the same key again is a retry.
    /// Kept in memory only; an SDK's retry also says so in its headers.
    last_key: Option<String>,
}

/// The meta as last sent to storage. Users and system messages can be
/// kilobytes (a long system prompt) and rarely change, so they are written
/// only when they do; the turn number, the first sequence number and the
/// last activity (`Op::Touch`, a small row) once per turn.
///
/// This is what was sent, not what is durable: a write that fails fences
/// the session in storage (`store::Fences`), every later write of this
/// state is refused, and the session is reloaded from storage before it
/// is served again (`Store::find`), which rebuilds this from what storage
/// holds. So nothing here is trusted past a failed write.
#[derive(Debug, Clone, Copy, Default)]
struct Saved {
    /// Users and system messages are stored as they are here.
    whole: bool,
    turn_id: u64,
    first_seq: u64,
    last_active_ms: i64,
    /// What this state starts from, which its first write says first.
    origin: Origin,
    /// Batches this session has sent to storage: a reload checks that
    /// none was sent while it read.
    batches: u64,
}

/// Where a session's state came from, until its first write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Origin {
    /// Nothing: it has written since.
    #[default]
    Written,
    /// Read from storage: its writes resume (`Op::Resume`).
    Loaded,
    /// Started anew, with nothing loadable in storage: its writes resume,
    /// and messages left there by an earlier session of the same id (a
    /// reply recorded after that session ended) are cleared.
    New,
}

/// A Touch is written at most this long after the last one, besides once
/// per turn: the end of a long reply is activity too.
const TOUCH_AFTER_MS: i64 = 1000;

impl State {
    fn new(meta: Meta) -> Self {
        Self {
            turn_id: meta.turn_id,
            messages: Vec::new(),
            first_seq: meta.first_seq,
            active: None,
            lease: None,
            system_messages: meta.system_messages,
            users: meta.users,
            ended: false,
            incarnation: next_incarnation(),
            window_from: meta.first_seq,
            bytes: 0,
            saved: Saved {
                origin: Origin::New,
                ..Saved::default()
            },
            last_key: None,
        }
    }

    /// The newest message that is not superseded.
    fn last_visible(&self) -> Option<&Message> {
        self.messages
            .iter()
            .rev()
            .map(|m| &**m)
            .find(|m| !interruption::is_superseded(m))
    }

    /// A session as storage holds it.
    fn with_messages(meta: Meta, messages: Vec<Message>) -> Self {
        let last_active_ms = meta.last_active_ms;
        let mut st = Self::new(meta);
        st.replace_messages(shared(messages));
        st.saved = Saved {
            whole: true,
            turn_id: st.turn_id,
            first_seq: st.first_seq,
            last_active_ms,
            origin: Origin::Loaded,
            batches: 0,
        };
        st
    }

    /// Users or system messages changed: the next write carries them.
    fn meta_changed(&mut self) {
        self.saved.whole = false;
    }

    // Every change to `messages` goes through these, which keep `bytes`.

    fn replace_messages(&mut self, messages: Vec<Arc<Message>>) -> Vec<Arc<Message>> {
        self.bytes = messages.iter().map(|m| m.byte_cost()).sum();
        std::mem::replace(&mut self.messages, messages)
    }

    fn push_message(&mut self, m: Arc<Message>) {
        self.bytes += m.byte_cost();
        self.messages.push(m);
    }

    fn extend_messages(&mut self, new: impl IntoIterator<Item = Message>) {
        for m in new {
            self.push_message(Arc::new(m));
        }
    }

    fn drop_oldest(&mut self, n: usize) {
        let gone: usize = self.messages[..n].iter().map(|m| m.byte_cost()).sum();
        self.bytes = self.bytes.saturating_sub(gone);
        self.messages.drain(..n);
    }

    fn clear_messages(&mut self) {
        self.bytes = 0;
        self.messages.clear();
    }

    /// Changes the message at `index` (copied first if a window or a
    /// storage op still shares it).
    fn edit_message<T>(&mut self, index: usize, change: impl FnOnce(&mut Message) -> T) -> T {
        let m = Message::edit(&mut self.messages[index]);
        let before = m.byte_cost();
        let out = change(m);
        let after = m.byte_cost();
        self.bytes = (self.bytes + after).saturating_sub(before);
        out
    }
}

/// A copy of a session's memory.
#[derive(Debug, Clone)]
pub struct History {
    pub turn_id: u64,
    pub messages: Vec<Arc<Message>>,
}

/// A request's turn, as the session needs it.
pub struct TurnRequest<'a> {
    /// The request's messages, instructions taken out.
    pub incoming: &'a [Message],
    pub user: Option<&'a str>,
    /// How the model the turn is sent to counts tokens.
    pub encoding: Encoding,
    pub now_ms: i64,
    /// The client says it retries (`x-stainless-retry-count` above 0).
    pub retrying: bool,
    pub idempotency_key: Option<&'a str>,
    /// How the upstream sees the history, and its fallback if it has one.
    pub rules: &'a VendorRules,
    pub fallback_rules: Option<&'a VendorRules>,
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
        }
    }
}

/// Messages as a session holds them. Not `collect()`: that reuses the
/// `Vec<Message>`'s buffer in place, and a session would keep 14 times the
/// capacity it needs (2 KiB for 20 messages) for as long as it lives.
pub(crate) fn shared(messages: Vec<Message>) -> Vec<Arc<Message>> {
    let mut out = Vec::with_capacity(messages.len());
    out.extend(messages.into_iter().map(Arc::new));
    out
}

/// A number no other session history in this process has had: what the
/// answer cache keys a session's answers by, so that a reset or a reused
/// id never serves answers from an earlier conversation.
fn next_incarnation() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Why a turn could not begin.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// A reply is in flight and the policy is to reject.
    Busy,
    /// The session ended meanwhile; look it up again.
    Ended,
}

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
    fn new(id: &str, now_ms: i64) -> Self {
        Self {
            id: id.to_owned(),
            created_ms: now_ms,
            last_active_ms: AtomicI64::new(now_ms),
            state: Mutex::new(State::new(Meta::default())),
        }
    }

    /// A session read back from storage.
    fn from_loaded(id: &str, loaded: Loaded) -> Self {
        let Loaded { meta, messages } = loaded;
        Self {
            id: id.to_owned(),
            created_ms: meta.created_ms,
            last_active_ms: AtomicI64::new(meta.last_active_ms),
            state: Mutex::new(State::with_messages(meta, messages)),
        }
    }

    fn meta(&self, st: &State) -> Meta {
        Meta {
            created_ms: self.created_ms,
            last_active_ms: self.last_active_ms(),
            turn_id: st.turn_id,
            first_seq: st.first_seq,
            users: st.users.clone(),
            system_messages: st.system_messages.clone(),
        }
    }

    /// Sends the changes made under `st` to storage, in the order they
    /// were made, preceded by what changed of the session's meta (the
    /// caller still holds the lock).
    fn persist(&self, st: &mut State, policy: &Policy, ops: Vec<Op>) -> Ticket {
        self.write(st, &policy.storage, ops)
    }

    fn write(&self, st: &mut State, storage: &Storage, mut ops: Vec<Op>) -> Ticket {
        if !storage.persistent() {
            return Ticket::ready();
        }
        let last_active_ms = self.last_active_ms();
        let since = last_active_ms - st.saved.last_active_ms;
        // A client's message (a user's, a tool result) is a turn: its
        // activity is stored, so that no sweeper (another replica's, or
        // this one's after a restart) takes a session busy in a tool loop
        // for idle.
        let said = ops
            .iter()
            .any(|op| matches!(op, Op::Push { message, .. } if message.role != "assistant"));
        let moved = st.turn_id != st.saved.turn_id
            || st.first_seq != st.saved.first_seq
            || (since > 0 && said)
            || since >= TOUCH_AFTER_MS;
        let mut head = Vec::with_capacity(3);
        if st.saved.origin != Origin::Written {
            head.push(Op::Resume {
                id: self.id.clone(),
            });
        }
        if st.saved.origin == Origin::New {
            head.push(Op::Clear {
                id: self.id.clone(),
            });
        }
        if !st.saved.whole {
            head.push(Op::Save {
                id: self.id.clone(),
                meta: self.meta(st),
            });
        } else if moved {
            head.push(Op::Touch {
                id: self.id.clone(),
                created_ms: self.created_ms,
                last_active_ms,
                turn_id: st.turn_id,
                first_seq: st.first_seq,
            });
        }
        if head.is_empty() && ops.is_empty() {
            return Ticket::ready();
        }
        ops.splice(0..0, head);
        st.saved = Saved {
            whole: true,
            turn_id: st.turn_id,
            first_seq: st.first_seq,
            last_active_ms: if moved || !st.saved.whole {
                last_active_ms
            } else {
                st.saved.last_active_ms
            },
            origin: Origin::Written,
            batches: st.saved.batches + 1,
        };
        storage.submit(ops)
    }

    /// Batches sent to storage so far (see `recover`).
    pub(crate) fn batches(&self) -> u64 {
        self.state().saved.batches
    }

    /// After a failed write: replaces the local copy with what storage
    /// holds, `loaded`, read after every write queued before it was done.
    /// Not while a reply is in flight, nor if the session wrote anything
    /// since `batches` was read (what was read may be older than that).
    /// With nothing loadable in storage the session ends, so that it is
    /// started anew. Returns whether it did either.
    pub(crate) fn recover(&self, loaded: Option<Loaded>, batches: u64, storage: &Storage) -> bool {
        let mut st = self.state();
        if st.active.is_some() || st.ended || st.saved.batches != batches {
            return false;
        }
        let Some(Loaded { meta, messages }) = loaded else {
            st.ended = true;
            return true;
        };
        self.last_active_ms
            .fetch_max(meta.last_active_ms, Ordering::Relaxed);
        *st = State::with_messages(meta, messages);
        st.saved.batches = batches;
        tracing::info!(session = %self.id, "session reloaded from storage after a failed write");
        // Lifts the fence now, not at the next turn's write.
        drop(self.write(&mut st, storage, Vec::new()));
        true
    }

    fn push_op(&self, st: &State, index: usize) -> Op {
        Op::Push {
            id: self.id.clone(),
            seq: st.first_seq + index as u64,
            message: Arc::clone(&st.messages[index]),
        }
    }

    fn set_op(&self, st: &State, index: usize) -> Op {
        Op::Set {
            id: self.id.clone(),
            seq: st.first_seq + index as u64,
            message: Arc::clone(&st.messages[index]),
        }
    }

    /// Messages held in memory (for the metrics).
    pub fn message_count(&self) -> usize {
        self.state().messages.len()
    }

    pub fn touch(&self, now_ms: i64) {
        self.last_active_ms.fetch_max(now_ms, Ordering::Relaxed);
    }

    pub fn last_active_ms(&self) -> i64 {
        self.last_active_ms.load(Ordering::Relaxed)
    }

    /// A reply is in flight: the session is not idle whatever the clock says.
    pub fn is_busy(&self) -> bool {
        self.state().active.is_some()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every change under this lock is a push, a drain or a field
        // update, so a panic elsewhere cannot leave it half done: go on.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn snapshot(&self) -> History {
        let st = self.state();
        History {
            turn_id: st.turn_id,
            messages: st.messages.clone(),
        }
    }

    /// Opens a turn: settles the reply still in flight (if any), merges the
    /// client's conversation into the history, and decides what the
    /// upstream is sent.
    pub fn begin(
        self: &Arc<Self>,
        policy: &Arc<Policy>,
        req: &TurnRequest<'_>,
    ) -> Result<(Prepared, Reply), Refused> {
        let mut st = self.settled(policy, policy.on_new_request)?;
        if let Some(user) = req.user {
            if !st.users.iter().any(|u| u == user) {
                st.users.push(user.to_owned());
                st.meta_changed();
            }
        }
        self.touch(req.now_ms);
        let prepared = self.append(&mut st, policy, req);
        let flight = Arc::new(InFlight::new(prepared.turn_id));
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

    /// Replaces the local copy with what shared storage holds, unless a
    /// reply is in flight here (then this process holds the session and
    /// its copy is the newest).
    pub fn reload(&self, loaded: Loaded) {
        let mut st = self.state();
        if st.active.is_some() || st.ended {
            return;
        }
        let Loaded { meta, messages } = loaded;
        self.last_active_ms
            .fetch_max(meta.last_active_ms, Ordering::Relaxed);
        let batches = st.saved.batches;
        *st = State::with_messages(meta, messages);
        st.saved.batches = batches;
    }

    /// Settles the reply in flight, if any, as `on_new` says, and returns
    /// the state with no reply in flight.
    fn settled(
        &self,
        policy: &Policy,
        on_new: OnNewRequest,
    ) -> Result<MutexGuard<'_, State>, Refused> {
        let mut st = self.state();
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

    fn append(&self, st: &mut State, policy: &Policy, req: &TurnRequest<'_>) -> Prepared {
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
        let found = reconcile::reconcile(&st.messages, incoming, hints);
        let rewrite = self.apply(st, policy, &found, incoming.len(), now_ms, &mut ops);
        st.last_key = req.idempotency_key.map(str::to_owned);
        let mut new = incoming[found.new_from(incoming.len())..].to_vec();
        st.turn_id = turns::stamp_client_messages(&mut new, st.turn_id, st.last_visible(), now_ms);
        let from = st.messages.len();
        st.extend_messages(new);
        ops.extend((from..st.messages.len()).map(|i| self.push_op(st, i)));
        self.trim(st, policy, &mut ops);

        let limits = Limits {
            messages: policy.history.window_messages,
            chars: policy.history.window_chars,
            tokens: policy.history.window_tokens,
            encoding: req.encoding,
        };
        let sent = render::outbound(&st.messages, req.rules, limits);
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
            .map(|rules| render::outbound(&st.messages, rules, limits).messages);
        Prepared {
            turn_id: st.turn_id,
            window: sent.messages,
            fallback_window,
            system_messages: st.system_messages.clone(),
            incarnation: st.incarnation,
            durable: self.persist(st, policy, ops),
            rewrite,
        }
    }

    /// Carries out what `reconcile` decided of the stored messages: the
    /// replies the client resent shortened are marked as heard, and those
    /// a regenerate, an edit or a retry replaced are superseded (the
    /// reason is returned when any were).
    fn apply(
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
        let mut gone = Vec::new();
        for i in superseded_from..st.messages.len() {
            let m = &st.messages[i];
            if !interruption::is_superseded(m) && !interruption::from_the_session_api(m) {
                st.edit_message(i, |m| interruption::supersede(m, now_ms));
                ops.push(self.set_op(st, i));
                gone.push(Arc::clone(&st.messages[i]));
            }
        }
        if gone.is_empty() {
            return None;
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

    fn trim(&self, st: &mut State, policy: &Policy, ops: &mut Vec<Op>) {
        let by_count = window::keep_start(&st.messages, policy.history.max_messages);
        let by_bytes = window::keep_start_bytes(&st.messages, st.bytes, policy.history.max_bytes);
        let (drop, reason) = if by_bytes > by_count {
            (by_bytes, TrimReason::MaxBytes)
        } else {
            (by_count, TrimReason::MaxMessages)
        };
        if drop > 0 {
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
    fn trimmed(&self, policy: &Policy, scope: TrimScope, reason: TrimReason, n: usize) {
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

    fn settle_locked(
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
                    policy.metrics.interrupted(cause);
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
                    lease = st.lease.take();
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
                (
                    None,
                    self.update_locked(st, seq, policy, |m| change.apply(m)),
                )
            }
        }
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
            st.lease = Some(claim);
        } else {
            let _ = policy.storage.release(claim);
        }
    }

    /// Changes a stored message, if it is still stored.
    fn update_locked(
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
        let op = self.set_op(st, index);
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
