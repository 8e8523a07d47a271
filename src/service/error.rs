//! Why a service call did not produce its answer: the one error type of the service, which the HTTP
//! API maps in `api/errors.rs` and the gRPC service in `grpc.rs`.

use super::lease_id;
use crate::store::{Etag, StoreError};

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
    /// `If-Match` or `If-None-Match` did not hold; `current` is the policy's ETag now.
    #[error("{}", match current {
        Some(etag) => format!("the policy's ETag is \"{etag}\", not the one the request names"),
        None => "the policy does not exist".to_owned(),
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
    /// The store failed on a policy whose fail mode is `closed`, or on a policy write or a
    /// reset.
    #[error(transparent)]
    Store(#[from] StoreError),
}
