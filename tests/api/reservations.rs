//! Reservations (issue 29) on Redis: the reservation script (`lua/reserve.lua`, composed by
//! `scripts::compose_reserve`) decides exactly as the pure model, `limiter::reservation::reserve`,
//! on random sequences over one to three limits of every algorithm: bookings far ahead and none,
//! waits accepted and refused, denials, the queue it leaves; and the plain scripts among them
//! (acquire, peek, report, and refund with a booking's marks: a cancel, in any order) read that
//! queue and decide as `limiter::reservation::decide_queued`. Replies are compared whole, every
//! limit's times measured from the caller's now. Then every store (embedded, Redis, Cluster),
//! through its own entry point and on its own clock, against the same models.

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use ratelimiter::limiter::reservation::{
    decide_joint_queued, decide_queued, reserve, Queued, Reservation, LONGEST_WAIT_MS,
};
use ratelimiter::limiter::{Mark, Op, State, Verdict};
use ratelimiter::policy::{Algorithm, FailMode, Limit, LimitKey, Params, Policy, PolicyName};
use ratelimiter::store::connection::ConnectionMode;
use ratelimiter::store::{scripts, Ask, MemoryStore, Plan, RedisStore, Store};

use crate::helpers::{ask, claim, script_reply, TestCluster, TestRedis};
use crate::scripts::Spec;
use crate::settle::Lab;

/// A plausible current time in µs.
const T0: u64 = 1_764_460_800_123_457;

/// Limits of at most 6 units whose periods are `periods_ms` long: small and short enough that
/// bookings queue up.
fn small_limit(periods_ms: std::ops::RangeInclusive<u64>) -> impl Strategy<Value = Spec> {
    let (p, w, b) = (periods_ms.clone(), periods_ms.clone(), periods_ms);
    prop_oneof![
        (1u64..=6, 1u64..=4, p).prop_map(|(c, r, p)| (Algorithm::TokenBucket, vec![c, r, p])),
        (1u64..=4, w, 1u64..=6).prop_map(|(r, p, b)| (Algorithm::Gcra, vec![r, p, b])),
        (
            prop::sample::select(vec![
                Algorithm::FixedWindow,
                Algorithm::SlidingWindowLog,
                Algorithm::SlidingWindowCounter,
            ]),
            1u64..=6,
            b
        )
            .prop_map(|(a, l, w)| (a, vec![l, w])),
    ]
}

/// Small limits, and now and then any limit at all.
fn limit() -> impl Strategy<Value = Spec> {
    prop_oneof![4 => small_limit(1..=2_000), 1 => crate::scripts::limits()]
}

/// One call: the clock's move (now and then back), a number the cost is made from, the wait
/// accepted, whether it cancels an earlier booking instead (and which), and otherwise whether
/// it is a plain operation that accepts no wait (`plain` 0: acquire, 1: peek, 2: report) rather
/// than a reservation.
#[derive(Debug, Clone)]
struct Step {
    dt_us: i64,
    pick: u64,
    max_wait_us: u64,
    cancel: Option<usize>,
    plain: u8,
}

/// A plain operation's script reply as the model gives it, with the time a report or a refund
/// was decided at when the queue moved it there (lua/common.lua: one number more).
fn plain_reply(v: &Verdict, op: Op, queued: Queued) -> Vec<u64> {
    let mut reply = script_reply(v, op);
    let moved = queued.queue_us.filter(|q| *q > queued.now_us);
    if let (Some(q), Op::Report | Op::Refund) = (moved, op) {
        reply.push(q);
    }
    reply
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let dt = prop_oneof![
        2 => Just(0i64),
        3 => 0i64..2_000,
        3 => 0i64..400_000,
        1 => 0i64..3_000_000,
        1 => -1_000_000i64..0,
    ];
    let wait = prop_oneof![
        2 => Just(0u64),
        1 => 0u64..50_000,
        3 => 0u64..3_000_000,
        1 => Just(LONGEST_WAIT_MS * 1_000),
    ];
    let cancel = prop_oneof![3 => Just(None), 1 => any::<usize>().prop_map(Some)];
    let step = (dt, any::<u64>(), wait, cancel, 0u8..8).prop_map(
        |(dt_us, pick, max_wait_us, cancel, plain)| Step {
            dt_us,
            pick,
            max_wait_us,
            cancel,
            plain,
        },
    );
    prop::collection::vec(step, 1..40)
}

