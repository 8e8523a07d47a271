//! Peek, report and refund scripts on a real Redis, held to `limiter::decide_op`.
//!
//! A property test runs random sequences of acquires, peeks, reports and refunds (with a
//! ticket's marks, without, and with marks no take made) through the composed scripts of one to
//! three limits and through the pure functions, and requires identical replies step by step,
//! which holds the scripts' state to the model's. Targeted tests check what a reply cannot show:
//! a peek writes nothing, a refund moves no expiry and creates no key.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use ratelimiter::limiter::{decide_op, Mark, Op, State};
use ratelimiter::policy::{Algorithm, FailMode, Limit, Params, Policy, PolicyName};
use ratelimiter::store::key::state_key;
use ratelimiter::store::scripts;

use crate::helpers::TestRedis;
use crate::scripts::{limits, Spec};

/// A plausible current time in µs: large enough that float truncation would show.
const T0: u64 = 1_764_460_800_123_457;

/// A private Redis, a connection to it, and the scripts loaded so far (shared with
/// `reservations.rs`).
pub(crate) struct Lab {
    _redis: TestRedis,
    pub(crate) conn: redis::Connection,
    policies: u64,
    loaded: std::collections::HashMap<(Vec<Algorithm>, Op), String>,
}

impl Lab {
    pub(crate) fn new() -> Self {
        let redis = TestRedis::start();
        let conn = redis.conn();
        Self {
            _redis: redis,
            conn,
            policies: 0,
            loaded: Default::default(),
        }
    }

    /// A fresh policy of these limits, and its subject's state keys as the Redis store names
    /// them.
    pub(crate) fn policy(&mut self, specs: &[Spec]) -> (Policy, Vec<String>) {
        self.policies += 1;
        let name = PolicyName::parse(&format!("p{}", self.policies)).expect("valid name");
        let policy = if let [(a, values)] = specs {
            Policy::single(name, *a, values, None, FailMode::Closed)
        } else {
            let limits = specs
                .iter()
                .enumerate()
                .map(|(i, (a, values))| {
                    let limit = PolicyName::parse(&format!("l{}", i + 1)).expect("valid name");
                    Limit::new(limit, *a, values)
                })
                .collect();
            Policy::new(name, limits, None, FailMode::Closed).expect("valid limits")
        };
        let keys = policy
            .params()
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut k = String::new();
                state_key(
                    &mut k,
                    "rl",
                    policy.name.as_str(),
                    "subject",
                    policy.state_name(i),
                    p.algorithm(),
                );
                k
            })
            .collect();
        (policy, keys)
    }

    /// The SHA of the script of `op` for these limits, loaded once.
    fn sha(&mut self, params: &[Params], op: Op) -> String {
        let algorithms: Vec<Algorithm> = params.iter().map(Params::algorithm).collect();
        if let Some(sha) = self.loaded.get(&(algorithms.clone(), op)) {
            return sha.clone();
        }
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(scripts::compose(&algorithms, op))
            .query(&mut self.conn)
            .expect("SCRIPT LOAD");
        self.loaded.insert((algorithms, op), sha.clone());
        sha
    }

    /// One call of `op`'s script at `now`, as the Redis store makes it (a peek with
    /// `EVALSHA_RO`), with `marks` for a refund (empty: none). With `persist`, every key is
    /// persisted in the same transaction, so that simulated time may run ahead of Redis's clock.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn call(
        &mut self,
        keys: &[String],
        params: &[Params],
        op: Op,
        cost: u64,
        now: u64,
        marks: &[Mark],
        persist: bool,
    ) -> Result<Vec<u64>, String> {
        let sha = self.sha(params, op);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd(if op == Op::Peek {
                "EVALSHA_RO"
            } else {
                "EVALSHA"
            })
            .arg(sha)
            .arg(keys.len())
            .arg(keys)
            .arg(cost)
            .arg(now);
        for p in params {
            pipe.arg(p.script_args().as_slice());
        }
        if op == Op::Refund {
            pipe.arg(crate::helpers::mark_args(params.len(), marks));
        }
        if persist {
            for k in keys {
                pipe.cmd("PERSIST").arg(k).ignore();
            }
        }
        let (reply,): (Vec<u64>,) = pipe.query(&mut self.conn).map_err(|e| e.to_string())?;
        Ok(reply)
    }

    /// A key's content and absolute expiry (`PEXPIRETIME`; -1 none, -2 no key).
    fn snapshot(&mut self, key: &str) -> (Vec<Vec<u8>>, i64) {
        let conn = &mut self.conn;
        let kind: String = redis::cmd("TYPE").arg(key).query(conn).expect("TYPE");
        let content: Vec<Vec<u8>> = match kind.as_str() {
            "none" => vec![],
            "string" => vec![redis::cmd("GET").arg(key).query(conn).expect("GET")],
            "zset" => redis::cmd("ZRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query(conn)
                .expect("ZRANGE"),
            other => panic!("{key} is a {other}"),
        };
        let expires: i64 = redis::cmd("PEXPIRETIME")
            .arg(key)
            .query(conn)
            .expect("PEXPIRETIME");
        (content, expires)
    }
}

