//! The exact models of booking: what the times handed out admit over any interval, per
//! algorithm, checked against each algorithm's own definition rather than against its code; and
//! that a reservation which will not wait is an acquire.

use proptest::prelude::*;

use super::*;
use crate::limiter::{decide_op, Algorithm, Mark, Op};

const T0: u64 = 1_764_460_800_123_457;
const MS: u64 = 1_000;
const S: u64 = 1_000_000;

/// One limit: its algorithm and its fields' values, in [`Algorithm::fields`] order.
#[derive(Debug, Clone)]
struct Limit {
    algorithm: Algorithm,
    values: Vec<u64>,
}

impl Limit {
    fn params(&self) -> Params {
        self.algorithm.params(&self.values)
    }

    fn quota(&self) -> u64 {
        self.params().quota()
    }

    /// Whether `schedule` (the times units were granted for, in the order granted, and how
    /// many) is one the algorithm allows, from its definition: a bucket of `capacity` (GCRA:
    /// `burst`) refilled at its rate never grants more over `[a, b]` than its capacity plus
    /// what `b - a` refills; a fixed window (and the counter's current window, which it never
    /// lets pass its limit) never more than `limit` in one window; a log never more than
    /// `limit` within any `window_ms`.
    fn check(&self, schedule: &[(u64, u64)]) -> Result<(), String> {
        let v = &self.values;
        match self.algorithm {
            Algorithm::TokenBucket | Algorithm::Gcra => {
                let (capacity, tokens, period_us) = match self.algorithm {
                    Algorithm::TokenBucket => (v[0], v[1], v[2] * MS),
                    _ => (v[2], v[0], v[1] * MS),
                };
                for (i, &(a, _)) in schedule.iter().enumerate() {
                    let mut sum = 0;
                    for &(b, units) in &schedule[i..] {
                        sum += units;
                        let refilled =
                            u128::from(b - a) * u128::from(tokens) / u128::from(period_us);
                        if u128::from(sum) > u128::from(capacity) + refilled {
                            return Err(format!(
                                "{:?}: {sum} granted over [{a}, {b}], more than {capacity} + {refilled}",
                                self.algorithm
                            ));
                        }
                    }
                }
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindowCounter => {
                let (limit, window_us) = (v[0], v[1] * MS);
                let mut counts = std::collections::BTreeMap::new();
                for &(at, units) in schedule {
                    *counts.entry(at / window_us).or_insert(0) += units;
                }
                if let Some((w, n)) = counts.iter().find(|(_, &n)| n > limit) {
                    return Err(format!(
                        "{:?}: {n} granted in window {w}, limit {limit}",
                        self.algorithm
                    ));
                }
            }
            Algorithm::SlidingWindowLog => {
                let (limit, window_us) = (v[0], v[1] * MS);
                for &(b, _) in schedule {
                    let n: u64 = schedule
                        .iter()
                        .filter(|&&(a, _)| a <= b && b - a < window_us)
                        .map(|&(_, u)| u)
                        .sum();
                    if n > limit {
                        return Err(format!("log: {n} granted within {window_us} µs before {b}"));
                    }
                }
            }
        }
        Ok(())
    }
}

fn limit() -> impl Strategy<Value = Limit> {
    prop_oneof![
        (1u64..=6, 1u64..=4, 1u64..=1_500).prop_map(|(c, r, p)| Limit {
            algorithm: Algorithm::TokenBucket,
            values: vec![c, r, p],
        }),
        (1u64..=4, 1u64..=1_500, 1u64..=6).prop_map(|(r, p, b)| Limit {
            algorithm: Algorithm::Gcra,
            values: vec![r, p, b],
        }),
        (
            prop::sample::select(vec![
                Algorithm::FixedWindow,
                Algorithm::SlidingWindowLog,
                Algorithm::SlidingWindowCounter,
            ]),
            1u64..=6,
            1u64..=2_000
        )
            .prop_map(|(algorithm, l, w)| Limit {
                algorithm,
                values: vec![l, w],
            }),
    ]
}

/// One call: the clock's move, a number from which the cost is made, and the wait accepted.
fn calls() -> impl Strategy<Value = Vec<(u64, u64, u64)>> {
    let dt =
        prop_oneof![2 => Just(0u64), 3 => 0u64..2_000, 3 => 0u64..400_000, 1 => 0u64..3_000_000];
    let wait = prop_oneof![2 => Just(0u64), 1 => 0u64..50_000, 3 => 0u64..3_000_000];
    prop::collection::vec((dt, any::<u64>(), wait), 1..60)
}

fn fmt(states: &[Option<State>]) -> String {
    format!("{states:?}")
}

/// A policy's limits and their states, reserved at a clock that only moves forward.
struct Subject {
    params: Vec<Params>,
    states: Vec<Option<State>>,
    ttls: Vec<Option<u64>>,
    queue: Option<u64>,
}

impl Subject {
    fn new(params: Vec<Params>) -> Self {
        let n = params.len();
        Self {
            params,
            states: vec![None; n],
            ttls: vec![None; n],
            queue: None,
        }
    }

