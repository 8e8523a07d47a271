//! A smoke test of the lease endpoints on the embedded store: take, renew, release, and the
//! refusals between rate and concurrency policies. The full behaviour, on every store, is in
//! `leases`.

use serde_json::json;

use crate::helpers::{spawn_app, Backend};

#[tokio::test]
async fn a_lease_is_taken_renewed_and_released_on_the_embedded_store() {
    let app = spawn_app(Backend::Embedded).await;
    app.create_policy(
        json!({"name": "exports", "algorithm": "concurrency", "limit": 2, "lease_ms": 60000}),
    )
    .await;
    let policy = app.get("/v1/policies/exports").await;
    assert_eq!(policy.status(), 200);
    assert_eq!(
        policy.json::<serde_json::Value>().await.expect("JSON"),
        json!({"name": "exports", "algorithm": "concurrency", "limit": 2, "lease_ms": 60000, "max_lease_ms": 60000, "fail_mode": "open", "mode": "enforce"})
    );

    // Take: 201, with the lease's URL and the headers.
    let r = app
        .post(
            "/v1/leases",
            &json!({"policy": "exports", "key": "customer-7", "cost": 1}),
        )
        .await;
    assert_eq!(r.status(), 201);
    let header = |r: &reqwest::Response, name: &str| {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    assert_eq!(
        header(&r, "ratelimit-policy").as_deref(),
        Some("\"exports\";q=2;qu=\"concurrent-requests\"")
    );
    assert_eq!(header(&r, "ratelimit").as_deref(), Some("\"exports\";r=1"));
    assert_eq!(header(&r, "decided-by").as_deref(), Some("embedded"));
    let location = header(&r, "location").expect("Location");
    let taken: serde_json::Value = r.json().await.expect("JSON");
    let lease = taken["lease"].as_str().expect("a lease id").to_owned();
    assert_eq!(location, format!("/v1/leases/{lease}"));
    assert_eq!(taken["allowed"], true, "{taken}");
    assert_eq!(taken["in_use"], 1, "{taken}");
    assert_eq!(taken["remaining"], 1, "{taken}");
    assert_eq!(taken["expires_in_ms"], 60000, "{taken}");
    assert_eq!(taken["retry_after_ms"], 0, "{taken}");

    // A second of cost 1 fits; a third does not: 200, denied, with Retry-After.
    let second = app
        .post(
            "/v1/leases",
            &json!({"policy": "exports", "key": "customer-7", "lease_ms": 1000}),
        )
        .await;
    assert_eq!(second.status(), 201);
    let denied = app
        .post(
            "/v1/leases",
            &json!({"policy": "exports", "key": "customer-7"}),
        )
        .await;
    assert_eq!(denied.status(), 200);
    assert!(header(&denied, "retry-after").is_some());
    let denied: serde_json::Value = denied.json().await.expect("JSON");
    assert_eq!(denied["allowed"], false, "{denied}");
    assert!(denied.get("lease").is_none(), "{denied}");
    assert_eq!(denied["expires_in_ms"], 0, "{denied}");
    assert!(denied["retry_after_ms"].as_u64() > Some(0), "{denied}");

    // Renew, with and without a body.
    let r = app
        .post(&format!("{location}/renew"), &json!({"lease_ms": 5000}))
        .await;
    assert_eq!(r.status(), 200);
    let renewed: serde_json::Value = r.json().await.expect("JSON");
    assert_eq!(renewed["lease"], lease.as_str(), "{renewed}");
    assert_eq!(renewed["expires_in_ms"], 5000, "{renewed}");
    assert_eq!(renewed["in_use"], 2, "{renewed}");
    let r = app
        .client
        .post(app.url(&format!("{location}/renew")))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 200);

    // Release: 204, twice; then the lease is unknown, and its slot free again.
    for _ in 0..2 {
        assert_eq!(app.delete(&location).await.status(), 204);
    }
    let r = app.post(&format!("{location}/renew"), &json!({})).await;
    assert_eq!(r.status(), 404);
    let problem: serde_json::Value = r.json().await.expect("JSON");
    assert_eq!(problem["type"], "urn:ratelimiter:problem:unknown-lease");
    let again = app
        .post(
            "/v1/leases",
            &json!({"policy": "exports", "key": "customer-7"}),
        )
        .await;
    assert_eq!(again.status(), 201);

    // Other methods: 405 naming the ones each path takes.
    for (method, path, allow) in [
        (reqwest::Method::GET, "/v1/leases", "POST"),
        (reqwest::Method::GET, location.as_str(), "DELETE"),
        (
            reqwest::Method::DELETE,
            &format!("{location}/renew"),
            "POST",
        ),
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
            Some(allow),
            "{method} {path}"
        );
    }

    // A malformed id: 404 for both.
    assert_eq!(app.delete("/v1/leases/not-a-lease").await.status(), 404);
    assert_eq!(
        app.post("/v1/leases/not-a-lease/renew", &json!({}))
            .await
            .status(),
        404
    );
}

