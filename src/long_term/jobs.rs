//! Long-term memory's background jobs for a session: an extraction when
//! one is due (or when the session ended), and the search whose result
//! the session's next turn sends. The turn that starts them never waits.

use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{Extracted, LongTerm, LongTermError};
use crate::memory::long_term as lt;
use crate::memory::session::{Ended, Extraction, Query, Session};

/// Extracts `ex` in a task of its own, which a caller that stops
/// waiting does not cancel; `session` (none once it ended) hears when it
/// is done, however it ends.
pub fn extract(
    lt: Arc<LongTerm>,
    session: Option<Arc<Session>>,
    ex: Extraction,
) -> JoinHandle<Result<Extracted, LongTermError>> {
    tokio::spawn(async move {
        let mut running = Running {
            session,
            until: None,
        };
        let done = lt.extract(&ex).await;
        match &done {
            Ok(done) => {
                tracing::debug!(session = %ex.session, ?done, "facts extracted");
                running.until = Some(ex.until);
            }
            Err(e) => tracing::warn!(session = %ex.session, error = %e,
                "facts were not extracted: they are tried again with the next ones"),
        }
        done
    })
}

struct Running {
    session: Option<Arc<Session>>,
    until: Option<u64>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(s) = &self.session {
            s.extraction_ended(self.until);
        }
    }
}

/// Searches `user`'s records for `query` in a task of its own, unless a
/// search of the session runs (then `query` waits for it, and `None` is
/// returned); the result is kept with the session. The receiver hears
/// when it is (an inline turn waits for it, for a while).
pub fn recall(
    lt: Arc<LongTerm>,
    session: Arc<Session>,
    user: String,
    query: Query,
) -> Option<oneshot::Receiver<()>> {
    let first = session.search_for(query)?;
    let (done, heard) = oneshot::channel();
    tokio::spawn(async move {
        let mut done = Some(done);
        let mut next = Some(first);
        while let Some(query) = next {
            match lt.recall(&user, &query).await {
                Ok(facts) => session.recalled(&user, query.for_seq, facts),
                Err(e) => tracing::warn!(session = %session.id, error = %e,
                    "the user's records were not searched; the turn sends the last facts found"),
            }
            if let Some(done) = done.take() {
                let _ = done.send(());
            }
            next = session.search_ended();
        }
    });
    Some(heard)
}

/// Extracts what an ended session left unextracted, in the background.
pub fn after_end(long_term: &Arc<LongTerm>, ended: &Ended, began_ms: i64, id: &str) {
    let r = &ended.remembered;
    let Some(user) = r.user.clone().filter(|_| !r.forgotten) else {
        return;
    };
    let from = ended.extracted_until.saturating_sub(ended.first_seq);
    let from = usize::try_from(from).unwrap_or(usize::MAX);
    let left = ended.contents.get(from..).unwrap_or_default();
    let messages: Vec<_> = ended.held_back.iter().chain(left).cloned().collect();
    if !lt::worth_extracting(&messages) {
        return;
    }
    let (user_name, session) = lt::shown_names(&user, id, &ended.users);
    let ex = Extraction {
        user,
        user_name,
        session,
        began_ms,
        until: ended.first_seq + ended.contents.len() as u64,
        messages,
    };
    drop(extract(Arc::clone(long_term), None, ex));
}
