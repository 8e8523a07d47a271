//! The one place that turns errors into HTTP answers: RFC 9457 `application/problem+json`.
//!
//! Client mistakes name the field at fault; a store outage is a 503 with `Retry-After`; anything
//! unexpected is a 500 whose body says nothing more, with the full cause in the log.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use utoipa::ToSchema;

use crate::policy::ValidationError;
use crate::service::policies::etag_header;
use crate::service::readiness::Unready;
use crate::service::ServiceError;
use crate::store::ErrorClass;
use crate::telemetry::Summarized;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// An error answer, as defined by RFC 9457.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "type": "urn:ratelimiter:problem:invalid-field",
    "title": "A field is missing, unknown or out of range",
    "status": 422,
    "detail": "`cost` 5 exceeds the policy's `limit` of 3, so it could never be granted",
    "field": "cost"
}))]
pub struct Problem {
    /// A URN naming the kind of problem; stable, for programs to match on.
    #[serde(rename = "type")]
    #[schema(example = "urn:ratelimiter:problem:invalid-field")]
    pub kind: &'static str,
    /// A short summary of the kind of problem.
    #[schema(example = "A field is missing, unknown or out of range")]
    pub title: &'static str,
    /// The HTTP status code.
    #[schema(example = 422)]
    pub status: u16,
    /// What went wrong with this request, in words.
    #[schema(example = "`cost` 5 exceeds the policy's `limit` of 3, so it could never be granted")]
    pub detail: String,
    /// The request field at fault, when there is one (`cost`, `limit`, `policies[0].name`…).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "cost")]
    pub field: Option<String>,
}

/// Every way a request can fail.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Validation(#[from] ValidationError),
    /// The body is not JSON, or a field has the wrong JSON type.
    #[error("{detail}")]
    MalformedBody {
        detail: String,
        field: Option<String>,
    },
    #[error("the request body is larger than {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("{0}")]
    Unauthorized(&'static str),
    /// The request's body did not arrive within `server.request_timeout_ms`.
    #[error("the request body did not arrive within {limit_ms} ms")]
    RequestTimeout { limit_ms: u64 },
    #[error("no route for {0}")]
    NoRoute(String),
    #[error("{route} is not allowed; this path takes {allow}")]
    MethodNotAllowed { route: String, allow: &'static str },
    #[error("not ready: {0}")]
    NotReady(#[from] Unready),
    /// A request header the endpoint reads is malformed.
    #[error("`{header}` {reason}")]
    BadHeader {
        header: &'static str,
        reason: &'static str,
    },
    /// A query parameter is unknown, repeated or out of range.
    #[error("`{parameter}` {reason}")]
    BadQuery { parameter: String, reason: String },
    #[error(transparent)]
    Service(#[from] ServiceError),
}

type Parts<'a> = (StatusCode, &'static str, &'static str, Option<&'a str>);

const MALFORMED_BODY: Parts<'static> = (
    StatusCode::BAD_REQUEST,
    "urn:ratelimiter:problem:malformed-body",
    "The request body is not a JSON object",
    None,
);

fn malformed_field(field: Option<&str>) -> Parts<'_> {
    (
        StatusCode::BAD_REQUEST,
        "urn:ratelimiter:problem:malformed-field",
        "A field has the wrong JSON type",
        field,
    )
}

fn invalid_field(field: Option<&str>) -> Parts<'_> {
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        "urn:ratelimiter:problem:invalid-field",
        "A field is missing, unknown or out of range",
        field,
    )
}

