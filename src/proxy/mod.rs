//! The upstream edge: an upstream (its protocol, URL, key and client
//! pools), the HTTP client, the slots a call waits for (gate), a body's
//! idle limit, the answer cache, and the built-in mock upstream. The
//! exchange itself, relayed and reported to its session, is `relay`.

pub use recall_core::exchange::{accumulate, cut, protocol};
pub mod cache;
pub mod client;
pub mod gate;
pub mod idle;
pub mod mock;
pub mod upstream;
