//! The local denial cache (issue 13) over HTTP, on one Redis and on a Cluster: repeated acquires
//! of a subject Redis denied are answered by the instance (`decided_by: local_cache`) until the
//! retry time Redis gave, costing Redis no script call; a refund, a report, a reset or a policy
//! change on another instance ends them there; an entry never outlives `limits.denial_cache_ms`;
//! an instance that lost its subscription asks Redis again; and only enforced acquires of 1
//! unit of one-limit policies are ever cached.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::{
    clear_of_window_edges, masters, metric, spawn_app_on_cluster, spawn_app_with, TestApp,
    TestCluster, TestRedis,
};

const MINUTE_MS: u64 = 60_000;

/// Where the instances share their state.
#[derive(Clone)]
enum Shared {
    Redis(Arc<TestRedis>),
    Cluster(Arc<TestCluster>),
}

impl Shared {
    /// A name for the store in policy names, so that the two runs of a test, which share the
    /// process's metrics, count apart.
    fn tag(&self) -> &'static str {
        match self {
            Shared::Redis(_) => "redis",
            Shared::Cluster(_) => "cluster",
        }
    }

    fn redis() -> Self {
        Shared::Redis(Arc::new(TestRedis::start()))
    }

    fn cluster() -> Self {
        Shared::Cluster(Arc::new(TestCluster::start()))
    }

    /// An instance on it, with cached denials bounded by `bound_ms`.
    async fn instance(&self, bound_ms: u64) -> TestApp {
        self.instance_with(bound_ms, &[]).await
    }

    /// An instance on it, with cached denials bounded by `bound_ms`, and `extra` settings.
    async fn instance_with(&self, bound_ms: u64, extra: &[(&str, &str)]) -> TestApp {
        let bound = bound_ms.to_string();
        let mut settings = vec![("RATELIMITER__LIMITS__DENIAL_CACHE_MS", bound.as_str())];
        settings.extend_from_slice(extra);
        match self {
            Shared::Redis(r) => spawn_app_with(Some(r.clone()), &settings).await,
            Shared::Cluster(c) => spawn_app_on_cluster(c.clone(), &settings).await,
        }
    }
}

/// One acquire's body and `Decided-By` header.
async fn acquire(app: &TestApp, policy: &str, key: &str, cost: u64) -> (Value, String) {
    let r = app
        .post(
            "/v1/acquire",
            &json!({"policy": policy, "key": key, "cost": cost}),
        )
        .await;
    assert_eq!(r.status(), 200, "acquire {policy}/{key}");
    let header = r
        .headers()
        .get("decided-by")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body: Value = r.json().await.expect("JSON decision");
    assert_eq!(body["decided_by"], header.as_str(), "{body}");
    (body, header)
}

/// Script calls Redis has run, over every master.
fn script_calls(app: &TestApp) -> u64 {
    let mut calls = 0;
    for mut conn in masters(app).expect("a Redis") {
        let stats: String = ::redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut conn)
            .expect("INFO commandstats");
        for line in stats.lines() {
            let script = ["evalsha", "evalsha_ro", "eval", "eval_ro"]
                .iter()
                .any(|c| line.starts_with(&format!("cmdstat_{c}:")));
            if script {
                let n = line
                    .split(['=', ','])
                    .nth(1)
                    .and_then(|n| n.parse::<u64>().ok())
                    .expect("calls=N");
                calls += n;
            }
        }
    }
    calls
}

/// A fixed window of `limit` per minute named `name`.
fn per_minute(name: &str, limit: u64) -> Value {
    json!({"name": name, "algorithm": "fixed_window", "limit": limit, "window_ms": MINUTE_MS})
}

/// Acquires until the subject is denied by Redis, then once more to see it cached: the
/// allowed acquires' bodies.
async fn exhaust(app: &TestApp, policy: &str, key: &str) -> Vec<Value> {
    let mut allowed = Vec::new();
    loop {
        let (body, by) = acquire(app, policy, key, 1).await;
        if body["allowed"] == true {
            allowed.push(body);
            continue;
        }
        assert_eq!(by, "redis", "the first denial is Redis's: {body}");
        break;
    }
    let (body, by) = acquire(app, policy, key, 1).await;
    assert_eq!(
        (by.as_str(), &body["allowed"]),
        ("local_cache", &json!(false)),
        "then cached: {body}"
    );
    allowed
}

