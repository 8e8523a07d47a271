//! The concurrency limit's scripts on a real Redis, held to `concurrency::decide`.
//!
//! A property test runs random sequences of takes (some with a deadline, some decided after it),
//! renewals, releases, resets, looks and sweeps on two subjects of one policy (random members
//! and costs, lease lengths from 1 µs to a day, a limit that changes, time that moves forward
//! and sometimes back) through `lua/concurrency.lua` and
//! through the pure function, and requires identical replies, identical leases in each subject's
//! sorted set and in the policy's ledger, and the keys' expiries the function asks for, step by
//! step. Targeted tests check what a reply cannot show: on Redis's own clock the keys expire
//! when their last lease does, a look writes nothing, and on a Cluster a policy's leases live on
//! the slot of its hash tag.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use ratelimiter::limiter::concurrency::{self, LeaseAnswer, LeaseCall, LeaseOp, Ledger, State};
use ratelimiter::policy::{FailMode, LimitKey, Policy, PolicyName};
use ratelimiter::store::connection::ConnectionMode;
use ratelimiter::store::key::{hash_tag, lease_key, lease_ledger};
use ratelimiter::store::{scripts, LeasePlan, RedisStore, Store};

use crate::helpers::{TestCluster, TestRedis};

/// A plausible current time in µs: large enough that float truncation would show.
const T0: u64 = 1_764_460_800_123_457;

/// The member that holds the sum of the costs in the sorted set (see `lua/concurrency.lua`).
const SUM: &str = "in_use";

/// A lease's member string, as the service draws them: `<32 hex>:<cost>`.
fn member(id: u64, cost: u64) -> String {
    format!("{id:032x}:{cost}")
}

/// A private Redis, a connection to it, and the two scripts loaded.
struct Lab {
    _redis: TestRedis,
    conn: redis::Connection,
    look: String,
    change: String,
    policies: u64,
}

impl Lab {
    fn new() -> Self {
        let redis = TestRedis::start();
        let mut conn = redis.conn();
        let (look, change) = scripts::lease_sources();
        let mut load = |source: String| -> String {
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(source)
                .query(&mut conn)
                .expect("SCRIPT LOAD")
        };
        let (look, change) = (load(look), load(change));
        Self {
            _redis: redis,
            conn,
            look,
            change,
            policies: 0,
        }
    }

    /// A fresh policy's ledger and the lease keys of two of its subjects, as the Redis store
    /// names them.
    fn policy(&mut self) -> (String, [String; 2]) {
        self.policies += 1;
        let name = format!("c{}", self.policies);
        let mut ledger = String::new();
        lease_ledger(&mut ledger, "rl", &name, 1);
        let subject = |k: &str| {
            let mut key = String::new();
            lease_key(&mut key, "rl", &name, 1, k);
            key
        };
        (ledger, [subject("x"), subject("y")])
    }

    /// One call as the Redis store makes it (a look with `EVALSHA_RO`) at `now` (`None`: Redis
    /// TIME): its reply.
    fn call(
        &mut self,
        keys: (&str, &str),
        call: &LeaseCall<'_>,
        now: Option<u64>,
    ) -> Result<Vec<u64>, String> {
        let mut pipe = redis::pipe();
        self.script(&mut pipe, keys, call, now);
        let (reply,): (Vec<u64>,) = pipe.query(&mut self.conn).map_err(|e| e.to_string())?;
        Ok(reply)
    }

