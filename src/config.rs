//! Settings, layered: defaults in code < a TOML file (`--config PATH` or `RATELIMITER_CONFIG`)
//! < environment variables `RATELIMITER__<SECTION>__<KEY>` (for example
//! `RATELIMITER__REDIS__URL`).
//!
//! Loading validates everything, policies included, and names the bad key in its error, so a
//! service with a bad configuration never starts.
//!
//! Environment values are taken as written: a string setting such as `redis.key_prefix=007`
//! stays `007`, and numbers are parsed only where a number is expected. The list settings
//! ([`is_list_key`]) are split on commas. No error built here quotes a value, since the value
//! may be a token or a password.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::policy::{parse_policy, Policy};
use crate::store::connection::ConnectionMode;

/// Why the configuration was refused. Neither variant ever holds a configured value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The sources could not be read or do not fit the settings' shape.
    #[error("configuration: {0}")]
    Load(String),
    #[error("configuration: `{key}` {reason}")]
    Invalid { key: String, reason: String },
}

impl From<config::ConfigError> for ConfigError {
    fn from(e: config::ConfigError) -> Self {
        ConfigError::Load(describe(&e))
    }
}

/// What went wrong, without the value that was refused (it may be a secret).
fn describe(e: &config::ConfigError) -> String {
    use config::ConfigError as E;
    match e {
        E::Type {
            unexpected,
            expected,
            key,
            ..
        } => {
            let found = kind_of(unexpected);
            match key {
                Some(key) => format!("`{key}` must be {expected}, not {found}"),
                None => format!("expected {expected}, not {found}"),
            }
        }
        E::At { error, key, .. } => match (error.as_ref(), key) {
            (E::Type { key: None, .. } | E::Message(_), Some(key)) => {
                format!("`{key}`: {}", describe(error))
            }
            _ => describe(error),
        },
        E::FileParse { uri, cause } => {
            // A parser's message quotes the offending line (`12 | token = ...`): keep only the
            // lines that say where and what.
            let cause = cause.to_string();
            let said: Vec<&str> = cause
                .lines()
                .filter(|l| !l.contains('|') && !l.trim().is_empty())
                .collect();
            let file = uri.as_deref().unwrap_or("the configuration file");
            format!("cannot parse {file}: {}", said.join("; "))
        }
        E::Message(m) => unquote(m),
        other => unquote(&other.to_string()),
    }
}

/// The kind of a refused value, never the value. The config crate does not export its
/// `Unexpected`, so the kind is read from the start of its description.
fn kind_of(unexpected: &impl fmt::Display) -> &'static str {
    let described = unexpected.to_string();
    [
        ("boolean", "a boolean"),
        ("string", "a string"),
        ("floating", "a number"),
        ("unit", "empty"),
        ("sequence", "a list"),
        ("map", "a table"),
    ]
    .into_iter()
    .find(|(prefix, _)| described.starts_with(prefix))
    .map_or("an integer", |(_, kind)| kind)
}

/// A message with anything it quotes (`"…"`, where serde puts values) blanked out.
fn unquote(m: &str) -> String {
    // The config crate names a refused choice after this phrase, serde in backticks
    // (`unknown variant `x`, expected …`).
    if let Some((before, _)) = m.split_once("does not have variant constructor") {
        return format!("{before}does not have that variant");
    }
    if let Some(rest) = m.strip_prefix("unknown variant `") {
        let choices = rest.split_once('`').map_or("", |(_, after)| after);
        return format!("unknown variant …{choices}");
    }
    let mut out = String::with_capacity(m.len());
    for (i, part) in m.split('"').enumerate() {
        out.push_str(if i % 2 == 1 { "…" } else { part });
        out.push('"');
    }
    out.pop();
    out
}

/// Keys whose environment variable is a comma-separated list: every `…_tokens` setting and
/// `redis.cluster_nodes`.
pub fn is_list_key(key: &str) -> bool {
    key.ends_with("_tokens") || key == "redis.cluster_nodes" || key == "server.trusted_proxies"
}

/// The `RATELIMITER__SECTION__KEY` variables as `(section.key, value)`, values as written.
///
/// The config crate's own environment source either parses every value that looks like a
/// number or a boolean (so `007` became `7` and `1e3` became `1000`, and a token `123` was
/// refused for not being a string) or splits no lists at all; this keeps strings as strings and
/// leaves it to each setting's type to parse its number.
fn environment(env: impl IntoIterator<Item = (String, String)>) -> Vec<(String, config::Value)> {
    const PREFIX: &str = "RATELIMITER__";
    env.into_iter()
        .filter_map(|(k, v)| {
            let key = k.strip_prefix(PREFIX)?.to_lowercase().replace("__", ".");
            let value = if is_list_key(&key) {
                config::Value::from(v.split(',').map(str::to_owned).collect::<Vec<_>>())
            } else {
                config::Value::from(v)
            };
            Some((key, value))
        })
        .collect()
}

/// A token list (`auth.admin_tokens`, `auth.client_tokens`, any other) as it will be compared:
/// surrounding whitespace trimmed, since a token sent in a header never carries any. A token
/// that is empty, or holds whitespace or control characters inside, could never match: refused,
/// naming the setting and the position, never the token.
pub fn token_list(key: &str, tokens: Vec<Secret>) -> Result<Vec<Secret>, ConfigError> {
    tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let trimmed = t.expose().trim();
            if trimmed.is_empty() {
                Err(ConfigError::Invalid {
                    key: key.to_owned(),
                    reason: format!("must not hold an empty token (entry {})", i + 1),
                })
            } else if trimmed.chars().any(|c| c.is_whitespace() || c.is_control()) {
                Err(ConfigError::Invalid {
                    key: key.to_owned(),
                    reason: format!(
                        "entry {} holds a space or a control character, which a bearer token \
                         cannot carry",
                        i + 1
                    ),
                })
            } else {
                Ok(Secret(trimmed.to_owned()))
            }
        })
        .collect()
}

