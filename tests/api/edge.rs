//! The HTTP edge under hostile clients: bodies that never end, connection floods under a low
//! file limit, Authorization headers, `/metrics` behind a token, repeated JSON keys, and what
//! the logs show of a request.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{fresh_client_is_served, spawn_app_with, Binary, TestApp, TestRedis};

/// The flood test's client token and policy, for the fresh clients served beside it.
const EDGE: (&str, &str) = ("edge-token", "edge-flood");

/// Connects to `address` (`http://127.0.0.1:port`) and writes `request` as is.
async fn send_raw(address: &str, request: &[u8]) -> TcpStream {
    let host = address.trim_start_matches("http://");
    let mut stream = TcpStream::connect(host).await.expect("connect");
    stream.write_all(request).await.expect("write");
    stream
}

/// What came back on a connection within `within`, and whether the server closed it by then.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> (String, bool) {
    let deadline = tokio::time::Instant::now() + within;
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return (String::from_utf8_lossy(&received).into_owned(), false),
            Ok(Ok(0)) | Ok(Err(_)) => {
                return (String::from_utf8_lossy(&received).into_owned(), true)
            }
            Ok(Ok(n)) => received.extend_from_slice(&buf[..n]),
        }
    }
}

fn status_of(response: &str) -> Option<u16> {
    response.split(' ').nth(1).and_then(|s| s.parse().ok())
}

fn has_header(response: &str, name: &str, value: &str) -> bool {
    let head = response.split("\r\n\r\n").next().unwrap_or("");
    head.lines().any(|l| {
        l.split_once(':').is_some_and(|(n, v)| {
            n.trim().eq_ignore_ascii_case(name) && v.trim().eq_ignore_ascii_case(value)
        })
    })
}

/// A request whose chunked body starts and never ends.
fn unterminated_chunked(path: &str, authorization: Option<&str>) -> Vec<u8> {
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\n\r\n5\r\n{{\"pol\r\n"
    )
    .into_bytes()
}

/// A request that announces a body and sends none of it.
fn body_never_sent(path: &str, authorization: Option<&str>) -> Vec<u8> {
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n"
    )
    .into_bytes()
}

async fn acquire_with(app: &TestApp, authorization: &[&str]) -> reqwest::Response {
    let mut request = app
        .client
        .post(app.url("/v1/acquire"))
        .json(&json!({"policy": "edge-auth", "key": "k"}));
    for value in authorization {
        request = request.header("Authorization", *value);
    }
    request.send().await.expect("sent")
}

