//! Redis failing under load: refused, hung, restarted and out of memory. Every request is
//! answered within the deadline plus a margin, by its policy's fail mode; decisions are exact
//! again once Redis is back; the service never needs a restart; an out-of-memory Redis takes no
//! write at all.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use serde_json::{json, Value};

use crate::helpers::{spawn_app_on_cluster, spawn_app_with, TestApp, TestCluster, TestRedis};

/// The Redis deadline used here, and the margin allowed on top of it on a busy 2-core machine.
/// The outages last [`OUTAGE_MS`], well beyond both: a call that waited for Redis instead of
/// its deadline would take up to the whole outage, and so still fail the check, however slow
/// the machine.
const DEADLINE_MS: u64 = 250;
const MARGIN_MS: u64 = 1_250;
const OUTAGE_MS: u64 = 3_000;

/// One answered acquire of the load.
#[derive(Debug)]
struct Sample {
    policy: &'static str,
    status: u16,
    took: Duration,
    body: Value,
}

/// A Redis that keeps its data across restarts, and an app on it with a short deadline and a
/// quick breaker; three policies, one per fail mode.
async fn setup(tag: &str, mode: &str) -> (Arc<TestRedis>, TestApp, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("ratelimiter-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let dir_arg = dir.to_string_lossy().into_owned();
    let redis = Arc::new(TestRedis::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--dir",
        &dir_arg,
    ]));
    let deadline = DEADLINE_MS.to_string();
    let app = spawn_app_with(
        Some(redis.clone()),
        &[
            ("RATELIMITER__REDIS__TIMEOUT_MS", &deadline),
            ("RATELIMITER__REDIS__BREAKER_FAILURES", "3"),
            ("RATELIMITER__REDIS__CONNECTION_MODE", mode),
            ("RATELIMITER__REDIS__BREAKER_COOLDOWN_MS", "300"),
        ],
    )
    .await;
    for (name, mode) in [("open", "open"), ("closed", "closed")] {
        app.create_policy(json!({
            "name": name, "algorithm": "fixed_window", "limit": 5, "window_ms": 3_600_000,
            "fail_mode": mode
        }))
        .await;
    }
    // A bucket of 5 that refills 5 an hour, not a fixed window: a run that crosses the hour would
    // open a fresh window, and `local` could rightly grant 5 more than the test counts on.
    app.create_policy(json!({
        "name": "local", "algorithm": "token_bucket", "capacity": 5, "refill_tokens": 5,
        "refill_period_ms": 3_600_000, "fail_mode": "local"
    }))
    .await;
    app.create_policy(json!({"name": "exact", "algorithm": "sliding_window_log", "limit": 5, "window_ms": 3_600_000}))
        .await;
    (redis, app, dir)
}

/// Six concurrent clients acquiring for `duration`, cycling through the three policies, on one
/// key each (so the limit of 5 is reached early and both answers are seen).
async fn load(app: &TestApp, duration: Duration) -> Vec<Sample> {
    let workers = (0..6).map(|w| {
        let (client, url) = (app.client.clone(), app.url("/v1/acquire"));
        tokio::spawn(async move {
            let mut samples = Vec::new();
            let end = Instant::now() + duration;
            let mut i = w;
            while Instant::now() < end {
                let policy = ["open", "closed", "local"][i % 3];
                i += 1;
                let started = Instant::now();
                let r = client
                    .post(&url)
                    .json(&json!({"policy": policy, "key": "k"}))
                    .send()
                    .await
                    .expect("every request is answered");
                let status = r.status().as_u16();
                let body: Value = r.json().await.expect("a JSON body");
                samples.push(Sample {
                    policy,
                    status,
                    took: started.elapsed(),
                    body,
                });
            }
            samples
        })
    });
    join_all(workers)
        .await
        .into_iter()
        .flat_map(|r| r.expect("worker"))
        .collect()
}

