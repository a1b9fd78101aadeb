//! The request's way to the upstream and back: the upstream client and its
//! slots, the vendor body, the relay of the answer (SSE parsed once), the
//! cut and the drain, the answer cache, and the built-in mock upstream.

pub use recall_core::exchange::{accumulate, cut, protocol};
pub mod cache;
pub mod client;
pub mod gate;
pub mod idle;
pub mod mock;
pub mod relay;
pub mod upstream;
