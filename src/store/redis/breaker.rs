//! A circuit breaker in front of a store.
//!
//! While Redis is unreachable every call would wait its full deadline; after `threshold`
//! consecutive failures the breaker opens and calls fail at once, so each policy's fail mode
//! answers without delay. After `cooldown` one call is let through as a probe (half-open): its
//! success closes the breaker, its failure opens it for another cooldown. Only failures to reach
//! the store count; an error the store answers with (a script error, out of memory) proves it is
//! reachable. The breaker remembers why the last call failed, so that the calls it answers while
//! open still say what is wrong (a wrong password, a refused connection), not only that it is
//! open.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The breaker's state, as reported by metrics and `/readyz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    HalfOpen,
    Open,
}

impl BreakerState {
    pub const fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::HalfOpen => "half_open",
            BreakerState::Open => "open",
        }
    }
}

pub struct Breaker {
    threshold: u32,
    cooldown: Duration,
    epoch: Instant,
    failures: AtomicU32,
    /// Microseconds after `epoch` until which the breaker is open; 0 when closed.
    open_until_us: AtomicU64,
    /// A probe is under way (half-open); other calls keep failing fast meanwhile.
    probing: AtomicBool,
    /// Why the last call that could not reach the store failed.
    cause: Mutex<Option<String>>,
}

/// Permission to make one call; report how it went with [`Breaker::record`].
#[derive(Debug)]
#[must_use]
pub struct Permit {
    probe: bool,
}

impl Breaker {
    pub fn new(threshold: u32, cooldown: Duration) -> Self {
        Self {
            threshold: threshold.max(1),
            cooldown,
            epoch: Instant::now(),
            failures: AtomicU32::new(0),
            open_until_us: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            cause: Mutex::new(None),
        }
    }

    /// A new, closed breaker with this one's threshold and cooldown.
    pub fn like(&self) -> Self {
        Self::new(self.threshold, self.cooldown)
    }

    /// Remembers why a call could not reach the store (only failures take the lock).
    pub fn set_cause(&self, cause: String) {
        *self.cause.lock().unwrap_or_else(|e| e.into_inner()) = Some(cause);
    }

    /// Why the last call that could not reach the store failed.
    pub fn cause(&self) -> Option<String> {
        self.cause.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// A permit to call the store, or `None` while the breaker is open.
    pub fn permit(&self) -> Option<Permit> {
        let open_until = self.open_until_us.load(Ordering::Acquire);
        if open_until == 0 {
            return Some(Permit { probe: false });
        }
        if self.now_us() < open_until {
            return None;
        }
        // Cooled down: exactly one caller probes.
        self.probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| Permit { probe: true })
    }

    /// Reports the outcome of a permitted call: `reached` is false when the store could not be
    /// reached (refused, reset, timed out).
    pub fn record(&self, permit: Permit, reached: bool) {
        if reached {
            self.failures.store(0, Ordering::Release);
            if permit.probe || self.open_until_us.load(Ordering::Acquire) != 0 {
                self.open_until_us.store(0, Ordering::Release);
                tracing::info!("store reachable again: circuit breaker closed");
            }
        } else {
            let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
            if permit.probe || failures >= self.threshold {
                let until = self.now_us()
                    + u64::try_from(self.cooldown.as_micros()).unwrap_or(u64::MAX / 2);
                if self.open_until_us.swap(until.max(1), Ordering::AcqRel) == 0 {
                    let cause = self.cause().unwrap_or_default();
                    tracing::warn!(failures, %cause, "store unreachable: circuit breaker open");
                }
            }
        }
        if permit.probe {
            self.probing.store(false, Ordering::Release);
        }
    }

    /// Hands back a permit whose call was cancelled before it could tell anything: it counts
    /// neither way, and a probe's slot is freed for the next caller.
    pub fn abandon(&self, permit: Permit) {
        if permit.probe {
            self.probing.store(false, Ordering::Release);
        }
    }

    pub fn state(&self) -> BreakerState {
        let open_until = self.open_until_us.load(Ordering::Acquire);
        if open_until == 0 {
            BreakerState::Closed
        } else if self.now_us() < open_until && !self.probing.load(Ordering::Acquire) {
            BreakerState::Open
        } else {
            BreakerState::HalfOpen
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_and_probes_after_the_cooldown() {
        let b = Breaker::new(3, Duration::from_millis(30));
        for _ in 0..2 {
            let p = b.permit().expect("closed");
            b.record(p, false);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        let p = b.permit().expect("closed");
        b.record(p, false);
        assert_eq!(b.state(), BreakerState::Open);
        assert!(b.permit().is_none(), "open: fail fast");

        std::thread::sleep(Duration::from_millis(40));
        let probe = b.permit().expect("one probe after the cooldown");
        assert!(b.permit().is_none(), "only one probe at a time");
        b.record(probe, false);
        assert_eq!(b.state(), BreakerState::Open, "a failed probe reopens");

        std::thread::sleep(Duration::from_millis(40));
        let probe = b.permit().expect("probe");
        b.record(probe, true);
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.permit().is_some());
    }

    #[test]
    fn an_abandoned_probe_lets_the_next_caller_probe() {
        let b = Breaker::new(1, Duration::from_millis(10));
        let p = b.permit().expect("closed");
        b.record(p, false);
        std::thread::sleep(Duration::from_millis(20));
        let probe = b.permit().expect("a probe after the cooldown");
        assert!(b.permit().is_none(), "one probe at a time");
        // Its caller went away before the answer.
        b.abandon(probe);
        let probe = b.permit().expect("the next caller probes");
        b.record(probe, true);
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn a_success_resets_the_failure_count() {
        let b = Breaker::new(2, Duration::from_secs(60));
        let p = b.permit().expect("closed");
        b.record(p, false);
        let p = b.permit().expect("closed");
        b.record(p, true);
        let p = b.permit().expect("closed");
        b.record(p, false);
        assert_eq!(b.state(), BreakerState::Closed);
    }
}
