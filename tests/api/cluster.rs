//! Behaviour that only a Redis Cluster shows. (The shared behaviour suite runs on a cluster too:
//! see `on_every_store!`.)

use std::collections::HashSet;
use std::sync::Arc;

use ratelimiter::store::key::hash_tag;
use serde_json::json;

use crate::helpers::{policies_of_every_algorithm, spawn_app_on_cluster, TestCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subjects_spread_over_every_master_each_on_its_own_slot() {
    let cluster = Arc::new(TestCluster::start());
    let app = spawn_app_on_cluster(cluster.clone(), &[]).await;
    let mut subjects = Vec::new();
    for policy in policies_of_every_algorithm("spread", 10) {
        app.create_policy(policy.clone()).await;
        let name = policy["name"].as_str().expect("name").to_owned();
        for i in 0..60 {
            let key = match i % 4 {
                0 => format!("user-{i}"),
                1 => format!("{{tag}}-{i}"),
                2 => format!("a}}{i}{{b"),
                _ => format!("x:{i}:y"),
            };
            let d = app.acquire(&name, &key, 1).await;
            assert_eq!(d["allowed"], true, "{name}/{key}: {d}");
            subjects.push(name.clone());
        }
    }

    let mut stored = Vec::new();
    let mut masters_with_state = 0;
    for node in cluster.nodes() {
        let mut conn = node.conn();
        let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut conn).expect("ROLE");
        let is_master = matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master");
        if !is_master {
            continue;
        }
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("rl:{spread-*")
            .query(&mut conn)
            .expect("KEYS");
        masters_with_state += usize::from(!keys.is_empty());
        for k in keys {
            // Each key lives on the slot of its hash tag, which is the subject, escaped.
            let slot: i64 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(&k)
                .query(&mut conn)
                .expect("KEYSLOT");
            let tag_slot: i64 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(hash_tag(&k))
                .query(&mut conn)
                .expect("KEYSLOT");
            assert_eq!(slot, tag_slot, "{k}");
            assert!(!hash_tag(&k).contains(['{', '}']), "{k}");
            stored.push(k);
        }
    }
    assert_eq!(
        masters_with_state, 3,
        "subjects spread over all three masters"
    );
    let distinct: HashSet<&String> = stored.iter().collect();
    assert_eq!(
        distinct.len(),
        subjects.len(),
        "one key per subject, none shared"
    );
}

/// The index of the master node serving `key`'s slot.
/// A `fixed_window` subject key of `policy` on each of the three masters: the one on a master
/// that does not hold the policies (the victim of a fault test), and the others.
pub(crate) fn key_per_master(
    cluster: &TestCluster,
    policy: &str,
) -> ((usize, String), Vec<(usize, String)>) {
    let policies = master_of(cluster, "rl:{policies}:meta");
    let mut by_master: Vec<(usize, String)> = Vec::new();
    for i in 0..10_000 {
        let key = format!("k{i}");
        let m = master_of(cluster, &format!("rl:{{{policy}:{key}}}:fixed_window"));
        if by_master.iter().all(|(seen, _)| *seen != m) {
            by_master.push((m, key));
        }
    }
    assert_eq!(by_master.len(), 3, "three masters");
    let at = by_master
        .iter()
        .position(|(m, _)| *m != policies)
        .expect("a master without the policies");
    let victim = by_master.remove(at);
    (victim, by_master)
}