impl ApiError {
    fn parts(&self) -> Parts<'_> {
        use StatusCode as S;
        match self {
            ApiError::Validation(ValidationError::NotAnObject) => MALFORMED_BODY,
            ApiError::Validation(e) if e.is_malformed() => malformed_field(e.field()),
            ApiError::Validation(e) => invalid_field(e.field()),
            ApiError::MalformedBody { field: None, .. } => MALFORMED_BODY,
            ApiError::MalformedBody { field, .. } => malformed_field(field.as_deref()),
            ApiError::BodyTooLarge { .. } => (
                S::PAYLOAD_TOO_LARGE,
                "urn:ratelimiter:problem:body-too-large",
                "The request body is too large",
                None,
            ),
            ApiError::Unauthorized(_) => (
                S::UNAUTHORIZED,
                "urn:ratelimiter:problem:unauthorized",
                "A valid bearer token is required",
                None,
            ),
            ApiError::RequestTimeout { .. } => (
                S::REQUEST_TIMEOUT,
                "urn:ratelimiter:problem:request-timeout",
                "The request did not arrive in time",
                None,
            ),
            ApiError::NoRoute(_) => (
                S::NOT_FOUND,
                "urn:ratelimiter:problem:no-route",
                "No such endpoint",
                None,
            ),
            ApiError::MethodNotAllowed { .. } => (
                S::METHOD_NOT_ALLOWED,
                "urn:ratelimiter:problem:method-not-allowed",
                "The endpoint does not take this method",
                None,
            ),
            ApiError::NotReady(_) => (
                S::SERVICE_UNAVAILABLE,
                "urn:ratelimiter:problem:not-ready",
                "This instance cannot decide with current policies now",
                None,
            ),
            ApiError::BadHeader { header, .. } => (
                S::BAD_REQUEST,
                "urn:ratelimiter:problem:malformed-header",
                "A request header is malformed",
                Some(header),
            ),
            ApiError::BadQuery { parameter, .. } => (
                S::BAD_REQUEST,
                "urn:ratelimiter:problem:malformed-query",
                "A query parameter is malformed",
                Some(parameter.as_str()),
            ),
            ApiError::Service(e) => match e {
                ServiceError::Invalid(e) if e.is_malformed() => malformed_field(e.field()),
                ServiceError::Invalid(e) => invalid_field(e.field()),
                ServiceError::UnknownOverride(_) => (
                    S::NOT_FOUND,
                    "urn:ratelimiter:problem:unknown-override",
                    "No such override",
                    None,
                ),
                ServiceError::OverrideConflict { .. } => (
                    S::CONFLICT,
                    "urn:ratelimiter:problem:override-conflict",
                    "Another override of the policy has the same match",
                    Some("match"),
                ),
                ServiceError::TooManyOverrides(_) => (
                    S::CONFLICT,
                    "urn:ratelimiter:problem:too-many-overrides",
                    "The policy has as many overrides of this kind as it may",
                    Some("match"),
                ),
                ServiceError::PolicyChanging(_) => (
                    S::CONFLICT,
                    "urn:ratelimiter:problem:policy-changing",
                    "The policy changed while the override was being written",
                    None,
                ),
                ServiceError::UnknownPolicy(_) => (
                    S::NOT_FOUND,
                    "urn:ratelimiter:problem:unknown-policy",
                    "No such policy",
                    None,
                ),
                ServiceError::PolicyExists(_) => (
                    S::CONFLICT,
                    "urn:ratelimiter:problem:policy-exists",
                    "The policy already exists",
                    Some("name"),
                ),
                ServiceError::DescriptorClaimed { .. } => (
                    S::CONFLICT,
                    "urn:ratelimiter:problem:descriptor-claimed",
                    "Another policy serves the same descriptor shape",
                    Some("descriptor"),
                ),
                ServiceError::CostAboveQuota { .. } => invalid_field(Some("cost")),
                ServiceError::BadTicket(_) | ServiceError::TicketRequired => {
                    invalid_field(Some("ticket"))
                }
                ServiceError::LeaseTooLong { .. } => invalid_field(Some("lease_ms")),
                ServiceError::ConcurrencyPolicy(_) | ServiceError::RatePolicy(_) => {
                    invalid_field(Some("policy"))
                }
                ServiceError::UnknownLease(_) => (
                    S::NOT_FOUND,
                    "urn:ratelimiter:problem:unknown-lease",
                    "No such lease",
                    None,
                ),
                ServiceError::NoRandomness(_) => (
                    S::INTERNAL_SERVER_ERROR,
                    "urn:ratelimiter:problem:internal",
                    "Internal error",
                    None,
                ),
                ServiceError::TooManyPolicies(_) => (
                    S::CONFLICT,
                    "urn:ratelimiter:problem:too-many-policies",
                    "The store holds as many policies as it may",
                    None,
                ),
                ServiceError::PreconditionFailed { .. } => (
                    S::PRECONDITION_FAILED,
                    "urn:ratelimiter:problem:precondition-failed",
                    "The policy or override is not at the version the request names",
                    None,
                ),
                // The HTTP column of `ErrorClass`'s table.
                ServiceError::Store(e) => match e.class() {
                    ErrorClass::OutcomeUnknown => (
                        S::SERVICE_UNAVAILABLE,
                        "urn:ratelimiter:problem:outcome-unknown",
                        "The store did not answer in time: the request may or may not have taken effect",
                        None,
                    ),
                    ErrorClass::Unreachable | ErrorClass::ClusterRefused | ErrorClass::Refused => (
                        S::SERVICE_UNAVAILABLE,
                        "urn:ratelimiter:problem:store-unavailable",
                        "The rate-limit store is unavailable",
                        None,
                    ),
                    ErrorClass::Corrupt => (
                        S::INTERNAL_SERVER_ERROR,
                        "urn:ratelimiter:problem:internal",
                        "Internal error",
                        None,
                    ),
                },
            },
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.parts().0
    }

