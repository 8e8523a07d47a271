//! The decision endpoints of rate policies: `POST /v1/acquire`, `/v1/peek`, `/v1/report` and
//! `/v1/refund`, each answered as JSON and as the IETF `RateLimit` headers, and `POST
//! /v1/reset`. A concurrency policy is refused with 422 naming `policy` (its endpoints are in
//! `leases`), except by reset, which ends the subject's leases.

use std::sync::Arc;

use actix_web::http::header;
use actix_web::{post, web, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::{Admin, Client, ResetAccess, Settle};
use super::body::JsonBody;
use super::errors::{ApiError, Problem};
use super::reply::{
    fixed_header, Reply, DECIDED_BY, POLICY_ETAG, RATELIMIT, RATELIMIT_OVERRIDE, RATELIMIT_POLICY,
};
use super::schema;
use crate::fields;
use crate::limiter::{calendar, Op, MAX_UNITS};
use crate::policy::overrides::MatchKind;
use crate::policy::{
    input::parse_cost, input::parse_max_wait, Limit, LimitKey, PolicyName, Rate, ValidationError,
};
use crate::service::cache::Applied;
use crate::service::ticket::MAX_TICKET_BYTES;
use crate::service::{Acquired, Ask, DecidedBy, RateLimiter, Ticket};

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
    /// Acquire only: the longest wait accepted, in milliseconds (0 to 3600000). When `cost` fits
    /// only later, but within this wait, it is booked now for that later time (a reservation)
    /// and the answer is allowed, with `delay_ms` and `act_at`; beyond it, denied as without it.
    #[schema(schema_with = schema::max_wait_field)]
    #[serde(default)]
    pub max_wait_ms: Option<serde_json::Number>,
}

/// Look at what an acquire of `cost` units of `policy` for `key` would answer now.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"policy": "api-per-user", "key": "user-42", "cost": 1}))]
pub struct PeekRequest {
    /// Name of an existing policy.
    #[schema(schema_with = schema::policy_field)]
    pub policy: String,
    /// The subject, as for an acquire.
    #[schema(example = "user-42", min_length = 1, max_length = 256)]
    pub key: String,
    /// Units the acquire would ask for, as for an acquire. Defaults to 1.
    #[schema(schema_with = schema::cost_field)]
    #[serde(default)]
    pub cost: Option<serde_json::Number>,
}

/// Report `cost` units used by `key` under `policy`, taken whether or not they fit.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"policy": "llm-tokens", "key": "team-7", "cost": 1800}))]
pub struct ReportRequest {
    /// Name of an existing policy.
    #[schema(schema_with = schema::policy_field)]
    pub policy: String,
    /// The subject, as for an acquire.
    #[schema(example = "team-7", min_length = 1, max_length = 256)]
    pub key: String,
    /// Units used: at least 1 and at most 10^9; may exceed the policy's quota.
    #[schema(schema_with = schema::report_cost_field)]
    pub cost: serde_json::Number,
}

/// Give back up to `cost` units to `key` under `policy`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"policy": "llm-tokens", "key": "team-7", "cost": 700, "ticket": "2.1.5f0d2c41a9e3b7c8.2000.1764460860000000.3e4b1f9a07c2d85e6a91b0c4f7d2e813"}))]
pub struct RefundRequest {
    /// Name of an existing policy.
    #[schema(schema_with = schema::policy_field)]
    pub policy: String,
    /// The subject, as for an acquire.
    #[schema(example = "team-7", min_length = 1, max_length = 256)]
    pub key: String,
    /// Units to give back: at least 1 and at most 10^9 (and at most the ticket's units).
    #[schema(schema_with = schema::refund_cost_field)]
    pub cost: serde_json::Number,
    /// The `ticket` of the acquire or report that took the units (required unless
    /// `limits.ticketless_refunds` is on): the refund then lands only where they were taken
    /// (their window, log entries, or the part of a bucket's or GCRA's level that time has not
    /// yet refilled), does nothing once that is gone, and never gives back more in all than the
    /// ticket took, however often it is sent. Without it (when allowed), the refund applies to
    /// the subject's current state.
    #[schema(
        example = "2.1.5f0d2c41a9e3b7c8.2000.1764460860000000.3e4b1f9a07c2d85e6a91b0c4f7d2e813",
        min_length = 1,
        max_length = 256
    )]
    #[serde(default)]
    pub ticket: Option<String>,
}

