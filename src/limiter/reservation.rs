//! Reservations (issue 29): booking a cost over every limit of a policy for the earliest time,
//! no later than a wait the caller accepts, at which every limit admits it, as pure functions.
//! `lua/reserve.lua` (composed by `store::redis::scripts::compose_reserve`) decides the same on
//! Redis, the subject's queue in a key on its hash tag (`store::key::queue_key`), and
//! `tests/api/reservations.rs` holds it to [`reserve`]. Every store books through
//! `store::Ask::Reserve`, and every store decides every other operation with the queue
//! ([`decide_queued`], in `lua/common.lua`'s scripts on Redis; [`decide_joint_queued`] for a
//! joint acquire).
//!
//! A subject that takes reservations has a queue: the latest time anything is booked for
//! (`queue_us`, none once it has passed). Every decision of such a subject, an acquire that
//! will not wait included, is made at `base = max(now, queue)`, so nothing is admitted before
//! what was booked ahead of it (first come, first served), and each limit decides with its own
//! algorithm's [`super::Rule::decide`] at that time. A cost is booked for `act = base + w`,
//! where `w` is the longest of the limits' `retry_after_us` at `base` (the first time each
//! admits; each algorithm's admission only grows with time, so every limit admits at the
//! longest), looked at again at `act` until every limit admits there; it is taken at `act` on
//! every limit, and the queue moves to `act`. A cost whose `act - now` passes `max_wait_us`
//! is denied and takes nothing, its `retry_after_us` being `act - now`.
//!
//! Why that is exact for every algorithm: the units granted to a subject are accounted, by
//! every limit, at the times they are used, in the order of those times (a queue only moves
//! forward), so each limit sees exactly the sequence of takes its algorithm would see if each
//! caller came back at its `act` and acquired then. What any interval admits is therefore what
//! the algorithm admits over it: a bucket's capacity plus its refill, a window's limit, a log's
//! limit over any span of its window (the tests below check each on the times handed out). A
//! booking far ahead keeps no more state than a take does: the state is written at `act`, as a
//! take at `act` writes it, so memory stays bounded by the algorithm's own.
//!
//! The queue is the subject's, not a field of each limit's state, because a limit's state may
//! lie after `now` for another reason: a clock that stepped back, where the shared rule
//! (decide at the stored time, and admit) stays as it is for subjects that book nothing. A
//! step back while something is booked is decided at the queue, so it admits nothing early;
//! the exactness above is for a clock that does not step back past the stored times.
//!
//! Cancelling is a refund with the booking's ticket, decided with the queue ([`decide_queued`]):
//! at `max(now, queue)`, which is `act` or later, where it gives back what the booking still
//! holds, as any refund with a mark does; the queue stays where it is, so
//! the freed units go to the next reservation, at the cancelled one's time, not to a caller
//! jumping ahead of the queue.
//!
//! Times in the answer are measured from the caller's `now`, as every decision's are: after a
//! booking, `reset_after_us` is the delay plus the reset at `act`, so a ticket's marks
//! ([`super::Verdict::marks`]) are the absolute times its units stop counting.
//!
//! A calendar window's [`super::fixed_window::Bounds`] reach the end of the period after the
//! one holding `now`; the longest booking, [`LONGEST_WAIT_MS`], is far shorter than any
//! calendar period, so a booking's `act` always falls within them.

use super::{decide_op, Decision, Mark, Op, Params, State, Verdict, MAX_LIMITS, MAX_WAIT_US};

/// The longest wait a reservation may accept: one hour. Longer queues are better kept by the
/// caller; and it keeps every booking inside the calendar boundaries a decision is given.
pub const LONGEST_WAIT_MS: u64 = 3_600_000;

/// Looks at most this many times for a time at which every limit admits. Each algorithm's
/// `retry_after_us` is the first time it admits, so the second look admits; the rest are
/// for a limit whose retry rounds short.
const LOOKS: usize = 8;

/// The answer to one reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// Allowed (booked, or granted now when `delay_us` is 0) or denied, with each limit's
    /// decision measured from `now`: after the booking when allowed, as the subject stands at
    /// `max(now, queue)` when denied (nothing taken).
    pub verdict: Verdict,
    /// How long to wait before acting on an allowed reservation: 0 when the cost fits now.
    pub delay_us: u64,
    /// The subject's queue to keep: the latest booked time, when it is after `now`.
    pub queue_us: Option<u64>,
}

