//! GCRA, the generic cell rate algorithm: sustained `rate` units per `period_ms`, at most
//! `burst` at once (`burst` is the capacity, the reply's `limit`).
//!
//! The emission interval `T = period_us / rate` is kept as an exact fraction in lowest terms,
//! `interval_num / interval_den` µs. The state is the theoretical arrival time (TAT): the time at
//! which the subject is back to its full burst. With `t = max(now, anchor)` (see below):
//! - `new_tat = max(tat, t) + cost·T`; the request is allowed iff `new_tat − t <= burst·T`;
//!   a denial changes nothing;
//! - `remaining = floor((burst·T − (new_tat − t)) / T)` after an allowed request, and
//!   `floor((burst·T − (max(tat, t) − t)) / T)` (never negative) after a denial;
//! - `retry_after` is `ceil(new_tat − burst·T − t)` µs, the exact time until the same request
//!   is allowed; `reset_after` is `ceil(tat − t)` µs for the TAT the request leaves behind; both
//!   are measured from the caller's `now` (plus `t − now`) and capped at [`MAX_WAIT_US`];
//! - the TTL is `reset_after`: once the TAT has passed, a missing state gives the same answers.
//!
//! Exactness. The TAT is kept as `anchor_us + units·T`, a whole number of microseconds plus a
//! whole number of emission intervals, so it is exact without any rounding, and a burst of
//! `burst` simultaneous requests admits exactly `burst` for every rate, period and burst (float
//! GCRA scripts such as go-redis/redis_rate's admit 9 of 10 at 10 per second). Each decision
//! moves the anchor forward by whole periods of `interval_num` µs (`interval_den` intervals), so
//! it stays within one such period of the last decision and `units < burst + interval_den`:
//! every number stays below 2^53 (Lua's exact integers) for the whole parameter range, even when
//! `burst·T` is millions of years.
//!
//! Clock step back (the shared rule): the anchor is a time at or before the last decision, and a
//! `now` before it is treated as the anchor. A step back therefore never refunds anything (the
//! subject looks at least as busy as at the anchor), and costs at most what was consumed since
//! the anchor, rather than `step / T` units as a bare GCRA would.
//!
//! Debt ([`super::Rule::report`]). A report takes its units whether they fit or not, so the
//! level `busy` (intervals still to drain, rounded up) may pass `burst`, up to `2·burst`
//! (usage of twice the capacity, the shared bound): a report records `min(cost, 2·burst −
//! busy)`, and the TAT lies at most `2·burst·T` after `t`. Time drains it like any backlog: an
//! acquire is denied until `busy + cost <= burst` again, `retry_after` being that exact time,
//! and `remaining` is 0 meanwhile. The bounds above become `units < 2·burst + interval_den` and
//! levels up to `2·burst <= 2·10^9 < 2^31`, still exact in Lua through `muldiv`. (A burst lowered
//! by a policy change may leave an older, longer backlog; it drains as it stands, and reports
//! record nothing until it is back within the bound.)
//!
//! Refund ([`super::Rule::refund`]). Gives back whole intervals, at most `busy`: giving them all
//! puts the TAT before `t`, a subject at rest (never above full). A ticket's mark is the TAT
//! after its take (rounded up to a µs): by `t`, all but `(mark − t) / T` of that take's units
//! have drained (none once `mark <= t`), so no more are given back, rounded up to a whole
//! interval (a refund right after its take gives all of it back, not one less) (`mark − t` is capped at
//! [`MAX_WAIT_US`], which no take's reset exceeds, so that any mark stays exact in Lua; a take
//! whose TAT lies further, a report of 10^9 at one a month, has a held mark instead, which
//! [`super::undrained`] reads). A
//! refund writes the earlier TAT but keeps the key's expiry, which is then at or after it. A
//! take's units drain after every earlier one, so a refund of an earlier take moves them up:
//! the state keeps its [`Life`] (when it was last found at rest, and the units refunds have
//! given back since), a ticket keeps the count as its take left it, and a refund gives back no
//! more than the mark says less what every refund since gave back, and nothing for a take from
//! before the life began ([`super::undrained`]). A count rounded up from part of an interval,
//! given back whole, re-anchors the level at `t`, dropping the part drained so far, so that it
//! is not given twice.
//!
//! A change of parameters (a burst, rate or period changed by a policy update, an override or
//! a tier): the units in use (`busy`, the backlog still to drain) carry over, whatever the
//! burst (ADDITIVE: 4 in use of 10 leave 16 of 20, and none of 3, in debt by 1). The state
//! says the interval it was written with, and its TAT drains at that interval until a take or a
//! report rewrites it at the one decided: `busy` units, anchored at `t`, plus the cost; a peek,
//! a denial and a refund leave it at its own, so their waits are the times it drains to them
//! and the key expires exactly at the TAT, after which the subject is at rest, as a missing key
//! is. A changed burst alone changes nothing stored. Whatever the parameters, a state past its
//! expiry answers as no state. Not exact: a rewrite at another interval drops the part of an
//! interval drained so far (a unit in use counts as whole), so the subject may wait up to one
//! interval longer.
//!
//! Mappings. redis-cell's `CL.THROTTLE key max_burst count period` is `burst = max_burst + 1`,
//! `rate = count`, `period_ms = period * 1000`. go-redis/redis_rate's `Limit{Rate, Burst,
//! Period}` is `rate`, `burst`, `period_ms` as they are. On a clock that never goes back, GCRA
//! with `rate`/`period_ms`/`burst` gives the same answers as a `token_bucket` with `capacity =
//! burst`, `refill_tokens = rate` and `refill_period_ms = period_ms` (tested below).

