//! Leases under attack and fault (issue 22): takes that got no answer are undone once the store
//! answers again, in every fail mode (item 5); the lease sweep costs what the leases in use cost,
//! not what the concurrency policies are (item 11); a policy bounds the lease a call may ask
//! for, and a reset frees a stuck holder's slots (item 14).
//!
//! Redis is paused with SIGSTOP (this test's own `redis-server`, or the master of a Cluster
//! that holds the policy's leases) for longer than `redis.timeout_ms`, so that takes are sent
//! and get no answer, and then run by Redis when it resumes. Waits are bounded and generous:
//! what is asserted is the state reached (slots held, ids known), never how fast.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use serde_json::{json, Value};

use crate::helpers::{
    masters, metric, spawn_app_on_cluster, spawn_app_with, Backend, TestApp, TestCluster, TestRedis,
};

crate::on_every_store!(a_policy_bounds_a_call_s_lease_and_a_reset_frees_a_stuck_holder_s_slots,);

const HOUR_MS: u64 = 3_600_000;

fn tag(backend: Backend) -> &'static str {
    match backend {
        Backend::Embedded => "embedded",
        Backend::Redis => "redis",
        Backend::Cluster => "cluster",
    }
}

/// The app on `backend`, with extra settings.
async fn spawn_on(backend: Backend, extra: &[(&str, &str)]) -> TestApp {
    match backend {
        Backend::Embedded => spawn_app_with(None, extra).await,
        Backend::Redis => spawn_app_with(Some(Arc::new(TestRedis::start())), extra).await,
        Backend::Cluster => spawn_app_on_cluster(Arc::new(TestCluster::start()), extra).await,
    }
}

/// One answer: status and JSON body (`null` when empty).
async fn send(request: reqwest::RequestBuilder) -> (u16, Value) {
    let r = request.send().await.expect("request sent");
    let status = r.status().as_u16();
    let text = r.text().await.expect("a body");
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    (status, body)
}

async fn take(
    app: &TestApp,
    policy: &str,
    key: &str,
    cost: u64,
    lease_ms: Option<u64>,
) -> (u16, Value) {
    let mut body = json!({"policy": policy, "key": key, "cost": cost});
    if let Some(l) = lease_ms {
        body["lease_ms"] = json!(l);
    }
    send(app.client.post(app.url("/v1/leases")).json(&body)).await
}

async fn renew(app: &TestApp, id: &str, lease_ms: Option<u64>) -> (u16, Value) {
    let request = app.client.post(app.url(&format!("/v1/leases/{id}/renew")));
    let request = match lease_ms {
        Some(l) => request.json(&json!({"lease_ms": l})),
        None => request,
    };
    send(request).await
}

/// A 422 problem naming `field`.
fn names_field(answer: &(u16, Value), field: &str) -> bool {
    answer.0 == 422
        && answer.1["field"] == field
        && answer.1["detail"]
            .as_str()
            .is_some_and(|d| d.contains(field))
}

/// The lease members held in the store for `policy`'s subject `key` (every incarnation), and
/// those in its ledger, from every master; `None` on the embedded store.
fn held(app: &TestApp, policy: &str, key: &str) -> Option<(Vec<String>, Vec<String>)> {
    let (mut subject, mut ledger) = (Vec::new(), Vec::new());
    for mut conn in masters(app)? {
        for (pattern, into) in [
            (format!("rl:{{{policy}@*}}:lease:{key}"), &mut subject),
            (format!("rl:{{{policy}@*}}:leases"), &mut ledger),
        ] {
            let keys: Vec<String> = ::redis::cmd("KEYS")
                .arg(pattern)
                .query(&mut conn)
                .expect("KEYS");
            for k in keys {
                let members: Vec<String> = ::redis::cmd("ZRANGEBYSCORE")
                    .arg(&k)
                    .arg(0)
                    .arg("+inf")
                    .query(&mut conn)
                    .expect("ZRANGEBYSCORE");
                into.extend(members);
            }
        }
    }
    subject.sort();
    ledger.sort();
    Some((subject, ledger))
}

