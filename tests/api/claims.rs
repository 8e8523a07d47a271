//! Policy writes that must be decided by the store in one step, whatever the instances race:
//! an Envoy descriptor shape is served by one policy only, and a policy that changes kind starts
//! a new incarnation, so a concurrency policy's old leases never come back.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::helpers::{spawn_app, spawn_app_on_cluster, spawn_app_with, Backend, TestApp};
use crate::helpers::{TestCluster, TestRedis};

/// Rounds of the race: before the store claimed shapes, both creates succeeded in most rounds.
const ROUNDS: usize = 20;

fn served(name: &str, limit: u64, key: &str) -> Value {
    json!({
        "name": name, "algorithm": "token_bucket", "capacity": limit, "refill_tokens": 1, "refill_period_ms": 60_000,
        "descriptor": {"domain": "race", "entries": [{"key": key}]}
    })
}

/// Two instances create two differently named policies with one shape at the same moment, many
/// times: each time exactly one wins, the other is told which policy serves the shape, and the
/// winner's limit can still be changed (a `PUT` keeping its own shape is never refused).
async fn racing_creates_of_one_shape_have_one_winner(a: TestApp, b: TestApp) {
    for round in 0..ROUNDS {
        let key = format!("k{round}");
        let (first, second) = (format!("ra-{round}"), format!("rb-{round}"));
        let (da, db) = (served(&first, 5, &key), served(&second, 5, &key));
        let (ra, rb) = tokio::join!(a.post("/v1/policies", &da), b.post("/v1/policies", &db));
        let statuses = (ra.status().as_u16(), rb.status().as_u16());
        let (winner, loser, refused) = match statuses {
            (201, 409) => (&first, &second, rb),
            (409, 201) => (&second, &first, ra),
            other => panic!("round {round}: exactly one create wins, got {other:?}"),
        };
        let problem: Value = refused.json().await.expect("problem");
        assert_eq!(
            problem["type"], "urn:ratelimiter:problem:descriptor-claimed",
            "{problem}"
        );
        assert_eq!(problem["field"], "descriptor", "{problem}");
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains(winner.as_str())),
            "the refusal names the policy that serves the shape: {problem}"
        );
        assert_eq!(a.get(&format!("/v1/policies/{loser}")).await.status(), 404);
        for app in [&a, &b] {
            let put = app
                .put(&format!("/v1/policies/{winner}"), &served(winner, 6, &key))
                .await;
            assert_eq!(
                put.status(),
                200,
                "round {round}: the live limit can change"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_two_instances_racing_for_one_descriptor_shape_never_both_win() {
    let redis = Arc::new(TestRedis::start());
    let a = spawn_app_with(Some(redis.clone()), &[]).await;
    let b = spawn_app_with(Some(redis.clone()), &[]).await;
    racing_creates_of_one_shape_have_one_winner(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_two_instances_racing_for_one_descriptor_shape_never_both_win() {
    let cluster = Arc::new(TestCluster::start());
    let a = spawn_app_on_cluster(cluster.clone(), &[]).await;
    let b = spawn_app_on_cluster(cluster.clone(), &[]).await;
    racing_creates_of_one_shape_have_one_winner(a, b).await;
}

/// A shape given up, by a deletion or by a policy that now serves another, is free for others.
async fn a_shape_given_up_is_free_again(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_policy(served("first", 5, "a")).await;
    assert_eq!(
        app.post("/v1/policies", &served("second", 5, "a"))
            .await
            .status(),
        409
    );
    // `first` moves to another shape: its old one is free.
    assert_eq!(
        app.put("/v1/policies/first", &served("first", 5, "b"))
            .await
            .status(),
        200
    );
    app.create_policy(served("second", 5, "a")).await;
    assert_eq!(
        app.post("/v1/policies", &served("third", 5, "b"))
            .await
            .status(),
        409,
        "`first` claims its new shape"
    );
    assert_eq!(app.delete("/v1/policies/first").await.status(), 204);
    app.create_policy(served("third", 5, "b")).await;
}

crate::on_every_store!(
    a_shape_given_up_is_free_again,
    a_kind_flip_forgets_the_leases
);

/// A concurrency policy replaced by a rate policy and back is a new policy: the leases taken
/// before are gone (their ids do not renew), and the whole limit can be taken again.
async fn a_kind_flip_forgets_the_leases(backend: Backend) {
    let app = spawn_app(backend).await;
    let concurrency =
        json!({"name": "flip", "algorithm": "concurrency", "limit": 1, "lease_ms": 60_000});
    app.create_policy(concurrency.clone()).await;
    let ask = json!({"policy": "flip", "key": "k"});
    let take = || app.post("/v1/leases", &ask);
    let held = take().await;
    assert_eq!(held.status(), 201);
    let location = held
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .expect("a lease URL")
        .to_owned();
    let denied: Value = take().await.json().await.expect("JSON");
    assert_eq!(denied["allowed"], false, "the one slot is held: {denied}");

    let rate =
        json!({"name": "flip", "algorithm": "fixed_window", "limit": 5, "window_ms": 60_000});
    assert_eq!(app.put("/v1/policies/flip", &rate).await.status(), 200);
    assert_eq!(
        app.put("/v1/policies/flip", &concurrency).await.status(),
        200
    );

    let renew = app.post(&format!("{location}/renew"), &json!({})).await;
    assert_eq!(
        renew.status(),
        404,
        "a lease of the old incarnation is unknown"
    );
    let again = take().await;
    assert_eq!(again.status(), 201, "the old lease holds no slot");
}
