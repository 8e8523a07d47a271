//! Bearer-token access control, by scope:
//! - `auth.admin_tokens`: the policy API, `POST /v1/tickets/rotate`, and `POST /v1/reset`;
//! - `auth.settle_tokens`: decisions and settlements, `POST /v1/report` and `/v1/refund` (and
//!   `/v1/reset` when no admin token is set);
//! - `auth.client_tokens`: decisions only (`POST /v1/acquire`, `/v1/peek` and the leases: `POST
//!   /v1/leases`, `POST /v1/leases/{id}/renew`, `DELETE /v1/leases/{id}`), and settlements too
//!   while no settle token is set (as before settle tokens existed);
//! - `auth.metrics_tokens`: `GET /metrics`.
//!
//! A settle token may do whatever a client token may. An empty list leaves that part of the API
//! open (decisions: when there is neither a client nor a settle token).
//!
//! Tokens are kept and compared as SHA-256 digests with `subtle`, so neither a token's bytes nor
//! its length can be found by timing answers.

use std::future::{ready, Ready};

use actix_web::dev::Payload;
use actix_web::http::header;
use actix_web::{web, FromRequest, HttpRequest};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::errors::ApiError;
use crate::config::{AuthSettings, Secret};

type TokenDigest = [u8; 32];

/// The accepted tokens, as digests.
#[derive(Debug, Default, Clone)]
pub struct Tokens {
    admin: Vec<TokenDigest>,
    metrics: Vec<TokenDigest>,
    /// Client and settle tokens: what a decision accepts.
    deciders: Vec<TokenDigest>,
    /// What a settlement accepts: the settle tokens, or the client tokens while there are none.
    settlers: Vec<TokenDigest>,
}

fn digest(token: &[u8]) -> TokenDigest {
    Sha256::digest(token).into()
}

impl Tokens {
    pub fn from_settings(auth: &AuthSettings) -> Self {
        let digests = |tokens: &[Secret]| {
            tokens
                .iter()
                .map(|t| digest(t.expose().as_bytes()))
                .collect()
        };
        let client: Vec<TokenDigest> = digests(&auth.client_tokens);
        let settle: Vec<TokenDigest> = digests(&auth.settle_tokens);
        let deciders = client.iter().chain(&settle).copied().collect();
        let settlers = if settle.is_empty() {
            client.clone()
        } else {
            settle
        };
        Self {
            admin: digests(&auth.admin_tokens),
            metrics: digests(&auth.metrics_tokens),
            deciders,
            settlers,
        }
    }

    pub fn admin_required(&self) -> bool {
        !self.admin.is_empty()
    }

    /// Whether a call with these `authorization` values may ask for decisions (the gRPC edge's
    /// check, as [`Client`] is the HTTP one's), or why not.
    pub fn check_client<'a>(
        &self,
        mut values: impl Iterator<Item = &'a [u8]>,
    ) -> Result<(), &'static str> {
        check_values(&self.deciders, &mut values)
    }

    /// Whether a call with these `authorization` values may settle (report, refund, or Envoy's
    /// negative hits), or why not.
    pub fn check_settle<'a>(
        &self,
        mut values: impl Iterator<Item = &'a [u8]>,
    ) -> Result<(), &'static str> {
        check_values(&self.settlers, &mut values)
    }
}

/// Whether the `Authorization` values of a request carry one of `accepted` (or none is needed).
fn check_values(
    accepted: &[TokenDigest],
    values: &mut dyn Iterator<Item = &[u8]>,
) -> Result<(), &'static str> {
    if accepted.is_empty() {
        return Ok(());
    }
    let Some(value) = values.next() else {
        return Err("a bearer token is required");
    };
    // A proxy and a client may each disagree on which of two headers counts; refuse rather than
    // guess.
    if values.next().is_some() {
        return Err("the request has more than one Authorization header; send exactly one");
    }
    let Some(presented) = bearer_token(value) else {
        return Err("a bearer token is required");
    };
    if is_accepted(accepted, presented) {
        Ok(())
    } else {
        Err("the bearer token is not accepted")
    }
}

/// The token of an `Authorization` header value: the scheme is case-insensitive (RFC 9110
/// §11.1), and any amount of blank space may separate it from the token.
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer";
    if value.len() <= SCHEME.len() || !value[..SCHEME.len()].eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    let rest = &value[SCHEME.len()..];
    if !matches!(rest.first(), Some(b' ' | b'\t')) {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// Whether `presented` is one of `accepted`, comparing with every token without stopping at a
/// match.
fn is_accepted(accepted: &[TokenDigest], presented: &[u8]) -> bool {
    let presented = digest(presented);
    accepted
        .iter()
        .fold(subtle::Choice::from(0), |found, t| {
            found | t.ct_eq(&presented)
        })
        .into()
}

fn check(req: &HttpRequest, accepted: impl Fn(&Tokens) -> &[TokenDigest]) -> Result<(), ApiError> {
    // Always registered by `api::app`; an app built without it fails closed, not open.
    let Some(tokens) = req.app_data::<web::Data<Tokens>>() else {
        return Err(ApiError::Unauthorized(
            "no tokens are configured for this endpoint",
        ));
    };
    let mut values = req
        .headers()
        .get_all(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    check_values(accepted(tokens), &mut values).map_err(ApiError::Unauthorized)
}

/// Present in a handler's arguments: the request carries an admin token (or none is needed).
pub struct Admin;

impl FromRequest for Admin {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(check(req, |t| &t.admin).map(|()| Admin))
    }
}

/// Present in a handler's arguments: the request carries a client or a settle token (or none is
/// needed): it may ask for decisions.
pub struct Client;

impl FromRequest for Client {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(check(req, |t| &t.deciders).map(|()| Client))
    }
}

/// Present in a handler's arguments: the request carries a settle token, or a client token while
/// no settle token is set (or none is needed): it may report and refund.
pub struct Settle;

impl FromRequest for Settle {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(check(req, |t| &t.settlers).map(|()| Settle))
    }
}

/// The tokens `POST /v1/reset` accepts: admin tokens when any is set, else settle tokens when
/// any is set, else client tokens.
fn reset_tokens(t: &Tokens) -> &[TokenDigest] {
    if t.admin.is_empty() {
        &t.settlers
    } else {
        &t.admin
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
        ready(check(req, reset_tokens).map(|()| ResetAccess))
    }
}

/// Present in a handler's arguments: the request carries a metrics token (or none is needed).
pub struct Metrics;

impl FromRequest for Metrics {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(check(req, |t| &t.metrics).map(|()| Metrics))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_accepted_only_when_identical() {
        let accepted = [digest(b"secret"), digest(b"other")];
        assert!(is_accepted(&accepted, b"secret"));
        assert!(is_accepted(&accepted, b"other"));
        assert!(!is_accepted(&accepted, b"secreT"));
        assert!(!is_accepted(&accepted, b"secre"));
        assert!(!is_accepted(&accepted, b""));
        assert!(!is_accepted(&[], b"secret"));
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for value in ["Bearer t", "bearer t", "BEARER t", "bEaReR \t t  "] {
            assert_eq!(bearer_token(value.as_bytes()), Some(&b"t"[..]), "{value:?}");
        }
    }

    #[test]
    fn other_schemes_and_empty_tokens_are_not_bearer_tokens() {
        for value in [
            "Basic dDp0",
            "Bearer",
            "Bearer ",
            "Bearert",
            "Bearer\u{0}t",
            "bear t",
        ] {
            assert_eq!(bearer_token(value.as_bytes()), None, "{value:?}");
        }
    }
}
