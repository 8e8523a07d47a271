//! Sliding window log: at most `limit` units in any trailing window of `window_us`.
//!
//! Exact: every granted request is remembered with its time and cost until it leaves the window
//! `(now - window_us, now]`. On Redis each request is one sorted-set member carrying its cost
//! and a running total of units (so the units in the window are read from the two ends, and a
//! request costs Redis the same whatever its cost); here consecutive requests with the same time
//! share one entry, which keeps the embedded store small. Both give identical decisions.
//!
//! Time never runs backwards past the newest entry: a request at a `now` before it is logged at
//! the newest entry's time, and the window is measured from there.
//!
//! **Debt** ([`report`]): a report logs its units at `now` whether they fit or not, as long as
//! the units in the window stay at most `2 * limit`; units past that are not logged. A subject
//! in debt is denied until enough of its entries have left the window to bring it back under
//! `limit`: time pays the debt back exactly, entry by entry. As every entry (and every Redis
//! member) holds at least one unit, a log holds at most `2 * limit` of them.
//!
//! **Refund** ([`refund`]): gives units back by shrinking the entries they were logged in, so
//! that they stop counting at once, not when the entries leave the window. With a ticket's mark
//! (the take's time plus `window_us`) only the entry of that time, while it is still in the
//! window, gives anything: on Redis the newest member of that time first, then earlier ones of
//! the same time (takes in the same microsecond cannot be told apart). Without a mark the newest
//! entries give first. Only units in the window are given, so the log never goes below empty.
//! The expiry never moves: when the newest entry is given back whole, the state may outlive the
//! log's last entry, which changes no answer. On Redis, members after the refunded one have
//! their running totals rewritten: O(members after it), at most `2 * limit`.

use std::collections::VecDeque;

use super::{until, Decision, Outcome};

/// The largest `limit` accepted. It bounds the log: every entry holds at least one unit and a
/// report stops at `2 * limit` units in the window, so a log has at most `2 * limit` entries, and
/// at most that many leave the window in one call.
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
    let t = trim(&mut log, p, now_us);
    let count = units_in(&log);

    let admits = count + cost <= p.limit;
    if admits && take {
        let reset = log_at(&mut log, p, t, cost, now_us);
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
        // The request fits once the oldest `count + cost - limit` units have left the window
        // (more than `limit` of them when the subject is in debt).
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

/// Logs `cost` units whether they fit or not, as long as the units in the window stay at most
/// `2 * limit` (see the module docs): returns the outcome and the units logged. Nothing logged
/// (a subject at its bound) changes nothing.
pub fn report(state: Option<State>, p: &Params, cost: u64, now_us: u64) -> (Outcome<State>, u64) {
    let mut log = state.unwrap_or_default();
    let t = trim(&mut log, p, now_us);
    let recorded = cost.min((2 * p.limit).saturating_sub(units_in(&log)));
    if recorded == 0 {
        return (after(Some(log), p, now_us), 0);
    }
    let reset = log_at(&mut log, p, t, recorded, now_us);
    let mut o = after(Some(log), p, now_us);
    o.ttl_us = Some(reset);
    (o, recorded)
}

/// Gives back at most `units` units of the log's entries in the window: with `mark`, those of
/// the entry at `mark - window_us`; without, the newest first (see the module docs). Returns
/// the outcome, which never creates state nor moves the expiry, and the units given back.
pub fn refund(
    state: Option<State>,
    p: &Params,
    units: u64,
    now_us: u64,
    mark: Option<u64>,
) -> (Outcome<State>, u64) {
    let Some(mut log) = state else {
        return (after(None, p, now_us), 0);
    };
    trim(&mut log, p, now_us);
    // Only entries in the window are left, so whatever is given was in use.
    let mut left = units;
    match mark {
        Some(mark) => {
            let at = mark
                .checked_sub(p.window_us)
                .and_then(|time| log.entries.binary_search_by_key(&time, |&(ts, _)| ts).ok());
            if let Some(i) = at {
                let n = &mut log.entries[i].1;
                let g = left.min(*n);
                *n -= g;
                left -= g;
                if *n == 0 {
                    log.entries.remove(i);
                }
            }
        }
        None => {
            while let Some((_, n)) = log.entries.back_mut() {
                let g = left.min(*n);
                *n -= g;
                left -= g;
                if *n > 0 {
                    break;
                }
                log.entries.pop_back();
            }
        }
    }
    (after(Some(log), p, now_us), units - left)
}

/// Drops the entries that have left the window and returns the time the window ends at: `now`,
/// or the newest entry's time when the clock stepped back before it.
fn trim(log: &mut State, p: &Params, now_us: u64) -> u64 {
    let t = log.entries.back().map_or(now_us, |&(ts, _)| ts.max(now_us));
    if let Some(horizon) = t.checked_sub(p.window_us) {
        while log.entries.front().is_some_and(|&(ts, _)| ts <= horizon) {
            log.entries.pop_front();
        }
    }
    t
}

/// The units in the log.
fn units_in(log: &State) -> u64 {
    log.entries.iter().map(|&(_, n)| n).sum()
}

/// Logs `n` units at `t`, the window's end from [`trim`], and returns the time until they leave
/// the window, which is also the time until the whole log has.
fn log_at(log: &mut State, p: &Params, t: u64, n: u64, now_us: u64) -> u64 {
    match log.entries.back_mut() {
        Some((ts, units)) if *ts == t => *units += n,
        _ => log.entries.push_back((t, n)),
    }
    until(t + p.window_us, now_us)
}

/// A report's or a refund's answer: the subject as it stands, for one unit, allowed; the state
/// written with no new expiry.
fn after(state: Option<State>, p: &Params, now_us: u64) -> Outcome<State> {
    let mut o = decide(state, p, 1, now_us, false);
    o.decision.allowed = true;
    o
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
