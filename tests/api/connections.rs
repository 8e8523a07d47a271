//! How the service reaches Redis: `pool` mode under load, and what a refused connection, a wrong
//! password and a restarted Redis are reported as (and when a call is retried).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use ratelimiter::config::Settings;
use ratelimiter::startup::Application;
use ratelimiter::store::connection::ConnectionMode;
use ratelimiter::store::{RedisStore, Store, StoreError};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::helpers::{free_port, spawn_app_with, TestRedis};

const MODES: [&str; 2] = ["multiplexed", "pool"];

fn mode(name: &str) -> ConnectionMode {
    match name {
        "pool" => ConnectionMode::Pool,
        _ => ConnectionMode::Multiplexed,
    }
}

/// Builds the app against `url` and returns the start-up error with its causes, and how long
/// the attempt took.
async fn start_up_error(url: &str, mode: &str, timeout_ms: &str) -> (String, Duration) {
    let env = [
        ("RATELIMITER__SERVER__BIND", "127.0.0.1:0"),
        ("RATELIMITER__SERVER__WORKERS", "1"),
        ("RATELIMITER__REDIS__URL", url),
        ("RATELIMITER__REDIS__CONNECTION_MODE", mode),
        ("RATELIMITER__REDIS__TIMEOUT_MS", timeout_ms),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()));
    let settings = Settings::load_from(None, env).expect("valid settings");
    let started = Instant::now();
    let Err(e) = Application::build(settings).await else {
        panic!("{mode}: the app started against {url}");
    };
    (format!("{e:#}"), started.elapsed())
}

/// 1,000 acquires at once on a 2-worker app in `pool` mode with the default 100 ms deadline:
/// no call waits for a connection, so none is degraded, and exactly the limit is admitted.
///
/// A pool that made calls queue for a connection degrades a share of every burst; a loaded
/// machine can degrade a few calls of one burst by slowness alone. So each burst, on a subject
/// of its own, must be exact in what Redis decided (never more than the limit admitted, and
/// every unit accounted for), and one of [`BURSTS`] must be clean: the suite runs this beside
/// its other heavy tests on two cores, where three bursts in a row were once all slowed past
/// 100 ms, while a pool that queues degrades every burst however many are tried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_mode_decides_a_thousand_concurrent_acquires_exactly() {
    const BURSTS: usize = 10;
    let redis = Arc::new(TestRedis::start());
    let app = spawn_app_with(
        Some(redis),
        &[
            ("RATELIMITER__REDIS__CONNECTION_MODE", "pool"),
            ("RATELIMITER__REDIS__TIMEOUT_MS", "100"),
        ],
    )
    .await;
    app.create_policy(json!({
        "name": "busy", "algorithm": "fixed_window", "limit": 500, "window_ms": 3_600_000,
        "fail_mode": "open"
    }))
    .await;
    // Steady state: the script loaded and the connections made, as after any start-up.
    for _ in 0..20 {
        app.acquire("busy", "warm-up", 1).await;
    }
    // One client, one connection per request in flight: 1,000 concurrent HTTP connections.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client");
    let url = app.url("/v1/acquire");
    let mut seen = Vec::new();
    for burst in 0..BURSTS {
        let key = format!("k{burst}");
        let requests = (0..1_000).map(|_| {
            let (client, url, key) = (client.clone(), url.clone(), key.clone());
            tokio::spawn(async move {
                let r = client
                    .post(url)
                    .json(&json!({"policy": "busy", "key": key}))
                    .send()
                    .await
                    .expect("answered");
                assert_eq!(r.status(), 200);
                let d: Value = r.json().await.expect("JSON");
                (d["allowed"] == true, d["degraded"] == true)
            })
        });
        let answers: Vec<(bool, bool)> = join_all(requests)
            .await
            .into_iter()
            .map(|r| r.expect("task"))
            .collect();
        let degraded = answers.iter().filter(|a| a.1).count();
        let allowed = answers.iter().filter(|a| a.0 && !a.1).count();
        assert!(allowed <= 500, "burst {burst}: {allowed} admitted by Redis");
        assert!(
            allowed + degraded >= 500,
            "burst {burst}: {allowed} admitted and {degraded} degraded: units lost"
        );
        if degraded == 0 {
            assert_eq!(allowed, 500, "exactly the limit admitted");
            return;
        }
        seen.push(degraded);
        // A neighbour's burst of work passes in a moment; a queueing pool does not.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("every burst of {BURSTS} had decisions degraded (of 1000 each): {seen:?}");
}

