//! `GET /v1/policies/{name}/top`: two instances on one real Redis under generated load (one
//! subject floods, many trickle) both name the flooder first, every count within the answer's
//! error bound of what was sent, and two on a Redis Cluster; the embedded store; the windows and
//! dimensions; joint (gRPC) acquires, overrides and fail-open answers counted; bad parameters;
//! admin tokens; salted hashes of the keys.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt};
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::helpers::{spawn_app_on_cluster, spawn_app_with, TestApp, TestCluster, TestRedis};

/// Folds every 50 ms, so that a test waits a fraction of a second for its counts.
const FAST_FOLD: (&str, &str) = ("RATELIMITER__TOP__FOLD_MS", "50");

/// 50 acquires per subject an hour: the flooder is denied past them, the trickle never is.
fn policy(name: &str) -> Value {
    json!({"name": name, "algorithm": "fixed_window", "limit": 50, "window_ms": 3_600_000})
}

/// What was sent, per subject: (denied, allowed, near_limit).
type Truth = HashMap<String, [u64; 3]>;

/// Sends the load: `flood` acquires of "flooder" and `per_trickle` of each of `trickles`
/// subjects, spread over `apps` in turn, 16 at a time; answers the true counts by subject.
async fn load(
    apps: &[&TestApp],
    policy: &str,
    flood: usize,
    trickles: usize,
    per_trickle: usize,
) -> Truth {
    let mut keys: Vec<String> = vec!["flooder".to_owned(); flood];
    for _ in 0..per_trickle {
        keys.extend((0..trickles).map(|t| format!("trickle-{t}")));
    }
    // Mixed (a fixed permutation), so that the summaries see the flood and the trickle at once.
    let n = keys.len();
    for i in (1..n).rev() {
        keys.swap(i, (i * 7_919 + 13) % (i + 1));
    }
    let answers: Vec<(String, Value)> = stream::iter(keys.into_iter().enumerate())
        .map(|(i, key)| {
            let app = apps[i % apps.len()];
            let (client, url) = (app.client.clone(), app.url("/v1/acquire"));
            let body = json!({"policy": policy, "key": key});
            async move {
                let r = client.post(url).json(&body).send().await.expect("sent");
                (key, r.json::<Value>().await.expect("JSON"))
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let mut truth = Truth::new();
    for (key, a) in answers {
        let allowed = a["allowed"].as_bool();
        assert!(allowed.is_some(), "{key}: an answer, not {a}");
        let counts = truth.entry(key).or_default();
        if allowed == Some(true) {
            counts[1] += 1;
            // Near the limit: at most 20 % of the 50 left.
            if a["remaining"].as_u64().expect("remaining") <= 10 {
                counts[2] += 1;
            }
        } else {
            counts[0] += 1;
        }
    }
    truth
}

/// Waits until every one of `apps` decides with the policy `name` (another instance's write
/// arrives within `redis.policy_refresh_ms`). Asked with a peek, which decides from the
/// instance's own cache as an acquire does (a `GET` of the policy reads the store) and counts
/// for no top offender.
async fn known(apps: &[&TestApp], name: &str) {
    let started = Instant::now();
    let peek = json!({"policy": name, "key": "known-probe"});
    for app in apps {
        while app.post("/v1/peek", &peek).await.status() != 200 {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{name} never arrived"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn top(app: &TestApp, policy: &str, query: &str) -> Value {
    let r = app.get(&format!("/v1/policies/{policy}/top?{query}")).await;
    assert_eq!(r.status(), 200, "top {query}");
    r.json().await.expect("JSON")
}

/// Polls `top` until its total of `by` reaches `total` (the folds have caught up), for at most
/// five seconds. A 503 is polled through too: `top` reads the store, and just after an outage
/// the store's breaker may still be open for its cool-down, so the store is not asked yet.
async fn settled(app: &TestApp, policy: &str, query: &str, total: u64) -> Value {
    let started = Instant::now();
    loop {
        let r = app.get(&format!("/v1/policies/{policy}/top?{query}")).await;
        let status = r.status();
        let answer: Value = r.json().await.expect("JSON");
        if status == 200 && answer["total"].as_u64() == Some(total) {
            return answer;
        }
        assert!(
            status == 200 || status == 503,
            "top {query}: {status} {answer}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the folds did not bring the total to {total}: {status} {answer}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every listed subject's counts are within the bounds the answer states of what was sent.
fn within_bounds(answer: &Value, truth: &Truth) {
    let bounds = &answer["error_bounds"];
    for s in answer["subjects"].as_array().expect("subjects") {
        let key = s["key"].as_str().expect("key");
        let sent = truth.get(key).copied().unwrap_or_default();
        for (d, name) in ["denied", "allowed", "near_limit"].into_iter().enumerate() {
            let counted = s[name].as_u64().expect("a count");
            let bound = bounds[name].as_u64().expect("a bound");
            assert!(
                counted.abs_diff(sent[d]) <= bound,
                "{key}: {name} {counted} answered, {} sent, bound {bound}: {answer}",
                sent[d]
            );
        }
    }
    let by = answer["by"].as_str().expect("by");
    assert_eq!(
        answer["error_bound"], bounds[by],
        "error_bound is the ranked dimension's"
    );
}

fn sum(truth: &Truth, d: usize) -> u64 {
    truth.values().map(|c| c[d]).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_name_the_flooder_first_within_the_bound() {
    let redis = Arc::new(TestRedis::start());
    // 16 subjects per summary, fewer than the trickle: the summaries evict, and the bound shows.
    let settings = [FAST_FOLD, ("RATELIMITER__TOP__SUBJECTS", "16")];
    let a = spawn_app_with(Some(redis.clone()), &settings).await;
    let b = spawn_app_with(Some(redis.clone()), &settings).await;
    a.create_policy(policy("top-shared")).await;
    known(&[&a, &b], "top-shared").await;
    let truth = load(&[&a, &b], "top-shared", 300, 120, 3).await;
    assert_eq!(truth["flooder"], [250, 50, 11], "the limit's own answers");
    for app in [&a, &b] {
        let denied = settled(app, "top-shared", "by=denied", sum(&truth, 0)).await;
        assert_eq!(denied["subjects"][0]["key"], "flooder", "{denied}");
        assert_eq!(
            denied["subjects"][0]["share"], 1.0,
            "only the flooder was denied"
        );
        within_bounds(&denied, &truth);
        let allowed = settled(app, "top-shared", "by=allowed&limit=100", sum(&truth, 1)).await;
        within_bounds(&allowed, &truth);
        assert!(
            allowed["error_bound"].as_u64().expect("bound") <= 2 * sum(&truth, 1) / 16,
            "at most 2 N / k: {allowed}"
        );
        assert!(allowed["subjects"].as_array().expect("subjects").len() <= 16);
        let near = settled(app, "top-shared", "by=near_limit", 11).await;
        assert_eq!(near["subjects"][0]["key"], "flooder", "{near}");
        within_bounds(&near, &truth);
    }
    // Every key Redis holds for the summaries ends within the hour and two minutes.
    let mut conn = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("rl:{top/top-shared}:*")
        .query(&mut conn)
        .expect("KEYS");
    assert_eq!(keys.len() % 4, 0, "four keys a minute: {keys:?}");
    assert!(!keys.is_empty());
    for key in keys {
        let ttl: i64 = redis::cmd("TTL").arg(&key).query(&mut conn).expect("TTL");
        assert!((1..=62 * 60).contains(&ttl), "{key}: TTL {ttl}");
        if !key.ends_with(":m") {
            let members: u64 = redis::cmd("ZCARD")
                .arg(&key)
                .query(&mut conn)
                .expect("ZCARD");
            assert!(members <= 16, "{key}: {members} members");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_a_redis_cluster_name_the_flooder_first_within_the_bound() {
    let cluster = Arc::new(TestCluster::start());
    let settings = [FAST_FOLD, ("RATELIMITER__TOP__SUBJECTS", "16")];
    let a = spawn_app_on_cluster(cluster.clone(), &settings).await;
    let b = spawn_app_on_cluster(cluster.clone(), &settings).await;
    a.create_policy(policy("top-cluster")).await;
    known(&[&a, &b], "top-cluster").await;
    let truth = load(&[&a, &b], "top-cluster", 300, 120, 3).await;
    assert_eq!(truth["flooder"], [250, 50, 11], "the limit's own answers");
    for app in [&a, &b] {
        let denied = settled(app, "top-cluster", "by=denied", sum(&truth, 0)).await;
        assert_eq!(denied["subjects"][0]["key"], "flooder", "{denied}");
        within_bounds(&denied, &truth);
        let allowed = settled(app, "top-cluster", "by=allowed&limit=100", sum(&truth, 1)).await;
        within_bounds(&allowed, &truth);
        assert!(
            allowed["error_bound"].as_u64().expect("bound") <= 2 * sum(&truth, 1) / 16,
            "at most 2 N / k: {allowed}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_acquires_count_as_allowed_and_arrive_once_redis_answers_again() {
    let redis = Arc::new(TestRedis::start());
    let app = spawn_app_with(Some(redis.clone()), &[FAST_FOLD]).await;
    app.create_policy(
        json!({"name": "top-open", "algorithm": "fixed_window", "limit": 1_000_000,
        "window_ms": 3_600_000, "fail_mode": "open"}),
    )
    .await;
    // A hung Redis: the acquires are answered by fail mode, and the folds fail with them.
    redis.signal("STOP");
    for _ in 0..12 {
        let a = app.acquire("top-open", "outage", 1).await;
        assert_eq!(a["decided_by"], "fail_open", "{a}");
    }
    redis.signal("CONT");
    let allowed = settled(&app, "top-open", "by=allowed", 12).await;
    assert_eq!(allowed["subjects"][0]["key"], "outage", "{allowed}");
    assert_eq!(allowed["subjects"][0]["allowed"], 12, "{allowed}");
    // Fail-open answers say nothing of how close the subject came.
    let near = settled(&app, "top-open", "by=near_limit", 0).await;
    assert_eq!(near["subjects"], json!([]), "{near}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_store_answers_every_window_and_dimension_from_its_own_summaries() {
    let app = spawn_app_with(None, &[FAST_FOLD]).await;
    app.create_policy(policy("top-local")).await;
    let truth = load(&[&app], "top-local", 120, 40, 2).await;
    assert_eq!(truth["flooder"], [70, 50, 11]);
    for window in ["1m", "5m", "1h"] {
        let denied = settled(&app, "top-local", &format!("window={window}"), 70).await;
        assert_eq!(
            (&denied["by"], &denied["window"]),
            (&json!("denied"), &json!(window))
        );
        assert_eq!(denied["subjects"][0]["key"], "flooder");
        // Below the capacity, the counts are exact.
        assert_eq!(denied["error_bound"], 0);
        assert_eq!(
            denied["subjects"][0],
            json!({"key": "flooder", "denied": 70, "allowed": 50, "near_limit": 11, "share": 1.0})
        );
        let allowed = settled(
            &app,
            "top-local",
            &format!("by=allowed&window={window}&limit=3"),
            sum(&truth, 1),
        )
        .await;
        let subjects = allowed["subjects"].as_array().expect("subjects");
        assert_eq!(subjects.len(), 3, "limit");
        assert_eq!(subjects[0]["key"], "flooder");
        assert_eq!(subjects[1]["allowed"], 2);
        within_bounds(&allowed, &truth);
    }
    // The default limit is 10.
    let allowed = top(&app, "top-local", "by=allowed").await;
    assert_eq!(allowed["subjects"].as_array().expect("subjects").len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joint_grpc_acquires_and_overrides_are_counted() {
    let app = spawn_app_with(
        None,
        &[FAST_FOLD, ("RATELIMITER__GRPC__BIND", "127.0.0.1:0")],
    )
    .await;
    app.create_policy(json!({
        "name": "top-edge", "algorithm": "token_bucket",
        "capacity": 100, "refill_tokens": 100, "refill_period_ms": 3_600_000,
        "descriptor": {"domain": "edge", "entries": [{"key": "remote_address"}]}
    }))
    .await;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    let port = app.grpc_port.expect("gRPC");
    let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .expect("gRPC connects");
    let descriptor = |address: &str| RateLimitDescriptor {
        entries: vec![Entry {
            key: "remote_address".to_owned(),
            value: address.to_owned(),
        }],
        ..RateLimitDescriptor::default()
    };
    for _ in 0..7 {
        // Two descriptors in one call: the joint step.
        let req = RateLimitRequest {
            domain: "edge".to_owned(),
            descriptors: vec![descriptor("10.0.0.1"), descriptor("10.0.0.2")],
            hits_addend: 0,
        };
        client.should_rate_limit(req).await.expect("an answer");
    }
    let allowed = settled(&app, "top-edge", "by=allowed", 14).await;
    let subjects = allowed["subjects"].as_array().expect("subjects");
    assert_eq!(subjects.len(), 2, "{allowed}");
    assert!(subjects.iter().all(|s| s["allowed"] == 7), "{allowed}");

    // A blocked subject's denials are counted, though the store is never asked.
    let r = app
        .post(
            "/v1/policies/top-edge/overrides",
            &json!({"match": {"key": "blocked"}, "block": true}),
        )
        .await;
    assert_eq!(r.status(), 201);
    for _ in 0..3 {
        app.acquire("top-edge", "blocked", 1).await;
    }
    let denied = settled(&app, "top-edge", "", 3).await;
    assert_eq!(denied["subjects"][0]["key"], "blocked", "{denied}");
    assert_eq!(denied["subjects"][0]["denied"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_parameters_are_400_naming_them_and_an_unknown_policy_404() {
    let app = spawn_app_with(None, &[]).await;
    app.create_policy(policy("top-params")).await;
    for (query, field) in [
        ("by=rejected", "by"),
        ("window=2m", "window"),
        ("window=", "window"),
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("limit=ten", "limit"),
        ("limit=-1", "limit"),
        ("by=denied&by=allowed", "by"),
        ("sort=denied", "sort"),
    ] {
        let r = app
            .get(&format!("/v1/policies/top-params/top?{query}"))
            .await;
        assert_eq!(r.status(), 400, "{query}");
        assert_eq!(
            r.headers()["content-type"],
            "application/problem+json",
            "{query}"
        );
        let problem: Value = r.json().await.expect("JSON");
        assert_eq!(problem["field"], field, "{query}: {problem}");
        assert_eq!(problem["type"], "urn:ratelimiter:problem:malformed-query");
    }
    let r = app.get("/v1/policies/none-such/top").await;
    assert_eq!(r.status(), 404);
    let r = app.post("/v1/policies/top-params/top", &json!({})).await;
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "GET");
    // A policy nobody has decided for yet: no subjects, no error.
    let empty = top(&app, "top-params", "by=near_limit&window=1h&limit=100").await;
    assert_eq!(
        empty,
        json!({"policy": "top-params", "by": "near_limit", "window": "1h", "error_bound": 0,
               "error_bounds": {"denied": 0, "allowed": 0, "near_limit": 0}, "total": 0,
               "subjects": []})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_admin_tokens_top_needs_one() {
    let app = spawn_app_with(
        None,
        &[
            ("RATELIMITER__AUTH__ADMIN_TOKENS", "admin-one"),
            ("RATELIMITER__AUTH__CLIENT_TOKENS", "client-one"),
        ],
    )
    .await;
    let created = app
        .client
        .post(app.url("/v1/policies"))
        .bearer_auth("admin-one")
        .json(&policy("top-guarded"))
        .send()
        .await
        .expect("sent");
    assert_eq!(created.status(), 201);
    let url = app.url("/v1/policies/top-guarded/top");
    let none = app.client.get(&url).send().await.expect("sent");
    assert_eq!(none.status(), 401);
    for (token, status) in [("client-one", 401), ("admin-two", 401), ("admin-one", 200)] {
        let r = app
            .client
            .get(&url)
            .bearer_auth(token)
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), status, "{token}");
    }
}

/// `hmac:` and the first 16 bytes of HMAC-SHA-256 of `key` under `salt`, in hex.
fn hashed(salt: &str, key: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(salt.as_bytes()).expect("any key length");
    mac.update(key.as_bytes());
    let digest = mac.finalize().into_bytes();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("hmac:{hex}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashed_keys_are_salted_hmacs_alike_on_instances_sharing_the_salt() {
    let redis = Arc::new(TestRedis::start());
    let salt = "a-salt-shared-by-every-instance";
    let shared = [
        FAST_FOLD,
        ("RATELIMITER__TOP__HASH_KEYS", "true"),
        ("RATELIMITER__TOP__SALT", salt),
    ];
    let a = spawn_app_with(Some(redis.clone()), &shared).await;
    let b = spawn_app_with(Some(redis.clone()), &shared).await;
    let own = spawn_app_with(
        Some(redis.clone()),
        &[FAST_FOLD, ("RATELIMITER__TOP__HASH_KEYS", "true")],
    )
    .await;
    a.create_policy(policy("top-hashed")).await;
    known(&[&a, &b, &own], "top-hashed").await;
    for _ in 0..4 {
        a.acquire("top-hashed", "alice@example.com", 1).await;
    }
    b.acquire("top-hashed", "bob@example.com", 1).await;
    let expected = json!([
        hashed(salt, "alice@example.com"),
        hashed(salt, "bob@example.com")
    ]);
    for app in [&a, &b] {
        let answer = settled(app, "top-hashed", "by=allowed", 5).await;
        let keys: Vec<&Value> = answer["subjects"]
            .as_array()
            .expect("subjects")
            .iter()
            .map(|s| &s["key"])
            .collect();
        assert_eq!(json!(keys), expected, "{answer}");
        assert_eq!(answer["subjects"][0]["allowed"], 4);
    }
    // Without the salt, an instance draws its own: the same subject, another hash.
    let answer = settled(&own, "top-hashed", "by=allowed", 5).await;
    let key = answer["subjects"][0]["key"].as_str().expect("key");
    assert!(key.starts_with("hmac:") && key.len() == 37, "{key}");
    assert_ne!(json!(key), expected[0]);
}

/// Folds `tallies` twice as `fold` and once as a later fold, into `store`, and reads the minute.
async fn fold_twice_then_once(store: &ratelimiter::store::RedisStore) -> Vec<u64> {
    use ratelimiter::store::top::{FoldId, Tally};
    let one = Tally {
        total: 3,
        bound: 0,
        entries: vec![("resent".to_owned(), 3)],
    };
    let tallies = [one, Tally::default(), Tally::default()];
    let fold = FoldId {
        instance: 0xfeed,
        seq: 7,
    };
    for f in [fold, fold, FoldId { seq: 8, ..fold }] {
        store
            .fold_top("top-once", 42, 16, f, &tallies)
            .await
            .expect("fold");
    }
    // A fold of another instance with a lower number is its own.
    let other = FoldId {
        instance: 0xbeef,
        seq: 1,
    };
    store
        .fold_top("top-once", 42, 16, other, &tallies)
        .await
        .expect("fold");
    let minute = store.read_top("top-once", &[42]).await.expect("read");
    let denied = &minute[0].tallies[0];
    vec![denied.total, denied.entries[0].1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fold_sent_again_after_an_unknown_outcome_counts_once() {
    use ratelimiter::store::connection::ConnectionMode;
    use ratelimiter::store::RedisStore;
    let redis = TestRedis::start();
    let store = RedisStore::open(
        &redis.url(),
        ConnectionMode::Multiplexed,
        1,
        Duration::from_secs(5),
        "rl",
    )
    .expect("store");
    assert_eq!(
        fold_twice_then_once(&store).await,
        [9, 9],
        "three folds of 3"
    );
    let cluster = TestCluster::start();
    let seeds: Vec<String> = cluster.seeds().split(',').map(str::to_owned).collect();
    let store = RedisStore::open_cluster(&seeds, Duration::from_secs(5), "rl")
        .await
        .expect("cluster store");
    assert_eq!(
        fold_twice_then_once(&store).await,
        [9, 9],
        "on a Cluster too"
    );
}