/// A subject of a policy whose state to delete.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"policy": "login-failures", "key": "user-42"}))]
pub struct ResetRequest {
    /// Name of an existing policy.
    #[schema(schema_with = schema::policy_field)]
    pub policy: String,
    /// The subject, as for an acquire.
    #[schema(example = "user-42", min_length = 1, max_length = 256)]
    pub key: String,
}

/// The decision. A denial is an ordinary answer (200 with `"allowed": false`), not an error.
///
/// For a policy of several limits, the top-level `limit`, `remaining`, `reset_after_ms` and
/// `retry_after_ms` describe the binding limit: when denied, the denying limit with the longest
/// `retry_after_ms` (so that it is the time until the same request would be allowed); when
/// allowed, the limit with the fewest units remaining. `limits` then gives every limit and
/// `violated` the limits that denied.
///
/// A peek answers as the acquire would have; a report and a refund are always allowed, and
/// their `retry_after_ms` is the time until one unit is available again (a subject in debt).
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "allowed": true, "policy": "api-per-user", "key": "user-42", "limit": 20, "remaining": 19,
    "reset_after_ms": 100, "resets_at": "2026-12-04T14:35:37.1Z", "retry_after_ms": 0,
    "degraded": false, "decided_by": "redis"
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
    /// The instant `reset_after_ms` points at, in RFC 3339: for a calendar limit with the UTC
    /// offset of its time zone (`2026-12-05T00:00:00+01:00`, the next midnight in Berlin), else
    /// in UTC. The decision's time (Redis's clock) plus the exact reset.
    #[schema(example = "2026-12-04T14:35:37.1Z")]
    pub resets_at: String,
    /// 0 when allowed; otherwise milliseconds until the same request would be allowed, if
    /// nothing else arrives.
    #[schema(example = 0)]
    pub retry_after_ms: u64,
    /// An allowed acquire with `max_wait_ms` (a reservation) only: milliseconds to wait before
    /// acting (rounded up), 0 when the cost fit at once. The units are booked for then, on
    /// every limit; a refund with the `ticket` before `act_at` cancels the booking. 0 in shadow
    /// mode and in a `fail_open` answer, which hold nobody back.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = json!(null))]
    pub delay_ms: Option<u64>,
    /// With `delay_ms`: the instant to act at, in RFC 3339 (UTC), the decision's time plus the
    /// exact delay.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = json!(null))]
    pub act_at: Option<String>,
    /// True when the store could not be reached and the policy's fail mode (`open` or `local`)
    /// decided instead; an `open` answer was not counted. `decided_by` says which.
    #[schema(example = false)]
    pub degraded: bool,
    /// Who decided: `redis` or `embedded` (the store: a real decision), `local_cache` (a denial
    /// Redis decided for this subject, repeated by this instance until Redis's retry time:
    /// exact), `fail_open` (the store could not be asked and the fail mode allowed without
    /// counting: not a real allow), `fail_local` (this instance decided alone, limits per
    /// instance) or `override` (an `unlimited` or `block` override of the subject, without the
    /// store). Also in `Decided-By`.
    #[schema(example = "redis")]
    pub decided_by: DecidedBy,
    /// Policies of several limits only: each limit, in policy order. When the acquire was
    /// denied, nothing was taken from any limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<Vec<LimitState>>,
    /// Policies of several limits, on a denial only (in shadow mode: on a would-be denial):
    /// the names of the limits that denied.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = json!(["daily"]))]
    pub violated: Option<Vec<String>>,
    /// An acquire that took units, or a report: an opaque, signed ticket for `POST
    /// /v1/refund`, which then gives units back only where these were taken, and at most these
    /// units in all. Absent when nothing was taken (a denial, a peek, a refund, a `fail_open`
    /// answer).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "ticket_text"
    )]
    #[schema(value_type = Option<String>, example = "2.1.0c3f9b1e2d4a6870.1.1764460800100000.9b2e4d61f0a7c3851e6d2b9f04a7c5e3")]
    pub ticket: Option<Ticket>,
    /// A refund only: units given back (to every limit, the fewest over the limits; each
    /// limit's own count is in `limits`). Never more than asked, than the ticket's units, or
    /// than the subject had in use.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = 700)]
    pub refunded: Option<u64>,
    /// Present, and true, when the policy is in shadow mode (its `mode`, or `limits.shadow`):
    /// the answer is allowed whatever enforcement decided, and `would_allow`,
    /// `retry_after_ms` and `violated` say what enforcement answered. A would-be denial took
    /// nothing, exactly as an enforced denial.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = json!(null))]
    pub shadow: Option<bool>,
    /// Shadow mode only: whether enforcement would have allowed.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = json!(null))]
    pub would_allow: Option<bool>,
    /// The override that applied to the subject, if one did (also in `Ratelimit-Override`):
    /// the answer's limits are those it set. `GET /v1/policies/{name}/resolve?key=` explains it.
    #[serde(
        rename = "override",
        skip_serializing_if = "Option::is_none",
        serialize_with = "applied_override"
    )]
    #[schema(value_type = Option<AppliedOverride>)]
    pub applied: Option<AppliedAnswer>,
    /// The tier the subject was decided with, when an override gave it one.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = json!(null))]
    pub tier: Option<String>,
}

