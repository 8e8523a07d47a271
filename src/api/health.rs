//! Operations: `GET /healthz` (the process answers), `GET /readyz` (the store answers and
//! policies are loaded) and `GET /metrics` (Prometheus).

use actix_web::{get, web, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::auth;
use super::errors::{ApiError, Problem};
use crate::service::{RateLimiter, ServiceError};
use crate::store::StoreError;

/// The service's health.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// Always `ok` in a 200 answer.
    #[schema(example = "ok")]
    pub status: &'static str,
    /// `embedded` or `redis`.
    #[schema(example = "redis")]
    pub store: &'static str,
}

/// Liveness: the process answers HTTP.
///
/// 200 as long as the process runs, whatever the store's state: restart the process only when
/// this fails.
#[utoipa::path(
    tag = "operations",
    responses((status = 200, description = "The process is alive", body = Health))
)]
#[get("/healthz")]
pub async fn healthz(limiter: web::Data<RateLimiter>) -> HttpResponse {
    HttpResponse::Ok().json(Health {
        status: "ok",
        store: limiter.store().kind(),
    })
}

/// Readiness: the store answers and the policies have been loaded.
///
/// 503, with the reason in `detail`, while policies are not loaded, the circuit breaker is open
/// or the store does not answer `PING`: take the instance out of the load balancer meanwhile.
#[utoipa::path(
    tag = "operations",
    responses(
        (status = 200, description = "Ready to decide", body = Health),
        (status = 503, description = "Not ready, with the reason", body = Problem, content_type = "application/problem+json"),
    )
)]
#[get("/readyz")]
pub async fn readyz(limiter: web::Data<RateLimiter>) -> Result<HttpResponse, ApiError> {
    if let Some(reason) = limiter.unready().await {
        return Err(ServiceError::Store(StoreError::Unavailable(reason)).into());
    }
    Ok(HttpResponse::Ok().json(Health {
        status: "ok",
        store: limiter.store().kind(),
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
