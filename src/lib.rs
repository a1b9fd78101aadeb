//! recall: an OpenAI-compatible proxy that gives AI agents short-term memory.
//!
//! Three crates, bottom up (see ARCHITECTURE.md): `recall_core` (plain data
//! and pure decisions, re-exported here as `config`, `clock`, `json` and
//! inside `memory` and `proxy`), `recall_store` (storage, as `store`), and
//! this one. Here, bottom up: the edges (`metrics`, `webhook`, `proxy`,
//! `models`), the state (`memory`: a session and its reply in flight), the
//! exchange (`relay`), the background jobs (`summarizer`, `long_term`), and
//! the HTTP (`api`, `console`, `server`).

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
pub mod relay;
pub mod server;
pub use recall_store as store;
pub mod summaries;
pub mod webhook;

pub use config::Config;
pub use server::app::App;
pub use server::serve::{router, serve};
