//! What a session remembers, as plain data and pure decisions: messages,
//! how a request is reconciled with the history, what the upstream is
//! sent (render, window, tokens), turns, interruptions, responses in a
//! history, the running summary and long-term memory.

pub mod chain;
pub mod interruption;
pub mod long_term;
pub mod message;
pub mod reconcile;
pub mod render;
pub mod session_id;
pub mod summary;
pub mod text;
pub mod tokens;
pub mod turns;
pub mod window;
