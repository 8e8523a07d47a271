//! Policies of several limits, over HTTP. On every store: exact admission under concurrency, a
//! denial that takes nothing from any limit, the answer's `limits`, `violated`, binding limit and
//! headers, single-limit answers as they were, and which limits keep their state when a policy is
//! replaced. On the embedded store (the documents do not depend on the store): policies from the
//! configuration file, the two forms read back, a read-back written again, validation, and a
//! cost above one limit's quota.

use std::collections::BTreeSet;

use futures_util::future::join_all;
use reqwest::header::HeaderMap;
use serde_json::{json, Value};

use crate::helpers::{clear_of_window_edges, spawn_app, spawn_app_with_file, Backend, TestApp};

crate::on_every_store!(
    concurrent_acquires_admit_exactly_the_tightest_limit_and_count_every_other,
    a_denial_by_one_limit_leaves_every_other_limit_as_it_was,
    answers_give_every_limit_in_policy_order_and_the_binding_one_on_top,
    single_limit_policies_answer_as_before,
    replacing_a_policy_keeps_the_state_of_unchanged_limits_and_starts_the_others_afresh,
);

const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 86_400_000;

/// One acquire, decided by the store itself (not by a fail mode): the answer and its headers.
async fn decide(app: &TestApp, policy: &str, key: &str, cost: u64) -> (Value, HeaderMap) {
    let r = app
        .post(
            "/v1/acquire",
            &json!({"policy": policy, "key": key, "cost": cost}),
        )
        .await;
    let status = r.status();
    let headers = r.headers().clone();
    let body: Value = r.json().await.expect("JSON answer");
    assert_eq!(status, 200, "acquire {policy}/{key} cost {cost}: {body}");
    assert_eq!(body["degraded"], false, "decided by the store: {body}");
    (body, headers)
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .map(|v| v.to_str().expect("ASCII header").to_owned())
}

/// `limits[i].<field>` of an answer, for every limit in order.
fn per_limit(d: &Value, field: &str) -> Vec<Value> {
    d["limits"]
        .as_array()
        .unwrap_or_else(|| panic!("`limits` in {d}"))
        .iter()
        .map(|l| l[field].clone())
        .collect()
}

fn remaining(d: &Value) -> Vec<u64> {
    per_limit(d, "remaining")
        .iter()
        .map(|r| r.as_u64().expect("remaining is a number"))
        .collect()
}

/// The items of a `RateLimit` header as `(name, r, t)`.
fn ratelimit_items(value: &str) -> Vec<(String, u64, u64)> {
    value
        .split(", ")
        .map(|item| {
            let mut parts = item.split(';');
            let name = parts
                .next()
                .and_then(|n| n.strip_prefix('"'))
                .and_then(|n| n.strip_suffix('"'))
                .unwrap_or_else(|| panic!("a quoted name in {value:?}"))
                .to_owned();
            let mut param = |key: &str| -> u64 {
                parts
                    .next()
                    .and_then(|p| p.strip_prefix(key))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("`{key}<n>` in {value:?}"))
            };
            let r = param("r=");
            let t = param("t=");
            (name, r, t)
        })
        .collect()
}

fn minute_and_day(name: &str, day_algorithm: &str) -> Value {
    json!({"name": name, "fail_mode": "closed", "limits": [
        {"name": "minute", "algorithm": "fixed_window", "limit": 50, "window_ms": 60_000},
        {"name": "day", "algorithm": day_algorithm, "limit": 60, "window_ms": DAY_MS},
    ]})
}

