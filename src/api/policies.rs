//! `/v1/policies`: create, read, replace and delete policies at run time.

use actix_web::http::header;
use actix_web::{delete, get, post, put, web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::auth::Admin;
use super::body::JsonBody;
use super::errors::{ApiError, Problem};
use super::schema::{DeleteHeaders, PolicyReplacement, ReplaceHeaders};
use crate::policy::{parse_policy, PolicyDoc, PolicyName, ValidationError};
use crate::service::policies::etag_header;
use crate::service::{RateLimiter, ServiceError};
use crate::store::{Precondition, WriteKind, WriteStatus};

/// One page of policies, sorted by name.
#[derive(Debug, Serialize, ToSchema)]
pub struct PolicyList {
    /// Policies sorted by name, at most `limit`.
    pub policies: Vec<PolicyDoc>,
    /// Pass as `cursor` to get the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "api-per-user")]
    pub next_cursor: Option<String>,
}

/// Default and largest page of `GET /v1/policies`.
pub const DEFAULT_PAGE: usize = 100;
pub const MAX_PAGE: usize = 1_000;

/// The query of `GET /v1/policies`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Policies per page: 1 to 1,000; 100 when left out.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000, example = 100)]
    pub limit: Option<String>,
    /// `next_cursor` of the previous page; left out for the first page.
    #[param(example = "api-per-user")]
    pub cursor: Option<String>,
}

/// `{name}` of `/v1/policies/{name}`; its spec is in `schema`.
#[derive(Debug, Deserialize)]
pub struct PolicyPath {
    pub name: String,
}

/// A name from the path; one that is not a valid name names no policy.
pub(super) fn path_name(raw: &str) -> Result<PolicyName, ApiError> {
    PolicyName::parse(raw).map_err(|_| ServiceError::UnknownPolicy(raw.to_owned()).into())
}

fn location(name: &PolicyName) -> String {
    format!("/v1/policies/{name}")
}

/// A character of an opaque ETag (RFC 9110 `etagc`, ASCII only), but `,`, which separates list
/// items and was refused before; the schema's `If-Match` pattern says the same.
fn is_etag_char(b: u8) -> bool {
    b == b'!' || (b'#'..=b'~').contains(&b)
}

/// What a write's `If-Match` and `If-None-Match` ask.
pub(super) enum Condition {
    /// One precondition, or none.
    One(Precondition),
    /// `If-Match` and `If-None-Match: *` together: the first needs the policy and the second
    /// its absence, so they never both hold. RFC 9110 (13.2.2) evaluates them in turn, which
    /// always ends in 412; nothing is written.
    Never,
}

/// The precondition of a write, from `If-Match` (one ETag, or `*`) and `If-None-Match: *`.
pub(super) fn condition(req: &HttpRequest) -> Result<Condition, ApiError> {
    let one = |name: &'static str| -> Result<Option<&str>, ApiError> {
        let mut values = req.headers().get_all(name);
        let Some(value) = values.next() else {
            return Ok(None);
        };
        let bad = |reason| ApiError::BadHeader {
            header: name,
            reason,
        };
        if values.next().is_some() {
            return Err(bad("may be given once"));
        }
        let value = value.to_str().map_err(|_| bad("must be ASCII"))?.trim();
        if value.contains(',') {
            return Err(bad(
                "takes one ETag, as the policy's ETag header shows it, or `*`",
            ));
        }
        Ok(Some(value))
    };
    let if_match = match one("if-match")? {
        None => None,
        Some("*") => Some(Precondition::Exists),
        Some(etag) => {
            let inner = etag
                .strip_prefix('"')
                .and_then(|e| e.strip_suffix('"'))
                .filter(|e| !e.is_empty() && e.bytes().all(is_etag_char))
                .ok_or(ApiError::BadHeader {
                    header: "if-match",
                    reason: "must be a quoted ETag, as the policy's ETag header shows it, or `*`",
                })?;
            Some(Precondition::Matches(inner.to_owned()))
        }
    };
    let absent = match one("if-none-match")? {
        None => false,
        Some("*") => true,
        Some(_) => {
            return Err(ApiError::BadHeader {
                header: "if-none-match",
                reason: "only `*` is supported (create only if absent)",
            })
        }
    };
    Ok(match (if_match, absent) {
        (Some(_), true) => Condition::Never,
        (Some(p), false) => Condition::One(p),
        (None, true) => Condition::One(Precondition::Absent),
        (None, false) => Condition::One(Precondition::None),
    })
}