/// Reserves `cost` over every limit of a policy at `now_us`, waiting at most `max_wait_us`
/// (0: an acquire that will not wait, which a queue still delays). `states[i]` is limit `i`'s
/// state, replaced by what to keep, and `ttls[i]` is set as [`super::Outcome::ttl_us`] measured
/// from `now_us`. The slices are as long as `params`, at most [`MAX_LIMITS`]. Callers
/// guarantee `1 <= cost <= quota` of every limit, as for an acquire.
pub fn reserve(
    params: &[Params],
    states: &mut [Option<State>],
    ttls: &mut [Option<u64>],
    cost: u64,
    now_us: u64,
    queue_us: Option<u64>,
    max_wait_us: u64,
) -> Reservation {
    let base = queue_us.map_or(now_us, |q| q.max(now_us));
    let mut first = [None; MAX_LIMITS];
    let mut act = base;
    let mut settled = false;
    for look in 0..LOOKS {
        let mut wait = 0;
        for (i, p) in params.iter().enumerate() {
            let o = p.decide(states[i].take(), cost, act, false);
            states[i] = o.state;
            if !o.decision.allowed {
                wait = wait.max(o.decision.retry_after_us.max(1));
            }
            if look == 0 {
                first[i] = Some(o.decision);
            }
        }
        if wait == 0 {
            settled = true;
            break;
        }
        act = act.saturating_add(wait);
        if act - now_us > max_wait_us {
            break;
        }
    }
    let delay = act - now_us;
    let kept = queue_us.filter(|&q| q > now_us);
    if !settled || delay > max_wait_us {
        let first = first[..params.len()].iter().flatten().copied();
        return Reservation {
            verdict: denial(first, now_us, base - now_us, delay, max_wait_us),
            delay_us: 0,
            queue_us: kept,
        };
    }
    let mut verdict = Verdict::at(now_us);
    verdict.taken_us = act;
    for (i, p) in params.iter().enumerate() {
        let o = p.decide(states[i].take(), cost, act, true);
        verdict.refunded[i] = o.state.as_ref().map_or(0, State::refunded);
        states[i] = o.state;
        ttls[i] = o.ttl_us.map(|t| t.saturating_add(delay));
        verdict.push(later(o.decision, delay));
    }
    Reservation {
        verdict,
        delay_us: delay,
        queue_us: if delay > 0 { Some(act) } else { kept },
    }
}

/// When a decision is made: the caller's time, and the subject's queue then (see the module
/// doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queued {
    pub now_us: u64,
    pub queue_us: Option<u64>,
}

/// Decides an operation that accepts no wait (`op`, as [`decide_op`] does) on a subject whose
/// queue is `queue_us`, at `now_us`. With no queue ahead of now it is [`decide_op`]. With one, it
/// is decided at the queue, as every decision of a subject that books is: an acquire or a peek
/// is a reservation accepting no wait, denied by every limit (nothing is admitted ahead of what
/// was booked) with `retry_after_us` the wait for the queue plus the limit's own there; a report
/// is taken, and a refund given back, at the queue's time. Every time in the verdict is measured
/// from `now_us`, and `ttls` too; a report's `taken_us` is the queue's time.
pub fn decide_queued(
    params: &[Params],
    states: &mut [Option<State>],
    ttls: &mut [Option<u64>],
    (op, cost, marks): (Op, u64, &[Mark]),
    Queued { now_us, queue_us }: Queued,
) -> Verdict {
    let base = match queue_us {
        Some(q) if q > now_us => q,
        _ => return decide_op(params, states, ttls, op, cost, now_us, marks),
    };
    if matches!(op, Op::Acquire | Op::Peek) {
        // Always denied (the queue ahead is a longer wait than none), so nothing is written:
        // a peek's states stay exactly as they were.
        let mut unset = [None; MAX_LIMITS];
        return reserve(
            params,
            states,
            &mut unset[..params.len()],
            cost,
            now_us,
            queue_us,
            0,
        )
        .verdict;
    }
    let shift = base - now_us;
    let at_base = decide_op(params, states, ttls, op, cost, base, marks);
    let mut verdict = Verdict::at(now_us);
    verdict.taken_us = base;
    verdict.refunded = at_base.refunded;
    for (d, units) in at_base.limits().iter().zip(at_base.units()) {
        verdict.push_units(later(*d, shift), *units);
    }
    verdict.allowed = at_base.allowed;
    for ttl in ttls.iter_mut() {
        *ttl = ttl.map(|t| t.saturating_add(shift));
    }
    verdict
}

