//! Batches (`store::batch`, `lua/batch.lua`): decisions that wait for their thread's call at
//! Redis go together in one script call, each as exact as alone.
//!
//! The property test sends batches of decisions of mixed policies, algorithms, operations and
//! costs, with the same subject several times in one batch, and holds each answer to the Rust
//! reference (`limiter::decide_op`) applied one decision after the other in batch order. The
//! others check what the store does with batches: that concurrent decisions are batched and
//! stay exact, that one failing decision fails alone, and that the decisions of a batch given
//! no time share one reading of Redis's clock.

use std::collections::HashMap;

use futures_util::future::join_all;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use ratelimiter::limiter::{decide_op, Mark, Op, State, Verdict};
use ratelimiter::policy::{FailMode, LimitKey, Params, Policy, PolicyName};
use ratelimiter::store::batch::{answers, command, Job};
use ratelimiter::store::connection::ConnectionMode;
use ratelimiter::store::{scripts, ErrorClass, Plan, RedisStore, Store};

use crate::helpers::{ask, claim, TestCluster, TestRedis};
use crate::scripts::{limits, Spec};

/// A plausible current time in µs, as in `scripts.rs`.
const T0: u64 = 1_764_460_800_123_457;

/// One decision of a batch, as drawn: which policy and subject, the operation, the cost and
/// whether a refund carries a mark.
#[derive(Debug, Clone)]
struct Pick {
    policy: usize,
    subject: usize,
    op: Op,
    cost_pick: u64,
    mark: Option<i64>,
}

fn picks() -> impl Strategy<Value = Vec<Pick>> {
    let op = prop_oneof![6 => Just(Op::Acquire), 2 => Just(Op::Report), 2 => Just(Op::Refund)];
    let pick = (
        0usize..4,
        0usize..2,
        op,
        any::<u64>(),
        proptest::option::of(-2_000_000i64..2_000_000),
    )
        .prop_map(|(policy, subject, op, cost_pick, mark)| Pick {
            policy,
            subject,
            op,
            cost_pick,
            mark,
        });
    proptest::collection::vec(pick, 1..=16)
}

fn batches() -> impl Strategy<Value = Vec<(i64, Vec<Pick>)>> {
    let dt = prop_oneof![3 => 0i64..2_000, 2 => 0i64..5_000_000, 1 => -1_000_000i64..0];
    proptest::collection::vec((dt, picks()), 1..8)
}

fn policy(n: u64, (algorithm, values): &Spec) -> Policy {
    let name = PolicyName::parse(&format!("b{n}")).expect("valid name");
    Policy::single(name, *algorithm, values, None, FailMode::Closed)
}

fn subject(i: usize) -> LimitKey {
    LimitKey::parse(format!("s{i}")).expect("valid key")
}

/// A cost the operation takes: an acquire's at most the quota (as the API requires), mostly
/// small, sometimes the whole quota; a report's or refund's up to twice it.
fn cost(op: Op, quota: u64, pick: u64) -> u64 {
    match (op, pick % 8) {
        (Op::Acquire, 0) => quota,
        (Op::Acquire, _) => 1 + pick % quota.min(5),
        (_, 0) => quota.saturating_mul(2),
        _ => 1 + pick % quota.min(5),
    }
}

/// The batch script called for `jobs`, then every key persisted, in one transaction: simulated
/// time must not lose state to real expiry (as `Impl::OursPersisted` in `scripts.rs`).
fn persisted(conn: &mut redis::Connection, jobs: &[Job], keys: &[String]) -> Vec<Verdict> {
    let mut pipe = redis::pipe();
    pipe.atomic().add_command(command(jobs, false));
    for k in keys {
        pipe.cmd("PERSIST").arg(k).ignore();
    }
    let (reply,): (redis::Value,) = pipe.query(conn).expect("the batch runs");
    answers(reply, jobs)
        .into_iter()
        .map(|a| a.expect("every decision of the batch answers"))
        .collect()
}

