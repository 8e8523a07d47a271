//! Sliding window log: at most `limit` units in any trailing window of `window_us`.
//!
//! Exact: every granted request is remembered with its time and cost until it leaves the window
//! `(now - window_us, now]`. On Redis each request is one sorted-set member carrying its cost
//! and a running total of units (so the units in the window are read from the two ends, and a
//! request costs Redis the same whatever its cost); here consecutive requests with the same time
//! share one entry, which keeps the embedded store small. Both give identical decisions.

use std::collections::VecDeque;

use super::{until, Decision, Outcome};

/// The largest `limit` accepted. It bounds the log: every entry holds at least one unit, so a log
/// has at most `limit` entries, and at most that many leave the window in one call.
pub const MAX_LIMIT: u64 = 10_000;

/// Validated parameters, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub limit: u64,
    pub window_us: u64,
}

/// Granted units, oldest first: `(time, units granted at that time)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    pub entries: VecDeque<(u64, u64)>,
}

super::window_rule!("sliding_window_log", MAX_LIMIT);

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
    let mut log = state.unwrap_or_default();
    // Time never runs backwards past the newest entry.
    let t = log.entries.back().map_or(now_us, |&(ts, _)| ts.max(now_us));
    if let Some(horizon) = t.checked_sub(p.window_us) {
        while log.entries.front().is_some_and(|&(ts, _)| ts <= horizon) {
            log.entries.pop_front();
        }
    }
    let count: u64 = log.entries.iter().map(|&(_, n)| n).sum();

    let admits = count + cost <= p.limit;
    if admits && take {
        match log.entries.back_mut() {
            Some((ts, n)) if *ts == t => *n += cost,
            _ => log.entries.push_back((t, cost)),
        }
        let reset = until(t + p.window_us, now_us);
        Outcome {
            decision: Decision {
                allowed: true,
                remaining: p.limit - count - cost,
                reset_after_us: reset,
                retry_after_us: 0,
            },
            state: Some(log),
            ttl_us: Some(reset),
        }
    } else {
        // The request fits once the oldest `count + cost - limit` units have left the window.
        let mut must_leave = (count + cost).saturating_sub(p.limit);
        let mut leaves_at = t;
        for &(ts, n) in &log.entries {
            leaves_at = ts;
            if n >= must_leave {
                break;
            }
            must_leave -= n;
        }
        // An empty log is at full quota already.
        let reset = log
            .entries
            .back()
            .map_or(0, |&(newest, _)| until(newest + p.window_us, now_us));
        let decision = Decision {
            allowed: admits,
            remaining: p.limit.saturating_sub(count),
            reset_after_us: reset,
            retry_after_us: if admits {
                0
            } else {
                until(leaves_at + p.window_us, now_us)
            },
        };
        let state = (!log.entries.is_empty()).then_some(log);
        Outcome {
            decision,
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
        window_us: 1_000,
    };

    fn run(seq: &[(u64, u64)]) -> Vec<Decision> {
        let mut state = None;
        seq.iter()
            .map(|&(now, cost)| {
                let o = acquire(state.take(), &P, cost, now);
                state = o.state;
                o.decision
            })
            .collect()
    }

    #[test]
    fn limits_every_trailing_window() {
        let d = run(&[
            (0, 1),
            (400, 1),
            (800, 1),
            (999, 1),
            (1_000, 1),
            (1_399, 1),
            (1_400, 1),
        ]);
        let allowed: Vec<bool> = d.iter().map(|d| d.allowed).collect();
        assert_eq!(allowed, [true, true, true, false, true, false, true]);
        assert_eq!(d[3].retry_after_us, 1);
    }

    #[test]
    fn requests_at_the_same_microsecond_all_count() {
        let d = run(&[(7, 1), (7, 1), (7, 1), (7, 1)]);
        assert_eq!(d[2].remaining, 0);
        assert!(!d[3].allowed);
    }

    #[test]
    fn retry_after_waits_for_enough_units_to_leave() {
        let d = run(&[(0, 1), (100, 2), (200, 3)]);
        assert!(!d[2].allowed);
        // All three units must leave: the last ones were granted at 100.
        assert_eq!(d[2].retry_after_us, 100 + 1_000 - 200);
        assert_eq!(d[2].reset_after_us, 900);
    }

    #[test]
    fn clock_step_back_does_not_expire_entries() {
        let d = run(&[(5_000, 3), (4_000, 1), (5_999, 1), (6_000, 1)]);
        assert!(!d[1].allowed && !d[2].allowed && d[3].allowed);
        assert_eq!(d[1].retry_after_us, 2_000);
    }

    #[test]
    fn denied_acquire_does_not_consume() {
        let d = run(&[(0, 2), (10, 2), (20, 2), (30, 1)]);
        assert!(!d[1].allowed && !d[2].allowed && d[3].allowed);
    }
}
