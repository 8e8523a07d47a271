//! Operating the service: metrics, access control, and a graceful stop of the real binary.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use serde_json::{json, Value};

use crate::helpers::{free_port, signal_pid, spawn_app, spawn_app_with, Backend, TestRedis};

/// The value of one sample line of a Prometheus exposition, found by its name and labels.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_every_decision_of_a_burst() {
    let app = spawn_app(Backend::Redis).await;
    app.create_policy(json!({"name": "metrics-burst", "algorithm": "fixed_window", "limit": 7, "window_ms": 3_600_000}))
        .await;
    let body = json!({"policy": "metrics-burst", "key": "k"});
    let burst = (0..25).map(|_| app.post("/v1/acquire", &body));
    for r in join_all(burst).await {
        assert_eq!(r.status(), 200);
    }
    let r = app.get("/metrics").await;
    assert_eq!(r.status(), 200);
    assert!(r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/plain")));
    let text = r.text().await.expect("text");
    let decisions = |outcome| {
        sample(
            &text,
            "ratelimiter_decisions_total",
            &[("policy", "metrics-burst"), ("outcome", outcome)],
        )
    };
    assert_eq!(decisions("allowed"), Some(7.0), "{text}");
    assert_eq!(decisions("denied"), Some(18.0), "{text}");
    for name in [
        "ratelimiter_acquire_duration_seconds_bucket",
        "ratelimiter_redis_call_duration_seconds_bucket",
        "ratelimiter_circuit_breaker_state",
        "ratelimiter_redis_pool_connections",
    ] {
        assert!(text.contains(name), "{name} in {text}");
    }
    assert_eq!(
        sample(
            &text,
            "ratelimiter_circuit_breaker_state",
            &[("state", "closed")]
        ),
        Some(1.0)
    );
    assert!(
        text.lines().any(|l| l.starts_with("ratelimiter_policies ")),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_guard_the_policy_api_and_acquire() {
    let app = spawn_app_with(
        None,
        &[
            ("RATELIMITER__AUTH__ADMIN_TOKENS", "admin-one,admin-two"),
            ("RATELIMITER__AUTH__CLIENT_TOKENS", "client-one"),
        ],
    )
    .await;
    let policy =
        json!({"name": "guarded", "algorithm": "fixed_window", "limit": 2, "window_ms": 60000});
    let send = |method: reqwest::Method, path: &str, token: Option<&str>, body: Option<&Value>| {
        let mut req = app.client.request(method, app.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        req.send()
    };
    use reqwest::Method as M;

    for token in [None, Some("wrong"), Some("client-one")] {
        let r = send(M::POST, "/v1/policies", token, Some(&policy))
            .await
            .expect("sent");
        assert_eq!(r.status(), 401, "{token:?}");
        let challenge = r
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok());
        assert_eq!(challenge, Some("Bearer realm=\"ratelimiter\""));
        let problem: Value = r.json().await.expect("problem");
        assert_eq!(problem["type"], "urn:ratelimiter:problem:unauthorized");
        let r = send(M::GET, "/v1/policies", token, None)
            .await
            .expect("sent");
        assert_eq!(r.status(), 401, "reads need the token too");
    }
    let list = send(M::GET, "/v1/policies", Some("admin-one"), None)
        .await
        .expect("sent");
    let list: Value = list.json().await.expect("JSON");
    assert_eq!(
        list["policies"],
        json!([]),
        "a refused write changed nothing"
    );

    let r = send(M::POST, "/v1/policies", Some("admin-two"), Some(&policy))
        .await
        .expect("sent");
    assert_eq!(r.status(), 201);
    let r = send(M::DELETE, "/v1/policies/guarded", None, None)
        .await
        .expect("sent");
    assert_eq!(r.status(), 401);

    let acquire = json!({"policy": "guarded", "key": "k"});
    for token in [None, Some("admin-one")] {
        let r = send(M::POST, "/v1/acquire", token, Some(&acquire))
            .await
            .expect("sent");
        assert_eq!(r.status(), 401, "{token:?}");
    }
    let r = send(M::POST, "/v1/acquire", Some("client-one"), Some(&acquire))
        .await
        .expect("sent");
    assert_eq!(r.status(), 200);

    for path in ["/healthz", "/readyz", "/metrics", "/openapi.json", "/docs/"] {
        assert_eq!(
            send(M::GET, path, None, None).await.expect("sent").status(),
            200,
            "{path}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_every_in_flight_request_finish() {
    let redis = Arc::new(TestRedis::start());
    let port = free_port();
    let mut service = Command::new(env!("CARGO_BIN_EXE_ratelimiter"))
        .env("RATELIMITER__SERVER__BIND", format!("127.0.0.1:{port}"))
        .env("RATELIMITER__REDIS__URL", redis.url())
        .env("RATELIMITER__REDIS__TIMEOUT_MS", "2500")
        .env("RATELIMITER__SERVER__SHUTDOWN_TIMEOUT_S", "10")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the service");
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let start = Instant::now();
    while client
        .get(format!("{base}/readyz"))
        .send()
        .await
        .map(|r| r.status() != 200)
        .unwrap_or(true)
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the service did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = client
        .post(format!("{base}/v1/policies"))
        .json(&json!({"name": "drain", "algorithm": "token_bucket", "capacity": 100, "refill_tokens": 1, "refill_period_ms": 1000}))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 201);

    // Hold Redis so that the next acquires are still in flight when SIGTERM arrives.
    redis.signal("STOP");
    let in_flight = (0..20).map(|i| {
        let url = format!("{base}/v1/acquire");
        tokio::spawn(async move {
            // A connection of its own each, so that none of them is an idle keep-alive one.
            let client = reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .expect("client");
            client
                .post(url)
                .json(&json!({"policy": "drain", "key": format!("k{i}")}))
                .send()
                .await
        })
    });
    let in_flight: Vec<_> = in_flight.collect();
    tokio::time::sleep(Duration::from_millis(400)).await;
    signal_pid(service.id(), "TERM");
    // Longer than actix's first shutdown check (1 s), so a stop that cut requests short would
    // show here.
    tokio::time::sleep(Duration::from_millis(1_800)).await;
    redis.signal("CONT");

    for answer in join_all(in_flight).await {
        let r = answer
            .expect("task")
            .expect("an in-flight request was answered, not dropped");
        assert_eq!(r.status(), 200);
        let d: Value = r.json().await.expect("JSON");
        assert_eq!(d["allowed"], true, "{d}");
    }
    let start = Instant::now();
    let status = loop {
        if let Some(status) = service.try_wait().expect("wait") {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the service did not stop"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "a graceful stop exits 0: {status:?}");
    assert!(
        client.get(format!("{base}/healthz")).send().await.is_err(),
        "nothing listens after the stop"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_request_heads_are_refused() {
    let app = spawn_app(Backend::Embedded).await;
    let mut req = app.client.get(app.url("/healthz"));
    for i in 0..100 {
        req = req.header(format!("x-filler-{i}"), "x");
    }
    assert_eq!(
        req.send().await.expect("sent").status(),
        431,
        "too many header fields"
    );
    let r = app
        .client
        .get(app.url("/healthz"))
        .header("x-filler", "x".repeat(140 * 1024))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 431, "a head over 128 KiB");
    assert_eq!(
        app.get("/healthz").await.status(),
        200,
        "and the service carries on"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_too_slow_to_send_its_headers_is_cut_off() {
    let app = spawn_app_with(
        None,
        &[("RATELIMITER__SERVER__CLIENT_REQUEST_TIMEOUT_MS", "300")],
    )
    .await;
    let address = app.address.trim_start_matches("http://").to_owned();
    let answer = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(address).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        stream
            .write_all(b"POST /v1/acquire HTTP/1.1\r\nHost: x\r\n")
            .expect("write");
        let started = Instant::now();
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        (answer, started.elapsed())
    })
    .await
    .expect("task");
    assert!(answer.0.starts_with("HTTP/1.1 408"), "{:?}", answer.0);
    assert!(
        answer.1 < Duration::from_secs(2),
        "cut off after {:?}",
        answer.1
    );
}
