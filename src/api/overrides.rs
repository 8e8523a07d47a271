//! `/v1/policies/{name}/overrides` and `/v1/policies/{name}/resolve`: per-subject limits managed
//! at run time, and the explanation of what applies to a subject.

use actix_web::http::header;
use actix_web::{delete, get, post, put, web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::auth::Admin;
use super::body::JsonBody;
use super::errors::{ApiError, Problem};
use super::policies::{condition, list_page, path_name, Condition, ListQuery};
use super::schema::{DeleteHeaders, OverrideAnswer, OverrideBody, ReplaceHeaders};
use crate::policy::overrides::{rfc3339, Override, OverrideId, Precedence};
use crate::policy::{LimitKey, PolicyName, ValidationError};
use crate::service::cache::Effect;
use crate::service::overrides::Resolution;
use crate::service::policies::etag_header;
use crate::service::{RateLimiter, ServiceError};
use crate::store::Precondition;

/// `{name}` and `{id}` of `/v1/policies/{name}/overrides/{id}`; its spec is in `schema`.
#[derive(Debug, Deserialize)]
pub struct OverridePath {
    pub name: String,
    pub id: String,
}

/// `{name}` of `/v1/policies/{name}/overrides`.
#[derive(Debug, Deserialize)]
pub struct PolicyOnly {
    pub name: String,
}

/// One page of a policy's overrides, sorted by id.
#[derive(Debug, Serialize, ToSchema)]
pub struct OverrideList {
    /// Overrides sorted by id, at most `limit`; expired ones included until they are deleted.
    #[schema(value_type = Vec<OverrideAnswer>)]
    pub overrides: Vec<Value>,
    /// Pass as `cursor` to get the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "3f9b1e2d4a6870c1")]
    pub next_cursor: Option<String>,
}

/// The query of `GET /v1/policies/{name}/resolve`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ResolveQuery {
    /// The subject key to explain (1 to 256 bytes).
    #[param(
        required = true,
        example = "acme-corp",
        min_length = 1,
        max_length = 256
    )]
    pub key: Option<String>,
}

/// What applies to one subject, and why.
#[derive(Debug, Serialize, ToSchema)]
pub struct ResolveAnswer {
    #[schema(example = "api")]
    pub policy: String,
    #[schema(example = "acme-corp")]
    pub key: String,
    /// The time of the answer (RFC 3339): overrides that expire later still apply.
    #[schema(example = "2026-12-01T10:00:00Z")]
    pub at: String,
    /// What decides the subject: `policy` (no override applies), `tier`, `limits`, `unlimited`
    /// or `block`.
    #[schema(example = "tier")]
    pub decided_by: &'static str,
    /// The override that applies, if one does.
    #[serde(rename = "override", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<OverrideAnswer>)]
    pub applied: Option<Value>,
    /// The tier the subject is decided with, if the override gives one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// The limits the subject is decided with, as a policy's `limits` read (absent under
    /// `unlimited` and `block`, which consult no limit).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub limits: Option<Vec<Value>>,
    /// Every override matching the key, by precedence, first the one that applies (if any).
    pub candidates: Vec<ResolveCandidate>,
}

/// One override matching the key.
#[derive(Debug, Serialize, ToSchema)]
pub struct ResolveCandidate {
    #[serde(rename = "override")]
    #[schema(value_type = OverrideAnswer)]
    pub over: Value,
    /// Its precedence: `exact`, `cidr/<length>` or `prefix/<bytes>`.
    #[schema(example = "exact")]
    pub precedence: String,
    /// Whether it applies.
    pub applies: bool,
    /// Why not, when it does not: expired, outranked, or stale (its tier is no longer in the
    /// policy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passed_over: Option<String>,
    /// What of its `limits` the policy no longer has, passed over while the rest applies: a
    /// limit (`daily`), a field (`daily.window_ms`), or a time zone for a limit that is no
    /// longer a calendar limit (`daily.time_zone`). Absent when nothing is stale.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schema(example = json!(["daily.time_zone"]))]
    pub stale: Vec<String>,
}

fn location(name: &PolicyName, id: &OverrideId) -> String {
    format!("/v1/policies/{name}/overrides/{id}")
}

/// An id from the path; one that is not an id names no override.
fn path_id(raw: &str) -> Result<OverrideId, ApiError> {
    OverrideId::parse(raw).ok_or_else(|| ServiceError::UnknownOverride(raw.to_owned()).into())
}

fn doc(o: &Override) -> Value {
    serde_json::to_value(o.to_doc()).unwrap_or_default()
}

