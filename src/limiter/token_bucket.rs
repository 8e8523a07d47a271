//! Token bucket: `capacity` tokens, starting full, refilled continuously at `refill_tokens` per
//! `refill_period_us`.
//!
//! The level is kept exactly as whole tokens plus a fraction `fraction / refill_period_us`, with
//! the rate reduced by its greatest common divisor. Refill is `elapsed * refill_tokens` in those
//! units, so no tokens are lost to rounding however often the bucket is looked at (the classic
//! float script drifts). A `now` earlier than the last update (the clock stepped back) refills
//! nothing and never takes tokens away. All times below are measured at `t = max(now,
//! updated)` and reported from the caller's `now` (plus `t - now`).
//!
//! Debt ([`super::Rule::report`]). A report takes its tokens whether they are there or not, so
//! the whole-token level is signed: it may fall below zero, down to `-capacity` (usage of twice
//! the capacity, the shared bound), and a report records `min(cost, capacity + tokens)`. Time
//! repays debt at the refill rate like any other missing token: an acquire of `cost` waits for
//! the level to climb back to `cost`, `retry_after` being that exact time, and `remaining` is 0
//! while the level is below one token. Every product stays exact: the tokens missing from full
//! are at most `2 * capacity <= 2 * 10^9 < 2^31`, within what `muldiv` in `lua/muldiv.lua`
//! multiplies exactly. (A capacity lowered by a policy change may leave an older, deeper debt,
//! below `-capacity` of the new one but never below `-capacity` of the state's own, so the
//! tokens missing stay within that bound; it is repaid as it stands, and reports record nothing
//! until it is back within the bound.)
//!
//! Refund ([`super::Rule::refund`]). Gives back whole tokens, at most the ones in use
//! (`capacity - tokens`); a bucket brought back to `capacity` drops its fraction, so the level
//! is never above full. A ticket's mark is the time the bucket would have been full after its
//! take: by `t`, time has refilled all but `(mark - t) * refill_tokens / refill_period_us` of
//! the tokens that take used (none once `mark <= t`), so no more are given back, rounded up to
//! a whole token: a refund right after its take gives all of it back rather than one less for
//! the sliver refilled meanwhile (at most that sliver, less than a token, is given twice). (`mark - t` is capped at [`MAX_WAIT_US`], which no take's reset exceeds, so that any mark
//! stays exact in Lua; a take that leaves the bucket full only further away has a held mark
//! instead, which [`super::undrained`] reads.) A refund rewrites the level but keeps the key's expiry: the bucket is
//! only fuller, so it is full again before the old expiry.
//!
//! A take's tokens are the last to refill after it, so a refund of an earlier take moves them
//! up: the state keeps its [`Life`] (when the bucket was last found full, and the tokens refunds
//! have given back since), a ticket keeps the count as its take left it, and a refund gives
//! back no more than the mark says less what every refund since gave back, and nothing for a
//! take from before the life began ([`super::undrained`]). A count rounded up from part of a
//! token, given back whole, takes that part of the level's fraction with it, so that it is not
//! given twice.
//!
//! A change of parameters (a capacity or a rate changed by a policy update, an override or a
//! tier): the tokens missing from full carry over, whatever the capacity (ADDITIVE: a subject
//! that spent 5 of 22 has 57 of 62 once raised, and 0 of 4 once lowered, in debt by 1). The
//! state says the capacity and the rate it was written under, and its level refills at that
//! rate, up to that capacity, until a take or a report rewrites it under the parameters
//! decided; a peek, a denial and a refund leave it in its own terms, so that their waits are
//! the times the level reaches them at the rate it refills at, and the key expires exactly when
//! it is full, as a missing key is (a full bucket at any capacity). Whatever the parameters, a
//! state past its expiry answers as no state. Not exact: a rewrite at another rate drops the
//! part of a token refilled so far (it is counted in the old period), so the subject may wait
//! up to one token's time longer. Keys of the layout before (five fields, no capacity) are read
//! as written under the capacity decided.

use super::arith::{gcd, muldiv};
use super::{undrained, Decision, Life, Mark, Outcome, MAX_WAIT_US};

/// Validated parameters; the rate `refill_tokens / refill_period_us` is in lowest terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub capacity: u64,
    pub refill_tokens: u64,
    pub refill_period_us: u64,
}

impl Params {
    /// Parameters from a policy's fields, the rate reduced to lowest terms.
    pub fn new(capacity: u64, refill_tokens: u64, refill_period_us: u64) -> Self {
        let g = gcd(refill_tokens, refill_period_us).max(1);
        Self {
            capacity,
            refill_tokens: refill_tokens / g,
            refill_period_us: refill_period_us / g,
        }
    }
}

