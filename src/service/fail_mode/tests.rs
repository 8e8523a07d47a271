//! The fail-mode table row by row, and each kind of call answered by it with a real embedded
//! store to fall back on (and one that is full).

use super::*;
use crate::limiter::concurrency::{LeaseCall, LeaseOp, Params as LeaseParams};
use crate::limiter::Algorithm;
use crate::policy::{LimitKey, Policy, PolicyName};
use crate::store::{Ask, ErrorClass, LeasePlan, MemoryStore, Plan, StoreError};

const NOW: u64 = 1_000_000_000;

fn rate(name: &str, limit: u64, fail_mode: FailMode) -> Policy {
    Policy::single(
        PolicyName::parse(name).expect("valid name"),
        Algorithm::FixedWindow,
        &[limit, 60_000],
        None,
        fail_mode,
    )
}

fn leases(name: &str, limit: u64, fail_mode: FailMode) -> Policy {
    let params = LeaseParams {
        limit,
        lease_us: 10_000_000,
        max_lease_us: 10_000_000,
    };
    Policy::concurrent(
        PolicyName::parse(name).expect("valid name"),
        params,
        None,
        fail_mode,
    )
}

fn key(k: &str) -> LimitKey {
    LimitKey::parse(k.into()).expect("valid key")
}

/// Beside a shared store (`Some`, room for `room` subjects), or on the embedded store (`None`).
fn modes(room: Option<u64>) -> FailModes {
    FailModes::new(room.map(|max| MemoryStore::new("rl", max)))
}

fn failures() -> [StoreError; 2] {
    [
        StoreError::unavailable("refused"),
        StoreError::outcome_unknown("no answer"),
    ]
}

#[test]
fn each_fail_mode_falls_back_as_its_row_says() {
    use Fallback::*;
    let table = [
        (FailMode::Closed, true, Refuse),
        (FailMode::Closed, false, Refuse),
        (FailMode::Local, true, Local),
        (FailMode::Local, false, Allow),
        (FailMode::Open, true, Allow),
        (FailMode::Open, false, Allow),
    ];
    for (mode, local, row) in table {
        assert_eq!(fallback(mode, local), row, "{mode:?}, local {local}");
    }
}

#[test]
fn a_decision_is_answered_by_its_row() {
    let k = key("k");
    // (fail mode, room in the embedded store beside a shared one, expected: who decides and
    // whether the second acquire of a limit of 1 is allowed, or the error's class).
    type Row = (FailMode, Option<u64>, Option<(DecidedBy, bool)>);
    let rows: [Row; 6] = [
        (FailMode::Open, Some(100), Some((DecidedBy::FailOpen, true))),
        (FailMode::Open, None, Some((DecidedBy::FailOpen, true))),
        (
            FailMode::Local,
            Some(100),
            Some((DecidedBy::FailLocal, false)),
        ),
        // The embedded store full: as `open`.
        (FailMode::Local, Some(0), Some((DecidedBy::FailOpen, true))),
        (FailMode::Local, None, Some((DecidedBy::FailOpen, true))),
        (FailMode::Closed, Some(100), None),
    ];
    for (mode, room, expected) in rows {
        for error in failures() {
            let class = error.class();
            let fm = modes(room);
            let policy = rate("p", 1, mode);
            let plan = Plan::acquire(&policy, &k, 1);
            let first = fm.decision(&plan, error.duplicate(), NOW);
            let second = fm.decision(&plan, error, NOW);
            match expected {
                Some((by, allowed)) => {
                    let (v, first_by) = first.expect("answered");
                    assert!(v.allowed, "{mode:?} {room:?}: the first fits");
                    assert_eq!(first_by, by, "{mode:?} {room:?}");
                    let (v, second_by) = second.expect("answered");
                    assert_eq!(v.allowed, allowed, "{mode:?} {room:?}");
                    assert_eq!(second_by, by, "{mode:?} {room:?}");
                }
                None => {
                    // As what it is: an unknown outcome stays unknown.
                    assert_eq!(second.expect_err("refused").class(), class, "{mode:?}");
                }
            }
        }
    }
}

