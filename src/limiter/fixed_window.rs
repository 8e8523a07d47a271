//! Fixed window: at most `limit` units per window, aligned to multiples of `window_us` since the
//! Unix epoch, or a calendar period (a day, week, month, quarter or year of a time zone) whose
//! boundaries the caller passes in ([`Bounds`], computed by [`super::calendar::period`]).
//!
//! State: the window the count belongs to, and its size: `(window number, count, window_us)` for
//! an epoch window, `(end, count, 0)` for a calendar period (a size of 0 marks a calendar state,
//! whose window is known by its end). A `now` in an earlier window (the clock stepped back)
//! keeps counting in the stored window instead of opening a fresh one.
//!
//! A calendar window is decided on the store's clock with the boundaries the instance computed
//! on its own: the period that holds the instance's time, `[start_us, end_us)`, and the end of
//! the next one. A store time before `start_us` falls in the period that ends at `start_us`, one
//! from `end_us` in the next period, so the decision is exact while the two clocks differ by
//! less than a period. A store time past the next period's end (clocks a whole period apart)
//! opens a window that has already ended: counted for one instant, never an error.
//!
//! A change of parameters (a limit or a window changed by a policy update, an override or a
//! tier; a calendar's unit, zone or anchor; an epoch window changed into a calendar one or back):
//! the count carries over while the window it was counted in has not ended (ADDITIVE: 4
//! counted of 10 leave 16 of 20, and none of 3). Takes, reports and refunds go on counting in
//! that window, of the size it was opened with, until it ends, which is when the key expires;
//! the next window is aligned to the new `window_us` or calendar, as for a missing key. So a
//! window made longer does not stretch the window already open (its count ends with it), and one
//! made shorter does not cut it (the count holds until the old window's end). Whatever the
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
    /// An epoch window's length; for a calendar window, the length of the period that holds the
    /// instance's time (what `RateLimit-Policy`'s `w` says).
    pub window_us: u64,
    /// A calendar window's boundaries; `None` for a window aligned to the epoch.
    pub calendar: Option<Bounds>,
}

impl Params {
    /// A window of `window_us` aligned to the epoch.
    pub const fn every(limit: u64, window_us: u64) -> Self {
        Self {
            limit,
            window_us,
            calendar: None,
        }
    }

    /// The script's parameters: `limit`, `window_us` (0 for a calendar window) and the
    /// calendar's [`Bounds`] (zeros for an epoch window).
    fn args(&self) -> super::ScriptArgs {
        match self.calendar {
            None => super::ScriptArgs::new(&[self.limit, self.window_us, 0, 0, 0]),
            Some(b) => {
                super::ScriptArgs::new(&[self.limit, 0, b.start_us, b.end_us, b.next_end_us])
            }
        }
    }
}

/// A calendar window's boundaries around the instance's time, in Unix microseconds: the period
/// that holds it, `[start_us, end_us)`, and the end of the period after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub start_us: u64,
    pub end_us: u64,
    pub next_end_us: u64,
}

impl Bounds {
    /// The end of the period that holds `now_us` on the store's clock: the period before (which
    /// ends at `start_us`), this one, or the next.
    pub const fn end_at(&self, now_us: u64) -> u64 {
        if now_us < self.start_us {
            self.start_us
        } else if now_us < self.end_us {
            self.end_us
        } else {
            self.next_end_us
        }
    }
}

/// What is kept per subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// Window number, `start / window_us`; a calendar period's end when `window_us` is 0.
    pub window: u64,
    pub count: u64,
    /// The size of the window the count was counted in; 0 for a calendar period.
    pub window_us: u64,
}

impl State {
    /// Whether its window has not ended at `now_us` (or is later: the clock stepped back).
    fn holds(&self, now_us: u64) -> bool {
        match self.window_us {
            0 => now_us < self.window,
            size => self.window >= now_us / size,
        }
    }
}

/// The end of `window` of `size` (a calendar period's end when `size` is 0).
const fn end_of(window: u64, size: u64) -> u64 {
    match size {
        0 => window,
        _ => (window + 1) * size,
    }
}