/// The reservation script's reply as the model gives it: an acquire's, then the delay and the
/// queue left (0 for none).
fn as_reply(r: &Reservation) -> Vec<u64> {
    let mut reply = script_reply(&r.verdict, Op::Acquire);
    reply.extend([r.delay_us, r.queue_us.unwrap_or(0)]);
    reply
}

/// One call of the reservation script at `now`, then every key persisted in the same
/// transaction, so that simulated time may run ahead of Redis's clock.
fn reserve_on_redis(
    lab: &mut Lab,
    sha: &str,
    keys: &[String],
    params: &[Params],
    (cost, now, max_wait_us): (u64, u64, u64),
) -> Result<Vec<u64>, String> {
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("EVALSHA")
        .arg(sha)
        .arg(keys.len())
        .arg(keys)
        .arg(cost)
        .arg(now);
    for p in params {
        pipe.arg(p.script_args().as_slice());
    }
    pipe.arg(max_wait_us);
    for k in keys {
        pipe.cmd("PERSIST").arg(k).ignore();
    }
    let (reply,): (Vec<u64>,) = pipe.query(&mut lab.conn).map_err(|e| e.to_string())?;
    Ok(reply)
}

/// What the sequences covered, so that a generator that stopped booking would fail the test.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    booked: u64,
    granted_now: u64,
    refused_past_the_wait: u64,
    cancels_giving_back: u64,
    denied_behind_the_queue: u64,
    reported_at_the_queue: u64,
}

#[test]
fn the_reservation_script_decides_exactly_as_the_model() {
    let lab = std::cell::RefCell::new(Lab::new());
    let seen = std::cell::Cell::new(Seen::default());
    let shas = std::cell::RefCell::new(std::collections::HashMap::new());
    let mut runner = TestRunner::new(Config {
        cases: 256,
        ..Config::default()
    });
    let result = runner.run(
        &(prop::collection::vec(limit(), 1..=3), steps()),
        |(specs, steps)| {
            let mut lab = lab.borrow_mut();
            let mut shas = shas.borrow_mut();
            let (policy, mut keys) = lab.policy(&specs);
            let params = policy.params().to_vec();
            let algorithms: Vec<Algorithm> = params.iter().map(Params::algorithm).collect();
            let sha: String = shas
                .entry(algorithms.clone())
                .or_insert_with(|| -> String {
                    redis::cmd("SCRIPT")
                        .arg("LOAD")
                        .arg(scripts::compose_reserve(&algorithms))
                        .query(&mut lab.conn)
                        .expect("SCRIPT LOAD")
                })
                .clone();
            // The subject's queue, on its hash tag.
            let mut queue_key = String::new();
            ratelimiter::store::key::queue_key(
                &mut queue_key,
                "rl",
                policy.name.as_str(),
                "subject",
            );
            keys.push(queue_key);
            let quota = params.iter().map(Params::quota).min().unwrap_or(1);
            let mut states: Vec<Option<State>> = params.iter().map(|_| None).collect();
            let mut ttls = vec![None; params.len()];
            let mut queue = None;
            // Each booking's cost and marks.
            let mut tickets: Vec<(u64, Vec<Mark>)> = Vec::new();
            let mut tally = seen.get();
            let mut now = T0;
            for (i, step) in steps.iter().enumerate() {
                now = now.saturating_add_signed(step.dt_us);
                let queued = Queued {
                    now_us: now,
                    queue_us: queue,
                };
                let cost = match step.pick % 8 {
                    0 => quota,
                    _ => 1 + step.pick % quota.min(5),
                };
                // A cancel, or a plain operation: the plain scripts (lua/common.lua) read the
                // queue the reservations leave and decide as `decide_queued`.
                let plain = match (step.cancel, tickets.is_empty(), step.plain) {
                    (Some(pick), false, _) => {
                        let (cost, marks) = tickets.swap_remove(pick % tickets.len());
                        Some((Op::Refund, cost, marks))
                    }
                    (_, _, 0) => Some((Op::Acquire, cost, Vec::new())),
                    (_, _, 1) => Some((Op::Peek, cost, Vec::new())),
                    (_, _, 2) => Some((Op::Report, cost, Vec::new())),
                    _ => None,
                };
                if let Some((op, cost, marks)) = plain {
                    let expected =
                        decide_queued(&params, &mut states, &mut ttls, (op, cost, &marks), queued);
                    let got = lab
                        .call(&keys[..params.len()], &params, op, cost, now, &marks, true)
                        .map_err(TestCaseError::fail)?;
                    prop_assert_eq!(
                        &got,
                        &plain_reply(&expected, op, queued),
                        "step {} {:?} {} at {} behind {:?} of {:?}",
                        i,
                        op,
                        cost,
                        now,
                        queue,
                        specs
                    );
                    match op {
                        Op::Refund if expected.units().iter().any(|u| *u > 0) => {
                            tally.cancels_giving_back += 1;
                        }
                        Op::Acquire | Op::Peek if queue.is_some_and(|q| q > now) => {
                            tally.denied_behind_the_queue += 1;
                        }
                        Op::Report if queue.is_some_and(|q| q > now) => {
                            tally.reported_at_the_queue += 1;
                        }
                        _ => {}
                    }
                    if op == Op::Acquire && expected.allowed {
                        tickets.push((cost, expected.marks().collect()));
                    }
                    continue;
                }
                let r = reserve(
                    &params,
                    &mut states,
                    &mut ttls,
                    cost,
                    now,
                    queue,
                    step.max_wait_us,
                );
                queue = r.queue_us;
                let got = reserve_on_redis(
                    &mut lab,
                    &sha,
                    &keys,
                    &params,
                    (cost, now, step.max_wait_us),
                )
                .map_err(TestCaseError::fail)?;
                prop_assert_eq!(
                    &got,
                    &as_reply(&r),
                    "step {} at {}: cost {} wait {} of {:?}",
                    i,
                    now,
                    cost,
                    step.max_wait_us,
                    specs
                );
                match (r.verdict.allowed, r.delay_us) {
                    (true, 0) => tally.granted_now += 1,
                    (true, _) => tally.booked += 1,
                    (false, _) => tally.refused_past_the_wait += 1,
                }
                if r.verdict.allowed {
                    tickets.push((cost, r.verdict.marks().collect()));
                }
            }
            seen.set(tally);
            Ok(())
        },
    );
    if let Err(e) = result {
        panic!("{e}");
    }
    let s = seen.get();
    assert!(
        s.booked > 500
            && s.granted_now > 500
            && s.refused_past_the_wait > 200
            && s.cancels_giving_back > 100
            && s.denied_behind_the_queue > 100
            && s.reported_at_the_queue > 50,
        "{s:?}"
    );
}

