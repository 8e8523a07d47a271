//! OpenTelemetry traces over OTLP/HTTP protobuf: the tracer provider and its bounded export
//! queue, the `tracing` layer that turns the request spans into OpenTelemetry spans, the W3C
//! `traceparent` / `tracestate` a caller sends, and the decision's attributes on its span.
//!
//! Off unless an endpoint is configured (`tracing.otlp_endpoint` or the `OTEL_EXPORTER_OTLP_*`
//! variables, see `config::TracingSettings`). Off, nothing here runs on a request but one relaxed
//! atomic load ([`enabled`]): no layer is installed, no header is parsed, the store's child span
//! is not created and no attribute is formatted ([`store_call`], [`record_decision`]).
//!
//! On, exporting never waits on the collector: finished spans go into a bounded queue that the
//! SDK's batch thread empties; a span finished while the queue is full is dropped and counted in
//! [`SPANS_DROPPED`] (the SDK only logs its own drops, once, so the queue is bounded here, below
//! the SDK's, and the SDK's never fills). Shutdown sends what is queued, within
//! `tracing.shutdown_timeout_ms`.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry::{Context, KeyValue, StringValue, Value};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider, SpanData, SpanExporter,
    SpanProcessor,
};
use opentelemetry_sdk::Resource;
use tracing::{Instrument, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::{Layer, Registry};

use crate::config::TracingSettings;
use crate::policy::LimitKey;
use crate::service::Acquired;

/// Spans dropped because the export queue was full (`tracing.queue_size`).
pub const SPANS_DROPPED: &str = "ratelimiter_trace_spans_dropped_total";

static ENABLED: AtomicBool = AtomicBool::new(false);
static RECORD_KEY: AtomicBool = AtomicBool::new(false);

/// Whether traces are exported: the one check a request pays when they are not.
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("tracing: cannot build the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// The running tracer provider; [`Tracing::shutdown`] sends what is queued.
#[derive(Debug)]
pub struct Tracing {
    provider: SdkTracerProvider,
    shutdown_timeout: Duration,
    endpoint: String,
    sample_ratio: f64,
    service_name: String,
}

/// The layer that turns `tracing` spans into OpenTelemetry spans.
pub type TraceLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// Starts exporting when `settings` has an endpoint: the provider and the layer to install with
/// the log subscriber (`telemetry::init`); `None` when tracing is off.
pub fn start(settings: &TracingSettings) -> Result<Option<(Tracing, TraceLayer)>, TraceError> {
    // Registered now (the recorder first), on or off, so that the counter shows 0 before the
    // first drop and a dashboard's panel of it has a series on every instance.
    crate::metrics::handle();
    metrics::counter!(SPANS_DROPPED).absolute(0);
    let Some(endpoint) = &settings.endpoint else {
        return Ok(None);
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(endpoint.clone())
        .with_timeout(settings.export_timeout())
        .build()?;
    let queued = Arc::new(AtomicUsize::new(0));
    let batch = BatchSpanProcessor::new(
        Dequeued {
            inner: exporter,
            queued: queued.clone(),
        },
        BatchConfigBuilder::default()
            .with_max_queue_size(settings.queue_size)
            .with_max_export_batch_size(settings.queue_size.min(512))
            .with_scheduled_delay(Duration::from_millis(500))
            .build(),
    );
    let provider = SdkTracerProvider::builder()
        .with_span_processor(Bounded {
            inner: batch,
            queued,
            capacity: settings.queue_size,
        })
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            settings.sample_ratio,
        ))))
        .with_resource(
            Resource::builder()
                .with_service_name(settings.service_name.clone())
                .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
                .build(),
        )
        .build();
    let tracer = provider.tracer("ratelimiter");
    // Only this crate's spans, at `info` and above, whatever RUST_LOG says of the logs: the
    // HTTP client of the exporter itself, h2 and tonic are never traced.
    let only_ours = Targets::new().with_target("ratelimiter", LevelFilter::INFO);
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_tracked_inactivity(false)
        .with_threads(false)
        .with_location(false)
        .with_filter(only_ours)
        .boxed();
    ENABLED.store(true, Ordering::Relaxed);
    RECORD_KEY.store(settings.record_key, Ordering::Relaxed);
    Ok(Some((
        Tracing {
            provider,
            shutdown_timeout: settings.shutdown_timeout(),
            endpoint: endpoint.clone(),
            sample_ratio: settings.sample_ratio,
            service_name: settings.service_name.clone(),
        },
        layer,
    )))
}

