//! The HTTP edge under hostile clients: repeated JSON keys.

use serde_json::{json, Value};

use crate::helpers::{spawn_app_with, TestApp};

async fn problem(r: reqwest::Response, status: u16) -> Value {
    assert_eq!(r.status(), status);
    assert_eq!(
        r.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/problem+json")
    );
    r.json().await.expect("problem JSON")
}

/// Sends `body` as is (the JSON a client library would never produce).
async fn send_json_text(app: &TestApp, method: reqwest::Method, path: &str, body: &str) -> Value {
    let r = app
        .client
        .request(method, app.url(path))
        .header("Content-Type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .expect("sent");
    problem(r, 400).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_repeated_in_a_body_is_refused_at_any_depth() {
    let app = spawn_app_with(None, &[]).await;
    let p = send_json_text(
        &app,
        reqwest::Method::POST,
        "/v1/policies",
        r#"{"name": "edge-dup", "algorithm": "fixed_window", "limit": 1, "limit": 1000000, "window_ms": 60000}"#,
    )
    .await;
    assert_eq!(p["type"], "urn:ratelimiter:problem:malformed-field", "{p}");
    assert_eq!(p["field"], "limit", "{p}");
    assert_eq!(app.get("/v1/policies/edge-dup").await.status(), 404);

    app.create_policy(
        json!({"name": "edge-dup", "algorithm": "fixed_window", "limit": 1, "window_ms": 60_000}),
    )
    .await;
    let p = send_json_text(
        &app,
        reqwest::Method::PUT,
        "/v1/policies/edge-dup",
        r#"{"algorithm": "fixed_window", "limit": 1000000, "window_ms": 60000, "limit": 1000000}"#,
    )
    .await;
    assert_eq!(p["field"], "limit", "{p}");
    let p = send_json_text(
        &app,
        reqwest::Method::PUT,
        "/v1/policies/edge-dup",
        r#"{"algorithm": "fixed_window", "limit": 5, "window_ms": 60000, "x": [{"y": {"z": 1, "z": 2}}]}"#,
    )
    .await;
    assert_eq!(p["field"], "x[0].y.z", "{p}");
    let policy: Value = app
        .get("/v1/policies/edge-dup")
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(policy["limit"], 1, "the refused writes changed nothing");

    let p = send_json_text(
        &app,
        reqwest::Method::POST,
        "/v1/acquire",
        r#"{"policy": "edge-dup", "key": "a", "key": "b"}"#,
    )
    .await;
    assert_eq!(p["field"], "key", "{p}");
}