use thiserror::Error;

use super::arith::{gcd, muldiv};
use super::{undrained, Decision, Life, Mark, Outcome, MAX_WAIT_US};

/// Bounds of `rate`, units per period.
pub const MIN_RATE: u64 = 1;
pub const MAX_RATE: u64 = 1_000_000_000;
/// Bounds of `burst`, the capacity.
pub const MIN_BURST: u64 = 1;
pub const MAX_BURST: u64 = 1_000_000_000;
/// Bounds of `period_ms`: 1 ms to 31 days.
pub const MIN_PERIOD_MS: u64 = 1;
pub const MAX_PERIOD_MS: u64 = 2_678_400_000;

/// A parameter outside its range; `field` is the policy field's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("`{field}` must be between {min} and {max}, got {value}")]
pub struct ParamsError {
    pub field: &'static str,
    pub min: u64,
    pub max: u64,
    pub value: u64,
}

/// Validated parameters: the emission interval in lowest terms, in µs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    burst: u64,
    interval_num: u64,
    interval_den: u64,
}

impl Params {
    /// Checks each field against its range and reduces `period_ms * 1000 / rate`.
    pub fn parse(rate: u64, period_ms: u64, burst: u64) -> Result<Self, ParamsError> {
        let check = |field, min, max, value| {
            if (min..=max).contains(&value) {
                Ok(value)
            } else {
                Err(ParamsError {
                    field,
                    min,
                    max,
                    value,
                })
            }
        };
        let rate = check("rate", MIN_RATE, MAX_RATE, rate)?;
        let period_ms = check("period_ms", MIN_PERIOD_MS, MAX_PERIOD_MS, period_ms)?;
        let burst = check("burst", MIN_BURST, MAX_BURST, burst)?;
        Ok(Self::new(rate, period_ms, burst))
    }

    /// Parameters from fields already checked against their ranges (values outside are
    /// clamped into them, so this never fails).
    pub fn new(rate: u64, period_ms: u64, burst: u64) -> Self {
        let rate = rate.clamp(MIN_RATE, MAX_RATE);
        let period_us = period_ms.clamp(MIN_PERIOD_MS, MAX_PERIOD_MS) * 1_000;
        let g = gcd(period_us, rate);
        Self {
            burst: burst.clamp(MIN_BURST, MAX_BURST),
            interval_num: period_us / g,
            interval_den: rate / g,
        }
    }

    /// The capacity: at most this many units at once (the reply's `limit`).
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The emission interval `T` as `(numerator, denominator)` µs, in lowest terms.
    pub fn interval(&self) -> (u64, u64) {
        (self.interval_num, self.interval_den)
    }
}

/// What is kept per subject: `tat = anchor_us + units * interval_num / interval_den` µs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    pub anchor_us: u64,
    /// Emission intervals from the anchor to the TAT; below `burst + interval_den`, or
    /// `2·burst + interval_den` in debt.
    pub units: u64,
    /// The reduced interval this TAT drains at, until a take or a report rewrites it under
    /// another (see the module doc).
    pub interval_num: u64,
    pub interval_den: u64,
    /// When this TAT's [`Life`] began, and the units refunds have given back since, which
    /// tickets' marks are read against.
    pub since_us: u64,
    pub refunded: u64,
}

impl super::Rule for Params {
    const NAME: &'static str = "gcra";
    const FIELDS: &'static [super::Field] = &[
        super::Field {
            name: "rate",
            min: MIN_RATE,
            max: MAX_RATE,
            doc: "units per `period_ms`, sustained",
            example: 10,
        },
        super::Field {
            name: "period_ms",
            min: MIN_PERIOD_MS,
            max: MAX_PERIOD_MS,
            doc: "the period in milliseconds over which `rate` units are allowed",
            example: 1_000,
        },
        super::Field {
            name: "burst",
            min: MIN_BURST,
            max: MAX_BURST,
            doc: "the most units at once, the capacity",
            example: 20,
        },
    ];
    const QUOTA_FIELD: &'static str = "burst";
    type State = State;

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
        super::ScriptArgs::new(&[self.burst, self.interval_num, self.interval_den])
    }

    fn quota(&self) -> u64 {
        self.burst
    }

    fn per_period(requests: u64, period_ms: u64) -> super::ScriptArgs {
        // `requests` per period, all of them at once if they come at once.
        super::ScriptArgs::new(&[requests, period_ms, requests])
    }

    fn from_fields(values: &[u64]) -> Self {
        let [rate, period_ms, burst] = super::fields::<3>(values);
        Self::new(rate, period_ms, burst)
    }

    fn window_us(&self) -> u64 {
        // `burst` intervals: from busy to rest.
        let us = u128::from(self.burst) * u128::from(self.interval_num);
        u64::try_from(us.div_ceil(u128::from(self.interval_den))).unwrap_or(u64::MAX)
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
    let level = Level::at(state, p, now_us);
    let busy = level.busy;
    let admits = busy + cost <= p.burst;
    if admits && take {
        let level = level.under(p);
        let after = busy + cost;
        let reset = level.wait(after);
        Outcome {
            decision: Decision {
                allowed: true,
                remaining: p.burst - after,
                reset_after_us: reset,
                retry_after_us: 0,
            },
            state: Some(level.state(after)),
            ttl_us: Some(reset),
        }
    } else {
        Outcome {
            decision: Decision {
                allowed: admits,
                remaining: p.burst.saturating_sub(busy),
                reset_after_us: level.wait(busy),
                retry_after_us: if admits {
                    0
                } else {
                    level.wait(busy + cost - p.burst)
                },
            },
            state,
            ttl_us: None,
        }
    }
}

