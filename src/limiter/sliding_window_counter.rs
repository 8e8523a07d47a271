//! Sliding window counter: the previous window's count, weighted by the part of it still inside
//! the trailing window, plus the current window's count, may not exceed `limit`.
//!
//! A request at `now`, `elapsed` into the current window, is allowed when
//! `current + cost + prev * (window - elapsed) / window <= limit`, decided exactly in integers
//! (the weighted term is rounded up). A `now` in a window earlier than the stored one (the clock
//! stepped back) is treated as the start of the stored window, so old windows never come back.

use super::arith::muldiv;
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
    /// Number of the current window: `start / window_us`.
    pub window: u64,
    pub previous: u64,
    pub current: u64,
    pub window_us: u64,
}

super::window_rule!("sliding_window_counter", super::MAX_UNITS);

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
    let w = p.window_us;
    let now_window = now_us / w;
    let (window, previous, current) = match state {
        Some(s) if s.window_us == w => {
            if now_window <= s.window {
                (s.window, s.previous, s.current)
            } else if now_window == s.window + 1 {
                (now_window, s.current, 0)
            } else {
                (now_window, 0, 0)
            }
        }
        _ => (now_window, 0, 0),
    };
    let start = window * w;
    let elapsed = now_us.max(start) - start;
    let weighted = weighted(previous, w - elapsed, w);

    let end_of_next = start + 2 * w;
    let admits = current + cost + weighted <= p.limit;
    if admits && take {
        let current = current + cost;
        let reset = until(end_of_next, now_us);
        Outcome {
            decision: Decision {
                allowed: true,
                remaining: p.limit - current - weighted,
                reset_after_us: reset,
                retry_after_us: 0,
            },
            state: Some(State {
                window,
                previous,
                current,
                window_us: w,
            }),
            ttl_us: Some(reset),
        }
    } else {
        let reset_at = if current > 0 {
            end_of_next
        } else if previous > 0 {
            start + w
        } else {
            // Nothing counted: already at full quota.
            now_us
        };
        // Earliest time at which `current + cost + weighted` fits, if nothing else arrives.
        let allowed_at = if admits {
            now_us
        } else if current + cost <= p.limit {
            // Later in this window, once the previous window's weight has shrunk enough.
            start + w - muldiv(w, p.limit - current - cost, previous).0
        } else {
            // In the next window, where this window's count becomes the weighted one.
            let room = p.limit - cost;
            let next = start + w;
            next + w.saturating_sub(muldiv(w, room, current).0)
        };
        Outcome {
            decision: Decision {
                allowed: admits,
                remaining: p.limit.saturating_sub(current + weighted),
                reset_after_us: until(reset_at, now_us),
                retry_after_us: until(allowed_at, now_us),
            },
            state,
            ttl_us: None,
        }
    }
}

/// `ceil(previous * remaining_part / window)`: the previous window's share still inside.
fn weighted(previous: u64, remaining_part: u64, window: u64) -> u64 {
    let (q, r) = muldiv(remaining_part, previous, window);
    q + u64::from(r > 0)
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
        limit: 10,
        window_us: 1_000,
    };

    fn run(seq: &[(u64, u64)]) -> Vec<Decision> {
        let mut state = None;
        seq.iter()
            .map(|&(now, cost)| {
                let o = acquire(state, &P, cost, now);
                if o.ttl_us.is_some() {
                    state = o.state;
                }
                o.decision
            })
            .collect()
    }

    #[test]
    fn previous_window_is_weighted_by_its_overlap() {
        // 10 in window 0; at 1_250 three quarters of it (7.5, rounded up to 8) still count.
        let d = run(&[(500, 10), (1_250, 2), (1_250, 1)]);
        assert!(d[1].allowed);
        assert_eq!(d[1].remaining, 0);
        assert!(!d[2].allowed);
        // 8 + 1 <= 10 needs the weight at most 7: 10 * (2000 - t) / 1000 <= 7 => t >= 1_300.
        assert_eq!(d[2].retry_after_us, 50);
    }

    #[test]
    fn full_current_window_waits_into_the_next_one() {
        let d = run(&[(0, 10), (10, 1)]);
        assert!(!d[1].allowed);
        // In window 1 the 10 units weigh 10 * (2000 - t) / 1000 <= 9 => t >= 1_100.
        assert_eq!(d[1].retry_after_us, 1_090);
        assert_eq!(d[1].reset_after_us, 1_990);
    }

    #[test]
    fn windows_two_apart_forget_everything() {
        let d = run(&[(0, 10), (2_000, 10)]);
        assert!(d[1].allowed);
    }

    #[test]
    fn clock_step_back_does_not_bring_back_old_windows() {
        let d = run(&[(5_000, 10), (3_000, 1)]);
        assert!(!d[1].allowed);
        assert_eq!(d[1].retry_after_us, 6_100 - 3_000);
    }

    #[test]
    fn denied_acquire_does_not_consume() {
        let d = run(&[(0, 8), (1, 3), (2, 3), (3, 2)]);
        assert!(!d[1].allowed && !d[2].allowed && d[3].allowed);
    }
}
