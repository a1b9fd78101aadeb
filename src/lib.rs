//! recall: an OpenAI-compatible proxy that gives AI agents short-term memory.
//!
//! The request path, top to bottom (see ARCHITECTURE.md):
//! `api` (route, parse) → `session` (lookup, turn lock) → `reconcile` →
//! `render` (render + window + grammar) → `vendor` (rewrite) → `upstream`
//! (`gate`: a slot under `max_concurrent`) → `relay` (stream + record).
//! `reconcile`, `render`, `window`, `turns`, `vendor` and `accumulate` are pure.

pub mod accumulate;
pub mod api;
pub mod app;
pub mod auth;
pub mod cache;
pub mod clock;
pub mod config;
pub mod cut;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod gate;
pub mod idle;
pub mod inflight;
pub mod interruption;
pub mod lifecycle;
pub mod message;
pub mod metrics;
pub mod mock;
pub mod reconcile;
pub mod relay;
pub mod render;
pub mod session;
pub mod storage;
pub mod threads;
pub mod tokens;
pub mod turns;
pub mod upstream;
pub mod vendor;
pub mod webhook;
pub mod window;

pub use app::{router, serve, App};
pub use config::Config;