/// On Redis's own clock: a booking's states are kept until its units have counted (the
/// algorithm's expiry measured from the booked time, not from now), and the queue until the
/// booked time. A bucket of 1 refilled each second: the first take leaves it empty for 1 s; the
/// next, booked 1 s ahead, keeps the state 2 s and the queue 1 s.
#[test]
fn a_booking_keeps_its_states_until_its_units_have_counted_and_the_queue_until_it_acts() {
    let mut lab = Lab::new();
    let specs: Vec<Spec> = vec![(Algorithm::TokenBucket, vec![1, 1, 1_000])];
    let (policy, mut keys) = lab.policy(&specs);
    let mut queue_key = String::new();
    ratelimiter::store::key::queue_key(&mut queue_key, "rl", policy.name.as_str(), "subject");
    keys.push(queue_key.clone());
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(scripts::compose_reserve(&[Algorithm::TokenBucket]))
        .query(&mut lab.conn)
        .expect("SCRIPT LOAD");
    let args = policy.params()[0].script_args();
    let call = |conn: &mut redis::Connection, max_wait_us: u64| -> Vec<u64> {
        redis::cmd("EVALSHA")
            .arg(&sha)
            .arg(keys.len())
            .arg(&keys)
            .arg(1)
            .arg("")
            .arg(args.as_slice())
            .arg(max_wait_us)
            .query(conn)
            .expect("reserve")
    };
    let pttl = |conn: &mut redis::Connection, key: &str| -> i64 {
        redis::cmd("PTTL").arg(key).query(conn).expect("PTTL")
    };
    let now = call(&mut lab.conn, 0);
    assert_eq!((now[0], now[7]), (1, 0), "granted at once: {now:?}");
    assert!(pttl(&mut lab.conn, &keys[0]) > 500);
    assert_eq!(pttl(&mut lab.conn, &queue_key), -2, "no queue: {now:?}");
    let booked = call(&mut lab.conn, 2_000_000);
    let delay_ms = booked[7] / 1_000;
    assert_eq!(booked[0], 1, "{booked:?}");
    assert!((900..=1_000).contains(&delay_ms), "{booked:?}");
    // The state: the bucket is full 1 s after the booked time; the queue: until that time.
    let state = pttl(&mut lab.conn, &keys[0]);
    let queue = pttl(&mut lab.conn, &queue_key);
    assert!(
        (delay_ms as i64 + 500..=delay_ms as i64 + 1_001).contains(&state),
        "state kept {state} ms after a delay of {delay_ms} ms"
    );
    assert!(
        (delay_ms as i64 - 500..=delay_ms as i64 + 1).contains(&queue),
        "queue kept {queue} ms after a delay of {delay_ms} ms"
    );
    // A reservation that will not wait is denied behind the queue, and takes nothing.
    let denied = call(&mut lab.conn, 0);
    assert_eq!(denied[0], 0, "{denied:?}");
    assert!(pttl(&mut lab.conn, &keys[0]) <= state);
}

