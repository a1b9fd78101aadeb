//! What a session remembers beyond its window: when a fold of its running
//! summary is due, a fold's answer applied (if the summary it extends
//! still holds), a summary set by hand, and the note carried in from its
//! user's last session. The fold itself (the summary model's call) runs
//! outside, in `crate::summaries`.

use super::state::State;
use super::{Policy, Refused, Session};
use crate::memory::render::{self, Reach, Sent};
use crate::memory::summary::{self, Due, Fold, Folded, Remembered, Summary};
use crate::memory::tokens::Encoding;
use crate::memory::window::Limits;
use crate::metrics::{Job, JobOutcome};
use crate::proxy::protocol::VendorRules;
use crate::store::Ticket;

/// What asking for a fold found.
#[derive(Debug)]
pub enum FoldNow {
    /// A fold of this session is running here already.
    Running,
    /// Every message outside the window is covered.
    Covered,
    /// This fold is now the session's running one: `Session::fold_ended`
    /// must follow it.
    Start(Fold),
}

/// What became of a fold's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    Stored(Summary),
    /// The summary it extended was replaced meanwhile (by hand, by another
    /// replica's fold, or a cleared history): the answer is dropped.
    Stale,
    /// Kept for the session's next turn to store, under its lease.
    Pending,
}

impl Session {
    /// How far back this turn's window reaches: to the first message the
    /// summary does not cover, with `[memory] summarize`.
    pub(super) fn reach(&self, st: &State, policy: &Policy) -> Option<Reach> {
        if !policy.memory.summarize {
            return None;
        }
        let from = st.remembered.uncovered_from(st.first_seq) - st.first_seq;
        Some(Reach {
            from: usize::try_from(from).unwrap_or(usize::MAX),
            max: policy.memory.summary_max_lag_messages,
        })
    }

    /// After a turn's window: the fold now due, if any (which the caller
    /// starts), and what the summary did for this window.
    pub(super) fn after_window(
        &self,
        st: &mut State,
        policy: &Policy,
        sent: &Sent,
        encoding: Encoding,
        now_ms: i64,
    ) -> Option<Fold> {
        let memory = &policy.memory;
        if !memory.summarize {
            return None;
        }
        let uncovered = st.remembered.uncovered_from(st.first_seq) - st.first_seq;
        let lag = (sent.plain_start as u64).saturating_sub(uncovered);
        // Estimated (bytes / 4) rather than counted: this is for a metric,
        // under the session's lock, on every turn.
        let saved = st.remembered.summary.as_ref().map_or(0, |s| {
            s.covered_tokens.saturating_sub(s.text.len() as u64 / 4)
        });
        policy.metrics.memory.turn(lag, saved, sent.gap);
        if sent.gap {
            tracing::warn!(session = %self.id, uncovered = lag,
                limit = memory.summary_max_lag_messages,
                "the summary lags too far behind: messages left the window unsummarized");
        }
        if st.folding || now_ms < st.fold_after_ms {
            return None;
        }
        let due = Due {
            messages: memory.summary_every_messages,
            tokens: memory.summary_every_tokens,
            encoding,
        };
        let mut fold = summary::fold(
            &st.messages,
            st.first_seq,
            &st.remembered,
            sent.plain_start,
            Some(due),
        )?;
        fold.born = self.born(st);
        st.folding = true;
        Some(fold)
    }

    /// A fold of everything outside the window that the summary does not
    /// cover, whatever `summary_every_messages` says (the session API's
    /// `summarize`), with the window as `rules` and `limits` make it.
    pub fn fold_now(&self, rules: &VendorRules, limits: Limits) -> Result<FoldNow, Refused> {
        let mut st = self.state();
        if st.ended {
            return Err(Refused::Ended);
        }
        if st.folding {
            return Ok(FoldNow::Running);
        }
        let plain = render::outbound(&st.messages, rules, limits).start;
        match summary::fold(&st.messages, st.first_seq, &st.remembered, plain, None) {
            None => Ok(FoldNow::Covered),
            Some(mut fold) => {
                fold.born = self.born(&st);
                st.folding = true;
                Ok(FoldNow::Start(fold))
            }
        }
    }

    /// The fold that ran here has ended; after a failure, no fold starts
    /// before `retry_after_ms`.
    pub fn fold_ended(&self, retry_after_ms: Option<i64>) {
        let mut st = self.state();
        st.folding = false;
        if let Some(at) = retry_after_ms {
            st.fold_after_ms = at;
        }
    }

