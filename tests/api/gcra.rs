//! GCRA's script on a real Redis, driven with explicit times: it decides exactly as its Rust
//! function, a burst of `burst` simultaneous requests admits exactly `burst`, beside
//! go-redis/redis_rate's float GCRA every disagreement is settled by exact arithmetic in our
//! favour, and the classic flaws that apply to GCRA are absent.
//!
//! The script is the one the service sends for a one-limit GCRA policy
//! (`scripts::compose(&[Algorithm::Gcra], Op::Acquire)`); redis_rate's keeps its own arguments and reply.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use ratelimiter::limiter::gcra::{
    self, Params, MAX_BURST, MAX_PERIOD_MS, MAX_RATE, MIN_BURST, MIN_PERIOD_MS, MIN_RATE,
};
use ratelimiter::limiter::{Algorithm, Decision, Op, Rule};
use ratelimiter::store::scripts;

use crate::helpers::TestRedis;

const REDIS_RATE: &str = include_str!("classic/redis_rate_gcra.lua");

/// A plausible current time in µs: large enough that float truncation would show.
const T0: u64 = 1_764_460_800_123_457;

/// Our acquire script's reply for one limit: allowed, then the limit's admits, remaining,
/// reset_after_us and retry_after_us, the decision's time, and the limit's refund count.
type Reply = (u8, u8, u64, u64, u64, u64, u64);

fn decision(
    (allowed, _admits, remaining, reset_after_us, retry_after_us, _now, _refunded): Reply,
) -> Decision {
    Decision {
        allowed: allowed == 1,
        remaining,
        reset_after_us,
        retry_after_us,
    }
}

fn params(rate: u64, period_ms: u64, burst: u64) -> Params {
    Params::parse(rate, period_ms, burst).expect("in range")
}

/// A private Redis with both scripts loaded.
struct Lab {
    _redis: TestRedis,
    conn: redis::Connection,
    ours: String,
    theirs: String,
    keys: u64,
}

/// What one call of our script did: its reply, and the key's expiry as set by the call.
struct Call {
    decision: Decision,
    /// `(earliest, latest)` TTL in ms that the call may have set, from Redis's clock read just
    /// before and after it; `None` when the key has no expiry or does not exist.
    ttl_ms: Option<(i64, i64)>,
    exists: bool,
}

impl Lab {
    fn new() -> Self {
        let redis = TestRedis::start();
        let mut conn = redis.conn();
        let mut load = |source: &str| -> String {
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(source)
                .query(&mut conn)
                .expect("SCRIPT LOAD")
        };
        let (ours, theirs) = (
            load(&scripts::compose(&[Algorithm::Gcra], Op::Acquire)),
            load(REDIS_RATE),
        );
        Self {
            _redis: redis,
            conn,
            ours,
            theirs,
            keys: 0,
        }
    }

    fn key(&mut self) -> String {
        self.keys += 1;
        format!("gcra:{{s{}}}", self.keys)
    }

    fn ours_cmd(&self, key: &str, p: &Params, cost: u64, now: Option<u64>) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.ours).arg(1).arg(key).arg(cost);
        match now {
            Some(now) => cmd.arg(now),
            None => cmd.arg(""),
        };
        cmd.arg(Rule::script_args(p).as_slice());
        cmd
    }

    /// Our script at `now` (`None`: Redis's clock), with the key's expiry left as it set it.
    fn ours(&mut self, key: &str, p: &Params, cost: u64, now: Option<u64>) -> Decision {
        let reply: Reply = self
            .ours_cmd(key, p, cost, now)
            .query(&mut self.conn)
            .expect("gcra.lua");
        decision(reply)
    }

    /// Our script at `now`, then the expiry it set, then the key persisted, all in one
    /// transaction: simulated time may run far ahead of Redis's clock without the key expiring.
    fn ours_persisted(&mut self, key: &str, p: &Params, cost: u64, now: u64) -> Call {
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("TIME")
            .add_command(self.ours_cmd(key, p, cost, Some(now)))
            .cmd("PEXPIRETIME")
            .arg(key)
            .cmd("TIME")
            .cmd("PERSIST")
            .arg(key)
            .ignore();
        let (before, reply, expires_at, after): ((u64, u64), Reply, i64, (u64, u64)) = pipe
            .query(&mut self.conn)
            .expect("gcra.lua in a transaction");
        let ms = |(s, us): (u64, u64)| (s * 1_000 + us / 1_000) as i64;
        // Redis set the expiry at some ms between `before` and `after`.
        let ttl_ms = (expires_at >= 0).then(|| (expires_at - ms(after), expires_at - ms(before)));
        Call {
            decision: decision(reply),
            ttl_ms,
            exists: expires_at != -2,
        }
    }

    /// redis_rate's script as `Limiter.AllowN` calls it, at `now`; the key persisted after.
    /// Returns whether it allowed the request.
    fn theirs(
        &mut self,
        key: &str,
        rate: u64,
        period_ms: u64,
        burst: u64,
        cost: u64,
        now: u64,
    ) -> bool {
        // Go passes `Period.Seconds()`, a float64 that go-redis prints in its shortest form.
        let period_s = format!("{}", period_ms as f64 / 1_000.0);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("EVALSHA")
            .arg(&self.theirs)
            .arg(1)
            .arg(key)
            .arg(burst)
            .arg(rate)
            .arg(period_s)
            .arg(cost)
            .arg(now / 1_000_000)
            .arg(now % 1_000_000)
            .cmd("PERSIST")
            .arg(key)
            .ignore();
        let ((allowed, _remaining, _retry, _reset),): ((u64, i64, String, String),) =
            pipe.query(&mut self.conn).expect("redis_rate's script");
        allowed > 0
    }
}