/// The override that applied, and the subject's key when the override's match is that key.
#[derive(Debug)]
pub struct AppliedAnswer {
    applied: Arc<Applied>,
    /// An exact match's text is the key itself: written from the request's copy, which the
    /// decision has just read, rather than from the override's own memory.
    exact: Option<String>,
}

impl AppliedAnswer {
    fn new(applied: Arc<Applied>, key: &LimitKey) -> Self {
        let exact = (applied.kind == MatchKind::Exact).then(|| key.as_str().to_owned());
        Self { applied, exact }
    }
}

/// The override that applied, as `{"id", "match"}`, written straight from it.
fn applied_override<S: serde::Serializer>(
    applied: &Option<AppliedAnswer>,
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    struct Exact<'a>(&'a str);
    impl serde::Serialize for Exact<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut map = s.serialize_map(Some(1))?;
            map.serialize_entry("key", self.0)?;
            map.end()
        }
    }
    match applied {
        Some(a) => {
            let mut map = s.serialize_map(Some(2))?;
            map.serialize_entry("id", a.applied.id.as_str())?;
            match &a.exact {
                Some(key) => map.serialize_entry("match", &Exact(key))?,
                None => map.serialize_entry("match", &a.applied.over.matches)?,
            }
            map.end()
        }
        None => s.serialize_none(),
    }
}

/// The override that applied to a decision (its schema: the answer writes it from the override).
#[allow(dead_code)]
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"id": "3f9b1e2d4a6870c1", "match": {"key": "acme-corp"}}))]
pub struct AppliedOverride {
    /// Its id, under `/v1/policies/{name}/overrides/{id}`.
    pub id: String,
    /// What it matches: `{"key"}`, `{"prefix"}` or `{"cidr"}`.
    #[serde(rename = "match")]
    #[schema(value_type = Object)]
    pub matches: serde_json::Value,
}

/// A ticket as its text, written straight into the body rather than through a `String`.
fn ticket_text<S: serde::Serializer>(ticket: &Option<Ticket>, s: S) -> Result<S::Ok, S::Error> {
    match ticket {
        Some(t) => s.collect_str(t),
        None => s.serialize_none(),
    }
}

/// One limit of a policy of several, after an acquire.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"name": "daily", "limit": 10000, "remaining": 9990, "reset_after_ms": 3600000, "resets_at": "2026-12-05T00:00:00+01:00", "retry_after_ms": 0}))]
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
    /// The instant `reset_after_ms` points at, in RFC 3339 (a calendar limit's with the UTC
    /// offset of its time zone).
    #[schema(example = "2026-12-05T00:00:00+01:00")]
    pub resets_at: String,
    /// 0 when it admitted the cost; otherwise milliseconds until it would.
    #[schema(example = 0)]
    pub retry_after_ms: u64,
    /// A report: units it recorded; a refund: units it gave back. Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = json!(null))]
    pub units: Option<u64>,
}