    /// One call on `(ledger, subject)`, in a transaction that persists both keys after it (so
    /// that simulated time may run ahead of Redis's clock) and brackets it: the reply, each
    /// key's `PEXPIRETIME` as the script left it (-1 none, -2 no key; the ledger's first), and
    /// Redis's clock in ms before and after the script. (Redis 7.0 does not stop its clock
    /// inside a transaction, so the script's relative `PEXPIRE` counts from a moment in
    /// between.)
    fn call_persisted(
        &mut self,
        keys: (&str, &str),
        call: &LeaseCall<'_>,
        now: u64,
    ) -> Result<(Vec<u64>, [i64; 2], i64, i64), String> {
        let mut pipe = redis::pipe();
        pipe.atomic().cmd("TIME");
        self.script(&mut pipe, keys, call, Some(now));
        pipe.cmd("PEXPIRETIME").arg(keys.0);
        pipe.cmd("PEXPIRETIME").arg(keys.1).cmd("TIME");
        pipe.cmd("PERSIST").arg(keys.0).ignore();
        pipe.cmd("PERSIST").arg(keys.1).ignore();
        type Time = (i64, i64);
        let ((s0, us0), reply, ledger, subject, (s1, us1)): (Time, Vec<u64>, i64, i64, Time) =
            pipe.query(&mut self.conn).map_err(|e| e.to_string())?;
        let ms = |s: i64, us: i64| s * 1_000 + us / 1_000;
        Ok((reply, [ledger, subject], ms(s0, us0), ms(s1, us1)))
    }

    /// Adds one call of the script on `(ledger, subject)` to `pipe` (a sweep's names the
    /// ledger alone).
    fn script(
        &self,
        pipe: &mut redis::Pipeline,
        (ledger, subject): (&str, &str),
        call: &LeaseCall<'_>,
        now: Option<u64>,
    ) {
        let look = call.op == LeaseOp::Look;
        pipe.cmd(if look { "EVALSHA_RO" } else { "EVALSHA" })
            .arg(if look { &self.look } else { &self.change });
        if call.op == LeaseOp::Sweep {
            pipe.arg(1).arg(ledger);
        } else {
            pipe.arg(2).arg(ledger).arg(subject);
        }
        pipe.arg(call.op.as_str())
            .arg(call.member)
            .arg(call.cost)
            .arg(call.lease_us)
            .arg(call.limit);
        match now {
            Some(now) => pipe.arg(now),
            None => pipe.arg(""),
        };
        match call.deadline_us {
            Some(deadline) => pipe.arg(deadline),
            None => pipe.arg(""),
        };
    }

    /// The sorted set's leases (every score from 0 up: the sum's member alone is below), and
    /// the sum its `in_use` member holds.
    fn leases(&mut self, key: &str) -> (State, Option<u64>) {
        let expiries: Vec<(String, u64)> = redis::cmd("ZRANGEBYSCORE")
            .arg(key)
            .arg(0)
            .arg("+inf")
            .arg("WITHSCORES")
            .query(&mut self.conn)
            .expect("ZRANGEBYSCORE");
        let sum: Option<i64> = redis::cmd("ZSCORE")
            .arg(key)
            .arg(SUM)
            .query(&mut self.conn)
            .expect("ZSCORE");
        let mut state = State::default();
        for (m, expiry) in expiries {
            let cost = concurrency::member_cost(&m).expect("a lease member");
            state.leases.insert(m, (expiry, cost));
        }
        (state, sum.map(|s| (-s - 1) as u64))
    }

    /// The ledger's leases and their expiries, earliest first.
    fn ledger(&mut self, ledger: &str) -> Vec<(String, u64)> {
        let mut entries: Vec<(String, u64)> = redis::cmd("ZRANGE")
            .arg(ledger)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(&mut self.conn)
            .expect("ZRANGE");
        entries.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        entries
    }

    /// Writes `ledger` as the script keeps it, without expiry.
    fn restore_ledger(&mut self, key: &str, ledger: &Ledger) {
        let mut pipe = redis::pipe();
        pipe.atomic().cmd("DEL").arg(key).ignore();
        for (m, expiry) in ledger.entries() {
            pipe.cmd("ZADD").arg(key).arg(expiry).arg(m).ignore();
        }
        pipe.query::<()>(&mut self.conn).expect("restore");
    }

    /// Writes `state` as the script keeps it, without expiry.
    fn restore(&mut self, key: &str, state: Option<&State>) {
        let mut pipe = redis::pipe();
        pipe.atomic().cmd("DEL").arg(key).ignore();
        if let Some(state) = state {
            let held: u64 = state.leases.values().map(|(_, cost)| cost).sum();
            pipe.cmd("ZADD")
                .arg(key)
                .arg(-(held as i64) - 1)
                .arg(SUM)
                .ignore();
            for (m, (expiry, _)) in &state.leases {
                pipe.cmd("ZADD").arg(key).arg(*expiry).arg(m).ignore();
            }
        }
        pipe.query::<()>(&mut self.conn).expect("restore");
    }

