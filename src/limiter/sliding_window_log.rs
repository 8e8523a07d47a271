//! Sliding window log: at most `limit` units in any trailing window of `window_us`.
//!
//! Exact: every granted request is remembered with its time and cost until it leaves the window
//! `(now - window_us, now]`. One entry per time: requests at the same time share it. On Redis
//! each entry is one sorted-set member carrying its units and a running total of units (so the
//! units in the window are read from the two ends, and a request costs Redis the same whatever
//! its cost). Both give identical decisions.
//!
//! Time never runs backwards past the newest entry: a request at a `now` before it is logged at
//! the newest entry's time, and the window is measured from there.
//!
//! Entries that have left the window are dropped only by what writes (a take, a report that
//! logs, a refund that gives), as on Redis, where a peek or a denial must write nothing. So
//! after the clock steps back, entries that had left the window at a later `now` count again
//! until the next write: stricter, never looser, and the same on both stores.
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
//! their running totals rewritten, so a mark gives only while at most [`REACH`] entries follow
//! its own (later, nothing: stricter, never looser), and a refund without one gives from at most
//! the [`REACH`] newest entries.
//!
//! **Cost** ([`REACH`]): one call touches at most [`REACH`] entries besides the one it logs. A
//! write drops at most [`REACH`] of the entries that have left the window (all of them at once
//! when no entry is left in it, which Redis does with one `UNLINK`); the others stay, count
//! again only if the clock steps back, as any stored entry does, and go with the next writes.
//! As on Redis, an entry's time is its identity: requests at one time share one entry.
//!
//! **A change of parameters** (a limit or a window changed by a policy update, an override or
//! a tier): the entries carry over (ADDITIVE: 4 units in the window of 10 leave 16 of 20, and
//! none of 3). The log says the window it was last logged under (the state's `window_us`, on
//! Redis carried by the newest member), which set its expiry. An entry counts in the shorter of
//! that window and the one decided: a shorter window applies at once; a longer one applies from
//! the first take or report under it, which makes it the log's (the entries still logged then,
//! those in the old window, count in the new one from there on), while a peek, a denial and a
//! refund count in the old window, so that the key expires when its last entry has left that
//! window, as a missing key is. A ticket's mark is read with the log's window. Whatever the
//! parameters, a state past its expiry answers as no state. Logs of the layout before (members
//! that do not say their window) are read as logged under the window decided.

use std::collections::VecDeque;

use super::{until, Decision, Outcome};

/// The largest `limit` accepted. It bounds the log: every entry holds at least one unit and a
/// report stops at `2 * limit` units in the window, so a log has at most `2 * limit` entries, and
/// at most that many leave the window in one call.
pub const MAX_LIMIT: u64 = 10_000;

/// The most entries one call removes, gives from or rewrites besides the one it logs, so that
/// no call costs Redis more than a few hundred member writes whatever the log holds (see the
/// module docs): a write drops at most this many entries that have left the window (all of
/// them when none is left in it), a refund without a mark gives from at most this many of the
/// newest, and a refund with a mark gives only while at most this many entries follow its own.
pub const REACH: usize = 256;

/// Validated parameters, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub limit: u64,
    pub window_us: u64,
}

/// Granted units, oldest first: `(time, units granted at that time)`, and the window they were
/// last logged under.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    pub entries: VecDeque<(u64, u64)>,
    /// The `window_us` of the last take or report that logged, which set the expiry; 0 for a
    /// log that does not say (written before this was kept: read as logged under the window
    /// decided). On Redis it rides on the newest member.
    pub window_us: u64,
}

super::window_rule!("sliding_window_log", MAX_LIMIT);

/// Decides one acquire of `cost` units at `now_us`.
pub fn acquire(state: Option<State>, p: &Params, cost: u64, now_us: u64) -> Outcome<State> {
    decide(state, p, cost, now_us, true)
}

