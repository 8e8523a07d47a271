//! Concurrency limits: at most `limit` units held at once, by leases that expire when their
//! holder neither renews nor releases them.
//!
//! A rate limit bounds how often; this bounds how many at once (exports running per customer,
//! open streams per API key). Each lease holds `cost` units until it is released, or until its
//! expiry passes: a holder that dies frees its slot at the expiry, never later. A lease is named
//! within its subject by a member string, `<32 hex digits>:<cost>`, that the service draws at
//! random; its expiry is renewed from now by a renewal.
//!
//! The decision is [`decide`], a pure function of the subject's leases, the call and the time;
//! `lua/concurrency.lua` makes the same decisions on Redis, with Redis's clock, and the tests
//! hold the two to identical answers.

use std::collections::BTreeMap;

/// The largest `limit`: it bounds a subject's leases (each holds at least one unit).
pub const MAX_LIMIT: u64 = 10_000;
/// The longest `lease_ms`, one day: a holder that needs longer renews.
pub const MAX_LEASE_MS: u64 = 86_400_000;

/// A concurrency limit's validated parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Units held at once, at most.
    pub limit: u64,
    /// A lease's lifetime when the call names none, in µs.
    pub lease_us: u64,
}

/// What a lease call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseOp {
    /// Take a new lease of `cost` units for `lease_us`, if they fit.
    Take,
    /// Extend a live lease to `lease_us` from now.
    Renew,
    /// End a lease, live or not.
    Release,
    /// Say whether `cost` units would fit now, writing nothing.
    Look,
}

impl LeaseOp {
    pub const fn as_str(self) -> &'static str {
        match self {
            LeaseOp::Take => "take",
            LeaseOp::Renew => "renew",
            LeaseOp::Release => "release",
            LeaseOp::Look => "look",
        }
    }
}

/// One lease call on one subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseCall<'a> {
    pub op: LeaseOp,
    /// The lease's member string, `<32 hex digits>:<cost>` (unused by `Look`).
    pub member: &'a str,
    /// Units the lease holds (`Take`, `Look`).
    pub cost: u64,
    /// The lifetime to give the lease from now (`Take`, `Renew`), in µs.
    pub lease_us: u64,
    /// The policy's `limit` now (it may have been lowered below what is held).
    pub limit: u64,
}

/// The answer to one lease call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseAnswer {
    /// `Take`: granted. `Renew`: the lease was live, and now expires `expires_in_us` from now.
    /// `Release`: the lease was live (and is no more). `Look`: `cost` would fit.
    pub ok: bool,
    /// Units held by live leases after the call.
    pub in_use: u64,
    /// `Take` or `Renew` that succeeded: the lease's expiry, from now. Otherwise 0.
    pub expires_in_us: u64,
    /// `Take` denied, or `Look` that would be: the time until the earliest live lease expires,
    /// an upper bound on the wait (a release may free a slot sooner). Otherwise 0.
    pub retry_after_us: u64,
    /// Leases this call found expired and dropped (a holder that died or forgot). `Look`
    /// drops nothing.
    pub expired: u64,
    /// The decision's time, µs.
    pub at_us: u64,
}

/// One subject's leases: member string to `(expiry µs, cost)`, live or expired but not dropped
/// yet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    pub leases: BTreeMap<String, (u64, u64)>,
}

/// Decides one lease call on a subject's leases at `now_us`: what to keep (`None`: no leases
/// left, the key is deleted), the answer, and the key's new expiry from now (`Some(ttl)`: when
/// its last lease would expire; `None`: unchanged).
pub fn decide(
    state: Option<State>,
    call: &LeaseCall<'_>,
    now_us: u64,
) -> (Option<State>, LeaseAnswer, Option<u64>) {
    let _ = (call, now_us);
    (
        state,
        LeaseAnswer {
            ok: false,
            in_use: 0,
            expires_in_us: 0,
            retry_after_us: 0,
            expired: 0,
            at_us: now_us,
        },
        None,
    )
}
