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
mod policy_set;
pub mod redis;
pub mod scripts;

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use crate::limiter::Verdict;
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

/// A policy's version in the store: the data set it belongs to (`generation`, a random id that
/// changes when the store loses its data) and the change that wrote it (`version`, counted up
/// by every policy write). The API shows it as the policy's `ETag`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Etag {
    pub generation: Arc<str>,
    pub version: u64,
}

impl fmt::Display for Etag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.generation, self.version)
    }
}

/// What a policy write does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    /// Create, unless a policy of that name exists.
    Create,
    /// Create or replace.
    Put,
    Delete,
    /// Create from the configuration file: unless it exists or was ever seeded before (so a
    /// deletion through the API sticks), in this generation of the store.
    Seed,
    /// Change nothing; proves the store takes writes, and gives the store a generation if it
    /// has none yet.
    Probe,
}

impl WriteKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            WriteKind::Create => "create",
            WriteKind::Put => "put",
            WriteKind::Delete => "delete",
            WriteKind::Seed => "seed",
            WriteKind::Probe => "probe",
        }
    }
}

/// A condition on the stored policy for a write to happen (`If-Match`, `If-None-Match: *`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Precondition {
    #[default]
    None,
    /// The policy must not exist.
    Absent,
    /// The policy must exist.
    Exists,
    /// The policy must exist with exactly this ETag (as [`Etag`] prints it).
    Matches(String),
}

/// One policy write.
#[derive(Debug, Clone, Copy)]
pub struct PolicyWrite<'a> {
    pub kind: WriteKind,
    pub name: &'a PolicyName,
    /// The policy to store, for `Create`, `Put` and `Seed`.
    pub policy: Option<&'a Policy>,
    pub precondition: &'a Precondition,
    /// Creating a policy beyond this many is refused (`WriteStatus::Full`).
    pub max_policies: u64,
}

/// What a policy write did, or why it did nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteStatus {
    Created,
    Replaced,
    Deleted,
    /// `Create` or `Seed` found the policy (or, for `Seed`, found it seeded before).
    Exists,
    /// `Delete` found no such policy.
    Missing,
    /// The store holds `max_policies` already.
    Full,
    PreconditionFailed,
    Probed,
}

impl WriteStatus {
    pub(crate) fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "created" => WriteStatus::Created,
            "replaced" => WriteStatus::Replaced,
            "deleted" => WriteStatus::Deleted,
            "exists" => WriteStatus::Exists,
            "missing" => WriteStatus::Missing,
            "full" => WriteStatus::Full,
            "precondition_failed" => WriteStatus::PreconditionFailed,
            "probed" => WriteStatus::Probed,
            _ => return None,
        })
    }

    /// Whether the write changed the policy set.
    pub fn changed(self) -> bool {
        matches!(
            self,
            WriteStatus::Created | WriteStatus::Replaced | WriteStatus::Deleted
        )
    }
}

/// The answer to a policy write: what happened, and the ETag the change was given (for a
/// refusal, the policy's current one; version 0 when it does not exist).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub status: WriteStatus,
    pub etag: Etag,
}

/// One policy changed after a given version: its state now.
#[derive(Debug, Clone)]
pub struct Change {
    pub name: String,
    /// The version of the change.
    pub version: u64,
    /// The policy, or `None` when it was deleted.
    pub policy: Option<Policy>,
}

/// A page of the changes made to the policy set after a version, oldest first.
#[derive(Debug, Clone)]
pub struct ChangePage {
    /// `None` when the store has no policy metadata at all: new, or it lost its data.
    pub generation: Option<Arc<str>>,
    /// The store's version now.
    pub version: u64,
    /// Deletions at or below this version are forgotten: an instance that knows an older
    /// version must reload everything.
    pub floor: u64,
    pub changes: Vec<Change>,
}

/// A fresh random generation id (16 hex digits), for a store that has none yet.
pub fn new_generation() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

/// The operations every store provides.
pub trait Store: Send + Sync {
    /// Decides one acquire over all of the policy's limits atomically: allowed only if every
    /// limit admits `cost`, and then every limit takes it; otherwise none changes. `now_us` is for tests that drive time explicitly; `None`
    /// uses the store's clock (Redis `TIME`, or the system clock for the embedded store).
    fn acquire(
        &self,
        policy: &Policy,
        key: &LimitKey,
        cost: u64,
        now_us: Option<u64>,
    ) -> impl Future<Output = Result<Verdict, StoreError>> + Send;

    /// Writes (or refuses to write) one policy, atomically with the change tracking.
    fn write_policy(
        &self,
        write: PolicyWrite<'_>,
    ) -> impl Future<Output = Result<Written, StoreError>> + Send;

    /// At most `max` changes made after version `since` (0: every policy), in one consistent
    /// read.
    fn policy_changes(
        &self,
        since: u64,
        max: usize,
    ) -> impl Future<Output = Result<ChangePage, StoreError>> + Send;

    /// One policy and its ETag, in one consistent read.
    fn read_policy(
        &self,
        name: &PolicyName,
    ) -> impl Future<Output = Result<Option<(Policy, Etag)>, StoreError>> + Send;

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

/// What a store reports about its own health, for readiness and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreStatus {
    /// The circuit breaker's state, for a store that has one (Redis).
    pub breaker: Option<breaker::BreakerState>,
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

    /// The store itself, when it is the embedded one.
    pub fn embedded(&self) -> Option<&MemoryStore> {
        match self {
            AnyStore::Memory(m) => Some(m),
            AnyStore::Redis(_) => None,
        }
    }

    pub fn status(&self) -> StoreStatus {
        match self {
            AnyStore::Memory(_) => StoreStatus {
                breaker: None,
                connections: None,
            },
            AnyStore::Redis(r) => StoreStatus {
                breaker: Some(r.breaker().state()),
                connections: Some(r.pool_connections()),
            },
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
    ) -> Result<Verdict, StoreError> {
        dispatch!(self, s => s.acquire(policy, key, cost, now_us))
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

    async fn ping(&self) -> Result<(), StoreError> {
        dispatch!(self, s => s.ping())
    }
}
