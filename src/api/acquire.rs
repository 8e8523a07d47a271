//! `POST /v1/acquire`: one decision, as JSON and as the IETF `RateLimit` headers.

use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::{post, web, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::Client;
use super::body::JsonBody;
use super::errors::{ApiError, Problem};
use super::schema;
use crate::policy::{input::parse_cost, LimitKey, PolicyName, ValidationError};
use crate::service::{Acquired, DecidedBy, RateLimiter};

/// Ask for `cost` units of `policy` for the subject `key`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"policy": "api-per-user", "key": "user-42", "cost": 1}))]
pub struct AcquireRequest {
    /// Name of an existing policy.
    #[schema(schema_with = schema::policy_field)]
    pub policy: String,
    /// The subject being limited (a user id, an IP address, an API key…): any non-empty UTF-8
    /// string of at most 256 bytes.
    #[schema(example = "user-42", min_length = 1, max_length = 256)]
    pub key: String,
    /// Units to take, all or nothing: at least 1 and at most the quota of every limit of the
    /// policy. Defaults to 1.
    #[schema(schema_with = schema::cost_field)]
    #[serde(default)]
    pub cost: Option<serde_json::Number>,
}

/// The decision. A denial is an ordinary answer (200 with `"allowed": false`), not an error.
///
/// For a policy of several limits, the top-level `limit`, `remaining`, `reset_after_ms` and
/// `retry_after_ms` describe the binding limit: when denied, the denying limit with the longest
/// `retry_after_ms` (so that it is the time until the same request would be allowed); when
/// allowed, the limit with the fewest units remaining. `limits` then gives every limit and
/// `violated` the limits that denied.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "allowed": true, "policy": "api-per-user", "key": "user-42", "limit": 20, "remaining": 19,
    "reset_after_ms": 100, "retry_after_ms": 0, "degraded": false, "decided_by": "redis"
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
    /// The policy's `limit` (a token bucket's `capacity`, GCRA's `burst`); for several limits,
    /// the binding limit's.
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
    /// decided instead; an `open` answer was not counted. `decided_by` says which.
    #[schema(example = false)]
    pub degraded: bool,
    /// Who decided: `redis` or `embedded` (the store: a real decision), `fail_open` (the store
    /// could not be asked and the fail mode allowed without counting: not a real allow) or
    /// `fail_local` (this instance decided alone, limits per instance). Also in `Decided-By`.
    #[schema(example = "redis")]
    pub decided_by: DecidedBy,
    /// Policies of several limits only: each limit, in policy order. When the acquire was
    /// denied, nothing was taken from any limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<Vec<LimitState>>,
    /// Policies of several limits, on a denial only: the names of the limits that denied.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = json!(["daily"]))]
    pub violated: Option<Vec<String>>,
}

/// One limit of a policy of several, after an acquire.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"name": "daily", "limit": 10000, "remaining": 9990, "reset_after_ms": 3600000, "retry_after_ms": 0}))]
pub struct LimitState {
    /// The limit's name.
    #[schema(example = "daily")]
    pub name: String,
    /// Its quota: `limit`, `capacity` or `burst`.
    #[schema(example = 10000)]
    pub limit: u64,
    /// Units it still has; never negative.
    #[schema(example = 9990)]
    pub remaining: u64,
    /// Milliseconds until it is back to its full quota, if nothing else arrives.
    #[schema(example = 3600000)]
    pub reset_after_ms: u64,
    /// 0 when it admitted the cost; otherwise milliseconds until it would.
    #[schema(example = 0)]
    pub retry_after_ms: u64,
}

