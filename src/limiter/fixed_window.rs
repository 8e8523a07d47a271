//! Fixed window: at most `limit` units per window aligned to multiples of `window_us`.
//!
//! State: the window the count belongs to, and its size. A `now` in an earlier window (the clock
//! stepped back) keeps counting in the stored window instead of opening a fresh one.
//!
//! A change of parameters (a limit or a window changed by a policy update, an override or a
//! tier): the count carries over while the window it was counted in has not ended (ADDITIVE: 4
//! counted of 10 leave 16 of 20, and none of 3). Takes, reports and refunds go on counting in
//! that window, of the size it was opened with, until it ends, which is when the key expires;
//! the next window is aligned to the new `window_us`, as for a missing key. So a window made
//! longer does not stretch the window already open (its count ends with it), and one made
//! shorter does not cut it (the count holds until the old window's end). Whatever the
//! parameters, a state past its expiry answers as no state.
//!
//! Debt ([`report`]): a report adds its units to the window's count whether they fit or not, so
//! the count may pass `limit`; it never passes `2 * limit`, and units beyond that are not
//! recorded. The debt lives as long as its window: at the window's end the count starts again
//! from zero, so acquires are denied exactly until then, and the time to repay any debt is at
//! most one window.
//!
//! Refund ([`refund`]): units are taken off the count of the window `now` falls in (the stored
//! one after a clock step back), never below zero; a count of a window that has ended is never
//! touched. A ticket's mark is the end of the window its take counted in (the take's `now` plus
//! its `reset_after_us`), so with a mark units are given back only while that window is still
//! the current one. The expiry is left alone: it is the window's end, which a refund does not
//! move.

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
    let (window, count, size) = level(state.as_ref(), p, now_us);
    let end = (window + 1) * size;
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
                window_us: size,
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

/// The window that counts at `now_us`, its count and its size: the stored window, of the size
/// it was counted in, until it ends (and after a clock step back); then a fresh window of
/// `p.window_us` with nothing counted.
fn level(state: Option<&State>, p: &Params, now_us: u64) -> (u64, u64, u64) {
    match state {
        Some(s) if s.window_us > 0 && s.window >= now_us / s.window_us => {
            (s.window, s.count, s.window_us)
        }
        _ => (now_us / p.window_us, 0, p.window_us),
    }
}

/// Records `cost` units used at `now_us` whether they fit or not, up to a count of twice the
/// limit (see [`super::Rule::report`]). Returns the outcome and the units recorded.
pub fn report(state: Option<State>, p: &Params, cost: u64, now_us: u64) -> (Outcome<State>, u64) {
    let (window, count, size) = level(state.as_ref(), p, now_us);
    let units = cost.min((2 * p.limit).saturating_sub(count));
    if units == 0 {
        return (standing(state, p, now_us), 0);
    }
    let end = (window + 1) * size;
    let mut o = standing(
        Some(State {
            window,
            count: count + units,
            window_us: size,
        }),
        p,
        now_us,
    );
    // Kept until the window ends, as a take keeps it.
    o.ttl_us = Some(until(end, now_us));
    (o, units)
}