    /// A key's content and absolute expiry (`PEXPIRETIME`; -1 none, -2 no key).
    fn snapshot(&mut self, key: &str) -> (Option<Vec<u8>>, i64) {
        let dump: Option<Vec<u8>> = redis::cmd("DUMP")
            .arg(key)
            .query(&mut self.conn)
            .expect("DUMP");
        let expires: i64 = redis::cmd("PEXPIRETIME")
            .arg(key)
            .query(&mut self.conn)
            .expect("PEXPIRETIME");
        (dump, expires)
    }
}

/// An answer as the script replies: `{ok, in_use, expires_in_us, retry_after_us, expired,
/// leases, now}`.
fn as_reply(a: &LeaseAnswer) -> Vec<u64> {
    vec![
        u64::from(a.ok),
        a.in_use,
        a.expires_in_us,
        a.retry_after_us,
        a.expired,
        a.leases,
        a.at_us,
    ]
}

/// One step: move the clock (sometimes back, sometimes to exactly a lease's expiry), maybe
/// change the limit, and make one call on one of the two subjects.
#[derive(Debug, Clone)]
struct Step {
    dt_us: i64,
    /// Instead of `dt_us`: to the expiry of the lease of this index among those the policy's
    /// ledger holds (when any is), or 1 µs before or after it.
    to_expiry: Option<(usize, i64)>,
    op: LeaseOp,
    /// Which subject, 0 or 1.
    subject: usize,
    /// Take (again), renew or release a member held (live or expired), the one of index `id`,
    /// rather than `member(id, cost)`.
    held: bool,
    /// Which of a few lease ids, and its cost.
    id: u64,
    cost: u64,
    lease_us: u64,
    /// A new limit, from this step on.
    limit: Option<u64>,
    /// A take's deadline, this many µs from its time (negative: it arrives late).
    deadline: Option<i64>,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let op = prop_oneof![
        5 => Just(LeaseOp::Take),
        3 => Just(LeaseOp::Renew),
        3 => Just(LeaseOp::Release),
        2 => Just(LeaseOp::Look),
        1 => Just(LeaseOp::Sweep),
        1 => Just(LeaseOp::Reset),
    ];
    let deadline = prop_oneof![
        5 => Just(None),
        2 => (-2i64..=2).prop_map(Some),
    ];
    let to_expiry = prop_oneof![
        4 => Just(None),
        1 => (0usize..8, -1i64..=1).prop_map(Some),
    ];
    let lease = prop_oneof![
        1 => 1u64..=3,
        2 => 1u64..=2_000,
        4 => 1_000u64..=5_000_000,
        1 => Just(concurrency::MAX_LEASE_MS * 1_000),
    ];
    let limit = prop_oneof![
        6 => Just(None),
        3 => (1u64..=8).prop_map(Some),
        1 => Just(Some(concurrency::MAX_LIMIT)),
    ];
    let step = (
        prop_oneof![
            3 => 0i64..2_000,
            3 => 0i64..500_000,
            2 => 0i64..5_000_000,
            1 => -3_000_000i64..0,
            1 => 0i64..100_000_000_000,
        ],
        to_expiry,
        op,
        (0usize..2, any::<bool>()),
        0u64..6,
        prop_oneof![3 => 1u64..=3, 1 => 1u64..=10],
        lease,
        (limit, deadline),
    )
        .prop_map(
            |(dt_us, to_expiry, op, (subject, held), id, cost, lease_us, (limit, deadline))| Step {
                dt_us,
                to_expiry,
                op,
                subject,
                held,
                id,
                cost,
                lease_us,
                limit,
                deadline,
            },
        );
    proptest::collection::vec(step, 1..60)
}

