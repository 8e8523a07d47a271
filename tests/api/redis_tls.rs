//! TLS to Redis (`rediss://`, issue 27) on a real `redis-server` with `--tls-port`, with
//! certificates made by the tests (`certs`): decisions, batches, the denial cache's pub/sub,
//! policy sync and leases over TLS, and the start-up failures, each naming its setting.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use ratelimiter::config::Settings;
use ratelimiter::startup::Application;

use crate::certs::TestPki;
use crate::helpers::{free_port, spawn_app_with, TestApp, TestCluster, TestRedis};

/// A Redis with a TLS port (its plain port stays for the harness), its PKI, and the TLS port.
struct TlsRedis {
    redis: Arc<TestRedis>,
    pki: TestPki,
    tls_port: u16,
}

impl TlsRedis {
    /// `auth_clients`: whether Redis asks for a client certificate (mutual TLS).
    fn start(auth_clients: bool) -> Self {
        let pki = TestPki::new();
        let (cert, key) = pki.issue("redis", &["127.0.0.1", "localhost"]);
        let tls_port = free_port();
        let port = tls_port.to_string();
        let (cert, key, ca) = (
            cert.to_string_lossy().into_owned(),
            key.to_string_lossy().into_owned(),
            pki.ca_pem_path().to_string_lossy().into_owned(),
        );
        let redis = TestRedis::start_with(&[
            "--tls-port",
            &port,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            if auth_clients { "yes" } else { "no" },
        ]);
        Self {
            redis: Arc::new(redis),
            pki,
            tls_port,
        }
    }

    fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port)
    }

    fn ca(&self) -> String {
        self.pki.ca_pem_path().to_string_lossy().into_owned()
    }

    /// The settings of an instance on it over TLS (with a client certificate when `client`).
    fn settings(&self, client: bool) -> Vec<(String, String)> {
        let mut s = vec![
            ("RATELIMITER__REDIS__URL".to_owned(), self.url()),
            ("RATELIMITER__REDIS__TLS_CA_FILE".to_owned(), self.ca()),
            (
                "RATELIMITER__LIMITS__DENIAL_CACHE_MS".to_owned(),
                "60000".to_owned(),
            ),
        ];
        if client {
            let (cert, key) = self.pki.issue("client", &["client.test"]);
            s.push((
                "RATELIMITER__REDIS__TLS_CERT_FILE".to_owned(),
                cert.to_string_lossy().into_owned(),
            ));
            s.push((
                "RATELIMITER__REDIS__TLS_KEY_FILE".to_owned(),
                key.to_string_lossy().into_owned(),
            ));
        }
        s
    }

    async fn instance(&self, client: bool) -> TestApp {
        let settings = self.settings(client);
        let extra: Vec<(&str, &str)> = settings
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        // No redis.url from the harness: the settings carry the rediss:// one.
        let mut app = spawn_app_with(None, &extra).await;
        app._redis = Some(self.redis.clone());
        app
    }
}

/// One acquire: the answer and who decided it (`decided-by`).
async fn acquire(app: &TestApp, policy: &str, key: &str) -> (Value, String) {
    let r = app
        .post(
            "/v1/acquire",
            &json!({"policy": policy, "key": key, "cost": 1}),
        )
        .await;
    assert_eq!(r.status(), 200, "acquire {policy}/{key}");
    let by = r
        .headers()
        .get("decided-by")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (r.json().await.expect("JSON"), by)
}

/// Waits (10 s at most) until `app` knows the policy `name`.
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

/// Acquires, batches, pub/sub, policy sync and a lease, on two instances over TLS.
async fn everything_works_over_tls(redis: &TlsRedis, client: bool) {
    let (a, b) = (redis.instance(client).await, redis.instance(client).await);
    everything_works(&a, &b).await;
    let mut conn = redis.redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("rl:*")
        .query(&mut conn)
        .expect("KEYS");
    assert!(
        !keys.is_empty(),
        "the decisions were written to the TLS Redis"
    );
}