/// What is kept per subject. A missing state is a full bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// Whole tokens, from `-capacity` (in debt after a report) to `capacity`.
    pub tokens: i64,
    /// Part of the next token, in units of `1 / refill_period_us`; always below the period.
    pub fraction: u64,
    pub updated_us: u64,
    /// The reduced rate this level refills at until a take or a report rewrites it under other
    /// parameters (see the module doc).
    pub refill_tokens: u64,
    pub refill_period_us: u64,
    /// The capacity this level is measured against: the tokens missing from full are
    /// `capacity - tokens`, whatever the capacity decided. (Keys written before this field
    /// existed are read as written under the capacity decided.)
    pub capacity: u64,
    /// When this level's [`Life`] began, and the units refunds have given back since, which
    /// tickets' marks are read against.
    pub since_us: u64,
    pub refunded: u64,
}

impl super::Rule for Params {
    const NAME: &'static str = "token_bucket";
    const FIELDS: &'static [super::Field] = &[
        super::Field {
            name: "capacity",
            min: 1,
            max: super::MAX_UNITS,
            doc: "tokens the bucket holds; it starts full",
            example: 20,
        },
        super::Field {
            name: "refill_tokens",
            min: 1,
            max: super::MAX_UNITS,
            doc: "tokens added per `refill_period_ms`, continuously",
            example: 10,
        },
        super::Field {
            name: "refill_period_ms",
            min: 1,
            max: super::MAX_PERIOD_MS,
            doc: "the period in milliseconds over which `refill_tokens` are added",
            example: 1_000,
        },
    ];
    const QUOTA_FIELD: &'static str = "capacity";
    type State = State;

    fn per_period(requests: u64, period_ms: u64) -> super::ScriptArgs {
        // A bucket of the whole quota, refilled over the period.
        super::ScriptArgs::new(&[requests, requests, period_ms])
    }

    fn from_fields(values: &[u64]) -> Self {
        let [capacity, refill_tokens, refill_period_ms] = super::fields::<3>(values);
        Self::new(capacity, refill_tokens.max(1), refill_period_ms * 1_000)
    }

    fn window_us(&self) -> u64 {
        // Time to refill from empty.
        let us = u128::from(self.capacity) * u128::from(self.refill_period_us);
        u64::try_from(us.div_ceil(u128::from(self.refill_tokens.max(1)))).unwrap_or(u64::MAX)
    }

    fn decide(&self, state: Option<State>, cost: u64, now_us: u64, take: bool) -> Outcome<State> {
        decide(state, self, cost, now_us, take)
    }

    fn report(&self, state: Option<State>, cost: u64, now_us: u64) -> (Outcome<State>, u64) {
        report(state, self, cost, now_us)
    }

    fn refund(
        &self,
        state: Option<State>,
        units: u64,
        now_us: u64,
        mark: Option<Mark>,
    ) -> (Outcome<State>, u64) {
        refund(state, self, units, now_us, mark)
    }

    fn refunded(state: &State) -> u64 {
        state.refunded
    }

    fn script_args(&self) -> super::ScriptArgs {
        super::ScriptArgs::new(&[self.capacity, self.refill_tokens, self.refill_period_us])
    }

    fn quota(&self) -> u64 {
        self.capacity
    }
}

/// Decides one acquire of `cost` units at `now_us`.
pub fn acquire(state: Option<State>, p: &Params, cost: u64, now_us: u64) -> Outcome<State> {
    decide(state, p, cost, now_us, true)
}

/// Decides whether `cost` units fit at `now_us` and, when they do and `take` is set, takes them.
/// Otherwise nothing is taken and the decision describes the subject as it is: `allowed` says
/// whether the units fit, and `retry_after_us` is 0 when they do (see [`super::Rule::decide`]).
pub fn decide(
    state: Option<State>,
    p: &Params,
    cost: u64,
    now_us: u64,
    take: bool,
) -> Outcome<State> {
    let (level, t) = Level::at(state, p, now_us);
    let skew = t - now_us;

    // A level in debt (negative) admits nothing.
    let admits = u64::try_from(level.available()).is_ok_and(|n| n >= cost);
    if admits && take {
        let native = level.under(p);
        let after = Level {
            // `cost <= tokens <= capacity`, so it is an i64.
            tokens: native.tokens - cost as i64,
            ..native
        };
        let reset = (skew + after.wait_until_full()).min(MAX_WAIT_US);
        Outcome {
            decision: Decision {
                allowed: true,
                remaining: after.remaining(),
                reset_after_us: reset,
                retry_after_us: 0,
            },
            state: Some(after.state(t)),
            ttl_us: Some(reset),
        }
    } else {
        Outcome {
            decision: Decision {
                allowed: admits,
                remaining: level.remaining(),
                reset_after_us: (skew + level.wait_until_full()).min(MAX_WAIT_US),
                retry_after_us: if admits {
                    0
                } else {
                    (skew + level.wait_for(signed(cost))).min(MAX_WAIT_US)
                },
            },
            state,
            ttl_us: None,
        }
    }
}