/// The 412 of a write whose preconditions never hold, with the policy's ETag when it exists.
async fn never_holds(limiter: &RateLimiter, name: &PolicyName) -> ApiError {
    match limiter.get_policy(name).await {
        Ok((_, etag)) => ServiceError::PreconditionFailed {
            current: Some(etag),
        }
        .into(),
        Err(ServiceError::UnknownPolicy(_)) => {
            ServiceError::PreconditionFailed { current: None }.into()
        }
        Err(e) => e.into(),
    }
}

/// The `limit` and `cursor` of a list's query ([`ListQuery`]).
pub(super) fn list_page(req: &HttpRequest) -> Result<(usize, Option<String>), ApiError> {
    let query = web::Query::<ListQuery>::from_query(req.query_string()).map_err(|e| {
        let message = e.to_string();
        let field = ["limit", "cursor"]
            .into_iter()
            .find(|f| message.contains(&format!("`{f}`")))
            .unwrap_or("query");
        ValidationError::invalid(field, format!("is not understood: {message}"))
    })?;
    let limit = match query.limit.as_deref() {
        None => DEFAULT_PAGE,
        Some(raw) => raw
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_PAGE).contains(n))
            .ok_or_else(|| {
                ValidationError::invalid(
                    "limit",
                    format!("must be a whole number from 1 to {MAX_PAGE}"),
                )
            })?,
    };
    Ok((limit, query.into_inner().cursor))
}

/// List policies.
///
/// Policies sorted by name, a page at a time: follow `next_cursor` until it is absent. The list
/// is this instance's copy, brought up to date with the store first (while the store is
/// unreachable, the copy as it is).
#[utoipa::path(
    operation_id = "list_policies",
    tag = "policies",
    security((), ("bearer" = [])),
    params(ListQuery),
    responses(
        (status = 200, description = "One page of policies, sorted by name", body = PolicyList),
        (status = 401, description = "`auth.admin_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`limit` out of range, or an unknown query parameter", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable and no policies have been loaded yet", body = Problem, content_type = "application/problem+json"),
    )
)]
#[get("/v1/policies")]
pub async fn list(
    _: Admin,
    limiter: web::Data<RateLimiter>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let (limit, cursor) = list_page(&req)?;
    let (page, next_cursor) = limiter.list_policies(cursor.as_deref(), limit).await?;
    Ok(HttpResponse::Ok().json(PolicyList {
        policies: page.iter().map(|(p, _)| p.to_doc()).collect(),
        next_cursor,
    }))
}

