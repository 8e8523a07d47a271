//! The Lua scripts on a real Redis, driven with explicit times.
//!
//! Two kinds of test. Property tests run random request sequences through each script and
//! through its pure Rust function and require identical decisions; scripts composed for several
//! limits are held to `limiter::decide_all` the same way. Flaw tests each check one
//! known flaw of the classic scripts (kept in `tests/api/classic/`), and run twice: our script
//! must pass, and the classic one must fail, which proves the check can catch the flaw.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use ratelimiter::limiter::{
    decide_all, decide_joint, decide_op, fixed_window, sliding_window_log, Decision, Mark, Op,
    State, Verdict,
};
use ratelimiter::policy::{Algorithm, FailMode, Limit, LimitKey, Params, Policy, PolicyName};
use ratelimiter::store::connection::ConnectionMode;
use ratelimiter::store::key::{hash_tag, state_key};
use ratelimiter::store::{scripts, ErrorClass, MemoryStore, Plan, RedisStore, Store, StoreError};

use crate::helpers::{ask, TestRedis};

/// A plausible current time in µs: large enough that float truncation would show.
const T0: u64 = 1_764_460_800_123_457;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Impl {
    /// Our script, called through the Redis store as the service calls it.
    Ours,
    /// Our script with its TTL removed after each call, for long simulated sequences.
    OursPersisted,
    Classic,
}

fn classic_source(a: Algorithm) -> &'static str {
    match a {
        Algorithm::FixedWindow => include_str!("classic/fixed_window.lua"),
        Algorithm::SlidingWindowLog => include_str!("classic/sliding_window_log.lua"),
        Algorithm::SlidingWindowCounter => include_str!("classic/sliding_window_counter.lua"),
        Algorithm::TokenBucket => include_str!("classic/token_bucket.lua"),
        // redis_rate's GCRA takes other arguments: tests/api/gcra.rs runs it beside ours.
        Algorithm::Gcra => unreachable!("no classic script in our argument order for gcra"),
    }
}

/// One limit as a test writes it: the algorithm and its fields' values in the algorithm's order
/// (`window_ms` and the like in ms, as a user gives them).
pub(crate) type Spec = (Algorithm, Vec<u64>);

/// A private Redis, our store on it, and a plain connection for the classic scripts.
struct Lab {
    rt: tokio::runtime::Runtime,
    redis: TestRedis,
    store: RedisStore,
    conn: redis::Connection,
    subjects: u64,
}

impl Lab {
    fn new() -> Self {
        let redis = TestRedis::start();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        // The pool starts its housekeeping task on the current runtime.
        let _inside = rt.enter();
        let store = RedisStore::open(
            &redis.url(),
            ConnectionMode::Multiplexed,
            2,
            std::time::Duration::from_secs(5),
            "rl",
        )
        .expect("store");
        let conn = redis.conn();
        Self {
            rt,
            redis,
            store,
            conn,
            subjects: 0,
        }
    }

    /// A fresh subject under a fresh one-limit policy.
    fn subject(&mut self, imp: Impl, (algorithm, values): Spec) -> Subject<'_> {
        self.subjects += 1;
        let name = PolicyName::parse(&format!("p{}", self.subjects)).expect("valid name");
        let policy = Policy::single(name, algorithm, &values, None, FailMode::Closed);
        let key = LimitKey::parse("subject".into()).expect("valid key");
        let mut redis_key = String::new();
        state_key(
            &mut redis_key,
            "rl",
            policy.name.as_str(),
            key.as_str(),
            None,
            algorithm,
        );
        Subject {
            lab: self,
            imp,
            policy,
            key,
            redis_key,
        }
    }
}

struct Subject<'a> {
    lab: &'a mut Lab,
    imp: Impl,
    policy: Policy,
    key: LimitKey,
    redis_key: String,
}

impl Subject<'_> {
    /// One acquire at `now` (`None`: the script's own clock).
    fn at(&mut self, now: Option<u64>, cost: u64) -> Result<Decision, String> {
        let params = self.policy.params()[0];
        self.at_with(params, now, cost)
    }

    /// One acquire at `now` decided with `params` (a calendar limit's, whose boundaries change
    /// with the time) rather than the policy's own.
    fn at_with(&mut self, params: Params, now: Option<u64>, cost: u64) -> Result<Decision, String> {
        match self.imp {
            Impl::Ours => self
                .lab
                .rt
                .block_on(self.lab.store.decide(&Plan {
                    params: std::slice::from_ref(&params),
                    ..Plan::acquire(&self.policy, &self.key, cost).at(now)
                }))
                .map(|v| v.decision())
                .map_err(|e| e.to_string()),
            Impl::Classic => {
                // The classic scripts keep their own layout: [params..., cost, now] and a reply
                // of {allowed, remaining, reset_after_us, retry_after_us}.
                let mut args: Vec<u64> = params.script_args().as_slice().to_vec();
                args.push(cost);
                args.extend(now);
                let (allowed, remaining, reset_after_us, retry_after_us): (u8, u64, u64, u64) =
                    redis::Script::new(classic_source(params.algorithm()))
                        .key(&self.redis_key)
                        .arg(&args)
                        .invoke(&mut self.lab.conn)
                        .map_err(|e| e.to_string())?;
                Ok(Decision {
                    allowed: allowed == 1,
                    remaining,
                    reset_after_us,
                    retry_after_us,
                })
            }
            Impl::OursPersisted => {
                // The decision and PERSIST in one transaction: no real time passes in between
                // for a short TTL to expire what simulated time still needs.
                let mut pipe = redis::pipe();
                pipe.atomic()
                    .cmd("EVAL")
                    .arg(scripts::compose(&[params.algorithm()], Op::Acquire))
                    .arg(1)
                    .arg(&self.redis_key)
                    .arg(cost);
                match now {
                    Some(now) => pipe.arg(now),
                    None => pipe.arg(""),
                };
                pipe.arg(params.script_args().as_slice())
                    .cmd("PERSIST")
                    .arg(&self.redis_key)
                    .ignore();
                let ((allowed, _admits, remaining, reset_after_us, retry_after_us, _now, _count),): (
                    (u8, u8, u64, u64, u64, u64, u64),
                ) = pipe.query(&mut self.lab.conn).map_err(|e| e.to_string())?;
                Ok(Decision {
                    allowed: allowed == 1,
                    remaining,
                    reset_after_us,
                    retry_after_us,
                })
            }
        }
    }

    fn allowed(&mut self, now: u64, cost: u64) -> Result<bool, String> {
        self.at(Some(now), cost).map(|d| d.allowed)
    }

    /// The state key's remaining time to live in ms (-2: no key, -1: no expiry).
    fn pttl(&mut self) -> i64 {
        redis::cmd("PTTL")
            .arg(&self.redis_key)
            .query(&mut self.lab.conn)
            .expect("PTTL")
    }
}

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// `limit` units per `window_ms`, in each algorithm's own fields.
fn window(limit: u64, window_ms: u64, a: Algorithm) -> Spec {
    let values = match a {
        Algorithm::FixedWindow | Algorithm::SlidingWindowLog | Algorithm::SlidingWindowCounter => {
            vec![limit, window_ms]
        }
        // capacity, refill_tokens, refill_period_ms
        Algorithm::TokenBucket => vec![limit, limit, window_ms],
        // rate, period_ms, burst
        Algorithm::Gcra => vec![limit, window_ms, limit],
    };
    (a, values)
}

/// A token bucket of `capacity`, refilled by `refill_tokens` per `refill_period_ms`.
fn bucket(capacity: u64, refill_tokens: u64, refill_period_ms: u64) -> Spec {
    (
        Algorithm::TokenBucket,
        vec![capacity, refill_tokens, refill_period_ms],
    )
}

/// The algorithms that have a classic script in `classic/` taking our arguments.
const WITH_CLASSIC: [Algorithm; 4] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowLog,
    Algorithm::SlidingWindowCounter,
    Algorithm::TokenBucket,
];

/// Runs `check` on our script (must pass) and on the classic one (must fail).
fn ours_pass_and_classic_fails(check: fn(&mut Lab, Impl) -> Result<(), String>) {
    let mut lab = Lab::new();
    if let Err(e) = check(&mut lab, Impl::Ours) {
        panic!("our script fails the check: {e}");
    }
    assert!(
        check(&mut lab, Impl::Classic).is_err(),
        "the classic script has this flaw, so the check must catch it"
    );
}

// --- Flaw: time from the caller instead of Redis ------------------------------------------------

fn check_time_comes_from_redis(lab: &mut Lab, imp: Impl) -> Result<(), String> {
    let limit = bucket(2, 1, 60_000);
    let redis_now = |lab: &mut Lab| -> u64 {
        let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut lab.conn).expect("TIME");
        s * 1_000_000 + us
    };
    let before = redis_now(lab);
    let mut s = lab.subject(imp, limit);
    // No time given: the script reads Redis's clock.
    let d = s.at(None, 2)?;
    ensure!(d.allowed && d.remaining == 0, "{d:?}");
    // One refill period later by Redis's clock, exactly one token is back.
    let later = before + 60_000_000 + 5_000_000;
    ensure!(s.allowed(later, 1)?, "a token refilled by Redis's clock");
    ensure!(!s.allowed(later, 1)?, "only one");
    Ok(())
}

#[test]
fn scripts_take_time_from_redis_when_none_is_given() {
    ours_pass_and_classic_fails(check_time_comes_from_redis);
}

// --- Flaw: requests in the same microsecond collapse into one log entry -------------------------

