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
//! Metrics, per policy: `ratelimiter_leases_total{event}` counts what the store (or `local`'s)
//! did: `granted`, `denied`, `renewed`, `released` (a live lease ended) and `expired` (holders
//! that died or forgot); `fail_open` counts calls answered without any store. Expiries are read
//! from the policy's ledger (see [`crate::limiter::concurrency::Ledger`]): the call that drops an
//! expired lease from it counts it, once over all instances, so the counter sums over instances.
//! Every instance also sweeps each concurrency policy's ledger once a second
//! ([`RateLimiter::sweep_leases`]), which counts the expiries that no call would find (a subject
//! whose last lease expired with its key) within a second of them. `ratelimiter_leases_in_use` is
//! the policy's live leases in the shared store, over all instances, as of the latest answer or
//! sweep this instance saw: every instance reports the same number, so aggregate it with `max`,
//! not `sum`.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use metrics::{Counter, Gauge};

use super::{DecidedBy, LeaseId, RateLimiter, ServiceError};
use crate::limiter::concurrency::{LeaseAnswer, LeaseCall, LeaseOp, Params};
use crate::metrics as m;
use crate::policy::{FailMode, LimitKey, Policy};
use crate::store::memory::system_now_us;
use crate::store::{ErrorClass, Etag, Store, StoreError};
use crate::telemetry::Summarized;

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
            (LeaseOp::Renew | LeaseOp::Release | LeaseOp::Look | LeaseOp::Sweep, _) => {}
        }
        self.expired.increment(answer.expired);
    }
}

/// Every policy's lease metrics.
#[derive(Default)]
pub(super) struct LeaseMetrics(RwLock<HashMap<Arc<str>, Arc<LeaseCounters>>>);

