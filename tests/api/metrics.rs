//! The metrics that answer operators' questions (issue 25), scraped from `/metrics` of a real
//! instance and checked for exact values: per-limit decisions by outcome and `decided_by`,
//! near-limit acquires, each limit's configured quota per tier, and the policy cache's lag.
//!
//! The metrics recorder is the process's, shared by every test of the binary: each test names
//! its policies after itself and its store, and no other test uses those names.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use serde_json::{json, Value};

use crate::helpers::{
    clear_of_window_edges, metric, spawn_app, spawn_app_with, Backend, TestApp, TestRedis,
};

const HOUR_MS: u64 = 3_600_000;

/// A name unique to the test and its store.
fn named(test: &str, backend: Backend) -> String {
    format!("metrics-{test}-{}", format!("{backend:?}").to_lowercase())
}

/// What the store of `backend` answers as `decided_by`.
fn store_decider(backend: Backend) -> &'static str {
    match backend {
        Backend::Embedded => "embedded",
        Backend::Redis | Backend::Cluster => "redis",
    }
}

async fn decisions(
    app: &TestApp,
    policy: &str,
    limit: &str,
    outcome: &str,
    decided_by: &str,
) -> f64 {
    metric(
        app,
        "ratelimiter_limit_decisions_total",
        &[
            ("policy", policy),
            ("limit", limit),
            ("outcome", outcome),
            ("decided_by", decided_by),
        ],
    )
    .await
}

async fn near(app: &TestApp, policy: &str, limit: &str) -> f64 {
    metric(
        app,
        "ratelimiter_near_limit_total",
        &[("policy", policy), ("limit", limit)],
    )
    .await
}

/// Every `ratelimiter_limit_quota` sample of `policy`: `(limit, tier, value)`, sorted.
async fn quotas(app: &TestApp, policy: &str) -> Vec<(String, String, f64)> {
    let text = app.get("/metrics").await.text().await.expect("metrics");
    let mut out: Vec<(String, String, f64)> = text
        .lines()
        .filter(|l| l.starts_with("ratelimiter_limit_quota{"))
        .filter(|l| l.contains(&format!("policy=\"{policy}\"")))
        .map(|l| {
            let label = |k: &str| {
                let start = l.find(&format!("{k}=\"")).expect("label") + k.len() + 2;
                let end = start + l[start..].find('"').expect("closing quote");
                l[start..end].to_owned()
            };
            let value = l
                .rsplit(' ')
                .next()
                .expect("value")
                .parse()
                .expect("number");
            (label("limit"), label("tier"), value)
        })
        .collect();
    out.sort_by(|a, b| a.partial_cmp(b).expect("numbers"));
    out
}

fn q(limit: &str, tier: &str, value: f64) -> (String, String, f64) {
    (limit.to_owned(), tier.to_owned(), value)
}

crate::on_every_store!(near_limit_counts_allowed_acquires_from_the_ratio_on);

/// A fixed window of 10 at the default ratio of 0.8: the 8th, 9th and 10th acquires are near
/// the limit; the 11th is denied and not counted. At 0.5, the 5th to the 10th.
async fn near_limit_counts_allowed_acquires_from_the_ratio_on(backend: Backend) {
    clear_of_window_edges(&[HOUR_MS]).await;
    let app = spawn_app(backend).await;
    let (p, half) = (named("near", backend), named("near-half", backend));
    app.create_policy(
        json!({"name": p, "algorithm": "fixed_window", "limit": 10, "window_ms": HOUR_MS}),
    )
    .await;
    app.create_policy(json!({"name": half, "algorithm": "fixed_window", "limit": 10, "window_ms": HOUR_MS, "near_limit_ratio": 0.5}))
        .await;
    let by = store_decider(backend);
    for i in 1..=11u64 {
        let a = app.acquire(&p, "k", 1).await;
        assert_eq!(a["allowed"], i <= 10, "acquire {i}: {a}");
        assert_eq!(a["decided_by"], by, "{a}");
        let expected = i.min(10).saturating_sub(7) as f64;
        assert_eq!(near(&app, &p, &p).await, expected, "after acquire {i}");
    }
    assert_eq!(decisions(&app, &p, &p, "allowed", by).await, 10.0);
    assert_eq!(decisions(&app, &p, &p, "denied", by).await, 1.0);
    for _ in 0..11 {
        app.acquire(&half, "k", 1).await;
    }
    assert_eq!(near(&app, &half, &half).await, 6.0, "the 5th to the 10th");
    // The ratio reads back as written; the default is not written into the document.
    let doc: Value = app
        .get(&format!("/v1/policies/{half}"))
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(doc["near_limit_ratio"], 0.5, "{doc}");
    let doc: Value = app
        .get(&format!("/v1/policies/{p}"))
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(doc.get("near_limit_ratio"), None, "{doc}");
}

