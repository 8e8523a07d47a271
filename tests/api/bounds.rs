//! Bounds on what the service keeps: the embedded store's cap on subjects
//! (`limits.max_embedded_subjects`), on the main embedded store and on the one `local` fail mode
//! decides with while Redis is down.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::helpers::{spawn_app_with, TestApp, TestRedis};

fn window_policy(name: &str, fail_mode: &str) -> Value {
    json!({"name": name, "algorithm": "fixed_window", "limit": 1, "window_ms": 3_600_000, "fail_mode": fail_mode})
}

/// `ratelimiter_embedded_store_full_total` as `/metrics` shows it (0 before the first refusal).
async fn refusals(app: &TestApp) -> u64 {
    let text = app.get("/metrics").await.text().await.expect("metrics");
    text.lines()
        .find_map(|l| l.strip_prefix("ratelimiter_embedded_store_full_total "))
        .map_or(0, |v| v.trim().parse::<f64>().expect("a number") as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_embedded_store_answers_new_subjects_by_fail_mode_and_keeps_deciding_for_the_others()
{
    let app = spawn_app_with(None, &[("RATELIMITER__LIMITS__MAX_EMBEDDED_SUBJECTS", "3")]).await;
    app.create_policy(window_policy("open", "open")).await;
    app.create_policy(window_policy("closed", "closed")).await;
    let before = refusals(&app).await;

    for k in ["a", "b", "c"] {
        let d = app.acquire("open", k, 1).await;
        assert_eq!(
            (&d["allowed"], &d["degraded"]),
            (&json!(true), &json!(false)),
            "{d}"
        );
    }
    // Full: a new subject gets no state, and its policy's fail mode answers.
    for _ in 0..2 {
        let d = app.acquire("open", "d", 1).await;
        assert_eq!(
            (&d["allowed"], &d["degraded"]),
            (&json!(true), &json!(true)),
            "{d}"
        );
    }
    let r = app
        .post("/v1/acquire", &json!({"policy": "closed", "key": "a"}))
        .await;
    assert_eq!(r.status(), 503);
    assert_eq!(
        r.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/problem+json")
    );
    let body: Value = r.json().await.expect("JSON");
    assert_eq!(
        body["type"], "urn:ratelimiter:problem:store-unavailable",
        "{body}"
    );
    // Subjects with state still decide exactly.
    let d = app.acquire("open", "a", 1).await;
    assert_eq!(
        (&d["allowed"], &d["degraded"]),
        (&json!(false), &json!(false)),
        "{d}"
    );

    assert!(
        refusals(&app).await >= before + 3,
        "every refusal is counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_local_store_allows_new_subjects_as_open_does() {
    let redis = Arc::new(TestRedis::start());
    let app = spawn_app_with(
        Some(redis.clone()),
        &[("RATELIMITER__LIMITS__MAX_EMBEDDED_SUBJECTS", "2")],
    )
    .await;
    app.create_policy(window_policy("local", "local")).await;
    redis.kill();

    // Two subjects fit in the local store: decided there, exactly (a limit of 1).
    for k in ["a", "b"] {
        let d = app.acquire("local", k, 1).await;
        assert_eq!(
            (&d["allowed"], &d["degraded"]),
            (&json!(true), &json!(true)),
            "{d}"
        );
        let d = app.acquire("local", k, 1).await;
        assert_eq!(
            (&d["allowed"], &d["degraded"]),
            (&json!(false), &json!(true)),
            "{d}"
        );
    }
    // A third finds it full: allowed, as `open` would, every time.
    for _ in 0..2 {
        let d = app.acquire("local", "c", 1).await;
        assert_eq!(
            (&d["allowed"], &d["degraded"]),
            (&json!(true), &json!(true)),
            "{d}"
        );
    }
}