/// A secret that never prints.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// Address to listen on.
    pub bind: SocketAddr,
    /// HTTP worker threads; 0 means one per core.
    pub workers: usize,
    /// Open connections per worker beyond which new ones wait to be accepted; lowered at
    /// start-up so that every worker's connections fit in the process's file limit.
    pub max_connections: usize,
    /// Time a client has to send a request's headers; slower clients are answered 408.
    pub client_request_timeout_ms: u64,
    /// Time a client has to send a request's body once its headers have arrived; a body still
    /// unfinished then is answered 408 and its connection closed.
    pub request_timeout_ms: u64,
    /// Proxies (addresses or CIDR networks) whose `X-Forwarded-For` / `Forwarded` header names
    /// the client in the logs; from any other peer the logs show the peer's own address.
    #[serde(default)]
    pub trusted_proxies: Vec<ProxyNet>,
    /// How long an idle keep-alive connection is kept open.
    pub keep_alive_s: u64,
    /// On SIGTERM or SIGINT, how long in-flight requests may take to finish.
    pub shutdown_timeout_s: u64,
    /// PEM certificate chain to serve HTTPS with (see docs/tls.md); plain HTTP when unset.
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file`.
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA certificates; when set, HTTPS clients must present a certificate signed by one.
    #[serde(default)]
    pub tls_client_ca_file: Option<PathBuf>,
}

/// Envoy's rate-limit service over gRPC (see `grpc`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GrpcSettings {
    /// Address to serve `envoy.service.ratelimit.v3.RateLimitService` on (plaintext HTTP/2);
    /// not served when unset.
    pub bind: Option<SocketAddr>,
    /// Most gRPC connections open at once; lowered at start-up to fit the open-file limit
    /// beside the HTTP connections. At the cap, the oldest connection that has not finished its
    /// HTTP/2 handshake is closed to make room; without one, new connections wait in the
    /// listen queue.
    pub max_connections: usize,
    /// Time a new connection has to send the HTTP/2 preface and its first SETTINGS frame.
    pub handshake_timeout_ms: u64,
    /// Deadline of one call, from its headers to its answer, its request's body included
    /// (a shorter `grpc-timeout` from the client wins).
    pub call_timeout_ms: u64,
    /// Streams (calls) one connection may have open at once (`SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub max_concurrent_streams: u32,
    /// Streams a client may open and reset before they are served, per connection, before the
    /// connection is closed.
    pub max_pending_resets: usize,
    /// A connection that sent nothing for this long is pinged (HTTP/2 PING).
    pub keepalive_interval_ms: u64,
    /// A ping not answered within this is the end of its connection.
    pub keepalive_timeout_ms: u64,
    /// PEM certificate chain to serve gRPC over TLS with (see docs/tls.md); plaintext when unset.
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file`.
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA certificates; when set, gRPC clients must present a certificate signed by one.
    pub tls_client_ca_file: Option<PathBuf>,
}

impl Default for GrpcSettings {
    fn default() -> Self {
        Self {
            bind: None,
            max_connections: 1_024,
            handshake_timeout_ms: 5_000,
            call_timeout_ms: 1_000,
            max_concurrent_streams: 200,
            max_pending_resets: 20,
            keepalive_interval_ms: 30_000,
            keepalive_timeout_ms: 10_000,
            tls_cert_file: None,
            tls_key_file: None,
            tls_client_ca_file: None,
        }
    }
}

impl GrpcSettings {
    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.handshake_timeout_ms)
    }

    pub fn call_timeout(&self) -> Duration {
        Duration::from_millis(self.call_timeout_ms)
    }

    pub fn keepalive_interval(&self) -> Duration {
        Duration::from_millis(self.keepalive_interval_ms)
    }

    pub fn keepalive_timeout(&self) -> Duration {
        Duration::from_millis(self.keepalive_timeout_ms)
    }

    /// The first setting that is out of its bounds, and why.
    fn invalid(&self) -> Option<(&'static str, &'static str)> {
        const DAY_MS: u64 = 86_400_000;
        let durations = [
            ("grpc.handshake_timeout_ms", self.handshake_timeout_ms),
            ("grpc.call_timeout_ms", self.call_timeout_ms),
            ("grpc.keepalive_interval_ms", self.keepalive_interval_ms),
            ("grpc.keepalive_timeout_ms", self.keepalive_timeout_ms),
        ];
        if let Some((key, _)) = durations.iter().find(|(_, ms)| !(1..=DAY_MS).contains(ms)) {
            return Some((key, "must be from 1 to 86400000 (one day)"));
        }
        if self.max_connections == 0 {
            return Some(("grpc.max_connections", "must be at least 1"));
        }
        if !(1..=10_000).contains(&self.max_concurrent_streams) {
            return Some(("grpc.max_concurrent_streams", "must be from 1 to 10000"));
        }
        if !(1..=10_000).contains(&self.max_pending_resets) {
            return Some(("grpc.max_pending_resets", "must be from 1 to 10000"));
        }
        None
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// `redis://[:password@]host:port[/db]`; unset runs the embedded in-process store.
    pub url: Option<Secret>,
    /// Seed nodes (`[user:password@]host:port`) of a Redis Cluster, instead of `url`. Secret,
    /// since they may carry the cluster's password; printed only through `redact_url`.
    #[serde(default)]
    pub cluster_nodes: Vec<Secret>,
    /// `multiplexed` (one shared connection per HTTP worker thread) or `pool` (`pool_size`
    /// shared connections with their own I/O thread).
    pub connection_mode: ConnectionMode,
    /// Connections shared by every call in `pool` mode (multiplexed mode has one per worker
    /// thread).
    pub pool_size: u32,
    /// The most one-limit decisions one script call carries (`store::batch`); 1 sends each
    /// alone.
    pub batch_max: usize,
    /// Deadline of every Redis call, connection checkout included.
    pub timeout_ms: u64,
    /// First part of every key the service writes.
    pub key_prefix: String,
    /// How often each instance checks for policy changes made by others.
    pub policy_refresh_ms: u64,
    /// Consecutive failed Redis calls that open the circuit breaker.
    pub breaker_failures: u32,
    /// How long an open breaker answers by fail mode before letting one call probe Redis.
    pub breaker_cooldown_ms: u64,
    /// PEM CA bundle that verifies the server (`rediss://`); unset: the system's roots.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate chain, for Redis that asks for one (mutual TLS).
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file`.
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
    /// The name the server's certificate must carry, instead of the address's host.
    #[serde(default)]
    pub tls_server_name: Option<String>,
    /// Whether the cluster seeds are `rediss://` (they are kept without the scheme).
    #[serde(skip)]
    pub cluster_tls: bool,
    /// The TLS client, built from `tls_*` at validation when Redis is reached over TLS.
    #[serde(skip)]
    pub tls: Option<Arc<crate::store::redis::tls::Tls>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    /// Bearer tokens for the policy API (reads and writes); empty leaves it open.
    #[serde(default)]
    pub admin_tokens: Vec<Secret>,
    /// Bearer tokens for `POST /v1/acquire`; empty leaves it open.
    #[serde(default)]
    pub client_tokens: Vec<Secret>,
    /// Bearer tokens for `GET /metrics`; empty leaves it open.
    #[serde(default)]
    pub metrics_tokens: Vec<Secret>,
    /// Bearer tokens that may settle (`POST /v1/report`, `/v1/refund`) as well as decide: when
    /// set, client tokens may only decide (acquire, peek, leases), and `POST /v1/reset` takes a
    /// settle token when no admin token is set. Empty: client tokens settle too, as before.
    #[serde(default)]
    pub settle_tokens: Vec<Secret>,
}

/// An address or a CIDR network (`10.0.0.7`, `10.0.0.0/8`, `fd00::/8`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct ProxyNet(ipnet::IpNet);

impl ProxyNet {
    pub fn contains(&self, ip: &IpAddr) -> bool {
        self.0.contains(ip)
    }
}

impl TryFrom<String> for ProxyNet {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        let text = text.trim();
        if let Ok(net) = text.parse::<ipnet::IpNet>() {
            return Ok(Self(net.trunc()));
        }
        text.parse::<IpAddr>()
            .map(|ip| Self(ipnet::IpNet::from(ip)))
            // The text is not repeated: a misplaced secret must not reach an error.
            .map_err(|_| "an entry is neither an IP address nor a CIDR network".to_owned())
    }
}

