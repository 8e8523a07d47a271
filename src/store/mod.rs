//! Where limiter state and policies live: the embedded in-process store, or Redis (one server
//! or a Cluster; `connection` holds the ways of reaching it).
//!
//! Both implement [`Store`] and give the same answers: the embedded store runs the pure
//! functions of `limiter` under a lock, Redis runs the Lua script of the same name (`lua/`) in
//! one atomic call. [`AnyStore`] picks one at start-up. Nothing here knows about HTTP.

pub mod breaker;
pub mod connection;
pub mod key;
pub mod memory;
pub mod redis;
pub mod scripts;

use std::future::Future;

use crate::limiter::Decision;
use crate::policy::{LimitKey, Policy, PolicyName};

pub use self::memory::MemoryStore;
pub use self::redis::RedisStore;

/// Why a store call failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached, and the call was provably not executed (refused, no
    /// connection, circuit breaker open): worth retrying, and answered by the policy's fail mode.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The call may have been executed, but no answer came (the deadline passed, or the
    /// connection broke after the command was sent): transient like `Unavailable`, but a write
    /// must be read back before it is retried.
    #[error("no answer from the store: {0}")]
    OutcomeUnknown(String),
    /// The store answered with an error (a script error, out of memory, a wrong type).
    #[error("store error: {0}")]
    Server(String),
    /// Stored data that does not decode (a policy hash edited by hand, say).
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// The embedded store already holds state for its most subjects
    /// (`limits.max_embedded_subjects`, the number given) and none of them has expired: a
    /// subject without state gets none. Answered by the policy's fail mode, like an outage; not
    /// transient in the breaker's sense (nothing was unreachable).
    #[error("the embedded store is full: it keeps state for at most {0} subjects (limits.max_embedded_subjects)")]
    Full(u64),
}

impl StoreError {
    /// Whether the same call may succeed later without anyone changing anything.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable(_) | StoreError::OutcomeUnknown(_)
        )
    }
}

/// What a `put` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    Created,
    Replaced,
}

/// The operations every store provides.
pub trait Store: Send + Sync {
    /// Decides one acquire atomically. `now_us` is for tests that drive time explicitly; `None`
    /// uses the store's clock (Redis `TIME`, or the system clock for the embedded store).
    fn acquire(
        &self,
        policy: &Policy,
        key: &LimitKey,
        cost: u64,
        now_us: Option<u64>,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Every policy, and the policy version they reflect.
    fn load_policies(&self) -> impl Future<Output = Result<(Vec<Policy>, u64), StoreError>> + Send;

    fn load_policy(
        &self,
        name: &PolicyName,
    ) -> impl Future<Output = Result<Option<Policy>, StoreError>> + Send;

    /// Creates the policy unless one of that name exists; `Ok(false)` when it does.
    fn create_policy(
        &self,
        policy: &Policy,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    fn put_policy(
        &self,
        policy: &Policy,
    ) -> impl Future<Output = Result<PutOutcome, StoreError>> + Send;

    /// `Ok(false)` when there was no such policy.
    fn delete_policy(
        &self,
        name: &PolicyName,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// A number that changes whenever any policy is written, by any instance.
    fn policy_version(&self) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Whether the store answers at all.
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

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

impl AnyStore {
    /// A short name for logs and `/readyz`.
    pub fn kind(&self) -> &'static str {
        match self {
            AnyStore::Memory(_) => "embedded",
            AnyStore::Redis(_) => "redis",
        }
    }
}

impl Store for AnyStore {
    async fn acquire(
        &self,
        policy: &Policy,
        key: &LimitKey,
        cost: u64,
        now_us: Option<u64>,
    ) -> Result<Decision, StoreError> {
        dispatch!(self, s => s.acquire(policy, key, cost, now_us))
    }

    async fn load_policies(&self) -> Result<(Vec<Policy>, u64), StoreError> {
        dispatch!(self, s => s.load_policies())
    }

    async fn load_policy(&self, name: &PolicyName) -> Result<Option<Policy>, StoreError> {
        dispatch!(self, s => s.load_policy(name))
    }

    async fn create_policy(&self, policy: &Policy) -> Result<bool, StoreError> {
        dispatch!(self, s => s.create_policy(policy))
    }

    async fn put_policy(&self, policy: &Policy) -> Result<PutOutcome, StoreError> {
        dispatch!(self, s => s.put_policy(policy))
    }

    async fn delete_policy(&self, name: &PolicyName) -> Result<bool, StoreError> {
        dispatch!(self, s => s.delete_policy(name))
    }

    async fn policy_version(&self) -> Result<u64, StoreError> {
        dispatch!(self, s => s.policy_version())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        dispatch!(self, s => s.ping())
    }
}
