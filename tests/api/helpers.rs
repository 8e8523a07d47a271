//! Test fixtures: a private `redis-server` per test, and the real application on port 0.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ratelimiter::config::Settings;
use ratelimiter::startup::Application;
use serde_json::{json, Value};

/// Which store an app under test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Embedded,
    Redis,
    /// A Redis Cluster of 3 masters with a replica each, started for the test.
    Cluster,
}

/// A `redis-server` of our own on a free loopback port, killed on drop. Tests never use any
/// other Redis.
///
/// The service connects as [`TEST_USER`], whose ACL is exactly what `ratelimiter --print-acl`
/// prints for the prefix `rl` ([`TestRedis::url`]), so that the whole suite proves the
/// documented ACL is enough; the tests themselves inspect and break Redis as the default user,
/// which may do anything ([`TestRedis::admin_url`], [`TestRedis::conn`]).
pub struct TestRedis {
    child: Mutex<Child>,
    pub port: u16,
    args: Vec<String>,
}

/// The Redis user the service connects as in the tests, and its password.
pub const TEST_USER: &str = "ratelimiter";
pub const TEST_PASSWORD: &str = "acl-test-pw";

const INSTALL_HINT: &str = "the tests need `redis-server` 7 or later on PATH: `scripts/test` installs it, or on Debian or Ubuntu run \
     `apt-get install -y redis-server` (it also brings redis-cli)";

/// A free loopback port (nothing listens on it right now).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

impl TestRedis {
    /// Starts a server and waits until it answers PING. Retries on another port if the chosen
    /// one was taken in between.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (later ones override earlier ones).
    pub fn start_with(extra: &[&str]) -> Self {
        let args: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
        for _ in 0..5 {
            let port = free_port();
            if let Some(child) = spawn_redis(port, &args) {
                return Self {
                    child: Mutex::new(child),
                    port,
                    args,
                };
            }
        }
        panic!("redis-server did not start on a free port; {INSTALL_HINT}");
    }

    /// Kills the server and starts it again on the same port, with the same arguments.
    pub fn restart(&self) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let _ = child.kill();
        let _ = child.wait();
        for _ in 0..50 {
            if let Some(new) = spawn_redis(self.port, &self.args) {
                *child = new;
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server did not restart on port {}", self.port);
    }

    /// The service's URL: as [`TEST_USER`], limited to the documented ACL.
    pub fn url(&self) -> String {
        format!(
            "redis://{TEST_USER}:{TEST_PASSWORD}@127.0.0.1:{}",
            self.port
        )
    }

    /// As the default user, who may do anything: for the tests' own inspections.
    pub fn admin_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A plain synchronous connection as the default user, for inspecting keys.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.admin_url())
            .and_then(|c| c.get_connection())
            .expect("connect to the test redis")
    }
}

/// Sends `signal` (its name without `SIG`) to process `pid`.
pub fn signal_pid(pid: u32, signal: &str) {
    let number = match signal {
        "STOP" => libc::SIGSTOP,
        "CONT" => libc::SIGCONT,
        "TERM" => libc::SIGTERM,
        "KILL" => libc::SIGKILL,
        "INT" => libc::SIGINT,
        "HUP" => libc::SIGHUP,
        other => panic!("signal_pid: no signal named {other}"),
    };
    let pid = libc::pid_t::try_from(pid).expect("a pid fits pid_t");
    // SAFETY: kill(2) takes two integers and touches no memory of ours.
    let result = unsafe { libc::kill(pid, number) };
    assert_eq!(
        result,
        0,
        "kill -{signal} {pid}: {}",
        std::io::Error::last_os_error()
    );
}

