//! The policy REST API, on every store.

use serde_json::{json, Value};

use crate::helpers::{policies_of_every_algorithm, spawn_app, Backend};

crate::on_every_store!(
    policy_lifecycle_create_read_list_replace_delete,
    creating_an_existing_name_conflicts_and_changes_nothing,
    put_creates_or_replaces,
    a_name_in_the_body_must_match_the_path,
    every_algorithm_round_trips,
);

async fn policy_lifecycle_create_read_list_replace_delete(backend: Backend) {
    let app = spawn_app(backend).await;
    let policy = json!({"name": "life", "algorithm": "fixed_window", "limit": 10, "window_ms": 1000, "description": "demo"});
    let r = app.post("/v1/policies", &policy).await;
    assert_eq!(r.status(), 201);
    assert_eq!(
        r.headers().get("location").and_then(|v| v.to_str().ok()),
        Some("/v1/policies/life")
    );
    let created: Value = r.json().await.expect("JSON");
    assert_eq!(
        created["fail_mode"], "open",
        "the default fail mode is shown"
    );
    assert_eq!(created["limit"], 10);

    let r = app.get("/v1/policies/life").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.expect("JSON"), created);

    app.create_policy(json!({"name": "alpha", "algorithm": "token_bucket", "capacity": 1, "refill_tokens": 1, "refill_period_ms": 1}))
        .await;
    let names: Vec<String> = app.policies().await["policies"]
        .as_array()
        .expect("array")
        .iter()
        .map(|p| p["name"].as_str().expect("name").to_owned())
        .collect();
    assert_eq!(names, ["alpha", "life"], "sorted by name");

    let r = app
        .put("/v1/policies/life", &json!({"name": "life", "algorithm": "fixed_window", "limit": 20, "window_ms": 1000, "fail_mode": "closed"}))
        .await;
    assert_eq!(r.status(), 200);
    let got: Value = app
        .get("/v1/policies/life")
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(
        (got["limit"].clone(), got["fail_mode"].clone()),
        (json!(20), json!("closed"))
    );
    assert!(
        got.get("description").is_none(),
        "PUT replaces the whole policy"
    );
    assert_eq!(
        app.acquire("life", "k", 1).await["remaining"],
        19,
        "the new limit is in force"
    );

    assert_eq!(app.delete("/v1/policies/life").await.status(), 204);
    assert_eq!(app.get("/v1/policies/life").await.status(), 404);
    assert_eq!(app.delete("/v1/policies/life").await.status(), 404);
    let r = app
        .post("/v1/acquire", &json!({"policy": "life", "key": "k"}))
        .await;
    assert_eq!(r.status(), 404, "a deleted policy decides nothing");
}

async fn creating_an_existing_name_conflicts_and_changes_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    let policy = json!({"name": "dup", "algorithm": "fixed_window", "limit": 1, "window_ms": 1000});
    app.create_policy(policy.clone()).await;
    let before = app.policies().await;
    let r = app
        .post(
            "/v1/policies",
            &json!({"name": "dup", "algorithm": "fixed_window", "limit": 99, "window_ms": 1000}),
        )
        .await;
    assert_eq!(r.status(), 409);
    let problem: Value = r.json().await.expect("JSON");
    assert_eq!(problem["status"], 409);
    assert_eq!(app.policies().await, before);
}

async fn put_creates_or_replaces(backend: Backend) {
    let app = spawn_app(backend).await;
    let body = json!({"algorithm": "sliding_window_counter", "limit": 5, "window_ms": 1000});
    let r = app.put("/v1/policies/fresh", &body).await;
    assert_eq!(r.status(), 201);
    assert_eq!(
        r.headers().get("location").and_then(|v| v.to_str().ok()),
        Some("/v1/policies/fresh")
    );
    assert_eq!(r.json::<Value>().await.expect("JSON")["name"], "fresh");
    assert_eq!(app.put("/v1/policies/fresh", &body).await.status(), 200);
}

async fn a_name_in_the_body_must_match_the_path(backend: Backend) {
    let app = spawn_app(backend).await;
    let r = app
        .put(
            "/v1/policies/one",
            &json!({"name": "two", "algorithm": "fixed_window", "limit": 1, "window_ms": 1}),
        )
        .await;
    assert_eq!(r.status(), 422);
    let problem: Value = r.json().await.expect("JSON");
    assert_eq!(problem["field"], "name");
    assert_eq!(app.get("/v1/policies/one").await.status(), 404);
    assert_eq!(app.get("/v1/policies/two").await.status(), 404);
}

async fn every_algorithm_round_trips(backend: Backend) {
    let app = spawn_app(backend).await;
    for mut policy in policies_of_every_algorithm("rt", 7) {
        policy["fail_mode"] = json!("closed");
        policy["mode"] = json!("shadow");
        policy["description"] = json!("round trip ✓");
        app.create_policy(policy.clone()).await;
        let path = format!("/v1/policies/{}", policy["name"].as_str().expect("name"));
        assert_eq!(
            app.get(&path).await.json::<Value>().await.expect("JSON"),
            policy
        );
    }
}