/// List a policy's overrides.
///
/// Sorted by id, a page at a time: follow `next_cursor` until it is absent. This instance's copy,
/// brought up to date with the store first.
#[utoipa::path(
    operation_id = "list_overrides",
    tag = "overrides",
    security((), ("bearer" = [])),
    params(("name" = String, Path, description = "The policy's name"), ListQuery),
    responses(
        (status = 200, description = "One page of overrides, sorted by id", body = OverrideList),
        (status = 401, description = "`auth.admin_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such policy", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`limit` out of range, or an unknown query parameter", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable and nothing has been loaded yet", body = Problem, content_type = "application/problem+json"),
    )
)]
#[get("/v1/policies/{name}/overrides")]
pub async fn list(
    _: Admin,
    limiter: web::Data<RateLimiter>,
    path: web::Path<PolicyOnly>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let name = path_name(&path.name)?;
    let (limit, cursor) = list_page(&req)?;
    let (page, next_cursor) = limiter
        .list_overrides(&name, cursor.as_deref(), limit)
        .await?;
    Ok(HttpResponse::Ok().json(OverrideList {
        overrides: page.iter().map(|(o, _)| doc(o)).collect(),
        next_cursor,
    }))
}

/// Create an override.
///
/// Gives the subjects its `match` selects other limits than the policy's: a `tier` of the
/// policy, `limits` of their own (replacing only the fields named, raising or lowering, and for
/// a calendar limit its `time_zone`, so that the subject's days start at its own midnight; its
/// count carries until the end of the period it was counted in, then the periods are the new
/// zone's), `unlimited` (allowed without the store) or `block` (denied without the store). In force on
/// this instance at once and on every instance sharing the store within
/// `redis.policy_refresh_ms` (at once on those that use the denial cache); counters are kept.
/// Refused with 409 when another override of the policy has the same match, or past the caps
/// (`limits.max_exact_overrides`, `limits.max_pattern_overrides`).
#[utoipa::path(
    operation_id = "create_override",
    tag = "overrides",
    security((), ("bearer" = [])),
    params(("name" = String, Path, description = "The policy's name")),
    request_body = OverrideBody,
    responses(
        (status = 201, description = "Created", body = OverrideAnswer, headers(("Location" = String, description = "The new override's URL"), ("ETag" = String, description = "The version created"))),
        (status = 400, description = "Not a JSON object, or a field of the wrong JSON type", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`auth.admin_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such policy", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Another override has the same match (`override-conflict`, naming `match`), or the policy has as many overrides of the kind as it may (`too-many-overrides`)", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A missing, unknown or out-of-range field, an unknown tier or limit, a malformed match, or a concurrency policy", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
#[post("/v1/policies/{name}/overrides")]
pub async fn create(
    _: Admin,
    limiter: web::Data<RateLimiter>,
    path: web::Path<PolicyOnly>,
    body: JsonBody<Value>,
) -> Result<HttpResponse, ApiError> {
    let name = path_name(&path.name)?;
    let (o, etag) = limiter.create_override(&name, &body.0).await?;
    Ok(HttpResponse::Created()
        .insert_header((header::LOCATION, location(&name, &o.id)))
        .insert_header((header::ETAG, etag_header(&etag)))
        .json(o.to_doc()))
}

/// Get an override.
#[utoipa::path(
    operation_id = "read_override",
    tag = "overrides",
    security((), ("bearer" = [])),
    params(OverridePath),
    responses(
        (status = 200, description = "The override", body = OverrideAnswer, headers(("ETag" = String, description = "The override's version"))),
        (status = 401, description = "`auth.admin_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such policy or override", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
#[get("/v1/policies/{name}/overrides/{id}")]
pub async fn read(
    _: Admin,
    limiter: web::Data<RateLimiter>,
    path: web::Path<OverridePath>,
) -> Result<HttpResponse, ApiError> {
    let name = path_name(&path.name)?;
    let id = path_id(&path.id)?;
    let (o, etag) = limiter.get_override(&name, &id).await?;
    Ok(HttpResponse::Ok()
        .insert_header((header::ETAG, etag_header(&etag)))
        .json(o.to_doc()))
}

/// Replace an override.
///
/// The body is a whole override, as for a creation (its `id` may be repeated; `created_at` is
/// kept). Only an existing override is replaced (404 otherwise). With `If-Match: "<ETag>"` only
/// if it is still at that version.
#[utoipa::path(
    operation_id = "replace_override",
    tag = "overrides",
    security((), ("bearer" = [])),
    params(OverridePath, ReplaceHeaders),
    request_body = OverrideBody,
    responses(
        (status = 200, description = "Replaced", body = OverrideAnswer, headers(("ETag" = String, description = "The version written"))),
        (status = 400, description = "Not a JSON object, a field of the wrong JSON type, or a malformed `If-Match`/`If-None-Match`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`auth.admin_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such policy or override", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Another override has the same match, or the caps", body = Problem, content_type = "application/problem+json"),
        (status = 412, description = "`If-Match` or `If-None-Match` does not hold", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A missing, unknown or out-of-range field, or an `id` that differs from the path", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
#[put("/v1/policies/{name}/overrides/{id}")]
pub async fn replace(
    _: Admin,
    limiter: web::Data<RateLimiter>,
    path: web::Path<OverridePath>,
    req: HttpRequest,
    body: JsonBody<Value>,
) -> Result<HttpResponse, ApiError> {
    let name = path_name(&path.name)?;
    let id = path_id(&path.id)?;
    let precondition = match condition(&req)? {
        Condition::One(p) => p,
        Condition::Never => {
            // Bad input first, as for a policy: the 412 is for a write that could be made.
            limiter.check_override(&name, &id, &body.0).await?;
            return Err(ServiceError::PreconditionFailed { current: None }.into());
        }
    };
    let (o, etag) = limiter
        .replace_override(&name, &id, &body.0, &precondition)
        .await?;
    Ok(HttpResponse::Ok()
        .insert_header((header::ETAG, etag_header(&etag)))
        .json(o.to_doc()))
}

/// Delete an override.
///
/// The subjects it matched fall back to the next override by precedence, or to the policy, on
/// every instance within `redis.policy_refresh_ms`. Deleting a policy deletes its overrides.
#[utoipa::path(
    operation_id = "delete_override",
    tag = "overrides",
    security((), ("bearer" = [])),
    params(OverridePath, DeleteHeaders),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "A malformed `If-Match`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`auth.admin_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such policy or override", body = Problem, content_type = "application/problem+json"),
        (status = 412, description = "`If-Match` does not hold", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
#[delete("/v1/policies/{name}/overrides/{id}")]
pub async fn remove(
    _: Admin,
    limiter: web::Data<RateLimiter>,
    path: web::Path<OverridePath>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let name = path_name(&path.name)?;
    let id = path_id(&path.id)?;
    let precondition = match condition(&req)? {
        Condition::One(Precondition::Absent) | Condition::Never => {
            return Err(ApiError::BadHeader {
                header: "if-none-match",
                reason: "does not apply to DELETE",
            })
        }
        Condition::One(p) => p,
    };
    limiter.delete_override(&name, &id, &precondition).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Explain what applies to a subject.
///
/// Every override matching `key`, by precedence, which one applies and why the others do not,
/// and the limits the subject is decided with. Consumes nothing.
#[utoipa::path(
    tag = "overrides",
    security((), ("bearer" = [])),
    params(("name" = String, Path, description = "The policy's name"), ResolveQuery),
    responses(
        (status = 200, description = "What applies to the subject", body = ResolveAnswer),
        (status = 401, description = "`auth.admin_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such policy", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`key` missing or invalid, an unknown query parameter, or a concurrency policy", body = Problem, content_type = "application/problem+json"),
    )
)]
#[get("/v1/policies/{name}/resolve")]
pub async fn resolve(
    _: Admin,
    limiter: web::Data<RateLimiter>,
    path: web::Path<PolicyOnly>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let name = path_name(&path.name)?;
    let query = web::Query::<ResolveQuery>::from_query(req.query_string())
        .map_err(|e| ValidationError::invalid("key", format!("is not understood: {e}")))?;
    let raw = query
        .key
        .as_deref()
        .ok_or_else(|| ValidationError::Missing {
            field: "key".into(),
            context: " (the subject to explain)".into(),
        })?;
    let key = LimitKey::parse(raw.to_owned()).map_err(|r| ValidationError::invalid("key", r))?;
    let r = limiter.resolve_key(&name, &key).await?;
    Ok(HttpResponse::Ok().json(answer(&r, &key)))
}

fn answer(r: &Resolution, key: &LimitKey) -> ResolveAnswer {
    let applied = r.applied.as_deref();
    let (decided_by, tier) = match applied.map(|a| &a.effect) {
        None | Some(Effect::Stale(_)) => ("policy", None),
        Some(Effect::Tier { name, .. }) => ("tier", Some(name.to_string())),
        Some(Effect::Limits(_)) => ("limits", None),
        Some(Effect::Unlimited) => ("unlimited", None),
        Some(Effect::Block) => ("block", None),
    };
    let limits = r.limits.as_deref().map(|limits| {
        limits
            .limits()
            .iter()
            .map(|l| {
                let mut m = serde_json::Map::new();
                m.insert("name".into(), Value::from(l.name.as_str()));
                m.insert("algorithm".into(), Value::from(l.algorithm().as_str()));
                for (f, v) in l.fields() {
                    m.insert(f.into(), Value::from(v));
                }
                // A calendar limit's periods, in the zone the subject is decided in (an
                // override's `time_zone`, or the limit's own).
                if let Some(c) = l.calendar_of() {
                    m.insert(
                        crate::policy::calendar::FIELD.into(),
                        serde_json::to_value(c.to_input()).unwrap_or_default(),
                    );
                }
                Value::Object(m)
            })
            .collect()
    });
    ResolveAnswer {
        policy: r.policy.name.to_string(),
        key: key.as_str().to_owned(),
        at: rfc3339(r.at_us),
        decided_by,
        applied: applied.map(|a| doc(&a.over)),
        tier,
        limits,
        candidates: r
            .candidates
            .iter()
            .map(|c| ResolveCandidate {
                over: doc(&c.applied.over),
                precedence: match c.applied.over.matches.precedence() {
                    Precedence::Exact => "exact".to_owned(),
                    Precedence::Cidr(len) => format!("cidr/{len}"),
                    Precedence::Prefix(bytes) => format!("prefix/{bytes}"),
                },
                applies: c.passed_over.is_none(),
                passed_over: c.passed_over.clone(),
                stale: c.applied.passed_over.clone(),
            })
            .collect(),
    }
}
