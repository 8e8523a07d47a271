//! Prometheus metrics: their names and meanings, the process-wide recorder, and the scrape.
//!
//! Hot-path counters are registered once and kept as handles (see `service`), so recording a
//! decision is an atomic add, not a registry lookup. Gauges that describe state (circuit
//! breaker, pool, policy count) are set when `/metrics` is scraped.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Decisions, labelled `policy` and `outcome` (`allowed`, `denied`, `degraded`).
pub const DECISIONS: &str = "ratelimiter_decisions_total";
/// Acquire decisions per limit of each rate policy, labelled `policy`, `limit` (the limit's name;
/// a flat policy's one limit is named after the policy), `outcome` (that limit's own verdict:
/// `allowed` or `denied`) and `decided_by` (the answer's: `redis`, `embedded`, `local_cache`,
/// `fail_open`, `fail_local`, `override`). One count per limit of each acquire counted in
/// [`DECISIONS`].
pub const LIMIT_DECISIONS: &str = "ratelimiter_limit_decisions_total";
/// Allowed acquires after which a limit's used share is at least its policy's
/// `near_limit_ratio` (remaining <= (1 - ratio) × quota), labelled `policy` and `limit`. Not
/// counted for fail-open answers and override decisions, which do not say what is left.
pub const NEAR_LIMIT: &str = "ratelimiter_near_limit_total";
/// The configured quota of each limit (`Params::quota`: `limit`, `capacity` or `burst`),
/// labelled `policy`, `limit` and `tier` (`""` for the policy's own limits, one series per
/// tier). Written at each scrape from this instance's policy cache, so that a policy or tier
/// that goes takes its series with it.
pub const LIMIT_QUOTA: &str = "ratelimiter_limit_quota";
/// The store's latest policy change-log version this instance has read, minus the version its
/// cache has applied.
pub const POLICY_LAG_VERSIONS: &str = "ratelimiter_policy_cache_lag_versions";
/// Seconds since this instance's policy cache was last known current with the store: 0 while
/// its latest refresh applied every change the store had.
pub const POLICY_LAG_SECONDS: &str = "ratelimiter_policy_cache_lag_seconds";
/// Peeks, reports, refunds and resets, labelled `policy` and `operation`.
pub const OPERATIONS: &str = "ratelimiter_operations_total";
/// Units recorded by reports and given back by refunds, labelled `policy` and `operation`.
pub const OPERATION_UNITS: &str = "ratelimiter_operation_units_total";
/// Acquires that a policy in shadow mode answered as allowed and enforcement would have
/// denied, labelled `policy`.
pub const SHADOW_DENIED: &str = "ratelimiter_shadow_denied_total";
/// The units those acquires asked for, labelled `policy`.
pub const SHADOW_DENIED_UNITS: &str = "ratelimiter_shadow_denied_units_total";
/// On a Redis Cluster, whether each master's circuit breaker is open (1) or not (0), labelled
/// `master` (`host:port`).
pub const MASTER_BREAKER_OPEN: &str = "ratelimiter_redis_master_breaker_open";
/// Acquires answered by the local denial cache, labelled `policy` (also counted as `denied`
/// decisions).
pub const DENIAL_CACHE_HITS: &str = "ratelimiter_denial_cache_hits_total";
/// Decisions (acquires, peeks, reports, refunds) by the override that applied, labelled `policy`,
/// `source` (the kind of its match: `none`, `exact`, `prefix`, `cidr`) and `effect` (what it set:
/// `none`, `tier`, `limits`, `unlimited`, `block`): never a key or an override id.
pub const OVERRIDE_DECISIONS: &str = "ratelimiter_override_decisions_total";
/// Invalidation messages the denial cache received (refunds, reports and resets on any
/// instance).
pub const DENIAL_CACHE_INVALIDATIONS: &str = "ratelimiter_denial_cache_invalidations_total";
/// Denials cached now (expired ones not dropped yet included).
pub const DENIAL_CACHE_ENTRIES: &str = "ratelimiter_denial_cache_entries";
/// Lease events, labelled `policy` and `event`: `granted`, `denied`, `renewed`, `released`,
/// `expired` (a holder died or forgot: each expiry counted once over all instances, within about
/// a second of it), and `fail_open` (calls answered without any store). Sum over instances.
pub const LEASES: &str = "ratelimiter_leases_total";
/// Live leases of the policy in the store, over all instances (its ledger's size), labelled
/// `policy`, as of this instance's latest lease call or once-a-second sweep. Every instance
/// reports the same number: aggregate with `max`, not `sum`.
pub const LEASES_IN_USE: &str = "ratelimiter_leases_in_use";
/// Lease calls undone on the shared store after the store failed on them (see
/// `service::undo`), labelled `outcome`: `queued` (a take whose outcome was unknown, or a
/// release answered by fail mode, waiting for the store), `undone` (the store held the lease,
/// and released it), `absent` (the store held nothing: the take never ran, or was refused for
/// its deadline), `dropped` (the queue was full: the lease is held until its expiry),
/// `abandoned` (the store did not answer before the lease would have expired anyway).
pub const LEASE_UNDOS: &str = "ratelimiter_lease_undos_total";
/// Lease undos waiting for the store (at most `limits.lease_undo_queue`).
pub const LEASE_UNDOS_WAITING: &str = "ratelimiter_lease_undos_waiting";
/// Ledgers the latest lease sweep visited (those the lease index holds), and the calls it made.
pub const LEASE_SWEEP_LEDGERS: &str = "ratelimiter_lease_sweep_ledgers";
/// Reservations (acquires with `max_wait_ms`) the store decided, labelled `policy` and
/// `outcome`: `now` (the cost fit at once), `delayed` (booked for later, within the wait
/// accepted), `denied` (it would have waited longer: nothing taken). Shadow mode and `fail_open`
/// answers are not counted here.
pub const RESERVATIONS: &str = "ratelimiter_reservations_total";
/// The delay each granted reservation handed out (`delay_ms`, 0 for one that fit at once), in
/// seconds, labelled `policy`.
pub const RESERVATION_DELAY_SECONDS: &str = "ratelimiter_reservation_delay_seconds";
/// Refunds with the ticket of a booking not yet due that gave units back (cancellations),
/// labelled `policy`.
pub const RESERVATION_CANCELS: &str = "ratelimiter_reservation_cancels_total";
/// Time to answer an acquire, from validated request to decision, in seconds.
pub const ACQUIRE_SECONDS: &str = "ratelimiter_acquire_duration_seconds";
/// Envoy rate-limit calls over gRPC (`ShouldRateLimit`), labelled `code`: the answer's overall
/// `ok` or `over_limit`, or the gRPC status of a call that got none (`invalid_argument`,
/// `unauthenticated`, `unavailable`, `internal`).
pub const GRPC_REQUESTS: &str = "ratelimiter_grpc_requests_total";
/// Descriptors of those calls that a policy served, labelled `policy` and `code` (`ok` or
/// `over_limit`, as answered). Their decisions also count in `ratelimiter_decisions_total`, with
/// the HTTP API's.
pub const GRPC_DESCRIPTORS: &str = "ratelimiter_grpc_descriptors_total";
/// Descriptors of those calls that no policy serves, answered `OK` without a decision.
pub const GRPC_UNMATCHED: &str = "ratelimiter_grpc_unmatched_descriptors_total";
/// gRPC connections the service closed before their HTTP/2 handshake arrived, labelled `reason`:
/// `handshake_timeout` (`grpc.handshake_timeout_ms`) or `evicted` (closed to make room at
/// `grpc.max_connections`).
pub const GRPC_CONNECTIONS_CLOSED: &str = "ratelimiter_grpc_connections_closed_total";
/// Days until one of this instance's TLS certificates expires (fractional, negative once
/// expired), labelled `certificate`: `http` or `grpc` (a listener's, set at load and reload and
/// at every poll of the files) or `redis` (the client certificate shown to Redis,
/// `redis.tls_cert_file`, set at start-up and at every poll).
pub const TLS_CERTIFICATE_EXPIRY_DAYS: &str = "ratelimiter_tls_certificate_expiry_days";
/// Reloads of a listener's TLS files that failed (the certificate in use was kept), labelled
/// `listener`.
pub const TLS_RELOAD_FAILURES: &str = "ratelimiter_tls_reload_failures_total";
/// Time to answer a gRPC `ShouldRateLimit` call, from decoded request to answer, in seconds.
pub const GRPC_SECONDS: &str = "ratelimiter_grpc_request_duration_seconds";
/// Time of each Redis call, connection checkout included, in seconds.
pub const REDIS_SECONDS: &str = "ratelimiter_redis_call_duration_seconds";
/// Script calls that carried a batch of several decisions (see `store::batch`).
pub const REDIS_BATCHES: &str = "ratelimiter_redis_batches_total";
/// Decisions sent to Redis in those batches: divided by the batches, the mean batch size.
pub const REDIS_BATCHED_DECISIONS: &str = "ratelimiter_redis_batched_decisions_total";
/// Failed Redis calls, labelled `kind`: `timeout`, `connection`, `server`, `circuit_open`.
pub const REDIS_ERRORS: &str = "ratelimiter_redis_errors_total";
/// 1 for the circuit breaker's current `state` (`closed`, `half_open`, `open`), 0 for the others.
pub const BREAKER_STATE: &str = "ratelimiter_circuit_breaker_state";
/// Redis connections in the pool, labelled `state`: `in_use` or `idle`.
pub const POOL_CONNECTIONS: &str = "ratelimiter_redis_pool_connections";
/// Policies in this instance's cache.
pub const POLICIES: &str = "ratelimiter_policies";
/// The version of the store's policy change log up to which this instance's cache is current.
pub const POLICY_VERSION: &str = "ratelimiter_policy_cache_version";
/// Seconds since this instance's policy cache was last brought up to date with the store.
pub const POLICY_AGE: &str = "ratelimiter_policy_cache_age_seconds";
/// Pages of policy changes read from the store, labelled `kind`: `full` (a complete reload) or
/// `incremental` (changes since the cache's version).
pub const POLICY_PAGES: &str = "ratelimiter_policy_pages_total";
/// Subjects with state in this process's embedded store (the main one, or `local` fail mode's).
pub const EMBEDDED_SUBJECTS: &str = "ratelimiter_embedded_subjects";
/// Acquires of new subjects refused because the embedded store was full
/// (`limits.max_embedded_subjects`), answered by fail mode.
pub const EMBEDDED_STORE_FULL: &str = "ratelimiter_embedded_store_full_total";

