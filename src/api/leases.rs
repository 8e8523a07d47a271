//! The lease endpoints of concurrency policies: `POST /v1/leases` (take), `POST
//! /v1/leases/{id}/renew` and `DELETE /v1/leases/{id}` (release), answered as JSON and as the
//! IETF `RateLimit` headers with the `concurrent-requests` quota unit.

use actix_web::http::header;
use actix_web::{delete, post, web, HttpResponse, HttpResponseBuilder};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::Client;
use super::body::{JsonBody, OptionalJsonBody};
use super::errors::{ApiError, Problem};
use super::reply::{fixed_header, Reply, DECIDED_BY, POLICY_ETAG, RATELIMIT, RATELIMIT_POLICY};
use super::schema;
use crate::policy::concurrency::parse_lease_ms;
use crate::policy::{input::parse_cost, LimitKey, PolicyName, ValidationError};
use crate::service::{DecidedBy, LeaseId, Leased, RateLimiter, ServiceError};

/// Take a lease of `cost` units of the concurrency policy `policy` for the subject `key`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"policy": "exports", "key": "customer-7", "cost": 1, "lease_ms": 30000}))]
pub struct TakeLeaseRequest {
    /// Name of an existing concurrency policy.
    #[schema(schema_with = schema::policy_field)]
    pub policy: String,
    /// The subject (a customer, an API key, a repository…): any non-empty UTF-8 string of at
    /// most 256 bytes.
    #[schema(example = "customer-7", min_length = 1, max_length = 256)]
    pub key: String,
    /// Units the lease holds, 1 to the policy's `limit`. Defaults to 1.
    #[schema(schema_with = schema::lease_cost_field)]
    #[serde(default)]
    pub cost: Option<serde_json::Number>,
    /// The lease's lifetime in milliseconds, 1 to the policy's `max_lease_ms` (which is its
    /// `lease_ms` unless the policy says otherwise; at most 86400000); the policy's `lease_ms`
    /// when left out.
    #[schema(schema_with = schema::lease_ms_field)]
    #[serde(default)]
    pub lease_ms: Option<serde_json::Number>,
}

/// Renew a lease, optionally for another lifetime.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"lease_ms": 30000}))]
pub struct RenewLeaseRequest {
    /// The lease's new lifetime from now, in milliseconds, 1 to the policy's `max_lease_ms`;
    /// the policy's `lease_ms` when left out.
    #[schema(schema_with = schema::lease_ms_field)]
    #[serde(default)]
    pub lease_ms: Option<serde_json::Number>,
}

/// `{id}` of `/v1/leases/{id}`; its spec is in `schema`.
#[derive(Debug, Deserialize)]
pub struct LeasePath {
    pub id: String,
}

/// A take's answer: granted (201, with `lease`) or denied (200). A denial is an ordinary
/// answer, not an error.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "allowed": true, "lease": "l1~exports~Y3VzdG9tZXItNw~4f3c2a9d8e7b6a5f4e3d2c1b0a998877~1",
    "policy": "exports", "key": "customer-7", "limit": 5, "in_use": 3, "remaining": 2,
    "expires_in_ms": 30000, "retry_after_ms": 0, "degraded": false, "decided_by": "redis"
}))]
pub struct TakeLeaseResponse {
    /// Whether the lease was granted.
    #[schema(example = true)]
    pub allowed: bool,
    /// Granted only: the lease's id, for renewing and releasing it (also in `Location`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = schema::lease_id_field)]
    pub lease: Option<String>,
    /// The policy asked, echoed.
    #[schema(example = "exports")]
    pub policy: String,
    /// The subject asked for, echoed unchanged.
    #[schema(example = "customer-7")]
    pub key: String,
    /// The policy's `limit`: units held at once, at most.
    #[schema(example = 5)]
    pub limit: u64,
    /// Units held by the subject's live leases after this call (this lease included when
    /// granted). May exceed `limit` after the limit was lowered.
    #[schema(example = 3)]
    pub in_use: u64,
    /// Units still free: `limit` less `in_use`, never negative.
    #[schema(example = 2)]
    pub remaining: u64,
    /// Granted: milliseconds until the lease expires unless renewed. Denied: 0.
    #[schema(example = 30000)]
    pub expires_in_ms: u64,
    /// Granted: 0. Denied: milliseconds until the earliest current lease of the subject
    /// expires unless renewed: the earliest time a slot frees by itself (a release may free one
    /// sooner; a renewal, a larger `cost` or a lowered `limit` may need more than one).
    #[schema(example = 0)]
    pub retry_after_ms: u64,
    /// True when the store could not be reached and the policy's fail mode (`open` or `local`)
    /// decided instead; an `open` lease is held nowhere. `decided_by` says which.
    #[schema(example = false)]
    pub degraded: bool,
    /// Who decided: `redis` or `embedded` (the store), `fail_open` (granted without counting:
    /// not a real lease) or `fail_local` (this instance alone). Also in `Decided-By`.
    #[schema(example = "redis")]
    pub decided_by: DecidedBy,
}

