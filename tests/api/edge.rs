//! The HTTP edge under hostile clients: Authorization headers, `/metrics` behind a token,
//! repeated JSON keys.

use serde_json::{json, Value};

use crate::helpers::{spawn_app_with, TestApp};

async fn acquire_with(app: &TestApp, authorization: &[&str]) -> reqwest::Response {
    let mut request = app
        .client
        .post(app.url("/v1/acquire"))
        .json(&json!({"policy": "edge-auth", "key": "k"}));
    for value in authorization {
        request = request.header("Authorization", *value);
    }
    request.send().await.expect("sent")
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_is_case_insensitive() {
    let app = spawn_app_with(None, &[("RATELIMITER__AUTH__CLIENT_TOKENS", "edge-token")]).await;
    app.create_policy(json!({"name": "edge-auth", "algorithm": "fixed_window", "limit": 100, "window_ms": 60_000}))
        .await;
    for value in [
        "Bearer edge-token",
        "bearer edge-token",
        "BEARER edge-token",
    ] {
        let r = acquire_with(&app, &[value]).await;
        assert_eq!(r.status(), 200, "{value}");
    }
    for value in ["Basic edge-token", "bearer other", "bearer"] {
        let r = acquire_with(&app, &[value]).await;
        let p = problem(r, 401).await;
        assert_eq!(p["type"], "urn:ratelimiter:problem:unauthorized", "{value}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_authorization_headers_are_refused() {
    let app = spawn_app_with(None, &[("RATELIMITER__AUTH__CLIENT_TOKENS", "edge-token")]).await;
    app.create_policy(json!({"name": "edge-auth", "algorithm": "fixed_window", "limit": 100, "window_ms": 60_000}))
        .await;
    for values in [
        ["Bearer edge-token", "Bearer wrong"],
        ["Bearer wrong", "Bearer edge-token"],
        ["Bearer edge-token", "Bearer edge-token"],
    ] {
        let r = acquire_with(&app, &values).await;
        assert!(r.headers().contains_key("www-authenticate"));
        let p = problem(r, 401).await;
        assert!(
            p["detail"]
                .as_str()
                .is_some_and(|d| d.contains("more than one Authorization header")),
            "{p}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_can_be_put_behind_a_token() {
    let app = spawn_app_with(
        None,
        &[
            ("RATELIMITER__AUTH__METRICS_TOKENS", "scrape-1,scrape-2"),
            ("RATELIMITER__AUTH__CLIENT_TOKENS", "edge-token"),
        ],
    )
    .await;
    let metrics = |auth: Option<&'static str>| {
        let mut request = app.client.get(app.url("/metrics"));
        if let Some(a) = auth {
            request = request.header("Authorization", a);
        }
        request.send()
    };
    for auth in [None, Some("Bearer edge-token"), Some("Bearer scrape-3")] {
        let r = metrics(auth).await.expect("sent");
        assert!(r.headers().contains_key("www-authenticate"), "{auth:?}");
        problem(r, 401).await;
    }
    for auth in ["Bearer scrape-1", "bearer scrape-2"] {
        let r = metrics(Some(auth)).await.expect("sent");
        assert_eq!(r.status(), 200, "{auth}");
    }
    // Without the setting, /metrics stays open.
    let open = spawn_app_with(None, &[]).await;
    assert_eq!(open.get("/metrics").await.status(), 200);
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
