//! The time the service decides at: the store's own clock, or a time set by hand in tests.
//!
//! In service, decisions are made at the store's time (Redis `TIME`, one clock for every
//! instance; the system clock for the embedded store), so a plan carries no time at all. Tests
//! that drive time set it on the service's clock once ([`Clock::set`]), and every plan and every
//! answer this instance gives itself (a fail mode's, a cached denial's) reads it from there.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::store::memory::system_now_us;

/// The service's clock (see the module documentation).
#[derive(Debug, Default)]
pub struct Clock {
    /// The time set by hand (µs), or 0 for the store's clock.
    manual_us: AtomicU64,
}

impl Clock {
    /// The store's clock.
    pub fn store() -> Self {
        Self::default()
    }

    /// Sets the time by hand to `at_us` (µs, at least 1) from now on.
    pub fn set(&self, at_us: u64) {
        self.manual_us.store(at_us.max(1), Ordering::Relaxed);
    }

    /// The time a plan names: `None` for the store's own clock.
    pub fn at_us(&self) -> Option<u64> {
        match self.manual_us.load(Ordering::Relaxed) {
            0 => None,
            at => Some(at),
        }
    }

    /// The time for an answer this instance gives itself: the time set by hand, or the system
    /// clock.
    pub fn now_us(&self) -> u64 {
        self.at_us().unwrap_or_else(system_now_us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_clock_names_no_time_and_a_manual_one_its_own() {
        let clock = Clock::store();
        assert_eq!(clock.at_us(), None);
        assert!(clock.now_us() > 1_600_000_000_000_000, "the system clock");
        clock.set(7);
        assert_eq!((clock.at_us(), clock.now_us()), (Some(7), 7));
        clock.set(0);
        assert_eq!(clock.at_us(), Some(1), "0 is not the store's clock");
    }
}
