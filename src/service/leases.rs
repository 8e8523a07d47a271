//! Leases on concurrency policies: take, renew and release, each one store call, with the
//! policy's fail mode when the store fails, and the lease metrics.
//!
//! Fail modes, when the store cannot be asked:
//! - `open`: a take is granted without counting anything (`fail_open`, degraded), with a lease
//!   id that nothing stores; a renewal succeeds and a release is done, neither touching a store.
//!   Once the store is back, renewing such a lease is an unknown lease: the holder takes a new
//!   one.
//! - `local`: this instance decides with its own embedded store (`fail_local`, degraded): its
//!   leases count against the limit per instance, and a lease the shared store holds is unknown
//!   to it (a renewal is an unknown lease; a release does nothing there).
//! - `closed`: take, renewal and release all fail (503): the client retries a release later, and
//!   the lease expires anyway.
//!
//! In every mode, a take whose outcome is unknown, and a release the fail mode answered as
//! done, are undone on the store once it answers again ([`super::undo`]), so that no slot stays
//! held by a lease nobody was given. A call's `lease_ms` is bounded by its policy's
//! `max_lease_ms`; a reset of a subject ends its leases ([`RateLimiter::reset`]).
//!
//! Metrics, per policy: `ratelimiter_leases_total{event}` counts what the store (or `local`'s)
//! did: `granted`, `denied`, `renewed`, `released` (a live lease ended) and `expired` (holders
//! that died or forgot); `fail_open` counts calls answered without any store. Expiries are read
//! from the policy's ledger (see [`crate::limiter::concurrency::Ledger`]): the call that drops an
//! expired lease from it counts it, once over all instances, so the counter sums over instances.
//! Every instance also sweeps, once a second, the ledgers that may hold leases
//! ([`RateLimiter::sweep_leases`]: those of the store's lease index, not every concurrency
//! policy), which counts the expiries that no call would find (a subject whose last lease
//! expired with its key) within about a second of them. `ratelimiter_leases_in_use` is
//! the policy's live leases in the shared store, over all instances, as of the latest answer or
//! sweep this instance saw: every instance reports the same number, so aggregate it with `max`,
//! not `sum`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use metrics::{Counter, Gauge};

use super::undo::Undo;
use super::{DecidedBy, LeaseId, RateLimiter, ServiceError};
use crate::limiter::concurrency::{LeaseAnswer, LeaseCall, LeaseOp, Params};
use crate::metrics as m;
use crate::policy::{LimitKey, Policy};
use crate::store::memory::system_now_us;
use crate::store::{ErrorClass, Etag, LeasePlan, LeasedLedger, Store, StoreError};

/// One answered take or renewal.
#[derive(Debug, Clone)]
pub struct Leased {
    pub policy: Arc<Policy>,
    /// The version of the policy this instance decided with.
    pub etag: Etag,
    /// The policy's limit and default lifetime as decided with.
    pub params: Params,
    pub key: LimitKey,
    /// The lease: granted by a take, or renewed. `None` for a denied take.
    pub lease: Option<LeaseId>,
    pub answer: LeaseAnswer,
    pub decided_by: DecidedBy,
}

impl Leased {
    /// Whether the take was granted (a renewal that answers was always live).
    pub fn granted(&self) -> bool {
        self.lease.is_some()
    }

    /// Units still free: the limit less what live leases hold, never negative (a lowered limit
    /// may be below what is held).
    pub fn remaining(&self) -> u64 {
        self.params.limit.saturating_sub(self.answer.in_use)
    }
}

/// One answered release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// The lease was live, and is no more.
    pub was_live: bool,
    /// Who answered; `None` when no store was asked (the lease's policy is gone, or is no longer
    /// a concurrency policy: its leases are unknown).
    pub decided_by: Option<DecidedBy>,
}

/// A policy's lease metrics, registered once.
struct LeaseCounters {
    granted: Counter,
    denied: Counter,
    renewed: Counter,
    released: Counter,
    expired: Counter,
    fail_open: Counter,
    in_use: Gauge,
}

impl LeaseCounters {
    fn new(policy: &str) -> Self {
        let event = |event: &'static str| metrics::counter!(m::LEASES, "policy" => policy.to_owned(), "event" => event);
        Self {
            granted: event("granted"),
            denied: event("denied"),
            renewed: event("renewed"),
            released: event("released"),
            expired: event("expired"),
            fail_open: event("fail_open"),
            in_use: metrics::gauge!(m::LEASES_IN_USE, "policy" => policy.to_owned()),
        }
    }