mod per_limit {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embedded() {
        each_limit_counts_its_own_verdict(Backend::Embedded).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis() {
        each_limit_counts_its_own_verdict(Backend::Redis).await
    }
}

/// Two limits, `burst` of 3 and `daily` of 100: five acquires are three allowed and two denied
/// by `burst`, while `daily` admits all five (its own verdict), and only `burst` comes near.
async fn each_limit_counts_its_own_verdict(backend: Backend) {
    clear_of_window_edges(&[HOUR_MS]).await;
    let app = spawn_app(backend).await;
    let p = named("two-limits", backend);
    app.create_policy(json!({"name": p, "limits": [
        {"name": "burst", "algorithm": "fixed_window", "limit": 3, "window_ms": HOUR_MS},
        {"name": "daily", "algorithm": "fixed_window", "limit": 100, "window_ms": HOUR_MS}
    ]}))
    .await;
    let by = store_decider(backend);
    let allowed: Vec<bool> =
        futures_util::future::join_all((0..5).map(|_| app.acquire(&p, "k", 1)))
            .await
            .iter()
            .map(|a| a["allowed"] == true)
            .collect();
    assert_eq!(allowed.iter().filter(|a| **a).count(), 3);
    assert_eq!(decisions(&app, &p, "burst", "allowed", by).await, 3.0);
    assert_eq!(decisions(&app, &p, "burst", "denied", by).await, 2.0);
    assert_eq!(decisions(&app, &p, "daily", "allowed", by).await, 5.0);
    assert_eq!(decisions(&app, &p, "daily", "denied", by).await, 0.0);
    assert_eq!(near(&app, &p, "burst").await, 1.0, "the 3rd left 0 of 3");
    assert_eq!(near(&app, &p, "daily").await, 0.0);
    // The policy-level counter is unchanged in meaning: one per acquire.
    let total = |outcome: &'static str| {
        let p = p.clone();
        let app = &app;
        async move {
            metric(
                app,
                "ratelimiter_decisions_total",
                &[("policy", &p), ("outcome", outcome)],
            )
            .await
        }
    };
    assert_eq!((total("allowed").await, total("denied").await), (3.0, 2.0));
}

