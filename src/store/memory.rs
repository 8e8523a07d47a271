//! The embedded store: limiter state and policies in this process.
//!
//! It runs the same pure decision functions the Lua scripts mirror, so its answers match
//! Redis's; but its limits are per process, not shared between instances. State lives in a
//! fixed number of independently locked shards; every entry carries the expiry its algorithm
//! asked for, expired entries read as absent, and [`MemoryStore::evict_expired`] (run every
//! second by the service) frees them, so memory stays bounded by the live subjects.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use super::policy_set::PolicySet;
use super::{key, ChangePage, Etag, PolicyWrite, Store, StoreError, Written};
use crate::limiter::{
    fixed_window, sliding_window_counter, sliding_window_log, token_bucket, Decision, Outcome,
};
use crate::policy::{LimitKey, Params, Policy, PolicyName};

const SHARDS: usize = 64;

/// One subject's state, tagged by algorithm (the key names the algorithm too).
#[derive(Debug)]
enum State {
    FixedWindow(fixed_window::State),
    SlidingWindowLog(sliding_window_log::State),
    SlidingWindowCounter(sliding_window_counter::State),
    TokenBucket(token_bucket::State),
}

#[derive(Debug)]
struct Slot {
    state: State,
    expires_at_us: u64,
}

/// The in-process store.
pub struct MemoryStore {
    prefix: String,
    shards: Box<[Mutex<HashMap<String, Slot>>]>,
    policies: Mutex<PolicySet>,
}

/// Microseconds since the Unix epoch by the system clock.
pub fn system_now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

// A panic while a shard is locked cannot leave a half-updated entry (entries are replaced
// whole), so a poisoned lock is still safe to use.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl MemoryStore {
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            policies: Mutex::new(PolicySet::default()),
        }
    }

    /// Decides one acquire at an explicit time.
    pub fn acquire_at(&self, policy: &Policy, key: &LimitKey, cost: u64, now: u64) -> Decision {
        let mut name = String::new();
        key::state_key(
            &mut name,
            &self.prefix,
            policy.name.as_str(),
            key.as_str(),
            policy.algorithm(),
        );
        let mut shard = lock(self.shard(&name));
        // Taken out and put back: the pure functions own the state while they decide.
        let (state, expires_at) = match shard.remove(&name) {
            Some(slot) if slot.expires_at_us > now => (Some(slot.state), slot.expires_at_us),
            _ => (None, 0),
        };

        macro_rules! decide {
            ($module:ident, $variant:ident, $params:expr) => {{
                let state = match state {
                    Some(State::$variant(s)) => Some(s),
                    _ => None,
                };
                let o: Outcome<_> = $module::acquire(state, $params, cost, now);
                (o.decision, o.state.map(State::$variant), o.ttl_us)
            }};
        }
        let (decision, state, ttl) = match &policy.params {
            Params::FixedWindow(p) => decide!(fixed_window, FixedWindow, p),
            Params::SlidingWindowLog(p) => decide!(sliding_window_log, SlidingWindowLog, p),
            Params::SlidingWindowCounter(p) => {
                decide!(sliding_window_counter, SlidingWindowCounter, p)
            }
            Params::TokenBucket(p) => decide!(token_bucket, TokenBucket, p),
        };
        if let Some(state) = state {
            let expires_at_us = ttl.map_or(expires_at, |ttl| now.saturating_add(ttl));
            if expires_at_us > now {
                shard.insert(
                    name,
                    Slot {
                        state,
                        expires_at_us,
                    },
                );
            }
        }
        decision
    }

    /// Frees every entry that has expired by `now`; returns how many there were.
    pub fn evict_expired(&self, now: u64) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                let mut shard = lock(shard);
                let before = shard.len();
                shard.retain(|_, slot| slot.expires_at_us > now);
                before - shard.len()
            })
            .sum()
    }

    /// Subjects with state, expired or not yet evicted included.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, name: &str) -> &Mutex<HashMap<String, Slot>> {
        let mut h = DefaultHasher::new();
        name.hash(&mut h);
        &self.shards[(h.finish() as usize) % SHARDS]
    }
}

impl Store for MemoryStore {
    async fn acquire(
        &self,
        policy: &Policy,
        key: &LimitKey,
        cost: u64,
        now_us: Option<u64>,
    ) -> Result<Decision, StoreError> {
        Ok(self.acquire_at(policy, key, cost, now_us.unwrap_or_else(system_now_us)))
    }

    async fn write_policy(&self, write: PolicyWrite<'_>) -> Result<Written, StoreError> {
        Ok(lock(&self.policies).write(write))
    }

    async fn policy_changes(&self, since: u64, max: usize) -> Result<ChangePage, StoreError> {
        Ok(lock(&self.policies).changes(since, max))
    }

    async fn read_policy(&self, name: &PolicyName) -> Result<Option<(Policy, Etag)>, StoreError> {
        Ok(lock(&self.policies).read(name))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{FailMode, Limit};

    fn policy(limit: Limit) -> Policy {
        Policy::new(
            PolicyName::parse("p").expect("valid"),
            limit,
            None,
            FailMode::Open,
        )
    }

    #[test]
    fn expired_state_reads_as_absent_and_is_evicted() {
        let store = MemoryStore::new("rl");
        let p = policy(Limit::FixedWindow {
            limit: 1,
            window_ms: 1_000,
        });
        let k = LimitKey::parse("k".into()).expect("valid");
        assert!(store.acquire_at(&p, &k, 1, 0).allowed);
        assert!(!store.acquire_at(&p, &k, 1, 999_999).allowed);
        assert_eq!(store.evict_expired(999_999), 0);
        assert_eq!(store.evict_expired(1_000_000), 1);
        assert!(store.is_empty());
        assert!(store.acquire_at(&p, &k, 1, 1_000_000).allowed);
    }

    #[test]
    fn a_denial_keeps_the_expiry_of_the_state() {
        let store = MemoryStore::new("rl");
        let p = policy(Limit::TokenBucket {
            capacity: 1,
            refill_tokens: 1,
            refill_period_ms: 1_000,
        });
        let k = LimitKey::parse("k".into()).expect("valid");
        assert!(store.acquire_at(&p, &k, 1, 0).allowed);
        assert!(!store.acquire_at(&p, &k, 1, 500_000).allowed);
        assert_eq!(store.evict_expired(1_000_000), 1);
    }
}
