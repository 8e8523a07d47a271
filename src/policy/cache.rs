//! The in-process cache of policies, read on every acquire.
//!
//! Reads take a shared lock for a hash lookup and an `Arc` clone. The cache is refreshed from
//! the store whenever the store's policy version moves (see `service::RateLimiter::refresh`), and
//! updated at once by writes made through this instance.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::Policy;

#[derive(Debug, Default)]
pub struct PolicyCache {
    inner: RwLock<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    policies: HashMap<Arc<str>, Arc<Policy>>,
    /// The store's policy version these entries reflect; `None` before the first load.
    version: Option<u64>,
}

impl PolicyCache {
    pub fn get(&self, name: &str) -> Option<Arc<Policy>> {
        self.read().policies.get(name).cloned()
    }

    /// Every cached policy, in no particular order.
    pub fn all(&self) -> Vec<Policy> {
        self.read()
            .policies
            .values()
            .map(|p| (**p).clone())
            .collect()
    }

    /// The version last loaded with [`PolicyCache::replace_all`].
    pub fn version(&self) -> Option<u64> {
        self.read().version
    }

    pub fn len(&self) -> usize {
        self.read().policies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Replaces every entry with the store's full list, as of `version`.
    pub fn replace_all(&self, policies: Vec<Policy>, version: u64) {
        let policies = policies
            .into_iter()
            .map(|p| (Arc::from(p.name.as_str()), Arc::new(p)))
            .collect();
        let mut inner = self.write();
        inner.policies = policies;
        inner.version = Some(version);
    }

    pub fn insert(&self, policy: Policy) {
        let name = Arc::from(policy.name.as_str());
        self.write().policies.insert(name, Arc::new(policy));
    }

    pub fn remove(&self, name: &str) {
        self.write().policies.remove(name);
    }

    // A poisoned lock only means a writer panicked between two whole-map assignments: the map
    // itself is always consistent, so keep serving it.
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }
}
