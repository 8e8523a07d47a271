//! Token bucket: `capacity` tokens, starting full, refilled continuously at `refill_tokens` per
//! `refill_period_us`.
//!
//! The level is kept exactly as whole tokens plus a fraction `fraction / refill_period_us`, with
//! the rate reduced by its greatest common divisor. Refill is `elapsed * refill_tokens` in those
//! units, so no tokens are lost to rounding however often the bucket is looked at (the classic
//! float script drifts). A `now` earlier than the last update (the clock stepped back) refills
//! nothing and never takes tokens away.

use super::arith::{gcd, muldiv};
use super::{Decision, Outcome, MAX_WAIT_US};

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
    pub tokens: u64,
    /// Part of the next token, in units of `1 / refill_period_us`; always below the period.
    pub fraction: u64,
    pub updated_us: u64,
    /// The reduced rate this level was computed with; another rate starts a full bucket.
    pub refill_tokens: u64,
    pub refill_period_us: u64,
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

    // PLACEHOLDER (issue 11, being written): records and gives back nothing.
    fn report(&self, state: Option<State>, _cost: u64, now_us: u64) -> (Outcome<State>, u64) {
        let mut o = decide(state, self, 1, now_us, false);
        o.decision.allowed = true;
        (o, 0)
    }

    fn refund(
        &self,
        state: Option<State>,
        _units: u64,
        now_us: u64,
        _mark: Option<u64>,
    ) -> (Outcome<State>, u64) {
        let mut o = decide(state, self, 1, now_us, false);
        o.decision.allowed = true;
        (o, 0)
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
    let (rate, period) = (p.refill_tokens, p.refill_period_us);
    let (mut tokens, mut fraction, updated) = match state {
        Some(s) if s.refill_tokens == rate && s.refill_period_us == period => {
            if s.tokens >= p.capacity {
                (p.capacity, 0, s.updated_us)
            } else {
                (s.tokens, s.fraction, s.updated_us)
            }
        }
        _ => (p.capacity, 0, now_us),
    };
    let t = now_us.max(updated);
    if tokens < p.capacity {
        let (q, r) = muldiv(t - updated, rate, period);
        let (q, r) = if r + fraction >= period {
            (q.saturating_add(1), r + fraction - period)
        } else {
            (q, r + fraction)
        };
        if q >= p.capacity - tokens {
            (tokens, fraction) = (p.capacity, 0);
        } else {
            (tokens, fraction) = (tokens + q, r);
        }
    }
    let skew = t - now_us;
    let level = Level {
        tokens,
        fraction,
        rate,
        period,
    };

    let admits = tokens >= cost;
    if admits && take {
        let after = Level {
            tokens: tokens - cost,
            ..level
        };
        let reset = (skew + after.wait_for(p.capacity)).min(MAX_WAIT_US);
        Outcome {
            decision: Decision {
                allowed: true,
                remaining: after.tokens,
                reset_after_us: reset,
                retry_after_us: 0,
            },
            state: Some(State {
                tokens: after.tokens,
                fraction,
                updated_us: t,
                refill_tokens: rate,
                refill_period_us: period,
            }),
            ttl_us: Some(reset),
        }
    } else {
        Outcome {
            decision: Decision {
                allowed: admits,
                remaining: tokens,
                reset_after_us: (skew + level.wait_for(p.capacity)).min(MAX_WAIT_US),
                retry_after_us: if admits {
                    0
                } else {
                    (skew + level.wait_for(cost)).min(MAX_WAIT_US)
                },
            },
            state,
            ttl_us: None,
        }
    }
}

struct Level {
    tokens: u64,
    fraction: u64,
    rate: u64,
    period: u64,
}

impl Level {
    /// Time until the level reaches `target` whole tokens: `ceil(((target - tokens) * period -
    /// fraction) / rate)`, capped at [`MAX_WAIT_US`].
    fn wait_for(&self, target: u64) -> u64 {
        if self.tokens >= target {
            return 0;
        }
        let (q, r) = muldiv(self.period, target - self.tokens, self.rate);
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

    #[test]
    fn rate_is_kept_in_lowest_terms() {
        let p = Params::new(20, 100, 60_000_000);
        assert_eq!((p.refill_tokens, p.refill_period_us), (1, 600_000));
    }
}