/// Bounds on what the service keeps.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSettings {
    /// The most policies the store may hold; creating one more is refused.
    pub max_policies: u64,
    /// The most overrides of exact keys one policy may have; creating one more is refused
    /// (409).
    pub max_exact_overrides: u64,
    /// The most prefix and range overrides, together, one policy may have (what a lookup may
    /// search); creating one more is refused (409).
    pub max_pattern_overrides: u64,
    /// The most subjects the embedded store keeps state for (about 216 bytes each): the main one
    /// without Redis, and the one `local` fail mode decides with. At the cap, expired state is
    /// freed first; if none has expired, a subject without state gets none and its acquire is
    /// answered by the policy's fail mode (`open` and `local` allow it, degraded; `closed`
    /// answers 503), while subjects with state keep deciding exactly.
    pub max_embedded_subjects: u64,
    /// Puts every policy in shadow mode, whatever its own `mode`: acquires are decided and
    /// counted exactly, and answered as allowed with what enforcement would have answered. For
    /// rolling the service itself out in front of traffic. Off by default.
    pub shadow: bool,
    /// Answers repeated acquires of a subject that Redis denied, until its retry time, without
    /// asking Redis (see `service::denials`). On by default; only with Redis.
    pub denial_cache: bool,
    /// The longest a cached denial is answered without Redis, in ms (1 to 60,000): the bound on
    /// a denial answered after an invalidation message was lost.
    pub denial_cache_ms: u64,
    /// The most cached denials (at least 1), about 100 bytes each plus the key.
    pub denial_cache_entries: u64,
    /// Accepts `POST /v1/refund` without a `ticket` (and Envoy's `is_negative_hits`), which gives
    /// units back to whatever the subject has in use: any caller allowed to refund can then keep
    /// any subject under its limit. Off by default: a refund names the ticket of its take.
    pub ticketless_refunds: bool,
    /// The most lease calls waiting to be undone on Redis (`service::undo`: takes whose outcome
    /// is unknown, releases answered by fail mode), about 300 bytes each; when full, a new one
    /// is dropped (counted) and its lease is held until its expiry. 0 undoes nothing.
    pub lease_undo_queue: usize,
    /// The most concurrency policies' ledgers the lease sweep visits per second and instance
    /// (at least 1): those the lease index holds, in turn when there are more.
    pub lease_sweep_budget: usize,
}

impl LimitsSettings {
    /// `limits.denial_cache_ms` as a duration.
    pub fn denial_cache_bound(&self) -> Duration {
        Duration::from_millis(self.denial_cache_ms)
    }
}

/// The top offenders (`GET /v1/policies/{name}/top`, see `service::top`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopSettings {
    /// The subjects each summary tracks (per policy, dimension and minute): 0 turns top
    /// offenders off, otherwise 16 to 256. Each count is within `total / subjects` of the
    /// truth per summary; 128 keeps Redis's sorted sets in their compact encoding
    /// (`zset-max-listpack-entries` is 128 by default). At most 256: a fold's script time in
    /// Redis grows with it (`bench/top_cost.py`: at 1,024 one fold of a flood held Redis for tens
    /// of milliseconds).
    pub subjects: usize,
    /// How often an instance folds what it counted into Redis, in ms (10 to 60,000): what
    /// `top` lags behind by.
    pub fold_ms: u64,
    /// Shows keys as salted hashes (`hmac:` and 32 hex digits of HMAC-SHA-256) in `top`'s
    /// answers.
    pub hash_keys: bool,
    /// The salt of the hashes: the same on every instance so that a subject hashes alike on
    /// each; without it each process draws its own at start-up.
    pub salt: Option<Secret>,
}

impl Default for TopSettings {
    fn default() -> Self {
        Self {
            subjects: 128,
            fold_ms: 1_000,
            hash_keys: false,
            salt: None,
        }
    }
}

impl TopSettings {
    /// `top.fold_ms` as a duration.
    pub fn fold_every(&self) -> Duration {
        Duration::from_millis(self.fold_ms)
    }

    fn invalid(&self) -> Option<(&'static str, &'static str)> {
        if self.subjects != 0 && !(16..=256).contains(&self.subjects) {
            return Some(("top.subjects", "must be 0 (off) or from 16 to 256"));
        }
        if !(10..=60_000).contains(&self.fold_ms) {
            return Some(("top.fold_ms", "must be from 10 to 60000"));
        }
        if self.salt.as_ref().is_some_and(|s| s.expose().len() < 16) {
            return Some(("top.salt", "must be at least 16 bytes"));
        }
        None
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    pub format: LogFormat,
}

/// `log.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// OpenTelemetry traces over OTLP/HTTP protobuf (see `trace`). Off unless an endpoint is
/// configured here or by the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` /
/// `OTEL_EXPORTER_OTLP_ENDPOINT`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TracingSettings {
    /// Where to send traces, `http://host:port` (`/v1/traces` is appended to a URL without a
    /// path) or a full URL. Wins over the `OTEL_EXPORTER_OTLP_*` variables. Plain HTTP only: no
    /// TLS client is built in (send to a collector beside the service).
    pub otlp_endpoint: Option<String>,
    /// Share of root traces (requests without a sampled `traceparent`) that are recorded, from
    /// 0 to 1; a request with a `traceparent` follows its caller's sampling decision.
    pub sample_ratio: f64,
    /// Records the subject key (`ratelimit.key`) on the spans. Off: keys can be personal data.
    pub record_key: bool,
    /// The most finished spans waiting to be exported; a span finished when it is full is
    /// dropped and counted in `ratelimiter_trace_spans_dropped_total`.
    pub queue_size: usize,
    /// Deadline of one export call to the endpoint.
    pub export_timeout_ms: u64,
    /// At shutdown, how long the spans still queued may take to be sent.
    pub shutdown_timeout_ms: u64,
    /// The endpoint in force, from the setting or the environment (filled by loading).
    #[serde(skip)]
    pub endpoint: Option<String>,
    /// `OTEL_SERVICE_NAME`, default `ratelimiter` (filled by loading).
    #[serde(skip)]
    pub service_name: String,
}

impl Default for TracingSettings {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            sample_ratio: 1.0,
            record_key: false,
            queue_size: 2_048,
            export_timeout_ms: 5_000,
            shutdown_timeout_ms: 5_000,
            endpoint: None,
            service_name: "ratelimiter".to_owned(),
        }
    }
}

