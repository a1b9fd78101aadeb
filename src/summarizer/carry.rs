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
}

impl Leftover {
    /// `None` when the session has no user to carry into, or nothing a
    /// model would read.
    pub fn of(ended: &Ended) -> Option<Self> {
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

async fn carry(summarizer: &Summarizer, keep: &Keep, left: &Leftover) -> Result<(), CarryError> {
    let summary = match &left.fold {
        Some(fold) => summarizer.fold(fold).await?.text,
        // `Leftover::of` makes one of the two.
        None => left.summary.clone().unwrap_or_default(),
    };
    let before = keep.notes.get(&keep.storage, &left.user).await?;
    let text = summarizer
        .note(before.as_ref().map(|n| n.text.as_str()), &summary)
        .await?;
    let note = Note {
        text,
        model: summarizer.model_name().to_owned(),
        at_ms: keep.clock.now_ms(),
    };
    keep.notes
        .put(&keep.storage, &left.user, &note)
        .durable()
        .await?;
    summarizer.metrics.memory.job(Job::Note, JobOutcome::Stored);
    Ok(())
}
