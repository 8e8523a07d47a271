//! Fixed window: at most `limit` units per window aligned to multiples of `window_us`.
//!
//! State: the window the count belongs to. A `now` in an earlier window (the clock stepped back)
//! keeps counting in the stored window instead of opening a fresh one. A changed `window_us`
//! starts a fresh count, since window numbers of different sizes do not compare.

use super::{until, Decision, Outcome};

/// Validated parameters, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub limit: u64,
    pub window_us: u64,
}

/// What is kept per subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// Window number: `start / window_us`.
    pub window: u64,
    pub count: u64,
    pub window_us: u64,
}

super::window_rule!("fixed_window", super::MAX_UNITS);

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
    let current = now_us / p.window_us;
    let (window, count) = match state {
        Some(s) if s.window_us == p.window_us && s.window >= current => (s.window, s.count),
        _ => (current, 0),
    };
    let end = (window + 1) * p.window_us;
    let admits = count + cost <= p.limit;
    if admits && take {
        let count = count + cost;
        let ttl = until(end, now_us);
        Outcome {
            decision: Decision {
                allowed: true,
                remaining: p.limit - count,
                reset_after_us: ttl,
                retry_after_us: 0,
            },
            state: Some(State {
                window,
                count,
                window_us: p.window_us,
            }),
            ttl_us: Some(ttl),
        }
    } else {
        let wait = until(end, now_us);
        Outcome {
            decision: Decision {
                allowed: admits,
                remaining: p.limit.saturating_sub(count),
                // Nothing counted: already at full quota.
                reset_after_us: if count == 0 { 0 } else { wait },
                retry_after_us: if admits { 0 } else { wait },
            },
            state,
            ttl_us: None,
        }
    }
}

/// PLACEHOLDER (issue 11, being written): records nothing.
pub fn report(state: Option<State>, p: &Params, cost: u64, now_us: u64) -> (Outcome<State>, u64) {
    let mut o = decide(state, p, 1.min(cost), now_us, false);
    o.decision.allowed = true;
    (o, 0)
}

/// PLACEHOLDER (issue 11, being written): gives back nothing.
pub fn refund(
    state: Option<State>,
    p: &Params,
    _units: u64,
    now_us: u64,
    _mark: Option<u64>,
) -> (Outcome<State>, u64) {
    let mut o = decide(state, p, 1, now_us, false);
    o.decision.allowed = true;
    (o, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Params = Params {
        limit: 3,
        window_us: 1_000_000,
    };

    fn run(seq: &[(u64, u64)]) -> Vec<Decision> {
        let mut state = None;
        seq.iter()
            .map(|&(now, cost)| {
                let o = acquire(state, &P, cost, now);
                state = o.state;
                o.decision
            })
            .collect()
    }

    #[test]
    fn allows_up_to_the_limit_then_denies_until_the_window_ends() {
        let d = run(&[(0, 1), (10, 1), (20, 1), (30, 1)]);
        assert!(d[..3].iter().all(|d| d.allowed));
        assert_eq!(d[2].remaining, 0);
        assert!(!d[3].allowed);
        assert_eq!(d[3].retry_after_us, 1_000_000 - 30);
    }

    #[test]
    fn windows_are_aligned_to_multiples_of_the_window() {
        let d = run(&[(999_999, 3), (1_000_000, 3)]);
        assert!(d[0].allowed && d[1].allowed);
        assert_eq!(d[0].reset_after_us, 1);
    }

    #[test]
    fn denied_acquire_does_not_consume() {
        let d = run(&[(0, 2), (1, 2), (2, 2), (3, 1)]);
        assert!(d[0].allowed && !d[1].allowed && !d[2].allowed);
        assert!(d[3].allowed, "the one unit left must still be there");
    }

    #[test]
    fn clock_step_back_does_not_reopen_an_old_window() {
        // Fill window 5, then the clock jumps back into window 4.
        let d = run(&[(5_000_000, 3), (4_500_000, 1)]);
        assert!(!d[1].allowed);
        assert_eq!(d[1].retry_after_us, 6_000_000 - 4_500_000);
    }

    #[test]
    fn cost_is_all_or_nothing() {
        let d = run(&[(0, 2), (1, 2), (2, 1)]);
        assert!(!d[1].allowed);
        assert_eq!(d[1].remaining, 1);
        assert!(d[2].allowed);
    }

    #[test]
    fn a_changed_window_size_starts_a_fresh_count() {
        let o = acquire(None, &P, 3, 5_000_000);
        let wider = Params {
            limit: 3,
            window_us: 3_600_000_000,
        };
        assert!(acquire(o.state, &wider, 1, 5_000_001).decision.allowed);
    }
}
