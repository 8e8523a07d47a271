//! `POST /v1/acquire`: one decision, as JSON and as the IETF `RateLimit` headers.

use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::{post, web, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::Client;
use super::body::JsonBody;
use super::errors::{ApiError, Problem};
use crate::policy::{input::parse_cost, LimitKey, PolicyName, ValidationError};
use crate::service::{Acquired, RateLimiter};

/// Ask for `cost` units of `policy` for the subject `key`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"policy": "api-per-user", "key": "user-42", "cost": 1}))]
pub struct AcquireRequest {
    /// Name of an existing policy.
    #[schema(example = "api-per-user")]
    pub policy: String,
    /// The subject being limited (a user id, an IP address, an API key…): any non-empty UTF-8
    /// string of at most 256 bytes.
    #[schema(example = "user-42", min_length = 1, max_length = 256)]
    pub key: String,
    /// Units to take, all or nothing; at least 1 and at most the policy's `limit` or `capacity`.
    /// Defaults to 1.
    #[schema(value_type = Option<u64>, minimum = 1, example = 1)]
    #[serde(default)]
    pub cost: Option<serde_json::Number>,
}

/// The decision. A denial is an ordinary answer (200 with `"allowed": false`), not an error.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "allowed": true, "policy": "api-per-user", "key": "user-42", "limit": 20, "remaining": 19,
    "reset_after_ms": 100, "retry_after_ms": 0, "degraded": false
}))]
pub struct AcquireResponse {
    /// Whether the units were granted.
    #[schema(example = true)]
    pub allowed: bool,
    /// The policy asked, echoed.
    #[schema(example = "api-per-user")]
    pub policy: String,
    /// The subject asked for, echoed unchanged.
    #[schema(example = "user-42")]
    pub key: String,
    /// The policy's `limit` (or a token bucket's `capacity`).
    #[schema(example = 20)]
    pub limit: u64,
    /// Units still available after this call; never negative.
    #[schema(example = 19)]
    pub remaining: u64,
    /// Milliseconds until the subject is back to its full quota, if nothing else arrives.
    #[schema(example = 100)]
    pub reset_after_ms: u64,
    /// 0 when allowed; otherwise milliseconds until the same request would be allowed, if
    /// nothing else arrives.
    #[schema(example = 0)]
    pub retry_after_ms: u64,
    /// True when the store could not be reached and the policy's fail mode (`open` or `local`)
    /// decided instead; an `open` answer was not counted.
    #[schema(example = false)]
    pub degraded: bool,
}

/// Acquire units from a policy for a subject.
///
/// Atomically takes `cost` units for `key` under `policy`, or takes nothing. Every decision
/// carries `RateLimit-Policy` and `RateLimit` headers (IETF httpapi draft-10 syntax); a denial
/// also carries `Retry-After` in whole seconds.
#[utoipa::path(
    tag = "acquire",
    security((), ("bearer" = [])),
    request_body = AcquireRequest,
    responses(
        (status = 200, description = "The decision, allowed or denied", body = AcquireResponse, headers(
            ("RateLimit-Policy" = String, description = "`\"<policy>\";q=<limit>;w=<window seconds>`"),
            ("RateLimit" = String, description = "`\"<policy>\";r=<remaining>;t=<seconds until reset>`"),
            ("Retry-After" = u64, description = "On a denial: seconds until the request would be allowed"),
            ("Policy-ETag" = String, description = "The version of the policy this instance decided with, as `GET /v1/policies/{name}` shows it in `ETag`: compare the two to see a change in force"),
        )),
        (status = 400, description = "Not a JSON object, or a field of the wrong JSON type", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`auth.client_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such policy", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A missing, unknown or out-of-range field: no `policy` or `key`, an invalid policy name, an empty or over-long key, a cost below 1 or above the policy's limit", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store failed and the policy's fail mode is `closed`", body = Problem, content_type = "application/problem+json"),
    )
)]
#[post("/v1/acquire")]
pub async fn acquire(
    _: Client,
    limiter: web::Data<RateLimiter>,
    body: JsonBody<AcquireRequest>,
) -> Result<HttpResponse, ApiError> {
    let JsonBody(req) = body;
    PolicyName::check(&req.policy).map_err(|r| ValidationError::invalid("policy", r))?;
    let key = LimitKey::parse(req.key).map_err(|r| ValidationError::invalid("key", r))?;
    let cost = match &req.cost {
        Some(n) => parse_cost(n)?,
        None => 1,
    };
    let acquired = limiter.acquire(&req.policy, &key, cost, None).await?;
    Ok(respond(acquired, key))
}

fn respond(a: Acquired, key: LimitKey) -> HttpResponse {
    let d = a.decision;
    let limit = a.policy.params.quota();
    let name = a.policy.name.as_str();
    let mut response = HttpResponse::Ok();

    let mut num = itoa::Buffer::new();
    let mut value = String::with_capacity(name.len() + 32);
    value.push('"');
    value.push_str(name);
    value.push_str("\";q=");
    value.push_str(num.format(limit));
    value.push_str(";w=");
    value.push_str(num.format(a.policy.limit.window_seconds()));
    push_header(&mut response, "ratelimit-policy", &value);

    value.clear();
    value.push('"');
    value.push_str(&a.etag.generation);
    value.push('.');
    value.push_str(num.format(a.etag.version));
    value.push('"');
    push_header(&mut response, "policy-etag", &value);

    // A degraded answer counted nothing, so there is no remaining quota to report.
    if !a.degraded {
        value.clear();
        value.push('"');
        value.push_str(name);
        value.push_str("\";r=");
        value.push_str(num.format(d.remaining));
        value.push_str(";t=");
        value.push_str(num.format(d.reset_after_us.div_ceil(1_000_000)));
        push_header(&mut response, "ratelimit", &value);
    }

    if !d.allowed {
        let seconds = d.retry_after_us.div_ceil(1_000_000).max(1);
        push_header(
            &mut response,
            header::RETRY_AFTER.as_str(),
            num.format(seconds),
        );
    }
    response.json(AcquireResponse {
        allowed: d.allowed,
        policy: name.to_owned(),
        key: key.into_string(),
        limit,
        remaining: d.remaining,
        reset_after_ms: d.reset_after_us.div_ceil(1_000),
        retry_after_ms: d.retry_after_us.div_ceil(1_000),
        degraded: a.degraded,
    })
}

fn push_header(response: &mut actix_web::HttpResponseBuilder, name: &'static str, value: &str) {
    // Policy names are restricted to header-safe characters and the rest are digits, so a value
    // is always valid; should that ever change, the header is left out rather than the request
    // failed.
    if let Ok(v) = HeaderValue::from_str(value) {
        response.insert_header((HeaderName::from_static(name), v));
    }
}
