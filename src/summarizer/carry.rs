//! Carry-over: when a user's session ends, what its summary does not cover
//! yet is folded in (the last turn included), and that final summary is
//! folded into the user's note, which their next session starts with.

use std::sync::Arc;

use super::Summarizer;
use crate::clock::Clock;
use crate::memory::session::Ended;
use crate::memory::summary::{self, Fold, Note};
use crate::metrics::{Job, JobOutcome};
use crate::store::{Notes, Storage};

/// What an ended session leaves for its user's note.
#[derive(Debug)]
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

/// Carries `left` into its user's note, in a task of its own.
pub fn start(summarizer: Arc<Summarizer>, keep: Keep, left: Leftover) {
    tokio::spawn(async move {
        if let Err(e) = carry(&summarizer, &keep, &left).await {
            tracing::warn!(error = %e, "the ended session was not carried into its user's note");
        }
    });
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