impl TracingSettings {
    pub fn export_timeout(&self) -> Duration {
        Duration::from_millis(self.export_timeout_ms)
    }

    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_millis(self.shutdown_timeout_ms)
    }

    /// Fills [`TracingSettings::endpoint`] and [`TracingSettings::service_name`] from the
    /// setting and the `OTEL_*` variables in `env`, and checks the bounds. The project's own
    /// setting wins, then the per-signal variable (taken as written, as the OpenTelemetry
    /// specification says), then the general one (with `/v1/traces` appended).
    fn resolve(&mut self, env: &[(String, String)]) -> Result<(), (&'static str, &'static str)> {
        let var = |name: &str| {
            env.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let (key, endpoint) = match self.otlp_endpoint.as_deref().map(str::trim) {
            Some(e) if !e.is_empty() => ("tracing.otlp_endpoint", Some(with_traces_path(e, false))),
            _ => match var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
                Some(e) => ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", Some(e)),
                None => (
                    "OTEL_EXPORTER_OTLP_ENDPOINT",
                    var("OTEL_EXPORTER_OTLP_ENDPOINT").map(|e| with_traces_path(&e, true)),
                ),
            },
        };
        if let Some(e) = &endpoint {
            if e.starts_with("https://") {
                return Err((
                    key,
                    "is https, and no TLS client is built in: send to a collector over http",
                ));
            }
            let rest = e.strip_prefix("http://").unwrap_or("");
            if rest.is_empty() || rest.starts_with('/') {
                return Err((key, "must be an http://host:port URL"));
            }
        }
        self.endpoint = endpoint;
        if let Some(name) = var("OTEL_SERVICE_NAME") {
            self.service_name = name;
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err(("tracing.sample_ratio", "must be from 0 to 1"));
        }
        if !(1..=1_000_000).contains(&self.queue_size) {
            return Err(("tracing.queue_size", "must be from 1 to 1000000"));
        }
        for (key, ms) in [
            ("tracing.export_timeout_ms", self.export_timeout_ms),
            ("tracing.shutdown_timeout_ms", self.shutdown_timeout_ms),
        ] {
            if !(1..=60_000).contains(&ms) {
                return Err((key, "must be from 1 to 60000"));
            }
        }
        Ok(())
    }
}

/// `url` with the OTLP traces path: always appended for `OTEL_EXPORTER_OTLP_ENDPOINT`
/// (`always`), else only when the URL has no path of its own.
fn with_traces_path(url: &str, always: bool) -> String {
    let base = url.trim_end_matches('/');
    let has_path = base
        .split_once("://")
        .is_some_and(|(_, rest)| rest.contains('/'));
    if always || !has_path {
        format!("{base}/v1/traces")
    } else {
        url.to_owned()
    }
}

/// Everything the service is configured with.
#[derive(Debug, Clone)]
pub struct Settings {
    pub server: ServerSettings,
    pub grpc: GrpcSettings,
    pub redis: RedisSettings,
    pub auth: AuthSettings,
    pub limits: LimitsSettings,
    pub top: TopSettings,
    pub log: LogSettings,
    pub tracing: TracingSettings,
    /// Created at start-up when absent; never overwrite a policy changed through the API.
    pub policies: Vec<Policy>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSettings {
    server: ServerSettings,
    #[serde(default)]
    grpc: GrpcSettings,
    redis: RedisSettings,
    #[serde(default)]
    auth: AuthSettings,
    limits: LimitsSettings,
    #[serde(default)]
    top: TopSettings,
    log: LogSettings,
    #[serde(default)]
    tracing: TracingSettings,
    #[serde(default)]
    policies: Vec<serde_json::Value>,
}

impl Settings {
    /// Loads defaults, then the file (when given), then `RATELIMITER__…` variables.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_from(file, std::env::vars())
    }

    /// Like [`Settings::load`], with the environment given explicitly (for tests).
    pub fn load_from(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let env: Vec<(String, String)> = env.into_iter().collect();
        let mut builder = config::Config::builder()
            .set_default("server.bind", "127.0.0.1:8080")?
            .set_default("server.workers", 0)?
            .set_default("server.max_connections", 4_096)?
            .set_default("server.client_request_timeout_ms", 5_000)?
            .set_default("server.request_timeout_ms", 10_000)?
            .set_default("server.keep_alive_s", 5)?
            .set_default("server.shutdown_timeout_s", 10)?
            .set_default("redis.connection_mode", "multiplexed")?
            .set_default("redis.pool_size", 16)?
            .set_default(
                "redis.batch_max",
                crate::store::batch::DEFAULT_BATCH_MAX as u64,
            )?
            .set_default("redis.timeout_ms", 100)?
            .set_default("redis.key_prefix", "rl")?
            .set_default("redis.policy_refresh_ms", 250)?
            .set_default("redis.breaker_failures", 5)?
            .set_default("redis.breaker_cooldown_ms", 1_000)?
            .set_default("limits.max_policies", 50_000)?
            .set_default("limits.max_exact_overrides", 100_000)?
            .set_default("limits.max_pattern_overrides", 1_000)?
            .set_default("limits.max_embedded_subjects", 1_000_000)?
            .set_default("limits.shadow", false)?
            .set_default("limits.denial_cache", true)?
            .set_default("limits.denial_cache_ms", 1_000)?
            .set_default("limits.denial_cache_entries", 100_000)?
            .set_default("limits.ticketless_refunds", false)?
            .set_default("limits.lease_undo_queue", 10_000)?
            .set_default("limits.lease_sweep_budget", 1_000)?
            .set_default("log.format", "text")?;
        if let Some(path) = file {
            builder = builder.add_source(config::File::from(path).required(true));
        }
        for (key, value) in environment(env.iter().cloned()) {
            builder = builder.set_override(key, value)?;
        }
        let mut raw: RawSettings = builder.build()?.try_deserialize()?;
        raw.tracing
            .resolve(&env)
            .map_err(|(key, reason)| ConfigError::Invalid {
                key: key.to_owned(),
                reason: reason.to_owned(),
            })?;
        raw.validate()
    }
}