/// A renewal's answer.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "lease": "l1~exports~Y3VzdG9tZXItNw~4f3c2a9d8e7b6a5f4e3d2c1b0a998877~1",
    "policy": "exports", "key": "customer-7", "limit": 5, "in_use": 3, "remaining": 2,
    "expires_in_ms": 30000, "degraded": false, "decided_by": "redis"
}))]
pub struct RenewLeaseResponse {
    /// The lease renewed: the same id.
    #[schema(schema_with = schema::lease_id_field)]
    pub lease: String,
    /// The lease's policy.
    #[schema(example = "exports")]
    pub policy: String,
    /// The lease's subject.
    #[schema(example = "customer-7")]
    pub key: String,
    /// The policy's `limit` now.
    #[schema(example = 5)]
    pub limit: u64,
    /// Units held by the subject's live leases, this one included.
    #[schema(example = 3)]
    pub in_use: u64,
    /// `limit` less `in_use`, never negative.
    #[schema(example = 2)]
    pub remaining: u64,
    /// Milliseconds until the lease expires unless renewed again.
    #[schema(example = 30000)]
    pub expires_in_ms: u64,
    /// True when the store could not be reached and the policy's fail mode decided instead.
    #[schema(example = false)]
    pub degraded: bool,
    /// Who decided, as for a take.
    #[schema(example = "redis")]
    pub decided_by: DecidedBy,
}

