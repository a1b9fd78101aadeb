//! Instructions: what goes before the conversation, in order: the
//! configured instructions, the session's system messages, the running
//! summary and carried note within their budget, the user's long-term
//! facts, then the client's own.

use super::open::Opened;
use super::Plan;
use crate::memory::message::Message;
use crate::server::app::App;

pub(super) fn assemble(app: &App, plan: &mut Plan, opened: &mut Opened) -> Vec<Message> {
    app.instructions
        .iter()
        .cloned()
        .chain(std::mem::take(&mut opened.prepared.system_messages))
        .chain(crate::summaries::turn::injected(
            &app.config.memory,
            &opened.prepared.remembered,
        ))
        .chain(opened.facts.take())
        .chain(std::mem::take(&mut plan.instructions))
        .collect()
}