/// Every answer is timely and follows its policy's fail mode; the outage was actually seen.
fn check_answers(samples: &[Sample]) {
    assert!(
        samples.len() > 30,
        "the load ran: {} requests",
        samples.len()
    );
    let limit = Duration::from_millis(DEADLINE_MS + MARGIN_MS);
    for s in samples {
        assert!(
            s.took <= limit,
            "{} answered after {:?}: {}",
            s.policy,
            s.took,
            s.body
        );
        let degraded = s.body["degraded"] == true;
        // Who decided, in every path: Redis, or the policy's own fail mode while it was down.
        if s.status == 200 {
            let by = match (degraded, s.policy) {
                // A denial Redis decided may be repeated by the denial cache (exact).
                (false, _)
                    if s.body["allowed"] == false && s.body["decided_by"] == "local_cache" =>
                {
                    "local_cache"
                }
                (false, _) => "redis",
                (true, "open") => "fail_open",
                (true, "local") => "fail_local",
                (true, other) => panic!("{other} answered degraded: {}", s.body),
            };
            assert_eq!(s.body["decided_by"], by, "{}: {}", s.policy, s.body);
        }
        match s.policy {
            "open" => {
                assert_eq!(s.status, 200, "{}", s.body);
                if degraded {
                    assert_eq!(s.body["allowed"], true, "open allows: {}", s.body);
                }
            }
            "closed" => {
                assert!(
                    s.status == 200 || s.status == 503,
                    "{} {}",
                    s.status,
                    s.body
                );
                if s.status == 503 {
                    // `outcome-unknown` when the call may have been counted (sent to a hung
                    // Redis), `store-unavailable` when it provably was not.
                    let kind = s.body["type"].as_str().unwrap_or_default();
                    assert!(
                        kind == "urn:ratelimiter:problem:store-unavailable"
                            || kind == "urn:ratelimiter:problem:outcome-unknown",
                        "{}",
                        s.body
                    );
                } else {
                    assert_eq!(
                        s.body["degraded"], false,
                        "closed never degrades: {}",
                        s.body
                    );
                }
            }
            "local" => assert_eq!(s.status, 200, "{}", s.body),
            _ => unreachable!(),
        }
    }
    let count = |policy: &str, f: &dyn Fn(&Sample) -> bool| {
        samples
            .iter()
            .filter(|s| s.policy == policy && f(s))
            .count()
    };
    assert!(
        count("open", &|s| s.body["degraded"] == true) > 0,
        "open answered degraded"
    );
    assert!(count("closed", &|s| s.status == 503) > 0, "closed refused");
    let local_granted = count("local", &|s| {
        s.body["degraded"] == true && s.body["allowed"] == true
    });
    assert!(
        count("local", &|s| s.body["degraded"] == true) > 0,
        "local decided in-process"
    );
    assert!(
        local_granted <= 5,
        "local keeps the limit of 5 per instance: granted {local_granted}"
    );
    // The breaker answered most of the outage at once, without waiting for the deadline.
    let fast = samples
        .iter()
        .filter(|s| s.status == 503 && s.took < Duration::from_millis(DEADLINE_MS / 2))
        .count();
    assert!(
        fast > 0,
        "an open circuit answers without waiting for Redis"
    );
}

/// Redis is back: ready within seconds, and exact under concurrency again. (A service that
/// never recovers fails at any bound; these leave a loaded machine room.)
async fn check_recovered(app: &TestApp) {
    let start = Instant::now();
    while app.get("/readyz").await.status() != 200 {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "not ready again after 15 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A connection that died with the old Redis is found dead by its next call (answered by
    // fail mode), then reconnects: bursts until one is decided by Redis throughout.
    let warm = json!({"policy": "closed", "key": "warm"});
    loop {
        let burst = (0..20).map(|_| app.post("/v1/acquire", &warm));
        if join_all(burst).await.iter().all(|r| r.status() == 200) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "connections did not recover"
        );
    }
    let requests = (0..20).map(|_| {
        let (client, url) = (app.client.clone(), app.url("/v1/acquire"));
        tokio::spawn(async move {
            let r = client
                .post(url)
                .json(&json!({"policy": "exact", "key": "after"}))
                .send()
                .await
                .expect("sent");
            let d: Value = r.json().await.expect("JSON");
            (d["allowed"] == true, d["degraded"] == true)
        })
    });
    let answers: Vec<(bool, bool)> = join_all(requests)
        .await
        .into_iter()
        .map(|r| r.expect("task"))
        .collect();
    assert!(
        answers.iter().all(|&(_, degraded)| !degraded),
        "decided by Redis again"
    );
    assert_eq!(
        answers.iter().filter(|&&(allowed, _)| allowed).count(),
        5,
        "exact again"
    );
}

/// Runs the load through `outage` (which starts 300 ms into it) and checks the answers and the
/// recovery, with either connection mode.
async fn through_an_outage<F>(tag: &str, outage: impl Fn(Arc<TestRedis>) -> F)
where
    F: std::future::Future<Output = ()>,
{
    for mode in ["multiplexed", "pool"] {
        through_an_outage_with(&format!("{tag}-{mode}"), mode, &outage).await;
    }
}

