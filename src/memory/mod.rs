//! Sessions and what they remember: messages, how a request is reconciled
//! with the history, what the upstream is sent (render, window, tokens),
//! turns, interruptions, the reply in flight, and how sessions end.

pub mod chain;
pub mod inflight;
pub mod interruption;
pub mod lifecycle;
pub mod long_term;
pub mod message;
pub mod reconcile;
pub mod render;
pub mod session;
pub mod summary;
pub mod text;
pub mod tokens;
pub mod turns;
pub mod window;
