//! Decisions on rate policies: an acquire, peek, report or refund resolved into a plan
//! ([`super::resolve`]), answered by the local denial cache, the store or, when the store fails,
//! the fail mode ([`super::fail_mode`]); then counted, and given its ticket. Resets, and the
//! invalidation of cached denials that a refund, a report or a reset makes stale.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::cache::Found;
use super::denials::{self, Lookup};
use super::resolve::Resolved;
use super::{Acquired, Ask, DecidedBy, RateLimiter, ServiceError};
use crate::limiter::{Decision, Op, Verdict};
use crate::policy::{Kind, LimitKey, Policy};
use crate::store::{Plan, Store};
use crate::telemetry::Summarized;

impl RateLimiter {
    /// Decides one acquire of `cost` units for the policy named `name` (already checked with
    /// [`crate::policy::PolicyName::check`]).
    pub async fn acquire(
        &self,
        name: &str,
        key: &LimitKey,
        cost: u64,
    ) -> Result<Acquired, ServiceError> {
        self.decide(name, key, Ask::Acquire { cost }).await
    }

    /// Decides one operation for the policy named `name` (already checked with
    /// [`crate::policy::PolicyName::check`]): an acquire or a peek of at most the quota of every
    /// limit, a report, or a refund (of at most its ticket's units, within its windows, when it
    /// names one). See `resolve`.
    pub async fn decide(
        &self,
        name: &str,
        key: &LimitKey,
        ask: Ask<&str>,
    ) -> Result<Acquired, ServiceError> {
        let started = Instant::now();
        let resolved = self.resolve(name, key, ask).await?;
        self.decide_resolved(resolved, key, started).await
    }

    /// Decides a resolved request: by the local denial cache, the store, or, when the store
    /// fails, the fail mode; then counts it and issues its ticket.
    pub(super) async fn decide_resolved(
        &self,
        resolved: Resolved,
        key: &LimitKey,
        started: Instant,
    ) -> Result<Acquired, ServiceError> {
        let plan = resolved.plan(key, self.clock.at_us());
        // An `unlimited` or `block` override is decided here: the store is never asked.
        let result = match resolved.without_store(self.clock.now_us()) {
            Some(verdict) => Ok((verdict, DecidedBy::Override)),
            None => self.ask_store(&plan, &resolved, started).await,
        };
        let (op, cost) = (plan.op(), plan.cost());
        let reserved = matches!(plan.ask, Ask::Reserve { .. });
        // When the units a refund's ticket took are due: after now, the booking is cancelled.
        let due_us = match &plan.ask {
            Ask::Refund {
                ticket: Some(claim),
                ..
            } => claim.marks.first().map_or(0, |m| m.taken_us),
            _ => 0,
        };
        if op == Op::Acquire {
            self.acquire_seconds.record(started.elapsed().as_secs_f64());
        }
        let (verdict, decided_by) = result?;
        let counters = resolved.counters.of(&resolved.policy);
        if op == Op::Acquire {
            counters
                .limits
                .count(resolved.limits().limits(), &verdict, decided_by);
            self.count_top(
                &resolved.policy,
                key.as_str(),
                &verdict,
                plan.params,
                decided_by,
            );
        }
        let Resolved {
            policy,
            etag,
            shadow,
            applied,
            given,
            ..
        } = resolved;
        let degraded = decided_by.is_degraded();
        if decided_by == DecidedBy::LocalCache {
            counters.cache_hits.increment(1);
        }
        // A refund, a report or a reset may give units back or move the retry time: every
        // instance's cached denial of the subject goes.
        if matches!(op, Op::Report | Op::Refund)
            && !degraded
            && verdict.units().iter().any(|u| *u > 0)
        {
            self.invalidate_denials(&policy, key).await;
        }
        counters.count(op, cost, &verdict, degraded, shadow);
        counters.count_override(applied.as_deref());
        // A reservation holds its caller back by the booking's delay, unless nothing was booked
        // (fail_open, an override) or enforcement is only watched (shadow mode).
        let holds = !shadow && decided_by.knows_remaining();
        let booked = verdict.taken_us.saturating_sub(verdict.at_us);
        if reserved && holds {
            counters.reservations().booked(&verdict, booked);
        }
        let delay_us =
            (reserved && (shadow || verdict.allowed)).then_some(if holds { booked } else { 0 });
        if due_us > verdict.at_us
            && op == Op::Refund
            && !degraded
            && verdict.units().iter().any(|u| *u > 0)
        {
            counters.reservations().cancels.increment(1);
        }
        // What was taken, for a refund: an allowed acquire's cost, or what a report recorded.
        // A fail-open answer took nothing.
        let taken = match op {
            Op::Acquire if verdict.allowed => cost,
            Op::Report => verdict.units().iter().copied().max().unwrap_or(0),
            _ => 0,
        };
        // Nothing an override decided alone was taken from the store, so nothing can be refunded.
        let ticket = (taken > 0
            && !matches!(decided_by, DecidedBy::FailOpen | DecidedBy::Override))
        .then(|| {
            let id = mix(self.ticket_seed ^ self.ticket_count.fetch_add(1, Ordering::Relaxed));
            self.tickets.issue(&policy, key, taken, &verdict, id)
        })
        .flatten();
        Ok(Acquired {
            op,
            policy,
            etag,
            verdict,
            degraded,
            decided_by,
            shadow,
            ticket,
            delay_us,
            applied,
            given,
        })
    }

