//! TLS to Redis (`rediss://`, issue 27) on a real `redis-server` with `--tls-port`, with
//! certificates made by the tests (`certs`): decisions, batches, the denial cache's pub/sub,
//! policy sync and leases over TLS, and the start-up failures, each naming its setting.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use ratelimiter::config::Settings;
use ratelimiter::startup::Application;

use crate::certs::{TestPki, Validity};
use crate::helpers::{
    free_port, spawn_app_with, Binary, TestApp, TestCluster, TestRedis, TEST_PASSWORD, TEST_USER,
};

/// A Redis with a TLS port (its plain port stays for the harness), its PKI, and the TLS port.
struct TlsRedis {
    redis: Arc<TestRedis>,
    pki: TestPki,
    tls_port: u16,
}

impl TlsRedis {
    /// `auth_clients`: whether Redis asks for a client certificate (mutual TLS).
    fn start(auth_clients: bool) -> Self {
        Self::start_with(auth_clients, Validity::Long)
    }

    /// [`TlsRedis::start`], the server's certificate valid as `validity`.
    fn start_with(auth_clients: bool, validity: Validity) -> Self {
        let pki = TestPki::new();
        let tls_port = free_port();
        let args = tls_args(&pki, &tls_port.to_string(), validity, auth_clients);
        let redis = TestRedis::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>());
        Self {
            redis: Arc::new(redis),
            pki,
            tls_port,
        }
    }

    fn url(&self) -> String {
        format!(
            "rediss://{TEST_USER}:{TEST_PASSWORD}@127.0.0.1:{}",
            self.tls_port
        )
    }

    /// The settings of an instance on it over TLS (with a client certificate when `client`).
    fn settings(&self, client: bool) -> Vec<(String, String)> {
        tls_settings(("RATELIMITER__REDIS__URL", self.url()), &self.pki, client)
    }

    async fn instance(&self, client: bool) -> TestApp {
        let mut app = spawn_on(&self.settings(client)).await;
        app._redis = Some(self.redis.clone());
        app
    }
}

/// A Redis Cluster of three masters (each with a replica) that speaks TLS to its clients and on
/// its bus (`tls-cluster yes`, so `CLUSTER SLOTS` answers the TLS ports), and its PKI. The
/// nodes' plain ports stay for the harness.
struct TlsCluster {
    cluster: Arc<TestCluster>,
    pki: TestPki,
}

impl TlsCluster {
    /// `auth_clients`: whether the nodes ask for a client certificate (mutual TLS); the nodes
    /// show theirs to each other on the bus.
    fn start(auth_clients: bool) -> Self {
        let pki = TestPki::new();
        let mut args = tls_args(&pki, "{tls-port}", Validity::Long, auth_clients);
        args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"].map(String::from));
        let cluster = TestCluster::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(cluster.tls_ports.len(), 6, "every node has a TLS port");
        Self {
            cluster: Arc::new(cluster),
            pki,
        }
    }

    /// Every node as a `rediss://` seed.
    fn seeds(&self) -> String {
        let seeds: Vec<String> = self
            .cluster
            .tls_ports
            .iter()
            .map(|p| format!("rediss://{TEST_USER}:{TEST_PASSWORD}@127.0.0.1:{p}"))
            .collect();
        seeds.join(",")
    }

    /// The settings of an instance on it over TLS (with a client certificate when `client`).
    fn settings(&self, client: bool) -> Vec<(String, String)> {
        tls_settings(
            ("RATELIMITER__REDIS__CLUSTER_NODES", self.seeds()),
            &self.pki,
            client,
        )
    }

    async fn instance(&self, client: bool) -> TestApp {
        let mut app = spawn_on(&self.settings(client)).await;
        app.cluster = Some(self.cluster.clone());
        app
    }
}

/// The settings of an instance on the store `address` names over TLS, trusting `pki`'s CA (with
/// its client certificate when `client`).
fn tls_settings(address: (&str, String), pki: &TestPki, client: bool) -> Vec<(String, String)> {
    let mut s = vec![
        (address.0.to_owned(), address.1),
        (
            "RATELIMITER__REDIS__TLS_CA_FILE".to_owned(),
            pki.ca_file().to_owned(),
        ),
        (
            "RATELIMITER__LIMITS__DENIAL_CACHE_MS".to_owned(),
            "60000".to_owned(),
        ),
    ];
    if client {
        s.extend(client_certificate(pki));
    }
    s
}

/// An instance with exactly `settings`: no store from the harness, since they name the
/// `rediss://` one.
async fn spawn_on(settings: &[(String, String)]) -> TestApp {
    let extra: Vec<(&str, &str)> = settings
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    spawn_app_with(None, &extra).await
}