/// The headers of every decision answer, as the OpenAPI spec lists them: name, description, and
/// whether the value is an integer. Added to the 200 answer of each decision operation by
/// [`document_headers`], in one place rather than written out on each handler.
const HEADERS: [(&str, &str, bool); 6] = [
    ("RateLimit-Policy", "`\"<policy>\";q=<limit>;w=<window seconds>`; for several limits one item per limit, `\"<policy>/<limit>\";q=…;w=…`, comma-separated, in policy order", false),
    ("RateLimit", "`\"<policy>\";r=<remaining>;t=<seconds until reset>`; for several limits one item per limit, named as in `RateLimit-Policy`. Absent on a `fail_open` answer", false),
    ("Retry-After", "On a denial (not in shadow mode): seconds until the request would be allowed; absent for a `block` override without an expiry", true),
    ("Decided-By", "Who decided, as the body's `decided_by`: `redis`, `embedded`, `local_cache`, `fail_open`, `fail_local` or `override`", false),
    ("Ratelimit-Override", "When an override applied to the subject: `id=<id>;match=<exact|prefix|cidr>[;tier=<tier>]`, as the body's `override` and `tier`", false),
    ("Policy-ETag", "The version of the policy this instance decided with, as `GET /v1/policies/{name}` shows it in `ETag`: compare the two to see a change in force", false),
];

/// Adds [`HEADERS`] to the 200 answers of `/v1/acquire` and `/v1/peek`, and all but
/// `Retry-After` to those of `/v1/report` and `/v1/refund`, which are never denials.
pub fn document_headers(spec: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    use utoipa::openapi::{header::HeaderBuilder, RefOr};
    for (path, denies) in [
        ("/v1/acquire", true),
        ("/v1/peek", true),
        ("/v1/report", false),
        ("/v1/refund", false),
    ] {
        let ok = spec
            .paths
            .paths
            .get_mut(path)
            .and_then(|item| item.post.as_mut())
            .and_then(|op| op.responses.responses.get_mut("200"));
        let Some(RefOr::T(ok)) = ok else { continue };
        for (name, description, integer) in HEADERS {
            if name == "Retry-After" && !denies {
                continue;
            }
            let schema = if integer {
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
                        utoipa::openapi::KnownFormat::Int64,
                    )))
                    .minimum(Some(0))
            } else {
                ObjectBuilder::new().schema_type(Type::String)
            };
            let header = HeaderBuilder::new()
                .schema(Some(schema))
                .description(Some(description))
                .build();
            ok.headers.insert(name.to_owned(), RefOr::T(header));
        }
    }
}

/// Acquire units from a policy for a subject.
///
/// Atomically takes `cost` units for `key` under `policy`, or takes nothing: for a policy of
/// several limits, only if every limit admits `cost`, and then from every one. Every decision
/// carries `RateLimit-Policy` and `RateLimit` headers (IETF httpapi draft-10/-11 syntax, one
/// list item per limit, named `"<policy>"` for a policy of one limit and `"<policy>/<limit>"`
/// for each limit of a policy of several); a denial also carries `Retry-After` in whole
/// seconds, from the binding limit. An allowed acquire returns a `ticket` for `POST
/// /v1/refund`. A policy in shadow mode answers every acquire as allowed, with what enforcement
/// decided beside it.
#[utoipa::path(
    tag = "decisions",
    security((), ("bearer" = [])),
    request_body = AcquireRequest,
    responses(
        (status = 200, description = "The decision, allowed or denied", body = AcquireResponse),
        (status = 400, description = "Not a JSON object, or a field of the wrong JSON type", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`auth.client_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such policy", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A missing, unknown or out-of-range field: no `policy` or `key`, an invalid policy name, an empty or over-long key, a cost below 1 or above the policy's limit, a concurrency policy (`policy`: take a lease instead)", body = Problem, content_type = "application/problem+json"),
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
    let (key, cost) = subject_and_cost(&req.policy, &req.key, req.cost.as_ref())?;
    let acquired = match max_wait_ms(req.max_wait_ms.as_ref())? {
        0 => limiter.acquire(&req.policy, &key, cost).await?,
        wait => {
            let ask = Ask::Reserve {
                cost,
                max_wait_us: wait * 1_000,
            };
            limiter.decide(&req.policy, &key, ask).await?
        }
    };
    Ok(respond(acquired, key, cost))
}

/// Look at a subject without spending anything.
///
/// Answers exactly what `POST /v1/acquire` with the same body would answer now (body and
/// headers, `Retry-After` included), and writes nothing: no state, no expiry (on Redis, a
/// read-only script call). A peek returns no `ticket`.
#[utoipa::path(
    tag = "decisions",
    security((), ("bearer" = [])),
    request_body = PeekRequest,
    responses(
        (status = 200, description = "What an acquire would answer now", body = AcquireResponse),
        (status = 400, description = "Not a JSON object, or a field of the wrong JSON type", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`auth.client_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such policy", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A missing, unknown or out-of-range field, as for an acquire", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store failed and the policy's fail mode is `closed`", body = Problem, content_type = "application/problem+json"),
    )
)]
#[post("/v1/peek")]
pub async fn peek(
    _: Client,
    limiter: web::Data<RateLimiter>,
    body: JsonBody<PeekRequest>,
) -> Result<HttpResponse, ApiError> {
    let JsonBody(req) = body;
    let (key, cost) = subject_and_cost(&req.policy, &req.key, req.cost.as_ref())?;
    let peeked = limiter
        .decide(&req.policy, &key, Ask::Peek { cost })
        .await?;
    Ok(respond(peeked, key, cost))
}