    /// Counts one answer to `op`.
    fn count(&self, op: LeaseOp, answer: &LeaseAnswer, decided_by: DecidedBy) {
        match decided_by {
            // Nothing stored, nothing to release or expire later.
            DecidedBy::FailOpen => {
                self.fail_open.increment(1);
                return;
            }
            // This instance's own leases, not the policy's: counted, but not the gauge.
            DecidedBy::FailLocal => {}
            _ => self.in_use.set(answer.leases as f64),
        }
        match (op, answer.ok) {
            (LeaseOp::Take, true) => self.granted.increment(1),
            (LeaseOp::Take, false) => self.denied.increment(1),
            (LeaseOp::Renew, true) => self.renewed.increment(1),
            (LeaseOp::Release, true) => self.released.increment(1),
            (
                LeaseOp::Renew | LeaseOp::Release | LeaseOp::Look | LeaseOp::Sweep | LeaseOp::Reset,
                _,
            ) => {}
        }
        self.expired.increment(answer.expired);
    }
}

/// Every policy's lease metrics.
#[derive(Default)]
pub(super) struct LeaseMetrics(RwLock<HashMap<Arc<str>, Arc<LeaseCounters>>>);

impl LeaseMetrics {
    /// Zeroes and forgets the gauges of policies for which `live` says no: a deleted policy's
    /// leases are unknown, none in use.
    fn retain(&self, live: impl Fn(&str) -> bool) {
        let mut all = self.0.write().unwrap_or_else(|e| e.into_inner());
        all.retain(|name, counters| {
            let kept = live(name);
            if !kept {
                counters.in_use.set(0.0);
            }
            kept
        });
    }

    fn of(&self, policy: &str) -> Arc<LeaseCounters> {
        if let Some(c) = self.0.read().unwrap_or_else(|e| e.into_inner()).get(policy) {
            return c.clone();
        }
        self.0
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(Arc::from(policy))
            .or_insert_with(|| Arc::new(LeaseCounters::new(policy)))
            .clone()
    }
}

/// `lease_ms` as the lease's lifetime in µs, or the policy's; refused above the policy's
/// `max_lease_ms`.
fn lifetime_us(params: &Params, lease_ms: Option<u64>) -> Result<u64, ServiceError> {
    let Some(ms) = lease_ms else {
        return Ok(params.lease_us);
    };
    let us = ms.saturating_mul(1_000);
    if us > params.max_lease_us {
        return Err(ServiceError::LeaseTooLong {
            asked: ms,
            max: params.max_lease_us / 1_000,
        });
    }
    Ok(us)
}

impl RateLimiter {
    /// Takes a lease of `cost` units (1 to the policy's `limit`) for `lease_ms` (already within
    /// 1 to [`crate::limiter::concurrency::MAX_LEASE_MS`], and refused above the policy's
    /// `max_lease_ms`; the policy's `lease_ms` when `None`)
    /// on the subject `key` of the concurrency policy named `name` (already checked with
    /// [`crate::policy::PolicyName::check`]). A denial is an answer, not an error.
    pub async fn take_lease(
        &self,
        name: &str,
        key: LimitKey,
        cost: u64,
        lease_ms: Option<u64>,
    ) -> Result<Leased, ServiceError> {
        let (policy, etag, params) = self
            .resolve_lease(name, || ServiceError::RatePolicy(name.to_owned()))
            .await?;
        if cost > params.limit {
            return Err(ServiceError::CostAboveQuota {
                cost,
                quota: params.limit,
                field: "limit",
                limit: None,
            });
        }
        let lease_us = lifetime_us(&params, lease_ms)?;
        // The id is drawn before the take is sent: a take that gets no answer can be undone
        // by it (see `undo`).
        let id = LeaseId::issue(&policy.name, &key, cost)?;
        let call = LeaseCall {
            op: LeaseOp::Take,
            member: id.member(),
            cost,
            lease_us,
            limit: params.limit,
            deadline_us: self.store.lease_deadline(self.clock.at_us()),
        };
        let (answer, decided_by) = self.lease_call(&policy, &key, call).await?;
        Ok(Leased {
            lease: answer.ok.then_some(id),
            policy,
            etag,
            params,
            key,
            answer,
            decided_by,
        })
    }