fn check_same_microsecond(lab: &mut Lab, imp: Impl) -> Result<(), String> {
    let mut s = lab.subject(imp, window(3, 1_000, Algorithm::SlidingWindowLog));
    for i in 0..3 {
        ensure!(s.allowed(T0, 1)?, "request {i} at the same µs");
    }
    ensure!(
        !s.allowed(T0, 1)?,
        "the fourth request in the same µs must be denied"
    );
    ensure!(
        s.allowed(T0 + 1_000_000, 3)?,
        "all three leave the window together"
    );
    Ok(())
}

#[test]
fn sliding_window_log_counts_every_request_in_the_same_microsecond() {
    ours_pass_and_classic_fails(check_same_microsecond);
}

// --- Flaw: a clock stepping back refunds or removes quota ---------------------------------------

fn check_step_back_token_bucket(lab: &mut Lab, imp: Impl) -> Result<(), String> {
    let mut s = lab.subject(imp, bucket(10, 1, 1_000));
    ensure!(s.allowed(T0, 5)?, "half the bucket");
    // The clock steps back 5 s: the 5 tokens left must stay.
    let d = s.at(Some(T0 - 5_000_000), 1)?;
    ensure!(d.allowed && d.remaining == 4, "after stepping back: {d:?}");
    let d = s.at(Some(T0 + 1_000_000), 5)?;
    ensure!(d.allowed && d.remaining == 0, "4 left + 1 refilled: {d:?}");
    Ok(())
}

fn check_step_back_windows(lab: &mut Lab, imp: Impl) -> Result<(), String> {
    for a in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
        let mut s = lab.subject(imp, window(3, 1_000, a));
        let start = T0 - T0 % 1_000_000 + 500_000;
        ensure!(s.allowed(start, 3)?, "{a:?}: fill the window");
        // Back into the previous window: it must not open again.
        ensure!(
            !s.allowed(start - 1_000_000, 1)?,
            "{a:?}: the previous window came back"
        );
    }
    Ok(())
}

#[test]
fn a_clock_stepping_back_never_adds_tokens_or_reopens_windows() {
    ours_pass_and_classic_fails(check_step_back_token_bucket);
    ours_pass_and_classic_fails(check_step_back_windows);
}

fn check_step_back_log(lab: &mut Lab, imp: Impl) -> Result<(), String> {
    let mut s = lab.subject(imp, window(2, 1_000, Algorithm::SlidingWindowLog));
    ensure!(s.allowed(T0, 2)?, "fill");
    ensure!(!s.allowed(T0 - 10_000_000, 1)?, "stepped back 10 s");
    ensure!(!s.allowed(T0 + 999_999, 1)?, "still in the window");
    ensure!(s.allowed(T0 + 1_000_000, 2)?, "left the window");
    Ok(())
}

#[test]
fn sliding_window_log_ignores_a_clock_stepping_back() {
    let mut lab = Lab::new();
    assert_eq!(check_step_back_log(&mut lab, Impl::Ours), Ok(()));
}

// --- Flaw: token arithmetic drifts -------------------------------------------------------------

fn check_no_drift(lab: &mut Lab, imp: Impl) -> Result<(), String> {
    // One token per 10 s, looked at every second for 10,000 s: exactly 1000 tokens arrive
    // (adding 0.1 ten times in floating point gives less than 1). Seconds rather than
    // milliseconds keep the key's real-time TTL far longer than the test runs.
    let mut s = lab.subject(imp, bucket(1, 1, 10_000));
    ensure!(s.allowed(T0, 1)?, "the first token");
    let mut granted = 0;
    for second in 1..=10_000u64 {
        granted += u64::from(s.allowed(T0 + second * 1_000_000, 1)?);
    }
    ensure!(granted == 1_000, "{granted} tokens granted instead of 1000");
    Ok(())
}

#[test]
fn token_bucket_refill_does_not_drift() {
    ours_pass_and_classic_fails(check_no_drift);
}

// --- Flaw: fractional waits truncated in the reply ---------------------------------------------

fn check_retry_after_is_exact(lab: &mut Lab, imp: Impl) -> Result<(), String> {
    let limits = [
        window(3, 1_000, Algorithm::FixedWindow),
        window(3, 1_000, Algorithm::SlidingWindowLog),
        window(3, 1_000, Algorithm::SlidingWindowCounter),
        bucket(3, 7, 1_000),
    ];
    for limit in limits {
        let a = limit.0;
        let mut s = lab.subject(imp, limit);
        ensure!(s.allowed(T0, 2)?, "{a:?}");
        ensure!(s.allowed(T0 + 333, 1)?, "{a:?}");
        let d = s.at(Some(T0 + 777), 2)?;
        ensure!(!d.allowed && d.retry_after_us > 0, "{a:?}: {d:?}");
        let at = T0 + 777 + d.retry_after_us;
        // Denied one µs before the announced time, allowed at it.
        ensure!(
            !s.allowed(at - 1, 2)?,
            "{a:?}: allowed before retry_after ({d:?})"
        );
        ensure!(
            s.allowed(at, 2)?,
            "{a:?}: still denied at retry_after ({d:?})"
        );
    }
    Ok(())
}

#[test]
fn retry_after_is_exact_to_the_microsecond() {
    ours_pass_and_classic_fails(check_retry_after_is_exact);
}

// --- Flaw: a denied request consumes quota -----------------------------------------------------

fn check_denied_does_not_consume(lab: &mut Lab, imp: Impl) -> Result<(), String> {
    for a in WITH_CLASSIC {
        let mut s = lab.subject(imp, window(5, 60_000, a));
        ensure!(s.allowed(T0, 4)?, "{a:?}");
        for i in 0..10 {
            let d = s.at(Some(T0 + i), 2)?;
            ensure!(!d.allowed && d.remaining == 1, "{a:?}: {d:?}");
        }
        ensure!(
            s.allowed(T0 + 10, 1)?,
            "{a:?}: the last unit was taken by denials"
        );
    }
    Ok(())
}

#[test]
fn denied_requests_never_consume_quota() {
    ours_pass_and_classic_fails(check_denied_does_not_consume);
}

// --- Flaw: state kept longer than needed (or forever) -------------------------------------------

fn check_ttls(lab: &mut Lab, imp: Impl) -> Result<(), String> {
    // (limit, longest TTL needed in ms after one allowed acquire at a window's start)
    let cases = [
        (window(5, 10_000, Algorithm::FixedWindow), 10_000),
        (window(5, 10_000, Algorithm::SlidingWindowLog), 10_000),
        (window(5, 10_000, Algorithm::SlidingWindowCounter), 20_000),
        (bucket(5, 1, 2_000), 2_000),
    ];
    for (limit, longest) in cases {
        let a = limit.0;
        let mut s = lab.subject(imp, limit);
        let start = T0 - T0 % 10_000_000;
        ensure!(s.allowed(start, 1)?, "{a:?}");
        let ttl = s.pttl();
        ensure!(
            ttl > 0 && ttl <= longest,
            "{a:?}: TTL {ttl} ms, needed at most {longest}"
        );
    }
    Ok(())
}

#[test]
fn state_expires_as_soon_as_it_no_longer_matters() {
    ours_pass_and_classic_fails(check_ttls);
}

// --- Keys: escaping and hash tags ---------------------------------------------------------------

#[test]
fn state_keys_keep_every_subject_on_its_own_hash_tag() {
    let mut lab = Lab::new();
    let keys = ["plain", "a}b", "{x}", "a:b", "%41", "\u{1}\n"];
    let (a, values) = window(1, 60_000, Algorithm::FixedWindow);
    for k in keys {
        let policy = Policy::single(
            PolicyName::parse("esc").expect("name"),
            a,
            &values,
            None,
            FailMode::Open,
        );
        let key = LimitKey::parse(k.into()).expect("key");
        let d = lab
            .rt
            .block_on(
                lab.store
                    .decide(&Plan::acquire(&policy, &key, 1).at(Some(T0))),
            )
            .expect("acquire");
        assert!(d.allowed, "{k:?} met another key's state");
    }
    let mut stored: Vec<String> = redis::cmd("KEYS")
        .arg("rl:{esc:*")
        .query(&mut lab.conn)
        .expect("KEYS");
    stored.sort();
    assert_eq!(stored.len(), keys.len());
    for k in &stored {
        let tag = hash_tag(k);
        assert!(tag.starts_with("esc:"), "{k}: tag {tag}");
        assert_eq!(
            k.len(),
            "rl:{".len() + tag.len() + "}:fixed_window".len(),
            "{k}"
        );
        assert!(!tag[4..].contains(['{', '}', ':']), "{k}");
    }
    drop(lab.redis);
}

// --- Property: each script decides exactly as its Rust function ---------------------------------

/// One step of a random sequence: move the clock (sometimes back) and ask for `cost` units.
#[derive(Debug, Clone)]
struct Step {
    dt_us: i64,
    cost_pick: u64,
}