async fn concurrent_acquires_admit_exactly_the_tightest_limit_and_count_every_other(
    backend: Backend,
) {
    let app = spawn_app(backend).await;
    for day_algorithm in ["fixed_window", "sliding_window_counter"] {
        let name = format!("md-{day_algorithm}");
        app.create_policy(minute_and_day(&name, day_algorithm))
            .await;
        clear_of_window_edges(&[60_000, DAY_MS]).await;
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
                r.json::<Value>().await.expect("JSON")
            })
        });
        let answers: Vec<Value> = join_all(requests)
            .await
            .into_iter()
            .map(|r| r.expect("task"))
            .collect();
        let (allowed, denied): (Vec<&Value>, Vec<&Value>) =
            answers.iter().partition(|d| d["allowed"] == true);
        assert_eq!(allowed.len(), 50, "{name}: exactly the minute's 50");
        // Each admission took one unit from both limits, under one atomic decision.
        let minute_left: BTreeSet<u64> = allowed.iter().map(|d| remaining(d)[0]).collect();
        let day_left: BTreeSet<u64> = allowed.iter().map(|d| remaining(d)[1]).collect();
        assert_eq!(minute_left, (0..50).collect(), "{name}");
        assert_eq!(day_left, (10..60).collect(), "{name}");
        for d in &answers {
            assert_eq!(d["degraded"], false, "{name}: {d}");
            assert_eq!(d["limit"], 50, "{name}: the minute binds: {d}");
        }
        for d in denied {
            assert_eq!(d["violated"], json!(["minute"]), "{name}: {d}");
            assert_eq!(remaining(d)[0], 0, "{name}: {d}");
        }

        let (d, _) = decide(&app, &name, "hot", 1).await;
        assert_eq!(d["allowed"], false, "{name}: {d}");
        assert_eq!(d["violated"], json!(["minute"]), "{name}: {d}");
        assert_eq!(per_limit(&d, "name"), [json!("minute"), json!("day")]);
        assert_eq!(d["limits"][1]["limit"], 60, "{name}: {d}");
        assert_eq!(
            d["limits"][1]["remaining"], 10,
            "{name}: the day saw exactly the 50 admitted: {d}"
        );
        assert_eq!(d["limits"][1]["retry_after_ms"], 0, "{name}: {d}");
        assert_eq!(
            (d["limit"].clone(), d["remaining"].clone()),
            (json!(50), json!(0))
        );
    }
}

/// Limit `name` of the mixed policies, with the given quota; every one refills too slowly to
/// give anything back during a test.
fn mixed_limit(name: &str, quota: u64) -> Value {
    match name {
        "bucket" => {
            json!({"name": name, "algorithm": "token_bucket", "capacity": quota, "refill_tokens": 1, "refill_period_ms": DAY_MS})
        }
        "window" => {
            json!({"name": name, "algorithm": "fixed_window", "limit": quota, "window_ms": HOUR_MS})
        }
        "cell" => {
            json!({"name": name, "algorithm": "gcra", "rate": 1, "period_ms": DAY_MS, "burst": quota})
        }
        "log" => {
            json!({"name": name, "algorithm": "sliding_window_log", "limit": quota, "window_ms": HOUR_MS})
        }
        other => unreachable!("no mixed limit {other}"),
    }
}

async fn a_denial_by_one_limit_leaves_every_other_limit_as_it_was(backend: Backend) {
    let app = spawn_app(backend).await;
    let names = ["bucket", "window", "cell", "log"];
    clear_of_window_edges(&[HOUR_MS]).await;
    // Each algorithm in turn is the tightest limit (10); the others have 11, 12, 13.
    for (v, violator) in names.iter().enumerate() {
        let mut others = 11..;
        let quotas: Vec<u64> = (0..names.len())
            .map(|i| {
                if i == v {
                    10
                } else {
                    others.next().unwrap_or(0)
                }
            })
            .collect();
        let policy = format!("mixed-{violator}");
        let limits: Vec<Value> = names
            .iter()
            .zip(&quotas)
            .map(|(n, q)| mixed_limit(n, *q))
            .collect();
        app.create_policy(json!({"name": policy, "fail_mode": "closed", "limits": limits}))
            .await;
        let after = |taken: u64| -> Vec<u64> { quotas.iter().map(|q| q - taken).collect() };

        let (d, _) = decide(&app, &policy, "k", 8).await;
        assert_eq!(d["allowed"], true, "{policy}: {d}");
        assert_eq!(remaining(&d), after(8), "{policy}: {d}");

        // Only the violator refuses 3 of its 2 left: nothing is taken from anyone.
        let (d, h) = decide(&app, &policy, "k", 3).await;
        assert_eq!(d["allowed"], false, "{policy}: {d}");
        assert_eq!(d["violated"], json!([violator]), "{policy}: {d}");
        assert_eq!(
            remaining(&d),
            after(8),
            "{policy}: a denial took something: {d}"
        );
        for (i, retry) in per_limit(&d, "retry_after_ms").iter().enumerate() {
            let retry = retry.as_u64().expect("retry_after_ms");
            assert_eq!(retry > 0, i == v, "{policy}: limit {i} retry: {d}");
        }
        assert_eq!(d["limit"], 10, "{policy}: the violator binds: {d}");
        assert_eq!(d["remaining"], 2, "{policy}: {d}");
        assert_eq!(d["retry_after_ms"], d["limits"][v]["retry_after_ms"]);
        let retry_s = d["retry_after_ms"].as_u64().expect("ms").div_ceil(1000);
        assert_eq!(header(&h, "retry-after"), Some(retry_s.to_string()));

        // A unit every limit has is granted from all of them.
        let (d, _) = decide(&app, &policy, "k", 1).await;
        assert_eq!(d["allowed"], true, "{policy}: {d}");
        assert_eq!(remaining(&d), after(9), "{policy}: {d}");

        // Denied by the violator alone, then also by the limit left with 2, then by all.
        let (d, _) = decide(&app, &policy, "k", 2).await;
        assert_eq!(
            (d["allowed"].clone(), d["violated"].clone()),
            (json!(false), json!([violator])),
            "{policy}: {d}"
        );
        assert_eq!(remaining(&d), after(9), "{policy}: {d}");
        let (d, _) = decide(&app, &policy, "k", 3).await;
        let two = quotas
            .iter()
            .position(|q| q - 9 == 2)
            .expect("a limit with 2");
        let mut violated: Vec<&str> = vec![violator, names[two]];
        violated.sort_by_key(|n| names.iter().position(|m| m == n));
        assert_eq!(
            d["violated"],
            json!(violated),
            "{policy}: in policy order: {d}"
        );
        assert_eq!(remaining(&d), after(9), "{policy}: {d}");
        let (d, _) = decide(&app, &policy, "k", 10).await;
        assert_eq!(d["violated"], json!(names), "{policy}: {d}");
        assert_eq!(remaining(&d), after(9), "{policy}: {d}");
        let (d, _) = decide(&app, &policy, "k", 1).await;
        assert_eq!(
            d["allowed"], true,
            "{policy}: the last unit is still there: {d}"
        );
        assert_eq!(remaining(&d), after(10), "{policy}: {d}");
    }
}

