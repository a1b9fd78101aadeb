//! recall: an OpenAI-compatible proxy that gives AI agents short-term memory.
//!
//! The request path, top to bottom (see ARCHITECTURE.md):
//! `api` (route, parse) → `session` (lookup, turn lock) → `reconcile` →
//! `render` (render + window + grammar) → `vendor` (rewrite) → `upstream`
//! (`gate`: a slot under `max_concurrent`) → `relay` (stream + record).
//! `reconcile`, `render`, `window`, `turns`, `vendor` and `accumulate` are pure.

pub mod api;
pub use recall_core::{clock, config, json};
pub mod console;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod long_term;
pub mod memory;
pub mod metrics;
pub mod models;
pub mod proxy;
pub mod server;
pub mod store;
pub mod summarizer;
pub mod webhook;

pub use config::Config;
pub use server::app::App;
pub use server::serve::{router, serve};