    fn reserve(&mut self, cost: u64, now: u64, max_wait: u64) -> Reservation {
        let r = reserve(
            &self.params,
            &mut self.states,
            &mut self.ttls,
            cost,
            now,
            self.queue,
            max_wait,
        );
        self.queue = r.queue_us;
        r
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Per limit, the units granted at the times handed out are what the algorithm allows over
    /// every interval; the times come in the order granted (first come, first served), within
    /// the wait accepted, and each is the first at which every limit admits; a denial takes
    /// nothing.
    #[test]
    fn booked_times_never_admit_more_than_any_limit_allows(
        limits in prop::collection::vec(limit(), 1..=3),
        calls in calls(),
    ) {
        let quota = limits.iter().map(Limit::quota).min().unwrap_or(1);
        let mut subject = Subject::new(limits.iter().map(Limit::params).collect());
        let mut schedule = Vec::new();
        let mut now = T0;
        for (dt, pick, max_wait) in calls {
            now += dt;
            let cost = 1 + pick % quota;
            let before = fmt(&subject.states);
            let (prior, queue) = (subject.states.clone(), subject.queue);
            let r = subject.reserve(cost, now, max_wait);
            if !r.verdict.allowed {
                prop_assert_eq!(fmt(&subject.states), before, "a denial took something");
                prop_assert_eq!(subject.queue, queue.filter(|&q| q > now));
                let retry = r.verdict.decision().retry_after_us;
                prop_assert!(retry > max_wait, "denied within the wait: {:?}", r);
                continue;
            }
            prop_assert!(r.delay_us <= max_wait);
            let act = now + r.delay_us;
            if let Some(&(last, _)) = schedule.last() {
                prop_assert!(act >= last, "granted {act} after {last} was booked");
            }
            prop_assert!(r.verdict.limits().iter().all(|d| d.retry_after_us == 0));
            let base = queue.map_or(now, |q| q.max(now));
            if act > base {
                // The first time every limit admits: a microsecond earlier, one does not.
                let earlier = subject.params.iter().zip(prior).any(|(p, state)| {
                    !p.decide(state, cost, act - 1, false).decision.allowed
                });
                prop_assert!(earlier, "booked for {act}, but all admitted at {}", act - 1);
            } else {
                prop_assert_eq!(act, base);
            }
            schedule.push((act, cost));
        }
        for l in &limits {
            l.check(&schedule).map_err(TestCaseError::fail)?;
        }
    }

    /// With no queue and no wait accepted, a reservation is an acquire: the same verdict, the
    /// same states and the same expiries.
    #[test]
    fn a_reservation_that_will_not_wait_is_an_acquire(
        limits in prop::collection::vec(limit(), 1..=3),
        calls in calls(),
    ) {
        let quota = limits.iter().map(Limit::quota).min().unwrap_or(1);
        let params: Vec<Params> = limits.iter().map(Limit::params).collect();
        let mut subject = Subject::new(params.clone());
        let mut states = vec![None; params.len()];
        let mut ttls = vec![None; params.len()];
        let mut now = T0;
        for (dt, pick, _) in calls {
            now += dt;
            let cost = 1 + pick % quota;
            let r = subject.reserve(cost, now, 0);
            let v = decide_op(&params, &mut states, &mut ttls, Op::Acquire, cost, now, &[]);
            prop_assert_eq!(r.delay_us, 0);
            prop_assert_eq!(r.queue_us, None);
            prop_assert_eq!(r.verdict.allowed, v.allowed);
            if v.allowed {
                prop_assert_eq!(r.verdict, v);
                prop_assert_eq!(&subject.ttls, &ttls);
            } else {
                prop_assert_eq!(r.verdict.decision().retry_after_us, v.decision().retry_after_us);
            }
            prop_assert_eq!(fmt(&subject.states), fmt(&states));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Cancelling, before a booking acts or after, later bookings made or not: each limit
    /// gives back what the booking still holds, and the units left granted (each booking's
    /// cost less what its limit gave back) are still what the algorithm allows over every
    /// interval. Cancels come in any order, and a ticket may be sent again: a refund of an
    /// earlier booking moves every later one up, which a bucket's or GCRA's mark alone would
    /// not know (it would overstate what its take still holds), and its refund count does.
    #[test]
    fn cancelled_bookings_give_back_only_what_every_limit_can_spare(
        limits in prop::collection::vec(limit(), 1..=3),
        calls in calls(),
        cancels in prop::collection::vec(any::<u64>(), 60),
    ) {
        let quota = limits.iter().map(Limit::quota).min().unwrap_or(1);
        let mut subject = Subject::new(limits.iter().map(Limit::params).collect());
        // Per limit, the units granted at each booked time; and each booking's marks.
        let mut granted: Vec<Vec<(u64, u64)>> = vec![Vec::new(); limits.len()];
        let mut tickets: Vec<(usize, u64, Vec<Mark>)> = Vec::new();
        let mut now = T0;
        for ((dt, pick, max_wait), cancel) in calls.into_iter().zip(cancels) {
            now += dt;
            if cancel % 3 == 0 {
                if tickets.is_empty() {
                    continue;
                }
                let pick = (cancel / 3) as usize % tickets.len();
                let (at, left, marks) = tickets[pick].clone();
                // Decided at the queue, as every decision of a subject that books is.
                let base = subject.queue.map_or(now, |q| q.max(now));
                let mut ttls = vec![None; limits.len()];
                let v = decide_op(&subject.params, &mut subject.states, &mut ttls, Op::Refund, left, base, &marks);
                for (i, given) in v.units().iter().enumerate() {
                    prop_assert!(*given <= granted[i][at].1);
                    granted[i][at].1 -= given;
                }
                // Kept to be sent again one time in four, for what its record says it has left
                // (the most any limit gave back comes off, as the stores keep it).
                if cancel % 4 == 0 {
                    tickets[pick].1 = left - v.units().iter().max().copied().unwrap_or(0);
                } else {
                    tickets.swap_remove(pick);
                }
                continue;
            }
            let cost = 1 + pick % quota;
            let r = subject.reserve(cost, now, max_wait);
            if r.verdict.allowed {
                for g in &mut granted {
                    g.push((now + r.delay_us, cost));
                }
                tickets.push((granted[0].len() - 1, cost, r.verdict.marks().collect()));
            }
        }
        for (l, g) in limits.iter().zip(&granted) {
            l.check(g).map_err(TestCaseError::fail)?;
        }
    }
}

fn gcra(rate: u64, period_ms: u64, burst: u64) -> Params {
    Algorithm::Gcra.params(&[rate, period_ms, burst])
}

#[test]
fn twenty_workers_sharing_ten_a_second_each_act_at_their_own_tenth_of_a_second() {
    for params in [
        gcra(10, 1_000, 1),
        Algorithm::TokenBucket.params(&[1, 10, 1_000]),
    ] {
        let mut s = Subject::new(vec![params]);
        let acts: Vec<u64> = (0..20)
            .map(|_| {
                let r = s.reserve(1, T0, 3 * S);
                assert!(r.verdict.allowed, "{params:?}: {r:?}");
                r.delay_us
            })
            .collect();
        let expected: Vec<u64> = (0..20).map(|i| i * 100 * MS).collect();
        assert_eq!(acts, expected, "{params:?}");
        // The queue reaches 1.9 s: an acquire that will not wait is denied until then, with that
        // wait; one accepting 2 s is booked after the twentieth.
        let r = s.reserve(1, T0 + 50 * MS, 0);
        assert!(!r.verdict.allowed);
        assert_eq!(r.verdict.decision().retry_after_us, 1_950 * MS);
        let r = s.reserve(1, T0 + 50 * MS, 2 * S);
        assert!(r.verdict.allowed);
        assert_eq!(r.delay_us, 1_950 * MS);
    }
}

#[test]
fn a_booking_past_the_wait_accepted_takes_nothing_and_says_when_it_would_fit() {
    let mut s = Subject::new(vec![gcra(10, 1_000, 5)]);
    assert!(s.reserve(5, T0, 0).verdict.allowed);
    let states = fmt(&s.states);
    let r = s.reserve(3, T0, 200 * MS);
    assert!(!r.verdict.allowed);
    assert_eq!(r.verdict.decision().retry_after_us, 300 * MS);
    assert_eq!((fmt(&s.states), r.queue_us), (states, None));
    assert_eq!(s.reserve(3, T0, 300 * MS).delay_us, 300 * MS);
}

#[test]
fn several_limits_book_the_latest_time_and_each_counts_it_then() {
    // 5 a second as a bucket, and 3 per fixed second: the window decides.
    let bucket = Algorithm::TokenBucket.params(&[5, 5, 1_000]);
    let window = Algorithm::FixedWindow.params(&[3, 1_000]);
    let start = T0 - T0 % S;
    let mut s = Subject::new(vec![bucket, window]);
    assert!(s.reserve(3, start, 0).verdict.allowed);
    let r = s.reserve(2, start, 2 * S);
    assert!(r.verdict.allowed);
    assert_eq!(r.delay_us, S, "the next window");
    let [b, w] = [r.verdict.limits()[0], r.verdict.limits()[1]];
    // Counted in the next second, which has 1 left, until its end.
    assert_eq!((w.remaining, w.reset_after_us), (1, 2 * S));
    // The bucket, taken at 1 s, was full again by then: 3 left, full 400 ms later.
    assert_eq!((b.remaining, b.reset_after_us), (3, S + 400 * MS));
    // A mark is the absolute time the booked units stop counting.
    let marks: Vec<u64> = r.verdict.marks().map(|m| m.at).collect();
    assert_eq!(marks, vec![start + S + 400 * MS, start + 2 * S]);
}

#[test]
fn a_cancelled_booking_frees_its_slot_for_the_next_reservation() {
    let mut s = Subject::new(vec![gcra(10, 1_000, 1)]);
    assert!(s.reserve(1, T0, 0).verdict.allowed);
    let booked = s.reserve(1, T0, S);
    assert_eq!(booked.delay_us, 100 * MS);
    let marks: Vec<Mark> = booked.verdict.marks().collect();
    // Cancelled before it acts: a refund with its ticket's marks gives the unit back.
    let mut ttls = vec![None];
    let v = decide_op(
        &s.params,
        &mut s.states,
        &mut ttls,
        Op::Refund,
        1,
        T0 + 10 * MS,
        &marks,
    );
    assert_eq!(v.units(), &[1]);
    // The next reservation gets the cancelled time, not a later one; and no caller that will
    // not wait jumps ahead of the queue.
    assert!(!s.reserve(1, T0 + 20 * MS, 0).verdict.allowed);
    assert_eq!(s.reserve(1, T0 + 20 * MS, S).delay_us, 80 * MS);
    assert_eq!(s.reserve(1, T0 + 20 * MS, S).delay_us, 180 * MS);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// The operations that accept no wait, decided with the queue ([`decide_queued`]) among
    /// bookings: an acquire or a peek admits only when no queue is ahead, and then as
    /// [`decide_op`] would; with acquires, reports, and refunds with the tickets of bookings and
    /// acquires (in any order) among them, the units granted and not given back are what each
    /// algorithm allows over every interval, at the times they are used. (A report takes
    /// whether or not it fits: it is left out of the schedule, which it can only shorten.)
    #[test]
    fn decisions_that_accept_no_wait_keep_to_the_queue(
        limits in prop::collection::vec(limit(), 1..=3),
        calls in calls(),
        kinds in prop::collection::vec(any::<u64>(), 60),
    ) {
        let quota = limits.iter().map(Limit::quota).min().unwrap_or(1);
        let mut subject = Subject::new(limits.iter().map(Limit::params).collect());
        let mut granted: Vec<Vec<(u64, u64)>> = vec![Vec::new(); limits.len()];
        let mut tickets: Vec<(usize, u64, Vec<Mark>)> = Vec::new();
        let mut now = T0;
        for ((dt, pick, max_wait), kind) in calls.into_iter().zip(kinds) {
            now += dt;
            let cost = 1 + pick % quota;
            let mut ttls = vec![None; limits.len()];
            let queue = subject.queue;
            let ahead = queue.is_some_and(|q| q > now);
            let mut queued = |op, cost, marks: &[Mark], subject: &mut Subject| {
                decide_queued(&subject.params, &mut subject.states, &mut ttls, (op, cost, marks), Queued { now_us: now, queue_us: queue })
            };
            let verdict = match kind % 5 {
                0 => {
                    if tickets.is_empty() {
                        continue;
                    }
                    let pick = (kind / 5) as usize % tickets.len();
                    let (at, left, marks) = tickets.swap_remove(pick);
                    let v = queued(Op::Refund, left, &marks, &mut subject);
                    for (i, given) in v.units().iter().enumerate() {
                        prop_assert!(*given <= granted[i][at].1);
                        granted[i][at].1 -= given;
                    }
                    continue;
                }
                1 | 2 => {
                    let op = if kind % 5 == 1 { Op::Acquire } else { Op::Peek };
                    let before = fmt(&subject.states);
                    let (mut states, mut plain_ttls) = (subject.states.clone(), vec![None; limits.len()]);
                    let plain = decide_op(&subject.params, &mut states, &mut plain_ttls, op, cost, now, &[]);
                    let v = queued(op, cost, &[], &mut subject);
                    if ahead {
                        prop_assert!(!v.allowed && v.limits().iter().all(|d| !d.allowed && d.retry_after_us > 0));
                        let first = v.limits().iter().map(|d| d.retry_after_us).min().unwrap_or(0);
                        prop_assert!(first >= queue.unwrap_or(0) - now, "{:?} ahead of the queue", v);
                        prop_assert_eq!(fmt(&subject.states), before);
                    } else {
                        prop_assert_eq!(v, plain);
                        prop_assert_eq!(fmt(&subject.states), fmt(&states));
                    }
                    if op == Op::Peek {
                        continue;
                    }
                    v
                }
                3 => {
                    let v = queued(Op::Report, cost, &[], &mut subject);
                    prop_assert!(v.taken_us >= queue.unwrap_or(0).max(now));
                    continue;
                }
                _ => {
                    let r = subject.reserve(cost, now, max_wait);
                    r.verdict
                }
            };
            if verdict.allowed {
                for g in &mut granted {
                    g.push((verdict.taken_us, cost));
                }
                tickets.push((granted[0].len() - 1, cost, verdict.marks().collect()));
            }
        }
        for (l, g) in limits.iter().zip(&granted) {
            l.check(g).map_err(TestCaseError::fail)?;
        }
    }
}
