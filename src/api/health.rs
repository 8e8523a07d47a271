//! `GET /healthz` (the process answers) and `GET /readyz` (the store answers and policies are
//! loaded).

use actix_web::{get, web, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::errors::{ApiError, Problem};
use crate::service::{RateLimiter, ServiceError};
use crate::store::{Store, StoreError};

/// The service's health.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    #[schema(example = "ok")]
    pub status: &'static str,
    /// `embedded` or `redis`.
    #[schema(example = "redis")]
    pub store: &'static str,
}

/// Liveness: the process answers HTTP.
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
#[utoipa::path(
    tag = "operations",
    responses(
        (status = 200, description = "Ready to decide", body = Health),
        (status = 503, description = "Not ready, with the reason", body = Problem, content_type = "application/problem+json"),
    )
)]
#[get("/readyz")]
pub async fn readyz(limiter: web::Data<RateLimiter>) -> Result<HttpResponse, ApiError> {
    limiter.store().ping().await.map_err(ServiceError::from)?;
    if limiter.cache().version().is_none() {
        return Err(ServiceError::Store(StoreError::Unavailable(
            "policies have not been loaded yet".into(),
        ))
        .into());
    }
    Ok(HttpResponse::Ok().json(Health {
        status: "ok",
        store: limiter.store().kind(),
    }))
}
