//! Why a service call did not produce its answer: the one error type of the service, which the HTTP
//! API maps in `api/errors.rs` and the gRPC service in `grpc.rs`.

use super::lease_id;
use crate::policy::ValidationError;
use crate::store::{Etag, OverrideCaps, StoreError};

/// Why a service call did not produce its answer.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("no policy named `{0}`")]
    UnknownPolicy(String),
    #[error("a policy named `{0}` already exists")]
    PolicyExists(String),
    /// A policy would serve the same Envoy descriptor shape, in the same domain, as another.
    #[error("`descriptor` serves the same descriptor shape in domain `{domain}` as policy `{other}` already")]
    DescriptorClaimed { domain: String, other: String },
    #[error("the store holds {0} policies already, the most `limits.max_policies` allows")]
    TooManyPolicies(u64),
    /// `If-Match` or `If-None-Match` did not hold; `current` is the ETag of the policy (or the
    /// override) now.
    #[error("{}", match current {
        Some(etag) => format!("the ETag is \"{etag}\", not the one the request names"),
        None => "it does not exist".to_owned(),
    })]
    PreconditionFailed { current: Option<Etag> },
    /// `limit` is the limit's name in a policy of several limits.
    #[error("`cost` {cost} exceeds {}`{field}` of {quota}, so it could never be granted", match limit {
        Some(limit) => format!("limit `{limit}`'s "),
        None => "the policy's ".to_owned(),
    })]
    CostAboveQuota {
        cost: u64,
        quota: u64,
        field: &'static str,
        limit: Option<String>,
    },
    /// A refund's `ticket` that this service did not issue, or issued for another subject.
    #[error("`ticket` {0}")]
    BadTicket(&'static str),
    /// A refund without a `ticket` while `limits.ticketless_refunds` is off.
    #[error("`ticket` is required: a refund gives back the units of the acquire or report whose ticket it names (limits.ticketless_refunds is off)")]
    TicketRequired,
    /// An acquire, peek, report, refund or reset named a concurrency policy.
    #[error("`policy` `{0}` is a concurrency policy: take a lease with POST /v1/leases")]
    ConcurrencyPolicy(String),
    /// A lease was asked of a rate policy.
    #[error(
        "`policy` `{0}` is a rate policy, not a concurrency policy: acquire with POST /v1/acquire"
    )]
    RatePolicy(String),
    /// A take or renewal asked for a longer lease than its policy's `max_lease_ms`.
    #[error("`lease_ms` {asked} is above the policy's `max_lease_ms` of {max}")]
    LeaseTooLong { asked: u64, max: u64 },
    /// A lease id that names no live lease (expired, released, never issued, its policy no longer
    /// a concurrency policy), or that is not a lease id at all.
    #[error("no such lease: {0}")]
    UnknownLease(&'static str),
    /// The operating system gave no random bytes for a lease id.
    #[error(transparent)]
    NoRandomness(#[from] lease_id::NoRandomness),
    /// Client input that only the service can check (an override against its policy).
    #[error(transparent)]
    Invalid(ValidationError),
    #[error("no override `{0}` of this policy")]
    UnknownOverride(String),
    /// Another override of the policy has the same match.
    #[error("`match` is the match of override `{other}` already: two overrides of one policy never have the same match, so that which applies never depends on order")]
    OverrideConflict { other: String },
    #[error("the policy has as many overrides of this kind as it may: {} exact keys (limits.max_exact_overrides) and {} prefixes and ranges (limits.max_pattern_overrides)", .0.exact, .0.patterns)]
    TooManyOverrides(OverrideCaps),
    /// The policy kept changing while an override of it was checked and written.
    #[error("policy `{0}` changed while the override was being written; try again")]
    PolicyChanging(String),
    /// The store failed on a policy whose fail mode is `closed`, or on a policy write or a
    /// reset.
    #[error(transparent)]
    Store(#[from] StoreError),
}