/// Decides a joint acquire (the Envoy descriptors of one request, [`super::decide_joint`]) whose
/// limits are of subjects with queues: `queues[i]` is the queue of limit `i`'s subject. With no
/// queue ahead of now it is [`super::decide_joint`]. With one, it is denied and takes nothing:
/// a limit of a subject whose queue is ahead is looked at there and denies as
/// [`decide_queued`] denies an acquire; every other limit is looked at now. `ttls` stay unset
/// (nothing is written).
pub fn decide_joint_queued(
    params: &[Params],
    states: &mut [Option<State>],
    ttls: &mut [Option<u64>],
    costs: &[u64],
    now_us: u64,
    queues: &[Option<u64>],
) -> (bool, Vec<Decision>) {
    let ahead = |i: usize| queues.get(i).copied().flatten().filter(|q| *q > now_us);
    if !(0..params.len()).any(|i| ahead(i).is_some()) {
        return super::decide_joint(params, states, ttls, costs, now_us);
    }
    let decisions = params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let at = ahead(i).unwrap_or(now_us);
            let o = p.decide(states[i].take(), costs[i], at, false);
            states[i] = o.state;
            ttls[i] = None;
            if at == now_us {
                return o.decision;
            }
            // Accepting no wait, it denies: the queue is after now.
            behind_queue(o.decision, at - now_us, 0).0
        })
        .collect();
    (false, decisions)
}

/// The denial at `now_us`: each limit as it stands at `max(now, queue)` (`shift` after now),
/// denying when the first time it admits, measured from now, is past the wait accepted, with
/// `retry_after_us` that time. When none is alone (their times only met past the wait), the
/// one that admits last denies, with the booking's `delay`.
fn denial(
    at_base: impl Iterator<Item = Decision>,
    now_us: u64,
    shift: u64,
    delay: u64,
    max_wait_us: u64,
) -> Verdict {
    let mut limits = [Decision {
        allowed: true,
        remaining: 0,
        reset_after_us: 0,
        retry_after_us: 0,
    }; MAX_LIMITS];
    let (mut n, mut last, mut latest) = (0, 0, 0);
    for (i, d) in at_base.enumerate().take(MAX_LIMITS) {
        let (d, own) = behind_queue(d, shift, max_wait_us);
        limits[i] = d;
        if own > latest {
            (last, latest) = (i, own);
        }
        n = i + 1;
    }
    if limits[..n].iter().all(|d| d.allowed) {
        limits[last].allowed = false;
        limits[last].retry_after_us = delay.min(MAX_WAIT_US);
    }
    let mut verdict = Verdict::at(now_us);
    for d in &limits[..n] {
        verdict.push(*d);
    }
    verdict
}

/// A limit's decision `d` at a subject's queue, `shift` µs after the caller's now, for a caller
/// accepting `max_wait_us`: measured from now, it admits at `own` (the wait for the queue plus
/// the limit's own there), and denies, with that wait, when `own` is past what is accepted.
/// Returns the decision and `own`.
fn behind_queue(d: Decision, shift: u64, max_wait_us: u64) -> (Decision, u64) {
    let own = shift.saturating_add(if d.allowed {
        0
    } else {
        d.retry_after_us.max(1)
    });
    let denies = own > max_wait_us;
    let d = Decision {
        allowed: !denies,
        retry_after_us: if denies { own.min(MAX_WAIT_US) } else { 0 },
        ..later(d, shift)
    };
    (d, own)
}

/// A decision made `shift` µs after the caller's now, measured from the caller's now.
fn later(d: Decision, shift: u64) -> Decision {
    let add = |us: u64| us.saturating_add(shift).min(MAX_WAIT_US);
    Decision {
        reset_after_us: add(d.reset_after_us),
        retry_after_us: if d.retry_after_us > 0 {
            add(d.retry_after_us)
        } else {
            0
        },
        ..d
    }
}

#[cfg(test)]
mod tests;