/// Limits whose periods are a few milliseconds, so that bookings queue up and clear on the
/// stores' own clocks within a test of real time.
fn quick_limit() -> impl Strategy<Value = Spec> {
    small_limit(5..=80)
}

/// One call on a store: a pause before it (ms), a number the cost is made from, the wait
/// accepted (µs), and what it is: a reservation, an acquire, or a cancel of an earlier
/// booking (which).
type StoreStep = (u64, u64, u64, u64);

fn store_steps() -> impl Strategy<Value = Vec<StoreStep>> {
    let pause = prop_oneof![3 => Just(0u64), 2 => 0u64..15];
    let wait = prop_oneof![1 => Just(0u64), 3 => 0u64..200_000];
    prop::collection::vec((pause, any::<u64>(), wait, any::<u64>()), 5..25)
}

fn quick_policy(name: &str, specs: &[Spec]) -> Policy {
    let name = PolicyName::parse(name).expect("valid name");
    if let [(a, values)] = specs {
        return Policy::single(name, *a, values, None, FailMode::Closed);
    }
    let limits = specs
        .iter()
        .enumerate()
        .map(|(i, (a, values))| {
            let limit = PolicyName::parse(&format!("l{}", i + 1)).expect("valid name");
            Limit::new(limit, *a, values)
        })
        .collect();
    Policy::new(name, limits, None, FailMode::Closed).expect("valid limits")
}

