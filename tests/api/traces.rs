//! OpenTelemetry traces, end to end: the real binary (the tracer provider is process-wide, so
//! each test runs the service as a child process) exports over OTLP/HTTP to a receiver in this
//! test that decodes each export with the published OTLP protobuf definitions
//! (`opentelemetry-proto`). Checked: the caller's `traceparent` is the parent, over HTTP and
//! gRPC metadata; the decision's attributes; the store's child span; no subject key unless
//! `tracing.record_key`; a malformed `traceparent` ignored; sampling ratio 0 sends no root; a
//! receiver that never answers neither slows nor fails an acquire, and the spans it cannot take
//! are counted as dropped; shutdown ends within its deadline.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use prost::Message;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use crate::helpers::{free_port, signal_pid, Binary};

const TRACE_HTTP: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_HTTP: &str = "00f067aa0ba902b7";
const TRACE_GRPC: &str = "0af7651916cd43dd8448eb211c80319c";
const PARENT_GRPC: &str = "b7ad6b7169203331";

/// One span as the receiver decoded it, ids in lower-case hex.
#[derive(Debug, Clone)]
struct Got {
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    attributes: HashMap<String, Any>,
    service_name: Option<String>,
}

impl Got {
    fn text(&self, key: &str) -> Option<&str> {
        match self.attributes.get(key)? {
            Any::StringValue(s) => Some(s),
            _ => None,
        }
    }

    fn flag(&self, key: &str) -> Option<bool> {
        match self.attributes.get(key)? {
            Any::BoolValue(b) => Some(*b),
            _ => None,
        }
    }

    fn int(&self, key: &str) -> Option<i64> {
        match self.attributes.get(key)? {
            Any::IntValue(i) => Some(*i),
            _ => None,
        }
    }