    fn error_response(&self) -> HttpResponse {
        let (status, kind, title, field) = self.parts();
        // What the store said (script names, line numbers, addresses) is for the log, not for
        // clients.
        let detail = match self {
            _ if status == StatusCode::INTERNAL_SERVER_ERROR => {
                tracing::error!(error = %self, "request failed");
                "The request could not be completed; the cause is in the service's log.".to_owned()
            }
            ApiError::Service(ServiceError::Store(e))
                if e.class() == ErrorClass::OutcomeUnknown =>
            {
                "The store did not answer in time, so it is not known whether this request took \
                 effect. For a policy write, read the policy and compare its ETag before \
                 retrying, or retry with If-Match (a write with a precondition is safe to repeat)."
                    .to_owned()
            }
            ApiError::Service(ServiceError::Store(_)) => {
                "The rate-limit store could not be used; the cause is in the service's log."
                    .to_owned()
            }
            _ => self.to_string(),
        };
        let mut response = HttpResponse::build(status);
        response.content_type(PROBLEM_JSON);
        if let ApiError::Unauthorized(_) = self {
            response.insert_header((header::WWW_AUTHENTICATE, "Bearer realm=\"ratelimiter\""));
        }
        if let ApiError::MethodNotAllowed { allow, .. } = self {
            response.insert_header((header::ALLOW, *allow));
        }
        if status == StatusCode::SERVICE_UNAVAILABLE {
            static UNAVAILABLE: Summarized = Summarized::per_second();
            if let Some(count) = UNAVAILABLE.hit() {
                tracing::warn!(error = %self, count, "answered 503 (count: since the last such line)");
            }
            response.insert_header((header::RETRY_AFTER, "1"));
        }
        if let ApiError::Service(ServiceError::PreconditionFailed {
            current: Some(etag),
        }) = self
        {
            response.insert_header((header::ETAG, etag_header(etag)));
        }
        response.json(Problem {
            kind,
            title,
            status: status.as_u16(),
            detail,
            field: field.map(str::to_owned),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;

    #[test]
    fn lease_errors_are_404_unknown_lease_and_kind_mismatches_422_naming_policy() {
        let unknown = ApiError::Service(ServiceError::UnknownLease("gone"));
        let (s, k, _, field) = unknown.parts();
        assert_eq!(
            (s.as_u16(), k, field),
            (404, "urn:ratelimiter:problem:unknown-lease", None)
        );
        for e in [
            ServiceError::ConcurrencyPolicy("c".into()),
            ServiceError::RatePolicy("r".into()),
        ] {
            let e = ApiError::Service(e);
            let (s, k, _, field) = e.parts();
            assert_eq!(
                (s.as_u16(), k, field),
                (422, "urn:ratelimiter:problem:invalid-field", Some("policy")),
                "{e}"
            );
        }
    }

    #[test]
    fn store_errors_are_answered_as_their_class_says() {
        // The HTTP column of `ErrorClass`'s table, one error of each kind.
        let table = [
            (StoreError::unavailable("refused"), 503, "store-unavailable"),
            (
                StoreError::outcome_unknown("no answer"),
                503,
                "outcome-unknown",
            ),
            (StoreError::server("OOM"), 503, "store-unavailable"),
            (StoreError::Full(2), 503, "store-unavailable"),
            (StoreError::corrupt("policy hash"), 500, "internal"),
        ];
        for (error, status, kind) in table {
            let text = error.to_string();
            let error = ApiError::Service(ServiceError::Store(error));
            let (s, k, _, field) = error.parts();
            assert_eq!(s.as_u16(), status, "{text}");
            assert_eq!(k, format!("urn:ratelimiter:problem:{kind}"), "{text}");
            assert_eq!(field, None, "{text}");
            assert_eq!(
                error
                    .error_response()
                    .headers()
                    .contains_key(header::RETRY_AFTER),
                status == 503,
                "{text}"
            );
        }
    }
}
