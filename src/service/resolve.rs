//! The one place where a request becomes what the store decides: the policy (from the cache),
//! its kind, the cost bound, a refund's ticket as its marks and record, shadow mode, and the
//! limits to decide with ([`Resolved::plan`]).
//!
//! Everything a store decides is a [`Plan`] built here (or, for a joint acquire's subjects, from
//! a [`Resolved`] too), so a capability that changes what a request is decided with (the limits
//! of one subject, a calendar window's boundaries) has this one home. The override that applies
//! to the subject ([`Applied`]) is found here: its limits replace the policy's in the plan, and
//! the cost is bounded by them; an `unlimited` or `block` override is decided without a plan
//! ([`Resolved::without_store`]). Where no override applies, a limit the request gave (an Envoy
//! descriptor's `limit`, [`Requested`]) replaces the policy's when the policy's `request_limits`
//! allows it, clamped to its maximum ([`given_limits`]): the operator's override wins over the
//! request's limit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cache::{Applied, Effect, Found};
use super::counters::Counted;
use super::{RateLimiter, ServiceError, Ticket};
use crate::limiter::concurrency::Params as LeaseParams;
use crate::limiter::{Decision, Verdict};
use crate::limiter::{Mark, Op, MAX_LIMITS};
use crate::policy::request_limits::Requested;
use crate::policy::{Kind, LimitKey, Limits, Mode, Policy, Rate};
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
    marks: ([Mark; MAX_LIMITS], usize),
    /// The policy is in shadow mode (its own `mode`, or `limits.shadow`), and this is an acquire
    /// or a peek: the answer is allowed whatever the store decides.
    pub shadow: bool,
    /// The override that applies to the subject, if one does.
    pub applied: Option<Arc<Applied>>,
    /// The limits the request gave, as clamped ([`given_limits`]), when they replace the
    /// policy's.
    pub given: Option<Arc<Limits>>,
    /// The limits' parameters at the instance's time, when a calendar limit's depend on it
    /// ([`Limits::params_at`]).
    at_time: Option<Box<[crate::limiter::Params]>>,
    /// What the denial cache keys the subject's denials by: the newer of the policy's version
    /// and its overrides' newest change; `None` when no denial may be cached (the override that
    /// applies ends by itself, and a denial under it could outlive it).
    pub denial_version: Option<u64>,
}

impl Resolved {
    /// The limits the subject is decided with: an override's, or the policy's own.
    pub fn limits(&self) -> &Limits {
        limits_of(&self.policy, self.applied.as_deref(), self.given.as_deref())
    }

    /// Whether an `unlimited` or `block` override decides the request without the store.
    pub fn decided_alone(&self) -> bool {
        self.applied
            .as_deref()
            .is_some_and(|a| matches!(a.effect, Effect::Unlimited | Effect::Block))
    }

    /// The verdict of an `unlimited` or `block` override, which the store is not asked for, at
    /// `now_us`: every limit allowed with its whole quota left, or denied with nothing left
    /// until the override's expiry (0 without one). `None` for any other request.
    pub fn without_store(&self, now_us: u64) -> Option<Verdict> {
        let applied = self.applied.as_deref()?;
        let allowed = match applied.effect {
            Effect::Unlimited => true,
            Effect::Block => false,
            Effect::Tier { .. } | Effect::Limits(_) | Effect::Stale(_) => return None,
        };
        let wait = match (allowed, applied.expires_at_us) {
            (false, Some(e)) => e.saturating_sub(now_us),
            _ => 0,
        };
        let mut verdict = Verdict::at(now_us);
        for p in self.limits().params() {
            verdict.push(Decision {
                allowed,
                remaining: if allowed { p.quota() } else { 0 },
                reset_after_us: wait,
                retry_after_us: wait,
            });
        }
        Some(verdict)
    }

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
            params: self.params(),
            at_us,
        }
    }

    /// The parameters the subject is decided with: [`Resolved::limits`]' at the time it was
    /// resolved.
    pub fn params(&self) -> &[crate::limiter::Params] {
        self.at_time
            .as_deref()
            .unwrap_or_else(|| self.limits().params())
    }
}

/// The limits `applied` gives the policy's subject, or those the request gave (`given`), or the
/// policy's own.
fn limits_of<'a>(
    policy: &'a Policy,
    applied: Option<&'a Applied>,
    given: Option<&'a Limits>,
) -> &'a Limits {
    static NONE: std::sync::OnceLock<Limits> = std::sync::OnceLock::new();
    if let Some(limits) = applied.and_then(|a| a.effect.limits()) {
        return limits;
    }
    match (applied, given) {
        (None, Some(given)) => given,
        _ => policy
            .rate()
            .map_or_else(|| NONE.get_or_init(Limits::empty), Rate::own),
    }
}

/// The limits a request's own limit `asked` gives the subject in place of the policy's: only
/// when the policy's `request_limits` allows one, clamped to its maximum, and no override
/// applies to the subject (an operator's override, even a stale one, wins over the request).
pub(super) fn given_limits(
    policy: &Policy,
    applied: Option<&Applied>,
    asked: Option<Requested>,
) -> Option<Arc<Limits>> {
    let (None, Some(asked)) = (applied, asked) else {
        return None;
    };
    let rate = policy.rate()?;
    let max = rate.request_limits()?;
    let [limit] = rate.limits() else {
        return None;
    };
    Some(Arc::new(max.limit_for(limit, asked).limits))
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
        let found = self.policy_for(name, key.as_str()).await?;
        self.resolve_with(found, key, ask, None).await
    }

    /// [`RateLimiter::resolve`], for a policy already looked up (an Envoy descriptor's), with the
    /// limit the request gave, if it gave one ([`given_limits`]).
    pub(super) async fn resolve_with(
        &self,
        found: Found,
        key: &LimitKey,
        ask: Ask<&str>,
        asked: Option<Requested>,
    ) -> Result<Resolved, ServiceError> {
        let Found {
            policy,
            etag,
            counters,
            overrides_changed,
            applied,
        } = found;
        let rate = match &policy.kind {
            Kind::Rate(rate) => rate,
            Kind::Concurrency(_) => {
                return Err(ServiceError::ConcurrencyPolicy(policy.name.to_string()))
            }
        };
        // Looked up with the policy, or now; a policy without overrides costs no lookup.
        let applied = match applied {
            Some(applied) => applied,
            None => (overrides_changed > 0)
                .then(|| {
                    self.cache
                        .override_for(policy.name.as_str(), key.as_str(), self.clock.now_us())
                })
                .flatten(),
        };
        let given = given_limits(&policy, applied.as_deref(), asked);
        // A denial under the request's own limit is that request's: another may give another.
        let denial_version = match applied.as_deref() {
            Some(a) if a.expires_at_us.is_some() => None,
            _ if given.is_some() => None,
            _ => Some(etag.version.max(overrides_changed)),
        };
        let limits = limits_of(&policy, applied.as_deref(), given.as_deref());
        let decided_alone = applied
            .as_deref()
            .is_some_and(|a| matches!(a.effect, Effect::Unlimited | Effect::Block));
        let mut cost = ask.cost();
        if matches!(ask.op(), Op::Acquire | Op::Peek) && !decided_alone {
            let tightest = limits.tightest();
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
        let mut marks = ([Mark::default(); MAX_LIMITS], 0);
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
        let at_time = limits.params_at(self.clock.now_us());
        Ok(Resolved {
            ask: ask.with_ticket(None).with_cost(cost),
            at_time,
            policy,
            etag,
            counters,
            ticket,
            marks,
            shadow,
            applied,
            given,
            denial_version,
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