/// Take a lease.
///
/// Atomically takes a lease of `cost` units (default 1) on the subject `key` of the
/// concurrency policy `policy`, if the units held by the subject's live leases leave room under
/// the policy's `limit`; otherwise takes nothing. A granted lease (201, `Location:
/// /v1/leases/{id}`) holds its units until it is released (`DELETE /v1/leases/{id}`) or expires
/// after `lease_ms` (default the policy's) without a renewal (`POST /v1/leases/{id}/renew`): a
/// holder that dies frees its slot at the expiry. A denial is a 200 with `"allowed": false`,
/// `retry_after_ms` (the time until the earliest current lease expires unless renewed: when a
/// slot frees by itself at the earliest; a release may free one sooner) and `Retry-After`. Both carry `RateLimit-Policy`
/// (`q` the limit, `qu="concurrent-requests"`) and `RateLimit` (`r` the units free). Expiry is
/// measured on the store's clock (Redis `TIME`). A degraded grant (`decided_by` `fail_open`:
/// nothing holds it, or `fail_local`: this instance alone holds it) is not held on the shared
/// store: once the store answers again, its renewal is a 404 and the holder takes a new lease.
#[utoipa::path(
    tag = "leases",
    security((), ("bearer" = [])),
    request_body = TakeLeaseRequest,
    responses(
        (status = 201, description = "Granted: the lease, its id also in `Location`", body = TakeLeaseResponse, headers(
            ("Location" = String, description = "`/v1/leases/<id>`: the lease's URL, for renewing and releasing it"),
            ("RateLimit-Policy" = String, description = "`\"<policy>\";q=<limit>;qu=\"concurrent-requests\"`"),
            ("RateLimit" = String, description = "`\"<policy>\";r=<units free>`. Absent on a `fail_open` answer"),
            ("Decided-By" = String, description = "Who decided, as the body's `decided_by`"),
            ("Policy-ETag" = String, description = "The version of the policy this instance decided with, as `GET /v1/policies/{name}` shows it in `ETag`"),
        )),
        (status = 200, description = "Denied: no lease; `retry_after_ms` says when the earliest current lease expires", body = TakeLeaseResponse, headers(
            ("Retry-After" = u64, description = "Seconds until the earliest current lease expires, rounded up, at least 1"),
            ("RateLimit-Policy" = String, description = "`\"<policy>\";q=<limit>;qu=\"concurrent-requests\"`"),
            ("RateLimit" = String, description = "`\"<policy>\";r=<units free>`"),
            ("Decided-By" = String, description = "Who decided, as the body's `decided_by`"),
            ("Policy-ETag" = String, description = "The version of the policy this instance decided with"),
        )),
        (status = 400, description = "Not a JSON object, or a field of the wrong JSON type", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`auth.client_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such policy", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A missing, unknown or out-of-range field: no `policy` or `key`, a `cost` below 1 or above the policy's `limit`, a `lease_ms` outside 1 to the policy's `max_lease_ms`, a policy that is a rate policy, not a concurrency policy", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store failed and the policy's fail mode is `closed` (a take that got no answer is undone once the store answers again)", body = Problem, content_type = "application/problem+json"),
    )
)]
#[post("/v1/leases")]
pub async fn take(
    _: Client,
    limiter: web::Data<RateLimiter>,
    body: JsonBody<TakeLeaseRequest>,
) -> Result<HttpResponse, ApiError> {
    let JsonBody(req) = body;
    PolicyName::check(&req.policy).map_err(|r| ValidationError::invalid("policy", r))?;
    let key = LimitKey::parse(req.key).map_err(|r| ValidationError::invalid("key", r))?;
    let cost = match &req.cost {
        Some(n) => parse_cost(n)?,
        None => 1,
    };
    let lease_ms = req.lease_ms.as_ref().map(parse_lease_ms).transpose()?;
    let leased = limiter.take_lease(&req.policy, key, cost, lease_ms).await?;
    let mut response = if leased.granted() {
        HttpResponse::Created()
    } else {
        HttpResponse::Ok()
    };
    let mut reply = headers(&mut response, &leased);
    let lease = leased.lease.as_ref().map(LeaseId::to_string);
    if let Some(id) = &lease {
        reply.push("/v1/leases/").push(id);
        reply.header(&mut response, header::LOCATION);
    } else {
        let seconds = leased.answer.retry_after_us.div_ceil(1_000_000).max(1);
        reply.push_u64(seconds);
        reply.header(&mut response, header::RETRY_AFTER);
    }
    Ok(reply.json(
        response,
        &TakeLeaseResponse {
            allowed: leased.granted(),
            lease,
            policy: leased.policy.name.to_string(),
            limit: leased.params.limit,
            in_use: leased.answer.in_use,
            remaining: leased.remaining(),
            expires_in_ms: leased.answer.expires_in_us / 1_000,
            retry_after_ms: leased.answer.retry_after_us.div_ceil(1_000),
            degraded: leased.decided_by.is_degraded(),
            decided_by: leased.decided_by,
            key: leased.key.into_string(),
        },
    ))
}

/// Renew a lease.
///
/// Extends a live lease to `lease_ms` from now (the policy's `lease_ms` when the body, which
/// may be left out, gives none). A lease that has expired, was released or never existed is a
/// 404 `unknown-lease`: the holder has lost its slot and takes a new lease. A lease whose
/// policy was deleted is a 404 `unknown-policy`.
#[utoipa::path(
    tag = "leases",
    security((), ("bearer" = [])),
    params(LeasePath),
    request_body(content = Option<RenewLeaseRequest>, description = "Optional: `{\"lease_ms\"}`"),
    responses(
        (status = 200, description = "Renewed", body = RenewLeaseResponse, headers(
            ("RateLimit-Policy" = String, description = "`\"<policy>\";q=<limit>;qu=\"concurrent-requests\"`"),
            ("RateLimit" = String, description = "`\"<policy>\";r=<units free>`. Absent on a `fail_open` answer"),
            ("Decided-By" = String, description = "Who decided, as the body's `decided_by`"),
            ("Policy-ETag" = String, description = "The version of the policy this instance decided with"),
        )),
        (status = 400, description = "Not a JSON object, or a field of the wrong JSON type", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`auth.client_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`unknown-lease`: the lease has expired, was released, never existed, or the id is not a lease id; `unknown-policy`: its policy was deleted", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "An unknown or out-of-range field: a `lease_ms` outside 1 to the policy's `max_lease_ms`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store failed and the policy's fail mode is `closed`", body = Problem, content_type = "application/problem+json"),
    )
)]
#[post("/v1/leases/{id}/renew")]
pub async fn renew(
    _: Client,
    limiter: web::Data<RateLimiter>,
    path: web::Path<LeasePath>,
    body: OptionalJsonBody<RenewLeaseRequest>,
) -> Result<HttpResponse, ApiError> {
    let OptionalJsonBody(req) = body;
    // The id first: a malformed one is a 404 whatever the body says.
    let id = lease_id(&path.id)?;
    let lease_ms = req.lease_ms.as_ref().map(parse_lease_ms).transpose()?;
    let leased = limiter.renew_lease(id, lease_ms).await?;
    let mut response = HttpResponse::Ok();
    let reply = headers(&mut response, &leased);
    Ok(reply.json(
        response,
        &RenewLeaseResponse {
            lease: leased
                .lease
                .as_ref()
                .map(LeaseId::to_string)
                .unwrap_or_default(),
            policy: leased.policy.name.to_string(),
            limit: leased.params.limit,
            in_use: leased.answer.in_use,
            remaining: leased.remaining(),
            expires_in_ms: leased.answer.expires_in_us / 1_000,
            degraded: leased.decided_by.is_degraded(),
            decided_by: leased.decided_by,
            key: leased.key.into_string(),
        },
    ))
}

/// Release a lease.
///
/// Ends the lease, freeing its units at once. Idempotent: 204 whether or not the lease was
/// still live (released before, expired, or its policy deleted), so a holder may release in a
/// `finally` without checking. Only an id that is not a lease id at all is a 404.
#[utoipa::path(
    tag = "leases",
    security((), ("bearer" = [])),
    params(LeasePath),
    responses(
        (status = 204, description = "The lease is gone (or was already)", headers(
            ("Decided-By" = String, description = "Who released it: `redis`, `embedded`, `fail_open` (nothing was touched) or `fail_local`; absent when the lease's policy no longer exists"),
        )),
        (status = 401, description = "`auth.client_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`unknown-lease`: the id is not a lease id", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store failed and the policy's fail mode is `closed`: retry (the lease expires anyway)", body = Problem, content_type = "application/problem+json"),
    )
)]
#[delete("/v1/leases/{id}")]
pub async fn release(
    _: Client,
    limiter: web::Data<RateLimiter>,
    path: web::Path<LeasePath>,
) -> Result<HttpResponse, ApiError> {
    let id = lease_id(&path.id)?;
    let released = limiter.release_lease(id).await?;
    let mut response = HttpResponse::NoContent();
    if let Some(by) = released.decided_by {
        fixed_header(&mut response, DECIDED_BY, by.as_str());
    }
    Ok(response.finish())
}

