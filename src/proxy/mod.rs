//! The request's way to the upstream and back: the upstream client and its
//! slots, the vendor body, the relay of the answer (SSE parsed once), the
//! cut and the drain, the answer cache, and the built-in mock upstream.

pub mod accumulate;
pub mod cache;
pub mod client;
pub mod cut;
pub mod gate;
pub mod idle;
pub mod mock;
pub mod relay;
pub mod upstream;
pub mod vendor;