    fn texts(&self, key: &str) -> Vec<String> {
        match self.attributes.get(key) {
            Some(Any::ArrayValue(a)) => a
                .values
                .iter()
                .filter_map(|v| match &v.value {
                    Some(Any::StringValue(s)) => Some(s.clone()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A minimal OTLP/HTTP receiver: HTTP/1.1 with keep-alive, `POST /v1/traces` bodies decoded as
/// `ExportTraceServiceRequest`. With `answer` false it accepts connections and never answers
/// (a collector that hangs).
struct Receiver {
    port: u16,
    spans: Arc<Mutex<Vec<Got>>>,
    paths: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    async fn start(answer: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let paths = Arc::new(Mutex::new(Vec::new()));
        let (s, p) = (spans.clone(), paths.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (s, p) = (s.clone(), p.clone());
                tokio::spawn(async move {
                    if !answer {
                        // Hold the connection open, unanswered.
                        let _held = stream;
                        tokio::time::sleep(Duration::from_secs(3_600)).await;
                        return;
                    }
                    let _ = serve(stream, s, p).await;
                });
            }
        });
        Self { port, spans, paths }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn spans(&self) -> Vec<Got> {
        self.spans.lock().expect("lock").clone()
    }

    /// Waits up to 10 s for a span that `wanted` accepts.
    async fn wait_for(&self, what: &str, wanted: impl Fn(&Got) -> bool) -> Got {
        let start = Instant::now();
        loop {
            if let Some(g) = self.spans().into_iter().find(|g| wanted(g)) {
                return g;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no {what} arrived; got {:#?}",
                self.spans()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn serve(
    stream: tokio::net::TcpStream,
    spans: Arc<Mutex<Vec<Got>>>,
    paths: Arc<Mutex<Vec<String>>>,
) -> std::io::Result<()> {
    let mut stream = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if stream.read_line(&mut request_line).await? == 0 {
            return Ok(());
        }
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            stream.read_line(&mut line).await?;
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; length];
        stream.read_exact(&mut body).await?;
        let path = request_line.split(' ').nth(1).unwrap_or("").to_owned();
        paths.lock().expect("lock").push(path);
        record(&body, &spans);
        stream
            .get_mut()
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n")
            .await?;
    }
}

/// Decodes one export and keeps its spans.
fn record(body: &[u8], spans: &Mutex<Vec<Got>>) {
    let export =
        ExportTraceServiceRequest::decode(body).expect("an OTLP ExportTraceServiceRequest");
    let mut got = spans.lock().expect("lock");
    for resource in export.resource_spans {
        let service_name = resource.resource.as_ref().and_then(|r| {
            r.attributes
                .iter()
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    Any::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
        });
        for scope in resource.scope_spans {
            for span in scope.spans {
                got.push(Got {
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    attributes: span
                        .attributes
                        .into_iter()
                        .filter_map(|kv| Some((kv.key, kv.value?.value?)))
                        .collect(),
                    service_name: service_name.clone(),
                });
            }
        }
    }
}

async fn create_policies(address: &str) {
    let client = reqwest::Client::new();
    for policy in [
        json!({"name": "traced", "algorithm": "token_bucket", "capacity": 100, "refill_tokens": 100, "refill_period_ms": 3_600_000}),
        json!({
            "name": "traced-edge", "algorithm": "token_bucket",
            "capacity": 100, "refill_tokens": 100, "refill_period_ms": 3_600_000,
            "descriptor": {"domain": "edge", "entries": [{"key": "remote_address"}]}
        }),
    ] {
        let r = client
            .post(format!("{address}/v1/policies"))
            .json(&policy)
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
    }
}

async fn acquire(address: &str, key: &str, traceparent: Option<&str>) -> Duration {
    let mut request = reqwest::Client::new()
        .post(format!("{address}/v1/acquire"))
        .json(&json!({"policy": "traced", "key": key, "cost": 2}));
    if let Some(t) = traceparent {
        request = request
            .header("traceparent", t)
            .header("tracestate", "vendor=x");
    }
    let start = Instant::now();
    let r = request.send().await.expect("sent");
    let took = start.elapsed();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    took
}

fn grpc_request(address: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".to_owned(),
                value: address.to_owned(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

/// The service with traces sent to `endpoint`, gRPC served, and `extra` settings.
async fn service(endpoint: &str, extra: &[(&str, &str)]) -> (Binary, u16) {
    let grpc = free_port();
    let grpc_bind = format!("127.0.0.1:{grpc}");
    let mut env = vec![
        ("RATELIMITER__TRACING__OTLP_ENDPOINT", endpoint),
        ("RATELIMITER__GRPC__BIND", grpc_bind.as_str()),
    ];
    env.extend_from_slice(extra);
    let binary = Binary::start("", &env).await;
    create_policies(&binary.address).await;
    (binary, grpc)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_continue_the_callers_trace_over_http_and_grpc_with_the_decision() {
    let receiver = Receiver::start(true).await;
    let (service, grpc) = service(
        &receiver.endpoint(),
        &[("OTEL_SERVICE_NAME", "limiter-under-test")],
    )
    .await;

    acquire(
        &service.address,
        "user-7",
        Some(&format!("00-{TRACE_HTTP}-{PARENT_HTTP}-01")),
    )
    .await;
    let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
        .await
        .expect("gRPC connects");
    let mut call = tonic::Request::new(grpc_request("203.0.113.9"));
    call.metadata_mut().insert(
        "traceparent",
        format!("00-{TRACE_GRPC}-{PARENT_GRPC}-01")
            .parse()
            .expect("metadata"),
    );
    client.should_rate_limit(call).await.expect("an answer");
    assert!(
        service
            .log_text()
            .contains("exporting traces over OTLP/HTTP"),
        "{}",
        service.log_text()
    );
    // A malformed traceparent is ignored: the acquire is answered, its span is a root.
    acquire(&service.address, "user-8", Some("00-not-a-trace-01")).await;

    let http = receiver
        .wait_for("HTTP request span", |g| {
            g.trace_id == TRACE_HTTP && g.name == "HTTP request"
        })
        .await;
    assert_eq!(http.parent_span_id, PARENT_HTTP, "{http:#?}");
    assert_eq!(http.text("ratelimit.policy"), Some("traced"));
    assert_eq!(http.text("ratelimit.operation"), Some("acquire"));
    assert_eq!(http.texts("ratelimit.limits"), ["traced"]);
    assert_eq!(http.text("ratelimit.decided_by"), Some("embedded"));
    assert_eq!(http.flag("ratelimit.allowed"), Some(true));
    assert_eq!(http.int("ratelimit.cost"), Some(2));
    assert_eq!(http.text("ratelimit.key"), None, "no key by default");
    assert_eq!(http.service_name.as_deref(), Some("limiter-under-test"));
    let store = receiver
        .wait_for("store span", |g| g.parent_span_id == http.span_id)
        .await;
    assert_eq!(store.trace_id, TRACE_HTTP);
    assert_eq!(store.name, "store decide");
    assert_eq!(store.text("db.system"), Some("embedded"));

    let call = receiver
        .wait_for("gRPC span", |g| {
            g.trace_id == TRACE_GRPC && g.name == "grpc"
        })
        .await;
    assert_eq!(call.parent_span_id, PARENT_GRPC, "{call:#?}");
    assert_eq!(call.text("ratelimit.policy"), Some("traced-edge"));
    assert_eq!(call.texts("ratelimit.limits"), ["traced-edge"]);
    assert_eq!(call.text("ratelimit.decided_by"), Some("embedded"));
    assert_eq!(call.flag("ratelimit.allowed"), Some(true));
    assert_eq!(call.int("ratelimit.cost"), Some(1));
    assert_eq!(call.text("ratelimit.key"), None, "no key by default");
    let store = receiver
        .wait_for("gRPC store span", |g| g.parent_span_id == call.span_id)
        .await;
    assert_eq!(store.trace_id, TRACE_GRPC);

    let root = receiver
        .wait_for("span of the malformed traceparent", |g| {
            g.name == "HTTP request" && g.parent_span_id.is_empty()
        })
        .await;
    assert_ne!(root.trace_id, TRACE_HTTP);
    assert!(receiver
        .paths
        .lock()
        .expect("lock")
        .iter()
        .all(|p| p == "/v1/traces"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subject_key_is_recorded_only_when_the_setting_allows_it() {
    let receiver = Receiver::start(true).await;
    let (service, _) = service(
        &receiver.endpoint(),
        &[("RATELIMITER__TRACING__RECORD_KEY", "true")],
    )
    .await;
    acquire(
        &service.address,
        "user-42",
        Some(&format!("00-{TRACE_HTTP}-{PARENT_HTTP}-01")),
    )
    .await;
    let http = receiver
        .wait_for("HTTP request span", |g| {
            g.trace_id == TRACE_HTTP && g.name == "HTTP request"
        })
        .await;
    assert_eq!(http.text("ratelimit.key"), Some("user-42"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_ratio_zero_sends_no_root_but_follows_a_sampled_caller() {
    let receiver = Receiver::start(true).await;
    let (service, _) = service(
        &receiver.endpoint(),
        &[("RATELIMITER__TRACING__SAMPLE_RATIO", "0")],
    )
    .await;
    for i in 0..20 {
        acquire(&service.address, &format!("root-{i}"), None).await;
    }
    // Not sampled by its caller: not recorded either.
    acquire(
        &service.address,
        "unsampled",
        Some(&format!("00-{TRACE_GRPC}-{PARENT_GRPC}-00")),
    )
    .await;
    acquire(
        &service.address,
        "sampled",
        Some(&format!("00-{TRACE_HTTP}-{PARENT_HTTP}-01")),
    )
    .await;
    receiver
        .wait_for("the sampled caller's span", |g| g.trace_id == TRACE_HTTP)
        .await;
    // Spans are exported in the order they end: those of earlier requests came first.
    let others: Vec<Got> = receiver
        .spans()
        .into_iter()
        .filter(|g| g.trace_id != TRACE_HTTP)
        .collect();
    assert!(others.is_empty(), "unsampled spans were sent: {others:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_never_answers_neither_slows_nor_fails_acquires() {
    let hanging = Receiver::start(false).await;
    let (mut service, _) = service(
        &hanging.endpoint(),
        &[
            ("RATELIMITER__TRACING__QUEUE_SIZE", "16"),
            ("RATELIMITER__TRACING__EXPORT_TIMEOUT_MS", "30000"),
            ("RATELIMITER__TRACING__SHUTDOWN_TIMEOUT_MS", "1000"),
        ],
    )
    .await;
    let mut slowest = Duration::ZERO;
    for i in 0..300 {
        slowest = slowest.max(acquire(&service.address, &format!("k{}", i % 50), None).await);
    }
    assert!(
        slowest < Duration::from_millis(250),
        "an acquire took {slowest:?} while the collector hung"
    );
    let metrics = reqwest::get(format!("{}/metrics", service.address))
        .await
        .expect("scraped")
        .text()
        .await
        .expect("text");
    let dropped: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("ratelimiter_trace_spans_dropped_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no drop counter in {metrics}"));
    // 300 requests of 2 spans each (the request, the store call) into a queue of 16, which a
    // collector that never answers does not empty (the first batch is stuck in its export).
    assert!(dropped >= 500.0, "dropped {dropped}");

    // Shutdown gives the queued spans `tracing.shutdown_timeout_ms`, then exits all the same.
    let start = Instant::now();
    signal_pid(service.child.id(), "TERM");
    loop {
        if service.child.try_wait().expect("wait").is_some() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "still running after SIGTERM: {}",
            service.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_sends_the_spans_still_queued() {
    let receiver = Receiver::start(true).await;
    let (mut service, _) = service(&receiver.endpoint(), &[]).await;
    acquire(
        &service.address,
        "last",
        Some(&format!("00-{TRACE_HTTP}-{PARENT_HTTP}-01")),
    )
    .await;
    // At once, well within the batch's 500 ms delay: only the shutdown's flush can send it.
    signal_pid(service.child.id(), "TERM");
    let start = Instant::now();
    while service.child.try_wait().expect("wait").is_none() {
        assert!(start.elapsed() < Duration::from_secs(8), "still running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        receiver.spans().iter().any(|g| g.trace_id == TRACE_HTTP),
        "the queued span was not sent at shutdown: {:#?}",
        receiver.spans()
    );
}
