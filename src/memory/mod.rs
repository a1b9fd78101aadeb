//! Sessions and what they remember: the plain data and decisions are
//! `recall_core::memory`'s (re-exported here); this crate adds the state
//! (a session, the reply in flight).

pub use recall_core::memory::{
    chain, interruption, long_term, message, reconcile, render, summary, text, tokens, turns,
    window,
};

pub mod inflight;
pub mod session;