mod quota {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embedded() {
        the_quota_gauge_follows_the_policy_and_its_tiers(Backend::Embedded).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis() {
        the_quota_gauge_follows_the_policy_and_its_tiers(Backend::Redis).await
    }
}

/// One series per limit (`tier=""`) and per tier's limit, each the algorithm's quota field;
/// changed with the policy; a tier that goes, and then the policy, take their series along.
async fn the_quota_gauge_follows_the_policy_and_its_tiers(backend: Backend) {
    let app = spawn_app(backend).await;
    let p = named("quota", backend);
    let limits = json!([
        {"name": "minute", "algorithm": "gcra", "rate": 100, "period_ms": 60000, "burst": 20},
        {"name": "bucket", "algorithm": "token_bucket", "capacity": 30, "refill_tokens": 1, "refill_period_ms": 1000}
    ]);
    app.create_policy(json!({"name": p, "limits": limits,
        "tiers": {"pro": {"minute": {"burst": 200}}}}))
        .await;
    assert_eq!(
        quotas(&app, &p).await,
        vec![
            q("bucket", "", 30.0),
            q("bucket", "pro", 30.0),
            q("minute", "", 20.0),
            q("minute", "pro", 200.0),
        ]
    );
    let r = app
        .put(
            &format!("/v1/policies/{p}"),
            &json!({"limits": [
                {"name": "minute", "algorithm": "gcra", "rate": 100, "period_ms": 60000, "burst": 25},
                {"name": "bucket", "algorithm": "token_bucket", "capacity": 30, "refill_tokens": 1, "refill_period_ms": 1000}
            ], "tiers": {"max": {"bucket": {"capacity": 1000}}}}),
        )
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    assert_eq!(
        quotas(&app, &p).await,
        vec![
            q("bucket", "", 30.0),
            q("bucket", "max", 1000.0),
            q("minute", "", 25.0),
            q("minute", "max", 25.0),
        ],
        "the new quota, the new tier, and `pro` gone"
    );
    assert_eq!(app.delete(&format!("/v1/policies/{p}")).await.status(), 204);
    assert_eq!(
        quotas(&app, &p).await,
        vec![],
        "the policy's series went with it"
    );
}

mod lag {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embedded() {
        let app = spawn_app(Backend::Embedded).await;
        the_lag_is_zero_when_current(&app).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis() {
        let redis = Arc::new(TestRedis::start());
        let app = spawn_app_with(Some(redis.clone()), &[]).await;
        the_lag_is_zero_when_current(&app).await;
        // Another instance writes; this one follows within a refresh (100 ms here).
        let other = spawn_app_with(Some(redis.clone()), &[]).await;
        other
            .create_policy(json!({"name": "lag-other", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000}))
            .await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(
            gauge(&app, "ratelimiter_policy_cache_lag_versions").await,
            0.0
        );
        assert_eq!(
            gauge(&app, "ratelimiter_policy_cache_lag_seconds").await,
            0.0
        );
        // With the store gone, the cache is no longer known current: its lag grows.
        let stopping = redis.clone();
        tokio::task::spawn_blocking(move || stopping.stop())
            .await
            .expect("stop");
        tokio::time::sleep(Duration::from_millis(800)).await;
        let behind = gauge(&app, "ratelimiter_policy_cache_lag_seconds").await;
        assert!(behind > 0.3, "behind for {behind} s");
        redis.restart();
        let mut lag = f64::MAX;
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            lag = gauge(&app, "ratelimiter_policy_cache_lag_seconds").await;
            if lag == 0.0 {
                break;
            }
        }
        assert_eq!(lag, 0.0, "current again once the store is back");
    }
}

/// A gauge without labels, of this instance's own exposition: `NaN` when absent.
async fn gauge(app: &TestApp, name: &str) -> f64 {
    let text = app.get("/metrics").await.text().await.expect("metrics");
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(f64::NAN, |v| v.parse().expect("a number"))
}

async fn the_lag_is_zero_when_current(app: &TestApp) {
    app.create_policy(
        json!({"name": "lag-mine", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        gauge(app, "ratelimiter_policy_cache_lag_versions").await,
        0.0
    );
    assert_eq!(
        gauge(app, "ratelimiter_policy_cache_lag_seconds").await,
        0.0
    );
}

/// Tallies answers by `(allowed, decided_by)`.
fn tally(answers: &[Value], allowed: bool, by: &str) -> f64 {
    answers
        .iter()
        .filter(|a| a["allowed"] == allowed && a["decided_by"] == by)
        .count() as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn override_decisions_are_counted_as_decided_by_override() {
    let app = spawn_app(Backend::Embedded).await;
    let p = "metrics-by-override";
    app.create_policy(
        json!({"name": p, "algorithm": "fixed_window", "limit": 2, "window_ms": HOUR_MS}),
    )
    .await;
    for (key, body) in [
        ("vip", json!({"unlimited": true})),
        ("bad", json!({"block": true})),
    ] {
        let mut body = body;
        body["match"] = json!({"key": key});
        let r = app
            .post(&format!("/v1/policies/{p}/overrides"), &body)
            .await;
        assert_eq!(r.status(), 201);
    }
    for _ in 0..5 {
        assert_eq!(app.acquire(p, "vip", 1).await["decided_by"], "override");
    }
    for _ in 0..3 {
        assert_eq!(app.acquire(p, "bad", 1).await["decided_by"], "override");
    }
    assert_eq!(decisions(&app, p, p, "allowed", "override").await, 5.0);
    assert_eq!(decisions(&app, p, p, "denied", "override").await, 3.0);
    assert_eq!(
        near(&app, p, p).await,
        0.0,
        "an override says nothing of what is left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_and_the_denial_cache_are_counted_by_who_decided() {
    clear_of_window_edges(&[HOUR_MS]).await;
    let redis = Arc::new(TestRedis::start());
    let app = spawn_app_with(Some(redis.clone()), &[]).await;
    let p = "metrics-by-cache-and-fail-open";
    app.create_policy(
        json!({"name": p, "algorithm": "fixed_window", "limit": 2, "window_ms": HOUR_MS}),
    )
    .await;
    // Denials repeat from the local cache once it is subscribed to its invalidations.
    let mut answers = Vec::new();
    for _ in 0..60 {
        let a = app.acquire(p, "k", 1).await;
        let cached = a["decided_by"] == "local_cache";
        answers.push(a);
        if cached {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(tally(&answers, false, "local_cache"), 1.0, "{answers:?}");
    let stopping = redis.clone();
    tokio::task::spawn_blocking(move || stopping.stop())
        .await
        .expect("stop");
    // A fresh subject: no cached denial stands in for the store.
    for _ in 0..4 {
        answers.push(app.acquire(p, "fresh", 1).await);
    }
    assert_eq!(tally(&answers, true, "fail_open"), 4.0, "{answers:?}");
    for (allowed, by) in [
        (true, "redis"),
        (false, "redis"),
        (false, "local_cache"),
        (true, "fail_open"),
    ] {
        let outcome = if allowed { "allowed" } else { "denied" };
        assert_eq!(
            decisions(&app, p, p, outcome, by).await,
            tally(&answers, allowed, by),
            "{outcome} by {by}"
        );
    }
    assert_eq!(tally(&answers, true, "redis"), 2.0);
    assert_eq!(near(&app, p, p).await, 1.0, "only the store's 2nd acquire");
}

/// Envoy's descriptors of two policies in one call are decided jointly (one atomic step on the
/// embedded store): each policy's limit is counted, and the one near its limit too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joint_grpc_decisions_are_counted_per_policy_and_limit() {
    clear_of_window_edges(&[HOUR_MS]).await;
    let app = spawn_app_with(None, &[("RATELIMITER__GRPC__BIND", "127.0.0.1:0")]).await;
    for (name, key, limit) in [("metrics-joint-a", "a", 2), ("metrics-joint-b", "b", 100)] {
        app.create_policy(
            json!({"name": name, "algorithm": "fixed_window", "limit": limit,
            "window_ms": HOUR_MS, "descriptor": {"domain": "metrics", "entries": [{"key": key}]}}),
        )
        .await;
    }
    let port = app.grpc_port.expect("gRPC");
    let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .expect("connects");
    let descriptor = |key: &str| RateLimitDescriptor {
        entries: vec![Entry {
            key: key.to_owned(),
            value: "v".to_owned(),
        }],
        ..RateLimitDescriptor::default()
    };
    let mut codes = Vec::new();
    for _ in 0..3 {
        let r = client
            .should_rate_limit(RateLimitRequest {
                domain: "metrics".into(),
                descriptors: vec![descriptor("a"), descriptor("b")],
                hits_addend: 0,
            })
            .await
            .expect("an answer")
            .into_inner();
        codes.push(r.overall_code == Code::Ok as i32);
    }
    assert_eq!(codes, [true, true, false]);
    assert_eq!(
        decisions(
            &app,
            "metrics-joint-a",
            "metrics-joint-a",
            "allowed",
            "embedded"
        )
        .await,
        2.0
    );
    assert_eq!(
        decisions(
            &app,
            "metrics-joint-a",
            "metrics-joint-a",
            "denied",
            "embedded"
        )
        .await,
        1.0
    );
    // `b` admits all three by its own verdict; the third took nothing, all or nothing.
    assert_eq!(
        decisions(
            &app,
            "metrics-joint-b",
            "metrics-joint-b",
            "allowed",
            "embedded"
        )
        .await,
        3.0
    );
    assert_eq!(
        near(&app, "metrics-joint-a", "metrics-joint-a").await,
        1.0,
        "the 2nd left 0 of 2"
    );
    assert_eq!(near(&app, "metrics-joint-b", "metrics-joint-b").await, 0.0);
}