/// One random limit of any algorithm, its fields at and between their bounds (shared with
/// `settle.rs`).
pub(crate) fn limits() -> impl Strategy<Value = Spec> {
    let units = prop_oneof![1u64..=12, Just(1_000_000_000u64), 1u64..=1_000_000_000];
    let windows = prop_oneof![
        1u64..=20,
        Just(1_000u64),
        Just(2_678_400_000u64),
        1u64..=2_678_400_000
    ];
    let log_units = prop_oneof![1u64..=12, Just(10_000u64)];
    prop_oneof![
        (units.clone(), windows.clone())
            .prop_map(|(limit, window_ms)| (Algorithm::FixedWindow, vec![limit, window_ms])),
        (log_units, windows.clone())
            .prop_map(|(limit, window_ms)| (Algorithm::SlidingWindowLog, vec![limit, window_ms])),
        (units.clone(), windows.clone()).prop_map(|(limit, window_ms)| (
            Algorithm::SlidingWindowCounter,
            vec![limit, window_ms]
        )),
        (units.clone(), units.clone(), windows.clone()).prop_map(
            |(capacity, refill_tokens, refill_period_ms)| (
                Algorithm::TokenBucket,
                vec![capacity, refill_tokens, refill_period_ms]
            )
        ),
        (units.clone(), windows, units)
            .prop_map(|(rate, period_ms, burst)| (Algorithm::Gcra, vec![rate, period_ms, burst])),
    ]
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = (
        prop_oneof![
            3 => 0i64..2_000,
            3 => 0i64..50_000,
            2 => 0i64..5_000_000,
            1 => -3_000_000i64..0,
            1 => 0i64..100_000_000_000,
        ],
        any::<u64>(),
    )
        .prop_map(|(dt_us, cost_pick)| Step { dt_us, cost_pick });
    proptest::collection::vec(step, 1..40)
}

/// The pure function's answer, threading its state like a store that never expires anything.
struct Model(Option<State>);

impl Model {
    fn decide(&mut self, params: &Params, cost: u64, now: u64) -> Decision {
        let o = params.decide(self.0.take(), cost, now, true);
        self.0 = o.state;
        o.decision
    }
}

// --- Calendar limits: boundaries drawn around each decision's time -----------------------------

const HOUR_US: u64 = 3_600_000_000;
const DAY_US: u64 = 24 * HOUR_US;

/// A calendar as the property tests draw one: periods that tile time, `lengths_us` over and
/// over from `origin_us` (uneven, as days across DST changes, months and years are), and per
/// step the store's clock against the instance's, in thousandths of the period at the store's
/// time (`skews[step % len]`; positive: the store is ahead). Each decision gets the bounds the
/// instance computes at its own time, as `Limit::params_at` does: the period that holds it and
/// the end of the next one.
#[derive(Debug, Clone)]
struct Cal {
    limit: u64,
    origin_us: u64,
    lengths_us: Vec<u64>,
    skews: Vec<i64>,
}

impl Cal {
    /// The period that holds `t`, `(start, end)`, and the end of the next.
    fn around(&self, t: u64) -> (u64, u64, u64) {
        let n = self.lengths_us.len();
        let cycle: i128 = self.lengths_us.iter().map(|&l| i128::from(l)).sum();
        let rel = i128::from(t) - i128::from(self.origin_us);
        let mut start = i128::from(self.origin_us) + rel.div_euclid(cycle) * cycle;
        let mut i = 0;
        while start + i128::from(self.lengths_us[i % n]) <= i128::from(t) {
            start += i128::from(self.lengths_us[i % n]);
            i += 1;
        }
        let end = start + i128::from(self.lengths_us[i % n]);
        let next_end = end + i128::from(self.lengths_us[(i + 1) % n]);
        let us = |x: i128| u64::try_from(x).expect("a time after the epoch");
        (us(start), us(end), us(next_end))
    }

    /// The parameters the instance decides step `step` with, the store's time being `now`.
    fn params(&self, step: usize, now: u64) -> Params {
        let (start, end, _) = self.around(now);
        let permille = self.skews[step % self.skews.len()];
        let skew = i128::from(end - start) * i128::from(permille) / 1_000;
        let instance = u64::try_from((i128::from(now) - skew).max(0)).expect("in range");
        let (start, end, next_end) = self.around(instance);
        Params::FixedWindow(fixed_window::Params {
            limit: self.limit,
            window_us: end - start,
            calendar: Some(fixed_window::Bounds {
                start_us: start,
                end_us: end,
                next_end_us: next_end,
            }),
        })
    }

    /// A fixed window of the same limit, for the policy that names the limit's state key (the
    /// key of a calendar limit is a fixed window's).
    fn spec(&self) -> Spec {
        (Algorithm::FixedWindow, vec![self.limit, 1_000])
    }
}

/// Calendars of uneven periods: days of 23, 24 and 25 hours, months of 28 to 31 days, quarters
/// and years, and periods of a few ms (or µs) so that the steps cross boundaries often.
fn calendars() -> impl Strategy<Value = Cal> {
    let units = prop_oneof![1u64..=12, Just(1_000_000_000u64), 1u64..=1_000_000_000];
    let select =
        |v: Vec<u64>, most: usize| proptest::collection::vec(prop::sample::select(v), 1..=most);
    let lengths = prop_oneof![
        2 => select(vec![23 * HOUR_US, 24 * HOUR_US, 24 * HOUR_US, 25 * HOUR_US], 6),
        1 => select((28..=31).map(|d| d * DAY_US).collect(), 6),
        1 => select([90, 91, 92, 365, 366].map(|d| d * DAY_US).to_vec(), 3),
        3 => proptest::collection::vec(1_000u64..=20_000, 1..=6),
        2 => proptest::collection::vec(1u64..=3_000, 1..=6),
    ];
    let skew = prop_oneof![
        4 => Just(0i64),
        3 => -50i64..=50,
        2 => -1_200i64..=1_200,
        1 => -3_000i64..=3_000,
    ];
    (
        units,
        0..=2 * DAY_US,
        lengths,
        proptest::collection::vec(skew, 1..=8),
    )
        .prop_map(|(limit, phase, lengths_us, skews)| Cal {
            limit,
            origin_us: T0 - phase,
            lengths_us,
            skews,
        })
}

/// One limit of a property test: as [`limits`] draws it, or a calendar limit.
#[derive(Debug, Clone)]
enum Drawn {
    Fields(Spec),
    Calendar(Cal),
}

impl Drawn {
    /// The limit as a policy holds it (a calendar limit as a fixed window: see [`Cal::spec`]).
    fn spec(&self) -> Spec {
        match self {
            Drawn::Fields(spec) => spec.clone(),
            Drawn::Calendar(c) => c.spec(),
        }
    }

    /// The parameters of step `step` at `now`: `own`, the policy's, or the calendar's bounds.
    fn params(&self, own: Params, step: usize, now: u64) -> Params {
        match self {
            Drawn::Fields(_) => own,
            Drawn::Calendar(c) => c.params(step, now),
        }
    }
}

/// A limit of any algorithm ([`limits`]) or a calendar limit.
fn drawn_limits() -> impl Strategy<Value = Drawn> {
    prop_oneof![
        2 => limits().prop_map(Drawn::Fields),
        1 => calendars().prop_map(Drawn::Calendar),
    ]
}

/// What the calendar limits of a property test went through, counted so that the test fails
/// when its cases stop covering it: decisions at a store time before the instance's period, in
/// it, past its end and past the next period's end; counts of an ended period left behind
/// (a boundary crossed with something counted); denials; states decided under the other kind
/// of window (epoch or calendar) while still counting; and calendar states still counting
/// under bounds that put the store's time in another period (another zone or unit, or a store
/// clock more than a period behind).
#[derive(Debug, Default, Clone, Copy)]
struct Crossings {
    before: u64,
    within: u64,
    after: u64,
    beyond: u64,
    crossed: u64,
    denied: u64,
    other_kind: u64,
    moved: u64,
}

impl Crossings {
    /// Notes a decision with `p` at `now` on `state` (before the decision). Any limit but a
    /// calendar one is left out, except for a calendar state decided as an epoch window.
    fn note(&mut self, p: &Params, state: Option<&State>, now: u64) {
        let Params::FixedWindow(fw) = p else { return };
        let live = match state {
            Some(State::FixedWindow(s)) if s.count > 0 => Some(s),
            _ => None,
        };
        let Some(b) = fw.calendar else {
            if live.is_some_and(|s| s.window_us == 0 && now < s.window) {
                self.other_kind += 1;
            }
            return;
        };
        if now < b.start_us {
            self.before += 1;
        } else if now < b.end_us {
            self.within += 1;
        } else if now < b.next_end_us {
            self.after += 1;
        } else {
            self.beyond += 1;
        }
        match live {
            Some(s) if s.window_us == 0 && s.window <= now => self.crossed += 1,
            Some(s) if s.window_us == 0 && s.window != b.end_at(now) => self.moved += 1,
            Some(s) if s.window_us > 0 && s.window >= now / s.window_us => self.other_kind += 1,
            _ => {}
        }
    }

    /// Notes the decision of a calendar limit.
    fn decided(&mut self, p: &Params, d: &Decision) {
        if matches!(p, Params::FixedWindow(fw) if fw.calendar.is_some()) && !d.allowed {
            self.denied += 1;
        }
    }

    /// Fails unless every branch was taken at least `least` times (a quarter of that for the
    /// rarest, a store a whole period ahead), and a boundary crossed with a count as often.
    fn covered(&self, least: u64, what: &str) {
        eprintln!("{what}: calendar cases {self:?}");
        assert!(
            self.before >= least
                && self.within >= least
                && self.after >= least
                && self.beyond >= least / 4
                && self.crossed >= least
                && self.denied >= least,
            "{what}: calendar cases too few: {self:?}"
        );
    }
}