/// Gives back at most `units` units of the current window's count, never below zero; with a
/// ticket's `mark`, only if the current window is the one that ends at `mark`, the window the
/// ticket's take counted in (see [`super::Rule::refund`]). Returns the outcome, which keeps the
/// expiry, and the units given back.
pub fn refund(
    state: Option<State>,
    p: &Params,
    units: u64,
    now_us: u64,
    mark: Option<u64>,
) -> (Outcome<State>, u64) {
    let (window, count, size) = level(state.as_ref(), p, now_us);
    let end = (window + 1) * size;
    let held = match mark {
        // Taken in another window: that count has ended, or is not this one.
        Some(m) if m != end => 0,
        _ => count,
    };
    let given = units.min(held);
    if given == 0 {
        return (standing(state, p, now_us), 0);
    }
    let state = State {
        window,
        count: count - given,
        window_us: size,
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
    fn a_changed_window_keeps_the_count_until_the_window_it_was_counted_in_ends() {
        let o = acquire(None, &P, 3, 5_000_000);
        // An hour's window of 5: the 3 counted in this second still count, in this second.
        let wider = Params {
            limit: 5,
            window_us: 3_600_000_000,
        };
        let o = acquire(o.state, &wider, 1, 5_400_000);
        assert!(o.decision.allowed);
        assert_eq!(o.decision.remaining, 1);
        assert_eq!(o.decision.reset_after_us, 600_000, "the second's end");
        assert_eq!(o.ttl_us, Some(600_000));
        let d = acquire(o.state, &wider, 2, 5_400_001).decision;
        assert!(!d.allowed);
        assert_eq!(d.retry_after_us, 599_999);
        // Past it, a fresh window of the new size: the same as when the key has expired.
        let live = acquire(o.state, &wider, 5, 6_000_000);
        assert_eq!(live.decision, acquire(None, &wider, 5, 6_000_000).decision);
        assert_eq!(live.state, acquire(None, &wider, 5, 6_000_000).state);
    }

    #[test]
    fn a_lowered_limit_counts_what_was_used_and_refunds_stay_below_it() {
        let o = acquire(None, &P, 3, 5_000_000);
        let lower = Params {
            limit: 2,
            window_us: 2_000_000,
        };
        let d = decide(o.state, &lower, 1, 5_100_000, false).decision;
        assert!(!d.allowed && d.remaining == 0 && d.retry_after_us == 900_000);
        // Reports stop at twice the new limit, refunds at nothing counted.
        let (r, units) = report(o.state, &lower, 5, 5_100_000);
        assert_eq!(units, 1);
        let (f, given) = refund(r.state, &lower, 10, 5_200_000, None);
        assert_eq!((given, f.decision.remaining), (4, 2));
    }

    /// Whether `cost` units would fit at `now`, decided without taking them.
    fn admits(state: Option<State>, cost: u64, now: u64) -> bool {
        decide(state, &P, cost, now, false).decision.allowed
    }

    #[test]
    fn a_report_goes_into_debt_up_to_twice_the_limit_and_the_window_end_repays_it() {
        let (o, units) = report(None, &P, 5, 100);
        assert_eq!(units, 5);
        assert_eq!(o.ttl_us, Some(999_900));
        assert_eq!(
            o.decision,
            Decision {
                allowed: true,
                remaining: 0,
                reset_after_us: 999_900,
                retry_after_us: 999_900,
            }
        );
        // 5 of a bound of 6: one more is recorded, the rest is not.
        let (o, units) = report(o.state, &P, 1_000_000_000, 200);
        assert_eq!(units, 1);
        assert_eq!(o.state.map(|s| s.count), Some(6));
        let a = acquire(o.state, &P, 1, 999_999);
        assert!(!a.decision.allowed);
        assert_eq!(
            a.decision.retry_after_us, 1,
            "denied exactly until the window ends"
        );
        assert!(admits(a.state, 3, 1_000_000));
        let a = acquire(a.state, &P, 3, 1_000_000);
        assert!(a.decision.allowed);
        assert_eq!(a.decision.remaining, 0);
    }

    #[test]
    fn a_report_at_the_bound_records_nothing_and_writes_nothing() {
        let (o, _) = report(None, &P, 6, 0);
        let before = o.state;
        let (o, units) = report(o.state, &P, 1, 500_000);
        assert_eq!(units, 0);
        assert_eq!(o.ttl_us, None);
        assert_eq!(o.state, before);
        assert_eq!(o.decision.remaining, 0);
        assert_eq!(o.decision.retry_after_us, 500_000);
    }

    #[test]
    fn a_report_that_fits_answers_for_one_more_unit() {
        let (o, units) = report(None, &P, 2, 250_000);
        assert_eq!(units, 2);
        assert_eq!(
            o.decision,
            Decision {
                allowed: true,
                remaining: 1,
                reset_after_us: 750_000,
                retry_after_us: 0,
            }
        );
    }

    #[test]
    fn a_refund_never_creates_state() {
        let (o, given) = refund(None, &P, 3, 10, None);
        assert_eq!(given, 0);
        assert_eq!(o.state, None);
        assert_eq!(o.ttl_us, None);
        assert_eq!(o.decision.remaining, 3);
        assert_eq!(o.decision.reset_after_us, 0);
    }

    #[test]
    fn a_refund_gives_back_at_most_the_count_and_keeps_the_expiry() {
        let a = acquire(None, &P, 2, 100);
        let (o, given) = refund(a.state, &P, 5, 200, None);
        assert_eq!(given, 2, "never above the full quota");
        assert_eq!(o.ttl_us, None, "the expiry does not move");
        assert_eq!(o.state.map(|s| s.count), Some(0));
        assert_eq!(o.decision.remaining, 3);
        assert_eq!(o.decision.reset_after_us, 0);
        let (o, given) = refund(o.state, &P, 1, 300, None);
        assert_eq!(given, 0);
        assert_eq!(o.state.map(|s| s.count), Some(0));
    }

    #[test]
    fn a_refund_pays_back_debt() {
        let (o, _) = report(None, &P, 6, 0);
        let (o, given) = refund(o.state, &P, 2, 10, None);
        assert_eq!(given, 2);
        assert_eq!(o.decision.remaining, 0, "4 of 3 used: still in debt");
        assert_eq!(o.decision.retry_after_us, 999_990);
        let (o, given) = refund(o.state, &P, 2, 20, None);
        assert_eq!(given, 2);
        assert_eq!(o.decision.remaining, 1);
        assert_eq!(o.decision.retry_after_us, 0);
    }

    #[test]
    fn a_refund_with_a_mark_gives_back_only_in_the_window_of_its_take() {
        let a = acquire(None, &P, 2, 1_500_000);
        let mark = 1_500_000 + a.decision.reset_after_us;
        assert_eq!(mark, 2_000_000);
        // Another window's mark: nothing.
        let (o, given) = refund(a.state, &P, 2, 1_600_000, Some(1_000_000));
        assert_eq!(given, 0);
        assert_eq!(o.state.map(|s| s.count), Some(2));
        let (o, given) = refund(o.state, &P, 1, 1_600_000, Some(mark));
        assert_eq!(given, 1);
        assert_eq!(o.decision.remaining, 2);
        // The window has ended: the take's units are no longer counted anywhere.
        let (o, given) = refund(o.state, &P, 1, 2_000_000, Some(mark));
        assert_eq!(given, 0);
        assert_eq!(o.decision.remaining, 3);
        // Nor does a refund without a mark touch the ended window's count.
        let (o, given) = refund(o.state, &P, 1, 2_000_000, None);
        assert_eq!(given, 0);
        assert_eq!(o.state.map(|s| (s.window, s.count)), Some((1, 1)));
    }

    #[test]
    fn retry_after_is_exact_for_every_cost_after_any_debt() {
        for reported in 1..=8 {
            for at in [0, 1, 499_999, 999_999] {
                let (o, _) = report(None, &P, reported, 3_000_000 + at);
                for cost in 1..=P.limit {
                    let now = 3_000_000 + at;
                    let d = decide(o.state, &P, cost, now, false).decision;
                    let r = d.retry_after_us;
                    assert_eq!(d.allowed, r == 0);
                    if r > 0 {
                        assert!(
                            !admits(o.state, cost, now + r - 1),
                            "{reported} {at} {cost}"
                        );
                        assert!(admits(o.state, cost, now + r), "{reported} {at} {cost}");
                    }
                }
            }
        }
    }
}
