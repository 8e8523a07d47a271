//! The one place where a request becomes what the store decides: the policy (from the cache),
//! its kind, the cost bound, a refund's ticket as its marks and record, shadow mode, and the
//! limits to decide with ([`Resolved::plan`]).
//!
//! Everything a store decides is a [`Plan`] built here (or, for a joint acquire's subjects, from
//! a [`Resolved`] too), so a capability that changes what a request is decided with (the limits
//! of one subject, a calendar window's boundaries) has this one home.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cache::Found;
use super::counters::Counted;
use super::{RateLimiter, ServiceError, Ticket};
use crate::limiter::concurrency::Params as LeaseParams;
use crate::limiter::{Op, MAX_LIMITS};
use crate::policy::{Kind, LimitKey, Mode, Policy};
use crate::store::{Ask, Claim, Etag, Plan};

/// A rate policy's request, resolved: the policy as this instance has it, the operation with its
/// cost as bounded, and a refund's verified ticket.
#[derive(Debug)]
pub struct Resolved {
    pub policy: Arc<Policy>,
    /// The version of the policy this instance decides with.
    pub etag: Etag,
    /// The policy's decision counters, from its cache entry.
    pub(super) counters: Counted,
    /// The operation, its ticket (if a refund has one) in `ticket`.
    pub ask: Ask<()>,
    /// A refund's ticket, verified for this subject.
    pub ticket: Option<Ticket>,
    /// The ticket's marks for the policy's limits, as [`Ticket::marks_for`] gives them.
    marks: ([u64; MAX_LIMITS], usize),
    /// The policy is in shadow mode (its own `mode`, or `limits.shadow`), and this is an acquire
    /// or a peek: the answer is allowed whatever the store decides.
    pub shadow: bool,
}

impl Resolved {
    /// The resolved request for the subject `key`, as a store decides it.
    pub fn plan<'a>(&'a self, key: &'a LimitKey, at_us: Option<u64>) -> Plan<'a> {
        let claim = self.ticket.as_ref().map(|t| Claim {
            marks: &self.marks.0[..self.marks.1],
            id: t.id,
            units: t.units,
            ends_at_us: t.ends_at(),
        });
        Plan {
            policy: &self.policy,
            key,
            ask: self.ask.with_ticket(claim),
            params: self.policy.params(),
            at_us,
        }
    }
}

impl RateLimiter {
    /// Resolves `ask` on the subject `key` of the rate policy named `name` (already checked with
    /// [`crate::policy::PolicyName::check`]): an acquire or a peek of at most the quota of every
    /// limit, a report, or a refund of at most its ticket's units (a refund without a ticket
    /// only with `limits.ticketless_refunds`).
    pub(super) async fn resolve(
        &self,
        name: &str,
        key: &LimitKey,
        ask: Ask<&str>,
    ) -> Result<Resolved, ServiceError> {
        let found = self.policy(name).await?;
        self.resolve_with(found, key, ask).await
    }

    /// [`RateLimiter::resolve`], for a policy already looked up (an Envoy descriptor's).
    pub(super) async fn resolve_with(
        &self,
        found: Found,
        key: &LimitKey,
        ask: Ask<&str>,
    ) -> Result<Resolved, ServiceError> {
        let Found {
            policy,
            etag,
            counters,
        } = found;
        let rate = match &policy.kind {
            Kind::Rate(rate) => rate,
            Kind::Concurrency(_) => {
                return Err(ServiceError::ConcurrencyPolicy(policy.name.to_string()))
            }
        };
        let mut cost = ask.cost();
        if matches!(ask.op(), Op::Acquire | Op::Peek) {
            let tightest = rate.tightest();
            let quota = tightest.params.quota();
            if cost > quota {
                return Err(ServiceError::CostAboveQuota {
                    cost,
                    quota,
                    field: tightest.algorithm().quota_field(),
                    limit: rate.is_composite().then(|| tightest.name.to_string()),
                });
            }
        }
        let shadow = matches!(ask.op(), Op::Acquire | Op::Peek)
            && (self.shadow || rate.mode() == Mode::Shadow);
        let mut marks = ([0; MAX_LIMITS], 0);
        let ticket = match ask {
            Ask::Refund {
                ticket: Some(text), ..
            } => {
                let ticket = self.verify_ticket(text, &policy, key).await?;
                cost = cost.min(ticket.units);
                marks = ticket.marks_for(&policy);
                Some(ticket)
            }
            Ask::Refund { ticket: None, .. } if !self.ticketless_refunds => {
                return Err(ServiceError::TicketRequired)
            }
            _ => None,
        };
        Ok(Resolved {
            ask: ask.with_ticket(None).with_cost(cost),
            policy,
            etag,
            counters,
            ticket,
            marks,
            shadow,
        })
    }

    /// The concurrency policy named `name` and its limit; a rate policy is `rate` (the error to
    /// answer for it).
    pub(super) async fn resolve_lease(
        &self,
        name: &str,
        rate: impl FnOnce() -> ServiceError,
    ) -> Result<(Arc<Policy>, Etag, LeaseParams), ServiceError> {
        let Found { policy, etag, .. } = self.policy(name).await?;
        let params = policy.concurrency().ok_or_else(rate)?;
        Ok((policy, etag, params))
    }

    /// The ticket `text` for `policy`'s subject `key`, verified; a ticket signed with a key this
    /// instance does not hold makes it read the ring again first (at most once a second), for a
    /// rotation another instance made.
    async fn verify_ticket(
        &self,
        text: &str,
        policy: &Policy,
        key: &LimitKey,
    ) -> Result<Ticket, ServiceError> {
        match self.tickets.verify(text, policy, key) {
            Err(super::ticket::UNKNOWN_KEY) if self.store.is_shared() => {
                let due = {
                    let mut read = self
                        .ticket_keys_read
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    let due = read.is_none_or(|at| at.elapsed() >= Duration::from_secs(1));
                    if due {
                        *read = Some(Instant::now());
                    }
                    due
                };
                if due {
                    self.load_ticket_keys().await?;
                }
                self.tickets
                    .verify(text, policy, key)
                    .map_err(ServiceError::BadTicket)
            }
            other => other.map_err(ServiceError::BadTicket),
        }
    }
}
