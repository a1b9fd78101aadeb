//! What a turn takes from summaries: the running summary and the note
//! carried in from the user's last session, as the system messages it
//! sends; the note, read when a session is made.

use crate::config::MemoryConfig;
use crate::memory::message::Message;
use crate::memory::session::Session;
use crate::memory::summary::{self, Remembered};
use crate::server::app::App;

/// The system messages memory adds to a turn, in order: the note carried
/// in from the user's last session, then the running summary; within
/// `max_tokens`, the summary first (it is this conversation's).
pub(crate) fn injected(config: &MemoryConfig, r: &Remembered) -> impl Iterator<Item = Message> {
    let mut left = config.max_tokens;
    let summary = r.summary.as_ref().and_then(|s| {
        summary::message_within(&config.summary_template, "{summary}", &s.text, &mut left)
    });
    let note = r
        .carried
        .as_deref()
        .and_then(|n| summary::message_within(&config.carry_over_template, "{note}", n, &mut left));
    note.into_iter().chain(summary)
}

/// Gives a session its user's note, if the user has one: called when the
/// session is made, before its first turn. A note that cannot be read is
/// logged and the session starts without it.
pub(crate) async fn carry_in(app: &App, session: &Session, key: &str, user: &str) {
    session.carry(key, user, note_of(app, key).await);
}

/// The text of user `key`'s note, if any; one that cannot be read is
/// logged and taken as none.
pub(crate) async fn note_of(app: &App, key: &str) -> Option<String> {
    match app.notes.get(&app.policy.storage, key).await {
        Ok(note) => note.and_then(|n| n.text().map(str::to_owned)),
        Err(e) => {
            tracing::warn!(error = %e, "a user's note could not be read");
            None
        }
    }
}