/// One step: move the clock (sometimes back), pick an operation, a cost and, for a refund, which
/// marks.
#[derive(Debug, Clone)]
struct Step {
    dt_us: i64,
    op: Op,
    pick: u64,
    marks: u64,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let op = prop_oneof![
        4 => Just(Op::Acquire),
        2 => Just(Op::Peek),
        2 => Just(Op::Report),
        3 => Just(Op::Refund),
    ];
    let step = (
        prop_oneof![
            3 => 0i64..2_000,
            3 => 0i64..50_000,
            2 => 0i64..5_000_000,
            1 => -3_000_000i64..0,
            1 => 0i64..100_000_000_000,
        ],
        op,
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(|(dt_us, op, pick, marks)| Step {
            dt_us,
            op,
            pick,
            marks,
        });
    proptest::collection::vec(step, 1..40)
}

/// How often each kind of interesting step happened, so that the test can prove it explored
/// them.
#[derive(Debug, Default)]
struct Seen {
    debts: u64,
    refunded_with_ticket: u64,
    refunded_without: u64,
    refused_tickets: u64,
}

#[test]
fn every_operation_decides_exactly_as_decide_op() {
    let lab = std::cell::RefCell::new(Lab::new());
    let seen = std::cell::RefCell::new(Seen::default());
    let mut runner = TestRunner::new(Config {
        cases: 384,
        ..Config::default()
    });
    let specs = proptest::collection::vec(limits(), 1..=3);
    let result = runner.run(&(specs, steps()), |(specs, steps)| {
        let mut lab = lab.borrow_mut();
        let mut seen = seen.borrow_mut();
        let (policy, keys) = lab.policy(&specs);
        let params = policy.params();
        let quota = params.iter().map(Params::quota).min().unwrap_or(1);
        let mut states: Vec<Option<State>> = params.iter().map(|_| None).collect();
        let mut ttls = vec![None; params.len()];
        // The marks of every take so far, as tickets carry them.
        let mut tickets: Vec<Vec<Mark>> = Vec::new();
        let mut now = T0;
        for (i, step) in steps.iter().enumerate() {
            now = now.saturating_add_signed(step.dt_us);
            let op = step.op;
            let cost = match (op, step.pick % 8) {
                (Op::Acquire | Op::Peek, 0) => quota,
                (Op::Acquire | Op::Peek, _) => 1 + step.pick % quota.min(5),
                // Reports and refunds may name more than a quota, up to 10^9.
                (_, 0) => (quota * 3).min(1_000_000_000),
                (_, 1) => quota,
                _ => 1 + step.pick % quota.min(5),
            };
            let marks: Vec<Mark> = match (op, step.marks % 4) {
                (Op::Refund, 0 | 1) if !tickets.is_empty() => {
                    tickets[(step.marks / 4) as usize % tickets.len()].clone()
                }
                // Marks no take made: near now, either side, and long ago; half of them held
                // marks (`limiter::HELD_MARK` + a take's time), which Lua must read alike; taken
                // up to 5 s ago, with small refund counts.
                (Op::Refund, 2) => params
                    .iter()
                    .map(|_| now.saturating_add_signed((step.marks >> 8) as i64 % 10_000_000))
                    .map(|m| {
                        let at = if step.marks & 16 == 0 {
                            m
                        } else {
                            ratelimiter::limiter::HELD_MARK + m
                        };
                        let taken = now.saturating_sub((step.marks >> 40) % 5_000_000);
                        Mark::new(at, taken, (step.marks >> 32) % 4)
                    })
                    .collect(),
                (Op::Refund, 3) if step.marks & 4 == 0 => vec![Mark::default(); params.len()],
                _ => Vec::new(),
            };
            let expected = decide_op(params, &mut states, &mut ttls, op, cost, now, &marks);
            let got = lab
                .call(&keys, params, op, cost, now, &marks, true)
                .map_err(TestCaseError::fail)?;
            prop_assert_eq!(
                &got,
                &crate::helpers::script_reply(&expected, op),
                "step {} at {}: {:?} cost {} marks {:?} of {:?}",
                i,
                now,
                op,
                cost,
                marks,
                specs
            );
            // What holds whatever the algorithm.
            for (n, (d, units)) in expected.limits().iter().zip(expected.units()).enumerate() {
                prop_assert!(
                    d.remaining <= params[n].quota(),
                    "above full quota: {:?}",
                    d
                );
                prop_assert!(*units <= cost, "{:?} moved {} of {}", op, units, cost);
            }
            match op {
                Op::Acquire if expected.allowed => tickets.push(expected.marks().collect()),
                Op::Report => {
                    tickets.push(expected.marks().collect());
                    if expected.limits().iter().any(|d| d.retry_after_us > 0) {
                        seen.debts += 1;
                    }
                }
                Op::Refund => {
                    let given = expected.units().iter().sum::<u64>();
                    match (marks.is_empty(), given > 0) {
                        (true, true) => seen.refunded_without += 1,
                        (false, true) => seen.refunded_with_ticket += 1,
                        (false, false) => seen.refused_tickets += 1,
                        (true, false) => {}
                    }
                }
                _ => {}
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let seen = seen.into_inner();
    assert!(
        seen.debts > 50
            && seen.refunded_with_ticket > 50
            && seen.refunded_without > 50
            && seen.refused_tickets > 50,
        "the sequences did not explore enough: {seen:?}"
    );
}

/// Every algorithm alone, and all five together.
fn every_policy() -> Vec<Vec<Spec>> {
    let each: Vec<Spec> = vec![
        (Algorithm::FixedWindow, vec![5, 60_000]),
        (Algorithm::SlidingWindowLog, vec![5, 60_000]),
        (Algorithm::SlidingWindowCounter, vec![5, 60_000]),
        (Algorithm::TokenBucket, vec![5, 1, 60_000]),
        (Algorithm::Gcra, vec![1, 60_000, 5]),
    ];
    let mut all: Vec<Vec<Spec>> = each.iter().map(|s| vec![s.clone()]).collect();
    all.push(each);
    all
}

#[test]
fn a_peek_writes_nothing_and_a_refund_moves_no_expiry_and_creates_no_key() {
    let mut lab = Lab::new();
    for specs in every_policy() {
        let (policy, keys) = lab.policy(&specs);
        let params = policy.params();
        let now = T0;
        // Nothing yet: a peek and a refund leave no key behind.
        for op in [Op::Peek, Op::Refund] {
            let reply = lab
                .call(&keys, params, op, 1, now, &[], false)
                .expect("script");
            assert_eq!(reply[0], 1, "{op:?} {specs:?}");
            for k in &keys {
                assert_eq!(lab.snapshot(k), (vec![], -2), "{op:?} made {k}");
            }
        }
        // Three taken, with their expiries.
        let taken = lab
            .call(&keys, params, Op::Acquire, 3, now, &[], false)
            .expect("acquire");
        assert_eq!(taken[0], 1, "{specs:?}");
        let before: Vec<_> = keys.iter().map(|k| lab.snapshot(k)).collect();
        assert!(before.iter().all(|(_, e)| *e > 0), "{before:?}");
        // A peek, even one that would be denied: every byte and every expiry as before.
        for cost in [1, 5] {
            let reply = lab
                .call(&keys, params, Op::Peek, cost, now + 1_000, &[], false)
                .expect("peek");
            assert_eq!(reply[0], u64::from(cost == 1), "{specs:?}");
            let after: Vec<_> = keys.iter().map(|k| lab.snapshot(k)).collect();
            assert_eq!(before, after, "a peek of {cost} changed {specs:?}");
        }
        // A refund gives back and keeps each key's expiry.
        let reply = lab
            .call(&keys, params, Op::Refund, 2, now + 2_000, &[], false)
            .expect("refund");
        for n in 0..params.len() {
            assert_eq!(reply[1 + 4 * n], 2, "limit {n} of {specs:?}: {reply:?}");
        }
        for (k, (content, expires)) in keys.iter().zip(&before) {
            let (now_content, now_expires) = lab.snapshot(k);
            assert_eq!(now_expires, *expires, "{k} moved its expiry");
            assert_ne!(&now_content, content, "{k} did not change");
        }
    }
}

#[test]
fn a_peek_runs_on_a_read_only_replica() {
    // `flags=no-writes` is what lets a script run where writes are refused: a replica.
    let primary = TestRedis::start();
    let replica = TestRedis::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    let mut lab = Lab {
        conn: replica.conn(),
        _redis: replica,
        policies: 0,
        loaded: Default::default(),
    };
    for specs in every_policy() {
        let (policy, keys) = lab.policy(&specs);
        let reply = lab
            .call(&keys, policy.params(), Op::Peek, 1, T0, &[], false)
            .expect("a peek on a replica");
        assert_eq!(reply[0], 1, "{specs:?}");
        let refused = lab.call(&keys, policy.params(), Op::Acquire, 1, T0, &[], false);
        assert!(
            refused.is_err_and(|e| e.contains("READONLY") || e.contains("replica")),
            "an acquire must not run on a replica"
        );
    }
    drop(primary);
}