/// Takes `cost` units whether or not they fit ([`super::Rule::report`]): the level may reach
/// `2·burst` intervals, and units past that are not recorded. Returns the outcome and the units
/// recorded.
pub fn report(state: Option<State>, p: &Params, cost: u64, now_us: u64) -> (Outcome<State>, u64) {
    let level = Level::at(state, p, now_us);
    // Room left before usage reaches twice the burst (none if a lowered burst left more).
    let units = cost.min((2 * p.burst).saturating_sub(level.busy));
    if units == 0 {
        let outcome = Outcome {
            decision: level.describe(level.busy, p.burst),
            state,
            ttl_us: None,
        };
        return (outcome, 0);
    }
    let level = level.under(p);
    let after = level.busy + units;
    let decision = level.describe(after, p.burst);
    let outcome = Outcome {
        decision,
        state: Some(level.state(after)),
        // Written as a take writes it: kept until the TAT has passed.
        ttl_us: Some(decision.reset_after_us),
    };
    (outcome, units)
}

/// Gives back at most `units` units ([`super::Rule::refund`]): at most the level `busy`, never to
/// a subject without state, and with `mark` (the TAT after the ticket's take) only the units of
/// that take not yet drained. Keeps the expiry. Returns the outcome and the units given back.
pub fn refund(
    state: Option<State>,
    p: &Params,
    units: u64,
    now_us: u64,
    mark: Option<Mark>,
) -> (Outcome<State>, u64) {
    // No state is a subject at rest: nothing is in use, so nothing is given and nothing is made.
    let level = Level::at(state, p, now_us);
    let mut give = units.min(level.busy);
    // Whether the part of an interval drained so far goes with what is given (see `undrained`).
    let mut drop_part = false;
    if let Some(mark) = mark {
        // Intervals of the take not drained yet, rounded up to a whole one: a refund right after
        // its take gives all of it back, not one less for the sliver drained since; moved up by
        // the refunds since; a held mark as `undrained` reads it.
        let held = undrained(mark, level.t, units, level.den, level.num, level.life);
        give = give.min(held.units);
        drop_part = held.partial && give == held.units;
    }
    if give == 0 {
        let outcome = Outcome {
            decision: level.describe(level.busy, p.burst),
            state,
            ttl_us: None,
        };
        return (outcome, 0);
    }
    let after = level.busy - give;
    let life = level.life.refund(give, level.t);
    let level = if drop_part {
        // The level anchored at `t`, with nothing of its next interval drained.
        Level {
            anchor: level.t,
            elapsed: 0,
            part: 0,
            life,
            ..level
        }
    } else {
        Level { life, ..level }
    };
    let outcome = Outcome {
        decision: level.describe(after, p.burst),
        state: Some(level.state(after)),
        ttl_us: None,
    };
    (outcome, give)
}

/// Where a subject stands at `t = max(now, anchor)`: `busy - part / num` intervals still to
/// drain before the TAT, `busy` being that level rounded up.
#[derive(Debug, Clone, Copy)]
struct Level {
    anchor: u64,
    /// Whole intervals from the anchor to `t`.
    elapsed: u64,
    busy: u64,
    part: u64,
    t: u64,
    skew: u64,
    num: u64,
    den: u64,
    /// Begun afresh when the subject is at rest.
    life: Life,
}

impl Level {
    /// The level of `state` at `now_us`, drained at the interval it was written with; a TAT at
    /// or before `t` (or no state) is a subject at rest, anchored at `t`.
    fn at(state: Option<State>, p: &Params, now_us: u64) -> Level {
        let (num, den, anchor, units, life) = match state {
            Some(s) if s.interval_num > 0 && s.interval_den > 0 => {
                let life = Life {
                    since_us: s.since_us,
                    refunded: s.refunded,
                };
                (s.interval_num, s.interval_den, s.anchor_us, s.units, life)
            }
            _ => (p.interval_num, p.interval_den, now_us, 0, Life::at(now_us)),
        };
        let t = now_us.max(anchor);
        let skew = t - now_us;
        // Intervals elapsed since the anchor: `elapsed` whole ones and `part / num` of the next.
        let (elapsed, part) = muldiv(t - anchor, den, num);
        let (anchor, busy, part, elapsed) = if elapsed >= units {
            (t, 0, 0, 0)
        } else {
            (anchor, units - elapsed, part, elapsed)
        };
        Level {
            anchor,
            elapsed,
            busy,
            part,
            t,
            skew,
            num,
            den,
            life: if busy == 0 { Life::at(t) } else { life },
        }
    }

    /// The same level at the interval of `p`, as a take or a report writes it: its `busy`
    /// units still to drain, anchored at `t`; the part of an interval drained so far is dropped
    /// when the interval differs (it is in µs of the old one).
    fn under(&self, p: &Params) -> Level {
        if (self.num, self.den) == (p.interval_num, p.interval_den) {
            return *self;
        }
        Level {
            anchor: self.t,
            elapsed: 0,
            part: 0,
            num: p.interval_num,
            den: p.interval_den,
            ..*self
        }
    }

    /// Time from the caller's `now` until a level of `level - part / num` intervals has
    /// drained, capped at [`MAX_WAIT_US`].
    fn wait(&self, level: u64) -> u64 {
        (self
            .skew
            .saturating_add(drain(level, self.part, self.num, self.den)))
        .min(MAX_WAIT_US)
    }