/// Nothing listens on the port: start-up fails at once (not after the 2 s deadline) and says
/// the connection was refused; so does a call at run time after Redis went away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_fails_at_once_and_says_so() {
    for m in MODES {
        let url = format!("redis://127.0.0.1:{}", free_port());
        let (error, took) = start_up_error(&url, m, "2000").await;
        assert!(error.contains("refused"), "{m}: {error}");
        assert!(took < Duration::from_millis(1_000), "{m}: took {took:?}");

        let redis = TestRedis::start();
        let store = RedisStore::open(&redis.url(), mode(m), 4, Duration::from_secs(2), "rl")
            .expect("store");
        store.ping().await.expect("Redis answers");
        redis.kill();
        // The store's end of the old connection sees it close.
        tokio::time::sleep(Duration::from_millis(200)).await;
        for _ in 0..3 {
            let started = Instant::now();
            let e = store.ping().await.expect_err("Redis is gone");
            let took = started.elapsed();
            assert!(
                matches!(&e, StoreError::Unavailable(s) if s.contains("refused")),
                "{m}: {e}"
            );
            assert!(took < Duration::from_millis(1_000), "{m}: took {took:?}");
        }
    }
}

/// A wrong password is an authentication failure, at start-up and at run time (also once the
/// circuit breaker is open), never a timeout; and the password is in no message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_reported_as_an_authentication_failure() {
    for m in MODES {
        let redis = TestRedis::start();
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("requirepass")
            .arg("right-pw-1")
            .query(&mut redis.conn())
            .expect("set a password");
        let wrong = format!("redis://:wrong-pw-2@127.0.0.1:{}", redis.port);
        let (error, _) = start_up_error(&wrong, m, "100").await;
        assert!(error.contains("authentication failed"), "{m}: {error}");
        assert!(
            !error.contains("timed out") && !error.contains("no answer"),
            "{m}: {error}"
        );
        assert!(!error.contains("wrong-pw-2"), "{m}: {error}");

        // At run time: the password changes and the connections are cut; every call after that
        // says why it cannot reach Redis.
        let right = format!("redis://:right-pw-1@127.0.0.1:{}", redis.port);
        let store =
            RedisStore::open(&right, mode(m), 4, Duration::from_millis(100), "rl").expect("store");
        store.ping().await.expect("the right password works");
        let mut admin = redis::Client::open(right.as_str())
            .and_then(|c| c.get_connection())
            .expect("admin connection");
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("requirepass")
            .arg("new-pw-3")
            .query(&mut admin)
            .expect("change the password");
        let _: () = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query(&mut admin)
            .expect("cut the store's connections");
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Past the breaker's 5 failures too: while it is open, calls still say why.
        for _ in 0..8 {
            let e = store.ping().await.expect_err("wrong password now");
            assert!(
                matches!(&e, StoreError::Unavailable(s) if s.contains("authentication failed")),
                "{m}: {e}"
            );
            assert!(!e.to_string().contains("right-pw-1"), "{m}: {e}");
        }
    }
}

/// After Redis restarts, every worker's connection is dead. The first call on each finds that
/// out before sending anything, reconnects and is decided by Redis, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_calls_after_a_redis_restart_are_decided_by_redis() {
    for m in MODES {
        let dir = std::env::temp_dir().join(format!(
            "ratelimiter-conn-restart-{m}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let dir_arg = dir.to_string_lossy().into_owned();
        let redis = Arc::new(TestRedis::start_with(&[
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--dir",
            &dir_arg,
        ]));
        let app = spawn_app_with(
            Some(redis.clone()),
            &[
                ("RATELIMITER__REDIS__CONNECTION_MODE", m),
                ("RATELIMITER__REDIS__POOL_SIZE", "2"),
            ],
        )
        .await;
        app.create_policy(json!({
            "name": "r", "algorithm": "fixed_window", "limit": 100, "window_ms": 3_600_000,
            "fail_mode": "closed"
        }))
        .await;
        // A new TCP connection per request: the server hands them to its workers in turn.
        let fresh = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .expect("client");
        let acquire = || async {
            let r = fresh
                .post(app.url("/v1/acquire"))
                .json(&json!({"policy": "r", "key": "k"}))
                .send()
                .await
                .expect("answered");
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.expect("JSON"))
        };
        for _ in 0..4 {
            assert_eq!(acquire().await.0, 200, "{m}: before the restart");
        }
        redis.restart();
        // The old connections' ends see the restart (their sockets close).
        tokio::time::sleep(Duration::from_millis(300)).await;
        for i in 0..6 {
            let (status, d) = acquire().await;
            assert_eq!(status, 200, "{m}: call {i} after the restart: {d}");
            assert_eq!(d["degraded"], false, "{m}: call {i}: {d}");
            assert_eq!(d["remaining"], 100 - 5 - i, "{m}: counted once: {d}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A TCP relay to Redis that, once `cut` is set, passes the next command on to Redis, lets it
/// run, and closes the client's connection without its answer.
struct Cutter {
    port: u16,
    cut: Arc<std::sync::atomic::AtomicBool>,
}

impl Cutter {
    async fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = cut.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(relay(client, upstream, flag.clone()));
            }
        });
        Self { port, cut }
    }
}

