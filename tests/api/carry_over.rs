//! A change of a limit's parameters through the service, on the embedded store and on Redis: a
//! subject's usage carries over (not reset, not a fresh full bucket), as each algorithm's rule
//! says (src/limiter, "A change of parameters"). Rates are a few a day and windows an hour or a
//! day, so that the milliseconds the test takes refill and slide nothing.

use serde_json::{json, Value};

use crate::helpers::{clear_of_window_edges, spawn_app, Backend, TestApp};

const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 86_400_000;

/// One acquire decided by the store: its answer.
async fn acquire(app: &TestApp, policy: &str, cost: u64) -> Value {
    let r = app
        .post(
            "/v1/acquire",
            &json!({"policy": policy, "key": "customer", "cost": cost}),
        )
        .await;
    let status = r.status();
    let body: Value = r.json().await.expect("JSON answer");
    assert_eq!(status, 200, "{policy}: {body}");
    assert_eq!(body["degraded"], false, "decided by the store: {body}");
    body
}

async fn put(app: &TestApp, name: &str, limit: Value) {
    let r = app.put(&format!("/v1/policies/{name}"), &limit).await;
    assert_eq!(
        r.status(),
        200,
        "{name}: {}",
        r.text().await.unwrap_or_default()
    );
}

/// Each algorithm at a quota of 10, then 20 with another rate or window, then 8 as at first.
fn versions(algorithm: &str) -> [Value; 3] {
    let fields = |quota: u64, per_ms: u64, fast: bool| match algorithm {
        "token_bucket" => {
            json!({"capacity": quota, "refill_tokens": if fast { 2 } else { 1 }, "refill_period_ms": per_ms})
        }
        "gcra" => json!({"burst": quota, "rate": if fast { 2 } else { 1 }, "period_ms": per_ms}),
        _ => json!({"limit": quota, "window_ms": per_ms}),
    };
    // Buckets and GCRA get twice the rate; windows a day instead of an hour.
    let (first, second) = match algorithm {
        "token_bucket" | "gcra" => ((DAY_MS, false), (DAY_MS, true)),
        _ => ((HOUR_MS, false), (DAY_MS, false)),
    };
    [(10, first), (20, second), (8, first)].map(|(quota, (per_ms, fast))| {
        let mut v = fields(quota, per_ms, fast);
        v["algorithm"] = json!(algorithm);
        v
    })
}

async fn usage_carries_over_a_change_of_parameters(backend: Backend) {
    let app = spawn_app(backend).await;
    clear_of_window_edges(&[HOUR_MS, DAY_MS]).await;
    for algorithm in [
        "token_bucket",
        "gcra",
        "fixed_window",
        "sliding_window_counter",
        "sliding_window_log",
    ] {
        let name = format!("carry-{}", algorithm.replace('_', "-"));
        let [first, raised, lowered] = versions(algorithm);
        let mut policy = first;
        policy["name"] = json!(name);
        app.create_policy(policy).await;
        let d = acquire(&app, &name, 4).await;
        assert_eq!(d["remaining"], 6, "{algorithm}: {d}");

        // Raised to 20, at twice the rate or over a day: the 4 spent still count, so 15 are
        // left after one more (a reset or a fresh full bucket would leave 19, the old level
        // carried as it stands 5).
        put(&app, &name, raised).await;
        let d = acquire(&app, &name, 1).await;
        assert_eq!(d["limit"], 20, "{algorithm}: {d}");
        assert_eq!(d["remaining"], 15, "{algorithm}: {d}");
        if algorithm == "fixed_window" {
            // The 5 counted in this hour's window count until it ends, not for a day.
            let reset = d["reset_after_ms"].as_u64().expect("reset_after_ms");
            assert!(reset <= HOUR_MS, "{algorithm}: {d}");
        }

        // Lowered to 8, back to the first rate or window: 5 spent, 2 left after one more, and
        // then nothing.
        put(&app, &name, lowered).await;
        let d = acquire(&app, &name, 1).await;
        assert_eq!(d["limit"], 8, "{algorithm}: {d}");
        assert_eq!(d["remaining"], 2, "{algorithm}: {d}");
        let d = acquire(&app, &name, 3).await;
        assert_eq!(d["allowed"], false, "{algorithm}: {d}");
        assert_eq!(d["remaining"], 2, "{algorithm}: {d}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_carries_over_a_change_of_parameters_on_the_embedded_store() {
    usage_carries_over_a_change_of_parameters(Backend::Embedded).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_carries_over_a_change_of_parameters_on_redis() {
    usage_carries_over_a_change_of_parameters(Backend::Redis).await
}

crate::on_every_store!(usage_carries_over_when_an_override_changes_a_subjects_limits);

/// The same, with the limits changed for one subject by an override (a tier, then the
/// override's own `limits`), on every store: the subject keeps its usage, and another subject
/// keeps the policy's limits.
async fn usage_carries_over_when_an_override_changes_a_subjects_limits(backend: Backend) {
    let app = spawn_app(backend).await;
    clear_of_window_edges(&[HOUR_MS, DAY_MS]).await;
    for algorithm in [
        "token_bucket",
        "gcra",
        "fixed_window",
        "sliding_window_counter",
        "sliding_window_log",
    ] {
        let name = format!("tier-{}", algorithm.replace('_', "-"));
        let [first, raised, lowered] = versions(algorithm);
        let fields = |mut v: Value| {
            v.as_object_mut().map(|m| m.remove("algorithm"));
            v
        };
        let mut policy = first;
        policy["name"] = json!(name);
        policy["tiers"] = json!({"up": {name.as_str(): fields(raised)}});
        app.create_policy(policy).await;
        let d = acquire(&app, &name, 4).await;
        assert_eq!(d["remaining"], 6, "{algorithm}: {d}");

        let r = app
            .post(
                &format!("/v1/policies/{name}/overrides"),
                &json!({"match": {"key": "customer"}, "tier": "up"}),
            )
            .await;
        assert_eq!(r.status(), 201, "{algorithm}");
        let id = r.json::<Value>().await.expect("JSON")["id"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        let d = acquire(&app, &name, 1).await;
        assert_eq!(
            (d["limit"].clone(), d["remaining"].clone()),
            (json!(20), json!(15)),
            "{algorithm}: {d}"
        );
        assert_eq!(d["tier"], "up");

        let r = app
            .put(
                &format!("/v1/policies/{name}/overrides/{id}"),
                &json!({"match": {"key": "customer"}, "limits": {name.as_str(): fields(lowered)}}),
            )
            .await;
        assert_eq!(r.status(), 200, "{algorithm}");
        let d = acquire(&app, &name, 1).await;
        assert_eq!(
            (d["limit"].clone(), d["remaining"].clone()),
            (json!(8), json!(2)),
            "{algorithm}: {d}"
        );
        // Another subject was never changed.
        let other = app.acquire(&name, "someone-else", 1).await;
        assert_eq!(
            (other["limit"].clone(), other["remaining"].clone()),
            (json!(10), json!(9))
        );
    }
}