/// Create a policy.
///
/// In force on every instance sharing the store within a second. Fails with 409 when a policy of
/// that name exists (use `PUT` to replace one) or when the store holds `limits.max_policies`
/// policies already. The answer's `ETag` names the version created.
#[utoipa::path(
    operation_id = "create_policy",
    tag = "policies",
    security((), ("bearer" = [])),
    request_body = PolicyDoc,
    responses(
        (status = 201, description = "Created", body = PolicyDoc, headers(("Location" = String, description = "The new policy's URL"), ("ETag" = String, description = "The version created"))),
        (status = 400, description = "Not a JSON object, or a field of the wrong JSON type", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A policy of that name exists (`policy-exists`), the store holds `limits.max_policies` policies (`too-many-policies`), or another policy serves the same Envoy descriptor shape (`descriptor-claimed`, naming `descriptor`)", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A missing, unknown or out-of-range field", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`auth.admin_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable; with type `urn:ratelimiter:problem:outcome-unknown`, it did not answer in time and the policy may have been created: read it before retrying", body = Problem, content_type = "application/problem+json"),
    )
)]
#[post("/v1/policies")]
pub async fn create(
    _: Admin,
    limiter: web::Data<RateLimiter>,
    body: JsonBody<Value>,
) -> Result<HttpResponse, ApiError> {
    let policy = parse_policy(&body.0, None)?;
    let doc = policy.to_doc();
    let name = policy.name.clone();
    let written = limiter
        .change_policy(WriteKind::Create, &name, Some(policy), &Precondition::None)
        .await?;
    Ok(HttpResponse::Created()
        .insert_header((header::LOCATION, location(&name)))
        .insert_header((header::ETAG, etag_header(&written.etag)))
        .json(doc))
}

/// Get a policy.
///
/// The policy as stored, with its defaults filled in, and its version as the `ETag` header (use
/// it with `If-Match` to change the policy only if nobody else has since). While the store is
/// unreachable, the copy this instance has cached.
#[utoipa::path(
    operation_id = "read_policy",
    tag = "policies",
    security((), ("bearer" = [])),
    params(PolicyPath),
    responses(
        (status = 200, description = "The policy", body = PolicyDoc, headers(("ETag" = String, description = "The policy's version"))),
        (status = 404, description = "No such policy", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`auth.admin_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
#[get("/v1/policies/{name}")]
pub async fn read(
    _: Admin,
    limiter: web::Data<RateLimiter>,
    path: web::Path<PolicyPath>,
) -> Result<HttpResponse, ApiError> {
    let name = path_name(&path.name)?;
    let (policy, etag) = limiter.get_policy(&name).await?;
    Ok(HttpResponse::Ok()
        .insert_header((header::ETAG, etag_header(&etag)))
        .json(policy.to_doc()))
}

/// Create or replace a policy.
///
/// The body is a whole policy; its `name` may be left out and must match the path when given.
/// Replacing a policy keeps the subjects' usage (the units spent and not yet earned back count
/// against the new limits) unless a limit's algorithm or name changes, in which case its state
/// starts afresh. With `If-Match: "<ETag>"` the write happens only if
/// the policy is still at that version (`If-Match: *`: only if it exists); with
/// `If-None-Match: *` only if it does not exist (both together never hold: 412). Either makes a
/// retry after an `outcome-unknown` 503 safe.
#[utoipa::path(
    operation_id = "replace_policy",
    tag = "policies",
    security((), ("bearer" = [])),
    params(PolicyPath, ReplaceHeaders),
    request_body = PolicyReplacement,
    responses(
        (status = 200, description = "Replaced", body = PolicyDoc, headers(("ETag" = String, description = "The version written"))),
        (status = 201, description = "Created", body = PolicyDoc, headers(("Location" = String, description = "The policy's URL"), ("ETag" = String, description = "The version written"))),
        (status = 400, description = "Not a JSON object, a field of the wrong JSON type, or a malformed `If-Match`/`If-None-Match`", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The store holds `limits.max_policies` policies (`too-many-policies`), or another policy serves the same Envoy descriptor shape (`descriptor-claimed`, naming `descriptor`)", body = Problem, content_type = "application/problem+json"),
        (status = 412, description = "`If-Match` or `If-None-Match` does not hold; `ETag` is the policy's version now", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A missing, unknown or out-of-range field, or a `name` that differs from the path", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`auth.admin_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable; with type `urn:ratelimiter:problem:outcome-unknown`, it did not answer in time and the write may have happened: read the policy before retrying, or retry with `If-Match`", body = Problem, content_type = "application/problem+json"),
    )
)]
#[put("/v1/policies/{name}")]
pub async fn replace(
    _: Admin,
    limiter: web::Data<RateLimiter>,
    path: web::Path<PolicyPath>,
    req: HttpRequest,
    body: JsonBody<Value>,
) -> Result<HttpResponse, ApiError> {
    let path = PolicyName::parse(&path.name)
        .map_err(|r| ApiError::Validation(ValidationError::invalid("name", r)))?;
    let condition = condition(&req)?;
    let policy = parse_policy(&body.0, Some(&path))?;
    let precondition = match condition {
        Condition::One(p) => p,
        Condition::Never => return Err(never_holds(&limiter, &path).await),
    };
    let doc = policy.to_doc();
    let written = limiter
        .change_policy(WriteKind::Put, &path, Some(policy), &precondition)
        .await?;
    let mut response = match written.status {
        WriteStatus::Created => {
            let mut r = HttpResponse::Created();
            r.insert_header((header::LOCATION, location(&path)));
            r
        }
        _ => HttpResponse::Ok(),
    };
    Ok(response
        .insert_header((header::ETAG, etag_header(&written.etag)))
        .json(doc))
}

/// Delete a policy.
///
/// Subjects' counters are left to expire by themselves. With `If-Match: "<ETag>"`, only if the
/// policy is still at that version. A policy listed in the configuration file stays deleted: the
/// file only creates each policy once.
#[utoipa::path(
    operation_id = "delete_policy",
    tag = "policies",
    security((), ("bearer" = [])),
    params(PolicyPath, DeleteHeaders),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "A malformed `If-Match`", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such policy", body = Problem, content_type = "application/problem+json"),
        (status = 412, description = "`If-Match` does not hold; `ETag` is the policy's version now", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`auth.admin_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable; with type `urn:ratelimiter:problem:outcome-unknown`, it did not answer in time and the policy may have been deleted: read it before retrying", body = Problem, content_type = "application/problem+json"),
    )
)]
#[delete("/v1/policies/{name}")]
pub async fn remove(
    _: Admin,
    limiter: web::Data<RateLimiter>,
    path: web::Path<PolicyPath>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let name = path_name(&path.name)?;
    let precondition = match condition(&req)? {
        Condition::One(Precondition::Absent) | Condition::Never => {
            return Err(ApiError::BadHeader {
                header: "if-none-match",
                reason: "does not apply to DELETE",
            })
        }
        Condition::One(p) => p,
    };
    limiter
        .change_policy(WriteKind::Delete, &name, None, &precondition)
        .await?;
    Ok(HttpResponse::NoContent().finish())
}