/// Starts `redis-server` on `port` and waits until it answers; `None` if it exits first (the
/// port was taken) or does not answer within 10 s.
fn spawn_redis(port: u16, extra: &[String]) -> Option<Child> {
    let mut child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args([
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "yes",
        ])
        .args(["--dir", &std::env::temp_dir().to_string_lossy()])
        .args(["--user", TEST_USER, "on", &format!(">{TEST_PASSWORD}")])
        .args(ratelimiter::store::redis::acl::rules("rl").split(' '))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start redis-server ({e}); {INSTALL_HINT}"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return None;
        }
        if let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}")) {
            if let Ok(mut conn) = client.get_connection() {
                if redis::cmd("PING").query::<String>(&mut conn).is_ok() {
                    return Some(child);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

impl TestRedis {
    /// Sends a signal (`STOP`, `CONT`, `TERM`…) to the server with `kill(1)`.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.lock().unwrap_or_else(|e| e.into_inner()).id();
        signal_pid(pid, signal);
    }

    /// Stops the server as an operator would (SIGTERM) and waits for it to exit.
    pub fn stop(&self) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        signal_pid(child.id(), "TERM");
        let _ = child.wait();
    }

    /// Kills the server (as a crash would) and waits for it to be gone.
    pub fn kill(&self) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis Cluster of our own: 3 masters and 3 replicas on free loopback ports (client and bus
/// ports both chosen free), created with `redis-cli --cluster create`, killed on drop.
pub struct TestCluster {
    nodes: Vec<TestRedis>,
    dir: std::path::PathBuf,
    /// Each node's TLS port, when its arguments had a `{tls-port}` placeholder.
    pub tls_ports: Vec<u16>,
}

impl TestCluster {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a cluster whose nodes all get extra `redis-server` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ratelimiter-cluster-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("cluster dir");
        let dir_arg = dir.to_string_lossy().into_owned();
        let mut tls_ports = Vec::new();
        let nodes: Vec<TestRedis> = (0..6)
            .map(|i| {
                let bus = free_port().to_string();
                // `{tls-port}` in `extra`: a free port of each node's own.
                let tls_port = free_port();
                if extra.contains(&"{tls-port}") {
                    tls_ports.push(tls_port);
                }
                let tls_port = tls_port.to_string();
                let extra: Vec<&str> = extra
                    .iter()
                    .map(|a| {
                        if *a == "{tls-port}" {
                            tls_port.as_str()
                        } else {
                            a
                        }
                    })
                    .collect();
                let conf = format!("nodes-{i}.conf");
                let mut args = vec![
                    "--cluster-enabled",
                    "yes",
                    "--cluster-port",
                    &bus,
                    "--cluster-config-file",
                    &conf,
                    "--cluster-node-timeout",
                    "1000",
                    "--dir",
                    &dir_arg,
                ];
                args.extend_from_slice(&extra);
                TestRedis::start_with(&args)
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        // `redis-cli --cluster create` waits without end for the nodes to agree when a bus
        // handshake is lost (seen once in CI, over TLS): given a deadline, the nodes are reset
        // and it is run once more, so that a test fails rather than hangs the suite.
        let mut attempts = 0;
        loop {
            attempts += 1;
            let mut create = Command::new("redis-cli")
                .arg("--cluster")
                .arg("create")
                .args(&addresses)
                .args(["--cluster-replicas", "1", "--cluster-yes"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}); {INSTALL_HINT}"));
            let deadline = Instant::now() + Duration::from_secs(60);
            let status = loop {
                match create.try_wait() {
                    Ok(Some(status)) => break Some(status),
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    _ => {
                        let _ = create.kill();
                        let _ = create.wait();
                        break None;
                    }
                }
            };
            let mut stdout = String::new();
            if let Some(mut out) = create.stdout.take() {
                let _ = std::io::Read::read_to_string(&mut out, &mut stdout);
            }
            match status {
                Some(status) => {
                    assert!(status.success(), "redis-cli --cluster create: {stdout}");
                    break;
                }
                None if attempts < 2 => {
                    for n in &nodes {
                        let _ = redis::cmd("CLUSTER")
                            .arg("RESET")
                            .arg("HARD")
                            .query::<()>(&mut n.conn());
                    }
                }
                None => panic!("redis-cli --cluster create did not finish in 60 s: {stdout}"),
            }
        }
        let cluster = Self {
            nodes,
            dir,
            tls_ports,
        };
        cluster.wait_until_ok();
        cluster
    }

    /// Waits until every node reports `cluster_state:ok` and every replica is in sync.
    pub fn wait_until_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = self.nodes.iter().all(|n| {
                let mut conn =
                    match redis::Client::open(n.admin_url()).and_then(|c| c.get_connection()) {
                        Ok(c) => c,
                        Err(_) => return false,
                    };
                let state = redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut conn);
                let replication = redis::cmd("INFO")
                    .arg("replication")
                    .query::<String>(&mut conn);
                matches!((state, replication), (Ok(s), Ok(r))
                    if s.contains("cluster_state:ok")
                        && (r.contains("role:master") || r.contains("master_link_status:up")))
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not reach cluster_state:ok"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `user:password@host:port` of every node, comma-separated, as `redis.cluster_nodes`
    /// takes them: as [`TEST_USER`], limited to the documented ACL.
    pub fn seeds(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("{TEST_USER}:{TEST_PASSWORD}@127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A plain connection to each node that is a master now.
    pub fn masters(&self) -> Vec<redis::Connection> {
        self.nodes()
            .iter()
            .map(|n| n.conn())
            .filter_map(|mut conn| {
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query(&mut conn)
                    .expect("INFO replication");
                info.contains("role:master").then_some(conn)
            })
            .collect()
    }

    pub fn nodes(&self) -> &[TestRedis] {
        &self.nodes
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for n in &self.nodes {
            n.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A running application and an HTTP client for it.
pub struct TestApp {
    pub address: String,
    pub client: reqwest::Client,
    /// Keeps the app's Redis running as long as the app.
    pub _redis: Option<Arc<TestRedis>>,
    pub cluster: Option<Arc<TestCluster>>,
    /// The gRPC port, when the app was started with `RATELIMITER__GRPC__BIND`.
    pub grpc_port: Option<u16>,
    /// The service itself: tests that drive time set its clock.
    pub limiter: Arc<ratelimiter::service::RateLimiter>,
}

/// Starts the app on a free port: on the embedded store, or on a fresh private Redis.
pub async fn spawn_app(backend: Backend) -> TestApp {
    match backend {
        Backend::Embedded => spawn_app_with(None, &[]).await,
        Backend::Redis => spawn_app_with(Some(Arc::new(TestRedis::start())), &[]).await,
        Backend::Cluster => spawn_app_on_cluster(Arc::new(TestCluster::start()), &[]).await,
    }
}

/// Starts the app on `backend`, with extra `RATELIMITER__…` settings.
pub async fn spawn_app_on(backend: Backend, extra: &[(&str, &str)]) -> TestApp {
    match backend {
        Backend::Embedded => spawn_app_with(None, extra).await,
        Backend::Redis => spawn_app_with(Some(Arc::new(TestRedis::start())), extra).await,
        Backend::Cluster => spawn_app_on_cluster(Arc::new(TestCluster::start()), extra).await,
    }
}

/// Starts the app against a cluster, with extra `RATELIMITER__…` settings.
pub async fn spawn_app_on_cluster(cluster: Arc<TestCluster>, extra: &[(&str, &str)]) -> TestApp {
    let seeds = cluster.seeds();
    let mut settings = vec![("RATELIMITER__REDIS__CLUSTER_NODES", seeds.as_str())];
    settings.extend_from_slice(extra);
    let mut app = spawn_app_with(None, &settings).await;
    app.cluster = Some(cluster);
    app
}

/// Starts the app against `redis` (or the embedded store), with extra `RATELIMITER__…`
/// settings.
pub async fn spawn_app_with(redis: Option<Arc<TestRedis>>, extra: &[(&str, &str)]) -> TestApp {
    spawn_app_with_file(redis, extra, None).await
}

pub async fn spawn_app_with_file(
    redis: Option<Arc<TestRedis>>,
    extra: &[(&str, &str)],
    config_file: Option<&std::path::Path>,
) -> TestApp {
    let mut env: Vec<(String, String)> = vec![
        ("RATELIMITER__SERVER__BIND".into(), "127.0.0.1:0".into()),
        ("RATELIMITER__SERVER__WORKERS".into(), "2".into()),
        ("RATELIMITER__REDIS__POLICY_REFRESH_MS".into(), "100".into()),
        ("RATELIMITER__REDIS__TIMEOUT_MS".into(), "2000".into()),
    ];
    if let Some(r) = &redis {
        env.push(("RATELIMITER__REDIS__URL".into(), r.url()));
    }
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let settings = Settings::load_from(config_file, env).expect("test settings are valid");
    let app = Application::build(settings).await.expect("the app starts");
    let address = format!("http://127.0.0.1:{}", app.port());
    let grpc_port = app.grpc_port();
    let limiter = app.limiter();
    tokio::spawn(app.run_until_stopped());
    TestApp {
        address,
        client: reqwest::Client::new(),
        _redis: redis,
        cluster: None,
        grpc_port,
        limiter,
    }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    pub async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .expect("request sent")
    }

    pub async fn put(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client
            .put(self.url(path))
            .json(body)
            .send()
            .await
            .expect("request sent")
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(self.url(path))
            .send()
            .await
            .expect("request sent")
    }

    pub async fn delete(&self, path: &str) -> reqwest::Response {
        self.client
            .delete(self.url(path))
            .send()
            .await
            .expect("request sent")
    }

    /// Creates a policy and checks that it was created.
    pub async fn create_policy(&self, policy: Value) {
        let r = self.post("/v1/policies", &policy).await;
        let status = r.status();
        assert_eq!(
            status,
            201,
            "create {policy}: {}",
            r.text().await.unwrap_or_default()
        );
    }

    /// One acquire; returns the JSON answer (status 200 asserted).
    pub async fn acquire(&self, policy: &str, key: &str, cost: u64) -> Value {
        let r = self
            .post(
                "/v1/acquire",
                &json!({"policy": policy, "key": key, "cost": cost}),
            )
            .await;
        assert_eq!(r.status(), 200, "acquire {policy}/{key}");
        r.json().await.expect("JSON decision")
    }

    /// One acquire of 1 unit; returns the JSON answer and the headers (status 200 asserted).
    pub async fn acquire_with_headers(
        &self,
        policy: &str,
        key: &str,
    ) -> (Value, reqwest::header::HeaderMap) {
        let r = self
            .post(
                "/v1/acquire",
                &json!({"policy": policy, "key": key, "cost": 1}),
            )
            .await;
        assert_eq!(r.status(), 200, "acquire {policy}/{key}");
        let headers = r.headers().clone();
        (r.json().await.expect("JSON decision"), headers)
    }

    /// Creates an override of `policy`, asserting 201 and a `Location` naming its id; answers
    /// its document.
    pub async fn create_override(&self, policy: &str, body: Value) -> Value {
        let r = self
            .post(&format!("/v1/policies/{policy}/overrides"), &body)
            .await;
        let status = r.status();
        let location = r
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let doc: Value = r.json().await.expect("JSON");
        assert_eq!(status, 201, "{body}: {doc}");
        let id = doc["id"].as_str().unwrap_or("");
        assert_eq!(
            location,
            Some(format!("/v1/policies/{policy}/overrides/{id}")),
            "{doc}"
        );
        doc
    }

    /// Every policy, as listed by the API.
    pub async fn policies(&self) -> Value {
        self.get("/v1/policies")
            .await
            .json()
            .await
            .expect("JSON list")
    }
}

/// One policy of each algorithm, all allowing `limit` units over a long window, named
/// `<prefix>-<algorithm>`.
pub fn policies_of_every_algorithm(prefix: &str, limit: u64) -> Vec<Value> {
    let window = json!(3_600_000);
    vec![
        json!({"name": format!("{prefix}-fixed_window"), "algorithm": "fixed_window", "limit": limit, "window_ms": window}),
        json!({"name": format!("{prefix}-sliding_window_log"), "algorithm": "sliding_window_log", "limit": limit, "window_ms": window}),
        json!({"name": format!("{prefix}-sliding_window_counter"), "algorithm": "sliding_window_counter", "limit": limit, "window_ms": window}),
        json!({"name": format!("{prefix}-token_bucket"), "algorithm": "token_bucket", "capacity": limit, "refill_tokens": 1, "refill_period_ms": 86_400_000}),
        json!({"name": format!("{prefix}-gcra"), "algorithm": "gcra", "rate": 1, "period_ms": 86_400_000, "burst": limit}),
    ]
}

/// Declares each listed `async fn name(backend: Backend)` as three tests: on the embedded store,
/// on one Redis, on a Redis Cluster.
#[macro_export]
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::helpers::Backend::Embedded).await
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::helpers::Backend::Redis).await
                }
            )*
        }
        mod cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::helpers::Backend::Cluster).await
                }
            )*
        }
    };
}

