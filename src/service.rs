//! The rate limiter as the API sees it: the policy cache in front of the store, and what to do
//! when the store fails.
//!
//! Acquires read the policy from the in-process cache and make one store call. When the store
//! cannot answer, the policy's fail mode decides: `open` allows, `closed` refuses, `local`
//! decides with an in-process store until the shared one is back. Policy writes go to the store
//! first and then to the cache, so this instance reads its own writes at once; other instances
//! see them when their refresh loop notices the store's policy version move. Policy reads fall
//! back to the cache while the store is unreachable.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use metrics::{Counter, Histogram};

use crate::limiter::Decision;
use crate::metrics as m;
use crate::policy::{FailMode, LimitKey, Policy, PolicyCache, PolicyName};
use crate::store::breaker::BreakerState;
use crate::store::memory::system_now_us;
use crate::store::{AnyStore, MemoryStore, PutOutcome, Store, StoreError};

/// Why a service call did not produce its answer.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("no policy named `{0}`")]
    UnknownPolicy(String),
    #[error("a policy named `{0}` already exists")]
    PolicyExists(String),
    #[error(
        "`cost` {cost} exceeds the policy's `{field}` of {quota}, so it could never be granted"
    )]
    CostAboveQuota {
        cost: u64,
        quota: u64,
        field: &'static str,
    },
    /// The store failed on a policy whose fail mode is `closed`, or on a policy write.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One answered acquire.
#[derive(Debug, Clone)]
pub struct Acquired {
    pub policy: Arc<Policy>,
    pub decision: Decision,
    /// The shared store could not be asked: the policy's fail mode (`open` or `local`) decided.
    pub degraded: bool,
}

/// A policy's decision counters, registered once.
struct DecisionCounters {
    allowed: Counter,
    denied: Counter,
    degraded: Counter,
}

impl DecisionCounters {
    fn new(policy: &str) -> Self {
        let counter = |outcome: &'static str| metrics::counter!(m::DECISIONS, "policy" => policy.to_owned(), "outcome" => outcome);
        Self {
            allowed: counter("allowed"),
            denied: counter("denied"),
            degraded: counter("degraded"),
        }
    }
}

pub struct RateLimiter {
    store: AnyStore,
    cache: PolicyCache,
    /// Decides for `fail_mode: local` policies while a shared store is unreachable.
    local: Option<MemoryStore>,
    counters: RwLock<HashMap<Arc<str>, Arc<DecisionCounters>>>,
    acquire_seconds: Histogram,
}

impl RateLimiter {
    /// `max_embedded_subjects` caps the in-process store that `local` fail mode decides with.
    pub fn new(store: AnyStore, key_prefix: &str, max_embedded_subjects: u64) -> Self {
        let local = match store {
            AnyStore::Memory(_) => None,
            AnyStore::Redis(_) => Some(MemoryStore::new(key_prefix, max_embedded_subjects)),
        };
        // Installs the recorder before the first counter is registered.
        let _ = m::handle();
        Self {
            store,
            cache: PolicyCache::default(),
            local,
            counters: RwLock::default(),
            acquire_seconds: metrics::histogram!(m::ACQUIRE_SECONDS),
        }
    }

    pub fn store(&self) -> &AnyStore {
        &self.store
    }

    pub fn cache(&self) -> &PolicyCache {
        &self.cache
    }

    /// Decides one acquire for the policy named `name` (already checked with
    /// [`PolicyName::check`]). `now_us` drives time explicitly (tests only).
    pub async fn acquire(
        &self,
        name: &str,
        key: &LimitKey,
        cost: u64,
        now_us: Option<u64>,
    ) -> Result<Acquired, ServiceError> {
        let started = Instant::now();
        let policy = self.policy(name).await?;
        let quota = policy.limit.quota();
        if cost > quota {
            return Err(ServiceError::CostAboveQuota {
                cost,
                quota,
                field: policy.limit.quota_field(),
            });
        }
        let result = match self.store.acquire(&policy, key, cost, now_us).await {
            Ok(decision) => Ok((decision, false)),
            Err(e) => self.by_fail_mode(&policy, key, cost, now_us, e),
        };
        self.acquire_seconds.record(started.elapsed().as_secs_f64());
        let (decision, degraded) = result?;
        let counters = self.counters(&policy);
        match (degraded, decision.allowed) {
            (true, _) => counters.degraded.increment(1),
            (false, true) => counters.allowed.increment(1),
            (false, false) => counters.denied.increment(1),
        }
        Ok(Acquired {
            policy,
            decision,
            degraded,
        })
    }

