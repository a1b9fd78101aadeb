//! The integration tests, one binary: each file is a module, `common` the
//! harness they share (a scripted upstream, recall on an ephemeral port).
//! One binary links recall once, where a binary per file linked it 32 times.

mod common;

mod auth;
mod bad_input;
mod behaviours;
mod cache;
mod carry_over;
mod cluster;
mod console;
mod durability;
mod errors;
mod failover;
mod fidelity;
mod fuzz_corpus;
mod interruptions;
mod lifecycle;
#[cfg(feature = "local-embedder")]
mod local_embedder;
mod long_term;
mod memory;
mod memory_eval;
mod memory_quality;
mod mock_upstream;
mod observability;
mod properties;
mod redis_faults;
mod replicas;
mod responses;
mod session_api;
mod soak;
mod storage_faults;
mod streaming;
mod summaries;
mod upstream_faults;
mod upstream_limit;
mod upstream_proxy;
mod upstream_slots;
mod vendor;
mod window_tokens;