async fn problem(r: reqwest::Response, status: u16) -> Value {
    assert_eq!(r.status(), status);
    assert_eq!(
        r.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/problem+json")
    );
    r.json().await.expect("problem JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_answered_early_is_closed_though_its_chunked_body_never_ends() {
    let app = spawn_app_with(None, &[("RATELIMITER__AUTH__CLIENT_TOKENS", "edge-token")]).await;
    for (path, status) in [("/v1/acquire", 401), ("/nowhere", 404)] {
        let mut stream = send_raw(&app.address, &unterminated_chunked(path, None)).await;
        // actix lingers 1 s (client_disconnect_timeout) before it closes.
        let (response, closed) = read_until_closed(&mut stream, Duration::from_secs(5)).await;
        assert_eq!(status_of(&response), Some(status), "{response}");
        assert!(has_header(&response, "connection", "close"), "{response}");
        assert!(closed, "{path}: the connection is still open: {response}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_never_arrives_is_answered_408_and_its_connection_closed() {
    let app = spawn_app_with(
        None,
        &[
            ("RATELIMITER__AUTH__CLIENT_TOKENS", "edge-token"),
            ("RATELIMITER__SERVER__REQUEST_TIMEOUT_MS", "500"),
        ],
    )
    .await;
    let token = Some("Bearer edge-token");
    for request in [
        body_never_sent("/v1/acquire", token),
        unterminated_chunked("/v1/acquire", token),
        body_never_sent("/v1/policies", None),
    ] {
        let mut stream = send_raw(&app.address, &request).await;
        let (response, closed) = read_until_closed(&mut stream, Duration::from_secs(5)).await;
        assert_eq!(status_of(&response), Some(408), "{response}");
        assert!(
            response.contains("urn:ratelimiter:problem:request-timeout"),
            "{response}"
        );
        assert!(has_header(&response, "connection", "close"), "{response}");
        assert!(closed, "the connection is still open: {response}");
    }
    // A body that does arrive is served as before.
    app.create_policy(
        json!({"name": "edge-408", "algorithm": "fixed_window", "limit": 5, "window_ms": 60_000}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_is_case_insensitive() {
    let app = spawn_app_with(None, &[("RATELIMITER__AUTH__CLIENT_TOKENS", "edge-token")]).await;
    app.create_policy(json!({"name": "edge-auth", "algorithm": "fixed_window", "limit": 100, "window_ms": 60_000}))
        .await;
    for value in [
        "Bearer edge-token",
        "bearer edge-token",
        "BEARER edge-token",
    ] {
        let r = acquire_with(&app, &[value]).await;
        assert_eq!(r.status(), 200, "{value}");
    }
    for value in ["Basic edge-token", "bearer other", "bearer"] {
        let r = acquire_with(&app, &[value]).await;
        let p = problem(r, 401).await;
        assert_eq!(p["type"], "urn:ratelimiter:problem:unauthorized", "{value}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_authorization_headers_are_refused() {
    let app = spawn_app_with(None, &[("RATELIMITER__AUTH__CLIENT_TOKENS", "edge-token")]).await;
    app.create_policy(json!({"name": "edge-auth", "algorithm": "fixed_window", "limit": 100, "window_ms": 60_000}))
        .await;
    for values in [
        ["Bearer edge-token", "Bearer wrong"],
        ["Bearer wrong", "Bearer edge-token"],
        ["Bearer edge-token", "Bearer edge-token"],
    ] {
        let r = acquire_with(&app, &values).await;
        assert!(r.headers().contains_key("www-authenticate"));
        let p = problem(r, 401).await;
        assert!(
            p["detail"]
                .as_str()
                .is_some_and(|d| d.contains("more than one Authorization header")),
            "{p}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_can_be_put_behind_a_token() {
    let app = spawn_app_with(
        None,
        &[
            ("RATELIMITER__AUTH__METRICS_TOKENS", "scrape-1,scrape-2"),
            ("RATELIMITER__AUTH__CLIENT_TOKENS", "edge-token"),
        ],
    )
    .await;
    let metrics = |auth: Option<&'static str>| {
        let mut request = app.client.get(app.url("/metrics"));
        if let Some(a) = auth {
            request = request.header("Authorization", a);
        }
        request.send()
    };
    for auth in [None, Some("Bearer edge-token"), Some("Bearer scrape-3")] {
        let r = metrics(auth).await.expect("sent");
        assert!(r.headers().contains_key("www-authenticate"), "{auth:?}");
        problem(r, 401).await;
    }
    for auth in ["Bearer scrape-1", "bearer scrape-2"] {
        let r = metrics(Some(auth)).await.expect("sent");
        assert_eq!(r.status(), 200, "{auth}");
    }
    // Without the setting, /metrics stays open.
    let open = spawn_app_with(None, &[]).await;
    assert_eq!(open.get("/metrics").await.status(), 200);
}

/// Sends `body` as is (the JSON a client library would never produce).
async fn send_json_text(app: &TestApp, method: reqwest::Method, path: &str, body: &str) -> Value {
    let r = app
        .client
        .request(method, app.url(path))
        .header("Content-Type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .expect("sent");
    problem(r, 400).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_repeated_in_a_body_is_refused_at_any_depth() {
    let app = spawn_app_with(None, &[]).await;
    let p = send_json_text(
        &app,
        reqwest::Method::POST,
        "/v1/policies",
        r#"{"name": "edge-dup", "algorithm": "fixed_window", "limit": 1, "limit": 1000000, "window_ms": 60000}"#,
    )
    .await;
    assert_eq!(p["type"], "urn:ratelimiter:problem:malformed-field", "{p}");
    assert_eq!(p["field"], "limit", "{p}");
    assert_eq!(app.get("/v1/policies/edge-dup").await.status(), 404);

    app.create_policy(
        json!({"name": "edge-dup", "algorithm": "fixed_window", "limit": 1, "window_ms": 60_000}),
    )
    .await;
    let p = send_json_text(
        &app,
        reqwest::Method::PUT,
        "/v1/policies/edge-dup",
        r#"{"algorithm": "fixed_window", "limit": 1000000, "window_ms": 60000, "limit": 1000000}"#,
    )
    .await;
    assert_eq!(p["field"], "limit", "{p}");
    let p = send_json_text(
        &app,
        reqwest::Method::PUT,
        "/v1/policies/edge-dup",
        r#"{"algorithm": "fixed_window", "limit": 5, "window_ms": 60000, "x": [{"y": {"z": 1, "z": 2}}]}"#,
    )
    .await;
    assert_eq!(p["field"], "x[0].y.z", "{p}");
    let policy: Value = app
        .get("/v1/policies/edge-dup")
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(policy["limit"], 1, "the refused writes changed nothing");

    let p = send_json_text(
        &app,
        reqwest::Method::POST,
        "/v1/acquire",
        r#"{"policy": "edge-dup", "key": "a", "key": "b"}"#,
    )
    .await;
    assert_eq!(p["field"], "key", "{p}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_unfinished_bodies_do_not_starve_other_clients() {
    // The flood needs more descriptors than the service starts with (soft limit 1,024), and
    // fewer than its hard limit (4,096) allows once raised.
    const SOFT: u64 = 1_024;
    const HARD: u64 = 4_096;
    const FLOOD: usize = 2_400;
    let (_, our_hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).expect("getrlimit");
    assert!(
        our_hard >= HARD,
        "this test needs a hard open-file limit of at least {HARD} (ulimit -Hn), not {our_hard}"
    );
    rlimit::increase_nofile_limit(HARD + 1_000).expect("raise the test's own file limit");

    let service = Binary::start(
        &format!("ulimit -Sn {SOFT} && ulimit -Hn {HARD} || exit 97"),
        &[
            ("RATELIMITER__AUTH__CLIENT_TOKENS", "edge-token"),
            // Long enough that the flood is still open while the fresh clients below are served
            // on a slow machine; a starved service serves none of them before it.
            ("RATELIMITER__SERVER__REQUEST_TIMEOUT_MS", "20000"),
        ],
    )
    .await;
    // The service raised its soft limit to the hard one, and lowered max_connections (4,096 per
    // worker by default) to fit: (4,096 - 256 reserved) / 2 workers.
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", service.child.id()))
        .expect("/proc limits");
    let open_files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files");
    assert_eq!(
        open_files.split_whitespace().nth(3),
        Some(HARD.to_string().as_str()),
        "{open_files}"
    );
    assert!(
        service.log_text().contains("lowered_to=1920"),
        "{}",
        service.log_text()
    );
    let created = reqwest::Client::new()
        .post(format!("{}/v1/policies", service.address))
        .json(&json!({"name": "edge-flood", "algorithm": "token_bucket", "capacity": 1000, "refill_tokens": 1000, "refill_period_ms": 1000}))
        .send()
        .await
        .expect("sent");
    assert_eq!(created.status(), 201);

    // The flood: unterminated chunked bodies without a token (answered 401 at once), and, with
    // a valid token, bodies that never arrive and chunked bodies that never end.
    let token = Some("Bearer edge-token");
    let hostile: Vec<Vec<u8>> = (0..FLOOD)
        .map(|i| match i % 4 {
            0 | 1 => unterminated_chunked("/v1/acquire", None),
            2 => body_never_sent("/v1/acquire", token),
            _ => unterminated_chunked("/v1/acquire", token),
        })
        .collect();
    let address = service.address.trim_start_matches("http://").to_owned();
    let opened = join_all(hostile.into_iter().map(|request| {
        let address = address.clone();
        async move {
            let connect = async {
                let mut s = TcpStream::connect(&address).await.ok()?;
                s.write_all(&request).await.ok()?;
                Some(s)
            };
            tokio::time::timeout(Duration::from_secs(15), connect)
                .await
                .ok()
                .flatten()
        }
    }))
    .await;
    let opened: Vec<TcpStream> = opened.into_iter().flatten().collect();
    assert!(
        opened.len() > SOFT as usize,
        "only {} of {FLOOD} hostile connections were opened",
        opened.len()
    );

    // While they are open, fresh clients are served, again and again.
    for round in 0..3 {
        if let Err(e) = fresh_client_is_served(&service.address, EDGE, Duration::from_secs(6)).await
        {
            panic!(
                "round {round}: a fresh client was not served with {} hostile connections open: \
                 {e}; the service holds {} descriptors",
                opened.len(),
                service.open_files()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Every hostile connection is answered and closed by the server: the 401s at once, the
    // others at the request deadline.
    let answers = join_all(
        opened
            .into_iter()
            .map(|mut s| async move { read_until_closed(&mut s, Duration::from_secs(90)).await }),
    )
    .await;
    let still_open = answers.iter().filter(|(_, closed)| !closed).count();
    assert_eq!(still_open, 0, "connections the server left open");
    let statuses: Vec<Option<u16>> = answers.iter().map(|(r, _)| status_of(r)).collect();
    assert!(statuses.contains(&Some(401)));
    assert!(statuses.contains(&Some(408)));
    assert!(
        statuses.iter().all(|s| matches!(s, Some(401 | 408))),
        "{:?}",
        statuses
            .iter()
            .filter(|s| !matches!(s, Some(401 | 408)))
            .take(5)
            .collect::<Vec<_>>()
    );
    let log = service.log_text();
    assert!(!log.contains("Too many open files"), "{log}");
    fresh_client_is_served(&service.address, EDGE, Duration::from_secs(5))
        .await
        .expect("served after the flood");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_show_no_query_string_no_spoofed_address_and_escaped_fields() {
    let redis = TestRedis::start();
    let service = Binary::start(
        "true",
        &[
            ("RATELIMITER__REDIS__URL", &redis.url()),
            ("RATELIMITER__REDIS__TIMEOUT_MS", "500"),
        ],
    )
    .await;
    // With Redis gone, /readyz logs a warning inside the request's span.
    redis.kill();
    let user_agent = "probe\" http.client_ip=6.6.6.7 \\ \tend \u{e9}";
    let r = reqwest::Client::new()
        .get(format!(
            "{}/readyz?access_token=SUPERSECRET-IN-QUERY",
            service.address
        ))
        .header("X-Forwarded-For", "6.6.6.6")
        .header(
            "User-Agent",
            reqwest::header::HeaderValue::from_bytes(user_agent.as_bytes()).expect("obs-text"),
        )
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 503);
    // The line is written after the answer; give it a moment.
    let deadline = Instant::now() + Duration::from_secs(5);
    let line = loop {
        let log = service.log_text();
        if let Some(line) = log
            .lines()
            .find(|l| l.contains("HTTP request") && l.contains("/readyz"))
        {
            break line.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no log line of the request: {log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let log = service.log_text();
    assert!(!log.contains("SUPERSECRET"), "{line}");
    assert!(!log.contains("6.6.6.6"), "{line}");
    assert!(line.contains("http.client_ip=127.0.0.1"), "{line}");
    assert!(line.contains("http.target=\"/readyz\""), "{line}");
    // The User-Agent is one escaped string: its quote, backslash, tab and non-ASCII cannot end
    // the field or forge another.
    assert!(
        line.contains(r#"http.user_agent="probe\" http.client_ip=6.6.6.7 \\ \tend é""#),
        "{line}"
    );
    assert!(!line.contains('\t'), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_logs_a_line_a_second_not_a_line_a_decision() {
    let redis = TestRedis::start();
    let service = Binary::start(
        "true",
        &[
            ("RATELIMITER__REDIS__URL", &redis.url()),
            ("RATELIMITER__REDIS__TIMEOUT_MS", "200"),
        ],
    )
    .await;
    let client = reqwest::Client::new();
    for (name, mode) in [("open-outage", "open"), ("closed-outage", "closed")] {
        let r = client
            .post(format!("{}/v1/policies", service.address))
            .json(&json!({"name": name, "algorithm": "fixed_window", "limit": 5, "window_ms": 60_000, "fail_mode": mode}))
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), 201);
    }
    redis.kill();
    let started = Instant::now();
    let mut answered = 0;
    while started.elapsed() < Duration::from_millis(1_500) {
        let burst = ["open-outage", "closed-outage"].map(|policy| {
            client
                .post(format!("{}/v1/acquire", service.address))
                .json(&json!({"policy": policy, "key": "k"}))
                .send()
        });
        for r in join_all(burst).await {
            assert!(matches!(r.map(|r| r.status().as_u16()), Ok(200 | 503)));
            answered += 1;
        }
    }
    assert!(
        answered >= 100,
        "the outage was exercised: {answered} answers"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = service.log_text();
    let lines = |what: &str| log.lines().filter(|l| l.contains(what)).count();
    // Over about 1.5 s: a line at once, then at most one a second, for each kind of failure.
    let degraded = lines("answering by fail mode");
    let refused = lines("answered 503");
    assert!((1..=3).contains(&degraded), "{degraded} lines:\n{log}");
    assert!((1..=3).contains(&refused), "{refused} lines:\n{log}");
    assert!(log.contains("count="), "{log}");
}