/// `redis-server`'s arguments for TLS on `port` (a port, or a cluster's `{tls-port}`) with a
/// server certificate of `pki` valid as `validity`, asking for client certificates when
/// `auth_clients`.
fn tls_args(pki: &TestPki, port: &str, validity: Validity, auth_clients: bool) -> Vec<String> {
    let (cert, key) = pki.issue_valid("redis", &["127.0.0.1", "localhost"], validity);
    let auth = if auth_clients { "yes" } else { "no" };
    [
        "--tls-port",
        port,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        pki.ca_file(),
        "--tls-auth-clients",
        auth,
    ]
    .map(String::from)
    .to_vec()
}

/// `redis.tls_cert_file` and `redis.tls_key_file` of a client certificate issued by `pki`.
fn client_certificate(pki: &TestPki) -> [(String, String); 2] {
    client_certificate_files(pki.issue("client", &["client.test"]))
}

/// `redis.tls_cert_file` and `redis.tls_key_file` of the certificate and key `(cert, key)`.
fn client_certificate_files((cert, key): (String, String)) -> [(String, String); 2] {
    [
        ("RATELIMITER__REDIS__TLS_CERT_FILE".to_owned(), cert),
        ("RATELIMITER__REDIS__TLS_KEY_FILE".to_owned(), key),
    ]
}

/// One acquire: the answer and who decided it (`decided-by`).
async fn acquire(app: &TestApp, policy: &str, key: &str) -> (Value, String) {
    let (answer, headers) = app.acquire_with_headers(policy, key).await;
    let by = headers
        .get("decided-by")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (answer, by)
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
    let cluster = TlsCluster::start(false);
    let (a, b) = (cluster.instance(false).await, cluster.instance(false).await);
    everything_works(&a, &b).await;
}

#[tokio::test]
async fn mutual_tls_works_on_a_redis_cluster_with_a_client_certificate() {
    let cluster = TlsCluster::start(true);
    let (a, b) = (cluster.instance(true).await, cluster.instance(true).await);
    everything_works(&a, &b).await;
}

#[tokio::test]
async fn mutual_tls_works_with_a_client_certificate() {
    let redis = TlsRedis::start(true);
    everything_works_over_tls(&redis, true).await;
}

/// `redis.timeout_ms` of the instances [`start_up_error`] starts: a failure that takes this long
/// is a timeout, not the handshake's own answer.
const START_UP_TIMEOUT: Duration = Duration::from_millis(2000);

/// The start-up error of an instance with `settings` (the whole chain), which must come
/// promptly: sooner than [`START_UP_TIMEOUT`], so that it is the handshake's answer and not a
/// deadline.
async fn start_up_error(settings: Vec<(String, String)>) -> String {
    let mut env = vec![
        (
            "RATELIMITER__SERVER__BIND".to_owned(),
            "127.0.0.1:0".to_owned(),
        ),
        (
            "RATELIMITER__REDIS__TIMEOUT_MS".to_owned(),
            START_UP_TIMEOUT.as_millis().to_string(),
        ),
    ];
    env.extend(settings);
    let settings = match Settings::load_from(None, env) {
        Ok(s) => s,
        Err(e) => return e.to_string(),
    };
    let started = Instant::now();
    let e = match Application::build(settings).await {
        Ok(_) => panic!("the instance started"),
        Err(e) => format!("{e:#}"),
    };
    let took = started.elapsed();
    assert!(
        took < START_UP_TIMEOUT,
        "start-up took {took:?} to fail, as long as a timeout: {e}"
    );
    assert!(!e.contains("timed out"), "{e}");
    e
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
        other.ca_file().to_owned(),
    );
    let e = start_up_error(settings).await;
    assert!(e.contains("TLS handshake with Redis at 127.0.0.1:"), "{e}");
    assert!(
        e.contains("UnknownIssuer") && e.contains("redis.tls_ca_file"),
        "{e}"
    );
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
async fn a_wrong_ca_fails_cluster_start_up_naming_redis_tls_ca_file() {
    let cluster = TlsCluster::start(false);
    let other = TestPki::new();
    let mut settings = cluster.settings(false);
    set(
        &mut settings,
        "RATELIMITER__REDIS__TLS_CA_FILE",
        other.ca_file().to_owned(),
    );
    let e = start_up_error(settings).await;
    assert!(
        e.contains("cannot reach the Redis Cluster at rediss://ratelimiter:***@127.0.0.1:"),
        "{e}"
    );
    assert!(e.contains("TLS handshake with Redis at 127.0.0.1:"), "{e}");
    assert!(
        e.contains("UnknownIssuer") && e.contains("redis.tls_ca_file"),
        "{e}"
    );
}

