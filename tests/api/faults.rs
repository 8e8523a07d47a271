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
    let d = app.acquire("lenient", "k", 2).await;
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