/// The member string of a lease id: `<32 hex>:<cost>`.
fn member_of(id: &str) -> String {
    let parts: Vec<&str> = id.split('~').collect();
    format!("{}:{}", parts[3], parts[4])
}

// ---- Item 14: max_lease_ms, and reset of a concurrency policy's subject ---------------------

async fn a_policy_bounds_a_call_s_lease_and_a_reset_frees_a_stuck_holder_s_slots(backend: Backend) {
    let app = spawn_on(
        backend,
        &[
            ("RATELIMITER__AUTH__ADMIN_TOKENS", "admin-one"),
            ("RATELIMITER__AUTH__CLIENT_TOKENS", "client-one"),
        ],
    )
    .await;
    let admin = |r: reqwest::RequestBuilder| r.bearer_auth("admin-one");
    let client = |r: reqwest::RequestBuilder| r.bearer_auth("client-one");
    let (short, long) = (
        format!("{}-short", tag(backend)),
        format!("{}-long", tag(backend)),
    );
    for doc in [
        json!({"name": short, "algorithm": "concurrency", "limit": 2, "lease_ms": 1_000}),
        json!({"name": long, "algorithm": "concurrency", "limit": 2, "lease_ms": 1_000, "max_lease_ms": HOUR_MS}),
    ] {
        let (status, body) = send(admin(app.client.post(app.url("/v1/policies"))).json(&doc)).await;
        assert_eq!(status, 201, "{body}");
    }
    // Left out, max_lease_ms is lease_ms, and reads back so.
    let (_, doc) = send(admin(
        app.client.get(app.url(&format!("/v1/policies/{short}"))),
    ))
    .await;
    assert_eq!(doc["max_lease_ms"], 1_000, "{doc}");
    let (status, refused) = send(admin(app.client.post(app.url("/v1/policies"))).json(
        &json!({"name": "bad-max", "algorithm": "concurrency", "limit": 2, "lease_ms": 1_000, "max_lease_ms": 999}),
    ))
    .await;
    assert!(
        names_field(&(status, refused.clone()), "max_lease_ms"),
        "{status} {refused}"
    );

    let take_as = |policy: &str, key: &str, cost: u64, lease_ms: Option<u64>| {
        let mut body = json!({"policy": policy, "key": key, "cost": cost});
        if let Some(l) = lease_ms {
            body["lease_ms"] = json!(l);
        }
        send(client(app.client.post(app.url("/v1/leases"))).json(&body))
    };
    let too_long = take_as(&short, "k", 1, Some(1_001)).await;
    assert!(names_field(&too_long, "lease_ms"), "{too_long:?}");
    let (status, granted) = take_as(&long, "k", 1, Some(HOUR_MS)).await;
    assert_eq!(status, 201, "{granted}");
    let id = granted["lease"].as_str().expect("an id").to_owned();
    let too_long = take_as(&long, "k", 1, Some(HOUR_MS + 1)).await;
    assert!(names_field(&too_long, "lease_ms"), "{too_long:?}");
    let renew_too_long = send(
        client(app.client.post(app.url(&format!("/v1/leases/{id}/renew"))))
            .json(&json!({"lease_ms": HOUR_MS + 1})),
    )
    .await;
    assert!(
        names_field(&renew_too_long, "lease_ms"),
        "{renew_too_long:?}"
    );

    // A stuck holder: both slots held for an hour, renewed as it likes. The other subject's
    // lease must survive the reset.
    let (status, second) = take_as(&long, "k", 1, Some(HOUR_MS)).await;
    assert_eq!(status, 201, "{second}");
    let (status, other) = take_as(&long, "other", 1, Some(HOUR_MS)).await;
    assert_eq!(status, 201, "{other}");
    let (status, denied) = take_as(&long, "k", 1, None).await;
    assert_eq!(
        (status, &denied["allowed"]),
        (200, &json!(false)),
        "{denied}"
    );

    let reset = json!({"policy": long, "key": "k"});
    let (status, body) = send(client(app.client.post(app.url("/v1/reset"))).json(&reset)).await;
    assert_eq!(status, 401, "a client token cannot reset: {body}");
    let (status, body) = send(admin(app.client.post(app.url("/v1/reset"))).json(&reset)).await;
    assert_eq!(status, 204, "{body}");

    // Freed at once: the full limit is taken again, and the old ids renew no more.
    let (status, fresh) = take_as(&long, "k", 2, None).await;
    assert_eq!(
        (status, fresh["in_use"].as_u64()),
        (201, Some(2)),
        "{fresh}"
    );
    for old in [&id, second["lease"].as_str().expect("an id")] {
        let (status, body) = send(client(
            app.client.post(app.url(&format!("/v1/leases/{old}/renew"))),
        ))
        .await;
        assert_eq!(
            (status, &body["type"]),
            (404, &json!("urn:ratelimiter:problem:unknown-lease")),
            "{body}"
        );
    }
    let other_id = other["lease"].as_str().expect("an id");
    let (status, body) = send(client(
        app.client
            .post(app.url(&format!("/v1/leases/{other_id}/renew"))),
    ))
    .await;
    assert_eq!(status, 200, "another subject's lease is untouched: {body}");
    // The reset ones are gone from the ledger too: only the two fresh units and the other
    // subject's remain in it.
    if let Some((subject, ledger)) = held(&app, &long, "k") {
        assert_eq!(subject.len(), 1, "{subject:?}");
        assert_eq!(ledger.len(), 2, "{ledger:?}");
    }
}

