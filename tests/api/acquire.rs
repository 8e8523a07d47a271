//! `POST /v1/acquire` over HTTP, on every store.

use std::time::Duration;

use futures_util::future::join_all;
use serde_json::json;

use crate::helpers::{policies_of_every_algorithm, spawn_app, Backend};

crate::on_every_store!(
    every_algorithm_allows_up_to_its_limit_then_denies,
    decisions_carry_the_ratelimit_headers,
    denied_acquire_does_not_consume,
    cost_is_taken_all_or_nothing,
    cost_defaults_to_one,
    quota_comes_back_over_real_time,
    exact_admission_under_concurrency,
    subjects_are_independent_whatever_bytes_their_keys_hold,
    changing_a_policys_algorithm_starts_fresh_state,
);

async fn every_algorithm_allows_up_to_its_limit_then_denies(backend: Backend) {
    let app = spawn_app(backend).await;
    for policy in policies_of_every_algorithm("p", 3) {
        app.create_policy(policy.clone()).await;
        let name = policy["name"].as_str().expect("name");
        for left in (0..3).rev() {
            let d = app.acquire(name, "k", 1).await;
            assert_eq!(d["allowed"], true, "{name}: {d}");
            assert_eq!(d["remaining"], left, "{name}: {d}");
            assert_eq!(d["retry_after_ms"], 0, "{name}");
            assert_eq!(d["limit"], 3);
            assert_eq!(d["policy"], name);
            assert_eq!(d["key"], "k");
            assert_eq!(d["degraded"], false);
        }
        let d = app.acquire(name, "k", 1).await;
        assert_eq!(d["allowed"], false, "{name}: {d}");
        assert_eq!(d["remaining"], 0);
        assert!(d["retry_after_ms"].as_u64() > Some(0), "{name}: {d}");
        assert!(
            d["reset_after_ms"].as_u64() >= d["retry_after_ms"].as_u64(),
            "{name}: {d}"
        );
    }
}

async fn decisions_carry_the_ratelimit_headers(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_policy(
        json!({"name": "fw", "algorithm": "fixed_window", "limit": 2, "window_ms": 3_600_000}),
    )
    .await;
    app.create_policy(json!({"name": "tb", "algorithm": "token_bucket", "capacity": 20, "refill_tokens": 10, "refill_period_ms": 1000}))
        .await;

    let r = app
        .post("/v1/acquire", &json!({"policy": "fw", "key": "h"}))
        .await;
    let header = |r: &reqwest::Response, name: &str| {
        r.headers()
            .get(name)
            .map(|v| v.to_str().expect("ASCII header").to_owned())
    };
    assert_eq!(
        header(&r, "ratelimit-policy").as_deref(),
        Some("\"fw\";q=2;w=3600")
    );
    let rl = header(&r, "ratelimit").expect("RateLimit header");
    assert!(rl.starts_with("\"fw\";r=1;t="), "{rl}");
    let t: u64 = rl
        .rsplit('=')
        .next()
        .and_then(|t| t.parse().ok())
        .expect("t is a number");
    assert!((1..=3600).contains(&t), "{rl}");
    assert_eq!(header(&r, "retry-after"), None);
    // Who decided: the store, named.
    let store = match backend {
        Backend::Embedded => "embedded",
        Backend::Redis | Backend::Cluster => "redis",
    };
    assert_eq!(header(&r, "decided-by").as_deref(), Some(store));
    assert_eq!(
        header(&r, "content-type").as_deref(),
        Some("application/json")
    );

    app.acquire("fw", "h", 1).await;
    let r = app
        .post("/v1/acquire", &json!({"policy": "fw", "key": "h"}))
        .await;
    assert_eq!(r.status(), 200, "a denial is an ordinary answer");
    let retry: u64 = header(&r, "retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!((1..=3600).contains(&retry));
    let body: serde_json::Value = r.json().await.expect("JSON");
    assert_eq!(
        retry,
        body["retry_after_ms"].as_u64().expect("ms").div_ceil(1000)
    );

    // A token bucket's window is the time to refill it from empty: 20 tokens at 10/s.
    let r = app
        .post("/v1/acquire", &json!({"policy": "tb", "key": "h"}))
        .await;
    assert_eq!(
        header(&r, "ratelimit-policy").as_deref(),
        Some("\"tb\";q=20;w=2")
    );
    assert_eq!(header(&r, "ratelimit").as_deref(), Some("\"tb\";r=19;t=1"));
}

async fn denied_acquire_does_not_consume(backend: Backend) {
    let app = spawn_app(backend).await;
    for policy in policies_of_every_algorithm("d", 5) {
        app.create_policy(policy.clone()).await;
        let name = policy["name"].as_str().expect("name");
        assert_eq!(app.acquire(name, "k", 4).await["allowed"], true);
        for _ in 0..10 {
            let d = app.acquire(name, "k", 2).await;
            assert_eq!(d["allowed"], false, "{name}");
            assert_eq!(d["remaining"], 1, "{name}: a denial took something: {d}");
        }
        let d = app.acquire(name, "k", 1).await;
        assert_eq!(d["allowed"], true, "{name}: the last unit is still there");
        assert_eq!(d["remaining"], 0);
    }
}

async fn cost_is_taken_all_or_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    for policy in policies_of_every_algorithm("c", 10) {
        app.create_policy(policy.clone()).await;
        let name = policy["name"].as_str().expect("name");
        let d = app.acquire(name, "k", 7).await;
        assert_eq!(
            (d["allowed"].clone(), d["remaining"].clone()),
            (json!(true), json!(3)),
            "{name}"
        );
        let d = app.acquire(name, "k", 4).await;
        assert_eq!(
            (d["allowed"].clone(), d["remaining"].clone()),
            (json!(false), json!(3)),
            "{name}"
        );
        let d = app.acquire(name, "k", 3).await;
        assert_eq!(
            (d["allowed"].clone(), d["remaining"].clone()),
            (json!(true), json!(0)),
            "{name}"
        );
    }
}