async fn answers_give_every_limit_in_policy_order_and_the_binding_one_on_top(backend: Backend) {
    let app = spawn_app(backend).await;
    clear_of_window_edges(&[DAY_MS, HOUR_MS]).await;

    // Allowed: the limit with the fewest units left is on top, though it is not the first.
    app.create_policy(json!({"name": "shape", "limits": [
        {"name": "daily", "algorithm": "fixed_window", "limit": 10_000, "window_ms": DAY_MS},
        {"name": "burst", "algorithm": "token_bucket", "capacity": 20, "refill_tokens": 10, "refill_period_ms": 1000},
    ]}))
    .await;
    let (d, h) = decide(&app, "shape", "k", 1).await;
    let keys: BTreeSet<&str> = d
        .as_object()
        .expect("object")
        .keys()
        .map(|k| k.as_str())
        .collect();
    assert_eq!(
        keys,
        BTreeSet::from([
            "allowed",
            "policy",
            "key",
            "limit",
            "remaining",
            "reset_after_ms",
            "resets_at",
            "retry_after_ms",
            "degraded",
            "decided_by",
            "limits",
            "ticket"
        ]),
        "no `violated` when allowed: {d}"
    );
    let daily_reset = d["limits"][0]["reset_after_ms"].as_u64().expect("ms");
    assert!((1..=DAY_MS).contains(&daily_reset), "{d}");
    // Each limit's `resets_at` is an instant in UTC (no calendar here); the rest exactly.
    let mut limits = d["limits"].clone();
    for l in limits.as_array_mut().expect("an array") {
        let at = l
            .as_object_mut()
            .and_then(|o| o.remove("resets_at"))
            .expect("every limit has resets_at");
        let at = at.as_str().expect("a string");
        assert!(
            at.ends_with('Z') && at.parse::<jiff::Timestamp>().is_ok(),
            "{d}"
        );
    }
    assert_eq!(
        limits,
        json!([
            {"name": "daily", "limit": 10_000, "remaining": 9_999, "reset_after_ms": daily_reset, "retry_after_ms": 0},
            {"name": "burst", "limit": 20, "remaining": 19, "reset_after_ms": 100, "retry_after_ms": 0},
        ])
    );
    assert_eq!(
        (&d["allowed"], &d["policy"], &d["key"]),
        (&json!(true), &json!("shape"), &json!("k"))
    );
    assert_eq!(
        (
            &d["limit"],
            &d["remaining"],
            &d["reset_after_ms"],
            &d["retry_after_ms"]
        ),
        (&json!(20), &json!(19), &json!(100), &json!(0)),
        "the burst binds: {d}"
    );
    assert_eq!(
        header(&h, "ratelimit-policy").as_deref(),
        Some("\"shape/daily\";q=10000;w=86400, \"shape/burst\";q=20;w=2")
    );
    let rl = header(&h, "ratelimit").expect("RateLimit");
    assert_eq!(
        ratelimit_items(&rl),
        [
            ("shape/daily".to_owned(), 9_999, daily_reset.div_ceil(1000)),
            ("shape/burst".to_owned(), 19, 1),
        ],
        "{rl}"
    );
    assert_eq!(header(&h, "retry-after"), None);

    // Denied by two: the one that frees up last is on top and sets `Retry-After`.
    app.create_policy(json!({"name": "shape-deny", "limits": [
        {"name": "bucket", "algorithm": "token_bucket", "capacity": 2, "refill_tokens": 1, "refill_period_ms": 60_000},
        {"name": "free", "algorithm": "fixed_window", "limit": 100, "window_ms": HOUR_MS},
        {"name": "log", "algorithm": "sliding_window_log", "limit": 3, "window_ms": DAY_MS},
    ]}))
    .await;
    let (d, _) = decide(&app, "shape-deny", "k", 2).await;
    assert_eq!(remaining(&d), [0, 98, 1]);
    assert_eq!(
        (&d["limit"], &d["remaining"]),
        (&json!(2), &json!(0)),
        "the bucket binds: {d}"
    );
    let (d, h) = decide(&app, "shape-deny", "k", 2).await;
    assert_eq!(d["allowed"], false, "{d}");
    assert_eq!(d["violated"], json!(["bucket", "log"]), "{d}");
    assert_eq!(
        per_limit(&d, "name"),
        [json!("bucket"), json!("free"), json!("log")]
    );
    assert_eq!(remaining(&d), [0, 98, 1]);
    for l in d["limits"].as_array().expect("limits") {
        let fields: BTreeSet<&str> = l
            .as_object()
            .expect("object")
            .keys()
            .map(|k| k.as_str())
            .collect();
        assert_eq!(
            fields,
            BTreeSet::from([
                "name",
                "limit",
                "remaining",
                "reset_after_ms",
                "resets_at",
                "retry_after_ms"
            ])
        );
    }
    let retry = |i: usize| d["limits"][i]["retry_after_ms"].as_u64().expect("ms");
    assert!(
        (1..=120_000).contains(&retry(0)),
        "two tokens at one a minute: {d}"
    );
    assert_eq!(retry(1), 0, "the free limit admits: {d}");
    assert!(
        retry(2) > 120_000,
        "the log frees its oldest entry in a day: {d}"
    );
    assert_eq!(
        (
            &d["limit"],
            &d["remaining"],
            &d["retry_after_ms"],
            &d["reset_after_ms"]
        ),
        (
            &json!(3),
            &json!(1),
            &json!(retry(2)),
            &d["limits"][2]["reset_after_ms"]
        ),
        "the log binds: {d}"
    );
    assert_eq!(
        header(&h, "retry-after"),
        Some(retry(2).div_ceil(1000).to_string())
    );
    let rl = header(&h, "ratelimit").expect("RateLimit");
    let items: Vec<(String, u64)> = ratelimit_items(&rl)
        .into_iter()
        .map(|(n, r, _)| (n, r))
        .collect();
    assert_eq!(
        items,
        [
            ("shape-deny/bucket".to_owned(), 0),
            ("shape-deny/free".to_owned(), 98),
            ("shape-deny/log".to_owned(), 1),
        ]
    );
    assert_eq!(
        header(&h, "ratelimit-policy").as_deref(),
        Some("\"shape-deny/bucket\";q=2;w=120, \"shape-deny/free\";q=100;w=3600, \"shape-deny/log\";q=3;w=86400")
    );
}

