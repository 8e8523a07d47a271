//! Per-subject limits (issue 24): tiers in a policy, overrides by key, prefix and range, their
//! precedence, expiry, deletion and explanation, on every store; across instances on Redis.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::helpers::{
    masters, metric, spawn_app, spawn_app_on, spawn_app_on_cluster, spawn_app_with, Backend,
    TestApp, TestCluster, TestRedis,
};

crate::on_every_store!(
    an_exact_override_raises_one_subject_and_leaves_every_other_at_the_policy,
    a_tier_given_by_an_override_applies_per_limit,
    expiry_and_deletion_put_the_subject_back,
    prefix_and_range_overrides_apply_to_what_they_match_and_nothing_else,
    precedence_is_fixed_and_an_ambiguous_write_is_refused,
    unlimited_never_reaches_the_store_and_block_denies,
    resolve_explains_each_case,
    a_subject_keeps_its_usage_when_its_limits_change,
    bad_input_is_refused_naming_the_field_and_changes_nothing,
    deleting_a_policy_deletes_its_overrides,
    replacements_keep_created_at_and_honour_if_match,
    the_caps_are_enforced_by_the_write,
    a_replacement_that_can_never_hold_answers_bad_input_first,
);

/// `policy`, a fixed window of 2 per hour, with a tier `pro` of 5 and `max` of 50.
async fn flat(app: &TestApp, policy: &str) {
    app.create_policy(json!({
        "name": policy, "algorithm": "fixed_window", "limit": 2, "window_ms": 3_600_000,
        "tiers": {"pro": {policy: {"limit": 5}}, "max": {policy: {"limit": 50}}}
    }))
    .await;
}

/// Creates an override of `policy` (see [`TestApp::create_override`]).
async fn create(app: &TestApp, policy: &str, body: Value) -> Value {
    app.create_override(policy, body).await
}

/// `n` acquires of 1; answers how many were allowed, and the last answer.
async fn allowed_of(app: &TestApp, policy: &str, key: &str, n: usize) -> (usize, Value) {
    let mut allowed = 0;
    let mut last = Value::Null;
    for _ in 0..n {
        last = app.acquire(policy, key, 1).await;
        if last["allowed"] == true {
            allowed += 1;
        }
    }
    (allowed, last)
}