async fn cost_defaults_to_one(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_policy(
        json!({"name": "one", "algorithm": "fixed_window", "limit": 5, "window_ms": 60000}),
    )
    .await;
    let r = app
        .post("/v1/acquire", &json!({"policy": "one", "key": "k"}))
        .await;
    let d: serde_json::Value = r.json().await.expect("JSON");
    assert_eq!(d["remaining"], 4);
}

async fn quota_comes_back_over_real_time(backend: Backend) {
    let app = spawn_app(backend).await;
    let policies = [
        json!({"name": "fw", "algorithm": "fixed_window", "limit": 2, "window_ms": 300}),
        json!({"name": "swl", "algorithm": "sliding_window_log", "limit": 2, "window_ms": 300}),
        json!({"name": "swc", "algorithm": "sliding_window_counter", "limit": 2, "window_ms": 300}),
        json!({"name": "tb", "algorithm": "token_bucket", "capacity": 2, "refill_tokens": 1, "refill_period_ms": 150}),
    ];
    for policy in policies {
        app.create_policy(policy.clone()).await;
        let name = policy["name"].as_str().expect("name");
        assert_eq!(app.acquire(name, "k", 2).await["allowed"], true);
        let denied = app.acquire(name, "k", 1).await;
        assert_eq!(denied["allowed"], false, "{name}");
        // Waiting what the service said is enough (plus scheduling slack) must be enough.
        let wait = denied["retry_after_ms"].as_u64().expect("retry_after_ms");
        assert!(wait <= 600, "{name}: {denied}");
        tokio::time::sleep(Duration::from_millis(wait + 20)).await;
        let d = app.acquire(name, "k", 1).await;
        assert_eq!(d["allowed"], true, "{name} after {wait} ms: {d}");
        // And once it is fully reset, the whole quota is back.
        tokio::time::sleep(Duration::from_millis(
            d["reset_after_ms"].as_u64().expect("reset") + 20,
        ))
        .await;
        assert_eq!(
            app.acquire(name, "k", 2).await["allowed"],
            true,
            "{name} after reset"
        );
    }
}

async fn exact_admission_under_concurrency(backend: Backend) {
    let app = spawn_app(backend).await;
    for policy in policies_of_every_algorithm("x", 50) {
        app.create_policy(policy.clone()).await;
        let name = policy["name"].as_str().expect("name").to_owned();
        let requests = (0..200).map(|_| {
            let (client, url, name) = (app.client.clone(), app.url("/v1/acquire"), name.clone());
            tokio::spawn(async move {
                let r = client
                    .post(url)
                    .json(&json!({"policy": name, "key": "hot"}))
                    .send()
                    .await
                    .expect("sent");
                assert_eq!(r.status(), 200);
                let d: serde_json::Value = r.json().await.expect("JSON");
                d["allowed"].as_bool().expect("allowed")
            })
        });
        let allowed = join_all(requests)
            .await
            .into_iter()
            .map(|r| r.expect("task"))
            .filter(|&a| a)
            .count();
        assert_eq!(allowed, 50, "{name}: exactly the limit must be admitted");
    }
}

async fn subjects_are_independent_whatever_bytes_their_keys_hold(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_policy(
        json!({"name": "ind", "algorithm": "fixed_window", "limit": 1, "window_ms": 60000}),
    )
    .await;
    app.create_policy(
        json!({"name": "ind.b", "algorithm": "fixed_window", "limit": 1, "window_ms": 60000}),
    )
    .await;
    let keys = [
        "a", "a}", "{a}", "a:b", "b:a", "%7D", "%", "a%3Ab", "ä", "a\u{0}b", "a\nb", "}{", ":",
        " ", "b",
    ];
    for key in keys {
        let d = app.acquire("ind", key, 1).await;
        assert_eq!(
            d["allowed"], true,
            "key {key:?} shared state with another key"
        );
        assert_eq!(d["key"], key, "the key is echoed unchanged");
    }
    // Policy "ind.b" with key "x" never meets policy "ind" with a key that spells ".b:x".
    assert_eq!(app.acquire("ind", ".b:x", 1).await["allowed"], true);
    assert_eq!(app.acquire("ind.b", "x", 1).await["allowed"], true);
    for key in keys {
        assert_eq!(
            app.acquire("ind", key, 1).await["allowed"],
            false,
            "{key:?}"
        );
    }
}

async fn changing_a_policys_algorithm_starts_fresh_state(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_policy(
        json!({"name": "morph", "algorithm": "fixed_window", "limit": 1, "window_ms": 60000}),
    )
    .await;
    assert_eq!(app.acquire("morph", "k", 1).await["allowed"], true);
    assert_eq!(app.acquire("morph", "k", 1).await["allowed"], false);
    for body in [
        json!({"algorithm": "sliding_window_log", "limit": 1, "window_ms": 60000}),
        json!({"algorithm": "sliding_window_counter", "limit": 1, "window_ms": 60000}),
        json!({"algorithm": "token_bucket", "capacity": 1, "refill_tokens": 1, "refill_period_ms": 60000}),
    ] {
        assert_eq!(app.put("/v1/policies/morph", &body).await.status(), 200);
        // Another algorithm's state (of another Redis type) must never reach this script.
        let d = app.acquire("morph", "k", 1).await;
        assert_eq!(
            d["allowed"], true,
            "after switching to {}: {d}",
            body["algorithm"]
        );
    }
}