/// Waits (10 s at most) until `app` knows the policy `name` (created through another instance).
async fn knows(app: &TestApp, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = app
            .post("/v1/peek", &json!({"policy": name, "key": "-"}))
            .await;
        if r.status() == 200 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never reached the instance"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Acquires on `app` until one is not answered by the cache (10 s at most): that answer.
async fn until_redis_answers(app: &TestApp, policy: &str, key: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (body, by) = acquire(app, policy, key, 1).await;
        if by != "local_cache" {
            assert_eq!(by, "redis", "{body}");
            return body;
        }
        assert_eq!(body["allowed"], false, "{body}");
        assert!(
            Instant::now() < deadline,
            "the cached denial outlived its invalidation"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---- 1. Repeated denials ----------------------------------------------------------------------

async fn repeated_denials_are_answered_locally_and_cost_redis_nothing(shared: Shared) {
    clear_of_window_edges(&[MINUTE_MS]).await;
    // Policies are read back by a script every refresh: once a minute here, so that the script
    // calls counted are decisions only (the instance knows its own policies at once).
    let app = shared
        .instance_with(
            MINUTE_MS,
            &[("RATELIMITER__REDIS__POLICY_REFRESH_MS", "60000")],
        )
        .await;
    let hot = &format!("{}-hot", shared.tag());
    app.create_policy(per_minute(hot, 2)).await;
    assert_eq!(exhaust(&app, hot, "k").await.len(), 2);

    let calls = script_calls(&app);
    let mut last_retry = u64::MAX;
    for _ in 0..50 {
        let (body, by) = acquire(&app, hot, "k", 1).await;
        assert_eq!(by, "local_cache", "{body}");
        assert_eq!(
            (&body["allowed"], &body["remaining"], &body["degraded"]),
            (&json!(false), &json!(0), &json!(false)),
            "{body}"
        );
        let retry = body["retry_after_ms"].as_u64().expect("retry_after_ms");
        assert!(retry > 0 && retry <= last_retry, "counts down: {body}");
        last_retry = retry;
    }
    assert_eq!(
        script_calls(&app),
        calls,
        "50 cached denials, no script call"
    );
    assert_eq!(
        metric(
            &app,
            "ratelimiter_denial_cache_hits_total",
            &[("policy", hot)]
        )
        .await,
        51.0
    );
    // A larger cost, a peek and another key ask Redis.
    assert_eq!(acquire(&app, hot, "k", 2).await.1, "redis");
    assert_eq!(acquire(&app, hot, "other", 1).await.1, "redis");
    let peek = app
        .post("/v1/peek", &json!({"policy": hot, "key": "k"}))
        .await;
    let peek: Value = peek.json().await.expect("JSON");
    assert_eq!(peek["decided_by"], "redis", "{peek}");
    assert_eq!(script_calls(&app), calls + 3);
}

// ---- 2. Invalidation from another instance ----------------------------------------------------

async fn a_refund_report_reset_or_policy_change_elsewhere_ends_the_cached_denial(shared: Shared) {
    clear_of_window_edges(&[MINUTE_MS]).await;
    let (a, b) = (
        shared.instance(MINUTE_MS).await,
        shared.instance(MINUTE_MS).await,
    );
    a.create_policy(per_minute("shared", 1)).await;
    knows(&b, "shared").await;
    let ticket = exhaust(&a, "shared", "k").await[0]["ticket"]
        .as_str()
        .expect("a ticket")
        .to_owned();

    // A refund through b: a's next acquires reach Redis, and the refunded unit is granted.
    let r = b
        .post(
            "/v1/refund",
            &json!({"policy": "shared", "key": "k", "cost": 1, "ticket": ticket}),
        )
        .await;
    let r: Value = r.json().await.expect("JSON");
    assert_eq!(r["refunded"], 1, "{r}");
    let after = until_redis_answers(&a, "shared", "k").await;
    assert_eq!(after["allowed"], true, "the refunded unit: {after}");

    // A reset through b.
    exhaust(&a, "shared", "k").await;
    let r = b
        .post("/v1/reset", &json!({"policy": "shared", "key": "k"}))
        .await;
    assert_eq!(r.status(), 204);
    let after = until_redis_answers(&a, "shared", "k").await;
    assert_eq!(after["allowed"], true, "reset: {after}");

    // A report through b: still denied, but asked of Redis again.
    exhaust(&a, "shared", "k").await;
    let r = b
        .post(
            "/v1/report",
            &json!({"policy": "shared", "key": "k", "cost": 1}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let after = until_redis_answers(&a, "shared", "k").await;
    assert_eq!(after["allowed"], false, "in debt: {after}");

    // A policy change through b: a decides with the new version once it has it.
    let (_, by) = acquire(&a, "shared", "k", 1).await;
    assert_eq!(by, "local_cache");
    let r = b.put("/v1/policies/shared", &per_minute("shared", 5)).await;
    assert_eq!(r.status(), 200);
    let after = until_redis_answers(&a, "shared", "k").await;
    assert_eq!(
        (&after["allowed"], &after["limit"]),
        (&json!(true), &json!(5)),
        "{after}"
    );
    // (The process's metrics are shared by every instance a test starts.)
    let text = a.get("/metrics").await.text().await.expect("metrics");
    let received: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("ratelimiter_denial_cache_invalidations_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(
        received >= 6.0,
        "a and b each received the refund's, the reset's and the report's messages: {received}"
    );
}

// ---- 3. Lifetime ------------------------------------------------------------------------------

async fn an_entry_ends_at_redis_retry_time_or_the_bound_whichever_is_first(shared: Shared) {
    // Redis's retry time: a window of a second.
    let app = shared.instance(MINUTE_MS).await;
    app.create_policy(
        json!({"name": "second", "algorithm": "fixed_window", "limit": 1, "window_ms": 1_000}),
    )
    .await;
    let mut granted_again = false;
    for _ in 0..5 {
        // Allowed, then denied by Redis, then cached; a window that turns in between starts
        // the attempt again.
        let (first, _) = acquire(&app, "second", "k", 1).await;
        let (denial, by) = acquire(&app, "second", "k", 1).await;
        if first["allowed"] != true || denial["allowed"] != false {
            continue;
        }
        assert_eq!(by, "redis", "{denial}");
        let (denied, by) = acquire(&app, "second", "k", 1).await;
        if denied["allowed"] == true {
            continue;
        }
        assert_eq!(by, "local_cache", "{denied}");
        let retry = denied["retry_after_ms"].as_u64().expect("retry_after_ms");
        assert!(retry <= 1_000, "{denied}");
        tokio::time::sleep(Duration::from_millis(retry + 20)).await;
        let (after, by) = acquire(&app, "second", "k", 1).await;
        assert_eq!(by, "redis", "the entry ended with the window: {after}");
        granted_again = after["allowed"] == true;
        if granted_again {
            break;
        }
    }
    assert!(granted_again, "a new window grants again");

    // The bound: a denial for a minute is cached for 300 ms at most.
    let bounded = shared.instance(300).await;
    bounded.create_policy(per_minute("bounded", 1)).await;
    exhaust(&bounded, "bounded", "k").await;
    let cached_at = Instant::now();
    let mut cached = None;
    let (after, by) = loop {
        let (body, by) = acquire(&bounded, "bounded", "k", 1).await;
        if by != "local_cache" {
            break (body, by);
        }
        cached.get_or_insert(body);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(by, "redis");
    assert_eq!(after["allowed"], false, "{after}");
    assert!(
        cached_at.elapsed() >= Duration::from_millis(250),
        "the entry lived its bound"
    );
    // The bound shortens the entry's life, not the retry time it answers: the cached answer
    // counts down Redis's, so it is no earlier than what Redis answers after it.
    let cached = cached.expect("a cached answer");
    let retry = |b: &Value| b["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!(
        retry(&cached) >= retry(&after),
        "cached {cached}, then Redis {after}"
    );
}

// ---- 4. Subscription --------------------------------------------------------------------------

async fn an_instance_that_lost_its_subscription_asks_redis_until_subscribed_again(shared: Shared) {
    clear_of_window_edges(&[MINUTE_MS]).await;
    let app = shared.instance(MINUTE_MS).await;
    app.create_policy(per_minute("sub", 1)).await;
    exhaust(&app, "sub", "k").await;
    for mut conn in masters(&app).expect("a Redis") {
        let _: u64 = ::redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .query(&mut conn)
            .expect("CLIENT KILL");
    }
    until_redis_answers(&app, "sub", "k").await;
    // Subscribed again a second later: cached again.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (body, by) = acquire(&app, "sub", "k", 1).await;
        assert_eq!(body["allowed"], false, "{body}");
        if by == "local_cache" {
            break;
        }
        assert!(Instant::now() < deadline, "never subscribed again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---- 5. What is never cached ------------------------------------------------------------------

async fn shadow_several_limits_and_larger_costs_are_never_cached(shared: Shared) {
    clear_of_window_edges(&[MINUTE_MS]).await;
    let app = shared.instance(MINUTE_MS).await;
    let mut shadow = per_minute("shadow", 1);
    shadow["mode"] = json!("shadow");
    app.create_policy(shadow).await;
    app.create_policy(json!({"name": "pair", "limits": [
        {"name": "a", "algorithm": "fixed_window", "limit": 1, "window_ms": MINUTE_MS},
        {"name": "b", "algorithm": "token_bucket", "capacity": 5, "refill_tokens": 1, "refill_period_ms": MINUTE_MS},
    ]}))
    .await;
    app.create_policy(per_minute("big", 3)).await;
    for _ in 0..5 {
        assert_eq!(acquire(&app, "shadow", "k", 1).await.1, "redis");
        assert_eq!(acquire(&app, "pair", "k", 1).await.1, "redis");
        assert_eq!(acquire(&app, "big", "k", 2).await.1, "redis");
    }
}

// ---- Runs -------------------------------------------------------------------------------------

macro_rules! on_redis_and_cluster {
    ($($name:ident),* $(,)?) => {
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Shared::redis()).await
                }
            )*
        }
        mod cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Shared::cluster()).await
                }
            )*
        }
    };
}

on_redis_and_cluster!(
    repeated_denials_are_answered_locally_and_cost_redis_nothing,
    a_refund_report_reset_or_policy_change_elsewhere_ends_the_cached_denial,
    an_entry_ends_at_redis_retry_time_or_the_bound_whichever_is_first,
    an_instance_that_lost_its_subscription_asks_redis_until_subscribed_again,
    shadow_several_limits_and_larger_costs_are_never_cached,
);