impl Tracing {
    /// Logs where traces go; once the log subscriber is installed (`start` runs before it).
    pub fn announce(&self) {
        tracing::info!(
            endpoint = %self.endpoint,
            sample_ratio = self.sample_ratio,
            service = %self.service_name,
            "exporting traces over OTLP/HTTP"
        );
    }

    /// Sends the spans still queued, within `tracing.shutdown_timeout_ms`, and stops exporting.
    /// Blocks: call it off the runtime's threads or after the servers stopped.
    pub fn shutdown(self) {
        ENABLED.store(false, Ordering::Relaxed);
        if let Err(e) = self.provider.shutdown_with_timeout(self.shutdown_timeout) {
            tracing::warn!(error = %e, "spans still queued at shutdown were not all sent");
        }
    }
}

/// The caller's trace, from the W3C `traceparent` (and `tracestate`) in `carrier`, made the
/// parent of `span`. A missing or malformed header leaves `span` a root: never an error.
pub fn continue_trace(span: &Span, carrier: &dyn Extractor) {
    if !enabled() || carrier.get("traceparent").is_none() {
        return;
    }
    let parent = TraceContextPropagator::new().extract(carrier);
    if parent.span().span_context().is_valid() {
        // Fails only when the span is disabled or already started: it then stays a root.
        let _ = span.set_parent(parent);
    }
}

/// Puts a decision's attributes on `span` (the request's or the call's): `ratelimit.policy`,
/// `ratelimit.operation`, `ratelimit.limits` (their names), `ratelimit.decided_by`,
/// `ratelimit.allowed` (the answer; in shadow mode also `ratelimit.would_allow`),
/// `ratelimit.cost`, and `ratelimit.key` only when `tracing.record_key` is on. See
/// [`record_decisions`] for a gRPC call of several descriptors.
pub fn record_decision(span: &Span, a: &Acquired, key: &LimitKey, cost: u64) {
    record_decisions(span, &[(a, key, cost)]);
}

/// The attributes of [`record_decision`] for the decisions of one call: the policies, the
/// deciders and the keys comma-separated in descriptor order, every limit's name, `allowed`
/// when every one was, and the costs summed.
pub fn record_decisions(span: &Span, decisions: &[(&Acquired, &LimitKey, u64)]) {
    if !enabled() || span.is_disabled() || decisions.is_empty() {
        return;
    }
    let joined = |part: &dyn Fn(&(&Acquired, &LimitKey, u64)) -> String| {
        decisions.iter().map(part).collect::<Vec<_>>().join(",")
    };
    span.set_attribute("ratelimit.policy", joined(&|d| d.0.policy.name.to_string()));
    span.set_attribute(
        "ratelimit.operation",
        joined(&|d| d.0.op.as_str().to_owned()),
    );
    let names: Vec<StringValue> = decisions
        .iter()
        .flat_map(|d| d.0.limits())
        .map(|l| StringValue::from(l.name.to_string()))
        .collect();
    span.set_attribute(
        "ratelimit.limits",
        Value::Array(opentelemetry::Array::String(names)),
    );
    span.set_attribute(
        "ratelimit.decided_by",
        joined(&|d| d.0.decided_by.as_str().to_owned()),
    );
    span.set_attribute("ratelimit.allowed", decisions.iter().all(|d| d.0.allowed()));
    if decisions.iter().any(|d| d.0.shadow) {
        span.set_attribute(
            "ratelimit.would_allow",
            decisions.iter().all(|d| d.0.verdict.allowed),
        );
    }
    let cost = decisions
        .iter()
        .map(|d| d.2)
        .fold(0u64, u64::saturating_add);
    span.set_attribute("ratelimit.cost", i64::try_from(cost).unwrap_or(i64::MAX));
    if RECORD_KEY.load(Ordering::Relaxed) {
        span.set_attribute("ratelimit.key", joined(&|d| d.1.as_str().to_owned()));
    }
}

/// Runs `call`, one call to the store (`operation`, on `decider`: `redis` or `embedded`),
/// inside a child span of the current one when traces are exported; otherwise runs it as it is,
/// creating no span.
pub async fn store_call<F: Future>(
    operation: &'static str,
    decider: &'static str,
    call: F,
) -> F::Output {
    if !enabled() {
        return call.await;
    }
    let span = tracing::info_span!(
        "store",
        otel.name = operation,
        otel.kind = "client",
        db.system = decider,
    );
    call.instrument(span).await
}

