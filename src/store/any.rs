//! [`AnyStore`], the store chosen at start-up: the embedded one or Redis, one [`Store`] to the
//! service above, and the store that answers for itself what only one kind has (the Redis
//! servers' scripts and masters, the invalidation channel and the ticket key ring the
//! instances share, its own housekeeping), so that nothing above `store` names a kind.

use futures_util::stream::BoxStream;
use futures_util::StreamExt;

use super::redis::breaker::BreakerState;
use super::top::{FoldId, Minute, Tally, DIMENSIONS};
use super::{
    ChangePage, Etag, LeasePlan, LeasedLedger, MemoryStore, OverrideWrite, OverrideWritten, Plan,
    PolicyWrite, RedisStore, Store, StoreError, Written,
};
use crate::limiter::concurrency::LeaseAnswer;
use crate::limiter::Verdict;
use crate::policy::overrides::{Override, OverrideId};
use crate::policy::{LimitKey, Policy, PolicyName};

/// The store chosen at start-up.
// One per process, behind an `Arc`: the variants' sizes do not matter, a box would only add an
// indirection to every acquire.
#[allow(clippy::large_enum_variant)]
pub enum AnyStore {
    Memory(MemoryStore),
    Redis(RedisStore),
}

macro_rules! dispatch {
    ($self:ident, $store:ident => $call:expr) => {
        match $self {
            AnyStore::Memory($store) => $call.await,
            AnyStore::Redis($store) => $call.await,
        }
    };
}

/// What a store reports about its own health, for readiness and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreStatus {
    /// The circuit breaker's state, for a store that has one (Redis).
    pub breaker: Option<BreakerState>,
    /// Connections `(in use, idle)`, for a store that has any.
    pub connections: Option<(u32, u32)>,
}

impl AnyStore {
    /// A short name for logs and `/readyz`.
    pub fn kind(&self) -> &'static str {
        match self {
            AnyStore::Memory(_) => "embedded",
            AnyStore::Redis(_) => "redis",
        }
    }

    /// Whether the store lives outside this process, so that it can fail and a `local` fail
    /// mode needs an in-process store to fall back on.
    pub fn is_shared(&self) -> bool {
        matches!(self, AnyStore::Redis(_))
    }

    /// Whether [`Store::acquire_joint`] can decide any subjects together: not on a Redis
    /// Cluster, whose subjects live on different slots.
    pub fn decides_jointly(&self) -> bool {
        match self {
            AnyStore::Memory(_) => true,
            AnyStore::Redis(r) => !r.is_cluster(),
        }
    }

    /// The store itself, when it is the embedded one.
    pub fn embedded(&self) -> Option<&MemoryStore> {
        match self {
            AnyStore::Memory(m) => Some(m),
            AnyStore::Redis(_) => None,
        }
    }

    /// Each Redis Cluster master and how it answered a write that changes nothing (see
    /// [`RedisStore::probe_masters`]); empty for any other store.
    pub async fn probe_masters(&self) -> Vec<(String, Result<(), StoreError>)> {
        match self {
            AnyStore::Redis(r) if r.is_cluster() => r.probe_masters().await,
            _ => Vec::new(),
        }
    }

    pub fn status(&self) -> StoreStatus {
        match self {
            AnyStore::Memory(_) => StoreStatus {
                breaker: None,
                connections: None,
            },
            AnyStore::Redis(r) => StoreStatus {
                breaker: Some(r.breaker_state()),
                connections: Some(r.pool_connections()),
            },
        }
    }
}

impl From<MemoryStore> for AnyStore {
    fn from(store: MemoryStore) -> Self {
        AnyStore::Memory(store)
    }
}

impl From<RedisStore> for AnyStore {
    fn from(store: RedisStore) -> Self {
        AnyStore::Redis(store)
    }
}

