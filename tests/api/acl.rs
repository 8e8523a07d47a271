//! The least-privilege Redis user: every other test already runs as a user limited to the ACL
//! `ratelimiter --print-acl` prints (see `helpers::TestRedis`); here, each permission taken away
//! in turn makes start-up fail at once naming the rule that is missing, on one Redis and on a
//! Cluster, and the optional `INFO` only makes it warn.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimiter::config::Settings;
use ratelimiter::startup::Application;
use ratelimiter::store::redis::acl::{rules, DIRECT, SCRIPTED};
use serde_json::json;

use crate::helpers::{spawn_app_with, TestCluster, TestRedis, TEST_USER};

/// Changes the test user's ACL on every node, as the default user.
fn set_user(nodes: &[&TestRedis], rules: &[&str]) {
    for node in nodes {
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(TEST_USER)
            .arg(rules)
            .query(&mut node.conn())
            .expect("ACL SETUSER as the default user");
    }
}

/// Builds the app with `store` settings and answers its start-up error with its causes, after
/// checking it came at once (a refusal is no timeout).
async fn start_up_error(store: (&str, &str), what: &str) -> String {
    let env = [
        ("RATELIMITER__SERVER__BIND", "127.0.0.1:0"),
        ("RATELIMITER__SERVER__WORKERS", "1"),
        ("RATELIMITER__REDIS__TIMEOUT_MS", "2000"),
        store,
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()));
    let settings = Settings::load_from(None, env).expect("valid settings");
    let started = Instant::now();
    let Err(e) = Application::build(settings).await else {
        panic!("the app started without {what}");
    };
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "without {what}: took {:?}",
        started.elapsed()
    );
    format!("{e:#}")
}

/// Takes each of `removals` away in turn (a rule, the one that puts it back, and what the
/// error must name), checks that start-up fails naming it, and puts it back.
async fn each_missing_permission_is_named(
    nodes: &[&TestRedis],
    store: (&str, &str),
    removals: &[(String, String, String)],
) {
    for (take, give, named) in removals {
        set_user(nodes, &take.split(' ').collect::<Vec<_>>());
        let error = start_up_error(store, named).await;
        assert!(
            error.contains(named.as_str()),
            "without {named}, start-up must name it: {error}"
        );
        assert!(
            !error.contains("timed out"),
            "without {named}: a refusal, not a timeout: {error}"
        );
        set_user(nodes, &give.split(' ').collect::<Vec<_>>());
    }
}

/// `-x` and `+x` and the name of each command, then the key pattern and the channel. The
/// refusals of `worded_by_redis` come before the check (the first calls of start-up) and are
/// worded by Redis: `'ping'` for `+ping`.
fn removals(commands: &[&str], worded_by_redis: &[&str]) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = commands
        .iter()
        .map(|c| {
            let named = if worded_by_redis.contains(c) {
                format!("'{c}'")
            } else {
                format!("+{c}")
            };
            (format!("-{c}"), format!("+{c}"), named)
        })
        .collect();
    out.push((
        "resetkeys ~elsewhere:*".into(),
        "resetkeys ~rl:*".into(),
        "~rl:*".into(),
    ));
    out.push((
        "resetchannels &elsewhere".into(),
        "resetchannels &rl:denials".into(),
        "&rl:denials".into(),
    ));
    out
}

/// Every command the service needs, but `INFO`, which is optional, and a Cluster's own.
fn every_needed_command() -> Vec<&'static str> {
    let mut all: Vec<&str> = DIRECT
        .iter()
        .map(|(c, _)| *c)
        .filter(|c| !matches!(*c, "info" | "cluster|slots" | "asking"))
        .chain(SCRIPTED.iter().map(|(c, _)| *c))
        .collect();
    all.dedup();
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_redis_refuses_start_up_naming_each_missing_permission() {
    let redis = Arc::new(TestRedis::start());
    let url = redis.url();
    let commands = every_needed_command();
    assert!(commands.len() > 30, "{commands:?}");
    each_missing_permission_is_named(
        &[&redis],
        ("RATELIMITER__REDIS__URL", &url),
        &removals(&commands, &["ping"]),
    )
    .await;

    // With every permission back, it starts and decides.
    let app = spawn_app_with(Some(redis.clone()), &[]).await;
    app.create_policy(
        json!({"name": "acl", "algorithm": "fixed_window", "limit": 1, "window_ms": 60_000}),
    )
    .await;
    assert_eq!(app.acquire("acl", "k", 1).await["allowed"], true);
    assert_eq!(app.acquire("acl", "k", 1).await["allowed"], false);
}

/// Without `INFO` the Redis version cannot be read: start-up warns and goes on, and the probe
/// keys are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_info_start_up_goes_on() {
    let redis = Arc::new(TestRedis::start());
    set_user(&[&redis], &["-info"]);
    let app = spawn_app_with(Some(redis.clone()), &[]).await;
    app.create_policy(
        json!({"name": "acl", "algorithm": "fixed_window", "limit": 2, "window_ms": 60_000}),
    )
    .await;
    assert_eq!(app.acquire("acl", "k", 2).await["allowed"], true);
    assert_eq!(app.acquire("acl", "k", 1).await["allowed"], false);
    let probes: Vec<String> = redis::cmd("KEYS")
        .arg("rl:{probe}:*")
        .query(&mut redis.conn())
        .expect("KEYS");
    assert_eq!(probes, Vec::<String>::new(), "the probe leaves no key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_refuses_start_up_naming_each_missing_permission() {
    let cluster = TestCluster::start();
    let seeds = cluster.seeds();
    let nodes: Vec<&TestRedis> = cluster.nodes().iter().collect();
    // The Cluster's own, what every call goes through, and some of what the scripts call.
    let commands = [
        "cluster|slots",
        "asking",
        "ping",
        "eval",
        "evalsha",
        "evalsha_ro",
        "script|load",
        "publish",
        "subscribe",
        "set",
        "unlink",
        "zadd",
        "zrange",
        "time",
        "hincrby",
        "zpopmin",
        "pexpireat",
    ];
    each_missing_permission_is_named(
        &nodes,
        ("RATELIMITER__REDIS__CLUSTER_NODES", &seeds),
        &removals(&commands, &["cluster|slots"]),
    )
    .await;
}

/// The rules the binary prints are those the tests' user has, and those docs/redis.md shows.
#[test]
fn the_printed_acl_is_the_documented_one() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ratelimiter"))
        .arg("--print-acl")
        .env("RATELIMITER__REDIS__KEY_PREFIX", "acme")
        .output()
        .expect("run ratelimiter --print-acl");
    assert!(out.status.success(), "{out:?}");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(printed.trim_end(), rules("acme"));
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/redis.md"))
        .expect("docs/redis.md");
    let line = format!("ACL SETUSER ratelimiter on >CHANGE-ME {}", rules("rl"));
    assert!(
        docs.contains(&line),
        "docs/redis.md must show the ACL line exactly:\n{line}"
    );
}
