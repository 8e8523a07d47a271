//! The rate limiter as the API sees it: the policy cache in front of the store.
//!
//! Acquires read the policy from the in-process cache and make one store call. Policy writes go
//! to the store first and then to the cache, so this instance reads its own writes at once;
//! other instances see them when their refresh loop notices the store's policy version move.

use std::sync::Arc;
use std::time::Duration;

use crate::limiter::Decision;
use crate::policy::{FailMode, LimitKey, Policy, PolicyCache, PolicyName};
use crate::store::{AnyStore, PutOutcome, Store, StoreError};

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
    /// The store could not be asked and the policy's fail mode (`open`) allowed the request.
    pub degraded: bool,
}

pub struct RateLimiter {
    store: AnyStore,
    cache: PolicyCache,
}

impl RateLimiter {
    pub fn new(store: AnyStore) -> Self {
        Self {
            store,
            cache: PolicyCache::default(),
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
        let policy = self.policy(name).await?;
        let quota = policy.limit.quota();
        if cost > quota {
            return Err(ServiceError::CostAboveQuota {
                cost,
                quota,
                field: policy.limit.quota_field(),
            });
        }
        match self.store.acquire(&policy, key, cost, now_us).await {
            Ok(decision) => Ok(Acquired {
                policy,
                decision,
                degraded: false,
            }),
            Err(e) => match policy.fail_mode {
                FailMode::Open => {
                    tracing::warn!(policy = %name, error = %e, "store failed; allowing by fail mode open");
                    Ok(Acquired {
                        decision: Decision {
                            allowed: true,
                            remaining: quota - cost,
                            reset_after_us: 0,
                            retry_after_us: 0,
                        },
                        policy,
                        degraded: true,
                    })
                }
                FailMode::Closed => Err(e.into()),
            },
        }
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

    pub async fn list_policies(&self) -> Result<Vec<Policy>, ServiceError> {
        let (mut policies, _) = self.store.load_policies().await?;
        policies.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(policies)
    }

    pub async fn get_policy(&self, name: &PolicyName) -> Result<Policy, ServiceError> {
        self.store
            .load_policy(name)
            .await?
            .ok_or_else(|| ServiceError::UnknownPolicy(name.to_string()))
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

    /// Keeps the cache in step with the store, and the embedded store's memory bounded, until
    /// the process ends.
    pub fn spawn_background(self: &Arc<Self>, refresh_every: Duration) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(refresh_every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_eviction = std::time::Instant::now();
            loop {
                tick.tick().await;
                let Some(this) = weak.upgrade() else { return };
                if let Err(e) = this.refresh().await {
                    tracing::warn!(error = %e, "could not refresh policies; serving the cached ones");
                }
                if let AnyStore::Memory(m) = &this.store {
                    if last_eviction.elapsed() >= Duration::from_secs(1) {
                        last_eviction = std::time::Instant::now();
                        let evicted = m.evict_expired(crate::store::memory::system_now_us());
                        tracing::debug!(evicted, "evicted expired state");
                    }
                }
            }
        });
    }
}