fn rfc3339_in(d: Duration) -> String {
    let at = SystemTime::now() + d;
    let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    // Formatted by hand (no date crate in the tests): days since the epoch to a civil date.
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Howard Hinnant's `civil_from_days`.
fn civil(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

async fn an_exact_override_raises_one_subject_and_leaves_every_other_at_the_policy(
    backend: Backend,
) {
    let app = spawn_app(backend).await;
    flat(&app, "api").await;
    let o = create(
        &app,
        "api",
        json!({"match": {"key": "vip"}, "limits": {"api": {"limit": 4}}, "reason": "launch"}),
    )
    .await;
    assert_eq!(o["reason"], "launch");
    assert!(o["created_at"].as_str().is_some_and(|t| t.ends_with('Z')));

    let (vip, last) = allowed_of(&app, "api", "vip", 6).await;
    assert_eq!(vip, 4, "raised for the subject: {last}");
    assert_eq!(last["limit"], 4);
    assert_eq!(
        last["override"],
        json!({"id": o["id"], "match": {"key": "vip"}})
    );
    for other in ["other", "vip2", "VIP", "vi"] {
        let (n, last) = allowed_of(&app, "api", other, 3).await;
        assert_eq!(n, 2, "{other} stays at the policy's: {last}");
        assert!(last.get("override").is_none(), "{last}");
    }
    let r = app
        .post("/v1/acquire", &json!({"policy": "api", "key": "vip"}))
        .await;
    let header = r
        .headers()
        .get("ratelimit-override")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    assert_eq!(
        header,
        Some(format!("id={};match=exact", o["id"].as_str().unwrap_or("")))
    );
    let policy_field = r
        .headers()
        .get("ratelimit-policy")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    assert_eq!(policy_field.as_deref(), Some("\"api\";q=4;w=3600"));
    assert!(
        metric(
            &app,
            "ratelimiter_override_decisions_total",
            &[("policy", "api"), ("source", "exact"), ("effect", "limits")]
        )
        .await
            >= 6.0
    );
}

async fn a_tier_given_by_an_override_applies_per_limit(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_policy(json!({"name": "plans", "limits": [
        {"name": "burst", "algorithm": "fixed_window", "limit": 2, "window_ms": 3_600_000},
        {"name": "daily", "algorithm": "fixed_window", "limit": 3, "window_ms": 86_400_000}],
      "tiers": {"pro": {"burst": {"limit": 10}},
                "enterprise": {"burst": {"limit": 10}, "daily": {"limit": 6}}}}))
        .await;
    create(&app, "plans", json!({"match": {"key": "p"}, "tier": "pro"})).await;
    create(
        &app,
        "plans",
        json!({"match": {"key": "e"}, "tier": "enterprise"}),
    )
    .await;
    // pro raises only `burst`: `daily` (3) binds.
    let (n, last) = allowed_of(&app, "plans", "p", 8).await;
    assert_eq!(n, 3, "{last}");
    assert_eq!(last["violated"], json!(["daily"]), "{last}");
    assert_eq!(last["tier"], "pro");
    let (n, last) = allowed_of(&app, "plans", "e", 8).await;
    assert_eq!(n, 6, "{last}");
    assert_eq!(last["limits"][0]["limit"], 10);
    assert_eq!(last["limits"][1]["limit"], 6);
    let (n, _) = allowed_of(&app, "plans", "free", 8).await;
    assert_eq!(n, 2);
}

async fn expiry_and_deletion_put_the_subject_back(backend: Backend) {
    let app = spawn_app(backend).await;
    flat(&app, "boost").await;
    // Whole seconds: at least 1.5 s ahead, so that it is in the future when written.
    let expires = rfc3339_in(Duration::from_millis(2_500));
    let o = create(
        &app,
        "boost",
        json!({"match": {"key": "launch"}, "tier": "max", "expires_at": expires}),
    )
    .await;
    assert_eq!(o["expires_at"], expires);
    let d = app.acquire("boost", "launch", 1).await;
    assert_eq!(
        (d["limit"].clone(), d["tier"].clone()),
        (json!(50), json!("max")),
        "{d}"
    );
    // After the expiry (plus the propagation bound), the policy's own limit: 1 used of 2 left one.
    let started = Instant::now();
    loop {
        let d = app.acquire("boost", "launch", 1).await;
        if d.get("override").is_none() {
            assert_eq!(d["limit"], 2, "{d}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "never expired: {d}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let o = create(
        &app,
        "boost",
        json!({"match": {"key": "gone"}, "tier": "pro"}),
    )
    .await;
    assert_eq!(app.acquire("boost", "gone", 1).await["limit"], 5);
    let path = format!(
        "/v1/policies/boost/overrides/{}",
        o["id"].as_str().unwrap_or("")
    );
    assert_eq!(app.delete(&path).await.status(), 204);
    assert_eq!(app.get(&path).await.status(), 404);
    assert_eq!(app.delete(&path).await.status(), 404);
    let d = app.acquire("boost", "gone", 1).await;
    assert_eq!(
        (d["limit"].clone(), d.get("override")),
        (json!(2), None),
        "{d}"
    );
}

async fn prefix_and_range_overrides_apply_to_what_they_match_and_nothing_else(backend: Backend) {
    let app = spawn_app(backend).await;
    flat(&app, "nets").await;
    create(
        &app,
        "nets",
        json!({"match": {"prefix": "acme-"}, "tier": "pro"}),
    )
    .await;
    create(
        &app,
        "nets",
        json!({"match": {"cidr": "203.0.113.0/24"}, "tier": "max"}),
    )
    .await;
    create(
        &app,
        "nets",
        json!({"match": {"cidr": "2001:db8::/32"}, "tier": "max"}),
    )
    .await;
    for (key, limit) in [
        ("acme-1", 5),
        ("acme-", 5),
        ("acme", 2),
        ("xacme-1", 2),
        ("203.0.113.7", 50),
        ("::ffff:203.0.113.9", 50),
        ("203.0.114.1", 2),
        ("2001:DB8::1", 50),
        ("2001:db9::1", 2),
        ("203.0.113.7x", 2),
    ] {
        let d = app.acquire("nets", key, 1).await;
        assert_eq!(d["limit"], limit, "{key}: {d}");
    }
}

async fn precedence_is_fixed_and_an_ambiguous_write_is_refused(backend: Backend) {
    let app = spawn_app(backend).await;
    flat(&app, "order").await;
    // Written in an order that a first-match rule would get wrong.
    create(
        &app,
        "order",
        json!({"match": {"prefix": "10."}, "tier": "pro"}),
    )
    .await;
    create(
        &app,
        "order",
        json!({"match": {"cidr": "10.0.0.0/8"}, "limits": {"order": {"limit": 7}}}),
    )
    .await;
    create(
        &app,
        "order",
        json!({"match": {"cidr": "10.1.0.0/16"}, "limits": {"order": {"limit": 8}}}),
    )
    .await;
    create(
        &app,
        "order",
        json!({"match": {"prefix": "10.1.2"}, "limits": {"order": {"limit": 9}}}),
    )
    .await;
    create(
        &app,
        "order",
        json!({"match": {"key": "10.1.2.3"}, "tier": "max"}),
    )
    .await;
    for (key, limit) in [
        ("10.1.2.3", 50), // the exact key
        ("10.1.2.4", 8),  // the narrower range beats the wider one and every prefix
        ("10.2.0.1", 7),  // the wider range
        ("10.1.2.x", 9),  // not an address: the longest prefix
        ("10.x", 5),      // the shorter prefix
    ] {
        assert_eq!(app.acquire("order", key, 1).await["limit"], limit, "{key}");
    }
    let before = app
        .get("/v1/policies/order/overrides")
        .await
        .json::<Value>()
        .await
        .expect("JSON");
    for m in [
        json!({"prefix": "10."}),
        json!({"cidr": "10.1.0.0/16"}),
        json!({"key": "10.1.2.3"}),
    ] {
        let r = app
            .post(
                "/v1/policies/order/overrides",
                &json!({"match": m, "block": true}),
            )
            .await;
        assert_eq!(r.status(), 409, "{m}");
        let p: Value = r.json().await.expect("problem");
        assert_eq!(p["field"], "match", "{p}");
        assert_eq!(p["type"], "urn:ratelimiter:problem:override-conflict");
    }
    let after = app
        .get("/v1/policies/order/overrides")
        .await
        .json::<Value>()
        .await
        .expect("JSON");
    assert_eq!(before, after, "nothing stored on a refusal");
}

async fn unlimited_never_reaches_the_store_and_block_denies(backend: Backend) {
    let app = spawn_app(backend).await;
    flat(&app, "gate").await;
    create(
        &app,
        "gate",
        json!({"match": {"key": "health"}, "unlimited": true}),
    )
    .await;
    let expires = rfc3339_in(Duration::from_secs(3_600));
    let b = create(
        &app,
        "gate",
        json!({"match": {"key": "abuser"}, "block": true, "expires_at": expires}),
    )
    .await;
    create(
        &app,
        "gate",
        json!({"match": {"key": "banned"}, "block": true}),
    )
    .await;
    let (n, last) = allowed_of(&app, "gate", "health", 20).await;
    assert_eq!(n, 20, "{last}");
    assert_eq!(last["decided_by"], "override");
    assert!(
        last.get("ticket").is_none(),
        "nothing was taken, nothing to refund: {last}"
    );
    // A cost above every quota is allowed too: no limit is consulted.
    assert_eq!(app.acquire("gate", "health", 1_000).await["allowed"], true);
    if let Some(masters) = masters(&app) {
        for mut conn in masters {
            let keys: Vec<String> = ::redis::cmd("KEYS")
                .arg("*health*")
                .query(&mut conn)
                .expect("KEYS");
            assert!(keys.is_empty(), "the store was consulted: {keys:?}");
        }
    }
    let r = app
        .post("/v1/acquire", &json!({"policy": "gate", "key": "abuser"}))
        .await;
    let retry: u64 = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    let d: Value = r.json().await.expect("JSON");
    assert_eq!(
        (d["allowed"].clone(), d["decided_by"].clone()),
        (json!(false), json!("override")),
        "{d}"
    );
    assert!(
        (3_590..=3_601).contains(&retry),
        "Retry-After is the expiry: {retry}"
    );
    assert_eq!(d["override"]["id"], b["id"]);
    let r = app
        .post("/v1/acquire", &json!({"policy": "gate", "key": "banned"}))
        .await;
    assert!(
        r.headers().get("retry-after").is_none(),
        "no time to wait for"
    );
    let d: Value = r.json().await.expect("JSON");
    assert_eq!(d["allowed"], false);
    // Peeks answer the same, and so do joint decisions of other subjects: untouched.
    let p: Value = app
        .post("/v1/peek", &json!({"policy": "gate", "key": "banned"}))
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(
        (p["allowed"].clone(), p["decided_by"].clone()),
        (json!(false), json!("override"))
    );
    assert_eq!(allowed_of(&app, "gate", "someone", 3).await.0, 2);
}

async fn resolve_explains_each_case(backend: Backend) {
    let app = spawn_app(backend).await;
    flat(&app, "why").await;
    let p = create(
        &app,
        "why",
        json!({"match": {"prefix": "acme"}, "tier": "pro"}),
    )
    .await;
    let e = create(
        &app,
        "why",
        json!({"match": {"key": "acme-corp"}, "tier": "max", "reason": "enterprise"}),
    )
    .await;
    let b = create(
        &app,
        "why",
        json!({"match": {"cidr": "198.51.100.0/24"}, "block": true}),
    )
    .await;
    let resolve = |key: &str| {
        let url = format!("/v1/policies/why/resolve?key={key}");
        let app = &app;
        async move {
            let r = app.get(&url).await;
            assert_eq!(r.status(), 200);
            r.json::<Value>().await.expect("JSON")
        }
    };
    let r = resolve("acme-corp").await;
    assert_eq!(r["decided_by"], "tier");
    assert_eq!(r["tier"], "max");
    assert_eq!(r["override"]["id"], e["id"]);
    assert_eq!(r["limits"][0]["limit"], 50);
    let c = r["candidates"].as_array().cloned().unwrap_or_default();
    assert_eq!(c.len(), 2, "{r}");
    assert_eq!(
        (c[0]["precedence"].clone(), c[0]["applies"].clone()),
        (json!("exact"), json!(true))
    );
    assert_eq!(
        (c[1]["precedence"].clone(), c[1]["applies"].clone()),
        (json!("prefix/4"), json!(false))
    );
    assert!(
        c[1]["passed_over"]
            .as_str()
            .is_some_and(|w| w.contains("outranked")),
        "{r}"
    );
    assert_eq!(c[1]["override"]["id"], p["id"]);
    let r = resolve("198.51.100.20").await;
    assert_eq!(
        (r["decided_by"].clone(), r.get("limits")),
        (json!("block"), None)
    );
    assert_eq!(r["override"]["id"], b["id"]);
    let r = resolve("nobody").await;
    assert_eq!(r["decided_by"], "policy");
    assert_eq!(r["limits"][0]["limit"], 2);
    assert_eq!(r["candidates"], json!([]));
    // It consumed nothing.
    assert_eq!(allowed_of(&app, "why", "nobody", 3).await.0, 2);
    // Bad input.
    assert_eq!(app.get("/v1/policies/why/resolve").await.status(), 422);
    assert_eq!(
        app.get("/v1/policies/nope/resolve?key=a").await.status(),
        404
    );
}

async fn a_subject_keeps_its_usage_when_its_limits_change(backend: Backend) {
    let app = spawn_app(backend).await;
    flat(&app, "upgrade").await;
    assert_eq!(allowed_of(&app, "upgrade", "cust", 2).await.0, 2);
    assert_eq!(app.acquire("upgrade", "cust", 1).await["allowed"], false);
    // Upgraded mid-window: the 2 units already spent count against the new 5.
    create(
        &app,
        "upgrade",
        json!({"match": {"key": "cust"}, "tier": "pro"}),
    )
    .await;
    let d = app.acquire("upgrade", "cust", 1).await;
    assert_eq!(
        (d["allowed"].clone(), d["remaining"].clone()),
        (json!(true), json!(2)),
        "{d}"
    );
}

async fn bad_input_is_refused_naming_the_field_and_changes_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    flat(&app, "strict").await;
    app.create_policy(
        json!({"name": "held", "algorithm": "concurrency", "limit": 2, "lease_ms": 1000}),
    )
    .await;
    for (policy, body, status, field) in [
        ("strict", json!({"tier": "pro"}), 422, "match"),
        ("strict", json!({"match": {"key": "a"}}), 422, "tier"),
        (
            "strict",
            json!({"match": {"key": "a"}, "tier": "gold"}),
            422,
            "tier",
        ),
        (
            "strict",
            json!({"match": {"key": "a"}, "tier": 5}),
            400,
            "tier",
        ),
        (
            "strict",
            json!({"match": {"key": "a"}, "limits": {"other": {"limit": 5}}}),
            422,
            "limits.other",
        ),
        (
            "strict",
            json!({"match": {"key": "a"}, "limits": {"strict": {"limit": 0}}}),
            422,
            "limits.strict.limit",
        ),
        (
            "strict",
            json!({"match": {"key": "a"}, "limits": {"strict": {"capacity": 5}}}),
            422,
            "limits.strict.capacity",
        ),
        (
            "strict",
            json!({"match": {"key": "a"}, "limits": {"strict": {"algorithm": "gcra"}}}),
            422,
            "limits.strict.algorithm",
        ),
        (
            "strict",
            json!({"match": {"cidr": "10.0.0.1/8"}, "block": true}),
            422,
            "match.cidr",
        ),
        (
            "strict",
            json!({"match": {"key": "a", "prefix": "b"}, "block": true}),
            422,
            "match",
        ),
        (
            "strict",
            json!({"match": {"key": "a"}, "block": true, "expires_at": "2020-01-01T00:00:00Z"}),
            422,
            "expires_at",
        ),
        (
            "strict",
            json!({"match": {"key": "a"}, "block": true, "expires_at": "soon"}),
            422,
            "expires_at",
        ),
        (
            "strict",
            json!({"match": {"key": "a"}, "block": true, "unlimited": true}),
            422,
            "block",
        ),
        (
            "strict",
            json!({"match": {"key": "a"}, "block": true, "colour": "red"}),
            422,
            "colour",
        ),
        (
            "held",
            json!({"match": {"key": "a"}, "block": true}),
            422,
            "policy",
        ),
    ] {
        let r = app
            .post(&format!("/v1/policies/{policy}/overrides"), &body)
            .await;
        assert_eq!(r.status(), status, "{body}");
        assert_eq!(
            r.headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("application/problem+json")
        );
        let p: Value = r.json().await.expect("problem");
        assert!(
            p["field"].as_str().is_some_and(|f| f.starts_with(field)),
            "{body}: {p}"
        );
    }
    let r = app
        .post(
            "/v1/policies/nope/overrides",
            &json!({"match": {"key": "a"}, "block": true}),
        )
        .await;
    assert_eq!(r.status(), 404);
    let list: Value = app
        .get("/v1/policies/strict/overrides")
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(list["overrides"], json!([]), "nothing stored");
    assert_eq!(allowed_of(&app, "strict", "a", 3).await.0, 2);
    // A tier is validated like the limit's own fields, naming the place.
    let r = app
        .post("/v1/policies", &json!({"name": "t", "algorithm": "fixed_window", "limit": 2, "window_ms": 1000, "tiers": {"pro": {"t": {"limit": 0}}}}))
        .await;
    assert_eq!(r.status(), 422);
    let p: Value = r.json().await.expect("problem");
    assert_eq!(p["field"], "tiers.pro.t.limit");
    assert_eq!(app.get("/v1/policies/t").await.status(), 404);
    // Paths that name nothing.
    assert_eq!(
        app.get("/v1/policies/strict/overrides/not-an-id")
            .await
            .status(),
        404
    );
    assert_eq!(
        app.get("/v1/policies/strict/overrides/0123456789abcdef")
            .await
            .status(),
        404
    );
}

async fn deleting_a_policy_deletes_its_overrides(backend: Backend) {
    let app = spawn_app(backend).await;
    flat(&app, "temp").await;
    let o = create(&app, "temp", json!({"match": {"key": "k"}, "tier": "pro"})).await;
    create(
        &app,
        "temp",
        json!({"match": {"prefix": "p"}, "tier": "pro"}),
    )
    .await;
    assert_eq!(app.delete("/v1/policies/temp").await.status(), 204);
    flat(&app, "temp").await;
    let list: Value = app
        .get("/v1/policies/temp/overrides")
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(list["overrides"], json!([]), "{list}");
    let path = format!(
        "/v1/policies/temp/overrides/{}",
        o["id"].as_str().unwrap_or("")
    );
    assert_eq!(app.get(&path).await.status(), 404);
    assert_eq!(app.acquire("temp", "k", 1).await["limit"], 2);
    // The same match can be written again.
    create(&app, "temp", json!({"match": {"key": "k"}, "tier": "pro"})).await;
    assert_eq!(app.acquire("temp", "k", 1).await["limit"], 5);
}

async fn replacements_keep_created_at_and_honour_if_match(backend: Backend) {
    let app = spawn_app(backend).await;
    flat(&app, "edit").await;
    let o = create(&app, "edit", json!({"match": {"key": "k"}, "tier": "pro"})).await;
    let path = format!(
        "/v1/policies/edit/overrides/{}",
        o["id"].as_str().unwrap_or("")
    );
    let r = app.get(&path).await;
    let etag = r
        .headers()
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .unwrap_or_default();
    let read: Value = r.json().await.expect("JSON");
    assert_eq!(read, o);
    // What a read answers is accepted back, with its id.
    let mut body = read.clone();
    body["tier"] = json!("max");
    let r = app
        .client
        .put(app.url(&path))
        .header("if-match", &etag)
        .json(&body)
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 200);
    let replaced: Value = r.json().await.expect("JSON");
    assert_eq!(
        (replaced["tier"].clone(), replaced["created_at"].clone()),
        (json!("max"), o["created_at"].clone())
    );
    assert_eq!(app.acquire("edit", "k", 1).await["limit"], 50);
    let r = app
        .client
        .put(app.url(&path))
        .header("if-match", &etag)
        .json(&body)
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 412, "the old ETag no longer holds");
    let other = app
        .put("/v1/policies/edit/overrides/0123456789abcdef", &body)
        .await;
    assert_eq!(other.status(), 422, "an id in the body must be the path's");
    body.as_object_mut().map(|m| m.remove("id"));
    let missing = app
        .put("/v1/policies/edit/overrides/0123456789abcdef", &body)
        .await;
    assert_eq!(missing.status(), 404, "a replacement never creates");
}

async fn the_caps_are_enforced_by_the_write(backend: Backend) {
    let app = spawn_app_on(
        backend,
        &[
            ("RATELIMITER__LIMITS__MAX_EXACT_OVERRIDES", "2"),
            ("RATELIMITER__LIMITS__MAX_PATTERN_OVERRIDES", "1"),
            ("RATELIMITER__LIMITS__MAX_POLICIES", "2"),
        ],
    )
    .await;
    flat(&app, "capped").await;
    create(
        &app,
        "capped",
        json!({"match": {"key": "a"}, "block": true}),
    )
    .await;
    create(
        &app,
        "capped",
        json!({"match": {"key": "b"}, "block": true}),
    )
    .await;
    create(
        &app,
        "capped",
        json!({"match": {"prefix": "c"}, "block": true}),
    )
    .await;
    for m in [json!({"key": "d"}), json!({"cidr": "10.0.0.0/8"})] {
        let r = app
            .post(
                "/v1/policies/capped/overrides",
                &json!({"match": m, "block": true}),
            )
            .await;
        assert_eq!(r.status(), 409, "{m}");
        let p: Value = r.json().await.expect("problem");
        assert_eq!(p["type"], "urn:ratelimiter:problem:too-many-overrides");
    }
    // Another policy has caps of its own, and overrides do not count as policies.
    flat(&app, "other").await;
    create(&app, "other", json!({"match": {"key": "a"}, "block": true})).await;
    let r = app
        .post(
            "/v1/policies",
            &json!({"name": "third", "algorithm": "fixed_window", "limit": 1, "window_ms": 1000}),
        )
        .await;
    assert_eq!(r.status(), 409, "two policies is the cap");
}

// ---- Across instances -------------------------------------------------------------------------

/// Waits (10 s at most) until `app` knows the policy `name`, created through another instance (a
/// miss reads the store at most once per 50 ms, so the first may come too early).
async fn knows(app: &TestApp, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while app
        .post("/v1/peek", &json!({"policy": name, "key": "-"}))
        .await
        .status()
        != 200
    {
        assert!(
            Instant::now() < deadline,
            "{name} never reached the instance"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two instances on one store, following the change log only every minute: what they learn
/// sooner, they learn from the announcement of the write.
async fn an_override_on_one_instance_ends_a_cached_denial_on_another(a: TestApp, b: TestApp) {
    flat(&a, "shared").await;
    knows(&b, "shared").await;
    for _ in 0..2 {
        b.acquire("shared", "cust", 1).await;
    }
    let denied = b.acquire("shared", "cust", 1).await;
    assert_eq!(denied["allowed"], false);
    let cached = b.acquire("shared", "cust", 1).await;
    assert_eq!(cached["decided_by"], "local_cache", "{cached}");
    create(
        &a,
        "shared",
        json!({"match": {"key": "cust"}, "tier": "pro"}),
    )
    .await;
    let started = Instant::now();
    loop {
        let d = b.acquire("shared", "cust", 1).await;
        if d["allowed"] == true {
            assert_eq!(d["limit"], 5);
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "still denied long after the override, far sooner than the minute of the log: {d}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Deleting it is announced as well: the subject is back at the policy's limit at once.
    let list: Value = a
        .get("/v1/policies/shared/overrides")
        .await
        .json()
        .await
        .expect("JSON");
    let id = list["overrides"][0]["id"].as_str().unwrap_or("").to_owned();
    assert_eq!(
        a.delete(&format!("/v1/policies/shared/overrides/{id}"))
            .await
            .status(),
        204
    );
    let started = Instant::now();
    loop {
        let d = b.acquire("shared", "cust", 1).await;
        if d.get("override").is_none() {
            assert_eq!(
                (d["allowed"].clone(), d["limit"].clone()),
                (json!(false), json!(2))
            );
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(3), "{d}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const SLOW_LOG: [(&str, &str); 1] = [("RATELIMITER__REDIS__POLICY_REFRESH_MS", "60000")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_on_one_redis_instance_ends_a_cached_denial_on_another() {
    let redis = Arc::new(TestRedis::start());
    let a = spawn_app_with(Some(redis.clone()), &SLOW_LOG).await;
    let b = spawn_app_with(Some(redis), &SLOW_LOG).await;
    an_override_on_one_instance_ends_a_cached_denial_on_another(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_on_one_cluster_instance_ends_a_cached_denial_on_another() {
    let cluster = Arc::new(TestCluster::start());
    let a = spawn_app_on_cluster(cluster.clone(), &SLOW_LOG).await;
    let b = spawn_app_on_cluster(cluster, &SLOW_LOG).await;
    an_override_on_one_instance_ends_a_cached_denial_on_another(a, b).await;
}

/// Without the announcement (another instance that does not use the denial cache), the change
/// log brings an override within its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_is_in_force_on_every_instance_within_the_refresh_bound() {
    let redis = Arc::new(TestRedis::start());
    let settings = [
        ("RATELIMITER__REDIS__POLICY_REFRESH_MS", "200"),
        ("RATELIMITER__LIMITS__DENIAL_CACHE", "false"),
    ];
    let a = spawn_app_with(Some(redis.clone()), &settings).await;
    let b = spawn_app_with(Some(redis), &settings).await;
    flat(&a, "spread").await;
    knows(&b, "spread").await;
    assert_eq!(b.acquire("spread", "k", 1).await["limit"], 2);
    let written = Instant::now();
    create(&a, "spread", json!({"match": {"key": "k"}, "tier": "max"})).await;
    loop {
        if b.acquire("spread", "k", 1).await["limit"] == 50 {
            break;
        }
        assert!(
            written.elapsed() < Duration::from_secs(2),
            "not in force within the bound"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// While Redis is down, `fail_mode: local` decides with the override's limits too, and
/// `unlimited` and `block` answer as ever (they never needed the store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_fail_mode_decides_with_the_override() {
    let redis = Arc::new(TestRedis::start());
    let app = spawn_app_with(Some(redis.clone()), &[]).await;
    app.create_policy(json!({
        "name": "loc", "algorithm": "fixed_window", "limit": 2, "window_ms": 3_600_000,
        "fail_mode": "local", "tiers": {"pro": {"loc": {"limit": 5}}}
    }))
    .await;
    create(&app, "loc", json!({"match": {"key": "pro"}, "tier": "pro"})).await;
    create(
        &app,
        "loc",
        json!({"match": {"key": "blocked"}, "block": true}),
    )
    .await;
    create(
        &app,
        "loc",
        json!({"match": {"key": "free"}, "unlimited": true}),
    )
    .await;
    redis.stop();
    let (n, last) = allowed_of(&app, "loc", "pro", 7).await;
    assert_eq!(
        (n, last["decided_by"].clone()),
        (5, json!("fail_local")),
        "{last}"
    );
    assert_eq!(last["tier"], "pro");
    let (n, last) = allowed_of(&app, "loc", "other", 4).await;
    assert_eq!(
        (n, last["decided_by"].clone()),
        (2, json!("fail_local")),
        "{last}"
    );
    let d = app.acquire("loc", "blocked", 1).await;
    assert_eq!(
        (d["allowed"].clone(), d["decided_by"].clone()),
        (json!(false), json!("override"))
    );
    let d = app.acquire("loc", "free", 1).await;
    assert_eq!(
        (d["allowed"].clone(), d["degraded"].clone()),
        (json!(true), json!(false))
    );
}

/// A policy replaced without the tier an override names: the override no longer applies (the
/// subject gets the policy's limits), and `resolve` says why; the tier back, it applies again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_naming_a_tier_the_policy_dropped_stops_applying_and_says_why() {
    let app = spawn_app(Backend::Embedded).await;
    flat(&app, "drop").await;
    create(&app, "drop", json!({"match": {"key": "k"}, "tier": "pro"})).await;
    assert_eq!(app.acquire("drop", "k", 1).await["limit"], 5);
    let without =
        json!({"name": "drop", "algorithm": "fixed_window", "limit": 2, "window_ms": 3_600_000});
    assert_eq!(app.put("/v1/policies/drop", &without).await.status(), 200);
    let d = app.acquire("drop", "k", 1).await;
    assert_eq!(
        (d["limit"].clone(), d.get("override")),
        (json!(2), None),
        "{d}"
    );
    let r: Value = app
        .get("/v1/policies/drop/resolve?key=k")
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(r["decided_by"], "policy");
    assert!(
        r["candidates"][0]["passed_over"]
            .as_str()
            .is_some_and(|w| w.contains("no tier `pro`")),
        "{r}"
    );
    flat(&app, "drop2").await;
    let with = json!({"name": "drop", "algorithm": "fixed_window", "limit": 2, "window_ms": 3_600_000,
                      "tiers": {"pro": {"drop": {"limit": 9}}}});
    assert_eq!(app.put("/v1/policies/drop", &with).await.status(), 200);
    assert_eq!(app.acquire("drop", "k", 1).await["limit"], 9);
}

/// `If-None-Match: *` never holds for a replacement (it never creates); bad input is still
/// answered as bad input, naming the field, as for a policy, and only a good body gets the 412.
async fn a_replacement_that_can_never_hold_answers_bad_input_first(backend: Backend) {
    let app = spawn_app(backend).await;
    flat(&app, "never").await;
    let o = create(&app, "never", json!({"match": {"key": "k"}, "tier": "pro"})).await;
    let path = format!(
        "/v1/policies/never/overrides/{}",
        o["id"].as_str().unwrap_or("")
    );
    let put = |body: Value| {
        let app = &app;
        let url = app.url(&path);
        async move {
            app.client
                .put(url)
                .header("if-none-match", "*")
                .json(&body)
                .send()
                .await
                .expect("sent")
        }
    };
    let r = put(json!({"match": {"key": "k"}, "tier": "pro", "colour": "red"})).await;
    assert_eq!(r.status(), 422);
    let p: Value = r.json().await.expect("problem");
    assert_eq!(p["field"], "colour", "{p}");
    let r = put(json!({"match": {"key": "k"}, "tier": "gold"})).await;
    assert_eq!(r.status(), 422);
    let r = put(json!({"match": {"key": "k"}, "tier": "max"})).await;
    assert_eq!(r.status(), 412);
    let read: Value = app.get(&path).await.json().await.expect("JSON");
    assert_eq!(read["tier"], "pro", "nothing written: {read}");
}
