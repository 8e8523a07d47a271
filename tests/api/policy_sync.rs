//! Policies at scale and under races: the cap, the paged list, paged and incremental loading,
//! unknown names, Redis losing its data, readiness, conditional writes, writes whose outcome is
//! unknown, configured policies deleted through the API, and each instance's view.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use serde_json::{json, Value};

use crate::helpers::{spawn_app, spawn_app_with, spawn_app_with_file, Backend, TestApp, TestRedis};
use crate::instances::within;

fn window(name: &str, limit: u64) -> Value {
    json!({"name": name, "algorithm": "fixed_window", "limit": limit, "window_ms": 3_600_000})
}

/// Calls of one Redis command so far, from `INFO commandstats` (calls from scripts included).
fn calls(redis: &TestRedis, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut redis.conn())
        .expect("INFO");
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A sample of the app's Prometheus text, by metric name and one `label="value"`.
async fn metric(app: &TestApp, name: &str, label: &str) -> f64 {
    let text = app.get("/metrics").await.text().await.expect("text");
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .find_map(|l| l.rsplit(' ').next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

/// An instance's own view of its policies, from `/readyz`.
async fn view(app: &TestApp) -> Value {
    let ready: Value = app.get("/readyz").await.json().await.expect("JSON");
    ready["policies"].clone()
}

async fn problem_type(r: reqwest::Response) -> (u16, String, Value) {
    let status = r.status().as_u16();
    let body: Value = r.json().await.expect("problem JSON");
    (
        status,
        body["type"].as_str().unwrap_or_default().to_owned(),
        body,
    )
}

fn etag(r: &reqwest::Response) -> String {
    r.headers()
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .expect("an ETag header")
        .to_owned()
}

/// A write to `/v1/policies/<name>` with one precondition header; a PUT when `limit` is given.
async fn conditional(
    app: &TestApp,
    name: &str,
    header: &str,
    value: &str,
    limit: Option<u64>,
) -> reqwest::Response {
    let url = app.url(&format!("/v1/policies/{name}"));
    let request = match limit {
        Some(limit) => app.client.put(url).json(&window(name, limit)),
        None => app.client.delete(url),
    };
    request.header(header, value).send().await.expect("sent")
}

async fn acquire_raw(app: &TestApp, policy: &str) -> reqwest::Response {
    app.post("/v1/acquire", &json!({"policy": policy, "key": "k"}))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_beyond_the_policy_cap_is_refused_and_changes_nothing() {
    for backend in [Backend::Embedded, Backend::Redis] {
        let redis = (backend == Backend::Redis).then(|| Arc::new(TestRedis::start()));
        let app = spawn_app_with(redis, &[("RATELIMITER__LIMITS__MAX_POLICIES", "3")]).await;
        for i in 0..3 {
            app.create_policy(window(&format!("p{i}"), 1)).await;
        }
        let (status, kind, body) =
            problem_type(app.post("/v1/policies", &window("p3", 1)).await).await;
        assert_eq!(
            (status, kind.as_str()),
            (409, "urn:ratelimiter:problem:too-many-policies"),
            "{backend:?}: {body}"
        );
        let (status, kind, _) =
            problem_type(app.put("/v1/policies/p3", &window("p3", 1)).await).await;
        assert_eq!(
            (status, kind.as_str()),
            (409, "urn:ratelimiter:problem:too-many-policies")
        );
        // Replacing one that exists is no new policy.
        assert_eq!(
            app.put("/v1/policies/p0", &window("p0", 5)).await.status(),
            200
        );
        assert_eq!(app.get("/v1/policies/p3").await.status(), 404);
        let listed = app.policies().await;
        assert_eq!(
            listed["policies"].as_array().map(Vec::len),
            Some(3),
            "{backend:?}"
        );
        // Room again after a deletion.
        assert_eq!(app.delete("/v1/policies/p1").await.status(), 204);
        app.create_policy(window("p3", 1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_list_comes_in_pages_sorted_by_name() {
    for backend in [Backend::Embedded, Backend::Redis] {
        let app = spawn_app(backend).await;
        for name in ["e", "a", "g", "c", "b", "f", "d"] {
            app.create_policy(window(name, 1)).await;
        }
        let mut names = Vec::new();
        let mut url = "/v1/policies?limit=3".to_owned();
        let mut pages = 0;
        loop {
            let page: Value = app.get(&url).await.json().await.expect("JSON");
            pages += 1;
            let got = page["policies"].as_array().expect("policies");
            assert!(got.len() <= 3);
            names.extend(
                got.iter()
                    .map(|p| p["name"].as_str().unwrap_or("").to_owned()),
            );
            match page["next_cursor"].as_str() {
                Some(cursor) => url = format!("/v1/policies?limit=3&cursor={cursor}"),
                None => break,
            }
        }
        assert_eq!(names, ["a", "b", "c", "d", "e", "f", "g"], "{backend:?}");
        assert_eq!(pages, 3);
        for bad in ["limit=0", "limit=1001", "limit=x", "page=2"] {
            let (status, _, body) =
                problem_type(app.get(&format!("/v1/policies?{bad}")).await).await;
            assert_eq!(status, 422, "{bad}: {body}");
            assert!(body["field"].is_string(), "{bad}: {body}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_instance_loads_many_policies_in_pages_then_follows_only_the_changes() {
    let redis = Arc::new(TestRedis::start());
    let a = spawn_app_with(Some(redis.clone()), &[]).await;
    let count = 1_200;
    for chunk in (0..count).collect::<Vec<_>>().chunks(50) {
        join_all(
            chunk
                .iter()
                .map(|i| a.create_policy(window(&format!("bulk-{i:04}"), 1))),
        )
        .await;
    }
    let b = spawn_app_with(Some(redis.clone()), &[]).await;
    // 1,200 policies at 500 a page: three pages, each its own store call.
    let loaded = view(&b).await;
    assert_eq!(loaded["count"], count);
    let full = loaded["full_pages"].as_u64().expect("full_pages");
    assert!(full >= 3, "loaded in {full} pages");

    // A change reaches B as one incremental page, without another full load.
    let before = loaded["incremental_pages"]
        .as_u64()
        .expect("incremental_pages");
    assert_eq!(
        a.put("/v1/policies/bulk-0007", &window("bulk-0007", 9))
            .await
            .status(),
        200
    );
    within(Duration::from_secs(1), || async {
        b.acquire("bulk-0007", "k", 1).await["limit"] == 9
    })
    .await;
    let followed = view(&b).await;
    assert!(
        followed["incremental_pages"].as_u64() > Some(before),
        "{followed}"
    );
    assert_eq!(followed["full_pages"], full);
    // The process-wide metric counts the same pages (other tests' instances add theirs).
    assert!(metric(&b, "ratelimiter_policy_pages_total", "kind=\"full\"").await >= full as f64);

    // Idle, both instances poll with one small read each, and read no policy.
    let (hgetall, evalsha) = (calls(&redis, "hgetall"), calls(&redis, "evalsha"));
    let idle = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        calls(&redis, "hgetall"),
        hgetall,
        "no policy read while idle"
    );
    let polls = calls(&redis, "evalsha") - evalsha;
    // Two instances polling every 100 ms: about 20 a second, far from one read per policy. Per
    // second measured, as a loaded machine may sleep longer than asked.
    let seconds = idle.elapsed().as_secs_f64();
    assert!(
        polls as f64 <= 40.0 * seconds,
        "{polls} calls in {seconds:.2} idle seconds"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_policy_names_do_not_cost_a_store_read_each() {
    let redis = Arc::new(TestRedis::start());
    let a = spawn_app_with(Some(redis.clone()), &[]).await;
    let b = spawn_app_with(Some(redis.clone()), &[]).await;
    let (hgetall, evalsha) = (calls(&redis, "hgetall"), calls(&redis, "evalsha"));
    let requests = 2_000;
    for chunk in (0..requests).collect::<Vec<_>>().chunks(100) {
        let answers = join_all(chunk.iter().map(|i| {
            let client = a.client.clone();
            let url = a.url("/v1/acquire");
            async move {
                client
                    .post(url)
                    .json(&json!({"policy": format!("nope-{i}"), "key": "k"}))
                    .send()
                    .await
                    .expect("sent")
                    .status()
            }
        }))
        .await;
        assert!(answers.iter().all(|s| s.as_u16() == 404));
    }
    assert_eq!(
        calls(&redis, "hgetall"),
        hgetall,
        "no policy read for unknown names"
    );
    let reads = calls(&redis, "evalsha") - evalsha;
    assert!(
        reads < requests / 10,
        "{reads} store reads for {requests} unknown names"
    );

    // A policy created through another instance is still found within the propagation bound.
    b.create_policy(window("late", 1)).await;
    within(Duration::from_secs(1), || async {
        acquire_raw(&a, "late").await.status() == 200
    })
    .await;
}

fn config_file(tag: &str, text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("ratelimiter-{tag}-{}.toml", std::process::id()));
    std::fs::write(&path, text).expect("write config");
    path
}

const CONFIGURED: &str =
    "[[policies]]\nname = \"from-file\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow_ms = 60000\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_notices_redis_lost_its_data_and_recreates_the_configured_policies() {
    let redis = Arc::new(TestRedis::start());
    let path = config_file("lost", CONFIGURED);
    let a = spawn_app_with_file(Some(redis.clone()), &[], Some(&path)).await;
    let other = spawn_app_with(Some(redis.clone()), &[]).await;
    a.create_policy(window("made-by-api", 1)).await;
    assert_eq!(a.acquire("made-by-api", "k", 1).await["allowed"], true);
    let before: Value = a.get("/readyz").await.json().await.expect("JSON");

    // Redis restarts with nothing (it keeps nothing on disk here).
    redis.restart();
    // As many writes as before, so the version counter is back where it was.
    other.create_policy(window("after-restart", 1)).await;

    within(Duration::from_secs(2), || async {
        acquire_raw(&a, "from-file").await.status() == 200
            && acquire_raw(&a, "made-by-api").await.status() == 404
            && acquire_raw(&a, "after-restart").await.status() == 200
    })
    .await;
    let after: Value = a.get("/readyz").await.json().await.expect("JSON");
    assert_ne!(
        before["policies"]["generation"], after["policies"]["generation"],
        "a new generation of the store"
    );
    let _ = std::fs::remove_file(path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_policy_deleted_through_the_api_stays_deleted() {
    let redis = Arc::new(TestRedis::start());
    let path = config_file("deleted", CONFIGURED);
    let a = spawn_app_with_file(Some(redis.clone()), &[], Some(&path)).await;
    assert_eq!(a.delete("/v1/policies/from-file").await.status(), 204);
    // Another instance, or this one restarted, with the same file.
    let b = spawn_app_with_file(Some(redis.clone()), &[], Some(&path)).await;
    assert_eq!(b.get("/v1/policies/from-file").await.status(), 404);
    assert_eq!(acquire_raw(&b, "from-file").await.status(), 404);
    // Created again through the API, it is an ordinary policy.
    a.create_policy(window("from-file", 2)).await;
    let _ = std::fs::remove_file(path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_is_refused_while_redis_is_out_of_memory_without_revealing_redis_text() {
    let redis = Arc::new(TestRedis::start());
    let app = spawn_app_with(Some(redis.clone()), &[]).await;
    assert_eq!(app.get("/readyz").await.status(), 200);
    let set_maxmemory = |bytes: &str| {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(bytes)
            .query(&mut redis.conn())
            .expect("CONFIG SET");
    };
    set_maxmemory("1");
    let (status, kind, body) = problem_type(app.get("/readyz").await).await;
    assert_eq!(
        (status, kind.as_str()),
        (503, "urn:ratelimiter:problem:not-ready")
    );
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("refuses writes"), "{detail}");
    // Policy writes refused by Redis say nothing of Redis's own words either.
    let (status, _, body) = problem_type(app.post("/v1/policies", &window("oom", 1)).await).await;
    assert_eq!(status, 503);
    for text in [body.to_string(), detail.to_owned()] {
        for raw in ["OOM", "script", "lua", "f_", "@user"] {
            assert!(!text.contains(raw), "{raw} in {text}");
        }
    }
    set_maxmemory("0");
    assert_eq!(app.get("/readyz").await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_is_refused_while_the_policy_cache_cannot_be_brought_up_to_date() {
    let redis = Arc::new(TestRedis::start());
    let app = spawn_app_with(Some(redis.clone()), &[]).await;
    assert_eq!(app.get("/readyz").await.status(), 200);
    // The change log is broken (another program wrote a string where it lives), while Redis
    // itself answers and takes writes.
    let mut conn = redis.conn();
    let _: () = redis::cmd("SET")
        .arg("rl:{policies}:names")
        .arg("squatted")
        .query(&mut conn)
        .expect("SET");
    let _: () = redis::cmd("HINCRBY")
        .arg("rl:{policies}:meta")
        .arg("version")
        .arg(1)
        .query(&mut conn)
        .expect("HINCRBY");
    within(Duration::from_secs(5), || async {
        let (status, _, body) = problem_type(app.get("/readyz").await).await;
        status == 503
            && body["detail"]
                .as_str()
                .is_some_and(|d| d.contains("not been brought up to date"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_is_refused_while_a_configured_policy_is_missing() {
    let redis = Arc::new(TestRedis::start());
    let two = format!(
        "{CONFIGURED}\n[[policies]]\nname = \"second\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow_ms = 60000\n"
    );
    let path = config_file("missing", &two);
    let cap = [("RATELIMITER__LIMITS__MAX_POLICIES", "1")];
    let app = spawn_app_with_file(Some(redis.clone()), &cap, Some(&path)).await;
    let (status, _, body) = problem_type(app.get("/readyz").await).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("configuration file are missing")),
        "{body}"
    );
    // Room is made: the missing one is created, and the instance is ready.
    assert_eq!(app.delete("/v1/policies/from-file").await.status(), 204);
    within(Duration::from_secs(2), || async {
        app.get("/readyz").await.status() == 200
    })
    .await;
    assert_eq!(acquire_raw(&app, "second").await.status(), 200);
    let _ = std::fs::remove_file(path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditional_writes_let_admins_not_overwrite_each_other() {
    for backend in [Backend::Embedded, Backend::Redis] {
        let app = spawn_app(backend).await;
        let r = app.post("/v1/policies", &window("cond", 1)).await;
        assert_eq!(r.status(), 201);
        let created = etag(&r);
        let r = app.get("/v1/policies/cond").await;
        assert_eq!(etag(&r), created, "GET shows the version created");

        // Two admins change it from the same version: one wins, the other is told.
        let (first, second) = tokio::join!(
            conditional(&app, "cond", "If-Match", &created, Some(2)),
            conditional(&app, "cond", "If-Match", &created, Some(3)),
        );
        let mut statuses = [first.status().as_u16(), second.status().as_u16()];
        statuses.sort_unstable();
        assert_eq!(statuses, [200, 412], "{backend:?}");
        let (winner, loser) = if first.status() == 200 {
            (first, second)
        } else {
            (second, first)
        };
        assert_eq!(etag(&loser), etag(&winner), "412 names the version now");
        let (_, kind, _) = problem_type(loser).await;
        assert_eq!(kind, "urn:ratelimiter:problem:precondition-failed");

        let r = conditional(&app, "cond", "If-None-Match", "*", Some(4)).await;
        assert_eq!(r.status(), 412, "If-None-Match: * on an existing policy");
        let r = conditional(&app, "cond", "If-Match", &created, None).await;
        assert_eq!(r.status(), 412, "a stale ETag deletes nothing");
        for malformed in ["not-quoted", "\"a b\"", "\"\"", "W/\"weak\""] {
            let r = conditional(&app, "cond", "If-Match", malformed, Some(4)).await;
            let (status, _, body) = problem_type(r).await;
            assert_eq!(
                (status, body["field"].as_str()),
                (400, Some("if-match")),
                "{malformed}"
            );
        }
        // Both at once never hold (RFC 9110 evaluates one, then the other): 412, nothing
        // written, whether the policy exists or not.
        for name in ["cond", "cond-absent"] {
            let r = app
                .client
                .put(app.url(&format!("/v1/policies/{name}")))
                .json(&window(name, 9))
                .header("If-Match", etag(&winner))
                .header("If-None-Match", "*")
                .send()
                .await
                .expect("sent");
            assert_eq!(r.status(), 412, "{name}");
            let now = r.headers().get("etag").map(|_| etag(&r));
            assert_eq!(now, (name == "cond").then(|| etag(&winner)), "{name}");
        }
        assert_eq!(app.get("/v1/policies/cond-absent").await.status(), 404);
        let r = conditional(&app, "cond", "If-Match", &etag(&winner), None).await;
        assert_eq!(r.status(), 204);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_redis_did_not_answer_in_time_says_its_outcome_is_unknown() {
    let redis = Arc::new(TestRedis::start());
    let app = spawn_app_with(
        Some(redis.clone()),
        &[("RATELIMITER__REDIS__TIMEOUT_MS", "200")],
    )
    .await;
    let r = app.post("/v1/policies", &window("slow", 1)).await;
    let first = etag(&r);

    redis.signal("STOP");
    let put = conditional(&app, "slow", "If-Match", &first, Some(2)).await;
    let (status, kind, body) = problem_type(put).await;
    redis.signal("CONT");
    assert_eq!(
        (status, kind.as_str()),
        (503, "urn:ratelimiter:problem:outcome-unknown"),
        "{body}"
    );
    // Redis ran the write once it resumed: the answer was right not to say it failed.
    let r = app.get("/v1/policies/slow").await;
    let now = etag(&r);
    let got: Value = r.json().await.expect("JSON");
    assert_eq!(got["limit"], 2);
    assert_ne!(now, first);
    // Retrying with the same precondition is safe: it does nothing, and says why.
    let retry = conditional(&app, "slow", "If-Match", &first, Some(2)).await;
    assert_eq!(retry.status(), 412);
    assert_eq!(etag(&retry), now);
}

/// The `Policy-ETag` of an acquire of `seen` on `app`.
async fn enforced(app: &TestApp) -> Option<String> {
    let r = acquire_raw(app, "seen").await;
    r.headers()
        .get("policy-etag")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_instance_shows_the_policy_version_it_enforces() {
    let redis = Arc::new(TestRedis::start());
    let a = spawn_app_with(Some(redis.clone()), &[]).await;
    let b = spawn_app_with(Some(redis.clone()), &[]).await;
    let r = a.post("/v1/policies", &window("seen", 10)).await;
    let created = etag(&r);
    assert_eq!(enforced(&a).await.as_deref(), Some(created.as_str()));
    let r = a.put("/v1/policies/seen", &window("seen", 20)).await;
    let replaced = etag(&r);
    within(Duration::from_secs(1), || async {
        enforced(&b).await.as_deref() == Some(replaced.as_str())
    })
    .await;
    // The same view as a metric and on /readyz.
    let ready: Value = b.get("/readyz").await.json().await.expect("JSON");
    let version = ready["policies"]["version"].as_u64().expect("version");
    assert!(
        replaced.ends_with(&format!(".{version}\"")),
        "{replaced} vs {ready}"
    );
    // The gauge is process-wide, and every test's instances share this process: another one
    // may set it between this scrape's update and its rendering, so allow a retry.
    within(Duration::from_secs(1), || async {
        metric(&b, "ratelimiter_policy_cache_version", "").await as u64 == version
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writes_misses_and_refreshes_leave_every_instance_on_the_latest_policy() {
    let redis = Arc::new(TestRedis::start());
    let fast = [("RATELIMITER__REDIS__POLICY_REFRESH_MS", "5")];
    let apps = [
        spawn_app_with(Some(redis.clone()), &fast).await,
        spawn_app_with(Some(redis.clone()), &fast).await,
    ];
    let mut ops = 0;
    for round in 0..8u64 {
        // Writes through both instances, acquires (misses while deleted) on both, at once.
        let burst = (0..200u64).map(|i| {
            let app = &apps[(i % 2) as usize];
            async move {
                match (i + round) % 4 {
                    0 => {
                        app.put("/v1/policies/racy", &window("racy", 1 + i)).await;
                    }
                    1 => {
                        app.delete("/v1/policies/racy").await;
                    }
                    _ => {
                        acquire_raw(app, "racy").await;
                    }
                }
            }
        });
        join_all(burst).await;
        ops += 200;
        // The last word: deleted in odd rounds, a known limit in even ones.
        let deleted = round % 2 == 1;
        let expected_etag = if deleted {
            let _ = apps[0].delete("/v1/policies/racy").await;
            None
        } else {
            let r = apps[1].put("/v1/policies/racy", &window("racy", 777)).await;
            Some(etag(&r))
        };
        for app in &apps {
            within(Duration::from_secs(1), || async {
                let r = acquire_raw(app, "racy").await;
                match &expected_etag {
                    None => r.status() == 404,
                    Some(tag) => {
                        r.headers().get("policy-etag").and_then(|v| v.to_str().ok())
                            == Some(tag.as_str())
                            && r.json::<Value>().await.expect("JSON")["limit"] == 777
                    }
                }
            })
            .await;
        }
    }
    assert_eq!(ops, 1_600);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_written_before_the_change_log_are_adopted() {
    let redis = Arc::new(TestRedis::start());
    // The layout of earlier versions: a set of names, a counter, one hash per policy.
    let mut conn = redis.conn();
    let _: () = redis::pipe()
        .cmd("SADD")
        .arg("rl:{policies}:index")
        .arg("old")
        .cmd("SET")
        .arg("rl:{policies}:version")
        .arg(1)
        .cmd("HSET")
        .arg("rl:{policies}:policy:old")
        .arg(&[
            ("name", "old"),
            ("algorithm", "fixed_window"),
            ("limit", "3"),
            ("window_ms", "60000"),
            ("fail_mode", "open"),
        ])
        .query(&mut conn)
        .expect("old layout");
    let app = spawn_app_with(Some(redis.clone()), &[]).await;
    assert_eq!(app.acquire("old", "k", 1).await["limit"], 3);
    app.create_policy(window("new", 1)).await;
    let listed = app.policies().await;
    assert_eq!(
        listed["policies"].as_array().map(Vec::len),
        Some(2),
        "{listed}"
    );
    let exists: bool = redis::cmd("EXISTS")
        .arg("rl:{policies}:index")
        .query(&mut conn)
        .expect("EXISTS");
    assert!(!exists, "the old index is gone once adopted");
}