/// The lease id of a path; anything else names no lease.
fn lease_id(raw: &str) -> Result<LeaseId, ApiError> {
    LeaseId::parse(raw).map_err(|_| {
        ServiceError::UnknownLease("the id is not a lease id this service issued").into()
    })
}

/// `RateLimit-Policy`, `RateLimit` (unless fail-open: nothing was counted), `Decided-By` and
/// `Policy-ETag`; the answer's [`Reply`], for the rest of its values and its body.
fn headers(response: &mut HttpResponseBuilder, leased: &Leased) -> Reply {
    let name = leased.policy.name.as_str();
    let mut reply = Reply::with_capacity(384 + 3 * name.len() + leased.key.as_str().len());
    reply
        .push("\"")
        .push(name)
        .push("\";q=")
        .push_u64(leased.params.limit)
        .push(";qu=\"concurrent-requests\"");
    reply.header(response, RATELIMIT_POLICY);
    if leased.decided_by != DecidedBy::FailOpen {
        reply
            .push("\"")
            .push(name)
            .push("\";r=")
            .push_u64(leased.remaining());
        reply.header(response, RATELIMIT);
    }
    reply.push_etag(&leased.etag).header(response, POLICY_ETAG);
    fixed_header(response, DECIDED_BY, leased.decided_by.as_str());
    reply
}