/// How often each kind of interesting step happened, so that the test can prove it explored
/// them.
#[derive(Debug, Default)]
struct Seen {
    granted: u64,
    denied_with_a_wait: u64,
    taken_again: u64,
    renewed: u64,
    released: u64,
    expired_dropped: u64,
    /// Expiries counted by a call on the other subject than theirs, or by a sweep.
    expired_elsewhere: u64,
    looks_denied: u64,
    /// Takes decided after their deadline (granting nothing), and resets that ended leases.
    late_takes: u64,
    resets: u64,
    keys_deleted: u64,
    at_an_expiry: u64,
    /// Keys that expired between the script and the `PERSIST` (not required to happen).
    expired_in_the_transaction: u64,
}

/// Checks a key's `PEXPIRETIME` (`expires`) after a step: none left (`kept` false) is no key;
/// an expiry the step did not set (`ttl` `None`) is none, the step before persisted it; a set
/// one is `ttl` rounded up to ms from the moment of the script. A key given less time than the
/// transaction took may be gone before it is read: `Ok(true)` asks the caller to restore it.
fn check_expiry(
    kept: bool,
    ttl: Option<u64>,
    expires: i64,
    (before_ms, after_ms): (i64, i64),
    context: &str,
) -> Result<bool, TestCaseError> {
    let ttl_ms = ttl.map(|t| t.div_ceil(1_000) as i64);
    match (kept, ttl_ms) {
        (false, _) => prop_assert_eq!(expires, -2, "{}", context),
        (true, None) => prop_assert_eq!(expires, -1, "{}", context),
        (true, Some(ttl_ms)) if expires == -2 && ttl_ms < after_ms - before_ms + 1 => {
            return Ok(true)
        }
        (true, Some(ttl_ms)) => prop_assert!(
            before_ms + ttl_ms <= expires && expires <= after_ms + ttl_ms,
            "expires at {} ms, not {} ms from between {} and {}: {}",
            expires,
            ttl_ms,
            before_ms,
            after_ms,
            context
        ),
    }
    Ok(false)
}