/// What only one kind of store has, answered by the store itself: the service and start-up ask
/// without knowing which store it is.
impl AnyStore {
    /// Fails unless every Redis behind the store can run the decision scripts (see
    /// [`RedisStore::require_flagged_scripts`]); nothing to check on the embedded store.
    pub async fn require_flagged_scripts(&self) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(_) => Ok(()),
            AnyStore::Redis(r) => r.require_flagged_scripts().await,
        }
    }

    /// Fails, naming what is missing, unless the Redis user may do all the service does (see
    /// [`RedisStore::require_permissions`]); nothing to check on the embedded store.
    pub async fn require_permissions(&self) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(_) => Ok(()),
            AnyStore::Redis(r) => r.require_permissions().await,
        }
    }

    /// Loads every script into Redis before the first decisions need them (see
    /// [`RedisStore::load_scripts`]); nothing to load on the embedded store.
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(_) => Ok(()),
            AnyStore::Redis(r) => r.load_scripts().await,
        }
    }

    /// The ring of ticket keys the instances share, made from the key `fresh` gives when it has
    /// none (see [`RedisStore::ticket_keys`]). `None` on the embedded store, whose process keeps
    /// its own key: `fresh` is not called.
    pub async fn ticket_keys(
        &self,
        fresh: impl FnOnce() -> Result<String, StoreError>,
    ) -> Result<Option<String>, StoreError> {
        match self {
            AnyStore::Memory(_) => Ok(None),
            AnyStore::Redis(r) => Ok(Some(r.ticket_keys(&fresh()?).await?)),
        }
    }

    /// Rotates the shared ring of ticket keys to `fresh` (see
    /// [`RedisStore::rotate_ticket_keys`]): the new ring. `None` on the embedded store, whose
    /// process rotates its own ring.
    pub async fn rotate_ticket_keys(&self, fresh: &[u8]) -> Result<Option<String>, StoreError> {
        match self {
            AnyStore::Memory(_) => Ok(None),
            AnyStore::Redis(r) => Ok(Some(r.rotate_ticket_keys(fresh).await?)),
        }
    }

    /// Tells every instance to drop its cached denial named by `message` (see
    /// `service::denials`), on the store's invalidation channel; nothing to tell on the
    /// embedded store, which no other instance shares.
    pub async fn publish_invalidation(&self, message: &str) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(_) => Ok(()),
            AnyStore::Redis(r) => r.publish(&r.denials_channel(), message).await,
        }
    }

    /// Subscribes to the store's invalidation channel (see [`RedisStore::subscribe`]): the
    /// payloads published on it, until the subscription's connection ends. `None` on the
    /// embedded store, which has no channel.
    pub async fn invalidations(&self) -> Option<Result<BoxStream<'static, Vec<u8>>, StoreError>> {
        match self {
            AnyStore::Memory(_) => None,
            AnyStore::Redis(r) => Some(r.subscribe(&r.denials_channel()).await.map(|pubsub| {
                pubsub
                    .into_on_message()
                    .map(|message| message.get_payload_bytes().to_vec())
                    .boxed()
            })),
        }
    }

    /// Each Redis Cluster master's address and breaker state; empty on one Redis and on the
    /// embedded store.
    pub fn master_breakers(&self) -> Vec<(String, BreakerState)> {
        match self {
            AnyStore::Memory(_) => Vec::new(),
            AnyStore::Redis(r) => r.master_breakers(),
        }
    }

    /// Folds an instance's top-offender summaries of `policy` into the minute's shared ones
    /// (see [`RedisStore::fold_top`]); nothing to fold on the embedded store, whose process
    /// keeps its own minutes.
    pub async fn fold_top(
        &self,
        policy: &str,
        minute: u64,
        capacity: usize,
        fold: FoldId,
        tallies: &[Tally; DIMENSIONS],
    ) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(_) => Ok(()),
            AnyStore::Redis(r) => r.fold_top(policy, minute, capacity, fold, tallies).await,
        }
    }

    /// The shared top-offender summaries of `policy` for `minutes` (see
    /// [`RedisStore::read_top`]); none on the embedded store.
    pub async fn read_top(&self, policy: &str, minutes: &[u64]) -> Result<Vec<Minute>, StoreError> {
        match self {
            AnyStore::Memory(_) => Ok(Vec::new()),
            AnyStore::Redis(r) => r.read_top(policy, minutes).await,
        }
    }

    /// The store's own upkeep, run by the service's background loop every second: on a Redis
    /// Cluster, reading its slot map again (see [`RedisStore::refresh_topology`]); nothing
    /// otherwise.
    pub async fn housekeeping(&self) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(_) => Ok(()),
            AnyStore::Redis(r) => r.refresh_topology().await,
        }
    }
}

impl Store for AnyStore {
    async fn decide(&self, plan: &Plan<'_>) -> Result<Verdict, StoreError> {
        dispatch!(self, s => s.decide(plan))
    }

    async fn acquire_joint(&self, plans: &[Plan<'_>]) -> Result<Vec<Verdict>, StoreError> {
        dispatch!(self, s => s.acquire_joint(plans))
    }

    async fn lease(&self, plan: &LeasePlan<'_>) -> Result<LeaseAnswer, StoreError> {
        dispatch!(self, s => s.lease(plan))
    }

    async fn sweep_leases(
        &self,
        policy: &Policy,
        now_us: Option<u64>,
    ) -> Result<LeaseAnswer, StoreError> {
        dispatch!(self, s => s.sweep_leases(policy, now_us))
    }

    async fn leased_ledgers(&self) -> Result<Vec<LeasedLedger>, StoreError> {
        dispatch!(self, s => s.leased_ledgers())
    }

    async fn unindex_ledger(&self, entry: &LeasedLedger) -> Result<(), StoreError> {
        dispatch!(self, s => s.unindex_ledger(entry))
    }

    fn lease_deadline(&self, now_us: Option<u64>) -> Option<u64> {
        match self {
            AnyStore::Memory(s) => s.lease_deadline(now_us),
            AnyStore::Redis(s) => s.lease_deadline(now_us),
        }
    }

    async fn reset(&self, policy: &Policy, key: &LimitKey) -> Result<(), StoreError> {
        dispatch!(self, s => s.reset(policy, key))
    }

    async fn write_policy(&self, write: PolicyWrite<'_>) -> Result<Written, StoreError> {
        dispatch!(self, s => s.write_policy(write))
    }

    async fn policy_changes(&self, since: u64, max: usize) -> Result<ChangePage, StoreError> {
        dispatch!(self, s => s.policy_changes(since, max))
    }

    async fn read_policy(&self, name: &PolicyName) -> Result<Option<(Policy, Etag)>, StoreError> {
        dispatch!(self, s => s.read_policy(name))
    }

    async fn write_override(&self, w: OverrideWrite<'_>) -> Result<OverrideWritten, StoreError> {
        dispatch!(self, s => s.write_override(w))
    }

    async fn read_override(
        &self,
        policy: &PolicyName,
        id: &OverrideId,
    ) -> Result<Option<(Override, Etag)>, StoreError> {
        dispatch!(self, s => s.read_override(policy, id))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        dispatch!(self, s => s.ping())
    }
}