/// Subjects evicted from this instance's top-offender summaries by others (a flood of distinct
/// subjects): each eviction widens the summary's error bound.
pub const TOP_EVICTED: &str = "ratelimiter_top_dropped_total";

/// Folds of a policy's top-offender summaries into Redis, labelled `outcome` = `ok`, `error` (a
/// failed fold is kept and folded with the next).
pub const TOP_FOLDS: &str = "ratelimiter_top_folds_total";

/// Gauges this instance writes into the scrape itself, from its own state, rather than through
/// the process-wide recorder: `metrics-exporter-prometheus` 0.18 cannot remove one series (its
/// only removal is `idle_timeout`, per kind of metric, which would drop every gauge not set
/// lately), and a quota series must go when its policy or tier does. Written after the
/// recorder's text, each name once, in the Prometheus text format.
pub struct Exposition {
    text: String,
}

impl Exposition {
    pub fn new(text: String) -> Self {
        Self { text }
    }

    /// Appends gauge `name` with its `help` and its samples, each `(labels, value)`.
    pub fn gauge<'a>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Vec<(&'a str, &'a str)>, f64)>,
    ) {
        use std::fmt::Write;
        if !self.text.is_empty() && !self.text.ends_with('\n') {
            self.text.push('\n');
        }
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} gauge");
        for (labels, value) in samples {
            self.text.push_str(name);
            if !labels.is_empty() {
                self.text.push('{');
                for (i, (k, v)) in labels.iter().enumerate() {
                    if i > 0 {
                        self.text.push(',');
                    }
                    let _ = write!(self.text, "{k}=\"{}\"", escape(v));
                }
                self.text.push('}');
            }
            let _ = writeln!(self.text, " {value}");
        }
    }

    pub fn into_text(self) -> String {
        self.text
    }
}