/// The SDK's batch processor behind a queue bound of its own, which counts what it drops.
#[derive(Debug)]
struct Bounded {
    inner: BatchSpanProcessor,
    /// Spans handed to `inner` and not yet given to the exporter (see [`Dequeued`]).
    queued: Arc<AtomicUsize>,
    capacity: usize,
}

impl SpanProcessor for Bounded {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        // The SDK's queue holds at most what `queued` counts, and has the same capacity: it is
        // never full when this lets a span through.
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.capacity {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            metrics::counter!(SPANS_DROPPED).increment(1);
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The exporter, counting the spans it takes out of the queue.
#[derive(Debug)]
struct Dequeued<E> {
    inner: E,
    queued: Arc<AtomicUsize>,
}

impl<E: SpanExporter> SpanExporter for Dequeued<E> {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        self.queued.fetch_sub(batch.len(), Ordering::AcqRel);
        self.inner.export(batch)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// An HTTP request's headers as the propagator reads them.
pub struct HttpHeaders<'a>(pub &'a actix_web::http::header::HeaderMap);

impl Extractor for HttpHeaders<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// A gRPC call's metadata as the propagator reads it.
pub struct GrpcMetadata<'a>(pub &'a tonic::metadata::MetadataMap);

impl Extractor for GrpcMetadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts what it exports, each export waiting until `open` is set: a receiver that does
    /// not answer, for as long as a test wants.
    #[derive(Debug, Clone, Default)]
    struct Counting {
        exported: Arc<std::sync::Mutex<usize>>,
        open: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    }

    impl Counting {
        fn open(&self) {
            let (open, changed) = &*self.open;
            if let Ok(mut open) = open.lock() {
                *open = true;
            }
            changed.notify_all();
        }

        fn exported(&self) -> usize {
            self.exported.lock().map(|n| *n).unwrap_or_default()
        }
    }

    impl SpanExporter for Counting {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            let (open, changed) = &*self.open;
            if let Ok(guard) = open.lock() {
                let _open = changed.wait_while(guard, |open| !*open);
            }
            if let Ok(mut n) = self.exported.lock() {
                *n += batch.len();
            }
            Ok(())
        }
    }

    #[test]
    fn the_queue_bound_drops_and_counts_instead_of_waiting() {
        use opentelemetry::trace::{Span as _, Tracer as _};
        let exported = Counting::default();
        let queued = Arc::new(AtomicUsize::new(0));
        // A receiver that does not answer: the batch thread takes a batch (the SDK starts an
        // export as soon as a batch's worth is queued) and hangs in its export, so the queue
        // fills behind it and stays full.
        let batch = BatchSpanProcessor::new(
            Dequeued {
                inner: exported.clone(),
                queued: queued.clone(),
            },
            BatchConfigBuilder::default()
                .with_max_queue_size(4)
                .with_max_export_batch_size(4)
                .with_scheduled_delay(Duration::from_secs(3_600))
                .build(),
        );
        let provider = SdkTracerProvider::builder()
            .with_span_processor(Bounded {
                inner: batch,
                queued: queued.clone(),
                capacity: 4,
            })
            .build();
        let tracer = provider.tracer("test");
        // A batch's worth, which the batch thread takes into its hung export.
        for _ in 0..4 {
            tracer.start("s").end();
        }
        let waiting = std::time::Instant::now();
        while queued.load(Ordering::Acquire) != 0 {
            assert!(
                waiting.elapsed() < Duration::from_secs(10),
                "never exported"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // Then 6 more: 4 fill the queue behind the hung export, 2 are dropped, none waits.
        let started = std::time::Instant::now();
        for _ in 0..6 {
            tracer.start("s").end();
        }
        assert!(started.elapsed() < Duration::from_secs(1), "never waits");
        assert_eq!(queued.load(Ordering::Acquire), 4, "the bound holds");
        exported.open();
        provider
            .shutdown_with_timeout(Duration::from_secs(5))
            .expect("shut down");
        assert_eq!(exported.exported(), 8, "the queued ones are sent");
        assert_eq!(queued.load(Ordering::Acquire), 0);
    }

    #[test]
    fn a_malformed_traceparent_is_ignored() {
        let parse = |value: &str| {
            let mut headers = actix_web::http::header::HeaderMap::new();
            headers.insert(
                actix_web::http::header::HeaderName::from_static("traceparent"),
                actix_web::http::header::HeaderValue::from_str(value).expect("value"),
            );
            TraceContextPropagator::new()
                .extract(&HttpHeaders(&headers))
                .span()
                .span_context()
                .is_valid()
        };
        assert!(parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        for bad in [
            "",
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(!parse(bad), "{bad:?}");
        }
    }
}