/// Report units used, whether or not they fit.
///
/// Takes `cost` units from every limit of the policy unconditionally, for costs known only
/// afterwards (tokens of an LLM response, bytes sent): the subject may go into debt, and later
/// acquires are denied until time has paid it back, with `retry_after_ms` saying exactly when.
/// A subject's usage is bounded at twice its quota: units past that are not recorded (each
/// limit's `units` says how many were). Always `allowed`; `remaining` is never negative, and
/// `retry_after_ms` is the time until one unit is available again. Returns a `ticket`. Needs a
/// settle token when `auth.settle_tokens` is set.
#[utoipa::path(
    tag = "decisions",
    security((), ("bearer" = [])),
    request_body = ReportRequest,
    responses(
        (status = 200, description = "The subject after the report", body = AcquireResponse),
        (status = 400, description = "Not a JSON object, or a field of the wrong JSON type", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "The request lacks a settle token (`auth.settle_tokens`), or a client token when only `auth.client_tokens` is set", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such policy", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A missing, unknown or out-of-range field: no `policy`, `key` or `cost`, a cost below 1 or above 10^9, a concurrency policy (`policy`)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store failed and the policy's fail mode is `closed`", body = Problem, content_type = "application/problem+json"),
    )
)]
#[post("/v1/report")]
pub async fn report(
    _: Settle,
    limiter: web::Data<RateLimiter>,
    body: JsonBody<ReportRequest>,
) -> Result<HttpResponse, ApiError> {
    let JsonBody(req) = body;
    let key = subject(&req.policy, req.key)?;
    let cost = units(&req.cost)?;
    let reported = limiter
        .decide(&req.policy, &key, Ask::Report { cost })
        .await?;
    Ok(respond(reported, key, cost))
}

/// Give units back.
///
/// Gives up to `cost` units back to every limit of the policy: never above its full quota,
/// never to a subject that has no state (nothing is created), and never moving an expiry. With
/// the `ticket` of the acquire or report that took them, only where they were taken, and
/// nothing once that window (or log entry, or unrefilled part of a bucket) is gone; a ticket
/// from before a change to the number of the policy's limits gives nothing back. A ticket gives
/// back at most its units in all, however often it is sent. Without a ticket (only with
/// `limits.ticketless_refunds`), up to `cost` of whatever the subject has in use. Needs a
/// settle token when `auth.settle_tokens` is set. `refunded` says how many units were given
/// back. Always `allowed`.
#[utoipa::path(
    tag = "decisions",
    security((), ("bearer" = [])),
    request_body = RefundRequest,
    responses(
        (status = 200, description = "The subject after the refund, and how many units it got back", body = AcquireResponse),
        (status = 400, description = "Not a JSON object, or a field of the wrong JSON type", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "The request lacks a settle token (`auth.settle_tokens`), or a client token when only `auth.client_tokens` is set", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such policy", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A missing, unknown or out-of-range field: no `policy`, `key` or `cost`, a cost below 1 or above 10^9, no `ticket` while `limits.ticketless_refunds` is off, a `ticket` this service did not issue, issued for another policy or key, or signed with a key rotated out, a concurrency policy (`policy`)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store failed and the policy's fail mode is `closed`", body = Problem, content_type = "application/problem+json"),
    )
)]
#[post("/v1/refund")]
pub async fn refund(
    _: Settle,
    limiter: web::Data<RateLimiter>,
    body: JsonBody<RefundRequest>,
) -> Result<HttpResponse, ApiError> {
    let JsonBody(req) = body;
    let key = subject(&req.policy, req.key)?;
    let cost = units(&req.cost)?;
    if let Some(t) = &req.ticket {
        if t.is_empty() || t.len() > MAX_TICKET_BYTES {
            return Err(ValidationError::invalid(
                "ticket",
                format!("must be 1 to {MAX_TICKET_BYTES} bytes"),
            )
            .into());
        }
    }
    let refunded = limiter
        .decide(
            &req.policy,
            &key,
            Ask::Refund {
                cost,
                ticket: req.ticket.as_deref(),
            },
        )
        .await?;
    Ok(respond(refunded, key, cost))
}

