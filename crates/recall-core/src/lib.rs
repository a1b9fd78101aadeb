//! recall's core: the plain data and the pure decisions, with no I/O.
//! The configuration, messages and how a request is reconciled with a
//! history, what the upstream is sent (render, window, tokens, the vendor
//! body), turns, interruptions, the running summary and long-term memory
//! as data, and how an answer is read (SSE, a completion, a cut). The
//! server crate (`recall`) holds the state, the I/O and the HTTP; this
//! crate cannot reach them (it has no tokio, axum, HTTP client or storage
//! among its dependencies).

pub mod chat;
pub mod clock;
pub mod config;
pub mod error;
pub mod exchange;
#[doc(hidden)]
pub mod fuzzing;
pub mod json;
pub mod memory;
pub mod responses;

pub use config::Config;