#[test]
fn every_lease_call_decides_exactly_as_decide() {
    let lab = std::cell::RefCell::new(Lab::new());
    let seen = std::cell::RefCell::new(Seen::default());
    let mut runner = TestRunner::new(Config {
        cases: 512,
        ..Config::default()
    });
    let result = runner.run(&(1u64..=6, steps()), |(limit, steps)| {
        let mut lab = lab.borrow_mut();
        let mut seen = seen.borrow_mut();
        let (ledger_key, keys) = lab.policy();
        let mut states: [Option<State>; 2] = [None, None];
        let mut ledger = Ledger::default();
        let mut limit = limit;
        let mut now = T0;
        for (i, step) in steps.iter().enumerate() {
            let who = step.subject;
            let held: Vec<(&str, u64)> = ledger.entries().collect();
            now = match step.to_expiry {
                Some((n, off)) if !held.is_empty() => {
                    let at = held[n % held.len()].1.saturating_add_signed(off);
                    seen.at_an_expiry += u64::from(off == 0);
                    at
                }
                _ => now.saturating_add_signed(step.dt_us),
            };
            limit = step.limit.unwrap_or(limit);
            // A take's member names its cost; a renewal or a release names a member, which
            // carries a cost of its own, as the API's lease ids do. The subjects' fresh members
            // differ, as random ones would; a held one may be the other subject's.
            let mine: Vec<&String> = states
                .iter()
                .flatten()
                .flat_map(|s| s.leases.keys())
                .collect();
            let m = match step.op {
                LeaseOp::Take | LeaseOp::Renew | LeaseOp::Release
                    if step.held && !mine.is_empty() =>
                {
                    mine[step.id as usize % mine.len()].clone()
                }
                _ => member(step.id + 100 * who as u64, step.cost),
            };
            let cost = match step.op {
                LeaseOp::Take => concurrency::member_cost(&m).unwrap_or(step.cost),
                _ => step.cost,
            };
            let call = LeaseCall {
                op: step.op,
                member: if matches!(step.op, LeaseOp::Look | LeaseOp::Sweep | LeaseOp::Reset) {
                    ""
                } else {
                    &m
                },
                cost,
                lease_us: step.lease_us,
                limit,
                deadline_us: step
                    .deadline
                    .filter(|_| step.op == LeaseOp::Take)
                    .map(|d| now.saturating_add_signed(d)),
            };
            prop_assert_eq!(call.problem(), None);
            let state = states[who].clone();
            let was_live = state
                .as_ref()
                .is_some_and(|s| s.leases.get(&m).is_some_and(|(expiry, _)| *expiry > now));
            let expired_here = state.as_ref().map_or(0, |s| {
                s.leases.values().filter(|(e, _)| *e <= now).count() as u64
            });
            let before = ledger.clone();
            let (next, answer, ttl) = concurrency::decide(state.clone(), &mut ledger, &call, now);
            let (reply, [ledger_expires, expires], before_ms, after_ms) = lab
                .call_persisted((&ledger_key, &keys[who]), &call, now)
                .map_err(TestCaseError::fail)?;
            let context = format!("step {i} at {now}: {call:?} on {state:?} with {before:?}");
            prop_assert_eq!(&reply, &as_reply(&answer), "{}", context);
            let clock = (before_ms, after_ms);
            if call.op == LeaseOp::Sweep {
                // A sweep names no subject: its key is untouched (persisted by the step before).
                prop_assert!(expires == -1 || expires == -2, "{}", context);
            } else if check_expiry(next.is_some(), ttl, expires, clock, &context)? {
                seen.expired_in_the_transaction += 1;
                lab.restore(&keys[who], next.as_ref());
            }
            // The ledger's expiry: a grace after its latest lease's, set by a take or renewal
            // that held.
            let moved = answer.ok && matches!(call.op, LeaseOp::Take | LeaseOp::Renew);
            let grace = concurrency::LEDGER_GRACE_MS * 1_000;
            let ledger_ttl = ledger
                .last()
                .filter(|_| moved)
                .map(|last| last - now + grace);
            if check_expiry(
                !ledger.is_empty(),
                ledger_ttl,
                ledger_expires,
                clock,
                &context,
            )? {
                seen.expired_in_the_transaction += 1;
                lab.restore_ledger(&ledger_key, &ledger);
            }
            // The sorted sets hold exactly the leases kept, and their sum.
            if call.op != LeaseOp::Sweep {
                let (stored, sum) = lab.leases(&keys[who]);
                let kept = next.clone().unwrap_or_default();
                prop_assert_eq!(&stored, &kept, "{}", context);
                let held: u64 = kept.leases.values().map(|(_, cost)| cost).sum();
                prop_assert_eq!(sum, next.as_ref().map(|_| held), "{}", context);
            }
            let in_ledger: Vec<(String, u64)> =
                ledger.entries().map(|(m, e)| (m.to_owned(), e)).collect();
            prop_assert_eq!(lab.ledger(&ledger_key), in_ledger, "{}", context);
            // What holds whatever the sequence.
            if answer.ok && call.op == LeaseOp::Take && !was_live {
                prop_assert!(answer.in_use <= limit, "{}", context);
            }
            let late = call.op == LeaseOp::Take && call.deadline_us.is_some_and(|d| now > d);
            if late {
                prop_assert!(!answer.ok && answer.retry_after_us == 0, "{}", context);
                seen.late_takes += 1;
            }
            match call.op {
                LeaseOp::Take if answer.ok && was_live => seen.taken_again += 1,
                LeaseOp::Take if answer.ok => seen.granted += 1,
                LeaseOp::Take if answer.retry_after_us > 0 => seen.denied_with_a_wait += 1,
                LeaseOp::Renew if answer.ok => seen.renewed += 1,
                LeaseOp::Release if answer.ok => seen.released += 1,
                LeaseOp::Look if !answer.ok => seen.looks_denied += 1,
                LeaseOp::Reset if answer.ok => seen.resets += 1,
                _ => {}
            }
            seen.expired_dropped += u64::from(answer.expired > 0);
            seen.expired_elsewhere += u64::from(answer.expired > expired_here);
            if call.op != LeaseOp::Sweep {
                seen.keys_deleted += u64::from(state.is_some() && next.is_none());
                states[who] = next;
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let seen = seen.into_inner();
    let counts = [
        seen.granted,
        seen.denied_with_a_wait,
        seen.taken_again,
        seen.renewed,
        seen.released,
        seen.expired_dropped,
        seen.expired_elsewhere,
        seen.looks_denied,
        seen.late_takes,
        seen.resets,
        seen.keys_deleted,
        seen.at_an_expiry,
    ];
    eprintln!("explored: {seen:?}");
    assert!(
        counts.iter().all(|n| *n > 100),
        "the sequences did not explore enough: {seen:?}"
    );
}

/// A Redis store of our own on `redis`, and a runtime to drive it.
fn store_on(redis: &TestRedis) -> (tokio::runtime::Runtime, RedisStore) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let store = {
        // The pool starts its housekeeping task on the current runtime.
        let _inside = rt.enter();
        RedisStore::open(
            &redis.url(),
            ConnectionMode::Multiplexed,
            2,
            Duration::from_secs(5),
            "rl",
        )
        .expect("store")
    };
    (rt, store)
}

/// The concurrency policy `exports` of incarnation 1 (its limit does not matter: the calls
/// name theirs).
fn exports() -> Policy {
    let name = PolicyName::parse("exports").expect("valid");
    let params = concurrency::Params {
        limit: 3,
        lease_us: 1_000_000,
        max_lease_us: 1_000_000,
    };
    Policy::concurrent(name, params, None, FailMode::Closed).with_incarnation(1)
}

fn call(op: LeaseOp, member: &str, cost: u64, lease_us: u64) -> LeaseCall<'_> {
    LeaseCall {
        op,
        member,
        cost,
        lease_us,
        limit: 3,
        deadline_us: None,
    }
}

#[test]
fn on_redis_time_the_key_expires_when_its_last_lease_would() {
    let redis = TestRedis::start();
    let (rt, store) = store_on(&redis);
    let mut conn = redis.conn();
    let subject = LimitKey::parse("k".into()).expect("valid");
    let (mut key, mut ledger) = (String::new(), String::new());
    lease_key(&mut key, "rl", "exports", 1, "k");
    lease_ledger(&mut ledger, "rl", "exports", 1);
    let mut expiry_ms = || -> (i64, i64) {
        redis::pipe()
            .cmd("PEXPIRETIME")
            .arg(&key)
            .cmd("PEXPIRETIME")
            .arg(&ledger)
            .query(&mut conn)
            .expect("PEXPIRETIME")
    };
    let policy = exports();
    let lease = |c: LeaseCall<'_>| {
        rt.block_on(store.lease(&LeasePlan {
            policy: &policy,
            key: &subject,
            call: c,
            at_us: None,
        }))
        .expect("answered")
    };
    let (long, short) = (member(1, 1), member(2, 2));
    // Lease ends in µs; the key's expiry is the latest of them in ms, rounded up, and the
    // ledger's a grace later.
    let ends = |a: &LeaseAnswer| {
        let ms = (a.at_us + a.expires_in_us).div_ceil(1_000) as i64;
        (ms, ms + concurrency::LEDGER_GRACE_MS as i64)
    };

    let a = lease(call(LeaseOp::Take, &long, 1, 60_000_123));
    assert!(a.ok);
    assert_eq!(expiry_ms(), ends(&a));
    // A shorter lease leaves the keys to the longer one.
    let b = lease(call(LeaseOp::Take, &short, 2, 1_500_001));
    assert!(b.ok);
    assert_eq!((b.in_use, b.leases), (3, 2));
    assert_eq!(expiry_ms(), ends(&a));
    // Renewing the longer one shorter makes the other the last.
    let a = lease(call(LeaseOp::Renew, &long, 1, 1_000_000));
    assert!(a.ok);
    assert_eq!(expiry_ms(), ends(&b));
    // A denial changes nothing, the keys' expiries included.
    let denied = lease(call(LeaseOp::Take, &member(3, 1), 1, 1_000));
    assert!(!denied.ok);
    assert!(denied.retry_after_us > 0 && denied.retry_after_us <= 1_000_000);
    assert_eq!(expiry_ms(), ends(&b));
    // Both leases end within 2 s: so does the key, with no call to delete it, and not
    // before the last lease.
    let last_ms = ends(&b).0;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (exists, (s, us)): (bool, (i64, i64)) = redis::pipe()
            .atomic()
            .cmd("EXISTS")
            .arg(&key)
            .cmd("TIME")
            .query(&mut redis.conn())
            .expect("EXISTS, TIME");
        if !exists {
            // Read after EXISTS, so no earlier than the moment the key was found gone.
            assert!(
                s * 1_000 + us / 1_000 >= last_ms,
                "the key went before its last lease"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the key outlived its last lease"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The ledger outlives them, and a sweep counts both expiries: nobody touched their
    // subject again, and its key is gone.
    let swept = rt
        .block_on(store.sweep_leases(&policy, None))
        .expect("swept");
    assert_eq!((swept.expired, swept.leases), (2, 0));
    assert_eq!(expiry_ms(), (-2, -2));
    // A release of the last lease deletes the subject's key at once.
    assert!(lease(call(LeaseOp::Take, &long, 1, 60_000_000)).ok);
    let released = lease(call(LeaseOp::Release, &long, 1, 0));
    assert_eq!(
        (released.ok, released.in_use, released.leases),
        (true, 0, 0)
    );
    assert_eq!(expiry_ms().0, -2);
}

#[test]
fn a_look_writes_nothing_and_runs_read_only() {
    let mut lab = Lab::new();
    let (ledger, [key, other]) = lab.policy();
    let keys = (ledger.as_str(), key.as_str());
    let look = |cost| LeaseCall {
        op: LeaseOp::Look,
        member: "",
        cost,
        lease_us: 0,
        limit: 3,
        deadline_us: None,
    };
    // No key: a look answers and creates none.
    let reply = lab.call(keys, &look(3), Some(T0)).expect("look");
    assert_eq!(reply, [1, 0, 0, 0, 0, 0, T0]);
    assert_eq!(lab.snapshot(&key), (None, -2));
    assert_eq!(lab.snapshot(&ledger), (None, -2));
    // Two leases, one short, and another subject's: at T0 + 10 ms the short one has expired
    // and is not dropped yet.
    let (a, b, c) = (member(1, 1), member(2, 1), member(3, 1));
    for (k, m, lease_us) in [
        (&key, &a, 5_000),
        (&key, &b, 60_000_000),
        (&other, &c, 60_000_000),
    ] {
        let reply = lab
            .call((&ledger, k), &call(LeaseOp::Take, m, 1, lease_us), Some(T0))
            .expect("take");
        assert_eq!(reply[0], 1);
    }
    let before = (lab.snapshot(&key), lab.snapshot(&ledger));
    assert!(before.0 .0.is_some() && before.0 .1 > 0, "{before:?}");
    let later = T0 + 10_000;
    for (cost, fits) in [(1, true), (2, true), (3, false)] {
        let reply = lab.call(keys, &look(cost), Some(later)).expect("look");
        let wait = if fits { 0 } else { 60_000_000 - 10_000 };
        // in_use counts the subject's live lease only, leases the policy's two live ones;
        // nothing is dropped or counted as expired.
        assert_eq!(
            reply,
            [u64::from(fits), 1, 0, wait, 0, 2, later],
            "cost {cost}"
        );
        assert_eq!(
            (lab.snapshot(&key), lab.snapshot(&ledger)),
            before,
            "a look of {cost} changed a key"
        );
    }
    // On Redis's clock too.
    let reply = lab.call(keys, &look(1), None).expect("look");
    assert_eq!(reply[0], 1);
    assert_eq!((lab.snapshot(&key), lab.snapshot(&ledger)), before);
    // The next change drops and counts the expired lease, even on the other subject.
    let reply = lab
        .call(
            (&ledger, &other),
            &call(LeaseOp::Renew, &c, 1, 60_000_000),
            Some(later),
        )
        .expect("renew");
    assert_eq!(reply, [1, 1, 60_000_000, 0, 1, 2, later]);
}

#[test]
fn the_store_refuses_a_take_whose_member_names_another_cost() {
    let redis = TestRedis::start();
    let (rt, store) = store_on(&redis);
    let subject = LimitKey::parse("k".into()).expect("valid");
    let m = member(1, 2);
    let wrong = call(LeaseOp::Take, &m, 1, 1_000);
    assert!(rt
        .block_on(store.lease(&LeasePlan {
            policy: &exports(),
            key: &subject,
            call: wrong,
            at_us: Some(T0)
        }))
        .is_err());
    let keys: i64 = redis::cmd("DBSIZE")
        .query(&mut redis.conn())
        .expect("DBSIZE");
    assert_eq!(keys, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_policy_s_leases_and_ledger_live_on_the_slot_of_its_hash_tag() {
    let cluster = Arc::new(TestCluster::start());
    let seeds: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let store = RedisStore::open_cluster(&seeds, Duration::from_secs(5), "rl")
        .await
        .expect("cluster store");
    let mut conn = cluster.nodes()[0].conn();
    let mut slots = std::collections::HashSet::new();
    for i in 0..24 {
        let policy = exports().with_incarnation(i);
        let mut ledger = String::new();
        lease_ledger(&mut ledger, "rl", "exports", i);
        for j in 0..4 {
            let raw = match j {
                0 => format!("user-{i}"),
                1 => format!("{{tag}}-{i}"),
                2 => format!("a}}{i}{{b"),
                _ => format!("x:{i}:y"),
            };
            let subject = LimitKey::parse(raw.clone()).expect("valid");
            let m = member(i * 10 + j, 1);
            for op in [LeaseOp::Take, LeaseOp::Look, LeaseOp::Renew] {
                let answer = store
                    .lease(&LeasePlan {
                        policy: &policy,
                        key: &subject,
                        call: call(op, &m, 1, 60_000_000),
                        at_us: None,
                    })
                    .await
                    .unwrap_or_else(|e| panic!("{op:?} on {raw}: {e}"));
                assert!(answer.ok, "{op:?} on {raw}: {answer:?}");
                assert_eq!(answer.leases, j + 1, "{op:?} on {raw}");
            }
            let mut key = String::new();
            lease_key(&mut key, "rl", "exports", i, &raw);
            let tag = hash_tag(&key);
            assert_eq!(tag, format!("exports@{i}"), "{key}");
            assert_eq!(tag, hash_tag(&ledger));
            let slot: i64 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(&key)
                .query(&mut conn)
                .expect("KEYSLOT");
            let tag_slot: i64 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(tag)
                .query(&mut conn)
                .expect("KEYSLOT");
            assert_eq!(slot, tag_slot, "{key}");
            slots.insert(slot);
            // The lease is where its slot's master keeps it, in the subject's set and in the
            // ledger.
            let held = cluster.nodes().iter().any(|n| {
                let mut c = n.conn();
                let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut c).expect("ROLE");
                let score = |k: &str, c: &mut redis::Connection| {
                    redis::cmd("ZSCORE")
                        .arg(k)
                        .arg(&m)
                        .query::<Option<f64>>(c)
                        .is_ok_and(|s| s.is_some())
                };
                matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master")
                    && score(&key, &mut c)
                    && score(&ledger, &mut c)
            });
            assert!(held, "{key} holds no lease on its master");
        }
        let swept = store.sweep_leases(&policy, None).await.expect("sweep");
        assert_eq!((swept.expired, swept.leases), (0, 4));
    }
    assert!(slots.len() > 12, "policies spread over slots: {slots:?}");
    // Each of them is in the lease index, one key on one slot, written beside the lease calls
    // (no script may write a key of another slot on a Cluster).
    let index = store.leased_ledgers().await.expect("the index");
    for i in 0..24 {
        assert!(
            index
                .iter()
                .any(|e| e.policy == "exports" && e.incarnation == i),
            "exports@{i} is not indexed: {index:?}"
        );
    }
}