/// Takes `cost` tokens whether or not they are there ([`super::Rule::report`]): the level may go
/// down to `-capacity`, and tokens past that are not recorded. Returns the outcome and the
/// tokens recorded.
pub fn report(state: Option<State>, p: &Params, cost: u64, now_us: u64) -> (Outcome<State>, u64) {
    let (level, t) = Level::at(state, p, now_us);
    let skew = t - now_us;
    // Room left before usage reaches twice the capacity (none if a lowered capacity left the
    // level deeper than that).
    let room = u64::try_from(signed(p.capacity).saturating_add(level.available())).unwrap_or(0);
    let units = cost.min(room);
    if units == 0 {
        let outcome = Outcome {
            decision: level.describe(skew),
            state,
            ttl_us: None,
        };
        return (outcome, 0);
    }
    let native = level.under(p);
    let after = Level {
        tokens: native.tokens - signed(units),
        ..native
    };
    let decision = after.describe(skew);
    let outcome = Outcome {
        decision,
        state: Some(after.state(t)),
        // Written as a take writes it: kept until the bucket is full again.
        ttl_us: Some(decision.reset_after_us),
    };
    (outcome, units)
}

/// Gives back at most `units` tokens ([`super::Rule::refund`]): never above `capacity`, never to
/// a subject without state, and with `mark` (the time the bucket would be full after the
/// ticket's take) only the tokens of that take that time has not refilled yet. Keeps the
/// expiry, and so the rate and capacity the state was written under (see the module doc).
/// Returns the outcome and the tokens given back.
pub fn refund(
    state: Option<State>,
    p: &Params,
    units: u64,
    now_us: u64,
    mark: Option<Mark>,
) -> (Outcome<State>, u64) {
    // No state is a full bucket: nothing is in use, so nothing is given and nothing is made.
    let (level, t) = Level::at(state, p, now_us);
    let skew = t - now_us;
    // Whole tokens in use: the level is at most full.
    let used = u64::try_from(signed(level.full) - level.tokens).unwrap_or(0);
    let mut give = units.min(used);
    // Whether the part of a token refilled so far goes with what is given (see `undrained`).
    let mut drop_part = false;
    if let Some(mark) = mark {
        // What time has not refilled yet of the take's tokens, rounded up to a whole token: a
        // refund right after its take gives all of it back, not one less for the sliver refilled
        // since (the level is capped at the capacity, so a full bucket gains nothing); moved up
        // by the refunds since; a held mark as `undrained` reads it.
        let held = undrained(mark, t, units, level.rate, level.period, level.life);
        give = give.min(held.units);
        drop_part = held.partial && give == held.units;
    }
    if give == 0 {
        let outcome = Outcome {
            decision: level.describe(skew),
            state,
            ttl_us: None,
        };
        return (outcome, 0);
    }
    let tokens = level.tokens + signed(give);
    let life = level.life.refund(give, t);
    let after = if tokens >= signed(level.full) {
        // Full: the fraction would put the level above the capacity.
        Level {
            tokens: signed(level.full),
            fraction: 0,
            life,
            ..level
        }
    } else {
        Level {
            tokens,
            fraction: if drop_part { 0 } else { level.fraction },
            life,
            ..level
        }
    };
    let outcome = Outcome {
        decision: after.describe(skew),
        state: Some(after.state(t)),
        ttl_us: None,
    };
    (outcome, give)
}

/// A count of tokens as the signed level holds it. Every count here is at most twice
/// [`super::MAX_UNITS`] (capacities, costs, refunds: `min` with the tokens in use), far inside
/// an i64; larger ones saturate.
fn signed(units: u64) -> i64 {
    i64::try_from(units).unwrap_or(i64::MAX)
}

/// The bucket at one time, in the terms of the state it was read from: `tokens + fraction /
/// period` of a bucket of `full` tokens refilled at `rate / period`, with `0 <= fraction <
/// period`. Under the parameters being decided the subject has `extra` more tokens (their
/// capacity minus `full`): the same tokens missing from full.
#[derive(Debug, Clone, Copy)]
struct Level {
    tokens: i64,
    fraction: u64,
    rate: u64,
    period: u64,
    full: u64,
    extra: i64,
    /// Begun afresh when the bucket is full.
    life: Life,
}

