//! A chat completions request as the client sent it: its body parsed
//! and checked in one pass where it can be (`one_pass`), by the general
//! reading where it cannot, to the same answer.

pub mod one_pass;
pub mod request;

pub use request::{parse_request, ChatRequest};
