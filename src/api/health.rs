//! Operations: `GET /healthz` (the process answers, and which build it is), `GET /readyz` (the
//! store answers and policies are loaded) and `GET /metrics` (Prometheus).

use actix_web::{get, web, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::auth;
use super::errors::{ApiError, Problem};
use crate::service::RateLimiter;
use crate::tls::Certificates;

/// The release this binary is (`version` in Cargo.toml), as `--version` and `/healthz` show it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit this binary was built from, or `unknown` (see `build.rs`).
pub const COMMIT: &str = env!("RATELIMITER_COMMIT");

/// The service's health.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// Always `ok` in a 200 answer.
    #[schema(example = "ok")]
    pub status: &'static str,
    /// The release this instance runs (semantic versioning; see CHANGELOG.md).
    #[schema(example = "0.26.0")]
    pub version: &'static str,
    /// The git commit it was built from, or `unknown` when the build had neither a git checkout
    /// nor `RATELIMITER_COMMIT`.
    #[schema(example = "b4344a95ed9ec47f442641f393a9b467c3f03bf6")]
    pub commit: &'static str,
    /// `embedded` or `redis`.
    #[schema(example = "redis")]
    pub store: &'static str,
    /// `/readyz` only: the policies this instance enforces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policies: Option<PolicyView>,
    /// `/readyz` only, on a Redis Cluster: what is degraded while the instance stays ready (a
    /// master that cannot be reached, the cluster refusing calls during a failover); absent
    /// when nothing is.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(
        example = "the Redis master 10.0.0.7:6379 is unreachable: its keys are answered by their policies' fail mode"
    )]
    pub degraded: Option<String>,
}

/// What this instance's policy cache holds: compare `generation` and `version` across instances
/// to see them converge.
#[derive(Debug, Serialize, ToSchema)]
pub struct PolicyView {
    /// The store's generation: a random id that changes when the store loses its data.
    #[schema(example = "8c3f0a51d2e94b7a")]
    pub generation: String,
    /// The version of the store's policy change log this instance is current with.
    #[schema(example = 42)]
    pub version: u64,
    /// Policies in the cache.
    #[schema(example = 12)]
    pub count: usize,
    /// Pages of the store's change log this instance has read in complete loads (at start-up,
    /// or after the store lost its data).
    #[schema(example = 1)]
    pub full_pages: u64,
    /// Pages of changes this instance has read since.
    #[schema(example = 7)]
    pub incremental_pages: u64,
}

/// Liveness: the process answers HTTP, and which build it runs.
///
/// 200 as long as the process runs, whatever the store's state: restart the process only when
/// this fails. `version` and `commit` say which release and commit answer, as
/// `ratelimiter --version` does, so that a rolling upgrade can be watched instance by instance.
#[utoipa::path(
    tag = "operations",
    responses((status = 200, description = "The process is alive", body = Health))
)]
#[get("/healthz")]
pub async fn healthz(limiter: web::Data<RateLimiter>) -> HttpResponse {
    HttpResponse::Ok().json(Health {
        status: "ok",
        version: VERSION,
        commit: COMMIT,
        store: limiter.store().kind(),
        policies: None,
        degraded: None,
    })
}

/// Readiness: this instance can decide with current policies.
///
/// 503, with the reason in `detail`, while policies are not loaded yet, the store is unreachable
/// (or the circuit breaker open; on a Redis Cluster, every master), the store refuses writes
/// (Redis out of memory; on a Cluster, any master, named), the policy cache has not been
/// brought up to date within its bound, or policies listed in the configuration file are
/// missing: take the instance out of the load balancer meanwhile. A 200 answer shows the policy
/// version this instance enforces, and on a Cluster, in `degraded`, what one failover leaves
/// degraded (a master that cannot be reached, the cluster refusing calls while it promotes a
/// replica): every instance sees the same cluster, so none is taken out of rotation for it.
#[utoipa::path(
    tag = "operations",
    responses(
        (status = 200, description = "Ready to decide", body = Health),
        (status = 503, description = "Not ready, with the reason", body = Problem, content_type = "application/problem+json"),
    )
)]
#[get("/readyz")]
pub async fn readyz(
    limiter: web::Data<RateLimiter>,
    certs: Option<web::Data<Certificates>>,
) -> Result<HttpResponse, ApiError> {
    let degraded = limiter.readiness().await?;
    // A certificate near its expiry is a warning, not unreadiness: every instance of a
    // deployment usually shares it, and taking them all out of rotation would serve no one.
    let expiring = certs.map(|c| c.expiry_warnings()).unwrap_or_default();
    let degraded = match (degraded, expiring.is_empty()) {
        (degraded, true) => degraded,
        (None, false) => Some(expiring.join("; ")),
        (Some(d), false) => Some(format!("{d}; {}", expiring.join("; "))),
    };
    let position = limiter.cache().position();
    let (full_pages, incremental_pages) = limiter.sync().pages();
    Ok(HttpResponse::Ok().json(Health {
        status: "ok",
        version: VERSION,
        commit: COMMIT,
        store: limiter.store().kind(),
        policies: Some(PolicyView {
            generation: position
                .generation
                .as_deref()
                .unwrap_or_default()
                .to_owned(),
            version: position.applied,
            count: limiter.cache().len(),
            full_pages,
            incremental_pages,
        }),
        degraded,
    }))
}

/// Metrics in the Prometheus text format.
///
/// Decisions by policy and outcome, acquire and Redis latency histograms, Redis errors by kind,
/// the circuit breaker's state, the connection pool, and the number of policies. Open unless
/// `auth.metrics_tokens` is set.
#[utoipa::path(
    tag = "operations",
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Prometheus text exposition format 0.0.4", body = String, content_type = "text/plain; version=0.0.4"),
        (status = 401, description = "`auth.metrics_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
    )
)]
#[get("/metrics")]
pub async fn metrics(_: auth::Metrics, limiter: web::Data<RateLimiter>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(limiter.render_metrics())
}