impl Level {
    /// The level at `t = max(now_us, updated)`, and `t`: the stored level refilled at its own
    /// rate for the time since its update, capped at its own capacity, or a full bucket of
    /// `p` for no state.
    fn at(state: Option<State>, p: &Params, now_us: u64) -> (Level, u64) {
        let (full, rate, period, mut tokens, mut fraction, updated, life) = match state {
            Some(s) if s.refill_tokens > 0 && s.refill_period_us > 0 => {
                let full = signed(s.capacity);
                let (tokens, fraction) = if s.tokens >= full {
                    (full, 0)
                } else {
                    (s.tokens, s.fraction)
                };
                let (rate, period) = (s.refill_tokens, s.refill_period_us);
                let life = Life {
                    since_us: s.since_us,
                    refunded: s.refunded,
                };
                (
                    s.capacity,
                    rate,
                    period,
                    tokens,
                    fraction,
                    s.updated_us,
                    life,
                )
            }
            _ => (
                p.capacity,
                p.refill_tokens,
                p.refill_period_us,
                signed(p.capacity),
                0,
                now_us,
                Life::at(now_us),
            ),
        };
        let capacity = signed(full);
        let t = now_us.max(updated);
        if tokens < capacity {
            let (q, r) = muldiv(t - updated, rate, period);
            let (q, r) = if r + fraction >= period {
                (q.saturating_add(1), r + fraction - period)
            } else {
                (q, r + fraction)
            };
            // Tokens missing from full: up to twice the capacity in debt.
            let missing = capacity.abs_diff(tokens);
            if q >= missing {
                (tokens, fraction) = (capacity, 0);
            } else {
                // `q < missing`, which fits an i64.
                (tokens, fraction) = (tokens + q as i64, r);
            }
        }
        let level = Level {
            tokens,
            fraction,
            rate,
            period,
            full,
            extra: signed(p.capacity) - capacity,
            life: if tokens >= capacity {
                Life::at(t)
            } else {
                life
            },
        };
        (level, t)
    }

    /// The same level in the terms of `p`, as a take or a report writes it: the same tokens
    /// missing from `p.capacity`; the part of a token refilled so far is dropped when the rate
    /// differs (it is in units of the old period).
    fn under(&self, p: &Params) -> Level {
        let same_rate = self.rate == p.refill_tokens && self.period == p.refill_period_us;
        Level {
            tokens: self.tokens + self.extra,
            fraction: if same_rate { self.fraction } else { 0 },
            rate: p.refill_tokens,
            period: p.refill_period_us,
            full: p.capacity,
            extra: 0,
            life: self.life,
        }
    }

    /// Whole tokens available under the parameters decided: negative in debt.
    fn available(&self) -> i64 {
        self.tokens + self.extra
    }

    /// Whole tokens available: 0 while in debt.
    fn remaining(&self) -> u64 {
        u64::try_from(self.available()).unwrap_or(0)
    }

    /// The state that keeps this level, updated at `t`.
    fn state(&self, t: u64) -> State {
        State {
            tokens: self.tokens,
            fraction: self.fraction,
            updated_us: t,
            refill_tokens: self.rate,
            refill_period_us: self.period,
            capacity: self.full,
            since_us: self.life.since_us,
            refunded: self.life.refunded,
        }
    }

    /// The decision of a report or a refund that leaves this level: allowed, and for one token.
    fn describe(&self, skew: u64) -> Decision {
        let remaining = self.remaining();
        Decision {
            allowed: true,
            remaining,
            reset_after_us: (skew + self.wait_until_full()).min(MAX_WAIT_US),
            retry_after_us: if remaining >= 1 {
                0
            } else {
                (skew + self.wait_for(1)).min(MAX_WAIT_US)
            },
        }
    }

    /// Time until the bucket is full, at its own rate.
    fn wait_until_full(&self) -> u64 {
        self.wait_for(signed(self.full) + self.extra)
    }