// ---- Item 5: a take with no answer is undone -------------------------------------------------

/// The master of `app`'s store that holds `policy`'s ledger (a lease was taken): its own Redis,
/// or the Cluster master of the ledger's slot.
fn owner_of<'a>(app: &'a TestApp, policy: &str) -> &'a TestRedis {
    if let Some(redis) = &app._redis {
        return redis;
    }
    let cluster = app.cluster.as_ref().expect("a Redis or a Cluster");
    cluster
        .nodes()
        .iter()
        .find(|n| {
            let mut c = n.conn();
            let role: Vec<::redis::Value> = ::redis::cmd("ROLE").query(&mut c).expect("ROLE");
            let keys: Vec<String> = ::redis::cmd("KEYS")
                .arg(format!("rl:{{{policy}@*}}:leases"))
                .query(&mut c)
                .expect("KEYS");
            matches!(role.first(), Some(::redis::Value::BulkString(r)) if r == b"master")
                && !keys.is_empty()
        })
        .expect("a master holds the policy's ledger")
}

/// Pauses the policy's Redis (SIGSTOP) while `n` takes of one unit each are in flight, until
/// every take was answered without it (by `redis.timeout_ms` of 100, or by the open breaker)
/// and at least 300 ms have passed, then resumes it; the answers. Redis then runs the takes it
/// had received.
async fn takes_with_redis_paused(app: &TestApp, policy: &str, n: usize) -> Vec<(u16, Value)> {
    let owner = owner_of(app, policy);
    owner.signal("STOP");
    let paused = Instant::now();
    let takes = join_all((0..n).map(|_| take(app, policy, "k", 1, None)));
    let answers = tokio::time::timeout(Duration::from_secs(20), takes).await;
    tokio::time::sleep(Duration::from_millis(300).saturating_sub(paused.elapsed())).await;
    owner.signal("CONT");
    answers.expect("every take is answered while Redis is paused")
}