/// Decides whether `cost` units fit at `now_us` and, when they do and `take` is set, takes them.
/// Otherwise nothing is taken and the decision describes the subject as it is: `allowed` says
/// whether the units fit, and `retry_after_us` is 0 when they do (see [`super::Rule::decide`]).
/// Entries that have left the window are dropped only when units are taken, as on Redis, where
/// a decision that takes nothing writes nothing.
pub fn decide(
    state: Option<State>,
    p: &Params,
    cost: u64,
    now_us: u64,
    take: bool,
) -> Outcome<State> {
    let mut log = state.unwrap_or_default();
    let w = Window::of(&log, p, now_us);

    let admits = w.count + cost <= p.limit;
    if admits && take {
        let reset = log_at(&mut log, p, &w, cost, now_us);
        Outcome {
            decision: Decision {
                allowed: true,
                remaining: p.limit - w.count - cost,
                reset_after_us: reset,
                retry_after_us: 0,
            },
            state: Some(log),
            ttl_us: Some(reset),
        }
    } else {
        let decision = standing(&log, &w, p, cost, now_us);
        let state = (!log.entries.is_empty()).then_some(log);
        Outcome {
            decision,
            state,
            ttl_us: None,
        }
    }
}

/// The subject as `w` finds it in `log`, for `cost` units, taking nothing: `w.gone` of its
/// oldest entries have left the window, `w.count` units are in it, and they leave it `w.span`
/// after their times.
fn standing(log: &State, w: &Window, p: &Params, cost: u64, now_us: u64) -> Decision {
    let admits = w.count + cost <= p.limit;
    // The request fits once the oldest `count + cost - limit` units in the window have left
    // it (more than `limit` of them when the subject is in debt).
    let mut must_leave = (w.count + cost).saturating_sub(p.limit);
    let mut leaves_at = w.t;
    for &(ts, n) in log.entries.iter().skip(w.gone) {
        leaves_at = ts;
        if n >= must_leave {
            break;
        }
        must_leave -= n;
    }
    // A log with nothing in the window is at full quota already: its newest entry has left
    // it, so this is 0.
    let reset = log
        .entries
        .back()
        .map_or(0, |&(newest, _)| until(newest + w.span, now_us));
    Decision {
        allowed: admits,
        remaining: p.limit.saturating_sub(w.count),
        reset_after_us: reset,
        retry_after_us: if admits {
            0
        } else {
            until(leaves_at + w.span, now_us)
        },
    }
}

/// Logs `cost` units whether they fit or not, as long as the units in the window stay at most
/// `2 * limit` (see the module docs): returns the outcome and the units logged. Nothing logged
/// (a subject at its bound) changes nothing.
pub fn report(state: Option<State>, p: &Params, cost: u64, now_us: u64) -> (Outcome<State>, u64) {
    let mut log = state.unwrap_or_default();
    let w = Window::of(&log, p, now_us);
    let recorded = cost.min((2 * p.limit).saturating_sub(w.count));
    if recorded == 0 {
        return (after(Some(log), p, now_us), 0);
    }
    let dropped = dropped(w.gone, log.entries.len());
    let reset = log_at(&mut log, p, &w, recorded, now_us);
    // Described as Redis describes it: the units this window held plus those logged, leaving
    // the window of the log as it now is (after a longer window, an entry that had left the
    // old one and stays, past what a write drops, counts again only from the next call, as any
    // stored entry may after a clock step back).
    let now_in = Window {
        t: w.t,
        gone: w.gone - dropped,
        count: w.count + recorded,
        span: p.window_us,
        logged: p.window_us,
    };
    let mut decision = standing(&log, &now_in, p, 1, now_us);
    decision.allowed = true;
    let o = Outcome {
        decision,
        state: Some(log),
        ttl_us: Some(reset),
    };
    (o, recorded)
}

