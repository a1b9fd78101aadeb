//! The Responses and Conversations APIs over any chat-completions
//! upstream, on the chat path:
//! - `create`: `POST /v1/responses`, its own open stage in `open`; `read`: `GET`/`DELETE` and
//!   `input_items`; `conversations`: conversations as sessions;
//! - `answer`: the chat path's answer as a Response or as the event
//!   stream;
//! - the translations (request, completion, response, usage, events,
//!   items, ids) are plain data, the core's `responses`.

mod answer;
pub mod conversations;
mod create;
mod open;
mod read;

pub use create::create;
pub use read::{delete, get, input_items};
pub use recall_core::responses::{completion, events, ids, items, request, response, usage};