    /// Extends the live lease `id` to `lease_ms` from now (the policy's `lease_ms` when `None`).
    /// A lease that has expired, was released or never existed is
    /// [`ServiceError::UnknownLease`], as is one whose policy is no longer a concurrency policy;
    /// one whose policy was deleted is [`ServiceError::UnknownPolicy`].
    pub async fn renew_lease(
        &self,
        id: LeaseId,
        lease_ms: Option<u64>,
    ) -> Result<Leased, ServiceError> {
        let (policy, etag, params) = self
            .resolve_lease(id.policy().as_str(), || ServiceError::UnknownLease(GONE))
            .await?;
        let call = LeaseCall {
            op: LeaseOp::Renew,
            member: id.member(),
            cost: id.cost(),
            lease_us: lifetime_us(&params, lease_ms)?,
            limit: params.limit,
            deadline_us: None,
        };
        let (answer, decided_by) = self.lease_call(&policy, id.key(), call).await?;
        if !answer.ok {
            return Err(ServiceError::UnknownLease(GONE));
        }
        Ok(Leased {
            key: id.key().clone(),
            lease: Some(id),
            policy,
            etag,
            params,
            answer,
            decided_by,
        })
    }

    /// Ends the lease `id`, live or not: idempotent. A lease whose policy is gone, or is no
    /// longer a concurrency policy, is unknown, and its release does nothing.
    pub async fn release_lease(&self, id: LeaseId) -> Result<Released, ServiceError> {
        let unknown = || ServiceError::UnknownLease(GONE);
        let (policy, _, params) = match self.resolve_lease(id.policy().as_str(), unknown).await {
            Ok(found) => found,
            Err(ServiceError::UnknownPolicy(_) | ServiceError::UnknownLease(_)) => {
                return Ok(Released::UNKNOWN)
            }
            Err(e) => return Err(e),
        };
        let call = LeaseCall {
            op: LeaseOp::Release,
            member: id.member(),
            cost: id.cost(),
            lease_us: 0,
            limit: params.limit,
            deadline_us: None,
        };
        let (answer, decided_by) = self.lease_call(&policy, id.key(), call).await?;
        Ok(Released {
            was_live: answer.ok,
            decided_by: Some(decided_by),
        })
    }

    /// Ends every lease of the subject `key` of the concurrency policy `policy`, on the store
    /// (an error when it fails, whatever the fail mode) and in this instance's own store for
    /// `local`.
    pub(super) async fn reset_leases(
        &self,
        policy: &Arc<Policy>,
        key: &LimitKey,
    ) -> Result<(), ServiceError> {
        let params = policy
            .concurrency()
            .ok_or_else(|| ServiceError::RatePolicy(policy.name.to_string()))?;
        let call = LeaseCall {
            op: LeaseOp::Reset,
            member: "",
            cost: 0,
            lease_us: 0,
            limit: params.limit,
            deadline_us: None,
        };
        let plan = LeasePlan {
            policy,
            key,
            call,
            at_us: self.clock.at_us(),
        };
        if let Some(local) = self.fail_modes.local() {
            let _ = local.lease_at(&plan, plan.at_us);
        }
        let answer = self.store.lease(&plan).await?;
        self.leases
            .of(policy.name.as_str())
            .count(LeaseOp::Reset, &answer, self.store_decider());
        Ok(())
    }