    /// Time until `target` whole tokens are available (under the parameters decided; the
    /// level's own `target - extra`): `ceil(((target - extra - tokens) * period - fraction) /
    /// rate)`, capped at [`MAX_WAIT_US`].
    fn wait_for(&self, target: i64) -> u64 {
        // Tokens missing: at most twice the capacity, when in debt.
        let missing = target - self.extra - self.tokens;
        let Ok(missing @ 1..) = u64::try_from(missing) else {
            return 0;
        };
        let (q, r) = muldiv(self.period, missing, self.rate);
        let wait = if r > self.fraction {
            q.saturating_add(1)
        } else {
            q - (self.fraction - r) / self.rate
        };
        wait.min(MAX_WAIT_US)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(p: &Params, seq: &[(u64, u64)]) -> Vec<Decision> {
        let mut state = None;
        seq.iter()
            .map(|&(now, cost)| {
                let o = acquire(state, p, cost, now);
                state = o.state;
                o.decision
            })
            .collect()
    }

    #[test]
    fn starts_full_and_refills_continuously() {
        // 10 per second, burst 20.
        let p = Params::new(20, 10, 1_000_000);
        let d = run(&p, &[(0, 20), (0, 1), (100_000, 1), (100_000, 1)]);
        assert!(d[0].allowed && !d[1].allowed && d[2].allowed && !d[3].allowed);
        assert_eq!(d[1].retry_after_us, 100_000);
        assert_eq!(d[0].reset_after_us, 2_000_000);
    }

    #[test]
    fn refill_is_exact_however_often_it_is_observed() {
        // One token per 3 ms, observed every millisecond: after 3 s exactly 1000 tokens came.
        let p = Params::new(1, 1, 3_000);
        let mut state = acquire(None, &p, 1, 0).state;
        let mut granted = 0;
        for ms in 1..=3_000u64 {
            let o = acquire(state, &p, 1, ms * 1_000);
            granted += u64::from(o.decision.allowed);
            state = o.state;
        }
        assert_eq!(granted, 1_000);
    }

    #[test]
    fn clock_step_back_never_removes_tokens() {
        let p = Params::new(10, 1, 1_000_000);
        let d = run(&p, &[(10_000_000, 5), (9_000_000, 1), (11_000_000, 5)]);
        assert!(d[1].allowed);
        assert_eq!(d[1].remaining, 4);
        // 4 left + 1 refilled by 11 s.
        assert!(d[2].allowed);
        assert_eq!(d[2].remaining, 0);
    }

    #[test]
    fn denied_acquire_does_not_consume() {
        let p = Params::new(5, 1, 1_000_000);
        let d = run(&p, &[(0, 4), (1, 2), (2, 2), (3, 1)]);
        assert!(!d[1].allowed && !d[2].allowed && d[3].allowed);
    }

    #[test]
    fn enormous_waits_are_capped() {
        let p = Params::new(1_000_000_000, 1, 2_678_400_000_000);
        let d = run(&p, &[(0, 1_000_000_000), (1, 1)]);
        assert_eq!(d[1].retry_after_us, 2_678_400_000_000 - 1);
        assert_eq!(d[1].reset_after_us, MAX_WAIT_US);
    }

    const T0: u64 = 1_764_460_800_123_457;

    #[test]
    fn a_report_puts_the_bucket_in_debt_that_time_repays_exactly() {
        // 10 per second (a token per 100 ms), capacity 10.
        let p = Params::new(10, 10, 1_000_000);
        let taken = acquire(None, &p, 4, T0);
        // 6 left: room for 16 more before usage is twice the capacity; the other 9 are dropped.
        let (o, units) = report(taken.state, &p, 25, T0);
        assert_eq!(units, 16);
        assert_eq!(o.state.map(|s| s.tokens), Some(-10));
        assert_eq!(
            o.decision,
            Decision {
                allowed: true,
                remaining: 0,
                reset_after_us: 2_000_000,
                retry_after_us: 1_100_000,
            }
        );
        assert_eq!(o.ttl_us, Some(2_000_000));
        // Denied until the debt of 10 and one token have come back, to the µs.
        let before = acquire(o.state, &p, 1, T0 + 1_099_999);
        assert!(!before.decision.allowed);
        assert_eq!(before.decision.retry_after_us, 1);
        assert_eq!(before.decision.remaining, 0);
        let at = acquire(o.state, &p, 1, T0 + 1_100_000);
        assert!(at.decision.allowed);
        // A full capacity waits for the whole debt and 10 tokens.
        let all = acquire(o.state, &p, 10, T0 + 1_100_000).decision;
        assert!(!all.allowed);
        assert_eq!(all.retry_after_us, 900_000);
        assert!(acquire(o.state, &p, 10, T0 + 2_000_000).decision.allowed);
    }

    #[test]
    fn a_report_at_the_bound_records_nothing_and_changes_nothing() {
        let p = Params::new(10, 1, 1_000_000);
        let (full, units) = report(None, &p, crate::limiter::MAX_UNITS, T0);
        assert_eq!(units, 20, "at most twice the capacity from full");
        let state = full.state;
        let (o, units) = report(state, &p, 1, T0 + 999_999);
        assert_eq!(units, 0);
        assert_eq!((o.state, o.ttl_us), (state, None));
        assert_eq!(o.decision.remaining, 0);
        assert_eq!(o.decision.retry_after_us, 11_000_000 - 999_999);
        assert_eq!(o.decision.reset_after_us, 20_000_000 - 999_999);
        // A second later one token has been repaid: exactly one more fits.
        let (o, units) = report(state, &p, 5, T0 + 1_000_000);
        assert_eq!(units, 1);
        assert_eq!(o.ttl_us, Some(20_000_000));
    }

    #[test]
    fn a_report_that_fits_leaves_tokens_and_no_retry() {
        let p = Params::new(10, 1, 1_000_000);
        let (o, units) = report(None, &p, 3, T0);
        assert_eq!(units, 3);
        assert_eq!(o.decision.remaining, 7);
        assert_eq!(o.decision.retry_after_us, 0);
        assert_eq!(o.decision.reset_after_us, 3_000_000);
    }

    #[test]
    fn a_refund_never_fills_above_capacity_nor_creates_state_nor_moves_the_expiry() {
        let p = Params::new(10, 1, 1_000_000);
        let (o, units) = refund(None, &p, 5, T0, None);
        assert_eq!((units, o.state, o.ttl_us), (0, None, None));
        assert_eq!(o.decision.remaining, 10);

        let taken = acquire(None, &p, 3, T0);
        // Half a second later: 7.5 tokens, 3 whole ones in use.
        let (o, units) = refund(taken.state, &p, 5, T0 + 500_000, None);
        assert_eq!(units, 3);
        assert_eq!(o.ttl_us, None);
        assert_eq!(o.decision.remaining, 10);
        assert_eq!(o.decision.reset_after_us, 0);
        // Full means exactly 10: the half token is gone, so one taken now is a second's refill.
        let next = acquire(o.state, &p, 1, T0 + 600_000);
        assert_eq!(next.decision.reset_after_us, 1_000_000);
        // Refunding a full bucket gives nothing and keeps its state.
        let (again, units) = refund(o.state, &p, 1, T0 + 600_000, None);
        assert_eq!((units, again.state), (0, o.state));
    }

    #[test]
    fn a_refund_in_debt_repays_part_of_it() {
        let p = Params::new(10, 10, 1_000_000);
        let (debt, _) = report(None, &p, 20, T0);
        let (o, units) = refund(debt.state, &p, 4, T0, None);
        assert_eq!(units, 4);
        assert_eq!(o.state.map(|s| s.tokens), Some(-6));
        assert_eq!(o.decision.remaining, 0);
        assert_eq!(o.decision.retry_after_us, 700_000);
        assert_eq!(o.decision.reset_after_us, 1_600_000);
        assert_eq!(o.ttl_us, None);
    }

    #[test]
    fn a_mark_gives_back_only_what_time_has_not_refilled() {
        // One token per second, capacity 10.
        let p = Params::new(10, 1, 1_000_000);
        let first = acquire(None, &p, 5, T0);
        let mark1 = T0 + first.decision.reset_after_us;
        assert_eq!(mark1, T0 + 5_000_000);
        // 9 by T0 + 4 s, 4 after the second take, full again 6 s later.
        let second = acquire(first.state, &p, 5, T0 + 4_000_000);
        let mark2 = T0 + 4_000_000 + second.decision.reset_after_us;
        assert_eq!(mark2, T0 + 10_000_000);
        let (mark1, mark2) = (Mark::new(mark1, T0, 0), Mark::new(mark2, T0 + 4_000_000, 0));
        let now = T0 + 6_000_000;
        // The first take's 5 have all been refilled by T0 + 5 s, though 4 are in use.
        let (o, units) = refund(second.state, &p, 5, now, Some(mark1));
        assert_eq!((units, o.state, o.ttl_us), (0, second.state, None));
        assert_eq!(o.decision.remaining, 6);
        // The second's: 4 s still to refill, so 4 of its 5.
        let (o, units) = refund(second.state, &p, 5, now, Some(mark2));
        assert_eq!(units, 4);
        assert_eq!(o.decision.remaining, 10);
        // 3.5 still to come back half a second later: rounded up, 4; a second later, 3.
        let (_, units) = refund(second.state, &p, 5, now + 500_000, Some(mark2));
        assert_eq!(units, 4);
        let (_, units) = refund(second.state, &p, 5, now + 1_500_000, Some(mark2));
        assert_eq!(units, 3);
        // A microsecond after a take, all of it comes back, not one less for the sliver of
        // refill since.
        let (o, units) = refund(first.state, &p, 5, T0 + 1, Some(mark1));
        assert_eq!((units, o.decision.remaining), (5, 10));
        // Without the mark, everything in use.
        let (_, units) = refund(second.state, &p, 5, now + 500_000, None);
        assert_eq!(units, 4);
    }

    #[test]
    fn debt_at_the_largest_parameters_stays_exact() {
        // A billion tokens refilled once a month, twice over in debt.
        let period = crate::limiter::MAX_PERIOD_MS * 1_000;
        let p = Params::new(1_000_000_000, 1, period);
        let (o, units) = report(None, &p, 1_000_000_000, T0);
        assert_eq!(units, 1_000_000_000);
        let (o, units) = report(o.state, &p, 1_000_000_000, T0 + 1);
        assert_eq!(units, 1_000_000_000);
        assert_eq!(o.state.map(|s| s.tokens), Some(-1_000_000_000));
        // One token is 10^9 + 1 months away, far past the longest wait reported.
        assert_eq!(o.decision.retry_after_us, MAX_WAIT_US);
        let d = acquire(o.state, &p, 1, T0 + 1).decision;
        assert_eq!(d.retry_after_us, MAX_WAIT_US);
        // At a billion per ms, the same debt is 2 ms of refill.
        let p = Params::new(1_000_000_000, 1_000_000_000, 1_000);
        let (o, _) = report(None, &p, 1_000_000_000, T0);
        let (o, _) = report(o.state, &p, 1_000_000_000, T0);
        assert_eq!(o.decision.reset_after_us, 2_000);
        assert_eq!(o.decision.retry_after_us, 1_001);
        let d = acquire(o.state, &p, 1_000_000_000, T0 + 1_999).decision;
        assert_eq!(d.retry_after_us, 1);
        assert_eq!(d.remaining, 999_000_000);
    }

    #[test]
    fn a_raised_capacity_answers_alike_whether_the_key_expired_or_not() {
        // Issue 24's case: 22 at 19/s, 5 taken; 1.16 s later (full since 0.26 s, the key
        // expired then) the capacity is 62 at the same rate.
        let old = Params::new(22, 19, 1_000_000);
        let new = Params::new(62, 19, 1_000_000);
        let o = acquire(None, &old, 5, T0);
        assert_eq!(o.ttl_us, Some(263_158));
        let live = acquire(o.state, &new, 1, T0 + 1_160_000);
        let expired = acquire(None, &new, 1, T0 + 1_160_000);
        assert_eq!(live.decision, expired.decision);
        assert_eq!(live.decision.remaining, 61);
        assert_eq!(live.state, expired.state);
    }

    #[test]
    fn a_changed_capacity_and_rate_keep_the_tokens_missing_from_full() {
        let old = Params::new(22, 19, 1_000_000);
        let o = acquire(None, &old, 20, T0);
        // Half a second on, 9.5 tokens refilled: 10.5 are missing, of 22 or of 62.
        let new = Params::new(62, 10, 1_000_000);
        let peek = decide(o.state, &new, 1, T0 + 500_000, false).decision;
        assert_eq!(peek.remaining, 51);
        // Until a take rewrites it, the level refills at its own rate: full in 10.5 / 19 s,
        // when the key expires.
        assert_eq!(peek.reset_after_us, 552_632);
        assert_eq!(o.ttl_us, Some(500_000 + 552_632));
        let t = acquire(o.state, &new, 1, T0 + 500_000);
        assert_eq!(t.decision.remaining, 50);
        // Rewritten at 10/s, the half token refilled at 19/s dropped: 12 missing.
        assert_eq!(t.decision.reset_after_us, 1_200_000);
        assert_eq!(
            t.state.map(|s| (s.capacity, s.refill_tokens)),
            Some((62, 1))
        );
        // Back at 22: the 12 missing of 62 are missing of 22.
        let d = decide(t.state, &old, 11, T0 + 500_000, false).decision;
        assert!(!d.allowed && d.remaining == 10, "{d:?}");
        assert_eq!(d.retry_after_us, 100_000);
    }

    #[test]
    fn a_lowered_capacity_keeps_the_debt_and_refunds_stop_at_full() {
        let p = Params::new(10, 1, 1_000_000);
        let (o, _) = report(None, &p, 15, T0);
        let low = Params::new(4, 1, 1_000_000);
        // 15 missing of 4: deeper than the bound, so reports record nothing.
        let (r, units) = report(o.state, &low, 1, T0);
        assert_eq!((units, r.decision.remaining), (0, 0));
        assert_eq!(
            r.decision.retry_after_us, 12_000_000,
            "12 tokens to refill for one"
        );
        let (f, given) = refund(o.state, &low, 100, T0, None);
        assert_eq!((given, f.decision.remaining), (15, 4));
        assert_eq!(f.ttl_us, None);
    }

    /// The mark of an allowed take or report: as [`crate::limiter::Verdict::marks`] makes it.
    fn mark_of(o: &Outcome<State>, at: u64) -> Mark {
        let refunded = o.state.map_or(0, |s| s.refunded);
        Mark::new(at + o.decision.reset_after_us, at, refunded)
    }

    #[test]
    fn refunds_out_of_order_give_back_no_more_than_each_take_still_holds() {
        // Capacity 10 at 1 a second: A takes 5, B takes 5, A is refunded, the bucket is full
        // again 5 s later and C takes all 10; B's ticket must give nothing back now, where its
        // mark alone (full at 10 s) would say 5.
        let p = Params::new(10, 1, 1_000_000);
        let a = acquire(None, &p, 5, T0);
        let b = acquire(a.state, &p, 5, T0);
        let (ma, mb) = (mark_of(&a, T0), mark_of(&b, T0));
        let (back, given) = refund(b.state, &p, 5, T0, Some(ma));
        assert_eq!(given, 5);
        let c = acquire(back.state, &p, 10, T0 + 5_000_000);
        assert!(c.decision.allowed);
        let (_, given) = refund(c.state, &p, 5, T0 + 5_000_000, Some(mb));
        assert_eq!(given, 0, "B's units were spent by then");
        // Before the bucket was full again, B held what A's refund moved up: at 2 s, 3 of 5.
        let (_, given) = refund(back.state, &p, 5, T0 + 2_000_000, Some(mb));
        assert_eq!(given, 3);
        // C's own ticket still gives its units back, all of them.
        let (_, given) = refund(
            c.state,
            &p,
            10,
            T0 + 5_000_000,
            Some(mark_of(&c, T0 + 5_000_000)),
        );
        assert_eq!(given, 10);
    }

    #[test]
    fn a_ticket_from_before_the_bucket_was_last_full_gives_nothing() {
        let p = Params::new(10, 1, 1_000_000);
        let a = acquire(None, &p, 5, T0);
        // Full again at 5 s, without any refund; a take at 6 s begins a new life.
        let b = acquire(a.state, &p, 10, T0 + 6_000_000);
        assert_eq!(b.state.map(|s| s.since_us), Some(T0 + 6_000_000));
        let (_, given) = refund(b.state, &p, 5, T0 + 6_000_000, Some(mark_of(&a, T0)));
        assert_eq!(given, 0);
    }

    #[test]
    fn a_refund_of_a_partly_refilled_take_drops_the_part_refilled() {
        // A takes 1 of 3 at 0, B 2 at 1 µs; by then A's token has refilled by 1 µs' worth. A's
        // refund gives its token back and with it the part refilled, so that B and a take at
        // the next token's time never count more than the bucket allows.
        let p = Params::new(3, 2, 295_000);
        let a = acquire(None, &p, 1, T0);
        let b = acquire(a.state, &p, 2, T0 + 1);
        let (back, given) = refund(b.state, &p, 1, T0 + 1, Some(mark_of(&a, T0)));
        assert_eq!(given, 1);
        assert_eq!(back.state.map(|s| (s.tokens, s.fraction)), Some((1, 0)));
        assert_eq!(back.decision.retry_after_us, 0);
        let early = decide(back.state, &p, 2, T0 + 147_500, false).decision;
        assert!(
            !early.allowed,
            "1 token and 147,499 µs of the next: {early:?}"
        );
        assert!(
            decide(back.state, &p, 2, T0 + 147_501, false)
                .decision
                .allowed
        );
    }

    #[test]
    fn a_life_begins_again_before_its_refund_count_leaves_what_lua_holds_exactly() {
        let p = Params::new(1_000_000_000, 1, 1_000_000);
        let a = acquire(None, &p, 1_000_000_000, T0);
        let near = State {
            refunded: crate::limiter::LIFE_REFUNDS - 10,
            ..a.state.expect("taken")
        };
        let (o, given) = refund(Some(near), &p, 20, T0 + 1, None);
        assert_eq!(given, 20);
        let s = o.state.expect("kept");
        assert_eq!((s.since_us, s.refunded), (T0 + 1, 0));
    }

    #[test]
    fn rate_is_kept_in_lowest_terms() {
        let p = Params::new(20, 100, 60_000_000);
        assert_eq!((p.refill_tokens, p.refill_period_us), (1, 600_000));
    }
}