async fn relay(mut client: TcpStream, upstream: u16, cut: Arc<std::sync::atomic::AtomicBool>) {
    let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        return;
    };
    let (mut a, mut b) = ([0u8; 16_384], [0u8; 16_384]);
    loop {
        tokio::select! {
            n = client.read(&mut a) => {
                let Ok(n @ 1..) = n else { return };
                if server.write_all(&a[..n]).await.is_err() { return }
                if cut.load(std::sync::atomic::Ordering::SeqCst) {
                    // Redis runs the command; its answer never reaches the client.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    return;
                }
            }
            n = server.read(&mut b) => {
                let Ok(n @ 1..) = n else { return };
                if client.write_all(&b[..n]).await.is_err() { return }
            }
        }
    }
}

/// A connection that breaks after the command went out may have run it: the call is answered
/// as "outcome unknown" and never sent again, so a decision is never counted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_may_have_run_is_never_sent_twice() {
    for m in MODES {
        let redis = Arc::new(TestRedis::start());
        let cutter = Cutter::start(redis.port).await;
        let url = format!("redis://127.0.0.1:{}", cutter.port);
        let app = spawn_app_with(
            None,
            &[
                ("RATELIMITER__REDIS__URL", url.as_str()),
                ("RATELIMITER__REDIS__CONNECTION_MODE", m),
                ("RATELIMITER__REDIS__POOL_SIZE", "1"),
            ],
        )
        .await;
        app.create_policy(json!({
            "name": "once", "algorithm": "fixed_window", "limit": 10, "window_ms": 3_600_000,
            "fail_mode": "closed"
        }))
        .await;
        // Every worker's connection made before the cut (each new client may land on another
        // worker), so that the cut catches the command itself, not a connection's set-up.
        let mut before = 0;
        for _ in 0..6 {
            let fresh = reqwest::Client::new();
            let d: Value = fresh
                .post(app.url("/v1/acquire"))
                .json(&json!({"policy": "once", "key": "k"}))
                .send()
                .await
                .expect("sent")
                .json()
                .await
                .expect("JSON");
            before = d["remaining"].as_u64().expect("remaining");
        }
        assert_eq!(before, 4, "{m}");
        cutter.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        let r = app
            .post("/v1/acquire", &json!({"policy": "once", "key": "k"}))
            .await;
        assert_eq!(r.status(), 503, "{m}: answered by the closed fail mode");
        cutter.cut.store(false, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The cut call ran at most once in Redis (once if its command went out, not at all if
        // only a connection's set-up did); never twice.
        let d = app.acquire("once", "k", 1).await;
        let after = d["remaining"].as_u64().expect("remaining");
        assert!(
            after == before - 2 || after == before - 1,
            "{m}: the cut call ran at most once: {d}"
        );
        drop(redis);
    }
}

/// Cluster seeds may carry the cluster's password; when the cluster cannot be reached, the
/// start-up error names the seeds with the password masked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_seed_passwords_never_reach_the_start_up_error() {
    let seed = format!("admin:s3cret-seed@127.0.0.1:{}", free_port());
    let env = [
        ("RATELIMITER__SERVER__BIND", "127.0.0.1:0"),
        ("RATELIMITER__REDIS__CLUSTER_NODES", seed.as_str()),
        ("RATELIMITER__REDIS__TIMEOUT_MS", "500"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()));
    let settings = Settings::load_from(None, env).expect("seeds with credentials are accepted");
    assert!(!format!("{settings:?}").contains("s3cret"));
    let Err(e) = Application::build(settings).await else {
        panic!("no cluster there");
    };
    let e = format!("{e:#}");
    assert!(e.contains("admin:***@127.0.0.1"), "{e}");
    assert!(!e.contains("s3cret"), "{e}");
}

/// Every script is in Redis (on a Cluster, on every master) once the service has started, so
/// the first burst of decisions does not meet `NOSCRIPT` all at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_loaded_at_start_up() {
    let shas: Vec<String> = ratelimiter::store::scripts::sources()
        .map(|s| redis::Script::new(&s).get_hash().to_owned())
        .collect();
    let loaded = |conn: &mut redis::Connection| -> Vec<bool> {
        redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(&shas)
            .query(conn)
            .expect("SCRIPT EXISTS")
    };
    let redis = Arc::new(TestRedis::start());
    let _app = spawn_app_with(Some(redis.clone()), &[]).await;
    assert!(loaded(&mut redis.conn()).iter().all(|&l| l), "on one Redis");

    let cluster = Arc::new(crate::helpers::TestCluster::start());
    let _app = crate::helpers::spawn_app_on_cluster(cluster.clone(), &[]).await;
    let mut masters = 0;
    for node in cluster.nodes() {
        let mut conn = node.conn();
        let role: String = redis::cmd("ROLE")
            .query::<Vec<redis::Value>>(&mut conn)
            .ok()
            .and_then(|r| r.into_iter().next())
            .and_then(|v| redis::from_redis_value(v).ok())
            .unwrap_or_default();
        if role == "master" {
            masters += 1;
            assert!(
                loaded(&mut conn).iter().all(|&l| l),
                "on master {}",
                node.port
            );
        }
    }
    assert_eq!(masters, 3, "every master was checked");
}
