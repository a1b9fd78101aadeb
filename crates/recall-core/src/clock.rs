//! Wall-clock time in milliseconds, as records and sessions store it.
//!
//! The session layer reads the time through its `Policy`'s `Clock`, so
//! that a test can hold it still or move it (expiry, timestamps) without
//! sleeping.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// The system's clock, or one a test sets.
#[derive(Debug, Clone, Default)]
pub enum Clock {
    #[default]
    System,
    Manual(Arc<AtomicI64>),
}

impl Clock {
    /// A clock that reads `at_ms` until it is set or advanced.
    pub fn manual(at_ms: i64) -> Self {
        Clock::Manual(Arc::new(AtomicI64::new(at_ms)))
    }

    pub fn now_ms(&self) -> i64 {
        match self {
            Clock::System => now_ms(),
            Clock::Manual(at) => at.load(Ordering::Relaxed),
        }
    }

    /// Moves a manual clock on; the system clock moves by itself.
    pub fn advance(&self, ms: i64) {
        if let Clock::Manual(at) = self {
            at.fetch_add(ms, Ordering::Relaxed);
        }
    }
}

/// The system's time: where no session policy is at hand (request
/// arrival, webhook ids, the sweeper's tick).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// 9999-12-31T23:59:59.999Z: the last time an HTTP date can show.
pub const LAST_MS: i64 = 253_402_300_799_999;

/// A Unix time in ms as an HTTP date (`Mon, 08 May 2023 13:56:00 GMT`);
/// none outside the years 1970 to 9999, which httpdate does not format
/// (and panics past): clients set timestamps.
pub fn http_date(ms: i64) -> Option<String> {
    if !(0..=LAST_MS).contains(&ms) {
        return None;
    }
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms as u64);
    Some(httpdate::fmt_http_date(at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let c = Clock::manual(1_000);
        assert_eq!(c.now_ms(), 1_000);
        c.advance(250);
        assert_eq!(c.clone().now_ms(), 1_250);
        assert!(Clock::System.now_ms() > 1_600_000_000_000);
    }
}