/// Acquire units from a policy for a subject.
///
/// Atomically takes `cost` units for `key` under `policy`, or takes nothing: for a policy of
/// several limits, only if every limit admits `cost`, and then from every one. Every decision
/// carries `RateLimit-Policy` and `RateLimit` headers (IETF httpapi draft-10/-11 syntax, one
/// list item per limit, named `"<policy>"` for a policy of one limit and `"<policy>/<limit>"`
/// for each limit of a policy of several); a denial also carries `Retry-After` in whole
/// seconds, from the binding limit.
#[utoipa::path(
    tag = "acquire",
    security((), ("bearer" = [])),
    request_body = AcquireRequest,
    responses(
        (status = 200, description = "The decision, allowed or denied", body = AcquireResponse, headers(
            ("RateLimit-Policy" = String, description = "`\"<policy>\";q=<limit>;w=<window seconds>`; for several limits one item per limit, `\"<policy>/<limit>\";q=…;w=…`, comma-separated, in policy order"),
            ("RateLimit" = String, description = "`\"<policy>\";r=<remaining>;t=<seconds until reset>`; for several limits one item per limit, named as in `RateLimit-Policy`"),
            ("Retry-After" = u64, description = "On a denial: seconds until the request would be allowed"),
            ("Decided-By" = String, description = "Who decided, as the body's `decided_by`: `redis`, `embedded`, `fail_open` or `fail_local`"),
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
    let policy = &a.policy;
    let verdict = &a.verdict;
    let d = verdict.decision();
    let binding = verdict.binding();
    let limit = policy.limits.get(binding).map_or(0, |l| l.params.quota());
    let name = policy.name.as_str();
    let composite = policy.is_composite();
    let mut response = HttpResponse::Ok();

    // One list item per limit: `"<policy>"`, or `"<policy>/<limit>"` for each of several
    // (policy and limit names hold no `/`, so the two never meet).
    let mut num = itoa::Buffer::new();
    let mut value = String::with_capacity(name.len() + 32);
    let item = |value: &mut String, limit: &str| {
        value.push('"');
        value.push_str(name);
        if composite {
            value.push('/');
            value.push_str(limit);
        }
        value.push('"');
    };
    for (i, l) in policy.limits.iter().enumerate() {
        if i > 0 {
            value.push_str(", ");
        }
        item(&mut value, l.name.as_str());
        value.push_str(";q=");
        value.push_str(num.format(l.params.quota()));
        value.push_str(";w=");
        value.push_str(num.format(l.window_seconds()));
    }
    push_header(&mut response, "ratelimit-policy", &value);

    value.clear();
    value.push('"');
    value.push_str(&a.etag.generation);
    value.push('.');
    value.push_str(num.format(a.etag.version));
    value.push('"');
    push_header(&mut response, "policy-etag", &value);
    push_header(&mut response, "decided-by", a.decided_by.as_str());

    // A degraded answer counted nothing, so there is no remaining quota to report.
    if !a.degraded {
        value.clear();
        for (i, (l, ld)) in policy.limits.iter().zip(verdict.limits()).enumerate() {
            if i > 0 {
                value.push_str(", ");
            }
            item(&mut value, l.name.as_str());
            value.push_str(";r=");
            value.push_str(num.format(ld.remaining));
            value.push_str(";t=");
            value.push_str(num.format(ld.reset_after_us.div_ceil(1_000_000)));
        }
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
    let (limits, violated) = if composite {
        let states = policy
            .limits
            .iter()
            .zip(verdict.limits())
            .map(|(l, ld)| LimitState {
                name: l.name.to_string(),
                limit: l.params.quota(),
                remaining: ld.remaining,
                reset_after_ms: ld.reset_after_us.div_ceil(1_000),
                retry_after_ms: ld.retry_after_us.div_ceil(1_000),
            })
            .collect();
        let violated = (!d.allowed).then(|| {
            policy
                .limits
                .iter()
                .zip(verdict.limits())
                .filter(|(_, ld)| !ld.allowed)
                .map(|(l, _)| l.name.to_string())
                .collect()
        });
        (Some(states), violated)
    } else {
        (None, None)
    };
    response.json(AcquireResponse {
        allowed: d.allowed,
        policy: name.to_owned(),
        key: key.into_string(),
        limit,
        remaining: d.remaining,
        reset_after_ms: d.reset_after_us.div_ceil(1_000),
        retry_after_ms: d.retry_after_us.div_ceil(1_000),
        degraded: a.degraded,
        decided_by: a.decided_by,
        limits,
        violated,
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