/// Acquires, batches, pub/sub, policy sync and a lease, on instances `a` and `b`.
async fn everything_works(a: &TestApp, b: &TestApp) {
    let (a, b) = (a, b);

    // Acquire, and policy sync: created on a, seen by b.
    a.create_policy(
        json!({"name": "tls", "algorithm": "fixed_window", "limit": 1000, "window_ms": 3_600_000}),
    )
    .await;
    knows(b, "tls").await;
    let (first, by) = acquire(a, "tls", "k").await;
    assert_eq!(
        (&first["allowed"], by.as_str()),
        (&json!(true), "redis"),
        "{first}"
    );

    // A batch: many concurrent acquires on one instance, every one counted once.
    let calls = (0..200).map(|_| acquire(b, "tls", "k"));
    let answers = futures_join_all(calls).await;
    assert!(answers.iter().all(|(v, _)| v["allowed"] == true));
    let (after, _) = acquire(a, "tls", "k").await;
    assert_eq!(after["remaining"], 1000 - 202, "{after}");

    // The denial cache's pub/sub: a caches a denial; a reset through b ends it on a.
    a.create_policy(
        json!({"name": "one", "algorithm": "fixed_window", "limit": 1, "window_ms": 3_600_000}),
    )
    .await;
    knows(b, "one").await;
    assert_eq!(acquire(a, "one", "k").await.0["allowed"], true);
    assert_eq!(acquire(a, "one", "k").await.1, "redis");
    let (cached, by) = acquire(a, "one", "k").await;
    assert_eq!(
        (&cached["allowed"], by.as_str()),
        (&json!(false), "local_cache")
    );
    let r = b
        .post("/v1/reset", &json!({"policy": "one", "key": "k"}))
        .await;
    assert_eq!(r.status(), 204);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (body, by) = acquire(a, "one", "k").await;
        if by == "redis" {
            assert_eq!(body["allowed"], true, "after the reset: {body}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the invalidation never arrived over TLS"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A lease: taken and released.
    a.create_policy(
        json!({"name": "jobs", "algorithm": "concurrency", "limit": 1, "lease_ms": 60000}),
    )
    .await;
    let r = a
        .post(
            "/v1/leases",
            &json!({"policy": "jobs", "key": "k", "cost": 1}),
        )
        .await;
    assert_eq!(r.status(), 201);
    let location = r
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .expect("Location")
        .to_owned();
    // b learns of the policy by policy sync.
    let deadline = Instant::now() + Duration::from_secs(10);
    let full: Value = loop {
        let r = b
            .post(
                "/v1/leases",
                &json!({"policy": "jobs", "key": "k", "cost": 1}),
            )
            .await;
        if r.status() == 200 {
            break r.json().await.expect("JSON");
        }
        assert!(
            Instant::now() < deadline,
            "jobs never reached b: {}",
            r.status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(full["allowed"], false, "the lease is held: {full}");
    let r = a.delete(&location).await;
    assert!(r.status().is_success(), "release: {}", r.status());
    let again = b
        .post(
            "/v1/leases",
            &json!({"policy": "jobs", "key": "k", "cost": 1}),
        )
        .await;
    assert_eq!(again.status(), 201, "released, so taken again");
}

async fn futures_join_all<F: std::future::Future>(
    calls: impl Iterator<Item = F>,
) -> Vec<F::Output> {
    let handles: Vec<_> = calls.map(Box::pin).collect();
    let mut out = Vec::with_capacity(handles.len());
    // Polled together, so that they are at Redis at once (and go in batches).
    let mut pending: Vec<_> = handles.into_iter().map(Some).collect();
    let mut results: Vec<Option<F::Output>> = (0..pending.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (i, slot) in pending.iter_mut().enumerate() {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        results[i] = Some(v);
                        *slot = None;
                    }
                    std::task::Poll::Pending => done = false,
                }
            }
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    out.extend(results.into_iter().flatten());
    out
}

#[tokio::test]
async fn decisions_batches_pubsub_policy_sync_and_leases_work_over_tls() {
    let redis = TlsRedis::start(false);
    everything_works_over_tls(&redis, false).await;
}

#[tokio::test]
async fn everything_works_on_a_redis_cluster_over_tls() {
    let pki = TestPki::new();
    let (cert, key) = pki.issue("node", &["127.0.0.1", "localhost"]);
    let (cert, key, ca) = (
        cert.to_string_lossy().into_owned(),
        key.to_string_lossy().into_owned(),
        pki.ca_pem_path().to_string_lossy().into_owned(),
    );
    let cluster = Arc::new(TestCluster::start_with(&[
        "--tls-port",
        "{tls-port}",
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        "no",
        "--tls-cluster",
        "yes",
        "--tls-replication",
        "yes",
    ]));
    let seeds: Vec<String> = cluster
        .tls_ports
        .iter()
        .map(|p| format!("rediss://127.0.0.1:{p}"))
        .collect();
    let seeds = seeds.join(",");
    let settings = [
        ("RATELIMITER__REDIS__CLUSTER_NODES", seeds.as_str()),
        ("RATELIMITER__REDIS__TLS_CA_FILE", ca.as_str()),
        ("RATELIMITER__LIMITS__DENIAL_CACHE_MS", "60000"),
    ];
    let a = spawn_app_with(None, &settings).await;
    let b = spawn_app_with(None, &settings).await;
    everything_works(&a, &b).await;
    drop(cluster);
}

#[tokio::test]
async fn mutual_tls_works_with_a_client_certificate() {
    let redis = TlsRedis::start(true);
    everything_works_over_tls(&redis, true).await;
}

/// The start-up error of an instance with `settings` (the whole chain).
async fn start_up_error(settings: Vec<(String, String)>) -> String {
    let mut env = vec![
        (
            "RATELIMITER__SERVER__BIND".to_owned(),
            "127.0.0.1:0".to_owned(),
        ),
        (
            "RATELIMITER__REDIS__TIMEOUT_MS".to_owned(),
            "2000".to_owned(),
        ),
    ];
    env.extend(settings);
    let settings = match Settings::load_from(None, env) {
        Ok(s) => s,
        Err(e) => return e.to_string(),
    };
    match Application::build(settings).await {
        Ok(_) => panic!("the instance started"),
        Err(e) => format!("{e:#}"),
    }
}

fn set(settings: &mut [(String, String)], key: &str, value: String) {
    settings
        .iter_mut()
        .find(|(k, _)| k == key)
        .expect("setting")
        .1 = value;
}

#[tokio::test]
async fn a_wrong_ca_fails_start_up_naming_redis_tls_ca_file() {
    let redis = TlsRedis::start(false);
    let other = TestPki::new();
    let mut settings = redis.settings(false);
    set(
        &mut settings,
        "RATELIMITER__REDIS__TLS_CA_FILE",
        other.ca_pem_path().to_string_lossy().into_owned(),
    );
    let e = start_up_error(settings).await;
    assert!(e.contains("TLS handshake with Redis at 127.0.0.1:"), "{e}");
    assert!(
        e.contains("UnknownIssuer") && e.contains("redis.tls_ca_file"),
        "{e}"
    );
    assert!(!e.contains("timed out"), "{e}");
}

#[tokio::test]
async fn a_wrong_server_name_fails_start_up_naming_redis_tls_server_name() {
    let redis = TlsRedis::start(false);
    let mut settings = redis.settings(false);
    settings.push((
        "RATELIMITER__REDIS__TLS_SERVER_NAME".to_owned(),
        "redis.example.com".to_owned(),
    ));
    let e = start_up_error(settings).await;
    assert!(e.contains("TLS handshake with Redis at 127.0.0.1:"), "{e}");
    assert!(e.contains("redis.tls_server_name"), "{e}");
}

#[tokio::test]
async fn a_missing_client_certificate_fails_start_up_naming_redis_tls_cert_file() {
    let redis = TlsRedis::start(true);
    let e = start_up_error(redis.settings(false)).await;
    assert!(e.contains("TLS handshake with Redis at 127.0.0.1:"), "{e}");
    assert!(e.contains("redis.tls_cert_file"), "{e}");
}

#[tokio::test]
async fn an_expired_server_certificate_fails_start_up_as_such() {
    let pki = TestPki::new();
    let (cert, key) = pki.issue_expired("old", &["127.0.0.1"]);
    let tls_port = free_port();
    let port = tls_port.to_string();
    let (cert, key, ca) = (
        cert.to_string_lossy().into_owned(),
        key.to_string_lossy().into_owned(),
        pki.ca_pem_path().to_string_lossy().into_owned(),
    );
    let _redis = TestRedis::start_with(&[
        "--tls-port",
        &port,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        "no",
    ]);
    let e = start_up_error(vec![
        (
            "RATELIMITER__REDIS__URL".to_owned(),
            format!("rediss://127.0.0.1:{tls_port}"),
        ),
        ("RATELIMITER__REDIS__TLS_CA_FILE".to_owned(), ca),
    ])
    .await;
    assert!(
        e.contains("TLS handshake") && e.contains("certificate expired"),
        "{e}"
    );
}

#[tokio::test]
async fn bad_tls_files_are_config_errors_naming_the_setting() {
    let pki = TestPki::new();
    let (cert, _) = pki.issue("c", &["x.test"]);
    let cases = [
        (
            vec![(
                "RATELIMITER__REDIS__TLS_CA_FILE",
                "/nonexistent/ca.pem".to_owned(),
            )],
            "redis.tls_ca_file",
        ),
        (
            vec![(
                "RATELIMITER__REDIS__TLS_CA_FILE",
                "/etc/hostname".to_owned(),
            )],
            "redis.tls_ca_file",
        ),
        (
            vec![(
                "RATELIMITER__REDIS__TLS_CERT_FILE",
                cert.to_string_lossy().into_owned(),
            )],
            "redis.tls_key_file",
        ),
        (
            vec![
                (
                    "RATELIMITER__REDIS__TLS_CERT_FILE",
                    cert.to_string_lossy().into_owned(),
                ),
                (
                    "RATELIMITER__REDIS__TLS_KEY_FILE",
                    cert.to_string_lossy().into_owned(),
                ),
            ],
            "redis.tls_key_file",
        ),
    ];
    for (extra, setting) in cases {
        let mut env = vec![(
            "RATELIMITER__REDIS__URL".to_owned(),
            "rediss://127.0.0.1:1".to_owned(),
        )];
        env.extend(extra.into_iter().map(|(k, v)| (k.to_owned(), v)));
        let e = Settings::load_from(None, env).expect_err("invalid TLS settings");
        assert!(e.to_string().contains(setting), "{setting}: {e}");
    }
}