#[tokio::test]
async fn a_wrong_server_name_fails_cluster_start_up_naming_redis_tls_server_name() {
    let cluster = TlsCluster::start(false);
    let mut settings = cluster.settings(false);
    settings.push((
        "RATELIMITER__REDIS__TLS_SERVER_NAME".to_owned(),
        "redis.example.com".to_owned(),
    ));
    let e = start_up_error(settings).await;
    assert!(
        e.contains("cannot reach the Redis Cluster at rediss://ratelimiter:***@127.0.0.1:"),
        "{e}"
    );
    assert!(e.contains("TLS handshake with Redis at 127.0.0.1:"), "{e}");
    assert!(e.contains("redis.tls_server_name"), "{e}");
}

#[tokio::test]
async fn a_missing_client_certificate_fails_cluster_start_up_naming_redis_tls_cert_file() {
    let cluster = TlsCluster::start(true);
    let e = start_up_error(cluster.settings(false)).await;
    assert!(
        e.contains("cannot reach the Redis Cluster at rediss://ratelimiter:***@127.0.0.1:"),
        "{e}"
    );
    assert!(e.contains("TLS handshake with Redis at 127.0.0.1:"), "{e}");
    assert!(e.contains("redis.tls_cert_file"), "{e}");
}

#[tokio::test]
async fn an_expired_server_certificate_fails_start_up_as_such() {
    let redis = TlsRedis::start_with(false, Validity::Expired);
    let e = start_up_error(redis.settings(false)).await;
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
            vec![("RATELIMITER__REDIS__TLS_CERT_FILE", cert.clone())],
            "redis.tls_key_file",
        ),
        (
            vec![
                ("RATELIMITER__REDIS__TLS_CERT_FILE", cert.clone()),
                ("RATELIMITER__REDIS__TLS_KEY_FILE", cert.clone()),
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

/// The settings of an instance on `redis` over mutual TLS, its client certificate expiring
/// `days` from now.
fn with_client_certificate_for_days(redis: &TlsRedis, days: u64) -> Vec<(String, String)> {
    let mut settings = redis.settings(false);
    settings.extend(client_certificate_files(redis.pki.issue_valid(
        "short",
        &["client.test"],
        Validity::Days(days),
    )));
    settings
}

#[tokio::test]
async fn the_expiry_gauge_shows_the_days_left_of_the_redis_client_certificate() {
    let redis = TlsRedis::start(true);
    let settings = with_client_certificate_for_days(&redis, 20);
    let env: Vec<(&str, &str)> = settings
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    // A process of its own: the gauge is the process's, and other tests here show Redis
    // certificates of their own.
    let binary = Binary::start("", &env).await;
    let text = reqwest::get(format!("{}/metrics", binary.address))
        .await
        .expect("/metrics")
        .text()
        .await
        .expect("text");
    let gauge: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("ratelimiter_tls_certificate_expiry_days{"))
        .collect();
    assert_eq!(gauge.len(), 1, "only the Redis client certificate: {text}");
    let line = gauge[0];
    assert!(
        line.starts_with("ratelimiter_tls_certificate_expiry_days{certificate=\"redis\"} "),
        "{line}"
    );
    let days: f64 = line
        .rsplit(' ')
        .next()
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("a number of days: {line}"));
    assert!((19.9..=20.0).contains(&days), "{line}");
    // 20 days left: /readyz says nothing of it.
    let ready: Value = reqwest::get(format!("{}/readyz", binary.address))
        .await
        .expect("/readyz")
        .json()
        .await
        .expect("JSON");
    assert!(ready.get("degraded").is_none(), "{ready}");
}

#[tokio::test]
async fn readyz_warns_of_a_redis_client_certificate_near_its_expiry_and_stays_ready() {
    let redis = TlsRedis::start(true);
    let settings = with_client_certificate_for_days(&redis, 5);
    let extra: Vec<(&str, &str)> = settings
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let app = spawn_app_with(None, &extra).await;
    let response = app.get("/readyz").await;
    assert_eq!(response.status(), 200);
    let ready: Value = response.json().await.expect("JSON");
    let degraded = ready["degraded"].as_str().unwrap_or_default();
    assert!(
        degraded.contains("the Redis client TLS certificate expires in 5.0 days")
            || degraded.contains("the Redis client TLS certificate expires in 4.9 days"),
        "{ready}"
    );
    // Still deciding over mutual TLS with it.
    app.create_policy(
        json!({"name": "soon", "algorithm": "fixed_window", "limit": 5, "window_ms": 60000}),
    )
    .await;
    let (answer, by) = acquire(&app, "soon", "k").await;
    assert_eq!((&answer["allowed"], by.as_str()), (&json!(true), "redis"));
}