#[test]
fn an_open_answer_leaves_each_limit_its_quota_less_what_was_asked() {
    let policy = rate("p", 5, FailMode::Open);
    let k = key("k");
    let fm = modes(None);
    let asks: [(Ask<crate::store::Claim<'_>>, u64); 4] = [
        (Ask::Acquire { cost: 2 }, 3),
        (Ask::Peek { cost: 2 }, 3),
        (Ask::Report { cost: 2 }, 5),
        (
            Ask::Refund {
                cost: 2,
                ticket: None,
            },
            5,
        ),
    ];
    for (ask, remaining) in asks {
        let plan = Plan::new(&policy, &k, ask);
        let (v, by) = fm
            .decision(&plan, StoreError::unavailable("down"), NOW)
            .expect("answered");
        assert_eq!(by, DecidedBy::FailOpen);
        assert!(v.allowed);
        assert_eq!(v.at_us, NOW);
        assert_eq!(v.limits()[0].remaining, remaining, "{ask:?}");
        assert!(v.units().iter().all(|u| *u == 0), "nothing recorded");
    }
}

#[test]
fn a_joint_acquire_is_refused_when_any_part_is_closed() {
    let (open, closed) = (rate("o", 1, FailMode::Open), rate("c", 1, FailMode::Closed));
    let (a, b) = (key("a"), key("b"));
    let plans = [Plan::acquire(&open, &a, 1), Plan::acquire(&closed, &b, 1)];
    for error in failures() {
        let class = error.class();
        let refused = modes(Some(100)).joint(&plans, error, NOW);
        assert_eq!(refused.expect_err("refused").class(), class);
    }
}

#[test]
fn each_part_of_a_joint_acquire_is_answered_by_its_own_fail_mode() {
    let (open, local) = (rate("o", 1, FailMode::Open), rate("l", 1, FailMode::Local));
    let (a, b) = (key("a"), key("b"));
    let plans = [Plan::acquire(&open, &a, 1), Plan::acquire(&local, &b, 1)];
    let fm = modes(Some(100));
    let first = fm
        .joint(&plans, StoreError::unavailable("down"), NOW)
        .expect("answered");
    let by: Vec<DecidedBy> = first.iter().map(|(_, by)| *by).collect();
    assert_eq!(by, [DecidedBy::FailOpen, DecidedBy::FailLocal]);
    assert!(first.iter().all(|(v, _)| v.allowed));
    // The `local` policy's limit holds in this instance, as it would for the subject alone; the
    // request is all or nothing, so the `open` part is denied with it.
    let second = fm
        .joint(&plans, StoreError::outcome_unknown("no answer"), NOW)
        .expect("answered");
    assert!(second.iter().all(|(v, _)| !v.allowed), "{second:?}");
    assert_eq!(second[1].1, DecidedBy::FailLocal);
    assert!(!second[1].0.limits()[0].allowed);
    // Alone, the `local` subject is denied the same way.
    let alone = fm
        .decision(&plans[1], StoreError::unavailable("down"), NOW)
        .expect("answered");
    assert_eq!((alone.0.allowed, alone.1), (false, DecidedBy::FailLocal));
}

#[test]
fn a_joint_acquire_of_open_parts_or_with_a_full_embedded_store_is_allowed() {
    let (l1, l2) = (
        rate("l1", 1, FailMode::Local),
        rate("l2", 1, FailMode::Local),
    );
    let (a, b) = (key("a"), key("b"));
    let plans = [Plan::acquire(&l1, &a, 1), Plan::acquire(&l2, &b, 1)];
    for room in [Some(0), None] {
        let fm = modes(room);
        for _ in 0..3 {
            let answers = fm
                .joint(&plans, StoreError::unavailable("down"), NOW)
                .expect("answered");
            assert!(
                answers
                    .iter()
                    .all(|(v, by)| v.allowed && *by == DecidedBy::FailOpen),
                "{room:?}: {answers:?}"
            );
        }
    }
    let fm = modes(Some(100));
    for _ in 0..3 {
        let answers = fm
            .joint(&plans, StoreError::unavailable("down"), NOW)
            .expect("answered");
        assert!(answers.iter().all(|(_, by)| *by == DecidedBy::FailLocal));
    }
}

fn lease_call(op: LeaseOp, member: &str) -> LeaseCall<'_> {
    LeaseCall {
        op,
        member,
        cost: 1,
        lease_us: 5_000_000,
        limit: 1,
        deadline_us: Some(NOW - 1),
    }
}

#[test]
fn a_lease_call_is_answered_by_its_row() {
    let k = key("k");
    let member = "0123456789abcdef0123456789abcdef:1";
    for error in failures() {
        // `closed`: the error, its outcome settled.
        let policy = leases("c", 1, FailMode::Closed);
        let plan = LeasePlan {
            policy: &policy,
            key: &k,
            call: lease_call(LeaseOp::Take, member),
            at_us: None,
        };
        let refused = modes(Some(100)).lease(&plan, error.duplicate(), NOW);
        assert_eq!(
            refused.expect_err("refused").class(),
            ErrorClass::Unreachable
        );

        // `open`: a take is granted for its lifetime; a release is done, not known live.
        let policy = leases("o", 1, FailMode::Open);
        let fm = modes(Some(100));
        for (op, ok, in_use) in [(LeaseOp::Take, true, 1), (LeaseOp::Release, false, 0)] {
            let plan = LeasePlan {
                policy: &policy,
                key: &k,
                call: lease_call(op, member),
                at_us: None,
            };
            let (answer, by) = fm.lease(&plan, error.duplicate(), NOW).expect("answered");
            assert_eq!(by, DecidedBy::FailOpen, "{op:?}");
            assert_eq!((answer.ok, answer.in_use), (ok, in_use), "{op:?}");
            assert_eq!(answer.at_us, NOW);
        }

        // `local`: the embedded store decides a take (with no deadline: it always answers), and
        // a renewal of a lease it does not know is answered as `open`.
        let policy = leases("l", 1, FailMode::Local);
        let fm = modes(Some(100));
        let take = LeasePlan {
            policy: &policy,
            key: &k,
            call: lease_call(LeaseOp::Take, member),
            at_us: None,
        };
        let (answer, by) = fm.lease(&take, error.duplicate(), NOW).expect("answered");
        assert_eq!((answer.ok, by), (true, DecidedBy::FailLocal));
        let other = "fedcba9876543210fedcba9876543210:1";
        let second = LeasePlan {
            call: lease_call(LeaseOp::Take, other),
            ..take
        };
        let (answer, by) = fm.lease(&second, error.duplicate(), NOW).expect("answered");
        assert_eq!(
            (answer.ok, by),
            (false, DecidedBy::FailLocal),
            "the limit holds"
        );
        let renew = LeasePlan {
            call: lease_call(LeaseOp::Renew, other),
            ..take
        };
        let (answer, by) = fm.lease(&renew, error, NOW).expect("answered");
        assert_eq!((answer.ok, by), (true, DecidedBy::FailOpen));
    }
}