/// Waits until every epoch-aligned window of `windows_ms` has at least 15 s left, so that no
/// fixed or sliding window turns over while a test counts on it (a test here takes far less).
pub async fn clear_of_window_edges(windows_ms: &[u64]) {
    const MARGIN_MS: u64 = 15_000;
    loop {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("the clock is after 1970")
            .as_millis() as u64;
        let wait = windows_ms
            .iter()
            .map(|w| w - now_ms % w)
            .filter(|left| *left < MARGIN_MS)
            .max();
        match wait {
            Some(left) => tokio::time::sleep(Duration::from_millis(left + 50)).await,
            None => return,
        }
    }
}

/// The servers that own state on `app`'s store: its Redis, or each master of its cluster.
/// None on the embedded store.
pub fn masters(app: &TestApp) -> Option<Vec<redis::Connection>> {
    if let Some(redis) = &app._redis {
        return Some(vec![redis.conn()]);
    }
    Some(app.cluster.as_ref()?.masters())
}

/// The value of one sample of `/metrics`, found by its name and labels; 0 when absent.
pub async fn metric(app: &TestApp, name: &str, labels: &[(&str, &str)]) -> f64 {
    let text = app.get("/metrics").await.text().await.expect("metrics");
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .map(|v| v.parse().expect("a number"))
        .unwrap_or(0.0)
}