    /// The verdict for `plan` and who gave it: a cached denial, the store's, or the fail mode's
    /// when the store fails.
    async fn ask_store(
        &self,
        plan: &Plan<'_>,
        resolved: &Resolved,
        started: Instant,
    ) -> Result<(Verdict, DecidedBy), ServiceError> {
        // Only an enforced acquire of 1 unit of a one-limit policy meets the denial cache (see
        // `denials`: a larger cost's retry time is its own; a reservation may book what an
        // acquire is denied), and only on the store's clock: the
        // cache counts retry times on this instance's monotonic clock, which a time set by hand
        // (tests) does not move.
        let denials = match (&self.denials, resolved.denial_version) {
            (Some(d), Some(version))
                if matches!(plan.ask, Ask::Acquire { .. })
                    && plan.cost() == 1
                    && !resolved.shadow
                    && plan.params.len() == 1
                    && plan.at_us.is_none() =>
            {
                Some((d, version))
            }
            _ => None,
        };
        let (name, key) = (plan.policy.name.as_str(), plan.key.as_str());
        let version = denials.map_or(0, |(_, v)| v);
        let denials = denials.map(|(d, _)| d);
        let lookup = denials.map(|d| d.check(name, version, key, started));
        if let Some(Lookup::Hit(denied)) = lookup {
            return Ok((
                cached_denial(denied, self.clock.now_us()),
                DecidedBy::LocalCache,
            ));
        }
        let decided = self.store.decide(plan);
        match crate::trace::store_call("store decide", self.store_decider().as_str(), decided).await
        {
            Ok(verdict) => {
                if let (Some(d), Some(Lookup::Miss(Some(ticket)))) = (denials, lookup) {
                    if let Some(denied) = denial_of(&verdict) {
                        d.insert(name, version, key, ticket, denied, Instant::now());
                    }
                }
                Ok((verdict, self.store_decider()))
            }
            Err(e) => Ok(self.fail_modes.decision(plan, e, self.clock.now_us())?),
        }
    }

    /// Deletes the subject `key`'s state for every limit of the policy named `name`, or, of a
    /// concurrency policy, ends every lease of the subject (their ids are unknown from then on:
    /// a support tool for a stuck holder). Not a decision: a failing store is an error whatever
    /// the fail mode (`local` also clears this instance's own state, so that the reset holds for
    /// what it decides meanwhile).
    pub async fn reset(&self, name: &str, key: &LimitKey) -> Result<(), ServiceError> {
        let Found {
            policy, counters, ..
        } = self.policy(name).await?;
        // Counted once done: a policy's counters are registered by its first counted call.
        let resets = || counters.of(&policy).resets.increment(1);
        match policy.kind {
            Kind::Concurrency(_) => {
                self.reset_leases(&policy, key).await?;
                resets();
                return Ok(());
            }
            Kind::Rate(_) => {}
        }
        if let Some(local) = self.fail_modes.local() {
            local.clear(&policy, key);
        }
        self.store.reset(&policy, key).await?;
        self.invalidate_denials(&policy, key).await;
        resets();
        Ok(())
    }

    /// Drops this instance's cached denial of the subject, and tells every instance to (see
    /// `denials`). A message that cannot be sent is logged: the other instances' entries end by
    /// their bound, `limits.denial_cache_ms`.
    async fn invalidate_denials(&self, policy: &Policy, key: &LimitKey) {
        if !self.store.is_shared() {
            return;
        }
        if let Some(d) = &self.denials {
            d.invalidate(policy.name.as_str(), key.as_str());
        }
        let message = denials::message(policy.name.as_str(), key.as_str());
        if let Err(e) = self.store.publish_invalidation(&message).await {
            static UNSENT: Summarized = Summarized::per_second();
            if let Some(count) = UNSENT.hit() {
                tracing::warn!(policy = %policy.name, error = %e, count, "could not publish a denial cache invalidation; other instances' cached denials of the subject end by limits.denial_cache_ms");
            }
        }
    }
}

/// A bijection of u64 (SplitMix64's finaliser): distinct counters give distinct ids.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A denial from the cache as the verdict of a one-limit policy: nothing left, and the times as
/// the cache counts them down.
fn cached_denial(denied: denials::Denied, now_us: u64) -> Verdict {
    let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    let mut verdict = Verdict::at(now_us);
    verdict.push(Decision {
        allowed: false,
        remaining: 0,
        reset_after_us: us(denied.reset_after),
        retry_after_us: us(denied.retry_after),
    });
    verdict
}

/// What the cache keeps of Redis's denial of 1 unit of a one-limit policy: its times, when it
/// shows nothing left (always, for a denial of 1 unit; checked all the same).
fn denial_of(verdict: &Verdict) -> Option<denials::Denied> {
    match verdict.limits() {
        [d] if !d.allowed && d.remaining == 0 && d.retry_after_us > 0 => Some(denials::Denied {
            retry_after: Duration::from_micros(d.retry_after_us),
            reset_after: Duration::from_micros(d.reset_after_us),
        }),
        _ => None,
    }
}