    /// The state that keeps `after` as the level at `t` (`after - part / num` intervals).
    fn state(&self, after: u64) -> State {
        // Whole periods of `num` µs (`den` intervals) move into the anchor, which stays exact
        // and within one period of `t`.
        let periods = self.elapsed / self.den;
        State {
            anchor_us: self.anchor + periods * self.num,
            units: self.elapsed % self.den + after,
            interval_num: self.num,
            interval_den: self.den,
            since_us: self.life.since_us,
            refunded: self.life.refunded,
        }
    }

    /// The decision of a report or a refund that leaves the level at `after`: allowed, and for
    /// one unit.
    fn describe(&self, after: u64, burst: u64) -> Decision {
        Decision {
            allowed: true,
            remaining: burst.saturating_sub(after),
            reset_after_us: self.wait(after),
            retry_after_us: if after < burst {
                0
            } else {
                self.wait(after + 1 - burst)
            },
        }
    }
}

/// Time for a level of `level - part / num` intervals to drain to zero:
/// `ceil((level * num - part) / den)` µs, capped at [`MAX_WAIT_US`].
fn drain(level: u64, part: u64, num: u64, den: u64) -> u64 {
    if level == 0 {
        return 0;
    }
    // `part < num <= level * num`, so this never underflows.
    let exact = u128::from(level) * u128::from(num) - u128::from(part);
    let wait = exact.div_ceil(u128::from(den));
    u64::try_from(wait).unwrap_or(u64::MAX).min(MAX_WAIT_US)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::token_bucket;
    use proptest::prelude::*;

    const T0: u64 = 1_764_460_800_123_457;

    fn params(rate: u64, period_ms: u64, burst: u64) -> Params {
        Params::parse(rate, period_ms, burst).expect("in range")
    }

    fn run(p: &Params, seq: &[(u64, u64)]) -> Vec<Decision> {
        let mut state = None;
        seq.iter()
            .map(|&(now, cost)| {
                let o = acquire(state, p, cost, now);
                state = o.state.or(state);
                o.decision
            })
            .collect()
    }

    /// `n` requests of one unit at `now`, then one more: how many were allowed.
    fn simultaneous(p: &Params, state: Option<State>, n: u64, now: u64) -> (u64, Option<State>) {
        let mut state = state;
        let mut allowed = 0;
        for _ in 0..n {
            let o = acquire(state, p, 1, now);
            allowed += u64::from(o.decision.allowed);
            state = o.state;
        }
        (allowed, state)
    }

    #[test]
    fn ten_per_second_admits_a_simultaneous_burst_of_exactly_ten() {
        let p = params(10, 1_000, 10);
        let (allowed, state) = simultaneous(&p, None, 11, T0);
        assert_eq!(allowed, 10);
        let d = acquire(state, &p, 1, T0).decision;
        assert_eq!(d.retry_after_us, 100_000);
        assert_eq!(d.reset_after_us, 1_000_000);
    }

    proptest! {
        #[test]
        fn a_burst_of_b_simultaneous_requests_admits_exactly_b(
            rate in prop_oneof![1u64..=20, Just(MAX_RATE), MIN_RATE..=MAX_RATE],
            period_ms in prop_oneof![1u64..=20, Just(MAX_PERIOD_MS), MIN_PERIOD_MS..=MAX_PERIOD_MS],
            burst in prop_oneof![1u64..=300, Just(MAX_BURST), MIN_BURST..=MAX_BURST],
        ) {
            let p = params(rate, period_ms, burst);
            // Up to 300 one by one; beyond, the first `burst - 300` taken in one request, which
            // the next test shows to leave the same state as as many single requests.
            let tail = burst.min(300);
            let start = if burst > tail {
                let o = acquire(None, &p, burst - tail, T0);
                prop_assert!(o.decision.allowed);
                o.state
            } else {
                None
            };
            let (allowed, _) = simultaneous(&p, start, tail + 1, T0);
            prop_assert_eq!(allowed, tail);
        }

        #[test]
        fn n_single_requests_leave_the_state_of_one_request_of_n(
            rate in MIN_RATE..=MAX_RATE,
            period_ms in MIN_PERIOD_MS..=MAX_PERIOD_MS,
            n in 1u64..=200,
            dt in 0u64..10_000_000,
        ) {
            let p = params(rate, period_ms, 1_000);
            let first = acquire(None, &p, 1, T0).state;
            let (_, singles) = simultaneous(&p, first, n, T0 + dt);
            let once = acquire(first, &p, n, T0 + dt);
            prop_assert!(once.decision.allowed);
            prop_assert_eq!(singles, once.state);
        }

        #[test]
        fn on_a_forward_clock_gcra_decides_as_the_token_bucket_of_the_same_rate(
            rate in prop_oneof![1u64..=12, MIN_RATE..=MAX_RATE],
            period_ms in prop_oneof![1u64..=20, Just(1_000u64), MIN_PERIOD_MS..=MAX_PERIOD_MS],
            burst in prop_oneof![1u64..=12, MIN_BURST..=MAX_BURST],
            steps in proptest::collection::vec(
                (prop_oneof![0u64..2_000, 0u64..5_000_000, 0u64..100_000_000_000], any::<u64>()),
                1..60,
            ),
        ) {
            let p = params(rate, period_ms, burst);
            let b = token_bucket::Params::new(burst, rate, period_ms * 1_000);
            let (mut gs, mut bs) = (None, None);
            let mut now = T0;
            for (dt, pick) in steps {
                now += dt;
                let cost = if pick % 4 == 0 { burst } else { 1 + pick % burst.min(5) };
                let g = acquire(gs, &p, cost, now);
                let t = token_bucket::acquire(bs, &b, cost, now);
                prop_assert_eq!(g.decision, t.decision, "at {} cost {}", now, cost);
                prop_assert_eq!(g.ttl_us, t.ttl_us);
                (gs, bs) = (g.state, t.state);
            }
        }

        #[test]
        fn on_a_forward_clock_reports_and_refunds_match_the_token_bucket_too(
            rate in prop_oneof![1u64..=12, MIN_RATE..=MAX_RATE],
            period_ms in prop_oneof![1u64..=20, Just(1_000u64), MIN_PERIOD_MS..=MAX_PERIOD_MS],
            burst in prop_oneof![1u64..=12, MIN_BURST..=MAX_BURST],
            steps in proptest::collection::vec(
                (prop_oneof![0u64..2_000, 0u64..5_000_000, 0u64..100_000_000_000], any::<u64>()),
                1..60,
            ),
        ) {
            let p = params(rate, period_ms, burst);
            let b = token_bucket::Params::new(burst, rate, period_ms * 1_000);
            let (mut gs, mut bs) = (None, None);
            let mut marks = Vec::new();
            let mut now = T0;
            for (dt, pick) in steps {
                now += dt;
                let cost = match pick % 3 {
                    0 => burst,
                    1 => (3 * burst).min(super::super::MAX_UNITS),
                    _ => 1 + (pick >> 8) % burst.min(5),
                };
                let (g, t, units) = match (pick >> 2) % 4 {
                    0 => {
                        let (g, gu) = report(gs, &p, cost, now);
                        let (t, tu) = token_bucket::report(bs, &b, cost, now);
                        prop_assert!(gu <= 2 * burst);
                        (g, t, (gu, tu))
                    }
                    1 => {
                        let mark = marks.get((pick >> 16) as usize % marks.len().max(1)).copied();
                        let (g, gu) = refund(gs, &p, cost, now, mark);
                        let (t, tu) = token_bucket::refund(bs, &b, cost, now, mark);
                        prop_assert_eq!(g.ttl_us, None);
                        (g, t, (gu, tu))
                    }
                    _ => {
                        let cost = cost.min(burst);
                        (acquire(gs, &p, cost, now), token_bucket::acquire(bs, &b, cost, now), (0, 0))
                    }
                };
                prop_assert_eq!(g.decision, t.decision, "at {} cost {} pick {}", now, cost, pick);
                prop_assert_eq!(units.0, units.1);
                prop_assert_eq!(g.ttl_us, t.ttl_us);
                prop_assert!(g.decision.remaining <= burst);
                if g.ttl_us.is_some() {
                    let refunded = g.state.map_or(0, |s| s.refunded);
                    marks.push(Mark::new(now + g.decision.reset_after_us, now, refunded));
                }
                (gs, bs) = (g.state, t.state);
                if let Some(s) = gs {
                    prop_assert!(s.units < 2 * burst + p.interval().1);
                }
            }
        }

        #[test]
        fn the_state_stays_below_two_to_the_fifty_three(
            rate in MIN_RATE..=MAX_RATE,
            period_ms in MIN_PERIOD_MS..=MAX_PERIOD_MS,
            burst in MIN_BURST..=MAX_BURST,
            steps in proptest::collection::vec((0u64..10_000_000_000, any::<u64>()), 1..40),
        ) {
            let p = params(rate, period_ms, burst);
            let (_, den) = p.interval();
            let mut state = None;
            let mut now = T0;
            for (dt, pick) in steps {
                now += dt;
                let o = acquire(state, &p, 1 + pick % burst, now);
                state = o.state.or(state);
                if let Some(s) = state {
                    prop_assert!(s.units < burst + den);
                    prop_assert!(s.anchor_us <= now);
                }
            }
        }
    }

    #[test]
    fn the_sustained_rate_is_exact_however_often_it_is_asked() {
        // 3 per second (an interval of 333,333⅓ µs), burst 2, asked every ms for 30 s after a
        // first request: the burst's second unit, then exactly one per interval, 90 in 30 s.
        // (With burst 1 each grant would wait for the next whole ms and lose the rest.)
        let p = params(3, 1_000, 2);
        let mut state = acquire(None, &p, 1, T0).state;
        let mut granted = 0;
        for ms in 1..=30_000u64 {
            let o = acquire(state, &p, 1, T0 + ms * 1_000);
            granted += u64::from(o.decision.allowed);
            state = o.state.or(state);
        }
        assert_eq!(granted, 91);
    }

    #[test]
    fn retry_after_is_the_exact_time_until_the_same_request_is_allowed() {
        let p = params(3, 1_000, 4);
        for cost in 1..=4 {
            let mut state = acquire(None, &p, 3, T0).state;
            state = acquire(state, &p, 1, T0 + 7).state;
            let d = acquire(state, &p, cost, T0 + 11).decision;
            assert!(!d.allowed);
            let at = T0 + 11 + d.retry_after_us;
            assert!(
                !acquire(state, &p, cost, at - 1).decision.allowed,
                "cost {cost}"
            );
            assert!(acquire(state, &p, cost, at).decision.allowed, "cost {cost}");
        }
    }

    #[test]
    fn reset_after_is_when_the_full_burst_is_back_and_is_the_ttl() {
        let p = params(3, 1_000, 4);
        let o = acquire(None, &p, 2, T0);
        // Two intervals of 333,333⅓ µs, rounded up.
        assert_eq!(o.decision.reset_after_us, 666_667);
        assert_eq!(o.ttl_us, Some(666_667));
        assert_eq!(o.decision.remaining, 2);
        let later = acquire(o.state, &p, 4, T0 + 666_667);
        assert!(later.decision.allowed, "the full burst is back");
        let before = acquire(o.state, &p, 4, T0 + 666_666);
        assert!(!before.decision.allowed);
        assert_eq!(before.decision.remaining, 3);
    }

    #[test]
    fn a_denial_changes_nothing() {
        let p = params(1, 1_000, 5);
        let d = run(&p, &[(T0, 4), (T0 + 1, 2), (T0 + 2, 2), (T0 + 3, 1)]);
        assert!(d[0].allowed && !d[1].allowed && !d[2].allowed && d[3].allowed);
        assert_eq!(d[1].remaining, 1);
        let o = acquire(None, &p, 5, T0);
        let denied = acquire(o.state, &p, 1, T0 + 1);
        assert_eq!((denied.state, denied.ttl_us), (o.state, None));
    }

    #[test]
    fn a_clock_stepping_back_never_refunds() {
        let p = params(1, 1_000, 10);
        let d = run(&p, &[(T0, 5), (T0 - 5_000_000, 1), (T0 + 1_000_000, 5)]);
        assert!(d[1].allowed, "{d:?}");
        assert_eq!(d[1].remaining, 4);
        // Measured from the caller's clock: 5 s back, plus 6 intervals of 1 s.
        assert_eq!(d[1].reset_after_us, 11_000_000);
        // 4 left and one back a second later: 5 again, and no more.
        assert!(d[2].allowed && d[2].remaining == 0, "{d:?}");
        let d = run(&p, &[(T0, 10), (T0 - 60_000_000, 1)]);
        assert!(!d[1].allowed);
        assert_eq!(d[1].retry_after_us, 61_000_000);
    }

    #[test]
    fn huge_bursts_refilled_once_a_month_neither_overflow_nor_lose_a_unit() {
        let p = params(1, MAX_PERIOD_MS, MAX_BURST);
        let o = acquire(None, &p, MAX_BURST, T0);
        assert!(o.decision.allowed);
        assert_eq!(o.decision.reset_after_us, MAX_WAIT_US);
        let d = acquire(o.state, &p, 1, T0 + 1).decision;
        assert!(!d.allowed);
        assert_eq!(d.retry_after_us, MAX_PERIOD_MS * 1_000 - 1);
        let d = acquire(o.state, &p, 1, T0 + MAX_PERIOD_MS * 1_000).decision;
        assert!(d.allowed && d.remaining == 0);

        // The fastest rate: a billion per ms, an interval of one millionth of a µs.
        let p = params(MAX_RATE, 1, MAX_BURST);
        let o = acquire(None, &p, MAX_BURST, T0);
        assert_eq!(o.decision.reset_after_us, 1_000);
        // A µs later a million intervals have passed.
        let d = acquire(o.state, &p, 2_000_000, T0 + 1).decision;
        assert!(!d.allowed);
        assert_eq!(d.retry_after_us, 1);
        assert_eq!(d.remaining, 1_000_000);
    }

    #[test]
    fn a_report_goes_into_debt_that_time_repays_exactly() {
        // 3 per second (an interval of 333,333⅓ µs), burst 4.
        let p = params(3, 1_000, 4);
        let taken = acquire(None, &p, 1, T0);
        // 3 left: room for 7 more before the level is twice the burst; the rest is dropped.
        let (o, units) = report(taken.state, &p, 20, T0);
        assert_eq!(units, 7);
        assert_eq!(
            o.decision,
            Decision {
                allowed: true,
                remaining: 0,
                // 8 intervals and 5 intervals, rounded up.
                reset_after_us: 2_666_667,
                retry_after_us: 1_666_667,
            }
        );
        assert_eq!(o.ttl_us, Some(2_666_667));
        for cost in [1, 4] {
            let d = acquire(o.state, &p, cost, T0 + 3).decision;
            assert!(!d.allowed);
            let at = T0 + 3 + d.retry_after_us;
            assert!(
                !acquire(o.state, &p, cost, at - 1).decision.allowed,
                "{cost}"
            );
            assert!(acquire(o.state, &p, cost, at).decision.allowed, "{cost}");
        }
        assert_eq!(
            acquire(o.state, &p, 4, T0).decision.retry_after_us,
            2_666_667
        );
    }

    #[test]
    fn a_report_at_the_bound_records_nothing_and_changes_nothing() {
        let p = params(1, 1_000, 5);
        let (o, units) = report(None, &p, super::super::MAX_UNITS, T0);
        assert_eq!(units, 10, "twice the burst from rest");
        let (again, units) = report(o.state, &p, 1, T0 + 999_999);
        assert_eq!(units, 0);
        assert_eq!((again.state, again.ttl_us), (o.state, None));
        assert_eq!(again.decision.remaining, 0);
        assert_eq!(again.decision.retry_after_us, 6_000_000 - 999_999);
        // One interval later there is room for one.
        let (later, units) = report(o.state, &p, 3, T0 + 1_000_000);
        assert_eq!(units, 1);
        assert_eq!(later.ttl_us, Some(10_000_000));
    }

    #[test]
    fn a_report_that_fits_leaves_units_and_no_retry() {
        let p = params(1, 1_000, 5);
        let (o, units) = report(None, &p, 2, T0);
        assert_eq!(units, 2);
        assert_eq!(o.decision.remaining, 3);
        assert_eq!(o.decision.retry_after_us, 0);
        assert_eq!(o.ttl_us, Some(2_000_000));
        assert_eq!(o.state, acquire(None, &p, 2, T0).state, "as a take of 2");
    }

    #[test]
    fn a_refund_never_goes_past_rest_nor_creates_state_nor_moves_the_expiry() {
        let p = params(3, 1_000, 4);
        let (o, units) = refund(None, &p, 5, T0, None);
        assert_eq!((units, o.state, o.ttl_us), (0, None, None));
        assert_eq!(o.decision.remaining, 4);

        let taken = acquire(None, &p, 3, T0);
        // Half an interval later: 2.5 intervals to drain, 3 in use.
        let (o, units) = refund(taken.state, &p, 5, T0 + 166_667, None);
        assert_eq!(units, 3);
        assert_eq!(o.ttl_us, None);
        assert_eq!(o.decision.remaining, 4);
        assert_eq!(o.decision.reset_after_us, 0);
        // At rest means exactly 4: one taken now drains in one whole interval.
        let next = acquire(o.state, &p, 1, T0 + 200_000);
        assert_eq!(next.decision.reset_after_us, 333_334);
        assert_eq!(next.decision.remaining, 3);
        let (again, units) = refund(o.state, &p, 1, T0 + 200_000, None);
        assert_eq!((units, again.state), (0, o.state));
    }

    #[test]
    fn a_refund_in_debt_repays_part_of_it() {
        let p = params(10, 1_000, 10);
        let (debt, _) = report(None, &p, 20, T0);
        let (o, units) = refund(debt.state, &p, 4, T0, None);
        assert_eq!(units, 4);
        assert_eq!(o.decision.remaining, 0);
        assert_eq!(o.decision.retry_after_us, 700_000);
        assert_eq!(o.decision.reset_after_us, 1_600_000);
        assert_eq!(o.ttl_us, None);
    }

    #[test]
    fn a_mark_gives_back_only_what_has_not_drained() {
        // One per second, burst 10.
        let p = params(1, 1_000, 10);
        let first = acquire(None, &p, 5, T0);
        let mark1 = T0 + first.decision.reset_after_us;
        assert_eq!(mark1, T0 + 5_000_000);
        // 1 in use by T0 + 4 s, 6 after the second take, at rest 6 s later.
        let second = acquire(first.state, &p, 5, T0 + 4_000_000);
        let mark2 = T0 + 4_000_000 + second.decision.reset_after_us;
        assert_eq!(mark2, T0 + 10_000_000);
        let (mark1, mark2) = (Mark::new(mark1, T0, 0), Mark::new(mark2, T0 + 4_000_000, 0));
        let now = T0 + 6_000_000;
        let (o, units) = refund(second.state, &p, 5, now, Some(mark1));
        assert_eq!((units, o.state, o.ttl_us), (0, second.state, None));
        assert_eq!(o.decision.remaining, 6);
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
        let (_, units) = refund(second.state, &p, 5, now + 500_000, None);
        assert_eq!(units, 4);
    }

    #[test]
    fn debt_at_the_largest_parameters_stays_exact() {
        // A billion per ms, burst a billion: twice over in debt is 2 ms of backlog.
        let p = params(MAX_RATE, 1, MAX_BURST);
        let (o, _) = report(None, &p, MAX_BURST, T0);
        let (o, units) = report(o.state, &p, MAX_BURST, T0);
        assert_eq!(units, MAX_BURST);
        assert_eq!(o.decision.reset_after_us, 2_000);
        assert_eq!(o.decision.retry_after_us, 1_001);
        let d = acquire(o.state, &p, MAX_BURST, T0 + 1_999).decision;
        assert_eq!(d.retry_after_us, 1);
        assert_eq!(d.remaining, 999_000_000);
        // One a month: the level is 2·10^9 intervals, far past the longest wait reported.
        let p = params(1, MAX_PERIOD_MS, MAX_BURST);
        let (o, _) = report(None, &p, MAX_BURST, T0);
        let (o, units) = report(o.state, &p, MAX_BURST, T0 + 1);
        assert_eq!(units, MAX_BURST);
        assert_eq!(o.decision.retry_after_us, MAX_WAIT_US);
        let (o, units) = refund(
            o.state,
            &p,
            MAX_BURST * 2,
            T0 + 2,
            Some(Mark::new(T0 + 2 + MAX_PERIOD_MS * 1_000, T0 + 1, 0)),
        );
        assert_eq!(units, 1, "one interval still to drain of that mark");
        assert_eq!(o.decision.remaining, 0);
    }

    #[test]
    fn a_held_mark_gives_back_a_take_whose_tat_is_past_the_longest_wait() {
        use crate::limiter::{Verdict, HELD_MARK};
        // One a month, burst 10^9: a report of 10^9 leaves a TAT 31 million years away.
        let p = params(1, MAX_PERIOD_MS, MAX_BURST);
        let interval = MAX_PERIOD_MS * 1_000;
        let mark_of = |o: &Outcome<State>, at: u64| {
            let mut v = Verdict::at(at);
            v.push(o.decision);
            let mark = v.marks().next().expect("one limit");
            mark
        };
        let (o, units) = report(None, &p, MAX_BURST, T0);
        assert_eq!(units, MAX_BURST);
        let mark = mark_of(&o, T0);
        assert_eq!(mark.at, HELD_MARK + T0, "held: past what a reply states");
        // All of it back, once (the 421 was the capped mark's 2^50 / 31 days).
        let (back, given) = refund(o.state, &p, MAX_BURST, T0 + 1, Some(mark));
        assert_eq!(given, MAX_BURST);
        assert_eq!(back.decision.remaining, MAX_BURST);
        // Behind a backlog of its own: its units drain last, and still all come back.
        let (o2, _) = report(o.state, &p, MAX_BURST, T0 + 5);
        let mark2 = mark_of(&o2, T0 + 5);
        let (_, given) = refund(o2.state, &p, MAX_BURST, T0 + 6, Some(mark2));
        assert_eq!(given, MAX_BURST);
        // Ten intervals later: the first report's own units cannot have drained by more than
        // ten (here they have: nothing queued before them), the rest come back.
        let later = T0 + 10 * interval;
        let (_, given) = refund(o.state, &p, MAX_BURST, later, Some(mark));
        assert_eq!(given, MAX_BURST - 10);
        // A take of 5 behind that backlog, refunded 10 intervals on: all 5 are still held, as
        // the intervals before take + 2^50 say.
        let (o3, _) = report(o.state, &p, 5, T0 + 7);
        let mark3 = mark_of(&o3, T0 + 7);
        let (_, given) = refund(o3.state, &p, 5, later, Some(mark3));
        assert_eq!(given, 5);
        // Past 2^50 µs after its take, a held mark gives nothing (its ticket has ended).
        let (_, given) = refund(o.state, &p, MAX_BURST, T0 + MAX_WAIT_US, Some(mark));
        assert_eq!(given, 0);
    }

    #[test]
    fn refunds_out_of_order_give_back_no_more_than_each_take_still_holds() {
        // As the bucket's: 1 a second, burst 10; A 5, B 5, A refunded, at rest 5 s later, C 10.
        let p = params(1, 1_000, 10);
        let mark_of = |o: &Outcome<State>, at: u64| {
            Mark::new(
                at + o.decision.reset_after_us,
                at,
                o.state.map_or(0, |s| s.refunded),
            )
        };
        let a = acquire(None, &p, 5, T0);
        let b = acquire(a.state, &p, 5, T0);
        let (ma, mb) = (mark_of(&a, T0), mark_of(&b, T0));
        let (back, given) = refund(b.state, &p, 5, T0, Some(ma));
        assert_eq!(given, 5);
        let c = acquire(back.state, &p, 10, T0 + 5_000_000);
        assert!(c.decision.allowed);
        let (_, given) = refund(c.state, &p, 5, T0 + 5_000_000, Some(mb));
        assert_eq!(given, 0, "B's units had drained by then");
        let (_, given) = refund(back.state, &p, 5, T0 + 2_000_000, Some(mb));
        assert_eq!(given, 3);
        // A partly drained take given back drops the part drained: re-anchored at t.
        let p = params(2, 295, 3);
        let a = acquire(None, &p, 1, T0);
        let b = acquire(a.state, &p, 2, T0 + 1);
        let (back, given) = refund(b.state, &p, 1, T0 + 1, Some(mark_of(&a, T0)));
        assert_eq!(given, 1);
        assert_eq!(
            back.state.map(|s| (s.anchor_us, s.units)),
            Some((T0 + 1, 2))
        );
        assert!(
            !decide(back.state, &p, 2, T0 + 147_500, false)
                .decision
                .allowed
        );
        assert!(
            decide(back.state, &p, 2, T0 + 147_501, false)
                .decision
                .allowed
        );
    }

    #[test]
    fn a_changed_rate_or_burst_keeps_the_units_in_use() {
        let o = acquire(None, &params(1, 1_000, 2), 2, T0);
        // Twice the rate: the 2 units in use still are, and now drain at 2 a second.
        let faster = params(2, 1_000, 2);
        let d = acquire(o.state, &faster, 1, T0).decision;
        assert!(!d.allowed && d.remaining == 0, "{d:?}");
        // Until rewritten the backlog drains at the interval it was written with.
        assert_eq!(d.retry_after_us, 1_000_000);
        let t = acquire(o.state, &faster, 1, T0 + 1_000_000);
        assert!(
            t.decision.allowed && t.decision.remaining == 0,
            "{:?}",
            t.decision
        );
        // The one unit left of the old backlog plus the one taken, at the new interval.
        assert_eq!(t.decision.reset_after_us, 1_000_000);
        assert_eq!(t.ttl_us, Some(1_000_000));
        let d = acquire(o.state, &params(1, 1_000, 3), 2, T0).decision;
        assert!(!d.allowed && d.remaining == 1, "{d:?}");
        // Once the TAT has passed, as no state.
        let live = acquire(o.state, &faster, 2, T0 + 2_000_000);
        assert_eq!(live, acquire(None, &faster, 2, T0 + 2_000_000));
    }

    #[test]
    fn a_lowered_burst_keeps_the_debt_bound_and_refunds_only_what_is_in_use() {
        let (o, _) = report(None, &params(1, 1_000, 10), 15, T0);
        let low = params(2, 1_000, 4);
        // 15 in use, more than twice the new burst: reports record nothing more.
        let (r, units) = report(o.state, &low, 3, T0);
        assert_eq!((units, r.decision.remaining), (0, 0));
        // A refund gives back at most what is in use, and never above full.
        let (f, given) = refund(o.state, &low, 100, T0 + 500_000, None);
        assert_eq!((given, f.decision.remaining), (15, 4));
    }

    #[test]
    fn the_interval_is_kept_in_lowest_terms() {
        assert_eq!(params(100, 60_000, 1).interval(), (600_000, 1));
        assert_eq!(params(3, 1_000, 1).interval(), (1_000_000, 3));
        let args = super::super::Rule::script_args(&params(10, 1_000, 7));
        assert_eq!(args.as_slice(), [7, 100_000, 1]);
    }

    #[test]
    fn out_of_range_parameters_name_their_field() {
        let e = Params::parse(0, 1_000, 1).unwrap_err();
        assert_eq!(e.field, "rate");
        assert_eq!(
            Params::parse(1, MAX_PERIOD_MS + 1, 1).unwrap_err().field,
            "period_ms"
        );
        let e = Params::parse(1, 1, MAX_BURST + 1).unwrap_err();
        assert_eq!(e.field, "burst");
        assert!(e
            .to_string()
            .contains("`burst` must be between 1 and 1000000000"));
    }
}