impl RawSettings {
    fn validate(mut self) -> Result<Settings, ConfigError> {
        let invalid = |key: &str, reason: &str| ConfigError::Invalid {
            key: key.to_owned(),
            reason: reason.to_owned(),
        };
        if self.redis.pool_size == 0 {
            return Err(invalid("redis.pool_size", "must be at least 1"));
        }
        if !(1..=1_000).contains(&self.redis.batch_max) {
            return Err(invalid("redis.batch_max", "must be between 1 and 1000"));
        }
        if self.redis.timeout_ms == 0 {
            return Err(invalid("redis.timeout_ms", "must be at least 1"));
        }
        if self.redis.breaker_failures == 0 {
            return Err(invalid("redis.breaker_failures", "must be at least 1"));
        }
        // actix-server panics on more than 512 workers: refuse them here, naming the setting.
        if self.server.workers > 512 {
            return Err(invalid(
                "server.workers",
                "must be from 0 (one per core) to 512",
            ));
        }
        // A keep-alive far in the future overflows the deadline actix computes for every idle
        // connection (each request's worker thread panicked at about 9.2e18 s): a day is plenty.
        if self.server.keep_alive_s > 86_400 {
            return Err(invalid(
                "server.keep_alive_s",
                "must be at most 86400 (one day)",
            ));
        }
        // Durations an operator would never want that end in arithmetic on instants (a deadline,
        // the breaker's reopening time) past what the clock types hold, and a queue whose bound
        // is no bound: each is refused at start-up rather than met at run time.
        if self.server.shutdown_timeout_s > 3_600 {
            return Err(invalid(
                "server.shutdown_timeout_s",
                "must be at most 3600 (one hour)",
            ));
        }
        if self.redis.breaker_cooldown_ms > 3_600_000 {
            return Err(invalid(
                "redis.breaker_cooldown_ms",
                "must be at most 3600000 (one hour)",
            ));
        }
        if self.limits.lease_undo_queue > 1_000_000 {
            return Err(invalid(
                "limits.lease_undo_queue",
                "must be at most 1000000",
            ));
        }
        if self.server.max_connections == 0 {
            return Err(invalid("server.max_connections", "must be at least 1"));
        }
        if self.server.client_request_timeout_ms == 0 {
            return Err(invalid(
                "server.client_request_timeout_ms",
                "must be at least 1",
            ));
        }
        if self.server.request_timeout_ms == 0 {
            return Err(invalid("server.request_timeout_ms", "must be at least 1"));
        }
        for (key, tokens) in [
            ("auth.admin_tokens", &mut self.auth.admin_tokens),
            ("auth.client_tokens", &mut self.auth.client_tokens),
            ("auth.metrics_tokens", &mut self.auth.metrics_tokens),
            ("auth.settle_tokens", &mut self.auth.settle_tokens),
        ] {
            *tokens = token_list(key, std::mem::take(tokens))?;
        }
        if self.limits.max_policies == 0 {
            return Err(invalid("limits.max_policies", "must be at least 1"));
        }
        // Bounded so that a policy's deletion, which deletes its overrides in the same atomic
        // step, stays a step of a second or less on Redis.
        for (key, n) in [
            (
                "limits.max_exact_overrides",
                self.limits.max_exact_overrides,
            ),
            (
                "limits.max_pattern_overrides",
                self.limits.max_pattern_overrides,
            ),
        ] {
            if n > 1_000_000 {
                return Err(invalid(key, "must be at most 1000000"));
            }
        }
        if self.limits.max_embedded_subjects == 0 {
            return Err(invalid(
                "limits.max_embedded_subjects",
                "must be at least 1",
            ));
        }
        if !(1..=60_000).contains(&self.limits.denial_cache_ms) {
            return Err(invalid("limits.denial_cache_ms", "must be from 1 to 60000"));
        }
        if self.limits.denial_cache_entries == 0 {
            return Err(invalid(
                "limits.denial_cache_entries",
                "must be at least 1 (turn the cache off with limits.denial_cache = false)",
            ));
        }
        if self.limits.lease_sweep_budget == 0 {
            return Err(invalid("limits.lease_sweep_budget", "must be at least 1"));
        }
        if self.redis.policy_refresh_ms == 0 {
            return Err(invalid("redis.policy_refresh_ms", "must be at least 1"));
        }
        let prefix = &self.redis.key_prefix;
        if prefix.is_empty() || prefix.contains(['{', '}']) {
            return Err(invalid(
                "redis.key_prefix",
                "must be non-empty and hold no `{` or `}`",
            ));
        }
        if !self.redis.cluster_nodes.is_empty() && self.redis.url.is_some() {
            return Err(invalid(
                "redis.cluster_nodes",
                "cannot be set together with redis.url: set one of them",
            ));
        }
        let seeds_tls = self
            .redis
            .cluster_nodes
            .iter()
            .filter(|n| n.expose().trim().starts_with("rediss://"))
            .count();
        if seeds_tls != 0 && seeds_tls != self.redis.cluster_nodes.len() {
            return Err(invalid(
                "redis.cluster_nodes",
                "every seed must be rediss:// or none: the Cluster is reached one way",
            ));
        }
        self.redis.cluster_tls = seeds_tls != 0;
        for node in &mut self.redis.cluster_nodes {
            let trimmed = node.expose().trim();
            let trimmed = trimmed
                .strip_prefix("rediss://")
                .or_else(|| trimmed.strip_prefix("redis://"))
                .unwrap_or(trimmed);
            // Credentials, when given, come before the last `@`; never echoed.
            let address = trimmed.rsplit_once('@').map_or(trimmed, |(_, a)| a);
            let ok = address
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !ok {
                return Err(invalid(
                    "redis.cluster_nodes",
                    "must be [user:password@]host:port seeds",
                ));
            }
            *node = Secret(trimmed.to_owned());
        }
        if let Some(url) = &self.redis.url {
            if !(url.expose().starts_with("redis://") || url.expose().starts_with("rediss://")) {
                return Err(invalid(
                    "redis.url",
                    "must start with redis:// or rediss://",
                ));
            }
        }
        let r = &self.redis;
        let uses_tls = r.cluster_tls
            || r.url
                .as_ref()
                .is_some_and(|u| u.expose().starts_with("rediss://"));
        let options = crate::store::redis::tls::TlsOptions {
            ca_file: r.tls_ca_file.clone(),
            cert_file: r.tls_cert_file.clone(),
            key_file: r.tls_key_file.clone(),
            server_name: r.tls_server_name.clone().filter(|n| !n.is_empty()),
        };
        let files_set =
            options.ca_file.is_some() || options.cert_file.is_some() || options.key_file.is_some();
        // Files are checked even when unused, so that a mistake shows before TLS is turned on.
        self.redis.tls = if uses_tls || files_set {
            let tls =
                crate::store::redis::tls::Tls::new(&options).map_err(|e| ConfigError::Invalid {
                    key: e.setting.to_owned(),
                    reason: e.reason,
                })?;
            uses_tls.then(|| Arc::new(tls))
        } else {
            None
        };
        let mut policies: Vec<Policy> = Vec::with_capacity(self.policies.len());
        for (i, value) in self.policies.iter().enumerate() {
            let at = format!("policies[{i}]");
            let policy = parse_policy(value, None).map_err(|e| {
                let e = e.within(&at);
                ConfigError::Invalid {
                    key: e.field().unwrap_or(&at).to_owned(),
                    reason: e.to_string(),
                }
            })?;
            if policies.iter().any(|p| p.name == policy.name) {
                return Err(invalid(
                    &format!("{at}.name"),
                    "repeats an earlier policy's name",
                ));
            }
            let shape = |p: &Policy| p.descriptor().map(|d| d.shape());
            if shape(&policy).is_some() && policies.iter().any(|p| shape(p) == shape(&policy)) {
                return Err(invalid(
                    &format!("{at}.descriptor"),
                    "serves the same descriptor shape, in the same domain, as an earlier policy",
                ));
            }
            policies.push(policy);
        }
        if let Some((key, reason)) = self.top.invalid() {
            return Err(invalid(key, reason));
        }
        if let Some((key, reason)) = self.grpc.invalid() {
            return Err(invalid(key, reason));
        }
        for (section, cert, key, ca) in [
            (
                "server",
                &self.server.tls_cert_file,
                &self.server.tls_key_file,
                &self.server.tls_client_ca_file,
            ),
            (
                "grpc",
                &self.grpc.tls_cert_file,
                &self.grpc.tls_key_file,
                &self.grpc.tls_client_ca_file,
            ),
        ] {
            match (cert, key) {
                (Some(_), None) => {
                    return Err(invalid(
                        &format!("{section}.tls_key_file"),
                        &format!("must be set with {section}.tls_cert_file"),
                    ))
                }
                (None, Some(_)) => {
                    return Err(invalid(
                        &format!("{section}.tls_cert_file"),
                        &format!("must be set with {section}.tls_key_file"),
                    ))
                }
                (None, None) if ca.is_some() => {
                    return Err(invalid(
                        &format!("{section}.tls_client_ca_file"),
                        &format!("needs {section}.tls_cert_file and {section}.tls_key_file"),
                    ))
                }
                _ => {}
            }
        }
        if let Some(grpc) = self.grpc.bind {
            if grpc == self.server.bind && grpc.port() != 0 {
                return Err(invalid(
                    "grpc.bind",
                    "must differ from server.bind: the HTTP API and gRPC listen on ports of their own",
                ));
            }
        }
        Ok(Settings {
            server: self.server,
            grpc: self.grpc,
            redis: self.redis,
            auth: self.auth,
            limits: self.limits,
            top: self.top,
            log: self.log,
            tracing: self.tracing,
            policies,
        })
    }
}

