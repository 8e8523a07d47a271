//! Several service instances sharing one Redis share exact limits and see each other's policy
//! changes; policies from the configuration file are created once and never overwrite the API's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use serde_json::{json, Value};

use crate::helpers::{
    policies_of_every_algorithm, spawn_app_on_cluster, spawn_app_with, spawn_app_with_file,
    TestApp, TestCluster, TestRedis,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_share_one_exact_limit() {
    let redis = Arc::new(TestRedis::start());
    // One instance of each connection mode: both must be exact.
    let a = spawn_app_with(
        Some(redis.clone()),
        &[("RATELIMITER__REDIS__CONNECTION_MODE", "multiplexed")],
    )
    .await;
    let b = spawn_app_with(
        Some(redis.clone()),
        &[("RATELIMITER__REDIS__CONNECTION_MODE", "pool")],
    )
    .await;
    for policy in policies_of_every_algorithm("shared", 50) {
        a.create_policy(policy.clone()).await;
        let name = policy["name"].as_str().expect("name").to_owned();
        let requests = (0..200).map(|i| {
            let app = if i % 2 == 0 { &a } else { &b };
            let (client, url, name) = (app.client.clone(), app.url("/v1/acquire"), name.clone());
            tokio::spawn(async move {
                let r = client
                    .post(url)
                    .json(&json!({"policy": name, "key": "k"}))
                    .send()
                    .await
                    .expect("sent");
                r.json::<Value>().await.expect("JSON")["allowed"] == true
            })
        });
        let allowed = join_all(requests)
            .await
            .into_iter()
            .filter(|r| matches!(r, Ok(true)))
            .count();
        assert_eq!(
            allowed, 50,
            "{name}: both instances together admit exactly the limit"
        );
    }
}

/// Polls `check` until it holds, for at most `limit`; returns how long it took.
pub async fn within<F, Fut>(limit: Duration, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "not in force within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_changes_reach_the_other_instance_within_a_second() {
    let redis = Arc::new(TestRedis::start());
    let refresh = [("RATELIMITER__REDIS__POLICY_REFRESH_MS", "250")];
    let a = spawn_app_with(Some(redis.clone()), &refresh).await;
    let b = spawn_app_with(Some(redis.clone()), &refresh).await;
    policy_changes_reach(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_changes_reach_the_other_instance_on_a_cluster_within_a_second() {
    let cluster = Arc::new(TestCluster::start());
    let refresh = [("RATELIMITER__REDIS__POLICY_REFRESH_MS", "250")];
    let a = spawn_app_on_cluster(cluster.clone(), &refresh).await;
    let b = spawn_app_on_cluster(cluster.clone(), &refresh).await;
    policy_changes_reach(&a, &b).await;
}

/// Changes made through `a` are in force on `b` within a second.
async fn policy_changes_reach(a: &TestApp, b: &TestApp) {
    // Created on A: B decides with it within a second (a miss waits for a refresh, unless one
    // started in the last 50 ms).
    a.create_policy(
        json!({"name": "moving", "algorithm": "fixed_window", "limit": 1, "window_ms": 3_600_000}),
    )
    .await;
    within(Duration::from_secs(1), || async {
        b.post("/v1/acquire", &json!({"policy": "moving", "key": "k"}))
            .await
            .status()
            == 200
    })
    .await;
    assert_eq!(b.acquire("moving", "k", 1).await["allowed"], false);

    // Raised on A: B admits again within a second.
    let r = a
        .put(
            "/v1/policies/moving",
            &json!({"algorithm": "fixed_window", "limit": 100, "window_ms": 3_600_000}),
        )
        .await;
    assert_eq!(r.status(), 200);
    within(Duration::from_secs(1), || async {
        b.acquire("moving", "k", 1).await["limit"] == 100
    })
    .await;

    // Deleted on A: B stops deciding with it within a second.
    assert_eq!(a.delete("/v1/policies/moving").await.status(), 204);
    within(Duration::from_secs(1), || async {
        b.post("/v1/acquire", &json!({"policy": "moving", "key": "k"}))
            .await
            .status()
            == 404
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_policies_are_created_once_and_never_overwrite_the_apis() {
    let redis = Arc::new(TestRedis::start());
    let path = std::env::temp_dir().join(format!("ratelimiter-test-{}.toml", std::process::id()));
    std::fs::write(
        &path,
        "[[policies]]\nname = \"from-file\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow_ms = 1000\n",
    )
    .expect("write config");
    let a = spawn_app_with_file(Some(redis.clone()), &[], Some(&path)).await;
    let got: Value = a
        .get("/v1/policies/from-file")
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(got["limit"], 5);

    let r = a
        .put(
            "/v1/policies/from-file",
            &json!({"algorithm": "fixed_window", "limit": 9, "window_ms": 1000}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let b = spawn_app_with_file(Some(redis.clone()), &[], Some(&path)).await;
    let got: Value = b
        .get("/v1/policies/from-file")
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(
        got["limit"], 9,
        "a restart must not undo a change made through the API"
    );
    let _ = std::fs::remove_file(&path);
}