/// Delete a subject's state.
///
/// Deletes the state of `key` for every limit of `policy`, atomically: the subject starts
/// afresh, with its full quota. For a concurrency policy, ends every lease of `key` (a support
/// tool for a stuck holder): their slots are free at once, and their ids are unknown leases from
/// then on (a renewal is a 404). Every other subject and policy is untouched. Needs an admin
/// token when `auth.admin_tokens` is set (otherwise a settle token when `auth.settle_tokens` is,
/// otherwise a client token when `auth.client_tokens` is). Not a decision: a store that cannot
/// be reached is a 503 whatever the fail mode.
#[utoipa::path(
    tag = "decisions",
    security((), ("bearer" = [])),
    request_body = ResetRequest,
    responses(
        (status = 204, description = "The subject's state, or its leases, are gone (or there were none)"),
        (status = 400, description = "Not a JSON object, or a field of the wrong JSON type", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "The request lacks an admin token (`auth.admin_tokens`), or without admin tokens a settle token (`auth.settle_tokens`), or a client token when only `auth.client_tokens` is set", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such policy", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A missing, unknown or out-of-range field: no `policy` or `key`, an invalid policy name, an empty or over-long key", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store could not be reached", body = Problem, content_type = "application/problem+json"),
    )
)]
#[post("/v1/reset")]
pub async fn reset(
    _: ResetAccess,
    limiter: web::Data<RateLimiter>,
    body: JsonBody<ResetRequest>,
) -> Result<HttpResponse, ApiError> {
    let JsonBody(req) = body;
    let key = subject(&req.policy, req.key)?;
    limiter.reset(&req.policy, &key).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// The ring of ticket keys after a rotation.
#[derive(Debug, Serialize, ToSchema)]
pub struct RotatedKeys {
    /// The id of the key that signs tickets from now on; tickets name it as their second field.
    /// The key before it still verifies; the one before that no longer does.
    #[schema(example = 2)]
    pub key_id: u32,
}

/// Rotate the keys that sign tickets.
///
/// A fresh random key signs every ticket from now on; the current key becomes the previous one
/// and still verifies its tickets; the previous one is dropped, and tickets it signed are
/// refused (422). Every instance reads the new ring within `redis.policy_refresh_ms`, and at
/// once when it meets a ticket of a key it does not hold. Rotate no more often than the tickets
/// you still mean to refund live (two rotations end every ticket signed before the first).
/// Needs an admin token when `auth.admin_tokens` is set.
#[utoipa::path(
    tag = "decisions",
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The keys are rotated", body = RotatedKeys),
        (status = 401, description = "`auth.admin_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store could not be reached", body = Problem, content_type = "application/problem+json"),
    )
)]
#[post("/v1/tickets/rotate")]
pub async fn rotate_ticket_keys(
    _: Admin,
    limiter: web::Data<RateLimiter>,
) -> Result<HttpResponse, ApiError> {
    let key_id = limiter.rotate_ticket_keys().await?;
    Ok(HttpResponse::Ok().json(RotatedKeys { key_id }))
}

/// The checked policy name's key.
fn subject(policy: &str, key: String) -> Result<LimitKey, ApiError> {
    PolicyName::check(policy).map_err(|r| ValidationError::invalid("policy", r))?;
    Ok(LimitKey::parse(key).map_err(|r| ValidationError::invalid("key", r))?)
}

/// An acquire's or a peek's subject and cost (1 when left out).
fn subject_and_cost(
    policy: &str,
    key: &str,
    cost: Option<&serde_json::Number>,
) -> Result<(LimitKey, u64), ApiError> {
    let key = subject(policy, key.to_owned())?;
    let cost = match cost {
        Some(n) => parse_cost(n)?,
        None => 1,
    };
    Ok((key, cost))
}

/// An acquire's `max_wait_ms`: an integer from 0 to one hour (`limiter::reservation::LONGEST_WAIT_MS`); 0 when left out (an
/// acquire that accepts no wait).
fn max_wait_ms(n: Option<&serde_json::Number>) -> Result<u64, ApiError> {
    Ok(n.map(parse_max_wait).transpose()?.unwrap_or(0))
}