/// Drives `store` on its own clock with random sequences and holds every verdict to the model
/// run at the time the store decided at (its verdict's `at_us`): reservations
/// ([`reserve`]), and among them acquires, peeks, reports and cancels (refunds with a ticket),
/// which the model decides with the queue ([`decide_queued`]). Answers what was covered.
async fn books_as_the_model(store: &impl Store, label: &str) -> Seen {
    let mut runner = TestRunner::deterministic();
    let strategy = (prop::collection::vec(quick_limit(), 1..=3), store_steps());
    let mut seen = Seen::default();
    let key = LimitKey::parse("subject".to_owned()).expect("valid key");
    for case in 0..24 {
        let (specs, steps) = strategy.new_tree(&mut runner).expect("a case").current();
        let policy = quick_policy(&format!("{label}{case}"), &specs);
        let params = policy.params().to_vec();
        let quota = params.iter().map(Params::quota).min().unwrap_or(1);
        let mut states: Vec<Option<State>> = params.iter().map(|_| None).collect();
        let mut ttls = vec![None; params.len()];
        let mut queue: Option<u64> = None;
        let mut tickets: Vec<(u64, Vec<Mark>)> = Vec::new();
        for (i, &(pause_ms, pick, max_wait_us, kind)) in steps.iter().enumerate() {
            tokio::time::sleep(std::time::Duration::from_millis(pause_ms)).await;
            let cost = 1 + pick % quota;
            let what = format!("{label} case {case} step {i} of {specs:?}");
            match kind % 6 {
                0 if !tickets.is_empty() => {
                    let (units, marks) = tickets.swap_remove((kind / 4) as usize % tickets.len());
                    let claim = claim(&marks, units);
                    let plan = Plan::new(&policy, &key, ask(Op::Refund, units, claim.as_ref()));
                    let got = store.decide(&plan).await.expect("refund");
                    let queued = Queued {
                        now_us: got.at_us,
                        queue_us: queue,
                    };
                    let expected = decide_queued(
                        &params,
                        &mut states,
                        &mut ttls,
                        (Op::Refund, units, &marks),
                        queued,
                    );
                    assert_eq!(got, expected, "{what}: cancel");
                    if expected.units().iter().any(|u| *u > 0) {
                        seen.cancels_giving_back += 1;
                    }
                }
                1..=3 => {
                    let op = [Op::Acquire, Op::Peek, Op::Report][(kind % 6 - 1) as usize];
                    let plan = Plan::new(&policy, &key, ask(op, cost, None));
                    let got = store.decide(&plan).await.expect("plain operation");
                    let queued = Queued {
                        now_us: got.at_us,
                        queue_us: queue,
                    };
                    let expected =
                        decide_queued(&params, &mut states, &mut ttls, (op, cost, &[]), queued);
                    assert_eq!(got, expected, "{what}: {op:?} {cost}");
                    if queue.is_some_and(|q| q > got.at_us) {
                        seen.denied_behind_the_queue += u64::from(op != Op::Report);
                        seen.reported_at_the_queue += u64::from(op == Op::Report);
                    }
                    if op != Op::Peek && got.allowed {
                        tickets.push((cost, got.marks().collect()));
                    }
                }
                _ => {
                    let reserve_ask = Ask::Reserve { cost, max_wait_us };
                    let got = store
                        .decide(&Plan::new(&policy, &key, reserve_ask))
                        .await
                        .expect("reserve");
                    let r = reserve(
                        &params,
                        &mut states,
                        &mut ttls,
                        cost,
                        got.at_us,
                        queue,
                        max_wait_us,
                    );
                    queue = r.queue_us;
                    assert_eq!(
                        got, r.verdict,
                        "{what}: reserve {cost} waiting {max_wait_us}"
                    );
                    match (r.verdict.allowed, r.delay_us) {
                        (true, 0) => seen.granted_now += 1,
                        (true, _) => seen.booked += 1,
                        (false, _) => seen.refused_past_the_wait += 1,
                    }
                    if r.verdict.allowed {
                        tickets.push((cost, r.verdict.marks().collect()));
                    }
                }
            }
        }
        // A reset ends the queue with the states: a reservation that will not wait is then
        // granted as on a subject never seen.
        store.reset(&policy, &key).await.expect("reset");
        let fresh = Ask::Reserve {
            cost: 1,
            max_wait_us: 0,
        };
        let got = store
            .decide(&Plan::new(&policy, &key, fresh))
            .await
            .expect("reserve after a reset");
        assert!(
            got.allowed && got.taken_us == got.at_us,
            "{label} case {case}: {got:?}"
        );
    }
    seen
}

/// The stores' entry point for a reservation (`Ask::Reserve`) decides as the model on the
/// embedded store, one Redis and a Cluster, each on its own clock, and the plain operations
/// among them keep to the queue as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_books_as_the_model() {
    let memory = MemoryStore::new("rl", 1_000_000);
    let on_memory = books_as_the_model(&memory, "m").await;
    assert!(
        on_memory.booked > 20
            && on_memory.refused_past_the_wait > 5
            && on_memory.cancels_giving_back > 5
            && on_memory.denied_behind_the_queue > 5
            && on_memory.reported_at_the_queue > 0,
        "embedded: {on_memory:?}"
    );
    let redis = TestRedis::start();
    let store = RedisStore::open(
        &redis.url(),
        ConnectionMode::Multiplexed,
        2,
        std::time::Duration::from_secs(5),
        "rl",
    )
    .expect("store");
    let on_redis = books_as_the_model(&store, "r").await;
    assert!(
        on_redis.booked > 20
            && on_redis.refused_past_the_wait > 5
            && on_redis.denied_behind_the_queue > 5
            && on_redis.cancels_giving_back > 5,
        "Redis: {on_redis:?}"
    );
    let cluster = TestCluster::start();
    let seeds: Vec<String> = cluster.seeds().split(',').map(str::to_owned).collect();
    let store = RedisStore::open_cluster(&seeds, std::time::Duration::from_secs(5), "rl")
        .await
        .expect("cluster store");
    let on_cluster = books_as_the_model(&store, "c").await;
    assert!(
        on_cluster.booked > 20 && on_cluster.denied_behind_the_queue > 5,
        "Cluster: {on_cluster:?}"
    );
}

