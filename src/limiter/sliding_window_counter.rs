//! Sliding window counter: the previous window's count, weighted by the part of it still inside
//! the trailing window, plus the current window's count, may not exceed `limit`.
//!
//! A request at `now`, `elapsed` into the current window, is allowed when
//! `current + cost + prev * (window - elapsed) / window <= limit`, decided exactly in integers
//! (the weighted term is rounded up). A `now` in a window earlier than the stored one (the clock
//! stepped back) is treated as the start of the stored window, so old windows never come back.
//!
//! Usage at `now` is `current + ceil(previous * (window - elapsed) / window)`, what the limit
//! is compared with.
//!
//! Debt ([`report`]): a report adds its units to the current window's count whether they fit or
//! not, so usage may pass `limit`; it never passes `2 * limit`, and units beyond that are not
//! recorded. Time repays the debt as the windows slide: once the window ends its count becomes
//! the weighted previous one, whose weight falls to zero one window later, so the debt is repaid
//! within two windows of the report, and an acquire's `retry_after_us` is the exact time its cost
//! fits again (the same arithmetic as for any full window: a count above `limit` only makes the
//! wait longer).
//!
//! Refund ([`refund`]): units are taken off the counts of the trailing windows, never below
//! zero: without a ticket's mark off `current` first, then off `previous` (a unit given back from
//! `previous` frees only its weighted share now, since that is all it still counts for). A mark
//! is the end of the window after the take's (the take's `now` plus its `reset_after_us`): when
//! the take's window is the current one its units are given back from `current`, when it is the
//! previous one from `previous`, and once it is older nothing is given back. The expiry is left
//! alone: the state still counts for as long as it did.
//!
//! A change of parameters (a limit or a window changed by a policy update, an override or a
//! tier): the usage carries over (ADDITIVE: usage 4 of 10 leaves 16 of 20, and none of 3). With
//! the same window the counts stand as they are. With another, the stored windows go on sliding
//! at their own size, so that a peek, a denial or a refund (which writes in the stored windows)
//! sees the usage fall as it would have, and the key expires when both have slid out, as a
//! missing key is; the first take or report under the new window writes the usage at that time
//! (`current` plus the weighted `previous`, rounded up) as the count of the new-size window
//! that holds it, with no previous one. Whatever the parameters, a state past its expiry
//! answers as no state. Not exact: the carried usage counts whole until that new window ends
//! and then slides out over the next, where the old previous window's share would have slid
//! out sooner (stricter, never looser).

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
    let l = level(state.as_ref(), p, now_us);
    let admits = l.current + cost + l.weighted <= p.limit;
    if admits && take {
        let l = l.under(p, now_us);
        let current = l.current + cost;
        let reset = until(l.start + 2 * l.size, now_us);
        Outcome {
            decision: Decision {
                allowed: true,
                remaining: p.limit - current - l.weighted,
                reset_after_us: reset,
                retry_after_us: 0,
            },
            state: Some(State {
                window: l.window,
                previous: l.previous,
                current,
                window_us: l.size,
            }),
            ttl_us: Some(reset),
        }
    } else {
        let Level {
            previous,
            current,
            start,
            weighted,
            size: w,
            ..
        } = l;
        let end_of_next = start + 2 * w;
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

/// Where a subject stands at a time: its windows rolled forward to that time, in windows of the
/// size they were counted in.
#[derive(Debug, Clone, Copy)]
struct Level {
    /// The current window's number (the stored one after a clock step back).
    window: u64,
    previous: u64,
    current: u64,
    /// The current window's start, in µs.
    start: u64,
    /// The previous window's count still inside the trailing window, rounded up.
    weighted: u64,
    /// The windows' length, in µs.
    size: u64,
}

impl Level {
    /// The same usage in windows of `p.window_us`, as a take or a report writes it: unchanged
    /// when the size is the same; otherwise the usage at `now_us` (`current + weighted`) is the
    /// count of the window of the new size that holds `now_us`, with no previous one.
    fn under(self, p: &Params, now_us: u64) -> Level {
        if self.size == p.window_us {
            return self;
        }
        let window = now_us / p.window_us;
        Level {
            window,
            previous: 0,
            current: self.current + self.weighted,
            start: window * p.window_us,
            weighted: 0,
            size: p.window_us,
        }
    }
}

/// The subject's windows at `now_us`, as every operation reads them: the stored ones, of their
/// own size, while either still counts; else a fresh window of `p.window_us`.
fn level(state: Option<&State>, p: &Params, now_us: u64) -> Level {
    let stored = state.filter(|s| s.window_us > 0).and_then(|s| {
        let now_window = now_us / s.window_us;
        if now_window <= s.window {
            Some((s.window, s.previous, s.current, s.window_us))
        } else if now_window == s.window + 1 {
            Some((now_window, s.current, 0, s.window_us))
        } else {
            None
        }
    });
    let (window, previous, current, w) =
        stored.unwrap_or((now_us / p.window_us, 0, 0, p.window_us));
    let start = window * w;
    let elapsed = now_us.max(start) - start;
    Level {
        window,
        previous,
        current,
        start,
        weighted: weighted(previous, w - elapsed, w),
        size: w,
    }
}

/// Records `cost` units used at `now_us` in the current window whether they fit or not, up to a
/// usage of twice the limit (see [`super::Rule::report`]). Returns the outcome and the units
/// recorded.
pub fn report(state: Option<State>, p: &Params, cost: u64, now_us: u64) -> (Outcome<State>, u64) {
    let l = level(state.as_ref(), p, now_us);
    let units = cost.min((2 * p.limit).saturating_sub(l.current + l.weighted));
    if units == 0 {
        return (standing(state, p, now_us), 0);
    }
    let l = l.under(p, now_us);
    let mut o = standing(
        Some(State {
            window: l.window,
            previous: l.previous,
            current: l.current + units,
            window_us: l.size,
        }),
        p,
        now_us,
    );
    // Kept until the next window ends, as a take keeps it.
    o.ttl_us = Some(until(l.start + 2 * l.size, now_us));
    (o, units)
}

/// Gives back at most `units` units of the trailing windows' counts, never below zero: off
/// `current`, then `previous`; with a ticket's `mark`, only off the count of the take's window,
/// if it is one of the two (see [`super::Rule::refund`]). Returns the outcome, which keeps the
/// expiry, and the units given back.
pub fn refund(
    state: Option<State>,
    p: &Params,
    units: u64,
    now_us: u64,
    mark: Option<u64>,
) -> (Outcome<State>, u64) {
    let l = level(state.as_ref(), p, now_us);
    let w = l.size;
    // A take's mark is the end of the window after its own.
    let (from_current, from_previous) = match mark {
        None => {
            let c = units.min(l.current);
            (c, (units - c).min(l.previous))
        }
        Some(m) if m == l.start + 2 * w => (units.min(l.current), 0),
        Some(m) if m == l.start + w => (0, units.min(l.previous)),
        // Taken in a window that no longer counts, or not by this limit.
        Some(_) => (0, 0),
    };
    let given = from_current + from_previous;
    if given == 0 {
        return (standing(state, p, now_us), 0);
    }
    let state = State {
        window: l.window,
        previous: l.previous - from_previous,
        current: l.current - from_current,
        window_us: w,
    };
    (standing(Some(state), p, now_us), given)
}

/// The answer of a report or a refund: the subject as it stands, for one unit, allowed. Writes
/// nothing (`ttl_us` is `None`).
fn standing(state: Option<State>, p: &Params, now_us: u64) -> Outcome<State> {
    let mut o = decide(state, p, 1, now_us, false);
    o.decision.allowed = true;
    o
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

    /// Whether `cost` units would fit at `now`, decided without taking them.
    fn admits(state: Option<State>, cost: u64, now: u64) -> bool {
        decide(state, &P, cost, now, false).decision.allowed
    }

    /// The window, previous and current counts kept, if any.
    fn counts(o: &Outcome<State>) -> Option<(u64, u64, u64)> {
        o.state.map(|s| (s.window, s.previous, s.current))
    }

    #[test]
    fn a_report_goes_into_debt_up_to_twice_the_limit_and_time_repays_it_exactly() {
        let (o, units) = report(None, &P, 25, 0);
        assert_eq!(units, 20, "usage stops at twice the limit");
        assert_eq!(o.ttl_us, Some(2_000));
        // In window 1 the 20 units weigh ceil(20 * (2000 - t) / 1000); one unit fits once that
        // is at most 9: t >= 1_550.
        assert_eq!(
            o.decision,
            Decision {
                allowed: true,
                remaining: 0,
                reset_after_us: 2_000,
                retry_after_us: 1_550,
            }
        );
        let a = acquire(o.state, &P, 1, 1_549);
        assert!(!a.decision.allowed);
        assert_eq!(a.decision.retry_after_us, 1);
        assert!(!admits(a.state, 1, 1_549));
        let a = acquire(a.state, &P, 1, 1_550);
        assert!(a.decision.allowed);
        assert_eq!(a.decision.remaining, 0);
        // Without the acquire, the whole limit is back once the debt's window has slid out.
        assert!(!admits(o.state, 10, 1_999));
        assert!(admits(o.state, 10, 2_000));
    }

    #[test]
    fn a_report_counts_the_weighted_previous_window_towards_the_bound() {
        let (o, _) = report(None, &P, 20, 0);
        // At 1_250 the 20 weigh 15: 5 more reach the bound.
        let (o, units) = report(o.state, &P, 100, 1_250);
        assert_eq!(units, 5);
        assert_eq!(counts(&o), Some((1, 20, 5)));
        assert_eq!(o.ttl_us, Some(1_750));
    }

    #[test]
    fn a_report_at_the_bound_records_nothing_and_writes_nothing() {
        let (o, _) = report(None, &P, 20, 0);
        let before = o.state;
        let (o, units) = report(o.state, &P, 1, 500);
        assert_eq!(units, 0);
        assert_eq!(o.ttl_us, None);
        assert_eq!(o.state, before);
        assert_eq!(o.decision.retry_after_us, 1_050);
    }

    #[test]
    fn a_refund_never_creates_state() {
        let (o, given) = refund(None, &P, 3, 10, None);
        assert_eq!(given, 0);
        assert_eq!(o.state, None);
        assert_eq!(o.ttl_us, None);
        assert_eq!(o.decision.remaining, 10);
    }

    #[test]
    fn a_refund_takes_from_current_then_previous_never_below_zero() {
        let a = acquire(None, &P, 6, 0);
        let a = acquire(a.state, &P, 2, 1_500);
        // At 1_500 the 6 weigh 3: usage 5.
        assert_eq!(a.decision.remaining, 5);
        let (o, given) = refund(a.state, &P, 5, 1_600, None);
        assert_eq!(given, 5, "2 from current, 3 from previous");
        assert_eq!(counts(&o), Some((1, 3, 0)));
        assert_eq!(o.ttl_us, None, "the expiry does not move");
        // The 3 left weigh ceil(3 * 400 / 1000) = 2.
        assert_eq!(o.decision.remaining, 8);
        let (o, given) = refund(o.state, &P, 100, 1_700, None);
        assert_eq!(given, 3, "never above the full quota");
        assert_eq!(counts(&o), Some((1, 0, 0)));
        assert_eq!(o.decision.remaining, 10);
        assert_eq!(o.decision.reset_after_us, 0);
        let (o, given) = refund(o.state, &P, 1, 1_800, None);
        assert_eq!(given, 0);
        assert_eq!(counts(&o), Some((1, 0, 0)));
    }

    #[test]
    fn a_refund_with_a_mark_gives_back_from_its_take_window_only() {
        let a = acquire(None, &P, 4, 100);
        let mark = 100 + a.decision.reset_after_us;
        assert_eq!(mark, 2_000, "the end of the window after the take's");
        let a = acquire(a.state, &P, 3, 1_100);
        let later = 1_100 + a.decision.reset_after_us;
        // The first take's window is now the previous one.
        let (o, given) = refund(a.state, &P, 10, 1_200, Some(mark));
        assert_eq!(given, 4);
        assert_eq!(counts(&o), Some((1, 0, 3)));
        let (o, given) = refund(o.state, &P, 10, 1_200, Some(later));
        assert_eq!(given, 3);
        assert_eq!(counts(&o), Some((1, 0, 0)));
        // A mark that is no window's end of this limit gives nothing.
        let a = acquire(None, &P, 4, 100);
        let (o, given) = refund(a.state, &P, 4, 200, Some(1_999));
        assert_eq!(given, 0);
        assert_eq!(counts(&o), Some((0, 0, 4)));
        // Two windows on, the take's units no longer count anywhere.
        let (o, given) = refund(o.state, &P, 4, 2_000, Some(2_000));
        assert_eq!(given, 0);
        assert_eq!(o.decision.remaining, 10);
    }

    #[test]
    fn a_refund_pays_back_debt() {
        let (o, _) = report(None, &P, 20, 0);
        let (o, given) = refund(o.state, &P, 9, 10, None);
        assert_eq!(given, 9);
        assert_eq!(o.decision.remaining, 0, "11 of 10 used: still in debt");
        let (o, given) = refund(o.state, &P, 2, 20, None);
        assert_eq!(given, 2);
        assert_eq!(o.decision.remaining, 1);
        assert_eq!(o.decision.retry_after_us, 0);
    }

    #[test]
    fn retry_after_is_exact_for_every_cost_after_any_debt() {
        for first in [0, 3, 10, 17, 20] {
            for reported in 1..=20 {
                for at in [0, 1, 250, 999] {
                    let (o, _) = report(None, &P, first, 5_000);
                    let now = 6_000 + at;
                    let (o, _) = report(o.state, &P, reported, now);
                    for cost in 1..=P.limit {
                        let d = decide(o.state, &P, cost, now, false).decision;
                        let r = d.retry_after_us;
                        assert_eq!(d.allowed, r == 0);
                        if r > 0 {
                            let case = (first, reported, at, cost);
                            assert!(!admits(o.state, cost, now + r - 1), "{case:?}");
                            assert!(admits(o.state, cost, now + r), "{case:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_changed_window_carries_the_usage_into_a_window_of_the_new_size() {
        let second = Params {
            limit: 10,
            window_us: 1_000_000,
        };
        let o = acquire(None, &second, 4, 500_000);
        // A quarter into the next second, 3 of the 4 still count; then 20 per 10 s.
        let wide = Params {
            limit: 20,
            window_us: 10_000_000,
        };
        let peek = decide(o.state, &wide, 1, 1_250_000, false).decision;
        assert_eq!(peek.remaining, 17);
        // Until rewritten the old windows slide at their own size.
        assert_eq!(peek.reset_after_us, 750_000);
        let t = acquire(o.state, &wide, 1, 1_250_000);
        assert_eq!(t.decision.remaining, 16);
        assert_eq!(
            t.state,
            Some(State {
                window: 0,
                previous: 0,
                current: 4,
                window_us: 10_000_000,
            })
        );
        assert_eq!(t.ttl_us, Some(20_000_000 - 1_250_000));
        // Once both old windows have slid out (the key's expiry), as no state.
        let live = acquire(o.state, &wide, 1, 2_000_000);
        assert_eq!(live, acquire(None, &wide, 1, 2_000_000));
    }

    #[test]
    fn a_lowered_limit_keeps_the_debt_bound_and_refunds_only_what_counts() {
        let second = Params {
            limit: 10,
            window_us: 1_000_000,
        };
        let o = acquire(None, &second, 4, 500_000);
        let low = Params {
            limit: 2,
            window_us: 1_000_000,
        };
        let d = decide(o.state, &low, 1, 1_250_000, false).decision;
        assert!(!d.allowed && d.remaining == 0, "{d:?}");
        // Usage 3 of a bound of 4: one more unit recorded.
        let (r, units) = report(o.state, &low, 5, 1_250_000);
        assert_eq!(units, 1);
        let (f, given) = refund(r.state, &low, 10, 1_250_000, None);
        assert_eq!((given, f.decision.remaining), (5, 2));
    }
}