    /// The answer when the store failed: `(decision, degraded)` or the error, by fail mode.
    fn by_fail_mode(
        &self,
        policy: &Policy,
        key: &LimitKey,
        cost: u64,
        now_us: Option<u64>,
        error: StoreError,
    ) -> Result<(Decision, bool), ServiceError> {
        tracing::warn!(policy = %policy.name, %error, fail_mode = policy.fail_mode.as_str(), "store failed; answering by fail mode");
        if let (FailMode::Local, Some(local)) = (policy.fail_mode, &self.local) {
            let now = now_us.unwrap_or_else(system_now_us);
            // A full local store (`StoreError::Full`) allows, as `open` does, below.
            if let Ok(decision) = local.acquire_at(policy, key, cost, now) {
                return Ok((decision, true));
            }
        }
        match policy.fail_mode {
            FailMode::Closed => Err(error.into()),
            // `local` on the embedded store (full, the only way it fails) allows, as `open`.
            FailMode::Open | FailMode::Local => Ok((
                Decision {
                    allowed: true,
                    remaining: policy.limit.quota() - cost,
                    reset_after_us: 0,
                    retry_after_us: 0,
                },
                true,
            )),
        }
    }

    fn counters(&self, policy: &Policy) -> Arc<DecisionCounters> {
        let name = policy.name.as_str();
        if let Some(c) = self
            .counters
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            return c.clone();
        }
        self.counters
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(Arc::from(name))
            .or_insert_with(|| Arc::new(DecisionCounters::new(name)))
            .clone()
    }

    /// The policy from the cache; on a miss, from the store (it may have been created on another
    /// instance since the last refresh).
    async fn policy(&self, name: &str) -> Result<Arc<Policy>, ServiceError> {
        if let Some(p) = self.cache.get(name) {
            return Ok(p);
        }
        let unknown = || ServiceError::UnknownPolicy(name.to_owned());
        let parsed = PolicyName::parse(name).map_err(|_| unknown())?;
        let policy = self.store.load_policy(&parsed).await?.ok_or_else(unknown)?;
        self.cache.insert(policy);
        self.cache.get(name).ok_or_else(unknown)
    }

    /// Every policy, sorted by name; from the cache while the store is unreachable.
    pub async fn list_policies(&self) -> Result<Vec<Policy>, ServiceError> {
        let mut policies = match self.store.load_policies().await {
            Ok((policies, _)) => policies,
            Err(e) if e.is_transient() && self.cache.version().is_some() => {
                tracing::warn!(error = %e, "store unreachable; listing cached policies");
                self.cache.all()
            }
            Err(e) => return Err(e.into()),
        };
        policies.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(policies)
    }

    /// One policy; from the cache while the store is unreachable.
    pub async fn get_policy(&self, name: &PolicyName) -> Result<Policy, ServiceError> {
        let found = match self.store.load_policy(name).await {
            Ok(found) => found,
            Err(e) if e.is_transient() && self.cache.version().is_some() => {
                tracing::warn!(error = %e, "store unreachable; reading the cached policy");
                self.cache.get(name.as_str()).map(|p| (*p).clone())
            }
            Err(e) => return Err(e.into()),
        };
        found.ok_or_else(|| ServiceError::UnknownPolicy(name.to_string()))
    }

    pub async fn create_policy(&self, policy: Policy) -> Result<Policy, ServiceError> {
        if !self.store.create_policy(&policy).await? {
            return Err(ServiceError::PolicyExists(policy.name.to_string()));
        }
        self.cache.insert(policy.clone());
        Ok(policy)
    }

    pub async fn put_policy(&self, policy: Policy) -> Result<PutOutcome, ServiceError> {
        let outcome = self.store.put_policy(&policy).await?;
        self.cache.insert(policy);
        Ok(outcome)
    }

    pub async fn delete_policy(&self, name: &PolicyName) -> Result<(), ServiceError> {
        if !self.store.delete_policy(name).await? {
            return Err(ServiceError::UnknownPolicy(name.to_string()));
        }
        self.cache.remove(name.as_str());
        Ok(())
    }

    /// Creates each policy that does not exist yet; never overwrites one (it may have been
    /// changed through the API since).
    pub async fn ensure_policies(&self, policies: &[Policy]) -> Result<(), StoreError> {
        for policy in policies {
            if self.store.create_policy(policy).await? {
                tracing::info!(policy = %policy.name, "created policy from the configuration");
            }
        }
        Ok(())
    }

    /// Reloads every policy when the store's version differs from the cache's.
    pub async fn refresh(&self) -> Result<bool, StoreError> {
        let version = self.store.policy_version().await?;
        if self.cache.version() == Some(version) {
            return Ok(false);
        }
        let (policies, version) = self.store.load_policies().await?;
        self.cache.replace_all(policies, version);
        Ok(true)
    }

    /// Why the service cannot decide with its shared store now, if it cannot.
    pub async fn unready(&self) -> Option<String> {
        if self.cache.version().is_none() {
            return Some("policies have not been loaded yet".into());
        }
        if let AnyStore::Redis(r) = &self.store {
            if r.breaker().state() == BreakerState::Open {
                return Some("Redis is unreachable (circuit breaker open)".into());
            }
        }
        self.store.ping().await.err().map(|e| e.to_string())
    }

    /// The in-process store: the main one, or the one `local` fail mode decides with.
    fn memory(&self) -> Option<&MemoryStore> {
        match &self.store {
            AnyStore::Memory(m) => Some(m),
            AnyStore::Redis(_) => self.local.as_ref(),
        }
    }

    /// The Prometheus text exposition, with the state gauges brought up to date.
    pub fn render_metrics(&self) -> String {
        metrics::gauge!(m::POLICIES).set(self.cache.len() as f64);
        if let Some(memory) = self.memory() {
            metrics::gauge!(m::EMBEDDED_SUBJECTS).set(memory.len() as f64);
        }
        if let AnyStore::Redis(r) = &self.store {
            let current = r.breaker().state();
            for state in [
                BreakerState::Closed,
                BreakerState::HalfOpen,
                BreakerState::Open,
            ] {
                metrics::gauge!(m::BREAKER_STATE, "state" => state.as_str())
                    .set(f64::from(u8::from(state == current)));
            }
            let (in_use, idle) = r.pool_connections();
            metrics::gauge!(m::POOL_CONNECTIONS, "state" => "in_use").set(f64::from(in_use));
            metrics::gauge!(m::POOL_CONNECTIONS, "state" => "idle").set(f64::from(idle));
        }
        m::handle().render()
    }

    /// Keeps the cache in step with the store, and in-process memory bounded, until the
    /// process ends.
    pub fn spawn_background(self: &Arc<Self>, refresh_every: Duration) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(refresh_every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_housekeeping = Instant::now();
            loop {
                tick.tick().await;
                let Some(this) = weak.upgrade() else { return };
                if let Err(e) = this.refresh().await {
                    tracing::debug!(error = %e, "could not refresh policies; serving the cached ones");
                }
                if last_housekeeping.elapsed() >= Duration::from_secs(1) {
                    last_housekeeping = Instant::now();
                    let now = system_now_us();
                    if let Some(memory) = this.memory() {
                        let evicted = memory.evict_expired(now);
                        tracing::trace!(evicted, "evicted expired state");
                    }
                    m::handle().run_upkeep();
                }
            }
        });
    }
}