/// Reservations on two subjects, and joint acquires of both (the Envoy descriptors of one
/// request) among them, on `store`'s own clock: every joint acquire decides as the model,
/// [`decide_joint_queued`], each limit with its own subject's queue. The second subject's key
/// is one whose state is on the first one's slot, as a Cluster needs for a joint acquire.
/// Answers the joint acquires denied behind a queue.
async fn joint_acquires_keep_to_the_queues(store: &impl Store, label: &str) -> u64 {
    let mut runner = TestRunner::deterministic();
    let strategy = (quick_limit(), quick_limit(), store_steps());
    let mut behind = 0;
    for case in 0..16 {
        let (first, second, steps) = strategy.new_tree(&mut runner).expect("a case").current();
        let policies = [
            quick_policy(&format!("{label}j{case}a"), &[first]),
            quick_policy(&format!("{label}j{case}b"), &[second]),
        ];
        let subject = LimitKey::parse("subject".to_owned()).expect("valid key");
        let slot_of = |policy: &Policy, key: &LimitKey| {
            let (names, _) = ratelimiter::store::key::state_keys("rl", policy, key);
            ratelimiter::store::topology::key_slot(&names[0])
        };
        let slot = slot_of(&policies[0], &subject);
        let beside = (0u32..)
            .map(|n| LimitKey::parse(format!("beside{n}")).expect("valid key"))
            .find(|k| slot_of(&policies[1], k) == slot)
            .expect("a key on the slot");
        let keys = [subject, beside];
        let params: Vec<Params> = policies.iter().map(|p| p.params()[0]).collect();
        let mut states: Vec<Option<State>> = vec![None, None];
        let mut ttls = vec![None, None];
        let mut queues: [Option<u64>; 2] = [None, None];
        for (i, &(pause_ms, pick, max_wait_us, kind)) in steps.iter().enumerate() {
            tokio::time::sleep(std::time::Duration::from_millis(pause_ms)).await;
            let what = format!("{label} case {case} step {i} of {params:?}");
            let costs = [
                1 + pick % params[0].quota(),
                1 + (pick / 7) % params[1].quota(),
            ];
            if kind % 3 == 0 {
                let plans: Vec<Plan<'_>> = (0..2)
                    .map(|s| Plan::acquire(&policies[s], &keys[s], costs[s]))
                    .collect();
                let got = store.acquire_joint(&plans).await.expect("joint acquire");
                let now = got[0].at_us;
                let (allowed, decisions) =
                    decide_joint_queued(&params, &mut states, &mut ttls, &costs, now, &queues);
                for (s, v) in got.iter().enumerate() {
                    assert_eq!(
                        (v.allowed, v.limits()),
                        (allowed, &decisions[s..=s]),
                        "{what}: joint acquire of {costs:?} behind {queues:?} at {now}"
                    );
                }
                behind += u64::from(queues.iter().flatten().any(|q| *q > now));
                continue;
            }
            let s = (kind % 3 - 1) as usize;
            let reserve_ask = Ask::Reserve {
                cost: costs[s],
                max_wait_us,
            };
            let got = store
                .decide(&Plan::new(&policies[s], &keys[s], reserve_ask))
                .await
                .expect("reserve");
            let r = reserve(
                &params[s..=s],
                &mut states[s..=s],
                &mut ttls[s..=s],
                costs[s],
                got.at_us,
                queues[s],
                max_wait_us,
            );
            queues[s] = r.queue_us;
            assert_eq!(got, r.verdict, "{what}: reserve on subject {s}");
        }
    }
    behind
}

/// A joint acquire (Envoy's protocol) keeps to each of its subjects' queues on the embedded
/// store, one Redis and a Cluster: a subject with reservations ahead denies it, as the model
/// says, and it takes nothing anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joint_acquires_keep_to_every_subjects_queue() {
    let memory = MemoryStore::new("rl", 1_000_000);
    let behind = joint_acquires_keep_to_the_queues(&memory, "m").await;
    assert!(behind > 10, "embedded: {behind}");
    let redis = TestRedis::start();
    let store = RedisStore::open(
        &redis.url(),
        ConnectionMode::Multiplexed,
        2,
        std::time::Duration::from_secs(5),
        "rl",
    )
    .expect("store");
    let behind = joint_acquires_keep_to_the_queues(&store, "r").await;
    assert!(behind > 10, "Redis: {behind}");
    let cluster = TestCluster::start();
    let seeds: Vec<String> = cluster.seeds().split(',').map(str::to_owned).collect();
    let store = RedisStore::open_cluster(&seeds, std::time::Duration::from_secs(5), "rl")
        .await
        .expect("cluster store");
    let behind = joint_acquires_keep_to_the_queues(&store, "c").await;
    assert!(behind > 10, "Cluster: {behind}");
}