/// Gives back at most `units` units of the log's entries in the window: with `mark`, those of
/// the entry at `mark - window_us`; without, the newest first (see the module docs). Returns
/// the outcome, which never creates state nor moves the expiry, and the units given back.
/// Nothing given changes nothing.
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
    let w = Window::of(&log, p, now_us);
    // Only entries in the window give, so whatever is given was in use. With a mark, the one
    // entry of its time (`at`), while in the window and followed by at most REACH entries.
    let want = units.min(w.count);
    let at = match mark {
        Some(mark) => {
            // The mark is its take's time plus the window the take logged under: the log's.
            let Some(i) = mark.checked_sub(w.logged).and_then(|time| {
                log.entries
                    .binary_search_by_key(&time, |&(ts, _)| ts)
                    .ok()
                    .filter(|&i| i >= w.gone && log.entries.len() - 1 - i <= REACH)
            }) else {
                return (after(Some(log), p, now_us), 0);
            };
            Some(i)
        }
        None => None,
    };
    let given = match at {
        Some(i) => want.min(log.entries[i].1),
        // The newest entries in the window, at most REACH of them.
        None => want.min(
            log.entries
                .iter()
                .skip(w.gone)
                .rev()
                .take(REACH)
                .map(|&(_, n)| n)
                .sum(),
        ),
    };
    if given == 0 {
        return (after(Some(log), p, now_us), 0);
    }
    match at {
        Some(i) => {
            log.entries[i].1 -= given;
            if log.entries[i].1 == 0 {
                log.entries.remove(i);
            }
        }
        None => {
            // The newest first; `given` is at most the units of the REACH newest entries in the
            // window, so the walk stops inside them.
            let mut left = given;
            while left > 0 {
                let Some((_, n)) = log.entries.back_mut() else {
                    break;
                };
                let g = left.min(*n);
                *n -= g;
                left -= g;
                if *n == 0 {
                    log.entries.pop_back();
                }
            }
        }
    }
    // A refund that gives writes the log, and drops what has left the window as a take does.
    // Something in the window gave, so some entry is left in it.
    log.entries.drain(..w.gone.min(REACH));
    (after(Some(log), p, now_us), given)
}

/// Where a log stands at `now`: the time its window ends at (`now`, or the newest entry's time
/// when the clock stepped back before it), the window's length `span`, how many of its oldest
/// entries have left the window, and the units of those still in it.
struct Window {
    t: u64,
    gone: usize,
    count: u64,
    /// The shorter of the window decided and the one the log was last logged under: an entry
    /// counts for neither longer than the window it was logged under (the log expires then)
    /// nor longer than the window decided.
    span: u64,
    /// The window the log was last logged under.
    logged: u64,
}

impl Window {
    fn of(log: &State, p: &Params, now_us: u64) -> Self {
        let logged = if log.window_us == 0 {
            p.window_us
        } else {
            log.window_us
        };
        let span = logged.min(p.window_us);
        let t = log.entries.back().map_or(now_us, |&(ts, _)| ts.max(now_us));
        let gone = match t.checked_sub(span) {
            Some(horizon) => log.entries.partition_point(|&(ts, _)| ts <= horizon),
            None => 0,
        };
        let count = log.entries.iter().skip(gone).map(|&(_, n)| n).sum();
        Self {
            t,
            gone,
            count,
            span,
            logged,
        }
    }
}

/// Drops the entries that have left the window `w`, logs `n` units at its end under the window
/// decided (which becomes the log's), and returns the time until they leave it, which is also
/// the time until the whole log has.
fn log_at(log: &mut State, p: &Params, w: &Window, n: u64, now_us: u64) -> u64 {
    let gone = dropped(w.gone, log.entries.len());
    log.entries.drain(..gone);
    match log.entries.back_mut() {
        Some((ts, units)) if *ts == w.t => *units += n,
        _ => log.entries.push_back((w.t, n)),
    }
    log.window_us = p.window_us;
    until(w.t + p.window_us, now_us)
}