#[test]
fn every_script_decides_exactly_as_its_rust_function() {
    let lab = std::cell::RefCell::new(Lab::new());
    let crossings = std::cell::Cell::new(Crossings::default());
    let mut runner = TestRunner::new(Config {
        cases: 384,
        ..Config::default()
    });
    let result = runner.run(&(drawn_limits(), steps()), |(limit, steps)| {
        let mut model = Model(None);
        let mut lab = lab.borrow_mut();
        let mut s = lab.subject(Impl::OursPersisted, limit.spec());
        let own = s.policy.params()[0];
        let quota = own.quota();
        let mut tally = crossings.get();
        let mut now = T0;
        for (i, step) in steps.iter().enumerate() {
            now = now.saturating_add_signed(step.dt_us);
            let params = limit.params(own, i, now);
            // Mostly small costs, sometimes the whole quota.
            let cost = match step.cost_pick % 8 {
                0 => quota,
                _ => 1 + step.cost_pick % quota.min(5),
            };
            tally.note(&params, model.0.as_ref(), now);
            let expected = model.decide(&params, cost, now);
            tally.decided(&params, &expected);
            crossings.set(tally);
            let got = s
                .at_with(params, Some(now), cost)
                .map_err(TestCaseError::fail)?;
            prop_assert_eq!(
                got,
                expected,
                "step {} at {} cost {} under {:?} of {:?}",
                i,
                now,
                cost,
                params,
                limit
            );
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    crossings.get().covered(100, "one limit");
}

// --- Composed scripts: several limits decided as `decide_all` decides them ----------------------

/// A policy of these limits, named `l1`, `l2`, ..., and the state keys of its subject `subject`
/// as the Redis store names them.
fn composite(lab: &mut Lab, specs: &[Spec]) -> (Policy, Vec<String>) {
    lab.subjects += 1;
    let name = PolicyName::parse(&format!("p{}", lab.subjects)).expect("valid name");
    let limits = specs
        .iter()
        .enumerate()
        .map(|(i, (a, values))| {
            let limit = PolicyName::parse(&format!("l{}", i + 1)).expect("valid name");
            Limit::new(limit, *a, values)
        })
        .collect();
    let policy = Policy::new(name, limits, None, FailMode::Closed).expect("valid limits");
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

/// A verdict as an acquire's script replies (`crate::helpers::script_reply`).
fn as_reply(v: &Verdict) -> Vec<u64> {
    crate::helpers::script_reply(v, Op::Acquire)
}

/// The loaded script `sha` for `params` at `now`, then every key persisted, in one transaction
/// (see [`Impl::OursPersisted`]).
fn composed_persisted(
    conn: &mut redis::Connection,
    sha: &str,
    keys: &[String],
    params: &[Params],
    cost: u64,
    now: u64,
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
    for k in keys {
        pipe.cmd("PERSIST").arg(k).ignore();
    }
    let (reply,): (Vec<u64>,) = pipe.query(conn).map_err(|e| e.to_string())?;
    Ok(reply)
}

fn load(conn: &mut redis::Connection, source: &str) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(source)
        .query(conn)
        .expect("SCRIPT LOAD")
}

#[test]
fn composed_scripts_decide_exactly_as_decide_all() {
    let lab = std::cell::RefCell::new(Lab::new());
    // Denials by some limits while others admit: the case that composing is about.
    let partial_denials = std::cell::Cell::new(0u64);
    let crossings = std::cell::Cell::new(Crossings::default());
    let mut runner = TestRunner::new(Config {
        cases: 384,
        ..Config::default()
    });
    let policies = proptest::collection::vec(drawn_limits(), 2..=4);
    let result = runner.run(&(policies, steps()), |(drawn, steps)| {
        let mut lab = lab.borrow_mut();
        let specs: Vec<Spec> = drawn.iter().map(Drawn::spec).collect();
        let (policy, keys) = composite(&mut lab, &specs);
        let own = policy.params();
        let algorithms: Vec<Algorithm> = own.iter().map(Params::algorithm).collect();
        let sha = load(&mut lab.conn, &scripts::compose(&algorithms, Op::Acquire));
        let quota = own.iter().map(Params::quota).min().unwrap_or(1);
        let mut states: Vec<Option<State>> = own.iter().map(|_| None).collect();
        let mut ttls = vec![None; own.len()];
        let mut tally = crossings.get();
        let mut now = T0;
        for (i, step) in steps.iter().enumerate() {
            now = now.saturating_add_signed(step.dt_us);
            let params: Vec<Params> = drawn
                .iter()
                .zip(own)
                .map(|(d, p)| d.params(*p, i, now))
                .collect();
            // Mostly small costs, sometimes the smallest quota.
            let cost = match step.cost_pick % 8 {
                0 => quota,
                _ => 1 + step.cost_pick % quota.min(5),
            };
            for (p, state) in params.iter().zip(&states) {
                tally.note(p, state.as_ref(), now);
            }
            let expected = decide_all(&params, &mut states, &mut ttls, cost, now);
            if !expected.allowed && expected.limits().iter().any(|d| d.allowed) {
                partial_denials.set(partial_denials.get() + 1);
            }
            for (p, d) in params.iter().zip(expected.limits()) {
                tally.decided(p, d);
            }
            crossings.set(tally);
            let got = composed_persisted(&mut lab.conn, &sha, &keys, &params, cost, now)
                .map_err(TestCaseError::fail)?;
            prop_assert_eq!(
                got,
                as_reply(&expected),
                "step {} at {} cost {} under {:?} of {:?}",
                i,
                now,
                cost,
                params,
                drawn
            );
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(
        partial_denials.get() > 100,
        "only {} denials where some limit admitted",
        partial_denials.get()
    );
    crossings.get().covered(100, "composed");
}

// --- A change of parameters: the same state decided under others, on Redis as in Rust ----------

/// Values of `a`'s fields, at and between their bounds, as [`limits`] draws them.
fn fields_of(a: Algorithm) -> BoxedStrategy<Vec<u64>> {
    let units = prop_oneof![1u64..=12, Just(1_000_000_000u64), 1u64..=1_000_000_000];
    let windows = prop_oneof![
        1u64..=20,
        Just(1_000u64),
        Just(2_678_400_000u64),
        1u64..=2_678_400_000
    ];
    match a {
        Algorithm::FixedWindow | Algorithm::SlidingWindowCounter => {
            (units, windows).prop_map(|(l, w)| vec![l, w]).boxed()
        }
        Algorithm::SlidingWindowLog => (prop_oneof![1u64..=12, Just(10_000u64)], windows)
            .prop_map(|(l, w)| vec![l, w])
            .boxed(),
        Algorithm::TokenBucket | Algorithm::Gcra => {
            let (first, second, third) = if a == Algorithm::TokenBucket {
                (
                    units.clone().boxed(),
                    units.clone().boxed(),
                    windows.boxed(),
                )
            } else {
                (units.clone().boxed(), windows.boxed(), units.boxed())
            };
            (first, second, third)
                .prop_map(|(x, y, z)| vec![x, y, z])
                .boxed()
        }
    }
}

/// One to three limits, each of one algorithm with three sets of its fields to change between;
/// a fixed window's sets may be calendars (an epoch window changed into a calendar one and
/// back, or a calendar of another zone or unit: other boundaries). Fixed windows are drawn
/// twice as often as each other algorithm, for their calendars.
fn changing_limits() -> impl Strategy<Value = Vec<(Algorithm, Vec<Drawn>)>> {
    let mut algorithms = Algorithm::ALL.to_vec();
    algorithms.push(Algorithm::FixedWindow);
    let one = prop::sample::select(algorithms).prop_flat_map(|a| {
        let fields = fields_of(a).prop_map(move |f| Drawn::Fields((a, f)));
        let set = if a == Algorithm::FixedWindow {
            prop_oneof![1 => fields, 1 => calendars().prop_map(Drawn::Calendar)].boxed()
        } else {
            fields.boxed()
        };
        (Just(a), proptest::collection::vec(set, 3))
    });
    proptest::collection::vec(one, 1..=3)
}

/// One step: the set of fields every limit is decided under, the clock's move, the operation,
/// a number its cost is made from, and for a refund whether it carries a take's marks.
#[derive(Debug, Clone)]
struct ChangeStep {
    set: usize,
    dt_us: i64,
    op: Op,
    pick: u64,
    marked: bool,
}

fn change_steps() -> impl Strategy<Value = Vec<ChangeStep>> {
    let op = prop_oneof![
        4 => Just(Op::Acquire),
        2 => Just(Op::Peek),
        2 => Just(Op::Report),
        2 => Just(Op::Refund),
    ];
    let step = (
        prop_oneof![3 => Just(0usize), 2 => 0usize..3],
        prop_oneof![
            3 => 0i64..2_000,
            3 => 0i64..50_000,
            2 => 0i64..5_000_000,
            1 => -3_000_000i64..0,
            1 => 0i64..100_000_000_000,
        ],
        op,
        any::<u64>(),
        any::<bool>(),
    )
        .prop_map(|(set, dt_us, op, pick, marked)| ChangeStep {
            set,
            dt_us,
            op,
            pick,
            marked,
        });
    proptest::collection::vec(step, 1..40)
}

/// `op`'s script for these limits at `now`, with `marks` for a refund (empty: none), then every
/// key persisted, in one transaction; its reply as `lua/common.lua` gives it.
fn op_persisted(
    conn: &mut redis::Connection,
    shas: &mut std::collections::HashMap<(Vec<Algorithm>, Op), String>,
    keys: &[String],
    params: &[Params],
    (op, cost, now): (Op, u64, u64),
    marks: &[Mark],
) -> Result<Vec<u64>, String> {
    let algorithms: Vec<Algorithm> = params.iter().map(Params::algorithm).collect();
    let sha = shas
        .entry((algorithms.clone(), op))
        .or_insert_with(|| load(conn, &scripts::compose(&algorithms, op)))
        .clone();
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
    for k in keys {
        pipe.cmd("PERSIST").arg(k).ignore();
    }
    let (reply,): (Vec<u64>,) = pipe.query(conn).map_err(|e| e.to_string())?;
    Ok(reply)
}

use crate::helpers::script_reply as as_op_reply;

/// Random sequences of every operation over limits whose parameters change between steps (each
/// limit keeps its algorithm): the scripts reply exactly as `decide_op`. When the clock never
/// steps back in a sequence, the Rust side drops each state at its expiry, as the embedded store
/// does, while Redis keeps every key: the replies still agree, so a state past its expiry
/// answers on Redis as no state, under whatever parameters it is decided.
#[test]
fn every_script_decides_as_its_rust_function_while_the_parameters_change() {
    let lab = std::cell::RefCell::new(Lab::new());
    let shas = std::cell::RefCell::new(std::collections::HashMap::new());
    // Steps decided under other fields than the step before, and states dropped at expiry.
    let seen = std::cell::Cell::new((0u64, 0u64));
    let crossings = std::cell::Cell::new(Crossings::default());
    let mut runner = TestRunner::new(Config {
        cases: 512,
        ..Config::default()
    });
    let result = runner.run(&(changing_limits(), change_steps()), |(limits, steps)| {
        let mut lab = lab.borrow_mut();
        let mut shas = shas.borrow_mut();
        let specs: Vec<Spec> = limits.iter().map(|(_, sets)| sets[0].spec()).collect();
        let (_, keys) = composite(&mut lab, &specs);
        // Each set's own parameters (a calendar's are drawn per step).
        let sets: Vec<Vec<Params>> = (0..3)
            .map(|set| {
                limits
                    .iter()
                    .map(|(a, drawn)| a.params(&drawn[set].spec().1))
                    .collect()
            })
            .collect();
        let mut tally = crossings.get();
        let monotone = steps.iter().all(|s| s.dt_us >= 0);
        let mut states: Vec<Option<State>> = keys.iter().map(|_| None).collect();
        let mut expires: Vec<Option<u64>> = keys.iter().map(|_| None).collect();
        let mut tickets: Vec<Vec<Mark>> = Vec::new();
        let mut last_set = 0;
        let mut now = T0;
        for (i, step) in steps.iter().enumerate() {
            now = now.saturating_add_signed(step.dt_us);
            let params: Vec<Params> = limits
                .iter()
                .zip(&sets[step.set])
                .map(|((_, drawn), own)| drawn[step.set].params(*own, i, now))
                .collect();
            let params = &params;
            if step.set != last_set {
                seen.set((seen.get().0 + 1, seen.get().1));
            }
            last_set = step.set;
            if monotone {
                for (state, at) in states.iter_mut().zip(&mut expires) {
                    if at.is_some_and(|at| now >= at) {
                        *state = None;
                        *at = None;
                        seen.set((seen.get().0, seen.get().1 + 1));
                    }
                }
            }
            let quota = params.iter().map(Params::quota).min().unwrap_or(1);
            let op = step.op;
            let cost = match (op, step.pick % 8) {
                (_, 0) => quota,
                (Op::Report | Op::Refund, 1) => (quota * 3).min(1_000_000_000),
                _ => 1 + step.pick % quota.min(5),
            };
            // Any earlier take's, in any order, so that refunds of earlier takes move later
            // ones up.
            let marks = match op {
                Op::Refund if step.marked && !tickets.is_empty() => {
                    tickets[(step.pick >> 20) as usize % tickets.len()].clone()
                }
                _ => Vec::new(),
            };
            let mut ttls = vec![None; params.len()];
            for (p, state) in params.iter().zip(&states) {
                tally.note(p, state.as_ref(), now);
            }
            let expected = decide_op(params, &mut states, &mut ttls, op, cost, now, &marks);
            if matches!(op, Op::Acquire | Op::Peek) {
                for (p, d) in params.iter().zip(expected.limits()) {
                    tally.decided(p, d);
                }
            }
            crossings.set(tally);
            for (at, ttl) in expires.iter_mut().zip(&ttls) {
                if let Some(ttl) = ttl {
                    *at = Some(now + ttl);
                }
            }
            let got = op_persisted(
                &mut lab.conn,
                &mut shas,
                &keys,
                params,
                (op, cost, now),
                &marks,
            )
            .map_err(TestCaseError::fail)?;
            prop_assert_eq!(
                &got,
                &as_op_reply(&expected, op),
                "step {} at {}: {:?} cost {} marks {:?} under {:?} of {:?}",
                i,
                now,
                op,
                cost,
                marks,
                params,
                limits
            );
            if matches!(op, Op::Acquire | Op::Report) && expected.allowed {
                tickets.push(expected.marks().collect());
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let (changes, expiries) = seen.get();
    assert!(
        changes > 1_000 && expiries > 100,
        "{changes} changes of parameters and {expiries} states dropped at expiry"
    );
    let tally = crossings.get();
    tally.covered(100, "changing parameters");
    assert!(
        tally.other_kind >= 100 && tally.moved >= 100,
        "too few counts carried between epoch and calendar windows or across other bounds: \
         {tally:?}"
    );
}

/// Keys in the layouts of the version before: a token bucket of five fields (no capacity) and a
/// log whose members do not say their window. Both still decode, read as written under the
/// capacity or window decided, on Redis as in the Rust model of such a state.
#[test]
fn keys_written_before_the_state_said_its_parameters_still_decode() {
    let mut lab = Lab::new();
    let mut shas = std::collections::HashMap::new();
    let old_bucket = |tokens: f64, updated: u64| -> Vec<u8> {
        [tokens, 0.0, updated as f64, 1.0, 1_000_000.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect()
    };
    for capacity in [10, 20, 3] {
        let (policy, keys) = composite(&mut lab, &[bucket(capacity, 1, 1_000)]);
        let params = policy.params();
        let _: () = redis::cmd("SET")
            .arg(&keys[0])
            .arg(old_bucket(4.0, T0))
            .query(&mut lab.conn)
            .expect("SET");
        let ratelimiter::limiter::Params::TokenBucket(p) = params[0] else {
            unreachable!("a bucket");
        };
        // The Rust model of that key: written under the capacity decided.
        let mut states = vec![Some(State::TokenBucket(
            ratelimiter::limiter::token_bucket::State {
                tokens: 4,
                fraction: 0,
                updated_us: T0,
                refill_tokens: 1,
                refill_period_us: 1_000_000,
                capacity: p.capacity,
                since_us: T0 + 1_500_000,
                refunded: 0,
            },
        ))];
        let now = T0 + 1_500_000;
        for op in [Op::Peek, Op::Acquire, Op::Refund, Op::Report] {
            let mut ttls = vec![None];
            let expected = decide_op(params, &mut states, &mut ttls, op, 1, now, &[]);
            let got = op_persisted(&mut lab.conn, &mut shas, &keys, params, (op, 1, now), &[])
                .expect("script");
            assert_eq!(
                got,
                as_op_reply(&expected, op),
                "{op:?} at capacity {capacity}"
            );
        }
        // 4 tokens (at most `capacity`), 1.5 refilled (none past full), 1 taken, 1 given back, 1
        // reported.
        let d = decide_op(params, &mut states, &mut [None], Op::Peek, 1, now, &[]);
        assert_eq!(d.limits()[0].remaining, 4.min(capacity - 1));
        let raw: Vec<u8> = redis::cmd("GET")
            .arg(&keys[0])
            .query(&mut lab.conn)
            .expect("GET");
        assert_eq!(raw.len(), 64, "rewritten in the new layout");
    }
    for window_ms in [1_000, 500, 5_000] {
        let (policy, keys) = composite(
            &mut lab,
            &[window(5, window_ms, Algorithm::SlidingWindowLog)],
        );
        let params = policy.params();
        let _: () = redis::cmd("ZADD")
            .arg(&keys[0])
            .arg(T0)
            .arg("0000000000000002:2")
            .arg(T0 + 400_000)
            .arg("0000000000000003:1")
            .query(&mut lab.conn)
            .expect("ZADD");
        let mut states = vec![Some(State::SlidingWindowLog(sliding_window_log::State {
            entries: [(T0, 2), (T0 + 400_000, 1)].into_iter().collect(),
            window_us: 0,
        }))];
        for (op, now) in [
            (Op::Peek, T0 + 450_000),
            (Op::Refund, T0 + 450_000),
            (Op::Peek, T0 + 700_000),
            (Op::Acquire, T0 + 1_200_000),
            (Op::Peek, T0 + 1_300_000),
        ] {
            let mut ttls = vec![None];
            let expected = decide_op(params, &mut states, &mut ttls, op, 1, now, &[]);
            let got = op_persisted(&mut lab.conn, &mut shas, &keys, params, (op, 1, now), &[])
                .expect("script");
            assert_eq!(
                got,
                as_op_reply(&expected, op),
                "{op:?} at {now}, {window_ms} ms"
            );
        }
    }
}

// --- A key of another type: every script fails on it, and leaves it as it was ------------------

/// Whether `key` still holds the list the test pushed, and nothing else.
fn holds_the_list(conn: &mut redis::Connection, key: &str) -> bool {
    let kind: String = redis::cmd("TYPE").arg(key).query(conn).expect("TYPE");
    let items: Vec<String> = redis::cmd("LRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query(conn)
        .expect("LRANGE");
    kind == "list" && items == ["x"]
}

fn exists(conn: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query(conn).expect("EXISTS")
}

/// A script of two limits kept in strings reads both with one MGET, which answers nil for a key
/// of another type where the one-limit script's GET fails with WRONGTYPE: each must fail the
/// call (an error the fail mode answers, as `ErrorClass` says), and write nothing anywhere.
#[test]
fn every_script_fails_on_a_key_of_another_type_and_writes_nothing() {
    let mut lab = Lab::new();
    let specs = [
        bucket(10, 1, 1_000),
        window(10, 60_000, Algorithm::FixedWindow),
    ];
    let key = LimitKey::parse("subject".into()).expect("key");
    let wrong_type = |e: StoreError, what: &str| {
        assert!(e.to_string().contains("WRONGTYPE"), "{what}: {e}");
        assert_eq!(e.class(), ErrorClass::Refused, "{what}: {e}");
    };
    // The list in the first limit's key, then in the second's.
    for listed in 0..2 {
        let ops = [
            (Op::Acquire, false),
            (Op::Peek, false),
            (Op::Report, false),
            (Op::Refund, false),
            (Op::Refund, true),
        ];
        for (op, with_marks) in ops {
            let (policy, keys) = composite(&mut lab, &specs);
            let _: i64 = redis::cmd("RPUSH")
                .arg(&keys[listed])
                .arg("x")
                .query(&mut lab.conn)
                .expect("RPUSH");
            let marks = if with_marks {
                vec![Mark::new(T0 + 1_000_000, T0, 0); 2]
            } else {
                Vec::new()
            };
            let what = format!("{op:?} with the list in limit {}", listed + 1);
            let e = lab
                .rt
                .block_on(
                    lab.store.decide(
                        &Plan::new(
                            &policy,
                            &key,
                            ask(op, 1, crate::helpers::claim(&marks, 1).as_ref()),
                        )
                        .at(Some(T0)),
                    ),
                )
                .expect_err(&what);
            wrong_type(e, &what);
            assert!(holds_the_list(&mut lab.conn, &keys[listed]), "{what}");
            assert!(!exists(&mut lab.conn, &keys[1 - listed]), "{what}");
        }
        // A joint acquire: the subject with the list, and another subject beside it.
        let (policy, keys) = composite(&mut lab, &specs);
        let (beside, beside_keys) = composite(&mut lab, &specs[1..]);
        let _: i64 = redis::cmd("RPUSH")
            .arg(&keys[listed])
            .arg("x")
            .query(&mut lab.conn)
            .expect("RPUSH");
        for parts in [[(&policy, 1), (&beside, 1)], [(&beside, 1), (&policy, 1)]] {
            let parts = parts.map(|(policy, cost)| Plan::acquire(policy, &key, cost).at(T0));
            let what = format!("a joint acquire with the list in limit {}", listed + 1);
            let e = lab
                .rt
                .block_on(lab.store.acquire_joint(&parts))
                .expect_err(&what);
            wrong_type(e, &what);
            assert!(holds_the_list(&mut lab.conn, &keys[listed]), "{what}");
            assert!(!exists(&mut lab.conn, &keys[1 - listed]), "{what}");
            assert!(!exists(&mut lab.conn, &beside_keys[0]), "{what}");
        }
    }
    // The one-limit script, for comparison: the same error.
    let (policy, keys) = composite(&mut lab, &specs[..1]);
    let _: i64 = redis::cmd("RPUSH")
        .arg(&keys[0])
        .arg("x")
        .query(&mut lab.conn)
        .expect("RPUSH");
    let e = lab
        .rt
        .block_on(
            lab.store
                .decide(&Plan::acquire(&policy, &key, 1).at(Some(T0))),
        )
        .expect_err("one limit");
    wrong_type(e, "one limit");
    assert!(holds_the_list(&mut lab.conn, &keys[0]));
}

// --- Joint scripts: several subjects, each with its own cost, as `decide_joint` decides them ----

/// A joint acquire's script over `keys` at `now`, limit `i` with `costs[i]`, then every key
/// persisted, in one transaction: its reply as `lua/common.lua` gives it.
fn joint_persisted(
    conn: &mut redis::Connection,
    sha: &str,
    keys: &[String],
    params: &[Params],
    costs: &[u64],
    now: u64,
) -> Result<Vec<u64>, String> {
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("EVALSHA")
        .arg(sha)
        .arg(keys.len())
        .arg(keys)
        .arg(0)
        .arg(now);
    for (p, cost) in params.iter().zip(costs) {
        pipe.arg(*cost).arg(p.script_args().as_slice());
    }
    for k in keys {
        pipe.cmd("PERSIST").arg(k).ignore();
    }
    let (reply,): (Vec<u64>,) = pipe.query(conn).map_err(|e| e.to_string())?;
    Ok(reply)
}

#[test]
fn joint_scripts_decide_exactly_as_decide_joint() {
    let lab = std::cell::RefCell::new(Lab::new());
    // Denials by some subjects while others admit: what all or nothing is about.
    let partial_denials = std::cell::Cell::new(0u64);
    let crossings = std::cell::Cell::new(Crossings::default());
    let mut runner = TestRunner::new(Config {
        cases: 288,
        ..Config::default()
    });
    let subjects = proptest::collection::vec(drawn_limits(), 2..=4);
    let result = runner.run(&(subjects, steps()), |(drawn, steps)| {
        let mut lab = lab.borrow_mut();
        let specs: Vec<Spec> = drawn.iter().map(Drawn::spec).collect();
        // Each limit a subject of its own (its own policy), with its own cost.
        let mut own = Vec::new();
        let mut keys = Vec::new();
        for spec in &specs {
            let (policy, k) = composite(&mut lab, std::slice::from_ref(spec));
            own.extend_from_slice(policy.params());
            keys.extend(k);
        }
        let algorithms: Vec<Algorithm> = own.iter().map(Params::algorithm).collect();
        let sha = load(&mut lab.conn, &scripts::compose_joint(&algorithms));
        let mut states: Vec<Option<State>> = own.iter().map(|_| None).collect();
        let mut ttls = vec![None; own.len()];
        let mut tally = crossings.get();
        let mut now = T0;
        for (i, step) in steps.iter().enumerate() {
            now = now.saturating_add_signed(step.dt_us);
            let params: Vec<Params> = drawn
                .iter()
                .zip(&own)
                .map(|(d, p)| d.params(*p, i, now))
                .collect();
            // Each subject's cost: mostly small, sometimes its whole quota.
            let costs: Vec<u64> = params
                .iter()
                .enumerate()
                .map(|(j, p)| {
                    let pick = step.cost_pick.rotate_left(8 * j as u32);
                    match pick % 8 {
                        0 => p.quota(),
                        _ => 1 + pick % p.quota().min(5),
                    }
                })
                .collect();
            for (p, state) in params.iter().zip(&states) {
                tally.note(p, state.as_ref(), now);
            }
            let (allowed, decisions) = decide_joint(&params, &mut states, &mut ttls, &costs, now);
            if !allowed && decisions.iter().any(|d| d.allowed) {
                partial_denials.set(partial_denials.get() + 1);
            }
            for (p, d) in params.iter().zip(&decisions) {
                tally.decided(p, d);
            }
            crossings.set(tally);
            let mut expected = Verdict::at(now);
            for d in decisions {
                expected.push(d);
            }
            expected.allowed = allowed;
            if allowed {
                for (count, state) in expected.refunded.iter_mut().zip(&states) {
                    *count = state.as_ref().map_or(0, State::refunded);
                }
            }
            let got = joint_persisted(&mut lab.conn, &sha, &keys, &params, &costs, now)
                .map_err(TestCaseError::fail)?;
            prop_assert_eq!(
                got,
                as_reply(&expected),
                "step {} at {} costs {:?} under {:?} of {:?}",
                i,
                now,
                costs,
                params,
                drawn
            );
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(
        partial_denials.get() > 100,
        "only {} denials where some subject admitted",
        partial_denials.get()
    );
    crossings.get().covered(100, "joint");
}

/// The embedded store's joint acquires decide as `decide_joint` does, and so as the joint
/// script (above): subjects of one or two limits of any algorithms, each with its own cost,
/// against the model threading every state without ever expiring one (the embedded store drops
/// states by their expiry, which must change no answer). Forward times only: a clock stepping
/// back would find a dropped state missing that the model still has.
///
/// Calendar limits among them, with bounds drawn per step as [`Cal`] draws them: each plan
/// carries the step's parameters, as the service resolves them.
#[test]
fn joint_acquires_of_the_embedded_store_decide_as_decide_joint() {
    let crossings = std::cell::Cell::new(Crossings::default());
    let mut runner = TestRunner::new(Config {
        cases: 384,
        ..Config::default()
    });
    let subjects =
        proptest::collection::vec(proptest::collection::vec(drawn_limits(), 1..=2), 2..=3);
    let result = runner.run(&(subjects, steps()), |(drawn, steps)| {
        let policies: Vec<Policy> = drawn
            .iter()
            .enumerate()
            .map(|(i, limits)| {
                let name = PolicyName::parse(&format!("p{i}")).expect("valid name");
                let limits = limits
                    .iter()
                    .enumerate()
                    .map(|(j, d)| {
                        let (a, values) = d.spec();
                        let limit = PolicyName::parse(&format!("l{j}")).expect("valid name");
                        Limit::new(limit, a, &values)
                    })
                    .collect();
                Policy::new(name, limits, None, FailMode::Closed).expect("valid limits")
            })
            .collect();
        let own: Vec<Params> = policies.iter().flat_map(|p| p.params().to_vec()).collect();
        let flat: Vec<&Drawn> = drawn.iter().flatten().collect();
        let key = LimitKey::parse("subject".into()).expect("valid key");
        let memory = MemoryStore::new("rl", 1_000_000);
        let mut states: Vec<Option<State>> = own.iter().map(|_| None).collect();
        let mut ttls = vec![None; own.len()];
        let mut tally = crossings.get();
        let mut now = T0;
        for (i, step) in steps.iter().enumerate() {
            now = now.saturating_add(step.dt_us.unsigned_abs());
            let params: Vec<Params> = flat
                .iter()
                .zip(&own)
                .map(|(d, p)| d.params(*p, i, now))
                .collect();
            // Each policy's share of the step's parameters.
            let mut rest = &params[..];
            let shares: Vec<&[Params]> = policies
                .iter()
                .map(|p| {
                    let (mine, others) = rest.split_at(p.params().len());
                    rest = others;
                    mine
                })
                .collect();
            let parts: Vec<Plan<'_>> = policies
                .iter()
                .zip(&shares)
                .enumerate()
                .map(|(j, (policy, share))| {
                    let quota = policy.rate().map_or(1, |r| r.tightest().params.quota());
                    let pick = step.cost_pick.rotate_left(8 * j as u32);
                    let cost = match pick % 8 {
                        0 => quota,
                        _ => 1 + pick % quota.min(5),
                    };
                    Plan {
                        params: share,
                        ..Plan::acquire(policy, &key, cost).at(now)
                    }
                })
                .collect();
            let costs: Vec<u64> = parts
                .iter()
                .flat_map(|p| p.params.iter().map(|_| p.cost()))
                .collect();
            for (p, state) in params.iter().zip(&states) {
                tally.note(p, state.as_ref(), now);
            }
            let (allowed, decisions) = decide_joint(&params, &mut states, &mut ttls, &costs, now);
            for (p, d) in params.iter().zip(&decisions) {
                tally.decided(p, d);
            }
            crossings.set(tally);
            let mut expected = Vec::new();
            let mut decisions = decisions.into_iter();
            for part in &parts {
                let mut v = Verdict::at(now);
                for d in decisions.by_ref().take(part.policy.params().len()) {
                    v.push(d);
                }
                v.allowed = allowed;
                expected.push(v);
            }
            let got = memory
                .acquire_joint_at(&parts, now)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(
                got,
                expected,
                "step {} at {} under {:?} of {:?}",
                i,
                now,
                params,
                drawn
            );
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    crossings.get().covered(100, "embedded joint");
}

/// A key's content and expiry, whatever its type: a string's bytes, a log's members with their
/// scores, and its absolute expiry in ms (`PEXPIRETIME`, which real time does not move).
fn snapshot(conn: &mut redis::Connection, key: &str) -> (Vec<Vec<u8>>, i64) {
    let kind: String = redis::cmd("TYPE").arg(key).query(conn).expect("TYPE");
    let content: Vec<Vec<u8>> = match kind.as_str() {
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

#[test]
fn eight_limits_run_and_a_denial_by_one_leaves_every_state_byte_for_byte() {
    let mut lab = Lab::new();
    // Every algorithm, then three more; the sixth is the tightest.
    let specs: Vec<Spec> = vec![
        window(100, 60_000, Algorithm::FixedWindow),
        window(100, 60_000, Algorithm::SlidingWindowLog),
        window(100, 60_000, Algorithm::SlidingWindowCounter),
        bucket(100, 1, 60_000),
        (Algorithm::Gcra, vec![1, 60_000, 100]),
        window(3, 60_000, Algorithm::FixedWindow),
        bucket(50, 5, 1_000),
        (Algorithm::Gcra, vec![10, 1_000, 50]),
    ];
    let (policy, keys) = composite(&mut lab, &specs);
    let key = LimitKey::parse("subject".into()).expect("valid key");
    let params = policy.params();
    let mut states: Vec<Option<State>> = params.iter().map(|_| None).collect();
    let mut ttls = vec![None; params.len()];

    // Through the store, as the service calls it: all eight take.
    let v = lab
        .rt
        .block_on(
            lab.store
                .decide(&Plan::acquire(&policy, &key, 2).at(Some(T0))),
        )
        .expect("eight limits decided");
    assert_eq!(v, decide_all(params, &mut states, &mut ttls, 2, T0));
    assert!(v.allowed && v.limits().len() == 8, "{v:?}");
    let before: Vec<_> = keys.iter().map(|k| snapshot(&mut lab.conn, k)).collect();
    assert!(before.iter().all(|(_, expires)| *expires > 0), "{before:?}");

    // The sixth has one unit left: it denies, and no limit changes.
    let now = T0 + 1_000;
    let v = lab
        .rt
        .block_on(
            lab.store
                .decide(&Plan::acquire(&policy, &key, 2).at(Some(now))),
        )
        .expect("eight limits decided");
    assert_eq!(v, decide_all(params, &mut states, &mut ttls, 2, now));
    assert!(!v.allowed && v.binding() == 5, "{v:?}");
    for (i, d) in v.limits().iter().enumerate() {
        assert_eq!(d.allowed, i != 5, "limit {}: {d:?}", i + 1);
    }
    let after: Vec<_> = keys.iter().map(|k| snapshot(&mut lab.conn, k)).collect();
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        assert_eq!(b, a, "limit {} ({}) changed on a denial", i + 1, keys[i]);
    }
}

#[test]
fn eight_limits_of_any_one_algorithm_fit_in_one_script() {
    // The parts nest, so their locals add up: eight of the heaviest part is the most any
    // composition holds. Each must compile, run and agree with `decide_all`.
    let mut lab = Lab::new();
    for a in Algorithm::ALL {
        let specs = vec![window(5, 60_000, a); 8];
        let (policy, keys) = composite(&mut lab, &specs);
        let params = policy.params();
        let sha = load(&mut lab.conn, &scripts::compose(&[a; 8], Op::Acquire));
        let mut states: Vec<Option<State>> = params.iter().map(|_| None).collect();
        let mut ttls = vec![None; params.len()];
        for (now, cost) in [(T0, 3), (T0 + 1, 3), (T0 + 2, 2)] {
            let expected = decide_all(params, &mut states, &mut ttls, cost, now);
            let got = composed_persisted(&mut lab.conn, &sha, &keys, params, cost, now)
                .unwrap_or_else(|e| panic!("{a:?}: {e}"));
            assert_eq!(got, as_reply(&expected), "{a:?} at {now} cost {cost}");
        }
    }
}

#[test]
fn a_one_limit_script_is_its_part_as_straight_line_code() {
    for a in Algorithm::ALL {
        let script = scripts::compose(&[a], Op::Acquire);
        let name = a.as_str();
        assert_eq!(script.matches("do -- limit ").count(), 1, "{name}");
        assert_eq!(script.matches("end -- limit ").count(), 1, "{name}");
        assert!(
            script.contains(&format!("do -- limit 1: {name}\n")),
            "{name}"
        );
        // The acquire's sections of the part, verbatim and in order (report and refund, after
        // keep, have scripts of their own).
        let lua = a.lua();
        let (level, rest) = lua.split_once("\n--- take\n").expect("take");
        let (take, rest) = rest.split_once("\n--- keep\n").expect("keep");
        let keep = rest.split_once("\n--- report\n").map_or(rest, |(k, _)| k);
        let mut at = 0;
        for section in [level, take, keep] {
            let found = script[at..]
                .find(section)
                .unwrap_or_else(|| panic!("{name}: a section is missing or out of order"));
            at += found + section.len();
        }
    }
}

// --- Bounds: what one request may cost Redis ---------------------------------------------------

/// Commands the scripts ran since the last `CONFIG RESETSTAT` (Redis counts the commands a
/// script calls in `INFO commandstats`): every command but the calls and loads of scripts and
/// the test's own inspection.
fn script_commands(conn: &mut redis::Connection) -> u64 {
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO");
    stats
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter(|l| {
            !["eval", "script", "config", "info"]
                .iter()
                .any(|own| l.starts_with(own))
        })
        .filter_map(|l| {
            l.split_once("calls=")?
                .1
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

fn reset_stats(conn: &mut redis::Connection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(conn)
        .expect("CONFIG RESETSTAT");
}

/// 31 days, the longest window, in ms.
const MONTH_MS: u64 = 2_678_400_000;

#[test]
fn one_expensive_request_is_one_log_entry_and_a_few_commands() {
    let mut lab = Lab::new();
    let mut s = lab.subject(
        Impl::Ours,
        window(10_000, MONTH_MS, Algorithm::SlidingWindowLog),
    );
    // The script loaded first, so that loading it is not counted.
    assert!(s.allowed(T0, 1).expect("decided"));
    let mut s = lab.subject(
        Impl::Ours,
        window(10_000, MONTH_MS, Algorithm::SlidingWindowLog),
    );
    reset_stats(&mut s.lab.conn);
    let d = s.at(Some(T0), 10_000).expect("decided");
    assert!(d.allowed && d.remaining == 0, "{d:?}");
    let commands = script_commands(&mut s.lab.conn);
    assert!(commands <= 5, "an allowed request ran {commands} commands");

    let members: u64 = redis::cmd("ZCARD")
        .arg(&s.redis_key)
        .query(&mut s.lab.conn)
        .expect("ZCARD");
    assert_eq!(members, 1, "10,000 units in one request are one entry");
    let bytes: u64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(&s.redis_key)
        .query(&mut s.lab.conn)
        .expect("MEMORY USAGE");
    assert!(bytes < 512, "the log takes {bytes} bytes");

    reset_stats(&mut s.lab.conn);
    let d = s.at(Some(T0 + 1), 1).expect("decided");
    assert!(
        !d.allowed && d.retry_after_us == MONTH_MS * 1_000 - 1,
        "{d:?}"
    );
    let commands = script_commands(&mut s.lab.conn);
    assert!(commands <= 5, "a denied request ran {commands} commands");
}

/// A tiny deterministic generator (xorshift), so that the long sequence below needs no seed.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
fn a_long_log_of_mixed_costs_decides_exactly_and_searches_it_in_a_few_commands() {
    let mut lab = Lab::new();
    let limit = window(10_000, 30_000, Algorithm::SlidingWindowLog);
    let s = lab.subject(Impl::Ours, limit);
    let Params::SlidingWindowLog(params) = s.policy.params()[0] else {
        unreachable!("a log")
    };
    let key = s.redis_key.clone();
    let conn = &mut lab.conn;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(scripts::compose(
            &[Algorithm::SlidingWindowLog],
            Op::Acquire,
        ))
        .query(conn)
        .expect("SCRIPT LOAD");

    // 15,000 requests about 2.5 ms apart over 37 s: mostly single units, so that the log grows
    // to thousands of entries, and now and then up to 2,000 units at once.
    let mut x = 0x9E37_79B9_7F4A_7C15;
    let mut now = T0;
    let mut requests = Vec::new();
    for _ in 0..15_000 {
        now += next(&mut x) % 5_000;
        let r = next(&mut x);
        let cost = if r.is_multiple_of(1_000) {
            1 + r / 1_000 % 2_000
        } else {
            1
        };
        requests.push((now, cost));
    }
    let mut pipe = redis::pipe();
    for &(now, cost) in &requests {
        pipe.cmd("EVALSHA")
            .arg(&sha)
            .arg(1)
            .arg(&key)
            .arg(cost)
            .arg(now)
            .arg(params.limit)
            .arg(params.window_us);
    }
    // The log keeps no refund count: its acquire's reply ends with 0.
    let replies: Vec<(u8, u8, u64, u64, u64, u64, u64)> = pipe.query(conn).expect("the sequence");

    let mut state = None;
    let mut longest = 0;
    let (mut allowed, mut denied) = (0, 0);
    for (i, (&(now, cost), reply)) in requests.iter().zip(replies).enumerate() {
        let o = sliding_window_log::acquire(state.take(), &params, cost, now);
        state = o.state;
        longest = longest.max(state.as_ref().map_or(0, |s| s.entries.len()));
        let d = o.decision;
        if d.allowed {
            allowed += 1;
        } else {
            denied += 1;
        }
        let expected = (
            u8::from(d.allowed),
            u8::from(d.allowed),
            d.remaining,
            d.reset_after_us,
            d.retry_after_us,
            now,
            0,
        );
        assert_eq!(reply, expected, "request {i} at {now} cost {cost}");
    }
    assert!(longest > 3_000, "the log grew to {longest} entries only");
    assert!(
        allowed > 1_000 && denied > 1_000,
        "{allowed} allowed, {denied} denied"
    );

    // A denial on a log of thousands: the search for its retry time is a few commands.
    let entries = state.as_ref().map_or(0, |s| s.entries.len());
    assert!(entries > 3_000, "{entries} entries");
    reset_stats(conn);
    let reply: (u8, u8, u64, u64, u64, u64, u64) = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(1)
        .arg(&key)
        .arg(params.limit)
        .arg(now)
        .arg(params.limit)
        .arg(params.window_us)
        .query(conn)
        .expect("a denial");
    let d = sliding_window_log::acquire(state, &params, params.limit, now).decision;
    assert_eq!(
        reply,
        (
            0,
            0,
            d.remaining,
            d.reset_after_us,
            d.retry_after_us,
            now,
            0
        ),
        "the last denial"
    );
    let commands = script_commands(conn);
    // At most 4 (the newest, the oldest, the oldest still in the window, ZCARD), then the
    // search over at most `limit` members (those that left the window are removed by the next
    // take, not by a denial).
    assert!(
        commands <= 4 + 15,
        "a denial on {entries} entries ran {commands} commands"
    );
}

// --- Out of memory: a script runs whole or not at all -------------------------------------------

#[test]
fn every_script_is_refused_whole_while_redis_is_out_of_memory() {
    let mut lab = Lab::new();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(1)
        .query(&mut lab.conn)
        .expect("CONFIG SET");
    for a in Algorithm::ALL {
        let s = lab.subject(Impl::Ours, window(5, 60_000, a));
        let (policy, key, redis_key) = (s.policy.clone(), s.key.clone(), s.redis_key.clone());
        let result = lab.rt.block_on(
            lab.store
                .decide(&Plan::acquire(&policy, &key, 1).at(Some(T0))),
        );
        match result {
            // The cause, as the service's degraded path logs it.
            Err(e @ StoreError::Server(_)) => {
                assert!(e.to_string().contains("OOM"), "{a:?}: {e}")
            }
            other => panic!("{a:?} ran out of memory: {other:?}"),
        }
        let exists: bool = redis::cmd("EXISTS")
            .arg(&redis_key)
            .query(&mut lab.conn)
            .expect("EXISTS");
        assert!(!exists, "{a:?} wrote its state past maxmemory");
    }
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(0)
        .query(&mut lab.conn)
        .expect("CONFIG SET");
}

// --- Redis before 7.0 cannot run flagged scripts: refused at start-up ---------------------------

/// Answers the Redis protocol as a Redis 6.2 would, for the few commands a start-up sends (no
/// Redis 6 can be installed here): `PING`, `INFO`, and an error for anything else.
fn serve_as_redis_6(listener: std::net::TcpListener) {
    use std::io::{BufRead, BufReader, Write};
    for stream in listener.incoming().flatten() {
        std::thread::spawn(move || {
            let mut writer = stream.try_clone().expect("clone");
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            loop {
                line.clear();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                let Some(n) = line.trim().strip_prefix('*') else {
                    continue;
                };
                let mut args = Vec::new();
                for _ in 0..n.parse::<usize>().unwrap_or(0) {
                    line.clear();
                    let _ = reader.read_line(&mut line);
                    line.clear();
                    let _ = reader.read_line(&mut line);
                    args.push(line.trim().to_ascii_uppercase());
                }
                let reply = match args.first().map(String::as_str) {
                    Some("PING") => "+PONG\r\n".to_owned(),
                    Some("INFO") => {
                        let info = "# Server\r\nredis_version:6.2.14\r\nredis_mode:standalone\r\n";
                        format!("${}\r\n{info}\r\n", info.len())
                    }
                    _ => "-ERR unknown command\r\n".to_owned(),
                };
                if writer.write_all(reply.as_bytes()).is_err() {
                    return;
                }
            }
        });
    }
}

#[tokio::test]
async fn the_service_refuses_to_start_on_redis_older_than_7() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || serve_as_redis_6(listener));
    let env = [
        ("RATELIMITER__SERVER__BIND", "127.0.0.1:0".to_owned()),
        (
            "RATELIMITER__REDIS__URL",
            format!("redis://127.0.0.1:{port}"),
        ),
    ]
    .map(|(k, v)| (k.to_owned(), v));
    let settings = ratelimiter::config::Settings::load_from(None, env).expect("settings");
    let error = match ratelimiter::startup::Application::build(settings).await {
        Ok(_) => panic!("started on Redis 6.2"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        error.contains("6.2.14") && error.contains("7.0"),
        "the error names both versions: {error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_starts_on_a_redis_that_hides_info() {
    // A hardened Redis may refuse INFO; its version cannot be read, so it is given the benefit
    // of the doubt (with a warning) rather than refused.
    let redis = std::sync::Arc::new(TestRedis::start_with(&["--rename-command", "INFO", ""]));
    let app = crate::helpers::spawn_app_with(Some(redis), &[]).await;
    app.create_policy(serde_json::json!({"name": "p", "algorithm": "sliding_window_log", "limit": 1, "window_ms": 1_000}))
        .await;
    let d = app.acquire("p", "k", 1).await;
    assert_eq!(d["degraded"], false, "{d}");
}

/// The one case `composed_scripts_decide_exactly_as_decide_all` was seen to fail, once, on a
/// loaded machine (step 3 found step 2's log entries gone): replayed at twenty start times it
/// agrees, as it did 3,000 times under load, so the cause was not in the scripts' arithmetic.
#[test]
fn the_case_seen_failing_once_under_load_decides_exactly_at_any_start() {
    let mut lab = Lab::new();
    let specs: Vec<Spec> = vec![
        (Algorithm::SlidingWindowLog, vec![11, 1]),
        (Algorithm::SlidingWindowCounter, vec![554109884, 2678400000]),
    ];
    let steps = [(382i64, 3u64), (37627880813, 1), (3410, 4), (962, 5)];
    let mut bad = 0;
    for r in 0..20u64 {
        let t0 = T0 + r * 7919 % 1000;
        let (policy, keys) = composite(&mut lab, &specs);
        let params = policy.params();
        let algorithms: Vec<Algorithm> = params.iter().map(Params::algorithm).collect();
        let sha = load(&mut lab.conn, &scripts::compose(&algorithms, Op::Acquire));
        let quota = params.iter().map(Params::quota).min().unwrap_or(1);
        let mut states: Vec<Option<State>> = params.iter().map(|_| None).collect();
        let mut ttls = vec![None; params.len()];
        let mut now = t0;
        for (i, (dt, pick)) in steps.iter().enumerate() {
            now = now.saturating_add_signed(*dt);
            let cost = match pick % 8 {
                0 => quota,
                _ => 1 + pick % quota.min(5),
            };
            let expected = decide_all(params, &mut states, &mut ttls, cost, now);
            let got =
                composed_persisted(&mut lab.conn, &sha, &keys, params, cost, now).expect("call");
            if got != as_reply(&expected) {
                bad += 1;
                eprintln!(
                    "t0+{} step {i}: got {got:?} expected {:?}",
                    t0 - T0,
                    as_reply(&expected)
                );
            }
        }
    }
    assert_eq!(bad, 0, "wrong answers");
}
