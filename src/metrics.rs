//! Counters the proxy keeps about itself. They are exported as metrics by
//! a later layer; for now they are read by tests and logs.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::window::{TrimReason, TrimScope};

#[derive(Debug, Default)]
pub struct Counters {
    /// Messages trimmed, by scope (window, history) and reason (count, chars).
    trimmed: [[AtomicU64; 2]; 2],
    sessions_ended: AtomicU64,
    cache_hits: AtomicU64,
}

impl Counters {
    pub fn add_trimmed(&self, scope: TrimScope, reason: TrimReason, n: usize) {
        self.trimmed[scope as usize][reason as usize].fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn trimmed(&self, scope: TrimScope, reason: TrimReason) -> u64 {
        self.trimmed[scope as usize][reason as usize].load(Ordering::Relaxed)
    }

    /// Messages left out of upstream windows, for any reason.
    pub fn trimmed_sent(&self) -> u64 {
        self.trimmed[TrimScope::Window as usize]
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// Messages dropped from sessions over `max_messages`.
    pub fn trimmed_kept(&self) -> u64 {
        self.trimmed(TrimScope::History, TrimReason::MaxMessages)
    }

    pub fn session_ended(&self) {
        self.sessions_ended.fetch_add(1, Ordering::Relaxed);
    }

    pub fn sessions_ended(&self) -> u64 {
        self.sessions_ended.load(Ordering::Relaxed)
    }

    pub fn cache_hit(&self) {
        self.cache_hits.fetch_add(1, Ordering::Relaxed);
    }

    pub fn cache_hits(&self) -> u64 {
        self.cache_hits.load(Ordering::Relaxed)
    }
}