    /// Stores the summary a fold's model wrote, if the summary it extends
    /// is still the session's (else it is `Stale`, and nothing changes).
    /// With `lease_here`, it needs the session's lease with shared storage:
    /// a turn here holding it lends it (this lock orders their writes);
    /// with none here, the answer waits for the next turn (`Pending`),
    /// which stores it before anything else, or for `store_pending`.
    pub fn offer_fold(
        &self,
        policy: &Policy,
        folded: Folded,
        lease_here: bool,
    ) -> Result<(Applied, Ticket), Refused> {
        let mut st = self.state();
        if st.ended {
            return Err(Refused::Ended);
        }
        if lease_here && st.lease.is_none() {
            st.pending = Some(Box::new(folded));
            return Ok((Applied::Pending, Ticket::ready()));
        }
        let applied = self.apply_fold(&mut st, policy, folded);
        let ticket = self.persist(&mut st, policy, Vec::new());
        Ok((applied, ticket))
    }

    /// Stores a fold's answer kept for later, if any (the caller holds the
    /// session's lease); `None` when there was none (a turn stored it).
    pub fn store_pending(&self, policy: &Policy) -> Result<Option<(Applied, Ticket)>, Refused> {
        let mut st = self.state();
        if st.ended {
            return Err(Refused::Ended);
        }
        let Some(folded) = st.pending.take() else {
            return Ok(None);
        };
        let applied = self.apply_fold(&mut st, policy, *folded);
        Ok(Some((applied, self.persist(&mut st, policy, Vec::new()))))
    }

    /// Whether a fold's answer waits for a turn to store it.
    pub fn has_pending(&self) -> bool {
        self.state().pending.is_some()
    }

    /// Puts a fold's answer in the session's memory, if the summary it
    /// extends still holds; the caller writes it.
    pub(super) fn apply_fold(&self, st: &mut State, policy: &Policy, folded: Folded) -> Applied {
        let r = &st.remembered;
        let f = &folded.fold;
        let held_until = st.first_seq + st.messages.len() as u64;
        let holds = r.epoch == f.epoch
            && r.summary.as_deref() == f.previous.as_ref()
            && self.born(st) == f.born
            && f.until <= held_until;
        let applied = if !holds {
            Applied::Stale
        } else {
            let before = r.summary.as_ref().map_or(0, |s| s.covered_tokens);
            let summary = Summary {
                text: folded.text,
                until: folded.fold.until,
                model: folded.model,
                at_ms: folded.at_ms,
                covered_tokens: before + folded.covered_tokens,
            };
            st.remembered.summary = Some(Box::new(summary.clone()));
            st.meta_changed();
            Applied::Stored(summary)
        };
        let outcome = match applied {
            Applied::Stored(_) => JobOutcome::Stored,
            _ => JobOutcome::Stale,
        };
        policy.metrics.memory.job(Job::Fold, outcome);
        tracing::debug!(session = %self.id, ?outcome, from = folded.fold.from,
            until = folded.fold.until, "summary fold ended");
        applied
    }

    /// Sets the summary by hand: it covers the messages before the window
    /// `rules` and `limits` make now.
    pub fn set_summary(
        &self,
        policy: &Policy,
        text: String,
        rules: &VendorRules,
        limits: Limits,
        now_ms: i64,
    ) -> Result<(Summary, Ticket), Refused> {
        self.change_meta(policy, now_ms, |st| {
            let plain = render::outbound(&st.messages, rules, limits).start;
            let summary = Summary {
                text,
                until: st.first_seq + plain as u64,
                model: summary::MANUAL.into(),
                at_ms: now_ms,
                covered_tokens: 0,
            };
            st.remembered.summary = Some(Box::new(summary.clone()));
            summary
        })
    }

    /// Makes user `key` (`user` as the client names them) the one this
    /// session is carried into when it ends (unless it has one), and gives
    /// it the user's `note`, if it has not begun yet (else the note is too
    /// late, and ignored). Written with the session's next change.
    pub fn carry(&self, key: &str, user: &str, note: Option<String>) {
        let mut st = self.state();
        st.carried_into(key);
        // In the users index, where a deletion of the user's memory finds
        // the copies sessions hold.
        if !st.users.iter().any(|u| u == user) {
            st.users.push(user.to_owned());
            st.meta_changed();
        }
        let fresh = st.messages.is_empty() && st.turn_id == 0;
        if let (Some(note), true, None) = (note, fresh, &st.remembered.carried) {
            st.remembered.carried = Some(note);
            st.meta_changed();
        }
    }

    /// Forgets user `key`'s note in this session: the copy it started with,
    /// and that its end is carried into the note. Whether it held either.
    pub fn forget_user(&self, policy: &Policy, key: &str) -> Result<(bool, Ticket), Refused> {
        let mut st = self.state();
        if st.ended {
            return Err(Refused::Ended);
        }
        if st.remembered.user.as_deref() != Some(key) || st.remembered.forgotten {
            return Ok((false, Ticket::ready()));
        }
        st.remembered.carried = None;
        st.remembered.forgotten = true;
        st.long_term.forget();
        st.meta_changed();
        Ok((true, self.persist(&mut st, policy, Vec::new())))
    }

    pub fn remembered(&self) -> Remembered {
        self.state().remembered.clone()
    }
}
