//! Bad input: every mistake gets a problem+json answer naming the field, never a 5xx, and never
//! changes stored state.

use serde_json::{json, Value};

use crate::helpers::{spawn_app, Backend, TestApp};

crate::on_every_store!(
    bad_acquires_are_answered_with_problems_naming_the_field,
    bad_policy_writes_are_refused_and_change_nothing,
    unknown_routes_are_problems_too,
    the_kinds_of_mistake_are_told_apart_the_same_way_on_every_endpoint,
);

/// Sends a raw body and checks the problem document.
async fn expect_problem(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    body: Vec<u8>,
    status: u16,
    field: Option<&str>,
) -> Value {
    let r = app
        .client
        .request(method.clone(), app.url(path))
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .expect("sent");
    let shown = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
    assert_eq!(r.status(), status, "{method} {path} {shown}");
    assert_eq!(
        r.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/problem+json"),
        "{shown}"
    );
    let problem: Value = r.json().await.expect("problem JSON");
    assert_eq!(problem["status"], status);
    for member in ["type", "title", "detail"] {
        assert!(
            problem[member].as_str().is_some_and(|s| !s.is_empty()),
            "{member} in {problem}"
        );
    }
    if let Some(field) = field {
        assert_eq!(problem["field"], field, "{shown}: {problem}");
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains(field)),
            "the detail names `{field}`: {problem}"
        );
    }
    problem
}

async fn bad_acquires_are_answered_with_problems_naming_the_field(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_policy(json!({"name": "p", "algorithm": "token_bucket", "capacity": 3, "refill_tokens": 1, "refill_period_ms": 1000}))
        .await;
    let post = reqwest::Method::POST;
    let body = |v: Value| serde_json::to_vec(&v).expect("JSON");
    let cases: Vec<(Vec<u8>, u16, Option<&str>)> = vec![
        (b"{".to_vec(), 400, None),
        (b"not json".to_vec(), 400, None),
        (
            b"{\"policy\": \"p\", \"key\": \"k\"} trailing".to_vec(),
            400,
            None,
        ),
        (body(json!([1, 2])), 400, None),
        (body(json!({"policy": 5, "key": "k"})), 400, Some("policy")),
        (body(json!({"policy": "p", "key": ["k"]})), 400, Some("key")),
        (
            body(json!({"policy": "p", "key": "k", "cost": "1"})),
            400,
            Some("cost"),
        ),
        (body(json!({"key": "k"})), 422, Some("policy")),
        (body(json!({"policy": "p"})), 422, Some("key")),
        (
            body(json!({"policy": "p", "key": "k", "colour": "red"})),
            422,
            Some("colour"),
        ),
        (body(json!({"policy": "nope", "key": "k"})), 404, None),
        (body(json!({"policy": "p", "key": ""})), 422, Some("key")),
        (
            body(json!({"policy": "p", "key": "k".repeat(257)})),
            422,
            Some("key"),
        ),
        (
            body(json!({"policy": "p", "key": "k", "cost": 0})),
            422,
            Some("cost"),
        ),
        (
            body(json!({"policy": "p", "key": "k", "cost": -3})),
            422,
            Some("cost"),
        ),
        (
            body(json!({"policy": "p", "key": "k", "cost": 1.5})),
            422,
            Some("cost"),
        ),
        (
            body(json!({"policy": "p", "key": "k", "cost": 4})),
            422,
            Some("cost"),
        ),
        (
            body(json!({"policy": "p", "key": "k", "cost": 18446744073709551615_u64})),
            422,
            Some("cost"),
        ),
        (
            body(json!({"policy": "bad name", "key": "k"})),
            422,
            Some("policy"),
        ),
        (
            body(json!({"policy": "p", "key": "k", "max_wait_ms": -1})),
            422,
            Some("max_wait_ms"),
        ),
        (
            body(json!({"policy": "p", "key": "k", "max_wait_ms": 3_600_001})),
            422,
            Some("max_wait_ms"),
        ),
        (
            body(json!({"policy": "p", "key": "k", "max_wait_ms": 1.5})),
            422,
            Some("max_wait_ms"),
        ),
        (
            body(json!({"policy": "p", "key": "k", "max_wait_ms": "100"})),
            400,
            Some("max_wait_ms"),
        ),
        (vec![b' '; 64 * 1024 + 1], 413, None),
    ];
    for (body, status, field) in cases {
        expect_problem(&app, post.clone(), "/v1/acquire", body, status, field).await;
    }
    // None of that consumed anything: the full capacity is still there.
    assert_eq!(app.acquire("p", "k", 3).await["allowed"], true);
    // A key of exactly 256 bytes is fine.
    assert_eq!(app.acquire("p", &"é".repeat(128), 1).await["allowed"], true);
}

