//! The decision logic of every algorithm, as pure functions.
//!
//! Each algorithm module exposes `acquire(state, params, cost, now_us) -> Outcome`: no I/O, no
//! clock reads, no allocation beyond the state it owns. The embedded store runs these functions
//! directly; the Lua scripts in `lua/` implement the same arithmetic on Redis, and the property
//! tests hold the two to identical answers on the same inputs.
//!
//! Shared rules, which every algorithm follows and the Lua scripts copy:
//! - time is integer microseconds; a `now` earlier than the time stored in the state is treated
//!   as the stored time, so a clock step back never refunds quota or reopens a window;
//! - a denied request changes no counter (the sliding log may drop entries that have left the
//!   window, which does not change what is allowed);
//! - callers guarantee `1 <= cost <= limit` (the API rejects larger costs before they get here);
//! - durations are measured from the caller's `now`, so a clock that stepped back gets waits that
//!   are long enough on its own clock.

pub mod arith;
pub mod fixed_window;
pub mod gcra;
pub mod sliding_window_counter;
pub mod sliding_window_log;
pub mod token_bucket;

/// The longest wait reported, in microseconds (2^50 µs, about 35.7 years). Larger waits (a huge
/// bucket refilled once a month) are reported as this, identically in Rust and in Lua.
pub const MAX_WAIT_US: u64 = 1 << 50;

/// The answer to one acquire. A denial is a decision like any other, not an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the units were granted.
    pub allowed: bool,
    /// Units still available after this call (never negative).
    pub remaining: u64,
    /// Time until the subject is back to its full quota, if nothing else arrives.
    pub reset_after_us: u64,
    /// Zero when allowed; otherwise the time until the same request would be allowed.
    pub retry_after_us: u64,
}

/// The result of one pure decision: the answer, and what the store must keep.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome<S> {
    pub decision: Decision,
    /// The state to keep, or `None` when the subject has no state worth keeping.
    pub state: Option<S>,
    /// `Some(ttl)`: the state was written and may be dropped `ttl` µs from now, when it no longer
    /// changes any answer. `None`: keep the previous expiry (nothing was consumed).
    pub ttl_us: Option<u64>,
}

/// `target - now`, or zero when `target` has passed.
pub(crate) fn until(target: u64, now: u64) -> u64 {
    target.saturating_sub(now)
}