async fn through_an_outage_with<F>(tag: &str, mode: &str, outage: &impl Fn(Arc<TestRedis>) -> F)
where
    F: std::future::Future<Output = ()>,
{
    let (redis, app, dir) = setup(tag, mode).await;
    // The load outlasts the outage, which starts 300 ms into it, by a second.
    let stream = load(&app, Duration::from_millis(300 + OUTAGE_MS + 1_000));
    let outage = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        outage(redis.clone()).await;
    };
    let (samples, ()) = tokio::join!(stream, outage);
    check_answers(&samples);
    check_recovered(&app).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_redis_is_answered_by_fail_mode_and_recovered_from() {
    through_an_outage("refused", |redis| async move {
        // Stopped by an operator: connections close, new ones are refused.
        let stopping = redis.clone();
        tokio::task::spawn_blocking(move || stopping.stop())
            .await
            .expect("stop");
        tokio::time::sleep(Duration::from_millis(OUTAGE_MS)).await;
        redis.restart();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_redis_is_answered_by_fail_mode_and_recovered_from() {
    through_an_outage("hung", |redis| async move {
        redis.signal("STOP");
        tokio::time::sleep(Duration::from_millis(OUTAGE_MS)).await;
        redis.signal("CONT");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_redis_is_answered_by_fail_mode_and_recovered_from() {
    through_an_outage("restarted", |redis| async move {
        // A restart that takes a while, as a real one does: down for seconds, then back with its
        // data but no scripts (NOSCRIPT) and every old connection dead.
        redis.kill();
        tokio::time::sleep(Duration::from_millis(OUTAGE_MS)).await;
        redis.restart();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_are_read_from_the_cache_while_redis_is_down_and_writes_are_refused() {
    let (redis, app, dir) = setup("reads", "multiplexed").await;
    let before = app.policies().await;
    redis.kill();
    assert_eq!(app.policies().await, before, "listed from the cache");
    let r = app
        .post("/v1/acquire", &json!({"policy": "open", "key": "h"}))
        .await;
    assert!(
        r.headers().get("ratelimit").is_none(),
        "nothing was counted, so no quota is claimed"
    );
    assert!(r.headers().get("ratelimit-policy").is_some());
    let d: Value = r.json().await.expect("JSON");
    assert_eq!(
        (
            d["allowed"].clone(),
            d["degraded"].clone(),
            d["remaining"].clone()
        ),
        (json!(true), json!(true), json!(4))
    );
    let r = app.get("/v1/policies/open").await;
    assert_eq!(r.status(), 200);
    let r = app
        .put(
            "/v1/policies/open",
            &json!({"algorithm": "fixed_window", "limit": 1, "window_ms": 1}),
        )
        .await;
    assert_eq!(r.status(), 503);
    assert_eq!(app.get("/readyz").await.status(), 503);
    assert_eq!(app.get("/healthz").await.status(), 200);
    redis.restart();
    check_recovered(&app).await;
    let got: Value = app
        .get("/v1/policies/open")
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(got["limit"], 5, "the refused write left nothing behind");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_redis_answers_with_are_answered_by_fail_mode_too() {
    let (redis, app, dir) = setup("errors", "multiplexed").await;
    let mut conn = redis.conn();
    let status = |policy: &'static str, key: &'static str| {
        let app = &app;
        async move {
            let r = app
                .post("/v1/acquire", &json!({"policy": policy, "key": key}))
                .await;
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.expect("JSON"))
        }
    };
    let check = |(status, body): (u16, Value), expected: u16| {
        assert_eq!(status, expected, "{body}");
        if status == 200 {
            assert_eq!(body["degraded"], true, "{body}");
        }
    };

    // A script error: someone wrote another type at a state key.
    let _: () = redis::cmd("HSET")
        .arg("rl:{closed:squatted}:fixed_window")
        .arg("x")
        .arg(1)
        .query(&mut conn)
        .expect("HSET");
    let _: () = redis::cmd("HSET")
        .arg("rl:{open:squatted}:fixed_window")
        .arg("x")
        .arg(1)
        .query(&mut conn)
        .expect("HSET");
    check(status("closed", "squatted").await, 503);
    check(status("open", "squatted").await, 200);

    // Out of memory: Redis refuses every script that may write.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query(&mut conn)
        .expect("CONFIG SET");
    check(status("closed", "oom").await, 503);
    check(status("open", "oom").await, 200);
    check(status("local", "oom").await, 200);
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("0")
        .query(&mut conn)
        .expect("CONFIG SET");

    // Errors Redis answers with prove it is reachable: the breaker stays closed.
    assert_eq!(app.get("/readyz").await.status(), 200);

    // Every connection reset under the service's feet: each connection's next call finds it
    // dead (and is answered by fail mode) and it reconnects; soon every call is decided again.
    let _: () = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query(&mut conn)
        .expect("CLIENT KILL");
    let start = Instant::now();
    loop {
        let burst = (0..20).map(|_| status("closed", "after-reset"));
        let codes: Vec<u16> = join_all(burst)
            .await
            .into_iter()
            .map(|(code, _)| code)
            .collect();
        assert!(codes.iter().all(|&c| c == 200 || c == 503), "{codes:?}");
        if codes.iter().all(|&c| c == 200) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "never reconnected"
        );
    }
    check_recovered(&app).await;
    let _ = std::fs::remove_dir_all(dir);
}

// --- Out of memory: refused whole, answered by fail mode ---------------------------------------

const ALGORITHMS: [&str; 4] = [
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
    "token_bucket",
];

/// An `open` and a `closed` policy of every algorithm, named `<mode>-<algorithm>`.
async fn create_oom_policies(app: &TestApp) {
    for mode in ["open", "closed"] {
        for a in ALGORITHMS {
            let mut policy = match a {
                "token_bucket" => {
                    json!({"capacity": 5, "refill_tokens": 1, "refill_period_ms": 60_000})
                }
                _ => json!({"limit": 5, "window_ms": 60_000}),
            };
            policy["name"] = json!(format!("{mode}-{a}"));
            policy["algorithm"] = json!(a);
            policy["fail_mode"] = json!(mode);
            app.create_policy(policy).await;
        }
    }
}

/// Acquires on every algorithm of a Redis that is out of memory: `open` allows, degraded;
/// `closed` answers 503.
async fn check_oom_answers(app: &TestApp) {
    for a in ALGORITHMS {
        let d = app.acquire(&format!("open-{a}"), "k", 1).await;
        assert_eq!(
            (d["allowed"].clone(), d["degraded"].clone()),
            (json!(true), json!(true)),
            "{a}: {d}"
        );
        let r = app
            .post(
                "/v1/acquire",
                &json!({"policy": format!("closed-{a}"), "key": "k"}),
            )
            .await;
        assert_eq!(r.status(), 503, "{a}");
        let body: Value = r.json().await.expect("JSON");
        assert_eq!(
            body["type"], "urn:ratelimiter:problem:store-unavailable",
            "{a}"
        );
    }
}

/// The state keys of the policies above, on one server.
fn oom_state_keys(conn: &mut redis::Connection) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for mode in ["open", "closed"] {
        let found: Vec<String> = redis::cmd("KEYS")
            .arg(format!("rl:{{{mode}-*"))
            .query(conn)
            .expect("KEYS");
        keys.extend(found);
    }
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_out_of_memory_takes_no_write_and_is_answered_by_fail_mode() {
    let redis = Arc::new(TestRedis::start_with(&[
        "--maxmemory",
        "4mb",
        "--maxmemory-policy",
        "noeviction",
    ]));
    let app = spawn_app_with(Some(redis.clone()), &[]).await;
    create_oom_policies(&app).await;

    // Up to the limit with keys of our own, until Redis refuses one.
    let mut conn = redis.conn();
    let value = vec![b'x'; 64 * 1024];
    for i in 0.. {
        assert!(i < 1_000, "never reached maxmemory");
        let set: redis::RedisResult<()> = redis::cmd("SET")
            .arg(format!("filler:{i}"))
            .arg(&value)
            .query(&mut conn);
        if let Err(e) = set {
            assert!(e.to_string().contains("OOM"), "{e}");
            break;
        }
    }
    // The refused write's own buffer pushed it over; without it Redis is just under the limit.
    // Halve the limit, as an operator might, so that it is clearly over it throughout.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("2mb")
        .query(&mut conn)
        .expect("CONFIG SET");
    let size =
        |conn: &mut redis::Connection| -> u64 { redis::cmd("DBSIZE").query(conn).expect("DBSIZE") };
    let keys_before = size(&mut conn);

    check_oom_answers(&app).await;
    assert_eq!(oom_state_keys(&mut conn), Vec::<String>::new());
    assert_eq!(size(&mut conn), keys_before, "nothing was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_out_of_memory_takes_no_write_and_is_answered_by_fail_mode() {
    let cluster = Arc::new(TestCluster::start());
    let app = spawn_app_on_cluster(cluster.clone(), &[]).await;
    create_oom_policies(&app).await;
    // Every master over its limit at once (replicas ignore maxmemory).
    for node in cluster.nodes() {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(1)
            .query(&mut node.conn())
            .expect("CONFIG SET");
    }
    check_oom_answers(&app).await;
    for node in cluster.nodes() {
        assert_eq!(oom_state_keys(&mut node.conn()), Vec::<String>::new());
    }
}
