//! Carry-over: when a user's session ends, what its summary does not cover
//! yet is folded in (the last turn included), and that final summary is
//! folded into the user's note, which their next session starts with.
//! With durable storage the carry-over is kept as a job in the same write
//! as the session's deletion, forgotten once it has run: one that a stop
//! cuts short (or whose model failed) runs again when recall next starts.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::Summarizer;
use crate::clock::Clock;
use crate::memory::session::Ended;
use crate::memory::summary::{self, Fold, Note};
use crate::metrics::{Job, JobOutcome};
use crate::store::{Kept, Notes, Op, Storage, Taken};

/// What an ended session leaves for its user's note.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Leftover {
    /// The note's key.
    pub user: String,
    /// What the summary does not cover yet.
    pub fold: Option<Fold>,
    /// The summary, if the fold has nothing to add.
    pub summary: Option<String>,
    /// When the session began: a note deleted since stays deleted.
    pub began_ms: i64,
}

impl Leftover {
    /// `None` when the session has no user to carry into, or nothing a
    /// model would read.
    pub fn of(ended: &Ended, began_ms: i64) -> Option<Self> {
        if ended.remembered.forgotten {
            return None;
        }
        let user = ended.remembered.user.clone()?;
        let fold = summary::last_fold(&ended.contents, ended.first_seq, &ended.remembered);
        let summary = ended.remembered.summary.as_ref().map(|s| s.text.clone());
        (fold.is_some() || summary.is_some()).then_some(Self {
            user,
            fold,
            summary,
            began_ms,
        })
    }
}

/// Where the note is kept, and the time it is written at.
pub struct Keep {
    pub notes: Arc<Notes>,
    pub storage: Arc<Storage>,
    pub clock: Clock,
}

/// A kept job's body: what it is, and what it needs.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "job", rename_all = "snake_case")]
enum KeptJob {
    CarryOver(Leftover),
}

impl Leftover {
    /// The kept job that carries it over, to be written with the delete
    /// of the session it comes from. `None` if it cannot be written down.
    pub fn keep(&self, id: &str) -> Option<Op> {
        let body = serde_json::to_string(&KeptJob::CarryOver(self.clone())).ok()?;
        Some(Op::KeepJob {
            id: id.to_owned(),
            body,
        })
    }
}

/// A new kept job's id: `job_` (never a webhook event's `msg_`), the time
/// in ms (hex) and 64 random bits.
pub fn new_job_id(at_ms: i64) -> String {
    crate::webhook::new_event_id(at_ms).replacen("msg_", "job_", 1)
}

/// Carries `left` into its user's note, in a task of its own. `kept`:
/// the id it was kept under, forgotten once it has run.
pub fn start(summarizer: Arc<Summarizer>, keep: Keep, left: Leftover, kept: Option<String>) {
    tokio::spawn(async move {
        match kept {
            Some(id) => run_kept(&summarizer, &keep, &id).await,
            None => {
                if let Err(e) = carry(&summarizer, &keep, &left).await {
                    tracing::warn!(error = %e, "the ended session was not carried into its user's note");
                }
            }
        }
    });
}

/// Runs the carry-overs an earlier run (or a replica that stopped) kept
/// and did not finish, each in a task of its own.
pub fn resume(summarizer: Arc<Summarizer>, keep: Keep) {
    tokio::spawn(async move {
        let kept = match keep.storage.kept(Kept::Job).await {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(error = %e, "could not read kept carry-overs; they run after a restart");
                return;
            }
        };
        if !kept.is_empty() {
            tracing::info!(
                jobs = kept.len(),
                "resuming carry-overs kept by an earlier run"
            );
        }
        let keep = Arc::new(keep);
        for (id, _) in kept {
            let (summarizer, keep) = (Arc::clone(&summarizer), Arc::clone(&keep));
            tokio::spawn(async move { run_kept(&summarizer, &keep, &id).await });
        }
    });
}

/// Runs the kept job `id` under its claim, as stored, and forgets it once
/// it has run. One that fails stays kept, for the next start.
async fn run_kept(summarizer: &Summarizer, keep: &Keep, id: &str) {
    let stays = |e: &dyn std::fmt::Display| {
        tracing::warn!(job = id, error = %e,
            "the ended session was not carried into its user's note; it stays kept and runs again after a restart");
    };
    let Taken { claim, body } = match keep.storage.take_kept(Kept::Job, id).await {
        Ok(Some(taken)) => taken,
        // Done meanwhile, by another replica.
        Ok(None) => return,
        Err(e) => return stays(&e),
    };
    match serde_json::from_str::<KeptJob>(&body) {
        Ok(KeptJob::CarryOver(left)) => match carry(summarizer, keep, &left).await {
            Ok(()) => {
                let forgotten = keep
                    .storage
                    .submit(vec![Op::ForgetJob { id: id.to_owned() }])
                    .durable()
                    .await;
                if let Err(e) = forgotten {
                    tracing::warn!(job = id, error = %e,
                        "a carry-over that ran could not be forgotten: it may run again");
                }
            }
            Err(e) => stays(&e),
        },
        // A job of a later version, or damaged: left for whoever reads it.
        Err(e) => stays(&e),
    }
    if !claim.lost() {
        let _ = keep.storage.release_kept(claim).await;
    }
}

#[derive(Debug, thiserror::Error)]
enum CarryError {
    #[error(transparent)]
    Model(#[from] super::ModelError),
    #[error(transparent)]
    Storage(#[from] crate::store::StorageError),
}

/// Folds written against a note that changed meanwhile are done again,
/// this many times at most.
const ATTEMPTS: usize = 3;

async fn carry(summarizer: &Summarizer, keep: &Keep, left: &Leftover) -> Result<(), CarryError> {
    let summary = match &left.fold {
        Some(fold) => summarizer.fold(fold).await?.text,
        // `Leftover::of` makes one of the two.
        None => left.summary.clone().unwrap_or_default(),
    };
    for _ in 0..ATTEMPTS {
        let before = keep.notes.get(&keep.storage, &left.user).await?;
        if before
            .as_ref()
            .is_some_and(|n| n.forgotten && n.at_ms >= left.began_ms)
        {
            // Deleted while this session lived: what it holds is older.
            summarizer
                .metrics()
                .memory
                .job(Job::Note, JobOutcome::Stale);
            return Ok(());
        }
        let text = summarizer
            .note(before.as_ref().and_then(Note::text), &summary)
            .await?;
        let note = Note {
            text,
            model: summarizer.model_name().to_owned(),
            at_ms: keep.clock.now_ms(),
            forgotten: false,
        };
        // Written only over the note it was folded from: a delete, or
        // another session's carry-over, since (on any replica) is not
        // written over; the fold is done again on what is there now.
        let written = keep
            .notes
            .put_if(&keep.storage, &left.user, &note, before.as_ref())?
            .durable()
            .await;
        match written {
            Err(e) if crate::store::note_changed(&e) => continue,
            other => other?,
        }
        summarizer
            .metrics()
            .memory
            .job(Job::Note, JobOutcome::Stored);
        return Ok(());
    }
    summarizer
        .metrics()
        .memory
        .job(Job::Note, JobOutcome::Stale);
    Ok(())
}