async fn bad_policy_writes_are_refused_and_change_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_policy(
        json!({"name": "keep", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000}),
    )
    .await;
    let before = app.policies().await;
    let ok = json!({"name": "keep", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000});
    let with = |field: &str, value: Value| {
        let mut v = ok.clone();
        v[field] = value;
        v
    };
    let without = |field: &str| {
        let mut v = ok.clone();
        v.as_object_mut().map(|o| o.remove(field));
        v
    };
    let cases: Vec<(Value, u16, Option<&str>)> = vec![
        (json!("a string"), 400, None),
        (with("limit", json!("5")), 400, Some("limit")),
        (with("window_ms", json!(null)), 422, Some("window_ms")),
        (with("limit", json!(0)), 422, Some("limit")),
        (with("limit", json!(1_000_000_001_u64)), 422, Some("limit")),
        (with("limit", json!(-1)), 422, Some("limit")),
        (with("limit", json!(2.5)), 422, Some("limit")),
        (with("window_ms", json!(0)), 422, Some("window_ms")),
        (
            with("window_ms", json!(2_678_400_001_u64)),
            422,
            Some("window_ms"),
        ),
        (
            with("algorithm", json!("leaky_bucket")),
            422,
            Some("algorithm"),
        ),
        (with("algorithm", json!(3)), 400, Some("algorithm")),
        (with("capacity", json!(3)), 422, Some("capacity")),
        (with("colour", json!("red")), 422, Some("colour")),
        (
            with("fail_mode", json!("sometimes")),
            422,
            Some("fail_mode"),
        ),
        (
            with("description", json!("x".repeat(1025))),
            422,
            Some("description"),
        ),
        (with("name", json!("")), 422, Some("name")),
        (with("name", json!("has space")), 422, Some("name")),
        (with("name", json!("-leading")), 422, Some("name")),
        (with("name", json!("a".repeat(65))), 422, Some("name")),
        (without("limit"), 422, Some("limit")),
        (without("algorithm"), 422, Some("algorithm")),
        (
            json!({"name": "keep", "algorithm": "token_bucket", "capacity": 1, "refill_tokens": 1}),
            422,
            Some("refill_period_ms"),
        ),
        (
            json!({"name": "keep", "algorithm": "sliding_window_log", "limit": 10_001, "window_ms": 1}),
            422,
            Some("limit"),
        ),
    ];
    for (policy, status, field) in cases {
        let bytes = serde_json::to_vec(&policy).expect("JSON");
        // As a replacement of the existing policy, and as a new one: both refused.
        expect_problem(
            &app,
            reqwest::Method::PUT,
            "/v1/policies/keep",
            bytes.clone(),
            status,
            field,
        )
        .await;
        let mut new = policy.clone();
        if new.get("name") == Some(&json!("keep")) {
            new["name"] = json!("new-one");
        }
        let bytes = serde_json::to_vec(&new).expect("JSON");
        expect_problem(
            &app,
            reqwest::Method::POST,
            "/v1/policies",
            bytes,
            status,
            field,
        )
        .await;
    }
    let huge = vec![b' '; 64 * 1024 + 1];
    expect_problem(&app, reqwest::Method::POST, "/v1/policies", huge, 413, None).await;
    assert_eq!(
        app.policies().await,
        before,
        "no rejected write changed anything"
    );
}

async fn unknown_routes_are_problems_too(backend: Backend) {
    let app = spawn_app(backend).await;
    expect_problem(
        &app,
        reqwest::Method::GET,
        "/v2/nothing",
        Vec::new(),
        404,
        None,
    )
    .await;
    expect_problem(
        &app,
        reqwest::Method::GET,
        "/v1/policies/no%20such",
        Vec::new(),
        404,
        None,
    )
    .await;
    for (method, path, allow) in [
        (reqwest::Method::GET, "/v1/acquire", "POST"),
        (reqwest::Method::PATCH, "/v1/policies/p", "GET, PUT, DELETE"),
        (reqwest::Method::DELETE, "/v1/policies", "GET, POST"),
    ] {
        let r = app
            .client
            .request(method.clone(), app.url(path))
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), 405, "{method} {path}");
        assert_eq!(
            r.headers().get("allow").and_then(|v| v.to_str().ok()),
            Some(allow)
        );
    }
}

async fn the_kinds_of_mistake_are_told_apart_the_same_way_on_every_endpoint(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_policy(
        json!({"name": "p", "algorithm": "fixed_window", "limit": 1, "window_ms": 1000}),
    )
    .await;
    let kinds = [
        (
            "/v1/acquire",
            json!({"policy": "p", "key": 1}),
            "malformed-field",
        ),
        (
            "/v1/policies",
            json!({"name": "q", "algorithm": "fixed_window", "limit": "1", "window_ms": 1}),
            "malformed-field",
        ),
        ("/v1/acquire", json!({"policy": "p"}), "invalid-field"),
        (
            "/v1/policies",
            json!({"name": "q", "algorithm": "fixed_window", "limit": 1}),
            "invalid-field",
        ),
        (
            "/v1/acquire",
            json!({"policy": "p", "key": "k", "x": 1}),
            "invalid-field",
        ),
        (
            "/v1/policies",
            json!({"name": "q", "algorithm": "fixed_window", "limit": 1, "window_ms": 1, "x": 1}),
            "invalid-field",
        ),
        ("/v1/acquire", json!([1]), "malformed-body"),
        ("/v1/policies", json!([1]), "malformed-body"),
    ];
    for (path, body, kind) in kinds {
        let problem: Value = app.post(path, &body).await.json().await.expect("problem");
        assert_eq!(
            problem["type"],
            format!("urn:ratelimiter:problem:{kind}"),
            "{path} {body}: {problem}"
        );
    }
}