/// A report's or a refund's `cost`: 1 to [`MAX_UNITS`].
fn units(n: &serde_json::Number) -> Result<u64, ApiError> {
    let cost = parse_cost(n)?;
    if cost > MAX_UNITS {
        return Err(
            ValidationError::invalid("cost", format!("must be at most {MAX_UNITS}")).into(),
        );
    }
    Ok(cost)
}

/// A `resets_at`: the decision's time `at_us` plus the reset, in the time zone of `limit` when
/// it is a calendar limit, else in UTC.
fn resets_at(limit: Option<&Limit>, at_us: u64, reset_after_us: u64) -> String {
    let at = i64::try_from(at_us.saturating_add(reset_after_us)).unwrap_or(i64::MAX);
    calendar::rfc3339(at, limit.and_then(Limit::calendar_of))
}

fn respond(a: Acquired, key: LimitKey, cost: u64) -> HttpResponse {
    // On the request's span (`api::span`), when traces are exported.
    crate::trace::record_decision(&tracing::Span::current(), &a, &key, cost);
    let policy = &a.policy;
    let verdict = &a.verdict;
    let d = verdict.decision();
    let binding = verdict.binding();
    // A decision's policy is a rate policy: `decide` refuses the others. The limits are those
    // the subject was decided with: an override's, or the policy's.
    let rate_limits = a.limits();
    let limit = rate_limits.get(binding).map_or(0, |l| l.params.quota());
    let name = policy.name.as_str();
    let composite = policy.rate().is_some_and(Rate::is_composite);
    let allowed = a.allowed();
    let moves = matches!(a.op, Op::Report | Op::Refund);
    let mut response = HttpResponse::Ok();
    // Header values and body, with room for the usual answer (the key echoed, a ticket).
    let mut reply = Reply::with_capacity(384 + 3 * name.len() + key.as_str().len());

    fields::ratelimit_policy(&mut reply, [&a]);
    reply.header(&mut response, RATELIMIT_POLICY);

    reply.push_etag(&a.etag).header(&mut response, POLICY_ETAG);
    fixed_header(&mut response, DECIDED_BY, a.decided_by.as_str());

    if fields::ratelimit(&mut reply, [&a]) {
        reply.header(&mut response, RATELIMIT);
    }

    if a.applied.is_some() {
        fields::override_field(&mut reply, &a);
        reply.header(&mut response, RATELIMIT_OVERRIDE);
    }
    // A block without an expiry has no time to wait for.
    let forever = a.decided_by == DecidedBy::Override && d.retry_after_us == 0;
    if !allowed && !forever {
        fields::retry_after(&mut reply, d.retry_after_us);
        reply.header(&mut response, header::RETRY_AFTER);
    }
    let (limits, violated) = if composite {
        let states = rate_limits
            .iter()
            .zip(verdict.limits())
            .zip(verdict.units())
            .map(|((l, ld), units)| LimitState {
                name: l.name.to_string(),
                limit: l.params.quota(),
                remaining: ld.remaining,
                reset_after_ms: ld.reset_after_us.div_ceil(1_000),
                resets_at: resets_at(Some(l), verdict.at_us, ld.reset_after_us),
                retry_after_ms: ld.retry_after_us.div_ceil(1_000),
                units: moves.then_some(*units),
            })
            .collect();
        let violated = (!verdict.allowed).then(|| {
            rate_limits
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
    reply.json(
        response,
        &AcquireResponse {
            allowed,
            policy: name.to_owned(),
            limit,
            remaining: d.remaining,
            reset_after_ms: d.reset_after_us.div_ceil(1_000),
            resets_at: resets_at(rate_limits.get(binding), verdict.at_us, d.reset_after_us),
            retry_after_ms: d.retry_after_us.div_ceil(1_000),
            delay_ms: a.delay_us.map(|us| us.div_ceil(1_000)),
            act_at: a.delay_us.map(|us| resets_at(None, verdict.at_us, us)),
            degraded: a.degraded,
            decided_by: a.decided_by,
            limits,
            violated,
            ticket: a.ticket,
            refunded: (a.op == Op::Refund).then(|| a.refunded()),
            shadow: a.shadow.then_some(true),
            would_allow: a.shadow.then_some(verdict.allowed),
            tier: a.tier().map(str::to_owned),
            applied: a.applied.map(|applied| AppliedAnswer::new(applied, &key)),
            key: key.into_string(),
        },
    )
}