    /// Sweeps the ledgers that may hold leases, on the store, and counts what the sweeps found
    /// (see the module doc): one read of the lease index (on Redis; the embedded store knows
    /// its ledgers), then one script call per ledger it holds, at most `limits.lease_sweep_budget`
    /// a round, taking turns when more are held. A ledger found empty after its index entry's
    /// time, or of a policy that is gone, leaves the index. The cost of a round follows the
    /// ledgers in use, not the number of concurrency policies. A store that fails is left for
    /// the next round. Returns the ledgers swept.
    pub async fn sweep_leases(&self) -> usize {
        let entries = match self.store.leased_ledgers().await {
            Ok(entries) => entries,
            Err(e) => {
                tracing::debug!(error = %e, "could not read the lease index; sweeping next time");
                return 0;
            }
        };
        let budget = self.sweep_budget.min(entries.len());
        let start = match entries.len() {
            0 => 0,
            n => self.sweep_cursor.fetch_add(budget, Ordering::Relaxed) % n,
        };
        let mut swept = 0;
        for entry in entries.iter().cycle().skip(start).take(budget) {
            let policy = self
                .cache
                .get(&entry.policy)
                .map(|f| f.policy)
                .filter(|p| p.incarnation() == entry.incarnation && p.concurrency().is_some());
            let Some(policy) = policy else {
                // Deleted, created again or of another kind: its leases are unknown. (A policy
                // this instance has not loaded yet keeps its entry until its time passes.)
                self.unindex_when_due(entry, None).await;
                continue;
            };
            swept += 1;
            match self.store.sweep_leases(&policy, None).await {
                Ok(answer) => {
                    self.leases.of(policy.name.as_str()).count(
                        LeaseOp::Sweep,
                        &answer,
                        self.store_decider(),
                    );
                    if answer.leases == 0 {
                        self.unindex_when_due(entry, Some(answer.at_us)).await;
                    }
                }
                Err(e) => {
                    tracing::debug!(policy = %policy.name, error = %e, "could not sweep a policy's leases");
                }
            }
        }
        metrics::gauge!(m::LEASE_SWEEP_LEDGERS).set(swept as f64);
        self.leases.retain(|name| {
            self.cache
                .get(name)
                .is_some_and(|f| f.policy.concurrency().is_some())
        });
        swept
    }

    /// Takes `entry` out of the lease index once its time has passed: by the store's clock
    /// `now_us` when a sweep read it, else by this machine's (the entry's time is a minute's
    /// worth of margin past its leases, so a skewed clock only delays it).
    async fn unindex_when_due(&self, entry: &LeasedLedger, now_us: Option<u64>) {
        let now = now_us.unwrap_or_else(system_now_us);
        if entry.until_us >= now {
            return;
        }
        if let Err(e) = self.store.unindex_ledger(entry).await {
            tracing::debug!(policy = %entry.policy, error = %e, "could not take a ledger out of the lease index");
        }
    }

    /// One lease call to the store, or by fail mode when it fails; counted.
    async fn lease_call(
        &self,
        policy: &Arc<Policy>,
        key: &LimitKey,
        call: LeaseCall<'_>,
    ) -> Result<(LeaseAnswer, DecidedBy), ServiceError> {
        let plan = LeasePlan {
            policy,
            key,
            call,
            at_us: self.clock.at_us(),
        };
        let (answer, decided_by) = match self.store.lease(&plan).await {
            Ok(answer) => (answer, self.store_decider()),
            Err(e) => self.lease_by_fail_mode(&plan, policy, e)?,
        };
        self.leases
            .of(policy.name.as_str())
            .count(call.op, &answer, decided_by);
        Ok((answer, decided_by))
    }

    /// The answer when the store failed, by fail mode ([`super::fail_mode`]), and what to undo
    /// on the store once it answers again.
    fn lease_by_fail_mode(
        &self,
        plan: &LeasePlan<'_>,
        policy: &Arc<Policy>,
        error: StoreError,
    ) -> Result<(LeaseAnswer, DecidedBy), ServiceError> {
        let (key, call) = (plan.key, plan.call);
        // A take that got no answer may yet be run by the store, granting a lease to nobody
        // that would keep its units for the whole lease: it is undone once the store answers
        // again, whatever the fail mode answers (see `undo`). So is a release the fail mode
        // answers as done, below, so that the holder's slot is freed on the store too.
        let unknown_take = call.op == LeaseOp::Take && error.class() == ErrorClass::OutcomeUnknown;
        if unknown_take && error.class().answered_by_fail_mode() {
            let lease = Duration::from_micros(call.lease_us);
            self.undos
                .push(Undo::new(policy.clone(), key.clone(), &call, lease));
        }
        let (answer, decided_by) = self.fail_modes.lease(plan, error, self.clock.now_us())?;
        if decided_by == DecidedBy::FailOpen && call.op == LeaseOp::Release {
            // The lease may live as long as the policy allows any to.
            let longest = policy.concurrency().map_or(0, |p| p.max_lease_us);
            let lease = Duration::from_micros(longest);
            self.undos
                .push(Undo::new(policy.clone(), key.clone(), &call, lease));
        }
        Ok((answer, decided_by))
    }
}

impl Released {
    const UNKNOWN: Released = Released {
        was_live: false,
        decided_by: None,
    };
}

/// Why a lease is unknown.
const GONE: &str = "the lease has expired, was released, or never existed: take a new one";
