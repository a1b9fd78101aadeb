//! The Responses API as plain data over chat completions: what the
//! server's `api/responses/` (the handlers, the sessions they pick)
//! translates with.
//! - `request`: a Responses request body as a chat request body, and what
//!   it asks of recall's state (`previous_response_id`, `conversation`,
//!   `store`);
//! - `completion`: a chat completion read for its Response;
//! - `response`: the Response, written, its `usage` in `usage`;
//!   `events`: a chat stream as the Responses event stream;
//! - `items`: stored messages as items; `ids`: ids that name their
//!   session.

pub mod completion;
pub mod events;
pub mod ids;
pub mod items;
pub mod request;
pub mod response;
pub mod usage;

#[cfg(test)]
mod tests;
