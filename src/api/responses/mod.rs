//! The Responses API over any chat-completions upstream (issue 17), built
//! in steps. This one: the translations, pure and unit-tested, not yet
//! routed.
//! - `request`: a Responses request body as a chat request body, and what
//!   it asks of recall's state (`previous_response_id`, `conversation`,
//!   `store`);
//! - `response`: a chat completion as a Response object;
//! - `events`: a chat stream's chunks as the Responses event stream.
//!
//! Still to come: the handlers (`POST /v1/responses` through the chat
//! path, `GET`/`DELETE` and `input_items`), responses kept in sessions
//! (a chain is a session, a fork shares its parent's prefix), and the
//! Conversations API.

mod answer;
pub mod conversations;
mod create;
pub mod events;
pub mod ids;
pub mod items;
mod read;
pub mod request;
pub mod response;

pub use create::create;
pub use read::{delete, get, input_items};

#[cfg(test)]
mod tests;