/// A label value escaped as the text format asks (`\\`, `\"`, `\n`).
fn escape(v: &str) -> std::borrow::Cow<'_, str> {
    if !v.contains(['\\', '"', '\n']) {
        return v.into();
    }
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
        .into()
}

const LATENCY_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5,
];

/// A reservation's delay: from none to the longest wait accepted, an hour.
const DELAY_BUCKETS: &[f64] = &[
    0.0, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// The process-wide recorder's handle, installed on first use.
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets(LATENCY_BUCKETS)
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full(RESERVATION_DELAY_SECONDS.to_owned()),
                    DELAY_BUCKETS,
                )
            })
            .unwrap_or_else(|_| PrometheusBuilder::new());
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("another metrics recorder is installed; /metrics will be empty");
        }
        describe();
        handle
    })
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!(
        TLS_CERTIFICATE_EXPIRY_DAYS,
        "Days until the TLS certificate expires: a listener's (http, grpc) or the one shown to Redis (redis)"
    );
    describe_counter!(
        TLS_RELOAD_FAILURES,
        "Reloads of the listener's TLS files that failed (the certificate in use was kept)"
    );
    describe_counter!(
        DECISIONS,
        "Decisions by policy and outcome (allowed, denied, degraded)"
    );
    describe_counter!(
        TOP_EVICTED,
        "Subjects evicted from this instance's top-offender summaries by other subjects"
    );
    describe_counter!(
        TOP_FOLDS,
        "Folds of a policy's top-offender summaries into Redis, by outcome (ok, error)"
    );
    describe_counter!(
        LIMIT_DECISIONS,
        "Acquire decisions per limit by that limit's outcome and who decided (decided_by)"
    );
    describe_counter!(
        NEAR_LIMIT,
        "Allowed acquires that left a limit at or past its policy's near_limit_ratio of its quota"
    );
    describe_histogram!(ACQUIRE_SECONDS, Unit::Seconds, "Time to decide one acquire");
    describe_counter!(
        RESERVATIONS,
        "Reservations by policy and outcome (now, delayed, denied)"
    );
    describe_histogram!(
        RESERVATION_DELAY_SECONDS,
        Unit::Seconds,
        "Delay handed out by each granted reservation"
    );
    describe_counter!(
        RESERVATION_CANCELS,
        "Refunds with the ticket of a booking not yet due that gave units back"
    );
    describe_histogram!(
        REDIS_SECONDS,
        Unit::Seconds,
        "Time of one Redis call, checkout included"
    );
    describe_counter!(REDIS_ERRORS, "Failed Redis calls by kind");
    describe_counter!(
        REDIS_BATCHES,
        "Script calls that carried a batch of several decisions"
    );
    describe_counter!(
        REDIS_BATCHED_DECISIONS,
        "Decisions sent to Redis in batches (divided by the batches: the mean batch size)"
    );
    describe_gauge!(BREAKER_STATE, "1 for the circuit breaker's current state");
    describe_gauge!(
        POOL_CONNECTIONS,
        "Redis connections in the pool, in use or idle"
    );
    describe_gauge!(POLICIES, "Policies in this instance's cache");
    describe_gauge!(
        POLICY_VERSION,
        "Version of the policy change log this instance's cache is current with"
    );
    describe_gauge!(
        POLICY_AGE,
        Unit::Seconds,
        "Time since this instance's policy cache was last brought up to date"
    );
    describe_counter!(
        POLICY_PAGES,
        "Pages of policy changes read from the store, full or incremental"
    );
    describe_gauge!(
        EMBEDDED_SUBJECTS,
        "Subjects with state in the embedded store"
    );
    describe_counter!(
        EMBEDDED_STORE_FULL,
        "New subjects refused state because the embedded store was full"
    );
    describe_counter!(
        OPERATIONS,
        "Peeks, reports, refunds and resets by policy and operation"
    );
    describe_counter!(
        OPERATION_UNITS,
        "Units recorded by reports and given back by refunds, by policy and operation"
    );
    describe_gauge!(
        MASTER_BREAKER_OPEN,
        "On a Redis Cluster, 1 while a master's circuit breaker is open (its keys answered by fail mode)"
    );
    describe_counter!(
        DENIAL_CACHE_HITS,
        "Acquires answered by the local denial cache, without asking Redis (also counted as denied)"
    );
    describe_counter!(
        OVERRIDE_DECISIONS,
        "Decisions by the kind of match of the override that applied (source) and what it set (effect)"
    );
    describe_counter!(
        DENIAL_CACHE_INVALIDATIONS,
        "Denial cache invalidations received (refunds, reports and resets on any instance)"
    );
    describe_gauge!(DENIAL_CACHE_ENTRIES, "Denials cached by this instance");
    describe_counter!(
        LEASES,
        "Lease events by policy: granted, denied, renewed, released, expired (a holder died or \
         forgot; each expiry counted once over all instances), fail_open (answered without any \
         store)"
    );
    describe_gauge!(
        LEASES_IN_USE,
        "Live leases of the policy in the store, over all instances (every instance reports the \
         same number: aggregate with max)"
    );
    describe_counter!(
        LEASE_UNDOS,
        "Lease calls undone on the shared store after it failed on them, by outcome: queued, \
         undone (a lease was held, and released), absent (nothing was held), dropped (queue \
         full), abandoned (the lease would have expired anyway)"
    );
    describe_gauge!(LEASE_UNDOS_WAITING, "Lease undos waiting for the store");
    describe_gauge!(
        LEASE_SWEEP_LEDGERS,
        "Concurrency policies' ledgers the latest lease sweep visited (those that may hold leases)"
    );
    describe_counter!(
        SHADOW_DENIED,
        "Acquires a shadow-mode policy allowed that enforcement would have denied"
    );
    describe_counter!(
        SHADOW_DENIED_UNITS,
        "Units asked by acquires a shadow-mode policy allowed that enforcement would have denied"
    );
}