async fn single_limit_policies_answer_as_before(backend: Backend) {
    let app = spawn_app(backend).await;
    clear_of_window_edges(&[HOUR_MS]).await;
    app.create_policy(
        json!({"name": "solo", "algorithm": "fixed_window", "limit": 2, "window_ms": HOUR_MS}),
    )
    .await;
    // One entry of `limits` is the same policy, whatever the entry is called.
    app.create_policy(json!({"name": "solo-listed", "limits": [
        {"name": "only", "algorithm": "fixed_window", "limit": 2, "window_ms": HOUR_MS},
    ]}))
    .await;
    for name in ["solo", "solo-listed"] {
        for (allowed, left) in [(true, 1), (true, 0), (false, 0)] {
            let (d, h) = decide(&app, name, "k", 1).await;
            assert_eq!(d["allowed"], allowed, "{name}: {d}");
            assert_eq!(d["remaining"], left, "{name}: {d}");
            assert_eq!(d["limit"], 2, "{name}: {d}");
            assert!(d.get("limits").is_none(), "{name}: {d}");
            assert!(d.get("violated").is_none(), "{name}: {d}");
            assert_eq!(
                header(&h, "ratelimit-policy"),
                Some(format!("\"{name}\";q=2;w=3600"))
            );
            let rl = header(&h, "ratelimit").expect("RateLimit");
            let items = ratelimit_items(&rl);
            assert_eq!(items.len(), 1, "{rl}");
            assert_eq!((items[0].0.as_str(), items[0].1), (name, left), "{rl}");
            assert_eq!(header(&h, "retry-after").is_some(), !allowed, "{name}");
        }
    }
}