impl LeaseMetrics {
    /// Zeroes and forgets the gauges of policies that are not among `live`: a deleted policy's
    /// leases are unknown, none in use.
    fn retain(&self, live: &[Arc<Policy>]) {
        let mut all = self.0.write().unwrap_or_else(|e| e.into_inner());
        all.retain(|name, counters| {
            let kept = live.iter().any(|p| p.name.as_str() == &**name);
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

/// `lease_ms` as the lease's lifetime in µs, or the policy's.
fn lifetime_us(params: &Params, lease_ms: Option<u64>) -> u64 {
    lease_ms.map_or(params.lease_us, |ms| ms.saturating_mul(1_000))
}

impl RateLimiter {
    /// Takes a lease of `cost` units (1 to the policy's `limit`) for `lease_ms` (already within
    /// 1 to [`crate::limiter::concurrency::MAX_LEASE_MS`]; the policy's `lease_ms` when `None`)
    /// on the subject `key` of the concurrency policy named `name` (already checked with
    /// [`crate::policy::PolicyName::check`]). A denial is an answer, not an error. `now_us`
    /// drives time explicitly (tests only).
    pub async fn take_lease(
        &self,
        name: &str,
        key: LimitKey,
        cost: u64,
        lease_ms: Option<u64>,
        now_us: Option<u64>,
    ) -> Result<Leased, ServiceError> {
        let (policy, etag) = self.policy(name).await?;
        let params = policy
            .concurrency()
            .ok_or_else(|| ServiceError::RatePolicy(name.to_owned()))?;
        if cost > params.limit {
            return Err(ServiceError::CostAboveQuota {
                cost,
                quota: params.limit,
                field: "limit",
                limit: None,
            });
        }
        let id = LeaseId::issue(&policy.name, &key, cost)?;
        let call = LeaseCall {
            op: LeaseOp::Take,
            member: id.member(),
            cost,
            lease_us: lifetime_us(&params, lease_ms),
            limit: params.limit,
        };
        let (answer, decided_by) = self.lease_call(&policy, &key, call, now_us).await?;
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
        now_us: Option<u64>,
    ) -> Result<Leased, ServiceError> {
        let (policy, etag) = self.policy(id.policy().as_str()).await?;
        let params = policy
            .concurrency()
            .ok_or(ServiceError::UnknownLease(GONE))?;
        let call = LeaseCall {
            op: LeaseOp::Renew,
            member: id.member(),
            cost: id.cost(),
            lease_us: lifetime_us(&params, lease_ms),
            limit: params.limit,
        };
        let (answer, decided_by) = self.lease_call(&policy, id.key(), call, now_us).await?;
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
    pub async fn release_lease(
        &self,
        id: LeaseId,
        now_us: Option<u64>,
    ) -> Result<Released, ServiceError> {
        let (policy, _) = match self.policy(id.policy().as_str()).await {
            Ok(found) => found,
            Err(ServiceError::UnknownPolicy(_)) => return Ok(Released::UNKNOWN),
            Err(e) => return Err(e),
        };
        let Some(params) = policy.concurrency() else {
            return Ok(Released::UNKNOWN);
        };
        let call = LeaseCall {
            op: LeaseOp::Release,
            member: id.member(),
            cost: id.cost(),
            lease_us: 0,
            limit: params.limit,
        };
        let (answer, decided_by) = self.lease_call(&policy, id.key(), call, now_us).await?;
        Ok(Released {
            was_live: answer.ok,
            decided_by: Some(decided_by),
        })
    }

    /// Sweeps the ledger of every concurrency policy this instance knows, on the store, and
    /// counts what the sweeps found (see the module doc): one script call per concurrency
    /// policy. A store that fails is left for the next sweep.
    pub async fn sweep_leases(&self) {
        let policies = self.cache.filtered(|p| p.concurrency().is_some());
        for policy in &policies {
            match self.store.sweep_leases(policy, None).await {
                Ok(answer) => self.leases.of(policy.name.as_str()).count(
                    LeaseOp::Sweep,
                    &answer,
                    self.store_decider(),
                ),
                Err(e) => {
                    tracing::debug!(policy = %policy.name, error = %e, "could not sweep a policy's leases");
                }
            }
        }
        self.leases.retain(&policies);
    }

    /// One lease call to the store, or by fail mode when it fails; counted.
    async fn lease_call(
        &self,
        policy: &Policy,
        key: &LimitKey,
        call: LeaseCall<'_>,
        now_us: Option<u64>,
    ) -> Result<(LeaseAnswer, DecidedBy), ServiceError> {
        let (answer, decided_by) = match self.store.lease(policy, key, call, now_us).await {
            Ok(answer) => (answer, self.store_decider()),
            Err(e) => {
                self.lease_by_fail_mode(policy, key, call, now_us, e)
                    .await?
            }
        };
        self.leases
            .of(policy.name.as_str())
            .count(call.op, &answer, decided_by);
        Ok((answer, decided_by))
    }

    /// The answer when the store failed: the answer and who gave it, or the error, by fail mode.
    async fn lease_by_fail_mode(
        &self,
        policy: &Policy,
        key: &LimitKey,
        call: LeaseCall<'_>,
        now_us: Option<u64>,
        error: StoreError,
    ) -> Result<(LeaseAnswer, DecidedBy), ServiceError> {
        if !error.class().answered_by_fail_mode() {
            return Err(error.into());
        }
        static DEGRADED: Summarized = Summarized::per_second();
        if let Some(count) = DEGRADED.hit() {
            tracing::warn!(policy = %policy.name, %error, op = call.op.as_str(), fail_mode = policy.fail_mode.as_str(), count, "store failed on a lease call; answering by fail mode (count: calls since the last such line)");
        }
        let now = now_us.unwrap_or_else(system_now_us);
        if let (FailMode::Local, Some(local)) = (policy.fail_mode, &self.local) {
            // A full local store (`StoreError::Full`) answers as `open` does, below. So does a
            // renewal or a release the local store does not know: the lease was most likely
            // taken on the shared store before it failed, and a 404 would tell a holder whose
            // lease is still live there to stop its work.
            if let Ok(answer) = local.lease_at(policy, key, call, now) {
                if answer.ok || matches!(call.op, LeaseOp::Take | LeaseOp::Look) {
                    return Ok((answer, DecidedBy::FailLocal));
                }
            }
        }
        match policy.fail_mode {
            // A take that got no answer may have been granted by a lease nobody holds, which
            // would keep its units for the whole lease: release it, on a best effort (the
            // store is failing), before refusing. A renewal or a release is retried by its
            // holder, and the lease expires anyway.
            FailMode::Closed => {
                if call.op == LeaseOp::Take && error.class() == ErrorClass::OutcomeUnknown {
                    let release = LeaseCall {
                        op: LeaseOp::Release,
                        ..call
                    };
                    let undone = self.store().lease(policy, key, release, now_us).await;
                    tracing::debug!(policy = %policy.name, undone = undone.is_ok(), "released a take whose outcome is unknown");
                }
                Err(error.outcome_known().into())
            }
            FailMode::Open | FailMode::Local => {
                // A take is granted and a renewal succeeds; a release is done, but whether the
                // lease was live is not known.
                let holds = matches!(call.op, LeaseOp::Take | LeaseOp::Renew);
                Ok((
                    LeaseAnswer {
                        ok: holds,
                        in_use: if holds { call.cost } else { 0 },
                        expires_in_us: if holds { call.lease_us } else { 0 },
                        ..LeaseAnswer::at(now)
                    },
                    DecidedBy::FailOpen,
                ))
            }
        }
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