/// How many of the `gone` entries that have left the window a write drops, of a log of `len`:
/// all when no entry is left in it, else at most [`REACH`].
fn dropped(gone: usize, len: usize) -> usize {
    if gone == len {
        len
    } else {
        gone.min(REACH)
    }
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

    fn entries(o: &Outcome<State>) -> Vec<(u64, u64)> {
        o.state
            .as_ref()
            .map_or(Vec::new(), |s| s.entries.iter().copied().collect())
    }

    fn log(entries: &[(u64, u64)]) -> Option<State> {
        Some(State {
            entries: entries.iter().copied().collect(),
            window_us: 0,
        })
    }

    #[test]
    fn a_report_goes_into_debt_that_time_repays_exactly() {
        let (o, recorded) = report(None, &P, 5, 100);
        assert_eq!(recorded, 5, "2 past the limit of 3");
        assert_eq!(o.ttl_us, Some(1_000));
        assert_eq!(
            o.decision,
            Decision {
                allowed: true,
                remaining: 0,
                reset_after_us: 1_000,
                retry_after_us: 1_000,
            }
        );
        // One more unit in debt, logged later: the debt is paid only when both entries leave.
        let (o, recorded) = report(o.state, &P, 1, 600);
        assert_eq!((recorded, o.decision.retry_after_us), (1, 500));
        let d = decide(o.state.clone(), &P, 1, 1_099, false).decision;
        assert!(!d.allowed && d.retry_after_us == 1);
        // At 1,100 the 5 units leave: 1 in the window, 2 free.
        let o = acquire(o.state, &P, 2, 1_100);
        assert!(o.decision.allowed && o.decision.remaining == 0);
        assert_eq!(entries(&o), [(600, 1), (1_100, 2)]);
    }

    #[test]
    fn a_report_at_twice_the_limit_records_nothing() {
        let (o, recorded) = report(None, &P, 1_000_000_000, 0);
        assert_eq!(recorded, 6, "twice the limit, no more");
        let (o, recorded) = report(o.state, &P, 1, 10);
        assert_eq!(recorded, 0);
        assert_eq!(o.ttl_us, None, "nothing written");
        assert_eq!(entries(&o), [(0, 6)]);
        assert_eq!(o.decision.retry_after_us, 1_000 - 10);
        // The one entry leaves whole at 1,000: the bound is free again.
        let (o, recorded) = report(o.state, &P, 9, 1_000);
        assert_eq!((recorded, entries(&o)), (6, vec![(1_000, 6)]));
    }

    #[test]
    fn a_denied_acquire_waits_for_the_whole_debt() {
        // 6 units at 0 and at 500 put 3 in debt twice over: 4 must leave for one to fit.
        let (o, _) = report(None, &P, 2, 0);
        let (o, _) = report(o.state, &P, 4, 500);
        let d = decide(o.state, &P, 1, 700, true).decision;
        assert!(!d.allowed);
        assert_eq!(d.retry_after_us, 500 + 1_000 - 700);
        assert_eq!(d.remaining, 0);
    }

    #[test]
    fn a_refund_never_creates_state_nor_goes_above_full_nor_moves_the_expiry() {
        let (o, given) = refund(None, &P, 3, 50, None);
        assert_eq!((o.state, o.ttl_us, given), (None, None, 0));
        assert_eq!(o.decision.remaining, 3);

        let o = acquire(None, &P, 2, 0);
        let (o, given) = refund(o.state, &P, 5, 10, None);
        assert_eq!(given, 2, "only what is in use");
        assert_eq!((o.state, o.ttl_us), (None, None));
        assert_eq!(
            o.decision,
            Decision {
                allowed: true,
                remaining: 3,
                reset_after_us: 0,
                retry_after_us: 0,
            }
        );
    }

    #[test]
    fn a_refund_without_a_mark_gives_the_newest_units_first() {
        let mut state = None;
        for (now, cost) in [(0, 1), (100, 1), (200, 1)] {
            state = acquire(state, &P, cost, now).state;
        }
        let (o, given) = refund(state, &P, 2, 300, None);
        assert_eq!(given, 2);
        assert_eq!(entries(&o), [(0, 1)]);
        assert_eq!(o.ttl_us, None);
        assert_eq!((o.decision.remaining, o.decision.reset_after_us), (2, 700));
        // Entries that have left the window give nothing: at 1,000 the one at 0 has left.
        let (o, given) = refund(o.state, &P, 1, 1_000, None);
        assert_eq!(given, 0);
        assert_eq!(entries(&o), [(0, 1)]);
    }

    #[test]
    fn a_refund_with_a_mark_gives_only_from_its_take_while_it_is_in_the_window() {
        let t1 = acquire(None, &P, 2, 0);
        let mark1 = t1.decision.reset_after_us; // at 0
        let t2 = acquire(t1.state, &P, 1, 400);
        let mark2 = 400 + t2.decision.reset_after_us;
        assert_eq!((mark1, mark2), (1_000, 1_400));

        // The first take's units, though the second is newer; its total stays.
        let (o, given) = refund(t2.state.clone(), &P, 3, 500, Some(mark1));
        assert_eq!(given, 2);
        assert_eq!(entries(&o), [(400, 1)]);
        assert_eq!((o.decision.remaining, o.decision.reset_after_us), (2, 900));
        // A mark no take made gives nothing and changes nothing.
        let (o, given) = refund(t2.state.clone(), &P, 3, 500, Some(mark1 + 1));
        assert_eq!((given, entries(&o)), (0, vec![(0, 2), (400, 1)]));
        let (o, given) = refund(t2.state.clone(), &P, 3, 500, Some(0));
        assert_eq!((given, entries(&o)), (0, vec![(0, 2), (400, 1)]));
        // Once the take has left the window, its mark gives nothing, and the entry that left
        // stays until a write removes it.
        let (o, given) = refund(t2.state, &P, 3, 1_000, Some(mark1));
        assert_eq!((given, entries(&o)), (0, vec![(0, 2), (400, 1)]));
        // The second take's mark at the same time gives its one unit, and drops the first.
        let (o, given) = refund(o.state, &P, 3, 1_000, Some(mark2));
        assert_eq!((given, o.state), (1, None));
    }

    #[test]
    fn a_mark_counts_the_time_a_take_was_logged_at_after_a_step_back() {
        let o = acquire(None, &P, 1, 5_000);
        // The clock steps back 400 µs: logged at 5,000 still, and its mark says so.
        let o = acquire(o.state, &P, 1, 4_600);
        let mark = 4_600 + o.decision.reset_after_us;
        assert_eq!(mark, 6_000);
        assert_eq!(entries(&o), [(5_000, 2)]);
        let (o, given) = refund(o.state, &P, 5, 4_600, Some(mark));
        assert_eq!((given, o.state), (2, None));
    }

    /// A log of `n` entries of one unit, 1 µs apart from 0, under a limit that holds them all.
    fn long_log(n: u64) -> (Params, Option<State>) {
        let p = Params {
            limit: MAX_LIMIT,
            window_us: 1_000_000,
        };
        (p, log(&(0..n).map(|t| (t, 1)).collect::<Vec<_>>()))
    }

    #[test]
    fn a_ticket_gives_while_at_most_reach_entries_follow_its_own() {
        let n = REACH as u64 + 10;
        let (p, state) = long_log(n);
        let mark = |t: u64| Some(t + p.window_us);
        let deepest = n - 1 - REACH as u64;
        let (o, given) = refund(state.clone(), &p, 1, n, mark(deepest));
        assert_eq!(given, 1);
        assert_eq!(entries(&o).len(), n as usize - 1);
        let (o, given) = refund(state, &p, 1, n, mark(deepest - 1));
        assert_eq!(
            (given, entries(&o).len()),
            (0, n as usize),
            "one entry too deep"
        );
    }

    #[test]
    fn a_refund_without_a_ticket_gives_from_at_most_reach_entries() {
        let (p, state) = long_log(REACH as u64 * 2);
        let (o, given) = refund(state, &p, 1_000_000_000, REACH as u64 * 2, None);
        assert_eq!(given, REACH as u64);
        assert_eq!(entries(&o).len(), REACH);
    }

    #[test]
    fn a_write_drops_at_most_reach_entries_that_left_unless_all_have() {
        let n = REACH as u64 * 3;
        let (p, state) = long_log(n);
        // All but the newest 10 have left the window at this time: REACH of them go.
        let now = n - 10 + p.window_us - 1;
        let o = acquire(state, &p, 1, now);
        assert_eq!(entries(&o).len(), n as usize - REACH + 1);
        // Those still stored are behind the new entry's window: they count for nothing.
        let d = decide(o.state.clone(), &p, 1, n, false).decision;
        assert_eq!(d.remaining, MAX_LIMIT - 11);
        // Once every one has left, they all go at once.
        let o = acquire(o.state, &p, 1, now + 2 * p.window_us);
        assert_eq!(entries(&o), [(now + 2 * p.window_us, 1)]);
    }

    #[test]
    fn what_writes_nothing_drops_nothing_so_a_step_back_sees_the_same_log_as_redis() {
        // On Redis only writes remove members that have left the window; here too.
        let o = acquire(None, &P, 3, 0);
        let peek = decide(o.state, &P, 1, 1_500, false);
        assert!(peek.decision.allowed && peek.decision.remaining == 3);
        assert_eq!(entries(&peek), [(0, 3)]);
        let back = decide(peek.state, &P, 1, 900, true);
        assert!(!back.decision.allowed, "the entry is in the window at 900");
        assert_eq!(back.decision.retry_after_us, 100);
        let taken = acquire(back.state, &P, 1, 1_500);
        assert_eq!(entries(&taken), [(1_500, 1)], "a take removes it");
    }

    #[test]
    fn a_changed_window_counts_the_entries_in_the_shorter_until_a_take_makes_it_the_logs() {
        let o = acquire(None, &P, 2, 0);
        let o = acquire(o.state, &P, 1, 400);
        let wide = Params {
            limit: 5,
            window_us: 3_000,
        };
        // At 1,200 the 2 units of 0 have left the log's window of 1,000: 1 counts of 5.
        let peek = decide(o.state.clone(), &wide, 1, 1_200, false).decision;
        assert_eq!((peek.remaining, peek.reset_after_us), (4, 200));
        // At 1,400 the log's last entry has left its window, when its key expires: as none.
        let live = decide(o.state.clone(), &wide, 5, 1_400, true);
        assert_eq!(live.decision, decide(None, &wide, 5, 1_400, true).decision);
        // A take at 1,200 makes the wide window the log's: the entry of 400 counts in it.
        let t = acquire(o.state, &wide, 1, 1_200);
        assert_eq!((t.decision.remaining, t.ttl_us), (3, Some(3_000)));
        assert_eq!(entries(&t), [(400, 1), (1_200, 1)]);
        let d = decide(t.state, &wide, 1, 3_300, false).decision;
        assert_eq!((d.remaining, d.reset_after_us), (3, 900));
    }

    #[test]
    fn a_lowered_limit_keeps_the_debt_bound_and_refunds_only_what_is_logged() {
        let o = acquire(None, &P, 2, 0);
        let o = acquire(o.state, &P, 1, 400);
        let low = Params {
            limit: 1,
            window_us: 1_000,
        };
        let (r, units) = report(o.state, &low, 1, 450);
        assert_eq!(
            (units, r.decision.remaining),
            (0, 0),
            "3 logged, twice 1 is 2"
        );
        let (f, given) = refund(r.state, &low, 10, 450, None);
        assert_eq!((given, f.decision.remaining), (3, 1));
        assert_eq!(f.ttl_us, None);
    }
}
