//! Who may do what, from a bearer token: the accepted tokens by scope, and the check of a call's
//! `Authorization` values against them, for the HTTP API ([`crate::api`]'s extractors, which
//! answer 401) and the gRPC service ([`crate::grpc`]'s interceptor) alike.
//!
//! The scopes, one list of tokens each in `auth`:
//! - `admin_tokens`: the policy API, ticket keys, and resets;
//! - `settle_tokens`: decisions and settlements (reports, refunds, Envoy's negative hits; resets
//!   too when no admin token is set);
//! - `client_tokens`: decisions only, and settlements too while no settle token is set (as
//!   before settle tokens existed);
//! - `metrics_tokens`: the metrics.
//!
//! A settle token may do whatever a client token may. An empty list leaves that scope open
//! (decisions: when there is neither a client nor a settle token).
//!
//! Tokens are kept and compared as SHA-256 digests with `subtle`, so neither a token's bytes nor
//! its length can be found by timing answers.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{AuthSettings, Secret};

type TokenDigest = [u8; 32];

/// What a call asks to do, as far as its token is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The policy API and the ticket keys: admin tokens.
    Admin,
    /// Decisions (acquires, peeks, leases): client or settle tokens.
    Decide,
    /// Settlements (reports, refunds, negative hits): settle tokens, or client tokens while
    /// there are none.
    Settle,
    /// Resets, which unblock a subject and so are never open while decisions are guarded: admin
    /// tokens when any is set, else as [`Scope::Settle`].
    Reset,
    /// The metrics: metrics tokens.
    Metrics,
}

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

    /// Whether a call with these `authorization` values may do what `scope` covers, or why not.
    pub fn check<'a>(
        &self,
        scope: Scope,
        mut values: impl Iterator<Item = &'a [u8]>,
    ) -> Result<(), &'static str> {
        check_values(self.accepted(scope), &mut values)
    }

    /// The digests `scope` accepts.
    fn accepted(&self, scope: Scope) -> &[TokenDigest] {
        match scope {
            Scope::Admin => &self.admin,
            Scope::Decide => &self.deciders,
            Scope::Settle => &self.settlers,
            Scope::Reset if self.admin.is_empty() => &self.settlers,
            Scope::Reset => &self.admin,
            Scope::Metrics => &self.metrics,
        }
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
