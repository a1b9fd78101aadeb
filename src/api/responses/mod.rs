//! The Responses and Conversations APIs over any chat-completions
//! upstream, on the chat path:
//! - `create`: `POST /v1/responses`; `read`: `GET`/`DELETE` and
//!   `input_items`; `conversations`: conversations as sessions;
//! - `request`: a Responses request body as a chat request body, and what
//!   it asks of recall's state (`previous_response_id`, `conversation`,
//!   `store`);
//! - `completion`: a chat completion read for its Response;
//! - `response`: the Response, written, its `usage` in `usage`;
//!   `answer`: the chat path's answer as a Response or as the event
//!   stream (`events`);
//! - `items`: stored messages as items; `ids`: ids that name their
//!   session.

mod answer;
pub mod completion;
pub mod conversations;
mod create;
pub mod events;
pub mod ids;
pub mod items;
mod read;
pub mod request;
pub mod response;
pub mod usage;

pub use create::create;
pub use read::{delete, get, input_items};

#[cfg(test)]
mod tests;