/// GCRA in exact integers, written independently of `limiter::gcra`: times are scaled by the
/// rate, so the emission interval is `period_us` and nothing is fractional.
#[derive(Debug, Clone, Copy)]
struct Exact {
    rate: u128,
    period_us: u128,
    burst: u128,
    /// TAT in µs times `rate`.
    tat: Option<u128>,
}

impl Exact {
    fn new(rate: u64, period_ms: u64, burst: u64) -> Self {
        Self {
            rate: rate.into(),
            period_us: u128::from(period_ms) * 1_000,
            burst: burst.into(),
            tat: None,
        }
    }

    /// Units available at `now`, as a fraction over `period_us`.
    fn available(&self, now: u64) -> (u128, u128) {
        let t = u128::from(now) * self.rate;
        let busy = self.tat.map_or(0, |tat| tat.saturating_sub(t));
        (self.burst * self.period_us - busy, self.period_us)
    }

    fn acquire(&mut self, cost: u64, now: u64) -> bool {
        let t = u128::from(now) * self.rate;
        let new_tat = self.tat.unwrap_or(t).max(t) + u128::from(cost) * self.period_us;
        let allowed = new_tat - t <= self.burst * self.period_us;
        if allowed {
            self.tat = Some(new_tat);
        }
        allowed
    }
}

fn show((num, den): (u128, u128)) -> String {
    format!("{num}/{den} = {:.9}", num as f64 / den as f64)
}

// --- Property: the script decides exactly as the Rust function ---------------------------------

fn any_params() -> impl Strategy<Value = (u64, u64, u64)> {
    (
        prop_oneof![1u64..=12, Just(MAX_RATE), MIN_RATE..=MAX_RATE],
        prop_oneof![
            1u64..=20,
            Just(1_000u64),
            Just(MAX_PERIOD_MS),
            MIN_PERIOD_MS..=MAX_PERIOD_MS
        ],
        prop_oneof![1u64..=12, Just(MAX_BURST), MIN_BURST..=MAX_BURST],
    )
}

fn steps() -> impl Strategy<Value = Vec<(i64, u64)>> {
    let dt = prop_oneof![
        3 => 0i64..2_000,
        3 => 0i64..50_000,
        2 => 0i64..5_000_000,
        1 => -3_000_000i64..0,
        1 => 0i64..100_000_000_000,
    ];
    proptest::collection::vec((dt, any::<u64>()), 1..40)
}

