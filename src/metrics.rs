//! Counters the proxy keeps about itself. They are exported as metrics by
//! a later layer; for now they are read by tests and logs.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Counters {
    trimmed_sent: AtomicU64,
    trimmed_kept: AtomicU64,
}

impl Counters {
    /// Messages left out of an upstream window.
    pub fn add_trimmed_sent(&self, n: usize) {
        self.trimmed_sent.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Messages dropped from a session because it was over `max_messages`.
    pub fn add_trimmed_kept(&self, n: usize) {
        self.trimmed_kept.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn trimmed_sent(&self) -> u64 {
        self.trimmed_sent.load(Ordering::Relaxed)
    }

    pub fn trimmed_kept(&self) -> u64 {
        self.trimmed_kept.load(Ordering::Relaxed)
    }
}