/// One acquire of `cost` for each of `keys`, in order, as a batch takes them.
fn acquires<'a>(
    policy: &Policy,
    keys: impl IntoIterator<Item = &'a LimitKey>,
    cost: u64,
    now_us: Option<u64>,
) -> Vec<Job> {
    keys.into_iter()
        .map(|key| {
            let plan = Plan::acquire(policy, key, cost).at(now_us);
            Job::new("rl", &plan).expect("a one-limit acquire goes in a batch")
        })
        .collect()
}

fn load_batch_script(conn: &mut redis::Connection) {
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(scripts::batch_source(false))
        .query(conn)
        .expect("SCRIPT LOAD");
}

fn state_key_of(policy: &Policy, key: &LimitKey) -> String {
    let mut k = String::new();
    ratelimiter::store::key::state_key(
        &mut k,
        "rl",
        policy.name.as_str(),
        key.as_str(),
        None,
        policy.params()[0].algorithm(),
    );
    k
}

#[test]
fn batches_of_mixed_policies_operations_and_costs_decide_exactly_as_one_after_the_other() {
    let redis = TestRedis::start();
    let conn = std::cell::RefCell::new(redis.conn());
    load_batch_script(&mut conn.borrow_mut());
    let made = std::cell::Cell::new(0u64);
    // Batches that held one subject more than once: what batching must not get wrong.
    let repeats = std::cell::Cell::new(0u64);
    let mut runner = TestRunner::new(Config {
        cases: 192,
        ..Config::default()
    });
    let specs = proptest::collection::vec(limits(), 4);
    let result = runner.run(&(specs, batches()), |(specs, batches)| {
        let mut conn = conn.borrow_mut();
        let policies: Vec<Policy> = specs
            .iter()
            .map(|spec| {
                made.set(made.get() + 1);
                policy(made.get(), spec)
            })
            .collect();
        let mut states: HashMap<(usize, usize), Option<State>> = HashMap::new();
        let mut now = T0;
        for (b, (dt, picks)) in batches.iter().enumerate() {
            now = now.saturating_add_signed(*dt);
            let mut seen = std::collections::HashSet::new();
            if picks.iter().any(|p| !seen.insert((p.policy, p.subject))) {
                repeats.set(repeats.get() + 1);
            }
            let keys: Vec<LimitKey> = picks.iter().map(|p| subject(p.subject)).collect();
            let marks: Vec<Vec<Mark>> = picks
                .iter()
                .map(|p| {
                    p.mark
                        .map(|m| Mark::new(now.saturating_add_signed(m), now, 0))
                        .into_iter()
                        .collect()
                })
                .collect();
            let costs: Vec<u64> = picks
                .iter()
                .map(|p| {
                    let quota = policies[p.policy].params()[0].quota();
                    cost(p.op, quota, p.cost_pick)
                })
                .collect();
            let jobs: Vec<Job> = picks
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let marks = if p.op == Op::Refund {
                        &marks[i][..]
                    } else {
                        &[]
                    };
                    let claim = claim(marks, costs[i]);
                    let ask = ask(p.op, costs[i], claim.as_ref());
                    let plan = Plan::new(&policies[p.policy], &keys[i], ask).at(now);
                    Job::new("rl", &plan).expect("a one-limit decision goes in a batch")
                })
                .collect();
            let state_keys: Vec<String> = picks
                .iter()
                .zip(&keys)
                .map(|(p, k)| state_key_of(&policies[p.policy], k))
                .collect();
            let got = persisted(&mut conn, &jobs, &state_keys);
            for (i, p) in picks.iter().enumerate() {
                let params: [Params; 1] = [policies[p.policy].params()[0]];
                let state = states.entry((p.policy, p.subject)).or_insert(None);
                let mut st = [state.take()];
                let marks = if p.op == Op::Refund {
                    &marks[i][..]
                } else {
                    &[]
                };
                let expected = decide_op(&params, &mut st, &mut [None], p.op, costs[i], now, marks);
                *state = st[0].take();
                prop_assert_eq!(
                    &got[i],
                    &expected,
                    "batch {} decision {} ({:?} cost {} of {:?}) at {}",
                    b,
                    i,
                    p.op,
                    costs[i],
                    specs[p.policy],
                    now
                );
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(
        repeats.get() > 200,
        "only {} batches held a subject twice",
        repeats.get()
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn store(redis: &TestRedis, batch_max: usize) -> RedisStore {
    RedisStore::open(
        &redis.url(),
        ConnectionMode::Multiplexed,
        1,
        std::time::Duration::from_secs(5),
        "rl",
    )
    .expect("store")
    .with_batch_max(batch_max)
}

/// `EVALSHA` calls Redis has run since its statistics were reset.
fn evalsha_calls(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[test]
fn concurrent_decisions_of_one_thread_go_in_batches_and_stay_exact() {
    let redis = TestRedis::start();
    let mut conn = redis.conn();
    let rt = runtime();
    let _inside = rt.enter();
    // A window of 50, asked 300 times at once from one thread, with batches and without.
    for (batch_max, most_calls) in [(64, 20), (1, u64::MAX)] {
        let store = store(&redis, batch_max);
        let name = format!("w{batch_max}");
        let policy = Policy::single(
            PolicyName::parse(&name).expect("valid"),
            ratelimiter::policy::Algorithm::FixedWindow,
            &[50, 3_600_000],
            None,
            FailMode::Closed,
        );
        let key = subject(0);
        rt.block_on(store.load_scripts()).expect("scripts load");
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut conn)
            .expect("RESETSTAT");
        let verdicts =
            rt.block_on(join_all((0..300).map(|_| async {
                store.decide(&Plan::acquire(&policy, &key, 1)).await
            })));
        let allowed = verdicts
            .iter()
            .map(|v| v.as_ref().expect("decided by Redis"))
            .filter(|v| v.allowed)
            .count();
        assert_eq!(allowed, 50, "batch_max {batch_max}");
        let calls = evalsha_calls(&mut conn);
        if batch_max == 1 {
            assert_eq!(calls, 300, "each decision alone");
        } else {
            // The first two go alone; the 298 that waited for them go in batches of at most 64.
            assert!(calls <= most_calls, "{calls} calls for 300 decisions");
            assert!(calls >= 2 + 298_u64.div_ceil(64), "{calls} calls");
        }
    }
}

#[test]
fn a_sliding_log_refund_is_never_batched_so_no_batch_waits_for_one() {
    let redis = TestRedis::start();
    let mut conn = redis.conn();
    let rt = runtime();
    let _inside = rt.enter();
    let store = store(&redis, 64);
    let log = Policy::single(
        PolicyName::parse("log").expect("valid"),
        ratelimiter::policy::Algorithm::SlidingWindowLog,
        &[100, 3_600_000],
        None,
        FailMode::Closed,
    );
    let key = subject(0);
    rt.block_on(store.load_scripts()).expect("scripts load");
    for now in 0..50 {
        let v = rt
            .block_on(store.decide(&Plan::acquire(&log, &key, 1).at(Some(T0 + now))))
            .expect("decided");
        assert!(v.allowed);
    }
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut conn)
        .expect("RESETSTAT");
    // 50 refunds at once from one thread: each its own call (the costliest decision, up to
    // hundreds of members rewritten, never holds up a batch), and exact.
    let verdicts = rt.block_on(join_all((0..50).map(|_| async {
        let plan = Plan::new(&log, &key, ask(Op::Refund, 1, None)).at(T0 + 100);
        store.decide(&plan).await
    })));
    let given: u64 = verdicts
        .iter()
        .map(|v| v.as_ref().expect("decided by Redis").units()[0])
        .sum();
    assert_eq!(given, 50);
    assert_eq!(evalsha_calls(&mut conn), 50, "each refund alone");
}

#[test]
fn a_decision_that_fails_in_a_batch_fails_alone() {
    let redis = TestRedis::start();
    let mut conn = redis.conn();
    load_batch_script(&mut conn);
    let policy = policy(
        1,
        &(
            ratelimiter::policy::Algorithm::TokenBucket,
            vec![5, 1, 1_000],
        ),
    );
    let keys: Vec<LimitKey> = (0..3).map(subject).collect();
    // The middle subject's state key holds a list: its script's GET fails with WRONGTYPE.
    let _: i64 = redis::cmd("LPUSH")
        .arg(state_key_of(&policy, &keys[1]))
        .arg("x")
        .query(&mut conn)
        .expect("LPUSH");
    let jobs = acquires(&policy, &keys, 2, Some(T0));
    let reply: redis::Value = command(&jobs, false)
        .query(&mut conn)
        .expect("the batch runs");
    let answers = answers(reply, &jobs);
    for i in [0, 2] {
        let v = answers[i].as_ref().expect("decided");
        assert!(v.allowed && v.decision().remaining == 3, "{v:?}");
    }
    let e = answers[1]
        .as_ref()
        .expect_err("the list fails its decision");
    assert_eq!(e.class(), ErrorClass::Refused);
    assert!(e.to_string().contains("WRONGTYPE"), "{e}");
}

#[test]
fn the_decisions_of_a_batch_given_no_time_share_one_reading_of_redis_clock() {
    let redis = TestRedis::start();
    let mut conn = redis.conn();
    load_batch_script(&mut conn);
    let policy = policy(
        1,
        &(
            ratelimiter::policy::Algorithm::TokenBucket,
            vec![3, 1, 1_000],
        ),
    );
    let key = subject(0);
    let jobs = acquires(&policy, std::iter::repeat_n(&key, 5), 1, None);
    let reply: redis::Value = command(&jobs, false)
        .query(&mut conn)
        .expect("the batch runs");
    let got: Vec<Verdict> = answers(reply, &jobs)
        .into_iter()
        .map(|a| a.expect("decided"))
        .collect();
    let now = got[0].at_us;
    assert!(got.iter().all(|v| v.at_us == now), "{got:?}");
    // Redis's own clock, in µs.
    let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut conn).expect("TIME");
    assert!(now <= s * 1_000_000 + us && now + 5_000_000 > s * 1_000_000 + us);
    // Three of the bucket's three tokens, then two denials, all at that one time.
    let params = [policy.params()[0]];
    let mut state = [None];
    for v in &got {
        let expected = decide_op(&params, &mut state, &mut [None], Op::Acquire, 1, now, &[]);
        assert_eq!(v, &expected);
    }
    assert_eq!(got.iter().filter(|v| v.allowed).count(), 3);
}

#[test]
fn decisions_whose_deadline_passes_while_they_wait_are_never_sent() {
    let redis = TestRedis::start();
    let rt = runtime();
    let _inside = rt.enter();
    let store = RedisStore::open(
        &redis.url(),
        ConnectionMode::Multiplexed,
        1,
        std::time::Duration::from_millis(200),
        "rl",
    )
    .expect("store");
    rt.block_on(store.load_scripts()).expect("scripts load");
    let policy = policy(
        1,
        &(
            ratelimiter::policy::Algorithm::FixedWindow,
            vec![100, 3_600_000],
        ),
    );
    let key = subject(0);
    // Redis hangs: the first two acquires are sent and get no answer; the 19 that wait behind
    // them have nearly all of their deadline gone when their turn comes.
    redis.signal("STOP");
    let verdicts =
        rt.block_on(join_all((0..21).map(|_| async {
            store.decide(&Plan::acquire(&policy, &key, 1)).await
        })));
    redis.signal("CONT");
    let classes: Vec<ErrorClass> = verdicts
        .iter()
        .map(|v| v.as_ref().expect_err("no answer in time").class())
        .collect();
    assert_eq!(
        classes[..2],
        [ErrorClass::OutcomeUnknown; 2],
        "the two sent"
    );
    assert!(
        classes[2..].iter().all(|c| *c == ErrorClass::Unreachable),
        "{classes:?}"
    );
    // Only the two sent reached Redis: two units of the window are gone, not 21.
    let seen = rt.block_on(async {
        loop {
            match store
                .decide(&Plan::new(&policy, &key, ask(Op::Peek, 1, None)))
                .await
            {
                Ok(v) => break v,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        }
    });
    assert_eq!(seen.decision().remaining, 98, "{seen:?}");
}

#[test]
fn on_a_cluster_decisions_go_in_batches_per_master_and_stay_exact() {
    let cluster = TestCluster::start();
    let seeds: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let rt = runtime();
    let _inside = rt.enter();
    let store = rt
        .block_on(RedisStore::open_cluster(
            &seeds,
            std::time::Duration::from_secs(5),
            "rl",
        ))
        .expect("cluster store");
    rt.block_on(store.load_scripts()).expect("scripts load");
    let mut masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    for conn in &mut masters {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(conn)
            .expect("RESETSTAT");
    }
    // 40 subjects, on every master, each under a window of 5, asked 10 times each at once.
    let policy = policy(
        1,
        &(
            ratelimiter::policy::Algorithm::FixedWindow,
            vec![5, 3_600_000],
        ),
    );
    let keys: Vec<LimitKey> = (0..40).map(subject).collect();
    let asks: Vec<&LimitKey> = (0..10).flat_map(|_| keys.iter()).collect();
    let verdicts = rt
        .block_on(join_all(asks.iter().map(|key| async {
            store.decide(&Plan::acquire(&policy, key, 1)).await
        })));
    let mut allowed: HashMap<&str, usize> = HashMap::new();
    for (key, v) in asks.iter().zip(&verdicts) {
        if v.as_ref().expect("decided by Redis").allowed {
            *allowed.entry(key.as_str()).or_default() += 1;
        }
    }
    assert_eq!(allowed.len(), 40);
    assert!(allowed.values().all(|n| *n == 5), "{allowed:?}");
    let calls: u64 = masters.iter_mut().map(evalsha_calls).sum();
    // Two alone per master, then batches of that master's waiting decisions.
    assert!(calls < 40, "{calls} script calls for 400 decisions");
}

#[test]
fn on_a_cluster_node_a_batch_reaches_keys_of_several_of_its_slots_and_no_other() {
    let cluster = TestCluster::start();
    let mut masters = cluster.masters();
    let conn = &mut masters[0];
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(scripts::batch_source(true))
        .query(conn)
        .expect("SCRIPT LOAD");
    let policy = policy(
        1,
        &(
            ratelimiter::policy::Algorithm::TokenBucket,
            vec![5, 1, 1_000],
        ),
    );
    // Subjects whose keys this master serves (two slots at least), then one it does not.
    let served = |conn: &mut redis::Connection, key: &LimitKey| {
        let reply: redis::RedisResult<Option<String>> = redis::cmd("GET")
            .arg(state_key_of(&policy, key))
            .query(conn);
        reply.is_ok()
    };
    let mut local = Vec::new();
    let mut foreign = None;
    for i in 0..200 {
        let key = subject(i);
        if served(conn, &key) {
            local.push(key);
        } else if foreign.is_none() {
            foreign = Some(key);
        }
    }
    let foreign = foreign.expect("a key of another master");
    local.truncate(3);
    let slots: std::collections::HashSet<u16> = local
        .iter()
        .map(|k| ratelimiter::store::topology::key_slot(&state_key_of(&policy, k)))
        .collect();
    assert!(slots.len() > 1, "{slots:?}");
    let keys: Vec<&LimitKey> = local.iter().chain([&foreign]).collect();
    let jobs = acquires(&policy, keys, 1, Some(T0));
    let reply: redis::Value = command(&jobs, true).query(conn).expect("the batch runs");
    let answers = answers(reply, &jobs);
    for answer in &answers[..3] {
        assert!(answer.as_ref().expect("decided").allowed);
    }
    // The store sends such a decision again alone when it sees this error's words.
    let e = answers[3].as_ref().expect_err("not this node's key");
    assert!(e.to_string().contains("non local key"), "{e}");
}