/// The operation `op` of `cost` units as a plan asks it; `ticket` is a refund's (the other
/// operations have none).
pub fn ask<'a>(
    op: ratelimiter::limiter::Op,
    cost: u64,
    ticket: Option<&ratelimiter::store::Claim<'a>>,
) -> ratelimiter::store::Ask<ratelimiter::store::Claim<'a>> {
    use ratelimiter::limiter::Op;
    use ratelimiter::store::Ask;
    match op {
        Op::Acquire => Ask::Acquire { cost },
        Op::Peek => Ask::Peek { cost },
        Op::Report => Ask::Report { cost },
        Op::Refund => Ask::Refund {
            cost,
            ticket: ticket.copied(),
        },
    }
}

/// A ticket's claim on `marks` for `units`, with an id of its own, as the service sends it (no
/// claim without marks: a ticketless operation).
pub fn claim(
    marks: &[ratelimiter::limiter::Mark],
    units: u64,
) -> Option<ratelimiter::store::Claim<'_>> {
    static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    (!marks.is_empty()).then(|| ratelimiter::store::Claim {
        marks,
        id: IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        units,
        ends_at_us: marks
            .iter()
            .map(|m| ratelimiter::limiter::mark_life_end(m.at))
            .max()
            .unwrap_or(0),
    })
}