#[test]
fn the_gcra_script_decides_exactly_as_its_rust_function() {
    let lab = std::cell::RefCell::new(Lab::new());
    let mut runner = TestRunner::new(Config {
        cases: 256,
        ..Config::default()
    });
    let result = runner.run(
        &(any_params(), steps()),
        |((rate, period_ms, burst), steps)| {
            let mut lab = lab.borrow_mut();
            let p = params(rate, period_ms, burst);
            let key = lab.key();
            let mut state: Option<gcra::State> = None;
            let mut now = T0;
            let mut last: Option<Decision> = None;
            for (i, (dt, pick)) in steps.into_iter().enumerate() {
                // Now and then exactly at (or a µs before) the time the last answer announced,
                // where rounding in either direction would show.
                let announced = match (pick / 8 % 6, last) {
                    (0, Some(d)) if !d.allowed => Some(d.retry_after_us),
                    (1, Some(d)) if !d.allowed => Some(d.retry_after_us.saturating_sub(1)),
                    (2, Some(d)) => Some(d.reset_after_us),
                    _ => None,
                };
                // Times stay below 2^52 µs (the year 2112): the scripts count on times below
                // 2^53, and a capped wait of 2^50 µs is no time to jump to.
                now = match announced {
                    Some(wait) if now + wait < 1 << 52 => now + wait,
                    _ => now.saturating_add_signed(dt),
                };
                // Mostly small costs, sometimes the whole burst.
                let mut cost = match pick % 8 {
                    0 => burst,
                    _ => 1 + pick % burst.min(5),
                };
                // Now and then one whole span of `num` µs (`den` intervals) past the anchor, with
                // the cost that fits exactly: a float interval rounds this one either way.
                if let (3, Some(s)) = (pick / 8 % 6, state) {
                    let (num, den) = p.interval();
                    let busy = s.units.saturating_sub(den);
                    if s.anchor_us + num >= now && busy < burst {
                        (now, cost) = (s.anchor_us + num, burst - busy);
                    }
                }
                let expected = gcra::acquire(state, &p, cost, now);
                state = expected.state.or(state);
                last = Some(expected.decision);
                let got = lab.ours_persisted(&key, &p, cost, now);
                let at =
                    format!("step {i} at {now} cost {cost} of {rate}/{period_ms} ms burst {burst}");
                prop_assert_eq!(got.decision, expected.decision, "{}", at);
                match expected.ttl_us {
                    Some(ttl) => {
                        let ms = ttl.div_ceil(1_000) as i64;
                        let (earliest, latest) = got.ttl_ms.unwrap_or((-1, -1));
                        prop_assert!(
                            earliest <= ms && ms <= latest,
                            "{}: TTL {} ms, set {:?}",
                            at,
                            ms,
                            got.ttl_ms
                        );
                    }
                    // A denial writes nothing: the key is as the last allowed call left it.
                    None => prop_assert_eq!(got.exists, state.is_some(), "{}", at),
                }
            }
            Ok(())
        },
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}

// --- A burst of B simultaneous requests admits exactly B ---------------------------------------

/// `burst` requests of one unit at one `now`, then one more, on the script and on the Rust
/// function. Bursts above 300 take all but the last 300 units in one request first, which the
/// unit tests of `limiter::gcra` show to leave the state that as many single requests leave.
fn burst_on_both(lab: &mut Lab, rate: u64, period_ms: u64, burst: u64) -> Result<(), String> {
    let p = params(rate, period_ms, burst);
    let key = lab.key();
    let tail = burst.min(300);
    let mut state = None;
    if burst > tail {
        let o = gcra::acquire(None, &p, burst - tail, T0);
        let d = lab.ours_persisted(&key, &p, burst - tail, T0).decision;
        if !(o.decision.allowed && d.allowed) {
            return Err(format!("the first {} units: {d:?}", burst - tail));
        }
        state = o.state;
    }
    let mut pipe = redis::pipe();
    // Persisted after each call, all in one transaction: the expiry is set on Redis's clock,
    // which runs on while the simulated one stands still, and no key expires inside a
    // transaction.
    pipe.atomic();
    for _ in 0..=tail {
        pipe.add_command(lab.ours_cmd(&key, &p, 1, Some(T0)))
            .cmd("PERSIST")
            .arg(&key)
            .ignore();
    }
    let replies: Vec<Reply> = pipe.query(&mut lab.conn).map_err(|e| e.to_string())?;
    let (mut lua, mut rust) = (0, 0);
    for reply in replies {
        let o = gcra::acquire(state, &p, 1, T0);
        state = o.state.or(state);
        rust += u64::from(o.decision.allowed);
        lua += u64::from(reply.0);
    }
    if (lua, rust) != (tail, tail) {
        return Err(format!(
            "{rate}/{period_ms} ms burst {burst}: the last {} requests admitted {lua} in Lua, \
             {rust} in Rust, instead of {tail}",
            tail + 1
        ));
    }
    Ok(())
}

#[test]
fn a_burst_of_b_simultaneous_requests_admits_exactly_b_for_every_rate_period_and_burst() {
    let lab = std::cell::RefCell::new(Lab::new());
    for (rate, period_ms, burst) in [(10, 1_000, 10), (3, 1_000, 3), (27, 1_000, 27), (7, 1, 300)] {
        let result = burst_on_both(&mut lab.borrow_mut(), rate, period_ms, burst);
        assert_eq!(result, Ok(()));
    }
    let mut runner = TestRunner::new(Config {
        cases: 128,
        ..Config::default()
    });
    let result = runner.run(&any_params(), |(rate, period_ms, burst)| {
        burst_on_both(&mut lab.borrow_mut(), rate, period_ms, burst).map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

// --- Beside go-redis/redis_rate: where the two differ, exact arithmetic shows ours right --------

#[test]
fn redis_rate_admits_9_of_a_simultaneous_burst_of_10_at_10_per_second_and_ours_admits_10() {
    let mut lab = Lab::new();
    let p = params(10, 1_000, 10);
    let (ours_key, theirs_key) = (lab.key(), lab.key());
    let mut exact = Exact::new(10, 1_000, 10);
    let (mut ours, mut theirs) = (0, 0);
    for i in 0..10 {
        let available = exact.available(T0);
        let right = exact.acquire(1, T0);
        assert!(right, "request {i}: exactly {} available", show(available));
        ours += u64::from(lab.ours(&ours_key, &p, 1, Some(T0)).allowed);
        theirs += u64::from(lab.theirs(&theirs_key, 10, 1_000, 10, 1, T0));
    }
    assert_eq!(ours, 10);
    assert_eq!(
        theirs, 9,
        "redis_rate's float TAT has changed: revisit this test"
    );
}

/// One disagreement: the parameters, the request and what exact arithmetic says.
struct Disagreement {
    limit: (u64, u64, u64),
    step: usize,
    cost: u64,
    /// Units available before the request, exactly.
    available: String,
    ours_allowed: bool,
}

impl std::fmt::Display for Disagreement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (rate, period_ms, burst) = self.limit;
        write!(
            f,
            "{rate}/{period_ms} ms burst {burst}, request {} of cost {} with exactly {} units \
             available: redis_rate {}, ours {}",
            self.step,
            self.cost,
            self.available,
            if self.ours_allowed {
                "refused"
            } else {
                "admitted"
            },
            if self.ours_allowed {
                "admitted"
            } else {
                "refused"
            },
        )
    }
}

/// Runs `requests` through both scripts on fresh keys until their first disagreement (after it
/// their histories differ, so later answers no longer compare); requires ours to match exact
/// arithmetic at every step, and returns the disagreement, if any.
fn side_by_side(
    lab: &mut Lab,
    (rate, period_ms, burst): (u64, u64, u64),
    requests: &[(u64, u64)],
) -> Result<Option<Disagreement>, String> {
    let p = params(rate, period_ms, burst);
    let (ours_key, theirs_key) = (lab.key(), lab.key());
    let mut exact = Exact::new(rate, period_ms, burst);
    for (step, &(now, cost)) in requests.iter().enumerate() {
        let available = show(exact.available(now));
        let right = exact.acquire(cost, now);
        let ours = lab
            .ours_persisted(&ours_key, &p, cost, now)
            .decision
            .allowed;
        let theirs = lab.theirs(&theirs_key, rate, period_ms, burst, cost, now);
        if ours != right {
            return Err(format!(
                "ours is wrong at step {step} ({rate}/{period_ms} ms burst {burst}, cost {cost} \
                 at {now}): {available} available, allowed {ours}"
            ));
        }
        if ours != theirs {
            return Ok(Some(Disagreement {
                limit: (rate, period_ms, burst),
                step,
                cost,
                available,
                ours_allowed: ours,
            }));
        }
    }
    Ok(None)
}

#[test]
fn where_redis_rate_and_ours_disagree_exact_arithmetic_shows_ours_right() {
    let mut lab = Lab::new();
    let mut found = Vec::new();
    // A full burst, then a request just before, at and just after the exact time it fits.
    for rate in 1..=60u64 {
        for period_ms in [1, 1_000, 60_000] {
            let burst = rate;
            for (first, cost) in [(burst, 1), (burst, burst.min(8)), (burst / 2 + 1, burst)] {
                // Exactly (first + cost - burst) intervals of period_us / rate must pass.
                let need = u128::from(first + cost - burst) * u128::from(period_ms) * 1_000;
                let at = (need / u128::from(rate)) as u64;
                for dt in [at.saturating_sub(1), at, at + 1] {
                    let requests = [(T0, first), (T0 + dt, cost)];
                    if let Some(d) = side_by_side(&mut lab, (rate, period_ms, burst), &requests)
                        .unwrap_or_else(|e| panic!("{e}"))
                    {
                        found.push(d);
                    }
                }
            }
        }
    }
    // Random sequences on a forward clock.
    let mut runner = TestRunner::new(Config {
        cases: 128,
        ..Config::default()
    });
    let limits = (
        prop_oneof![1u64..=100, 1u64..=1_000_000],
        prop_oneof![
            Just(1u64),
            Just(1_000u64),
            Just(60_000u64),
            1u64..=86_400_000
        ],
        1u64..=100,
    );
    let seqs = proptest::collection::vec(
        (prop_oneof![0u64..1_000, 0u64..2_000_000], any::<u64>()),
        1..30,
    );
    let found = std::cell::RefCell::new(found);
    let lab = std::cell::RefCell::new(lab);
    let result = runner.run(&(limits, seqs), |(limit, seq)| {
        let mut now = T0;
        let requests: Vec<(u64, u64)> = seq
            .into_iter()
            .map(|(dt, pick)| {
                now += dt;
                (
                    now,
                    1 + pick % limit.2.min(if pick % 4 == 0 { 100 } else { 3 }),
                )
            })
            .collect();
        let d =
            side_by_side(&mut lab.borrow_mut(), limit, &requests).map_err(TestCaseError::fail)?;
        found.borrow_mut().extend(d);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let found = found.into_inner();
    let admitted_too_much: Vec<_> = found.iter().filter(|d| !d.ours_allowed).collect();
    let refused_too_much: Vec<_> = found.iter().filter(|d| d.ours_allowed).collect();
    eprintln!("{} disagreements, ours right in each:", found.len());
    for d in &found {
        eprintln!("  {d}");
    }
    // Both kinds occur, so this test cannot pass by finding nothing.
    assert!(
        !admitted_too_much.is_empty(),
        "no over-admission by redis_rate found"
    );
    assert!(
        !refused_too_much.is_empty(),
        "no wrong refusal by redis_rate found"
    );
}

// --- The classic flaws that apply to GCRA, on our script ---------------------------------------

#[test]
fn gcra_takes_time_from_redis_when_none_is_given() {
    let mut lab = Lab::new();
    let p = params(1, 60_000, 2);
    let key = lab.key();
    let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut lab.conn).expect("TIME");
    let before = s * 1_000_000 + us;
    let d = lab.ours(&key, &p, 2, None);
    assert!(d.allowed && d.remaining == 0, "{d:?}");
    // One interval later by Redis's clock (and a margin for the calls in between), exactly one
    // unit is back; had the script used another clock, none or both would be.
    let later = before + 60_000_000 + 5_000_000;
    assert!(lab.ours(&key, &p, 1, Some(later)).allowed);
    assert!(!lab.ours(&key, &p, 1, Some(later)).allowed);
}

#[test]
fn a_clock_stepping_back_never_refunds_gcra() {
    let mut lab = Lab::new();
    let p = params(1, 1_000, 10);
    let key = lab.key();
    assert!(lab.ours(&key, &p, 5, Some(T0)).allowed);
    let d = lab.ours(&key, &p, 1, Some(T0 - 5_000_000));
    assert!(d.allowed && d.remaining == 4, "after stepping back: {d:?}");
    let d = lab.ours(&key, &p, 5, Some(T0 + 1_000_000));
    assert!(d.allowed && d.remaining == 0, "4 left + 1 back: {d:?}");
    let d = lab.ours(&key, &p, 1, Some(T0 - 60_000_000));
    assert!(!d.allowed && d.retry_after_us == 62_000_000, "{d:?}");
}

#[test]
fn gcra_does_not_drift_over_many_small_steps() {
    // 3 per 10 s (an interval of 3⅓ s), burst 2, asked every second for 10,000 s after a first
    // request: the burst's second unit, then exactly 3,000.
    let mut lab = Lab::new();
    let p = params(3, 10_000, 2);
    let key = lab.key();
    assert!(lab.ours(&key, &p, 1, Some(T0)).allowed);
    // One transaction, so that no short TTL set on Redis's clock expires between two calls.
    let mut pipe = redis::pipe();
    pipe.atomic();
    for second in 1..=10_000u64 {
        pipe.add_command(lab.ours_cmd(&key, &p, 1, Some(T0 + second * 1_000_000)))
            .cmd("PERSIST")
            .arg(&key)
            .ignore();
    }
    let replies: Vec<Reply> = pipe.query(&mut lab.conn).expect("the sequence");
    let granted: u64 = replies.iter().map(|r| u64::from(r.0)).sum();
    assert_eq!(granted, 3_001);
}

#[test]
fn gcra_retry_after_is_exact_to_the_microsecond() {
    // Persisted: the state's real TTL (under half a second) must not matter.
    let mut lab = Lab::new();
    for cost in 1..=3 {
        let p = params(7, 1_000, 3);
        let key = lab.key();
        assert!(lab.ours_persisted(&key, &p, 2, T0).decision.allowed);
        assert!(lab.ours_persisted(&key, &p, 1, T0 + 333).decision.allowed);
        let d = lab.ours(&key, &p, cost, Some(T0 + 777));
        assert!(!d.allowed && d.retry_after_us > 0, "{d:?}");
        let at = T0 + 777 + d.retry_after_us;
        assert!(
            !lab.ours(&key, &p, cost, Some(at - 1)).allowed,
            "cost {cost}: early {d:?}"
        );
        assert!(
            lab.ours(&key, &p, cost, Some(at)).allowed,
            "cost {cost}: late {d:?}"
        );
    }
}

#[test]
fn denied_gcra_requests_consume_nothing() {
    let mut lab = Lab::new();
    let p = params(5, 60_000, 5);
    let key = lab.key();
    assert!(lab.ours(&key, &p, 4, Some(T0)).allowed);
    let stored: Vec<u8> = redis::cmd("GET")
        .arg(&key)
        .query(&mut lab.conn)
        .expect("GET");
    for i in 0..10 {
        let d = lab.ours(&key, &p, 2, Some(T0 + i));
        assert!(!d.allowed && d.remaining == 1, "{d:?}");
    }
    let after: Vec<u8> = redis::cmd("GET")
        .arg(&key)
        .query(&mut lab.conn)
        .expect("GET");
    assert_eq!(stored, after, "a denial wrote the state");
    assert!(lab.ours(&key, &p, 1, Some(T0 + 10)).allowed);
}

#[test]
fn gcra_state_expires_when_the_tat_has_passed() {
    let mut lab = Lab::new();
    // One unit of a burst of 5 at 1 per 2 s: the TAT is 2 s ahead, and so is the expiry.
    let p = params(1, 2_000, 5);
    let key = lab.key();
    let start = T0 - T0 % 10_000_000;
    assert!(lab.ours(&key, &p, 1, Some(start)).allowed);
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query(&mut lab.conn)
        .expect("PTTL");
    assert!(ttl > 0 && ttl <= 2_000, "TTL {ttl} ms");
    // A denial leaves the expiry alone.
    assert!(lab.ours(&key, &p, 5, Some(start)).retry_after_us > 0);
    let again: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query(&mut lab.conn)
        .expect("PTTL");
    assert!(again > 0 && again <= ttl, "TTL {again} ms after a denial");
}

#[test]
fn a_changed_rate_keeps_the_units_in_use_in_the_script_too() {
    let mut lab = Lab::new();
    let key = lab.key();
    assert!(lab.ours(&key, &params(1, 1_000, 2), 2, Some(T0)).allowed);
    assert!(!lab.ours(&key, &params(1, 1_000, 3), 2, Some(T0)).allowed);
    // Twice the rate: the 2 units in use still are, draining at the old interval until a take
    // rewrites them.
    let d = lab.ours(&key, &params(2, 1_000, 2), 2, Some(T0));
    assert!(!d.allowed);
    assert_eq!(d.retry_after_us, 2_000_000);
    let d = lab.ours(&key, &params(2, 1_000, 2), 1, Some(T0 + 1_000_000));
    assert!(
        d.allowed && d.remaining == 0 && d.reset_after_us == 1_000_000,
        "{d:?}"
    );
}