pub(crate) fn master_of(cluster: &TestCluster, key: &str) -> usize {
    let mut conn = cluster.nodes()[0].conn();
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(&mut conn)
        .expect("KEYSLOT");
    // CLUSTER SLOTS: [[first, last, [master host, master port, id], replicas…], …]
    let ranges: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut conn)
        .expect("SLOTS");
    let port = ranges
        .iter()
        .find_map(|r| match (r.first(), r.get(1), r.get(2)) {
            (
                Some(redis::Value::Int(lo)),
                Some(redis::Value::Int(hi)),
                Some(redis::Value::Array(m)),
            ) if *lo <= slot && slot <= *hi => match m.get(1) {
                Some(redis::Value::Int(p)) => Some(*p),
                _ => None,
            },
            _ => None,
        })
        .expect("the slot has a master");
    cluster
        .nodes()
        .iter()
        .position(|n| i64::from(n.port) == port)
        .expect("a node of ours")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_failing_over_is_answered_by_fail_mode_then_decided_exactly_again() {
    use std::time::{Duration, Instant};

    use futures_util::future::join_all;
    use serde_json::Value;

    let cluster = Arc::new(TestCluster::start());
    let app = spawn_app_on_cluster(
        cluster.clone(),
        &[
            ("RATELIMITER__REDIS__TIMEOUT_MS", "250"),
            ("RATELIMITER__REDIS__BREAKER_FAILURES", "3"),
            ("RATELIMITER__REDIS__BREAKER_COOLDOWN_MS", "300"),
        ],
    )
    .await;
    app.create_policy(json!({"name": "fo", "algorithm": "fixed_window", "limit": 1_000_000, "window_ms": 3_600_000, "fail_mode": "closed"}))
        .await;
    app.create_policy(json!({"name": "fo-exact", "algorithm": "sliding_window_log", "limit": 5, "window_ms": 3_600_000}))
        .await;
    let victim = master_of(&cluster, "rl:{fo:k}:fixed_window");
    let exact_key = (0..1000)
        .map(|i| format!("after-{i}"))
        .find(|k| master_of(&cluster, &format!("rl:{{fo-exact:{k}}}:sliding_window_log")) == victim)
        .expect("a key on the victim's slots");

    // A stream of acquires on the victim's key while it dies and its replica takes over.
    let stream = async {
        let mut samples = Vec::new();
        let end = Instant::now() + Duration::from_secs(6);
        while Instant::now() < end {
            let started = Instant::now();
            let r = app
                .post("/v1/acquire", &json!({"policy": "fo", "key": "k"}))
                .await;
            samples.push((r.status().as_u16(), started.elapsed()));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        samples
    };
    let failover = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        cluster.nodes()[victim].kill();
    };
    let (samples, ()) = tokio::join!(stream, failover);
    for (status, took) in &samples {
        assert!(*status == 200 || *status == 503, "{status}");
        assert!(
            *took <= Duration::from_millis(1_500),
            "answered after {took:?}"
        );
    }
    assert!(
        samples.iter().any(|(s, _)| *s == 503),
        "the outage was seen"
    );

    // Promoted: decided by Redis again, and exact, without restarting the service.
    let start = Instant::now();
    let probe = json!({"policy": "fo", "key": "k"});
    loop {
        let burst = (0..10).map(|_| app.post("/v1/acquire", &probe));
        if join_all(burst).await.iter().all(|r| r.status() == 200) {
            break;
        }
        if start.elapsed() > Duration::from_secs(15) {
            let survivor = (victim + 1) % cluster.nodes().len();
            let nodes: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query(&mut cluster.nodes()[survivor].conn())
                .expect("NODES");
            let last: Value = app
                .post("/v1/acquire", &probe)
                .await
                .json()
                .await
                .expect("JSON");
            panic!("no failover within 15 s: {last}\n{nodes}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let body = json!({"policy": "fo-exact", "key": exact_key});
    let answers = join_all((0..20).map(|_| app.post("/v1/acquire", &body))).await;
    let mut allowed = 0;
    for r in answers {
        assert_eq!(r.status(), 200);
        let d: Value = r.json().await.expect("JSON");
        assert_eq!(d["degraded"], false);
        allowed += usize::from(d["allowed"] == true);
    }
    assert_eq!(allowed, 5, "exact on the promoted replica");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_master_answers_by_fail_mode_only_for_the_keys_it_owns() {
    use std::time::{Duration, Instant};

    use crate::helpers::metric;
    use serde_json::Value;

    let cluster = Arc::new(TestCluster::start());
    let app = spawn_app_on_cluster(
        cluster.clone(),
        &[
            ("RATELIMITER__REDIS__TIMEOUT_MS", "150"),
            ("RATELIMITER__REDIS__BREAKER_FAILURES", "2"),
            ("RATELIMITER__REDIS__BREAKER_COOLDOWN_MS", "10000"),
        ],
    )
    .await;
    app.create_policy(json!({"name": "pm", "algorithm": "fixed_window", "limit": 1_000_000, "window_ms": 3_600_000, "fail_mode": "open"}))
        .await;
    // One key per master; the victim is a master that does not hold the policies.
    let ((victim, victim_key), by_master) = key_per_master(&cluster, "pm");
    let acquire = |key: String| {
        let app = &app;
        async move {
            let started = Instant::now();
            let r = app
                .post("/v1/acquire", &json!({"policy": "pm", "key": key}))
                .await;
            assert_eq!(r.status(), 200);
            let body: Value = r.json().await.expect("JSON");
            (body, started.elapsed())
        }
    };
    for key in by_master.iter().map(|(_, k)| k).chain([&victim_key]) {
        assert_eq!(acquire(key.clone()).await.0["decided_by"], "redis");
    }

    // Hung (not dead, so no connection is refused: its calls time out). Within the cluster's
    // node timeout (1 s), before a replica takes its slots over: every round asks each master.
    cluster.nodes()[victim].signal("STOP");
    let stopped = Instant::now();
    let mut rounds = Vec::new();
    while stopped.elapsed() < Duration::from_millis(700) {
        let (v, a, b) = tokio::join!(
            acquire(victim_key.clone()),
            acquire(by_master[0].1.clone()),
            acquire(by_master[1].1.clone())
        );
        rounds.push((v, a, b));
    }
    let victim_address = format!("127.0.0.1:{}", cluster.nodes()[victim].port);
    let open = metric(
        &app,
        "ratelimiter_redis_master_breaker_open",
        &[("master", victim_address.as_str())],
    )
    .await;
    cluster.nodes()[victim].signal("CONT");

    assert!(rounds.len() >= 3, "{} rounds", rounds.len());
    for (v, a, b) in &rounds {
        for (other, _) in [a, b] {
            assert_eq!(
                (&other["decided_by"], &other["degraded"]),
                (&json!("redis"), &json!(false)),
                "another master's key: {other}"
            );
        }
        assert!(
            v.0["decided_by"] == "redis" || v.0["decided_by"] == "fail_open",
            "{}",
            v.0
        );
    }
    let (last, took) = &rounds.last().expect("rounds").0;
    assert_eq!(
        last["decided_by"], "fail_open",
        "the victim's breaker opened: {last}"
    );
    assert!(
        *took < Duration::from_millis(100),
        "answered at once by fail mode: {took:?}"
    );
    assert_eq!(open, 1.0, "the victim's breaker, and only it, is open");
}