/// A refund's mark arguments for `n` limits as `lua/common.lua` lays them out (per limit its
/// time, then per limit its refund count, then the take's time; all empty without a ticket).
pub fn mark_args(n: usize, marks: &[ratelimiter::limiter::Mark]) -> Vec<String> {
    let given = marks.len() == n;
    let field = |f: fn(&ratelimiter::limiter::Mark) -> u64| {
        (0..n).map(move |i| {
            if given {
                f(&marks[i]).to_string()
            } else {
                String::new()
            }
        })
    };
    let taken = marks
        .first()
        .filter(|_| given)
        .map_or(String::new(), |m| m.taken_us.to_string());
    field(|m| m.at)
        .chain(field(|m| m.refunded))
        .chain([taken])
        .collect()
}

/// A verdict as a decision script replies to `op` (`lua/common.lua`): allowed, then each limit's
/// units (admits for an acquire or a peek), remaining, reset_after_us and retry_after_us, then
/// the time, then for an acquire or a report each limit's refund count.
pub fn script_reply(v: &ratelimiter::limiter::Verdict, op: ratelimiter::limiter::Op) -> Vec<u64> {
    use ratelimiter::limiter::Op;
    let mut reply = vec![u64::from(v.allowed)];
    for (d, units) in v.limits().iter().zip(v.units()) {
        let first = match op {
            Op::Acquire | Op::Peek => u64::from(d.allowed),
            Op::Report | Op::Refund => *units,
        };
        reply.extend([first, d.remaining, d.reset_after_us, d.retry_after_us]);
    }
    reply.push(v.at_us);
    if matches!(op, Op::Acquire | Op::Report) {
        reply.extend(&v.refunded[..v.limits().len()]);
    }
    reply
}