#[tokio::test]
async fn rate_and_concurrency_policies_refuse_each_others_calls() {
    let app = spawn_app(Backend::Embedded).await;
    app.create_policy(
        json!({"name": "c", "algorithm": "concurrency", "limit": 2, "lease_ms": 60000}),
    )
    .await;
    app.create_policy(
        json!({"name": "r", "algorithm": "fixed_window", "limit": 2, "window_ms": 60000}),
    )
    .await;
    for path in ["/v1/acquire", "/v1/peek", "/v1/report", "/v1/refund"] {
        // (A reset of a concurrency policy's subject ends its leases: `lease_hardening`.)
        let body = json!({"policy": "c", "key": "k", "cost": 1});
        let r = app.post(path, &body).await;
        assert_eq!(r.status(), 422, "{path}");
        let problem: serde_json::Value = r.json().await.expect("JSON");
        assert_eq!(problem["field"], "policy", "{path}: {problem}");
    }
    let r = app
        .post("/v1/leases", &json!({"policy": "r", "key": "k"}))
        .await;
    assert_eq!(r.status(), 422);
    let problem: serde_json::Value = r.json().await.expect("JSON");
    assert_eq!(problem["field"], "policy", "{problem}");
    let r = app
        .post("/v1/leases", &json!({"policy": "c", "key": "k", "cost": 3}))
        .await;
    assert_eq!(r.status(), 422);
    let problem: serde_json::Value = r.json().await.expect("JSON");
    assert_eq!(problem["field"], "cost", "{problem}");
}

#[tokio::test]
async fn leases_on_redis_and_by_each_fail_mode_while_redis_is_down() {
    let redis = std::sync::Arc::new(crate::helpers::TestRedis::start());
    let app = crate::helpers::spawn_app_with(
        Some(redis.clone()),
        &[("RATELIMITER__REDIS__TIMEOUT_MS", "300")],
    )
    .await;
    for mode in ["open", "closed", "local"] {
        app.create_policy(json!({"name": mode, "algorithm": "concurrency", "limit": 1, "lease_ms": 60000, "fail_mode": mode}))
            .await;
    }
    let take = |policy: &'static str| {
        let app = &app;
        async move {
            app.post("/v1/leases", &json!({"policy": policy, "key": "k"}))
                .await
        }
    };
    // On Redis: one lease each, and it is held.
    let mut held = Vec::new();
    for mode in ["open", "closed", "local"] {
        let r = take(mode).await;
        assert_eq!(r.status(), 201, "{mode}");
        let body: serde_json::Value = r.json().await.expect("JSON");
        assert_eq!(body["decided_by"], "redis", "{body}");
        held.push(body["lease"].as_str().expect("id").to_owned());
        let denied: serde_json::Value = take(mode).await.json().await.expect("JSON");
        assert_eq!(denied["allowed"], false, "{denied}");
    }

    redis.kill();
    // open: granted, renewed and released without the store, visibly degraded.
    let r = take("open").await;
    assert_eq!(r.status(), 201);
    assert!(
        r.headers().get("ratelimit").is_none(),
        "nothing was counted"
    );
    let open: serde_json::Value = r.json().await.expect("JSON");
    assert_eq!(
        (&open["decided_by"], &open["degraded"]),
        (&json!("fail_open"), &json!(true))
    );
    let id = open["lease"].as_str().expect("id").to_owned();
    let r = app
        .post(&format!("/v1/leases/{id}/renew"), &json!({}))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(app.delete(&format!("/v1/leases/{id}")).await.status(), 204);
    // closed: 503 for all three.
    assert_eq!(take("closed").await.status(), 503);
    let closed = &held[1];
    assert_eq!(
        app.post(&format!("/v1/leases/{closed}/renew"), &json!({}))
            .await
            .status(),
        503
    );
    assert_eq!(
        app.delete(&format!("/v1/leases/{closed}")).await.status(),
        503
    );
    // local: this instance's own limit of 1.
    let r = take("local").await;
    assert_eq!(r.status(), 201);
    let local: serde_json::Value = r.json().await.expect("JSON");
    assert_eq!(local["decided_by"], "fail_local", "{local}");
    let denied: serde_json::Value = take("local").await.json().await.expect("JSON");
    assert_eq!(
        (&denied["allowed"], &denied["decided_by"]),
        (&json!(false), &json!("fail_local"))
    );
}
