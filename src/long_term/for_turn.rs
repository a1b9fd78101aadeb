//! Long-term memory in a turn: the facts it sends (the session's last
//! search, its user's newest records at first, or with `retrieve =
//! "inline"` a search within `inline_timeout_ms`), and the jobs it starts.

use std::sync::Arc;
use std::time::Duration;

use crate::config::Retrieve;
use crate::long_term::jobs;
use crate::memory::long_term as lt;
use crate::memory::message::Message;
use crate::memory::session::LongTermDue;
use crate::server::app::App;

/// The system message of the facts turn `due` of session `id` sends, if
/// any; starts the extraction and the search it leaves.
pub(crate) async fn for_turn(app: &Arc<App>, id: &str, due: LongTermDue) -> Option<Message> {
    let long_term = app.long_term.as_ref()?;
    let session = app.sessions.get(id)?;
    let Some(user) = due.user else {
        // A turn without a user sends no facts: the console says so.
        session.facts_sent(None);
        return None;
    };
    if let Some(ex) = due.extract {
        drop(jobs::extract(
            Arc::clone(long_term),
            Some(Arc::clone(&session)),
            ex,
        ));
    }
    let config = &long_term.config;
    let within = Duration::from_millis(config.inline_timeout_ms);
    let mut facts = due.facts;
    if facts.is_none() {
        // A session's first turn here: a read of the user's records, which
        // a process serves from its cache once it has read them; bounded,
        // as a storage that is slow now must not hold the turn.
        match tokio::time::timeout(within, long_term.recent(&user)).await {
            Ok(Ok(recent)) => session.start_recalled(&user, recent),
            Ok(Err(e)) => tracing::warn!(error = %e, "the user's records could not be read"),
            Err(_) => tracing::warn!("the user's records were not read in time"),
        }
        facts = session.recalled_facts(&user);
    }
    if let Some(query) = due.query {
        let searching = jobs::recall(
            Arc::clone(long_term),
            Arc::clone(&session),
            user.clone(),
            query,
        );
        // Inline: the turn waits for the search, for a while; else (or
        // past that) its result is for the next turn.
        if let (Retrieve::Inline, Some(heard)) = (config.retrieve, searching) {
            if let Ok(Ok(())) = tokio::time::timeout(within, heard).await {
                facts = session.recalled_facts(&user);
            }
        }
    }
    let template = &long_term.config.template;
    let message = facts
        .as_deref()
        .and_then(|f| lt::facts_message(template, f));
    // What the console shows as sent on the last turn.
    session.facts_sent(message.as_ref().and(facts));
    message
}