/// The real binary, with its standard error in a file; killed on drop.
pub struct Binary {
    pub child: Child,
    pub address: String,
    log: std::path::PathBuf,
}

impl Binary {
    /// Starts the service through `sh -c '<shell_prefix>; exec …'` (for `ulimit`), with `env`,
    /// and waits until `/healthz` answers.
    pub async fn start(shell_prefix: &str, env: &[(&str, &str)]) -> Self {
        let port = free_port();
        let log = std::env::temp_dir().join(format!(
            "ratelimiter-binary-{}-{port}.log",
            std::process::id()
        ));
        let stderr = std::fs::File::create(&log).expect("log file");
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!("{shell_prefix}\nexec \"$0\""))
            .arg(env!("CARGO_BIN_EXE_ratelimiter"))
            .env("RATELIMITER__SERVER__BIND", format!("127.0.0.1:{port}"))
            .env("RATELIMITER__SERVER__WORKERS", "2")
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start the service");
        let binary = Self {
            child,
            address: format!("http://127.0.0.1:{port}"),
            log,
        };
        let client = reqwest::Client::new();
        let start = Instant::now();
        while client
            .get(format!("{}/healthz", binary.address))
            .send()
            .await
            .map(|r| r.status() != 200)
            .unwrap_or(true)
        {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the service did not start: {}",
                binary.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        binary
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Open file descriptors of the process right now.
    pub fn open_files(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(|d| d.count())
            .unwrap_or(0)
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// One fresh HTTP client's `/healthz`, then an acquire of `policy` with the bearer `token`
/// (`(token, policy)`), each within `within`: what the flood tests require while a flood is open.
pub async fn fresh_client_is_served(
    address: &str,
    (token, policy): (&str, &str),
    within: Duration,
) -> Result<(), String> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(within)
        .build()
        .map_err(|e| e.to_string())?;
    let health = client
        .get(format!("{address}/healthz"))
        .send()
        .await
        .map_err(|e| format!("/healthz: {e}"))?;
    if health.status() != 200 {
        return Err(format!("/healthz answered {}", health.status()));
    }
    let acquire = client
        .post(format!("{address}/v1/acquire"))
        .bearer_auth(token)
        .json(&json!({"policy": policy, "key": "fresh"}))
        .send()
        .await
        .map_err(|e| format!("acquire: {e}"))?;
    if acquire.status() != 200 {
        return Err(format!("acquire answered {}", acquire.status()));
    }
    Ok(())
}
