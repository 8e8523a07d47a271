//! Bearer-token access control: `auth.admin_tokens` guard the policy API, `auth.client_tokens`
//! guard `POST /v1/acquire`. An empty list leaves that part of the API open.

use std::future::{ready, Ready};

use actix_web::dev::Payload;
use actix_web::http::header;
use actix_web::{web, FromRequest, HttpRequest};

use super::errors::ApiError;
use crate::config::AuthSettings;

/// The accepted tokens, as bytes.
#[derive(Debug, Default, Clone)]
pub struct Tokens {
    admin: Vec<Vec<u8>>,
    client: Vec<Vec<u8>>,
}

impl Tokens {
    pub fn from_settings(auth: &AuthSettings) -> Self {
        let bytes = |tokens: &[crate::config::Secret]| {
            tokens
                .iter()
                .map(|t| t.expose().as_bytes().to_vec())
                .collect()
        };
        Self {
            admin: bytes(&auth.admin_tokens),
            client: bytes(&auth.client_tokens),
        }
    }

    pub fn admin_required(&self) -> bool {
        !self.admin.is_empty()
    }
}

/// Equality that takes the same time wherever the inputs differ (their lengths aside), so a
/// caller cannot find a token byte by byte by timing answers.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn check(req: &HttpRequest, accepted: impl Fn(&Tokens) -> &[Vec<u8>]) -> Result<(), ApiError> {
    let Some(tokens) = req.app_data::<web::Data<Tokens>>() else {
        return Ok(());
    };
    let accepted = accepted(tokens);
    if accepted.is_empty() {
        return Ok(());
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(presented) = presented else {
        return Err(ApiError::Unauthorized("a bearer token is required"));
    };
    // Compare with every token, without stopping at a match.
    let matched = accepted.iter().fold(false, |found, t| {
        constant_time_eq(t, presented.as_bytes()) | found
    });
    if matched {
        Ok(())
    } else {
        Err(ApiError::Unauthorized("the bearer token is not accepted"))
    }
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

/// Present in a handler's arguments: the request carries a client token (or none is needed).
pub struct Client;

impl FromRequest for Client {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(check(req, |t| &t.client).map(|()| Client))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_equal_only_when_identical() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secre"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
