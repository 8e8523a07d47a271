//! Redis going away: each policy answers by its fail mode, quickly, and the process stays up.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::{spawn_app_with, TestRedis};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_gone_policies_answer_by_their_fail_mode() {
    let redis = Arc::new(TestRedis::start());
    let app = spawn_app_with(
        Some(redis.clone()),
        &[("RATELIMITER__REDIS__TIMEOUT_MS", "200")],
    )
    .await;
    app.create_policy(json!({"name": "lenient", "algorithm": "token_bucket", "capacity": 5, "refill_tokens": 1, "refill_period_ms": 1000, "fail_mode": "open"}))
        .await;
    app.create_policy(json!({"name": "strict", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000, "fail_mode": "closed"}))
        .await;
    assert_eq!(app.acquire("lenient", "k", 1).await["degraded"], false);
    assert_eq!(app.acquire("strict", "k", 1).await["allowed"], true);

    redis.kill();

    let start = Instant::now();
    let r = app
        .post(
            "/v1/acquire",
            &json!({"policy": "lenient", "key": "k", "cost": 2}),
        )
        .await;
    assert!(
        r.headers().get("ratelimit").is_none(),
        "nothing was counted, so no quota is claimed"
    );
    assert!(r.headers().get("ratelimit-policy").is_some());
    let d: Value = r.json().await.expect("JSON");
    assert_eq!(
        (d["allowed"].clone(), d["degraded"].clone()),
        (json!(true), json!(true)),
        "{d}"
    );
    assert_eq!(d["remaining"], 3, "reported as if the subject were fresh");

    let r = app
        .post("/v1/acquire", &json!({"policy": "strict", "key": "k"}))
        .await;
    assert_eq!(r.status(), 503);
    assert_eq!(
        r.headers().get("retry-after").and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let problem: Value = r.json().await.expect("problem");
    assert_eq!(problem["type"], "urn:ratelimiter:problem:store-unavailable");

    let r = app
        .post(
            "/v1/policies",
            &json!({"name": "later", "algorithm": "fixed_window", "limit": 1, "window_ms": 1}),
        )
        .await;
    assert_eq!(r.status(), 503, "a write that cannot be stored is refused");
    assert_eq!(app.get("/readyz").await.status(), 503);
    assert_eq!(
        app.get("/healthz").await.status(),
        200,
        "the process itself is fine"
    );
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "answers come within the store deadline, not after long retries: {:?}",
        start.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_redis_restarts_decisions_come_back_without_restarting_the_service() {
    // Persistence on, as in production, so the policy survives the restart.
    let dir = std::env::temp_dir().join(format!("ratelimiter-restart-{}", std::process::id()));
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
    let app = spawn_app_with(
        Some(redis.clone()),
        &[("RATELIMITER__REDIS__TIMEOUT_MS", "200")],
    )
    .await;
    app.create_policy(json!({"name": "strict", "algorithm": "fixed_window", "limit": 3, "window_ms": 3_600_000, "fail_mode": "closed"}))
        .await;
    // Warm every pooled connection, and the script cache, before the restart.
    for _ in 0..20 {
        let _ = app.acquire("strict", "warm", 1).await;
    }

    redis.restart();

    // The pool drops its dead connections and Redis gets the script again (NOSCRIPT).
    let start = Instant::now();
    loop {
        let r = app
            .post("/v1/acquire", &json!({"policy": "strict", "key": "k"}))
            .await;
        if r.status() == 200 {
            let d: Value = r.json().await.expect("JSON");
            assert_eq!(d["allowed"], true);
            break;
        }
        assert_eq!(r.status(), 503, "a failure answers by fail mode closed");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "Redis never came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Exact limits again.
    assert_eq!(app.acquire("strict", "k", 1).await["remaining"], 1);
    assert_eq!(app.acquire("strict", "k", 1).await["remaining"], 0);
    assert_eq!(app.acquire("strict", "k", 1).await["allowed"], false);
    assert_eq!(app.get("/readyz").await.status(), 200);
    drop(app);
    let _ = std::fs::remove_dir_all(&dir);
}