super::window_rule!("fixed_window", super::MAX_UNITS, 5);

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
    let end = end_of(window, size);
    let admits = count + cost <= p.limit;
    if admits && take {
        let count = count + cost;
        let wait = until(end, now_us);
        Outcome {
            decision: Decision {
                allowed: true,
                remaining: p.limit - count,
                reset_after_us: wait,
                retry_after_us: 0,
            },
            state: Some(State {
                window,
                count,
                window_us: size,
            }),
            ttl_us: Some(expiry(wait)),
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

/// The expiry of a state whose window ends in `wait_us`: at least 1 ms, as the script writes it,
/// for a window that has already ended (see the module doc).
fn expiry(wait_us: u64) -> u64 {
    if wait_us == 0 {
        1_000
    } else {
        wait_us
    }
}

/// The window that counts at `now_us`, its count and its size: the stored window, of the size
/// it was counted in, until it ends (and after a clock step back); then a fresh window of
/// `p.window_us`, or the calendar period that holds `now_us`, with nothing counted.
fn level(state: Option<&State>, p: &Params, now_us: u64) -> (u64, u64, u64) {
    match (state, p.calendar) {
        (Some(s), _) if s.holds(now_us) => (s.window, s.count, s.window_us),
        (_, None) => (now_us / p.window_us, 0, p.window_us),
        (_, Some(b)) => (b.end_at(now_us), 0, 0),
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
    let end = end_of(window, size);
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
    o.ttl_us = Some(expiry(until(end, now_us)));
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
    let end = end_of(window, size);
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

    const P: Params = Params::every(3, 1_000_000);

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
        let wider = Params::every(5, 3_600_000_000);
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
        let lower = Params::every(2, 2_000_000);
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

    // --- Calendar periods -------------------------------------------------------------------

    const HOUR: u64 = 3_600_000_000;
    /// A period's start, in Unix µs (an arbitrary midnight in 2025).
    const S: u64 = 1_764_460_800_000_000;

    /// `limit` per calendar period `[start, end)`, the next one ending at `next_end`, as the
    /// instance passes it.
    fn cal(limit: u64, start: u64, end: u64, next_end: u64) -> Params {
        Params {
            limit,
            window_us: end - start,
            calendar: Some(Bounds {
                start_us: start,
                end_us: end,
                next_end_us: next_end,
            }),
        }
    }

    /// Acquires of `cost` at each time, threading the state.
    fn run_cal(p: &Params, state: &mut Option<State>, seq: &[(u64, u64)]) -> Vec<Decision> {
        seq.iter()
            .map(|&(now, cost)| {
                let o = acquire(*state, p, cost, now);
                *state = o.state;
                o.decision
            })
            .collect()
    }

    #[test]
    fn a_23_hour_and_a_25_hour_day_each_end_at_their_own_end() {
        for hours in [23, 25] {
            let end = S + hours * HOUR;
            let p = cal(2, S, end, end + 24 * HOUR);
            let mut state = None;
            let d = run_cal(&p, &mut state, &[(S + HOUR, 2), (end - 1, 1), (end, 2)]);
            assert!(d[0].allowed, "{hours} h");
            assert_eq!(d[0].reset_after_us, (hours - 1) * HOUR, "{hours} h");
            assert!(!d[1].allowed, "{hours} h");
            assert_eq!(d[1].retry_after_us, 1, "denied exactly until the day ends");
            // The store's clock at the end, the instance's bounds still those of the day: the
            // next day, a fresh quota until its own end.
            assert!(d[2].allowed, "{hours} h");
            assert_eq!(d[2].reset_after_us, 24 * HOUR, "{hours} h");
            assert_eq!(
                state,
                Some(State {
                    window: end + 24 * HOUR,
                    count: 2,
                    window_us: 0
                })
            );
            // The instance moved on to the next day: the same period, known by its end.
            let next = cal(2, end, end + 24 * HOUR, end + 48 * HOUR);
            let d = acquire(state, &next, 1, end + HOUR).decision;
            assert!(!d.allowed);
            assert_eq!(d.retry_after_us, 23 * HOUR);
        }
    }

    #[test]
    fn a_store_clock_behind_the_start_counts_in_the_period_ending_at_the_start() {
        let end = S + 24 * HOUR;
        let p = cal(3, S, end, end + 23 * HOUR);
        let mut state = None;
        let d = run_cal(&p, &mut state, &[(S - 10, 3), (S - 1, 1), (S, 3)]);
        assert!(d[0].allowed);
        assert_eq!(
            d[0].reset_after_us, 10,
            "the previous period ends at the start"
        );
        assert_eq!(state.map(|s| s.window), Some(end));
        assert!(!d[1].allowed);
        assert_eq!(d[1].retry_after_us, 1);
        assert!(d[2].allowed, "the instance's period is a fresh one");
        assert_eq!(d[2].reset_after_us, 24 * HOUR);
        // Far behind (more than a period): still the period that ends at the start.
        let o = acquire(None, &p, 1, S - 30 * HOUR);
        assert_eq!(o.decision.reset_after_us, 30 * HOUR);
        assert_eq!(o.state.map(|s| s.window), Some(S));
    }

    #[test]
    fn a_store_clock_past_the_end_counts_in_the_next_period() {
        let end = S + 25 * HOUR;
        let next_end = end + 24 * HOUR;
        let p = cal(2, S, end, next_end);
        let mut state = None;
        let d = run_cal(&p, &mut state, &[(S + 5, 2), (end + 5, 2), (end + 6, 1)]);
        assert!(d[0].allowed && d[1].allowed);
        assert_eq!(d[1].reset_after_us, next_end - end - 5);
        assert!(!d[2].allowed);
        assert_eq!(d[2].retry_after_us, next_end - end - 6);
        assert_eq!(state.map(|s| (s.window, s.count)), Some((next_end, 2)));
    }

    #[test]
    fn a_store_clock_past_the_next_end_opens_a_window_that_has_already_ended() {
        let end = S + 24 * HOUR;
        let next_end = end + 24 * HOUR;
        let p = cal(2, S, end, next_end);
        for now in [next_end, next_end + 7, next_end + 400 * HOUR, u64::MAX / 2] {
            let o = acquire(None, &p, 2, now);
            assert!(o.decision.allowed, "{now}");
            assert_eq!(o.decision.remaining, 0);
            assert_eq!(o.decision.reset_after_us, 0, "the window has ended");
            assert_eq!(o.ttl_us, Some(1_000), "kept for the shortest expiry");
            assert_eq!(o.state.map(|s| (s.window, s.count)), Some((next_end, 2)));
            // Its count never counts again: every acquire finds the full quota.
            let again = acquire(o.state, &p, 2, now);
            assert!(again.decision.allowed);
            assert_eq!(again.ttl_us, Some(1_000));
            let (r, units) = report(o.state, &p, 10, now);
            assert_eq!(units, 4, "recorded up to twice the limit");
            assert_eq!(r.ttl_us, Some(1_000));
            assert_eq!((r.decision.remaining, r.decision.retry_after_us), (2, 0));
            let (f, given) = refund(o.state, &p, 2, now, None);
            assert_eq!((given, f.ttl_us), (0, None), "nothing left to give back");
            let (_, given) = refund(o.state, &p, 2, now, Some(next_end));
            assert_eq!(given, 0);
        }
        // The bounds a calendar limit holds before `Limit::params_at` fills them in: all zero.
        let zero = cal(2, 0, 0, 0);
        let o = acquire(None, &zero, 1, S);
        assert!(o.decision.allowed);
        assert_eq!((o.decision.reset_after_us, o.ttl_us), (0, Some(1_000)));
    }

    #[test]
    fn a_refund_mark_is_the_end_of_the_period_its_take_counted_in() {
        let end = S + 23 * HOUR;
        let next_end = end + 24 * HOUR;
        let p = cal(5, S, end, next_end);
        // (the store's time, the period that holds it by the instance's bounds)
        for (now, period_end) in [(S - 3, S), (S + 3, end), (end + 3, next_end)] {
            let a = acquire(None, &p, 3, now);
            let mark = now + a.decision.reset_after_us;
            assert_eq!(mark, period_end, "{now}");
            let (o, given) = refund(a.state, &p, 1, now + 1, Some(mark));
            assert_eq!(given, 1, "{now}");
            assert_eq!(o.decision.remaining, 3);
            assert_eq!(o.ttl_us, None, "the expiry stays the period's end");
            let (_, given) = refund(o.state, &p, 1, now + 1, Some(mark + 1));
            assert_eq!(given, 0, "another period's mark");
            // From the period's end, the take's units are counted nowhere.
            let (_, given) = refund(o.state, &p, 1, period_end, Some(mark));
            assert_eq!(given, 0, "{now}");
        }
    }

    #[test]
    fn report_debt_ends_at_the_period_end() {
        let end = S + 25 * HOUR;
        let p = cal(3, S, end, end + 24 * HOUR);
        let now = S + 2 * HOUR;
        let (o, units) = report(None, &p, 100, now);
        assert_eq!(units, 6, "up to twice the limit");
        assert_eq!(o.ttl_us, Some(end - now));
        assert_eq!(o.decision.retry_after_us, end - now);
        let d = acquire(o.state, &p, 1, end - 1).decision;
        assert!(!d.allowed);
        assert_eq!(d.retry_after_us, 1, "denied exactly until the period ends");
        let a = acquire(o.state, &p, 3, end);
        assert!(a.decision.allowed, "the next period starts from zero");
        assert_eq!(a.decision.reset_after_us, 24 * HOUR);
    }

    #[test]
    fn a_change_between_epoch_and_calendar_windows_carries_the_count_until_its_window_ends() {
        let hourly = Params::every(5, HOUR);
        let end = S + 24 * HOUR;
        let daily = cal(10, S, end, end + 23 * HOUR);
        // 3 counted in the hour [S + 5 h, S + 6 h), then the limit becomes 10 a calendar day.
        let t = S + 5 * HOUR + 10;
        let o = acquire(None, &hourly, 3, t);
        let o = acquire(o.state, &daily, 1, t + 1);
        assert!(o.decision.allowed);
        assert_eq!(o.decision.remaining, 6, "the hour's 3 carry over");
        assert_eq!(
            o.decision.reset_after_us,
            HOUR - 11,
            "in the hour, not the day"
        );
        assert_eq!(o.ttl_us, Some(HOUR - 11));
        assert_eq!(o.state.map(|s| (s.count, s.window_us)), Some((4, HOUR)));
        // Past the hour: the day's period, from nothing.
        let hour_end = S + 6 * HOUR;
        let c = acquire(o.state, &daily, 2, hour_end);
        assert_eq!(c.decision.remaining, 8);
        assert_eq!(c.decision.reset_after_us, end - hour_end);
        assert_eq!(c.state.map(|s| (s.window, s.window_us)), Some((end, 0)));
        // Back to 5 an hour: the day's 2 count until the day ends.
        let later = S + 10 * HOUR;
        let back = acquire(c.state, &hourly, 3, later);
        assert!(back.decision.allowed);
        assert_eq!(back.decision.remaining, 0);
        assert_eq!(back.decision.reset_after_us, end - later, "the day's end");
        let d = acquire(back.state, &hourly, 1, end - 1).decision;
        assert!(!d.allowed);
        assert_eq!(d.retry_after_us, 1);
        // From the day's end, hours again, as for a missing key.
        let fresh = acquire(back.state, &hourly, 5, end);
        assert_eq!(fresh.decision, acquire(None, &hourly, 5, end).decision);
        assert_eq!(fresh.state, acquire(None, &hourly, 5, end).state);
    }

    #[test]
    fn a_calendar_limit_gives_its_script_zero_for_the_window_and_its_bounds() {
        let p = cal(7, S, S + 24 * HOUR, S + 48 * HOUR);
        assert_eq!(
            p.args().as_slice(),
            &[7, 0, S, S + 24 * HOUR, S + 48 * HOUR]
        );
        assert_eq!(
            Params::every(7, 1_000).args().as_slice(),
            &[7, 1_000, 0, 0, 0]
        );
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