impl ServerSettings {
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
}

impl RedisSettings {
    pub fn connection_mode(&self) -> ConnectionMode {
        self.connection_mode
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    pub fn breaker_cooldown(&self) -> Duration {
        Duration::from_millis(self.breaker_cooldown_ms)
    }

    pub fn policy_refresh(&self) -> Duration {
        Duration::from_millis(self.policy_refresh_ms)
    }

    /// How long the policy cache may go without being brought up to date before `/readyz`
    /// reports it stale: eight refresh intervals, and at least 2 s.
    pub fn policy_stale_after(&self) -> Duration {
        (self.policy_refresh() * 8).max(Duration::from_secs(2))
    }
}

#[cfg(test)]
mod reference;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A configuration file that removes itself.
    struct TempFile(std::path::PathBuf);

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn file(text: &str) -> TempFile {
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "ratelimiter-config-{}-{}.toml",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, text).expect("write temp config");
        TempFile(path)
    }

    #[test]
    fn defaults_serve_the_embedded_store_on_loopback() {
        let s = Settings::load_from(None, env(&[])).expect("defaults are valid");
        assert_eq!(s.server.bind.to_string(), "127.0.0.1:8080");
        assert!(s.redis.url.is_none());
        assert_eq!(s.redis.timeout_ms, 100);
        assert_eq!(s.redis.key_prefix, "rl");
    }

    #[test]
    fn a_refused_choice_or_network_is_not_repeated_in_the_error() {
        for var in [
            "RATELIMITER__REDIS__CONNECTION_MODE",
            "RATELIMITER__LOG__FORMAT",
            "RATELIMITER__SERVER__TRUSTED_PROXIES",
        ] {
            let e = Settings::load_from(None, env(&[(var, "pasted-s3cret")])).expect_err("refused");
            assert!(!e.to_string().contains("s3cret"), "{var}: {e}");
        }
    }

    #[test]
    fn enumerated_settings_are_typed_and_a_bad_one_names_its_key() {
        let s = Settings::load_from(
            None,
            env(&[
                ("RATELIMITER__REDIS__CONNECTION_MODE", "pool"),
                ("RATELIMITER__LOG__FORMAT", "json"),
            ]),
        )
        .expect("valid");
        assert_eq!(s.redis.connection_mode, ConnectionMode::Pool);
        assert_eq!(s.log.format, LogFormat::Json);
        for (key, var) in [
            ("connection_mode", "RATELIMITER__REDIS__CONNECTION_MODE"),
            ("format", "RATELIMITER__LOG__FORMAT"),
        ] {
            let e = Settings::load_from(None, env(&[(var, "bogus")])).expect_err("not a choice");
            assert!(e.to_string().contains(key), "{e}");
        }
    }

    #[test]
    fn tracing_is_off_without_an_endpoint_and_its_own_setting_wins() {
        let s = Settings::load_from(None, env(&[])).expect("valid");
        assert_eq!(s.tracing.endpoint, None);
        assert_eq!(s.tracing.service_name, "ratelimiter");
        assert!(!s.tracing.record_key);
        let general = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/");
        let signal = (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://traces:4318/in",
        );
        let own = ("RATELIMITER__TRACING__OTLP_ENDPOINT", "http://own:4318");
        let endpoint = |pairs: &[(&str, &str)]| {
            Settings::load_from(None, env(pairs))
                .expect("valid")
                .tracing
                .endpoint
        };
        assert_eq!(
            endpoint(&[general]).as_deref(),
            Some("http://collector:4318/v1/traces")
        );
        assert_eq!(
            endpoint(&[general, signal]).as_deref(),
            Some("http://traces:4318/in")
        );
        assert_eq!(
            endpoint(&[general, signal, own]).as_deref(),
            Some("http://own:4318/v1/traces")
        );
        assert_eq!(
            endpoint(&[("RATELIMITER__TRACING__OTLP_ENDPOINT", "http://own:1/x")]).as_deref(),
            Some("http://own:1/x")
        );
        let s = Settings::load_from(None, env(&[("OTEL_SERVICE_NAME", "edge-limiter")]))
            .expect("valid");
        assert_eq!(s.tracing.service_name, "edge-limiter");
    }

    #[test]
    fn bad_tracing_settings_name_their_key() {
        for (var, value, key) in [
            (
                "RATELIMITER__TRACING__SAMPLE_RATIO",
                "1.5",
                "tracing.sample_ratio",
            ),
            (
                "RATELIMITER__TRACING__QUEUE_SIZE",
                "0",
                "tracing.queue_size",
            ),
            (
                "RATELIMITER__TRACING__OTLP_ENDPOINT",
                "https://collector:4318",
                "tracing.otlp_endpoint",
            ),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "collector:4318",
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
        ] {
            let e = Settings::load_from(None, env(&[(var, value)])).expect_err("refused");
            assert!(e.to_string().contains(key), "{var}: {e}");
        }
    }

    #[test]
    fn environment_overrides_the_file() {
        let f = file("[redis]\ntimeout_ms = 250\npool_size = 4\n");
        let s = Settings::load_from(
            Some(&f.0),
            env(&[("RATELIMITER__REDIS__TIMEOUT_MS", "50"), ("OTHER", "x")]),
        )
        .expect("valid");
        assert_eq!((s.redis.timeout_ms, s.redis.pool_size), (50, 4));
    }

    #[test]
    fn a_bad_value_names_its_key() {
        let e = Settings::load_from(None, env(&[("RATELIMITER__REDIS__POOL_SIZE", "lots")]))
            .expect_err("not a number");
        assert!(e.to_string().contains("pool_size"), "{e}");
        let e = Settings::load_from(None, env(&[("RATELIMITER__SERVER__BIND", "nowhere")]))
            .expect_err("not an address");
        assert!(e.to_string().contains("server.bind"), "{e}");
    }

    #[test]
    fn policies_in_the_file_are_validated_with_their_position() {
        let f = file(
            "[[policies]]\nname = \"a\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow_ms = 1000\n\n\
             [[policies]]\nname = \"b\"\nalgorithm = \"token_bucket\"\ncapacity = 0\nrefill_tokens = 1\nrefill_period_ms = 1\n",
        );
        let e = Settings::load_from(Some(&f.0), env(&[])).expect_err("capacity 0");
        assert!(e.to_string().contains("policies[1].capacity"), "{e}");
    }

    #[test]
    fn policies_in_the_file_may_hold_several_limits() {
        let f = file(
            "[[policies]]\nname = \"exports\"\nlimits = [\n  { name = \"minute\", algorithm = \"gcra\", rate = 5, period_ms = 60000, burst = 5 },\n  \
             { name = \"day\", algorithm = \"fixed_window\", limit = 100, window_ms = 86400000 },\n]\n",
        );
        let s = Settings::load_from(Some(&f.0), env(&[])).expect("valid");
        assert_eq!(s.policies.len(), 1);
        assert_eq!(s.policies[0].rate().map(|r| r.limits().len()), Some(2));
        let f = file(
            "[[policies]]\nname = \"exports\"\nlimits = [\n  { name = \"minute\", algorithm = \"gcra\", rate = 5, period_ms = 60000, burst = 0 },\n]\n",
        );
        let e = Settings::load_from(Some(&f.0), env(&[])).expect_err("burst 0");
        assert!(e.to_string().contains("policies[0].limits[0].burst"), "{e}");
    }

    #[test]
    fn policies_in_the_file_may_serve_envoy_descriptors_each_shape_once() {
        let policy = |name: &str, domain: &str| {
            format!(
                "[[policies]]\nname = \"{name}\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow_ms = 1000\n\
                 descriptor = {{ domain = \"{domain}\", entries = [{{ key = \"remote_address\" }}] }}\n\n"
            )
        };
        let f = file(&(policy("a", "edge") + &policy("b", "other")));
        let s = Settings::load_from(
            Some(&f.0),
            env(&[("RATELIMITER__GRPC__BIND", "127.0.0.1:8081")]),
        )
        .expect("valid");
        let served = s.policies[1].descriptor().map(|d| d.domain.as_str());
        assert_eq!(served, Some("other"));
        assert_eq!(s.grpc.bind.map(|a| a.port()), Some(8081));
        let f = file(&(policy("a", "edge") + &policy("b", "edge")));
        let e = Settings::load_from(Some(&f.0), env(&[])).expect_err("the same shape twice");
        assert!(e.to_string().contains("policies[1].descriptor"), "{e}");
        let e = Settings::load_from(
            None,
            env(&[
                ("RATELIMITER__GRPC__BIND", "127.0.0.1:8080"),
                ("RATELIMITER__SERVER__BIND", "127.0.0.1:8080"),
            ]),
        )
        .expect_err("one port for both");
        assert!(e.to_string().contains("grpc.bind"), "{e}");
    }

    #[test]
    fn grpc_connection_and_stream_bounds_have_defaults_and_are_checked() {
        let s = Settings::load_from(None, env(&[])).expect("valid");
        assert_eq!(s.grpc.max_connections, 1_024);
        assert_eq!(s.grpc.max_concurrent_streams, 200);
        assert_eq!(s.grpc.call_timeout(), Duration::from_secs(1));
        let s = Settings::load_from(
            None,
            env(&[
                ("RATELIMITER__GRPC__MAX_CONCURRENT_STREAMS", "7"),
                ("RATELIMITER__GRPC__HANDSHAKE_TIMEOUT_MS", "250"),
            ]),
        )
        .expect("valid");
        assert_eq!(s.grpc.max_concurrent_streams, 7);
        assert_eq!(s.grpc.handshake_timeout(), Duration::from_millis(250));
        for (key, value) in [
            ("MAX_CONNECTIONS", "0"),
            ("HANDSHAKE_TIMEOUT_MS", "0"),
            ("CALL_TIMEOUT_MS", "0"),
            ("MAX_CONCURRENT_STREAMS", "0"),
            ("MAX_CONCURRENT_STREAMS", "10001"),
            ("MAX_PENDING_RESETS", "0"),
            ("KEEPALIVE_INTERVAL_MS", "0"),
            ("KEEPALIVE_TIMEOUT_MS", "86400001"),
        ] {
            let var = format!("RATELIMITER__GRPC__{key}");
            let e = Settings::load_from(None, env(&[(var.as_str(), value)]))
                .expect_err("out of bounds");
            let named = format!("grpc.{}", key.to_lowercase());
            assert!(e.to_string().contains(&named), "{key}={value}: {e}");
        }
    }

    #[test]
    fn token_lists_come_from_comma_separated_variables() {
        let s = Settings::load_from(
            None,
            env(&[
                ("RATELIMITER__AUTH__ADMIN_TOKENS", "one,two"),
                ("RATELIMITER__AUTH__CLIENT_TOKENS", "c"),
            ]),
        )
        .expect("valid");
        let admin: Vec<&str> = s.auth.admin_tokens.iter().map(Secret::expose).collect();
        assert_eq!(admin, ["one", "two"]);
        assert_eq!(s.auth.client_tokens.len(), 1);
        assert!(!format!("{s:?}").contains("two"));
    }

    #[test]
    fn cluster_seeds_come_from_a_comma_separated_variable() {
        let s = Settings::load_from(
            None,
            env(&[(
                "RATELIMITER__REDIS__CLUSTER_NODES",
                "10.0.0.1:7000,10.0.0.2:7001",
            )]),
        )
        .expect("valid");
        let nodes: Vec<&str> = s.redis.cluster_nodes.iter().map(Secret::expose).collect();
        assert_eq!(nodes, ["10.0.0.1:7000", "10.0.0.2:7001"]);
        let e = Settings::load_from(
            None,
            env(&[("RATELIMITER__REDIS__CLUSTER_NODES", "nohost")]),
        )
        .expect_err("not host:port");
        assert!(e.to_string().contains("redis.cluster_nodes"), "{e}");
    }

    #[test]
    fn trusted_proxies_are_addresses_or_networks() {
        let s = Settings::load_from(
            None,
            env(&[(
                "RATELIMITER__SERVER__TRUSTED_PROXIES",
                "10.0.0.7,192.168.0.0/16,fd00::/8",
            )]),
        )
        .expect("valid");
        let proxies = &s.server.trusted_proxies;
        let trusted = |ip: &str| proxies.iter().any(|p| p.contains(&ip.parse().expect("ip")));
        assert!(trusted("10.0.0.7") && trusted("192.168.3.4") && trusted("fd00::1"));
        assert!(!trusted("10.0.0.8") && !trusted("127.0.0.1"));
        let e = Settings::load_from(
            None,
            env(&[("RATELIMITER__SERVER__TRUSTED_PROXIES", "10.0.0.0/33")]),
        )
        .expect_err("not a network");
        assert!(e.to_string().contains("server.trusted_proxies"), "{e}");
        let none = Settings::load_from(None, env(&[])).expect("defaults");
        assert!(none.server.trusted_proxies.is_empty());
    }

    #[test]
    fn metrics_tokens_come_from_a_comma_separated_variable() {
        let s = Settings::load_from(None, env(&[("RATELIMITER__AUTH__METRICS_TOKENS", "m1,m2")]))
            .expect("valid");
        assert_eq!(s.auth.metrics_tokens.len(), 2);
        assert!(Settings::load_from(None, env(&[]))
            .expect("defaults")
            .auth
            .metrics_tokens
            .is_empty());
    }

    #[test]
    fn settings_past_their_bounds_are_refused_naming_their_key() {
        for (var, accepted, refused, key) in [
            (
                "RATELIMITER__SERVER__WORKERS",
                "512",
                "513",
                "server.workers",
            ),
            (
                "RATELIMITER__SERVER__KEEP_ALIVE_S",
                "86400",
                "9223372036854775807",
                "server.keep_alive_s",
            ),
            (
                "RATELIMITER__SERVER__SHUTDOWN_TIMEOUT_S",
                "3600",
                "3601",
                "server.shutdown_timeout_s",
            ),
            (
                "RATELIMITER__REDIS__BREAKER_COOLDOWN_MS",
                "3600000",
                "18446744073709551615",
                "redis.breaker_cooldown_ms",
            ),
            (
                "RATELIMITER__LIMITS__LEASE_UNDO_QUEUE",
                "1000000",
                "1000001",
                "limits.lease_undo_queue",
            ),
        ] {
            assert!(
                Settings::load_from(None, env(&[(var, accepted)])).is_ok(),
                "{var}"
            );
            let e = Settings::load_from(None, env(&[(var, refused)])).expect_err(refused);
            assert!(e.to_string().contains(key), "{e}");
        }
    }

    #[test]
    fn a_zero_request_timeout_is_refused() {
        let e = Settings::load_from(
            None,
            env(&[("RATELIMITER__SERVER__REQUEST_TIMEOUT_MS", "0")]),
        )
        .expect_err("zero");
        assert!(e.to_string().contains("server.request_timeout_ms"), "{e}");
    }

    #[test]
    fn string_settings_from_the_environment_stay_as_written() {
        let s = Settings::load_from(None, env(&[("RATELIMITER__REDIS__KEY_PREFIX", "007")]))
            .expect("valid");
        assert_eq!(s.redis.key_prefix, "007");
        let s = Settings::load_from(
            None,
            env(&[
                ("RATELIMITER__REDIS__KEY_PREFIX", "1e3"),
                ("RATELIMITER__REDIS__TIMEOUT_MS", "250"),
            ]),
        )
        .expect("valid");
        assert_eq!(
            (s.redis.key_prefix.as_str(), s.redis.timeout_ms),
            ("1e3", 250)
        );
    }

    #[test]
    fn tokens_that_look_like_numbers_or_booleans_are_tokens() {
        let s = Settings::load_from(
            None,
            env(&[
                ("RATELIMITER__AUTH__ADMIN_TOKENS", "007"),
                ("RATELIMITER__AUTH__CLIENT_TOKENS", "true,1e3,-5"),
            ]),
        )
        .expect("valid");
        let admin: Vec<&str> = s.auth.admin_tokens.iter().map(Secret::expose).collect();
        let client: Vec<&str> = s.auth.client_tokens.iter().map(Secret::expose).collect();
        assert_eq!(admin, ["007"]);
        assert_eq!(client, ["true", "1e3", "-5"]);
    }

    #[test]
    fn token_lists_are_trimmed_or_refused_without_quoting_the_token() {
        let s = Settings::load_from(
            None,
            env(&[("RATELIMITER__AUTH__ADMIN_TOKENS", " one , two\t")]),
        )
        .expect("valid");
        let admin: Vec<&str> = s.auth.admin_tokens.iter().map(Secret::expose).collect();
        assert_eq!(admin, ["one", "two"]);
        let f = file("[auth]\nclient_tokens = [\"  padded-tok  \"]\n");
        let s = Settings::load_from(Some(&f.0), env(&[])).expect("valid");
        assert_eq!(s.auth.client_tokens[0].expose(), "padded-tok");

        for (var, value, key) in [
            (
                "RATELIMITER__AUTH__CLIENT_TOKENS",
                "ok,in side-tok",
                "auth.client_tokens",
            ),
            (
                "RATELIMITER__AUTH__ADMIN_TOKENS",
                "ok-tok, ,x",
                "auth.admin_tokens",
            ),
        ] {
            let e = Settings::load_from(None, env(&[(var, value)])).expect_err(value);
            let e = e.to_string();
            assert!(e.contains(key), "{e}");
            assert!(!e.contains("side-tok") && !e.contains("ok-tok"), "{e}");
        }
    }

    #[test]
    fn no_error_quotes_a_token_or_a_password() {
        let refused = |file_text: Option<&str>, vars: &[(&str, &str)]| {
            let f = file_text.map(file);
            let e = Settings::load_from(f.as_ref().map(|f| f.0.as_path()), env(vars))
                .expect_err("refused");
            e.to_string()
        };
        let cases = [
            // A token where a list belongs, from the file.
            refused(Some("[auth]\nadmin_tokens = \"s3cret-1\"\n"), &[]),
            // A file that does not parse, on the line of a token.
            refused(Some("[auth]\nadmin_tokens = [\"s3cret-1\"\n"), &[]),
            // A list of tables where tokens belong.
            refused(Some("[auth]\nclient_tokens = [{ s3cret-1 = 1 }]\n"), &[]),
            // A secret-looking value in a numeric setting.
            refused(None, &[("RATELIMITER__REDIS__POOL_SIZE", "s3cret-1")]),
            // A password in a URL that is refused.
            refused(None, &[("RATELIMITER__REDIS__URL", "http://:s3cret-1@h:1")]),
            // Cluster seeds with credentials and no port.
            refused(
                None,
                &[("RATELIMITER__REDIS__CLUSTER_NODES", "u:s3cret-1@host")],
            ),
            // An unknown key holding a secret.
            refused(None, &[("RATELIMITER__AUTH__ADMIN_TOKEN", "s3cret-1")]),
        ];
        for e in cases {
            assert!(!e.contains("s3cret"), "{e}");
            assert!(e.starts_with("configuration: "), "{e}");
        }
    }

    #[test]
    fn a_wrong_type_names_its_key_and_the_kind_of_value() {
        let e = Settings::load_from(None, env(&[("RATELIMITER__REDIS__TIMEOUT_MS", "1e3")]))
            .expect_err("not an integer");
        let e = e.to_string();
        assert!(
            e.contains("redis.timeout_ms") && e.contains("integer"),
            "{e}"
        );
    }

    #[test]
    fn cluster_seeds_may_carry_credentials_that_never_print() {
        let s = Settings::load_from(
            None,
            env(&[(
                "RATELIMITER__REDIS__CLUSTER_NODES",
                "user:s3cret-2@10.0.0.1:7000, 10.0.0.2:7001",
            )]),
        )
        .expect("valid");
        assert_eq!(s.redis.cluster_nodes[1].expose(), "10.0.0.2:7001");
        assert!(!format!("{s:?}").contains("s3cret"));
    }

    #[test]
    fn secrets_do_not_print() {
        let s = Settings::load_from(None, env(&[("RATELIMITER__REDIS__URL", "redis://:pw@h:1")]))
            .expect("valid");
        assert!(!format!("{s:?}").contains("pw"));
    }
}