async fn replacing_a_policy_keeps_the_state_of_unchanged_limits_and_starts_the_others_afresh(
    backend: Backend,
) {
    let app = spawn_app(backend).await;
    clear_of_window_edges(&[HOUR_MS]).await;
    let fw = |name: &str, limit: u64, window_ms: u64| json!({"name": name, "algorithm": "fixed_window", "limit": limit, "window_ms": window_ms});
    app.create_policy(json!({"name": "evolve", "limits": [
        fw("same", 10, HOUR_MS),
        fw("raised", 10, HOUR_MS),
        fw("old-name", 10, HOUR_MS),
        {"name": "morph", "algorithm": "sliding_window_log", "limit": 10, "window_ms": HOUR_MS},
        fw("rewindowed", 10, HOUR_MS),
        {"name": "cell", "algorithm": "gcra", "rate": 1, "period_ms": DAY_MS, "burst": 10},
        {"name": "rerated", "algorithm": "gcra", "rate": 1, "period_ms": DAY_MS, "burst": 10},
    ]}))
    .await;
    let (d, _) = decide(&app, "evolve", "k", 4).await;
    assert_eq!(remaining(&d), [6; 7], "{d}");

    // Reordered too: a limit's state follows its name, not its place.
    let replacement = json!({"limits": [
        {"name": "cell", "algorithm": "gcra", "rate": 1, "period_ms": DAY_MS, "burst": 12},
        fw("new-name", 10, HOUR_MS),
        {"name": "morph", "algorithm": "fixed_window", "limit": 10, "window_ms": HOUR_MS},
        fw("rewindowed", 10, 2 * HOUR_MS),
        {"name": "rerated", "algorithm": "gcra", "rate": 2, "period_ms": DAY_MS, "burst": 10},
        fw("raised", 20, HOUR_MS),
        fw("same", 10, HOUR_MS),
    ]});
    let r = app.put("/v1/policies/evolve", &replacement).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    let (d, _) = decide(&app, "evolve", "k", 1).await;
    assert_eq!(d["allowed"], true, "{d}");
    let expected = [
        ("cell", 12 - 5),       // kept: a changed burst keeps a GCRA's state
        ("new-name", 9),        // renamed: afresh
        ("morph", 9),           // another algorithm: afresh
        ("rewindowed", 10 - 5), // another window: the hour's count kept until the hour ends
        ("rerated", 10 - 5),    // another rate: the units in use kept
        ("raised", 20 - 5),     // kept: only the quota changed
        ("same", 10 - 5),       // kept
    ];
    let got: Vec<(String, u64)> = per_limit(&d, "name")
        .iter()
        .map(|n| n.as_str().expect("name").to_owned())
        .zip(remaining(&d))
        .collect();
    let expected: Vec<(String, u64)> = expected.iter().map(|(n, r)| (n.to_string(), *r)).collect();
    assert_eq!(got, expected, "{d}");

    // A policy of one limit that gains a second keeps the first's state when it keeps its name.
    app.create_policy(fw("grow", 10, HOUR_MS)).await;
    assert_eq!(decide(&app, "grow", "k", 3).await.0["remaining"], 7);
    let grown = json!({"limits": [fw("grow", 10, HOUR_MS), fw("daily", 100, DAY_MS)]});
    assert_eq!(app.put("/v1/policies/grow", &grown).await.status(), 200);
    let (d, _) = decide(&app, "grow", "k", 1).await;
    assert_eq!(remaining(&d), [6, 99], "{d}");
}

