//! Bearer-token access control over HTTP: which endpoints need which scope
//! ([`crate::access`] decides from the token), the `Authorization` header read from the request,
//! and a refusal answered as 401:
//! - admin: the policy API, `POST /v1/tickets/rotate`, and `POST /v1/reset`;
//! - settle: decisions and settlements, `POST /v1/report` and `/v1/refund` (and `/v1/reset` when
//!   no admin token is set);
//! - client: decisions only (`POST /v1/acquire`, `/v1/peek` and the leases: `POST /v1/leases`,
//!   `POST /v1/leases/{id}/renew`, `DELETE /v1/leases/{id}`), and settlements too while no settle
//!   token is set;
//! - metrics: `GET /metrics`.

use std::future::{ready, Ready};

use actix_web::dev::Payload;
use actix_web::http::header;
use actix_web::{web, FromRequest, HttpRequest};

use super::errors::ApiError;
use crate::access::{Scope, Tokens};

fn check(req: &HttpRequest, scope: Scope) -> Result<(), ApiError> {
    // Always registered by `api::app`; an app built without it fails closed, not open.
    let Some(tokens) = req.app_data::<web::Data<Tokens>>() else {
        return Err(ApiError::Unauthorized(
            "no tokens are configured for this endpoint",
        ));
    };
    let values = req
        .headers()
        .get_all(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    tokens.check(scope, values).map_err(ApiError::Unauthorized)
}

/// Present in a handler's arguments: the request carries an admin token (or none is needed).
pub struct Admin;

impl FromRequest for Admin {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(check(req, Scope::Admin).map(|()| Admin))
    }
}

/// Present in a handler's arguments: the request carries a client or a settle token (or none is
/// needed): it may ask for decisions.
pub struct Client;

impl FromRequest for Client {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(check(req, Scope::Decide).map(|()| Client))
    }
}

/// Present in a handler's arguments: the request carries a settle token, or a client token while
/// no settle token is set (or none is needed): it may report and refund.
pub struct Settle;

impl FromRequest for Settle {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(check(req, Scope::Settle).map(|()| Settle))
    }
}

/// Present in `POST /v1/reset`'s arguments: the request carries an admin token when
/// `auth.admin_tokens` is set, otherwise a settle token when `auth.settle_tokens` is, otherwise
/// a client token when `auth.client_tokens` is (or none is needed). Resetting a subject
/// unblocks it: it is never open while acquires are guarded.
pub struct ResetAccess;

impl FromRequest for ResetAccess {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(check(req, Scope::Reset).map(|()| ResetAccess))
    }
}

/// Present in a handler's arguments: the request carries a metrics token (or none is needed).
pub struct Metrics;

impl FromRequest for Metrics {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(check(req, Scope::Metrics).map(|()| Metrics))
    }
}
