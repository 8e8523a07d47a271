//! `GET /v1/policies/{name}/top`: a policy's heaviest subjects by denied, allowed or near-limit
//! decisions in the last minute, five minutes or hour, with the error bound of the summaries
//! they come from (see `service::top`). Admin-only when admin tokens are set: subject keys can
//! be personal data.

use actix_web::{get, web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::Admin;
use super::errors::{ApiError, Problem};
use super::policies::{path_name, PolicyPath};
use crate::service::top::{By, TopAnswer, Window};
use crate::service::RateLimiter;

/// Default and largest `limit`.
pub const DEFAULT_SUBJECTS: usize = 10;
pub const MAX_SUBJECTS: usize = 100;

/// The query of `GET /v1/policies/{name}/top` (read by hand, so that each bad parameter is
/// named; this is its spec).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TopQuery {
    /// What subjects are ranked by: `denied` (the default), `allowed`, or `near_limit` (allowed
    /// decisions that left 20 % of a limit's quota or less).
    #[param(value_type = Option<String>, pattern = "^(denied|allowed|near_limit)$", example = "denied")]
    pub by: Option<String>,
    /// The window: `1m` (the default), `5m` or `1h`, counted in whole minutes before the one in
    /// progress, as of the last fold (at most `top.fold_ms` ago).
    #[param(value_type = Option<String>, pattern = "^(1m|5m|1h)$", example = "1m")]
    pub window: Option<String>,
    /// Subjects to answer: 1 to 100; 10 when left out.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 100, example = 10)]
    pub limit: Option<String>,
}

/// One subject's decisions in the window.
#[derive(Debug, Serialize, ToSchema)]
pub struct TopSubject {
    /// The subject's key; `hmac:` and 32 hex digits of its salted hash with `top.hash_keys`.
    #[schema(example = "user-42")]
    pub key: String,
    #[schema(example = 1200)]
    pub denied: u64,
    #[schema(example = 100)]
    pub allowed: u64,
    /// Allowed decisions that left 20 % of a limit's quota or less.
    #[schema(example = 20)]
    pub near_limit: u64,
    /// The count ranked by over the window's total of that dimension (0 to 1).
    #[schema(example = 0.8)]
    pub share: f64,
}

/// Each count's error bound, by dimension.
#[derive(Debug, Serialize, ToSchema)]
pub struct TopBounds {
    pub denied: u64,
    pub allowed: u64,
    pub near_limit: u64,
}

/// The heaviest subjects of a policy.
#[derive(Debug, Serialize, ToSchema)]
pub struct TopList {
    #[schema(example = "api-per-user")]
    pub policy: String,
    #[schema(example = "denied")]
    pub by: String,
    #[schema(example = "1m")]
    pub window: String,
    /// Every count of the ranked dimension (`by`) is within this of the subject's true count in
    /// the window; a subject the summaries do not track has at most this many.
    #[schema(example = 3)]
    pub error_bound: u64,
    /// The bound of each dimension's counts.
    pub error_bounds: TopBounds,
    /// The decisions of the ranked dimension in the window, exactly (every instance's).
    #[schema(example = 1500)]
    pub total: u64,
    /// Heaviest first.
    pub subjects: Vec<TopSubject>,
}

impl From<TopAnswer> for TopList {
    fn from(a: TopAnswer) -> Self {
        let [denied, allowed, near_limit] = a.bounds;
        TopList {
            policy: a.policy,
            by: a.by.as_str().to_owned(),
            window: a.window.as_str().to_owned(),
            error_bound: a.bounds[a.by as usize],
            error_bounds: TopBounds {
                denied,
                allowed,
                near_limit,
            },
            total: a.totals[a.by as usize],
            subjects: a
                .subjects
                .into_iter()
                .map(|o| {
                    let [denied, allowed, near_limit] = o.counts;
                    TopSubject {
                        key: o.key,
                        denied,
                        allowed,
                        near_limit,
                        share: o.share,
                    }
                })
                .collect(),
        }
    }
}

/// `by`, `window` and `limit` of the query, each checked; any other parameter, or one given
/// twice, is refused naming it.
fn parse_query(req: &HttpRequest) -> Result<(By, Window, usize), ApiError> {
    let pairs = web::Query::<Vec<(String, String)>>::from_query(req.query_string())
        .map_err(|e| ApiError::BadQuery {
            parameter: "query".to_owned(),
            reason: format!("is not understood: {e}"),
        })?
        .into_inner();
    let bad = |parameter: &str, reason: &str| ApiError::BadQuery {
        parameter: parameter.to_owned(),
        reason: reason.to_owned(),
    };
    let (mut by, mut window, mut limit) = (None, None, None);
    for (name, value) in &pairs {
        let slot = match name.as_str() {
            "by" => &mut by,
            "window" => &mut window,
            "limit" => &mut limit,
            other => {
                return Err(bad(
                    other,
                    "is not a parameter of this endpoint (by, window, limit)",
                ))
            }
        };
        if slot.replace(value.as_str()).is_some() {
            return Err(bad(name, "may be given once"));
        }
    }
    let by = match by {
        None => By::Denied,
        Some(v) => {
            By::parse(v).ok_or_else(|| bad("by", "must be denied, allowed or near_limit"))?
        }
    };
    let window = match window {
        None => Window::OneMinute,
        Some(v) => Window::parse(v).ok_or_else(|| bad("window", "must be 1m, 5m or 1h"))?,
    };
    let limit = match limit {
        None => DEFAULT_SUBJECTS,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_SUBJECTS).contains(n))
            .ok_or_else(|| bad("limit", "must be a whole number from 1 to 100"))?,
    };
    Ok((by, window, limit))
}

/// A policy's top offenders.
///
/// The heaviest subjects of the policy by denied, allowed or near-limit acquires in the window,
/// heaviest first, counted by every instance sharing the store (each folds what it counted
/// every `top.fold_ms`), from bounded summaries: every count is within `error_bound` of the true
/// count (see docs/observability.md, "Top offenders"). Needs an admin token when admin tokens
/// are set.
#[utoipa::path(
    tag = "operations",
    security((), ("bearer" = [])),
    params(PolicyPath, TopQuery),
    responses(
        (status = 200, description = "The heaviest subjects, heaviest first", body = TopList),
        (status = 400, description = "A query parameter is unknown, repeated or out of range (`malformed-query`, naming it)", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`auth.admin_tokens` is set and the request has none of them", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such policy", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable", body = Problem, content_type = "application/problem+json"),
    )
)]
#[get("/v1/policies/{name}/top")]
pub async fn top(
    _: Admin,
    limiter: web::Data<RateLimiter>,
    path: web::Path<PolicyPath>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let name = path_name(&path.name)?;
    let (by, window, limit) = parse_query(&req)?;
    let answer = limiter.top(name.as_str(), by, window, limit).await?;
    Ok(HttpResponse::Ok().json(TopList::from(answer)))
}