// ---- Policy documents: the same on every store, so tested on the embedded one ----

fn config_file(tag: &str, text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "ratelimiter-limits-{tag}-{}.toml",
        std::process::id()
    ));
    std::fs::write(&path, text).expect("write config");
    path
}

const CONFIGURED: &str = r#"
[[policies]]
name = "file-tables"
description = "limits as arrays of tables"
fail_mode = "closed"

[[policies.limits]]
name = "minute"
algorithm = "fixed_window"
limit = 50
window_ms = 60000

[[policies.limits]]
name = "day"
algorithm = "sliding_window_counter"
limit = 60
window_ms = 86400000

[[policies]]
name = "file-inline"
limits = [
  { name = "burst", algorithm = "token_bucket", capacity = 20, refill_tokens = 10, refill_period_ms = 1000 },
  { name = "daily", algorithm = "gcra", rate = 10000, period_ms = 86400000, burst = 10000 },
]

[[policies]]
name = "file-one"
limits = [{ algorithm = "sliding_window_log", limit = 5, window_ms = 1000 }]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_policies_of_several_limits_are_read_in_both_toml_forms() {
    let path = config_file("both-forms", CONFIGURED);
    let app = spawn_app_with_file(None, &[], Some(&path)).await;
    let _ = std::fs::remove_file(&path);
    let read = |name: &'static str| {
        let app = &app;
        async move {
            let r = app.get(&format!("/v1/policies/{name}")).await;
            assert_eq!(r.status(), 200, "{name}");
            r.json::<Value>().await.expect("JSON")
        }
    };
    assert_eq!(
        read("file-tables").await,
        json!({"name": "file-tables", "limits": [
            {"name": "minute", "algorithm": "fixed_window", "limit": 50, "window_ms": 60_000},
            {"name": "day", "algorithm": "sliding_window_counter", "limit": 60, "window_ms": DAY_MS},
        ], "description": "limits as arrays of tables", "fail_mode": "closed", "mode": "enforce"})
    );
    assert_eq!(
        read("file-inline").await,
        json!({"name": "file-inline", "limits": [
            {"name": "burst", "algorithm": "token_bucket", "capacity": 20, "refill_tokens": 10, "refill_period_ms": 1000},
            {"name": "daily", "algorithm": "gcra", "rate": 10_000, "period_ms": DAY_MS, "burst": 10_000},
        ], "fail_mode": "open", "mode": "enforce"})
    );
    assert_eq!(
        read("file-one").await,
        json!({"name": "file-one", "algorithm": "sliding_window_log", "limit": 5, "window_ms": 1000, "fail_mode": "open", "mode": "enforce"})
    );
    clear_of_window_edges(&[60_000, DAY_MS]).await;
    let (d, _) = decide(&app, "file-tables", "k", 1).await;
    assert_eq!(per_limit(&d, "name"), [json!("minute"), json!("day")]);
    assert_eq!(remaining(&d), [49, 59]);

    // A bad limit in the file stops the start, naming it.
    let bad = CONFIGURED.replacen("name = \"day\"", "name = \"minute\"", 1);
    let path = config_file("bad-limit", &bad);
    let e = ratelimiter::config::Settings::load_from(Some(&path), Vec::new())
        .expect_err("a repeated limit name is refused");
    let _ = std::fs::remove_file(&path);
    assert!(e.to_string().contains("policies[0].limits[1].name"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_read_back_in_the_limits_form_and_one_in_the_flat_form() {
    let app = spawn_app(Backend::Embedded).await;
    let several = json!({"name": "several", "limits": [
        {"name": "a", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000},
        {"name": "b", "algorithm": "gcra", "rate": 1, "period_ms": 1000, "burst": 3},
    ], "fail_mode": "local", "mode": "shadow"});
    app.create_policy(several.clone()).await;
    let got: Value = app
        .get("/v1/policies/several")
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(got, several);

    let flat = json!({"algorithm": "token_bucket", "capacity": 4, "refill_tokens": 1, "refill_period_ms": 500, "fail_mode": "open", "mode": "enforce"});
    for (name, limit) in [
        (
            "one-named",
            json!({"name": "whatever", "algorithm": "token_bucket", "capacity": 4, "refill_tokens": 1, "refill_period_ms": 500}),
        ),
        (
            "one-unnamed",
            json!({"algorithm": "token_bucket", "capacity": 4, "refill_tokens": 1, "refill_period_ms": 500}),
        ),
    ] {
        let r = app
            .post("/v1/policies", &json!({"name": name, "limits": [limit]}))
            .await;
        assert_eq!(r.status(), 201, "{name}");
        let mut expected = flat.clone();
        expected["name"] = json!(name);
        assert_eq!(r.json::<Value>().await.expect("JSON"), expected, "{name}");
        let got: Value = app
            .get(&format!("/v1/policies/{name}"))
            .await
            .json()
            .await
            .expect("JSON");
        assert_eq!(got, expected, "{name}");
    }
    let listed = app.policies().await;
    let forms: Vec<(&str, bool)> = listed["policies"]
        .as_array()
        .expect("array")
        .iter()
        .map(|p| (p["name"].as_str().expect("name"), p.get("limits").is_some()))
        .collect();
    assert_eq!(
        forms,
        [
            ("one-named", false),
            ("one-unnamed", false),
            ("several", true)
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_read_back_and_written_again_is_unchanged() {
    let app = spawn_app(Backend::Embedded).await;
    clear_of_window_edges(&[HOUR_MS]).await;
    app.create_policy(json!({"name": "again", "description": "twice", "limits": [
        {"name": "window", "algorithm": "fixed_window", "limit": 5, "window_ms": HOUR_MS},
        {"name": "log", "algorithm": "sliding_window_log", "limit": 7, "window_ms": HOUR_MS},
        {"name": "bucket", "algorithm": "token_bucket", "capacity": 9, "refill_tokens": 1, "refill_period_ms": DAY_MS},
    ]}))
    .await;
    assert_eq!(remaining(&decide(&app, "again", "k", 2).await.0), [3, 5, 7]);
    let r = app.get("/v1/policies/again").await;
    let etag = header(r.headers(), "etag").expect("ETag");
    let read: Value = r.json().await.expect("JSON");

    let r = app.put("/v1/policies/again", &read).await;
    assert_eq!(r.status(), 200);
    assert_ne!(header(r.headers(), "etag"), Some(etag), "a new version");
    assert_eq!(r.json::<Value>().await.expect("JSON"), read);
    let reread: Value = app
        .get("/v1/policies/again")
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(reread, read);
    assert_eq!(
        remaining(&decide(&app, "again", "k", 1).await.0),
        [2, 4, 6],
        "every limit kept its state"
    );
}

/// A policy of several limits with `f` applied to its document.
fn broken(f: impl FnOnce(&mut Value)) -> Value {
    let mut v = json!({"name": "broken", "limits": [
        {"name": "a", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000},
        {"name": "b", "algorithm": "token_bucket", "capacity": 5, "refill_tokens": 1, "refill_period_ms": 1000},
    ]});
    f(&mut v);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_limits_are_refused_naming_the_field_and_change_nothing() {
    let app = spawn_app(Backend::Embedded).await;
    let limit = |i: usize| json!({"name": format!("l{i}"), "algorithm": "fixed_window", "limit": 5, "window_ms": 1000});
    let cases: Vec<(&str, Value, u16, &str)> = vec![
        (
            "no limits",
            broken(|v| v["limits"] = json!([])),
            422,
            "limits",
        ),
        (
            "nine limits",
            broken(|v| v["limits"] = (0..9).map(limit).collect()),
            422,
            "limits",
        ),
        (
            "a repeated name",
            broken(|v| v["limits"][1]["name"] = json!("a")),
            422,
            "limits[1].name",
        ),
        (
            "a nameless limit among several",
            broken(|v| {
                v["limits"][1].as_object_mut().map(|l| l.remove("name"));
            }),
            422,
            "limits[1].name",
        ),
        (
            "a limit name outside the pattern",
            broken(|v| v["limits"][0]["name"] = json!("a/b")),
            422,
            "limits[0].name",
        ),
        (
            "an unknown field in a limit",
            broken(|v| v["limits"][1]["colour"] = json!(1)),
            422,
            "limits[1].colour",
        ),
        (
            "another algorithm's field in a limit",
            broken(|v| v["limits"][0]["capacity"] = json!(5)),
            422,
            "limits[0].capacity",
        ),
        (
            "a value out of range",
            broken(|v| v["limits"][1]["capacity"] = json!(0)),
            422,
            "limits[1].capacity",
        ),
        (
            "a missing field",
            broken(|v| {
                v["limits"][0]
                    .as_object_mut()
                    .map(|l| l.remove("window_ms"));
            }),
            422,
            "limits[0].window_ms",
        ),
        (
            "`algorithm` beside `limits`",
            broken(|v| v["algorithm"] = json!("fixed_window")),
            422,
            "algorithm",
        ),
        (
            "a limit field beside `limits`",
            broken(|v| v["limit"] = json!(5)),
            422,
            "limit",
        ),
        (
            "`limits` not an array",
            broken(|v| v["limits"] = json!({"a": 1})),
            400,
            "limits",
        ),
        (
            "a limit not an object",
            broken(|v| v["limits"][1] = json!(5)),
            400,
            "limits[1]",
        ),
        (
            "a limit name not a string",
            broken(|v| v["limits"][0]["name"] = json!(7)),
            400,
            "limits[0].name",
        ),
        (
            "a number as a string",
            broken(|v| v["limits"][1]["capacity"] = json!("5")),
            400,
            "limits[1].capacity",
        ),
    ];

    let kept = json!({"name": "kept", "limits": [
        {"name": "x", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000},
        {"name": "y", "algorithm": "gcra", "rate": 1, "period_ms": 1000, "burst": 2},
    ]});
    app.create_policy(kept.clone()).await;
    let etag = |r: &reqwest::Response| header(r.headers(), "etag").expect("ETag");
    let kept_etag = etag(&app.get("/v1/policies/kept").await);
    let before = app.policies().await;

    for (what, body, status, field) in cases {
        let mut put_body = body.clone();
        put_body["name"] = json!("kept");
        for (method, r) in [
            ("POST", app.post("/v1/policies", &body).await),
            ("PUT", app.put("/v1/policies/kept", &put_body).await),
        ] {
            assert_eq!(r.status(), status, "{method} {what}: {body}");
            assert_eq!(
                header(r.headers(), "content-type").as_deref(),
                Some("application/problem+json"),
                "{method} {what}"
            );
            let problem: Value = r.json().await.expect("problem JSON");
            assert_eq!(problem["field"], field, "{method} {what}: {problem}");
            assert_eq!(problem["status"], status, "{method} {what}");
            let detail = problem["detail"].as_str().expect("detail");
            assert!(detail.contains(field), "{method} {what}: {detail}");
        }
    }
    assert_eq!(
        app.policies().await,
        before,
        "nothing was created or changed"
    );
    let r = app.get("/v1/policies/kept").await;
    assert_eq!(etag(&r), kept_etag);
    assert_eq!(
        r.json::<Value>().await.expect("JSON")["limits"],
        kept["limits"]
    );
    assert_eq!(app.get("/v1/policies/broken").await.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_above_one_limits_quota_is_refused_naming_that_limit() {
    let app = spawn_app(Backend::Embedded).await;
    clear_of_window_edges(&[HOUR_MS]).await;
    app.create_policy(json!({"name": "costly", "limits": [
        {"name": "big", "algorithm": "fixed_window", "limit": 100, "window_ms": HOUR_MS},
        {"name": "small", "algorithm": "token_bucket", "capacity": 5, "refill_tokens": 1, "refill_period_ms": DAY_MS},
    ]}))
    .await;
    let r = app
        .post(
            "/v1/acquire",
            &json!({"policy": "costly", "key": "k", "cost": 6}),
        )
        .await;
    assert_eq!(r.status(), 422);
    assert_eq!(
        header(r.headers(), "content-type").as_deref(),
        Some("application/problem+json")
    );
    let problem: Value = r.json().await.expect("problem JSON");
    assert_eq!(problem["field"], "cost", "{problem}");
    let detail = problem["detail"].as_str().expect("detail");
    assert!(
        detail.contains("limit `small`") && detail.contains("`capacity` of 5"),
        "{detail}"
    );
    let (d, _) = decide(&app, "costly", "k", 5).await;
    assert_eq!(
        (d["allowed"].clone(), remaining(&d)),
        (json!(true), vec![95, 0]),
        "the refused cost took nothing: {d}"
    );
}