async fn a_take_with_no_answer_is_undone_in_every_fail_mode(backend: Backend) {
    let app = spawn_on(
        backend,
        &[
            ("RATELIMITER__REDIS__TIMEOUT_MS", "100"),
            ("RATELIMITER__REDIS__BREAKER_FAILURES", "3"),
            ("RATELIMITER__REDIS__BREAKER_COOLDOWN_MS", "200"),
        ],
    )
    .await;
    for mode in ["open", "local", "closed"] {
        let p = format!("{}-undo-{mode}", tag(backend));
        app.create_policy(json!({"name": p, "algorithm": "concurrency", "limit": 10,
            "lease_ms": HOUR_MS, "fail_mode": mode}))
            .await;
        // Connections made and the policy indexed: the takes below go straight to Redis.
        let (status, warm) = take(&app, &p, "warm", 1, None).await;
        assert_eq!(status, 201, "{warm}");
        let answers = takes_with_redis_paused(&app, &p, 10).await;
        let mut by_redis = Vec::new();
        let mut degraded = Vec::new();
        for (status, body) in &answers {
            match (status, body["decided_by"].as_str()) {
                (201, Some("redis")) => {
                    by_redis.push(member_of(body["lease"].as_str().expect("id")))
                }
                (201, Some("fail_open" | "fail_local")) if mode != "closed" => {
                    assert_eq!(body["degraded"], true, "{body}");
                    degraded.push(body["lease"].as_str().expect("id").to_owned());
                }
                (503, _) if mode == "closed" => {}
                _ => panic!("{mode}: {status} {body}"),
            }
        }
        assert!(
            by_redis.len() < answers.len(),
            "{mode}: Redis answered every take; nothing was in flight"
        );
        // After a bounded wait for the undo queue, the store holds the leases Redis answered
        // for, and no other: none for a take answered degraded or 503.
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut expected = by_redis.clone();
        expected.sort();
        loop {
            let (subject, _) = held(&app, &p, "k").expect("a Redis store");
            if subject == expected {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{mode}: slots held by leases nobody was given: {subject:?} (answered by Redis: {expected:?})"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The full limit less what Redis granted is free again, and a degraded id is unknown
        // to the store (its holder takes a new lease).
        let free = 10 - by_redis.len() as u64;
        let (status, fresh) = take(&app, &p, "k", free, None).await;
        assert_eq!(
            (status, fresh["decided_by"].as_str()),
            (201, Some("redis")),
            "{mode}: {fresh}"
        );
        for id in &degraded {
            let (status, body) = renew(&app, id, None).await;
            assert_eq!(
                status, 404,
                "{mode}: a degraded lease renewed on Redis: {body}"
            );
        }
    }
    let undone = metric(
        &app,
        "ratelimiter_lease_undos_total",
        &[("outcome", "undone")],
    )
    .await
        + metric(
            &app,
            "ratelimiter_lease_undos_total",
            &[("outcome", "absent")],
        )
        .await;
    assert!(undone > 0.0, "the undos are counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_take_with_no_answer_is_undone_in_every_fail_mode() {
    a_take_with_no_answer_is_undone_in_every_fail_mode(Backend::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_take_with_no_answer_is_undone_in_every_fail_mode() {
    a_take_with_no_answer_is_undone_in_every_fail_mode(Backend::Cluster).await;
}

// ---- Item 11: the sweep's cost follows the leases, not the policies --------------------------

/// Script calls (`EVAL`, `EVALSHA`, `EVALSHA_RO`) the store's masters ran since their stats
/// were last reset.
fn script_calls(app: &TestApp) -> u64 {
    let mut calls = 0;
    for mut conn in masters(app).expect("a Redis store") {
        let info: String = ::redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut conn)
            .expect("INFO");
        for line in info.lines() {
            let Some((name, stats)) = line.split_once(':') else {
                continue;
            };
            if matches!(
                name,
                "cmdstat_eval" | "cmdstat_evalsha" | "cmdstat_evalsha_ro"
            ) {
                calls += stats
                    .split(',')
                    .find_map(|s| s.strip_prefix("calls="))
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    calls
}

fn reset_stats(app: &TestApp) {
    for mut conn in masters(app).expect("a Redis store") {
        let _: () = ::redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut conn)
            .expect("CONFIG RESETSTAT");
    }
}

/// Creates `n` concurrency policies named `<prefix>-<i>`, 32 at a time.
async fn create_many(app: &TestApp, prefix: &str, n: usize) {
    let names: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    for chunk in names.chunks(32) {
        join_all(chunk.iter().map(|name| {
            app.create_policy(
                json!({"name": name, "algorithm": "concurrency", "limit": 2, "lease_ms": 60_000}),
            )
        }))
        .await;
    }
}

/// With `n` concurrency policies `<prefix>-<i>` and no lease, the script calls a second Redis
/// runs over `idle` (a sweep a second on each policy would be `n` a second); 0 on the embedded
/// store.
async fn idle_script_calls(
    app: &TestApp,
    backend: Backend,
    prefix: &str,
    n: usize,
    idle: Duration,
) -> f64 {
    create_many(app, prefix, n).await;
    // Every instance's cache has them (the app's own writes went into it at once).
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    if backend == Backend::Embedded {
        return 0.0;
    }
    // Until the policy sync has read the change log of the creates (a page per call), its
    // calls would be counted too: wait (two minutes at most) for a second of fewer than 100.
    let settled = Instant::now() + Duration::from_secs(120);
    loop {
        reset_stats(app);
        tokio::time::sleep(Duration::from_secs(1)).await;
        if script_calls(app) < 100 || Instant::now() > settled {
            break;
        }
    }
    reset_stats(app);
    tokio::time::sleep(idle).await;
    script_calls(app) as f64 / idle.as_secs_f64()
}

/// The time from the expiry of a lease of one second on `policy` to its count as expired and
/// the gauge at 0 (15 s at most). No call touches its subject again: only the sweep can count
/// it.
async fn expiry_lag(app: &TestApp, policy: &str) -> Duration {
    let (status, granted) = take(app, policy, "k", 1, Some(1_000)).await;
    assert_eq!(status, 201, "{granted}");
    let expires_at = Instant::now() + Duration::from_millis(1_000);
    let deadline = expires_at + Duration::from_secs(15);
    loop {
        let expired = metric(
            app,
            "ratelimiter_leases_total",
            &[("policy", policy), ("event", "expired")],
        )
        .await;
        let in_use = metric(app, "ratelimiter_leases_in_use", &[("policy", policy)]).await;
        if expired == 1.0 && in_use == 0.0 {
            return Instant::now().saturating_duration_since(expires_at);
        }
        assert!(
            Instant::now() < deadline,
            "the expiry was not swept: expired {expired}, in use {in_use}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn the_sweep_costs_what_the_leases_cost_not_the_policies(backend: Backend) {
    let app = spawn_on(backend, &[]).await;
    let n = 2_000;
    let prefix = format!("{}-swept", tag(backend));
    let per_second = idle_script_calls(&app, backend, &prefix, n, Duration::from_secs(3)).await;
    // Without leases the sweep reads the lease index and nothing else; what remains is the
    // policy refresh (every 100 ms here). A sweep per policy would be 2,000 a second.
    assert!(per_second < 100.0, "{per_second} script calls a second");
    let lag = expiry_lag(&app, &format!("{prefix}-{}", n / 2)).await;
    eprintln!("{backend:?}: {n} concurrency policies, no lease: {per_second:.1} script calls/s; expiry counted {lag:?} after it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_embedded_store_an_expiry_is_swept_among_many_policies() {
    the_sweep_costs_what_the_leases_cost_not_the_policies(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_the_sweep_costs_what_the_leases_cost_not_the_policies() {
    the_sweep_costs_what_the_leases_cost_not_the_policies(Backend::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_sweep_costs_what_the_leases_cost_not_the_policies() {
    the_sweep_costs_what_the_leases_cost_not_the_policies(Backend::Cluster).await;
}

/// The figure in docs/leases.md: `RATELIMITER_SWEEP_POLICIES` (default 50,000) concurrency policies on one
/// Redis. Not in CI (it creates them all over HTTP): `cargo test --test api -- --ignored
/// sweep_at_scale --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the measurement in docs/leases.md at 50,000 policies, not a check: run it with --ignored"]
async fn sweep_at_scale() {
    let n = std::env::var("RATELIMITER_SWEEP_POLICIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    let app = spawn_on(
        Backend::Redis,
        &[("RATELIMITER__LIMITS__MAX_POLICIES", "100000")],
    )
    .await;
    let started = Instant::now();
    let per_second =
        idle_script_calls(&app, Backend::Redis, "scale", n, Duration::from_secs(10)).await;
    let lag = expiry_lag(&app, &format!("scale-{}", n / 2)).await;
    eprintln!("{n} concurrency policies (created and measured in {:?}), no lease: {per_second:.1} script calls/s; an expiry counted {lag:?} after it", started.elapsed());
}
