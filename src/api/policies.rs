//! `/v1/policies`: create, read, replace and delete policies at run time.

use actix_web::http::header;
use actix_web::{delete, get, post, put, web, HttpResponse};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::auth::Admin;
use super::body::JsonBody;
use super::errors::{ApiError, Problem};
use crate::policy::{parse_policy, PolicyDoc, PolicyName};
use crate::service::{RateLimiter, ServiceError};
use crate::store::PutOutcome;

/// Every policy, sorted by name.
#[derive(Debug, Serialize, ToSchema)]
pub struct PolicyList {
    /// Every policy, sorted by name.
    pub policies: Vec<PolicyDoc>,
}

/// A name from the path; one that is not a valid name names no policy.
fn path_name(raw: &str) -> Result<PolicyName, ApiError> {
    PolicyName::parse(raw).map_err(|_| ServiceError::UnknownPolicy(raw.to_owned()).into())
}

fn location(name: &PolicyName) -> String {
    format!("/v1/policies/{name}")
}

/// List policies.
///
/// Every policy, sorted by name.
#[utoipa::path(
    tag = "policies",
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Every policy, sorted by name", body = PolicyList),
        (status = 401, description = "`auth.admin_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
#[get("/v1/policies")]
pub async fn list(_: Admin, limiter: web::Data<RateLimiter>) -> Result<HttpResponse, ApiError> {
    let policies = limiter.list_policies().await?;
    Ok(HttpResponse::Ok().json(PolicyList {
        policies: policies.iter().map(|p| p.to_doc()).collect(),
    }))
}

/// Create a policy.
///
/// In force on every instance sharing the store within a second. Fails with 409 when a policy of
/// that name exists (use `PUT` to replace one).
#[utoipa::path(
    tag = "policies",
    security((), ("bearer" = [])),
    request_body = PolicyDoc,
    responses(
        (status = 201, description = "Created", body = PolicyDoc, headers(("Location" = String, description = "The new policy's URL"))),
        (status = 400, description = "Not a JSON object, or a field of the wrong JSON type", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A policy of that name exists", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A missing, unknown or out-of-range field", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`auth.admin_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
#[post("/v1/policies")]
pub async fn create(
    _: Admin,
    limiter: web::Data<RateLimiter>,
    body: JsonBody<Value>,
) -> Result<HttpResponse, ApiError> {
    let policy = parse_policy(&body.0, None)?;
    let policy = limiter.create_policy(policy).await?;
    Ok(HttpResponse::Created()
        .insert_header((header::LOCATION, location(&policy.name)))
        .json(policy.to_doc()))
}

/// Get a policy.
///
/// The policy as stored, with its defaults filled in. While the store is unreachable, the copy
/// this instance has cached.
#[utoipa::path(
    tag = "policies",
    security((), ("bearer" = [])),
    params(("name" = String, Path, description = "The policy's name")),
    responses(
        (status = 200, description = "The policy", body = PolicyDoc),
        (status = 404, description = "No such policy", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`auth.admin_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
#[get("/v1/policies/{name}")]
pub async fn read(
    _: Admin,
    limiter: web::Data<RateLimiter>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let name = path_name(&name)?;
    let policy = limiter.get_policy(&name).await?;
    Ok(HttpResponse::Ok().json(policy.to_doc()))
}

/// Create or replace a policy.
///
/// The body is a whole policy; its `name` may be left out and must match the path when given.
/// Replacing a policy keeps the subjects' counters unless the algorithm or its window or rate
/// changes, in which case they start afresh.
#[utoipa::path(
    tag = "policies",
    security((), ("bearer" = [])),
    params(("name" = String, Path, description = "The policy's name")),
    request_body = PolicyDoc,
    responses(
        (status = 200, description = "Replaced", body = PolicyDoc),
        (status = 201, description = "Created", body = PolicyDoc, headers(("Location" = String, description = "The policy's URL"))),
        (status = 400, description = "Not a JSON object, or a field of the wrong JSON type", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A missing, unknown or out-of-range field, or a `name` that differs from the path", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`auth.admin_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
#[put("/v1/policies/{name}")]
pub async fn replace(
    _: Admin,
    limiter: web::Data<RateLimiter>,
    name: web::Path<String>,
    body: JsonBody<Value>,
) -> Result<HttpResponse, ApiError> {
    let path = PolicyName::parse(&name)
        .map_err(|r| ApiError::Validation(crate::policy::ValidationError::invalid("name", r)))?;
    let policy = parse_policy(&body.0, Some(&path))?;
    let doc = policy.to_doc();
    Ok(match limiter.put_policy(policy).await? {
        PutOutcome::Created => HttpResponse::Created()
            .insert_header((header::LOCATION, location(&path)))
            .json(doc),
        PutOutcome::Replaced => HttpResponse::Ok().json(doc),
    })
}

/// Delete a policy.
///
/// Subjects' counters are left to expire by themselves.
#[utoipa::path(
    tag = "policies",
    security((), ("bearer" = [])),
    params(("name" = String, Path, description = "The policy's name")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such policy", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`auth.admin_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
#[delete("/v1/policies/{name}")]
pub async fn remove(
    _: Admin,
    limiter: web::Data<RateLimiter>,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let name = path_name(&name)?;
    limiter.delete_policy(&name).await?;
    Ok(HttpResponse::NoContent().finish())
}
