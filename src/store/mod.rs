//! Where limiter state and policies live: the embedded in-process store, or Redis (one server
//! or a Cluster; `connection` holds the ways of reaching it).
//!
//! Both implement [`Store`] and give the same answers: the embedded store runs the pure
//! functions of `limiter` under a lock, Redis runs one Lua script per decision, composed from
//! the parts (`lua/<algorithm>.lua`) of the policy's limits, in one atomic call (and decisions
//! that wait for their thread's call go together in one call of `lua/batch.lua`: `batch`;
//! `calls` is how any call reaches Redis). A joint acquire ([`Store::acquire_joint`], the
//! Envoy descriptors of one request) decides several subjects in the same one step: under their
//! shards' locks, or in one script composed for all of their limits. A concurrency
//! limit's leases ([`Store::lease`]) go the same two ways: `limiter::concurrency::decide` under
//! a lock, or one call of `lua/concurrency.lua`. [`AnyStore`] picks one at start-up. Nothing
//! here knows about HTTP.

pub mod batch;
pub mod breaker;
pub mod calls;
pub mod connection;
pub mod key;
pub mod memory;
mod plan;
mod policy_set;
pub mod redis;
pub mod scripts;
pub mod topology;

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use crate::limiter::concurrency::LeaseAnswer;
use crate::limiter::Verdict;
use crate::policy::{LimitKey, Policy, PolicyName};

pub use self::memory::MemoryStore;
pub use self::plan::{Ask, Claim, LeasePlan, Plan};
pub use self::redis::RedisStore;

/// Why a store call failed.
///
/// Each error carries what went wrong in words (its `Display`) and, where another error
/// reported it, that error as its [`source`](std::error::Error::source) (the redis-rs
/// `RedisError`, say), so that a log can show the chain. What an error means to its
/// reader (retry, breaker, fail mode, cache, HTTP) is its [`class`](StoreError::class), never
/// its variant.
#[derive(Debug)]
pub enum StoreError {
    /// The store could not be reached, and the call was provably not executed (refused, no
    /// connection, circuit breaker open). [`ErrorClass::Unreachable`].
    Unavailable(Cause),
    /// The call may have been executed, but no answer came (the deadline passed, or the
    /// connection broke after the command was sent): a write must be read back before it is
    /// retried. [`ErrorClass::OutcomeUnknown`].
    OutcomeUnknown(Cause),
    /// The store answered with an error (a script error, out of memory, a wrong type).
    /// [`ErrorClass::Refused`].
    Server(Cause),
    /// A Redis Cluster node refused the call unrun because the cluster cannot serve its slot
    /// right now (`CLUSTERDOWN` while a replica is promoted, `TRYAGAIN` or a redirect not
    /// followed while a slot moves). [`ErrorClass::ClusterRefused`].
    ClusterRefused(Cause),
    /// Stored data that does not decode (a policy hash edited by hand, say).
    /// [`ErrorClass::Corrupt`].
    Corrupt(Cause),
    /// The embedded store already holds state for its most subjects
    /// (`limits.max_embedded_subjects`, the number given) and none of them has expired: a
    /// subject without state gets none. [`ErrorClass::Refused`]: nothing was unreachable.
    Full(u64),
}

/// What a [`StoreError`] means to the code that meets it. This table is the one place that says
/// it; the circuit breaker and the resend on a new connection (`store::redis`), the fail modes,
/// the cached-policy fallback and readiness (`service`), and the HTTP answer (`api::errors`) all
/// go by it.
///
/// | class | errors | transient (breaker counts it) | acquire answered by fail mode | cached policies served instead | HTTP answer |
/// |---|---|---|---|---|---|
/// | `Unreachable` | `Unavailable` | yes | yes | yes | 503 `store-unavailable` |
/// | `OutcomeUnknown` | `OutcomeUnknown` | yes | yes | yes | 503 `outcome-unknown` |
/// | `ClusterRefused` | `ClusterRefused` | yes (the breaker does not count it) | yes | yes | 503 `store-unavailable` |
/// | `Refused` | `Server`, `Full` | no | yes | no | 503 `store-unavailable` |
/// | `Corrupt` | `Corrupt` | no | yes | no | 500 `internal` |
///
/// - *Transient* ([`is_transient`](Self::is_transient)): the store was not reached, its
///   answer never came, or a Cluster said it cannot serve the key for now, so the same call may
///   succeed later without anyone changing anything. Those that say the store could not be
///   reached count against the circuit breaker ([`counts_against_breaker`](
///   Self::counts_against_breaker)): an error the store answered with proves it reachable, and
///   a Cluster's refusal during a failover is the cluster's state, not its master's, so a
///   breaker opened on it would keep a healthy master's keys in fail mode after the cluster
///   answers again. The Redis store sends a transient call once more on a new connection when
///   the connection proves nothing was sent. Readiness reports `Unreachable` and
///   `OutcomeUnknown` as "the store is unreachable", `ClusterRefused` as a degraded but ready
///   store (every instance sees the same cluster: taking them out of rotation would help no
///   one), and any other error of its probe write as "the store refuses writes".
/// - *Fail mode* ([`answered_by_fail_mode`](Self::answered_by_fail_mode)): every failed acquire
///   is answered by its policy's fail mode: `open` allows, `local` decides with the in-process
///   store (and allows when that is full), `closed` answers the error as what it is: a
///   decision whose call may have been counted by Redis is `outcome-unknown`, one that
///   provably was not is `store-unavailable`.
/// - *Cached policies* ([`may_serve_cached`](Self::may_serve_cached)): a policy read or list
///   that meets a transient error is answered from this instance's cache, once it has loaded
///   the policies; any other error is answered as an error. Writes never fall back.
/// - *HTTP* (chosen in `api/errors.rs`, the one place that chooses statuses; the body of a
///   store error never carries its cause, which goes to the log): `outcome-unknown` tells the
///   client to read a write back before retrying it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The store could not be reached; the call provably did not take effect.
    Unreachable,
    /// The call was sent and no answer came: it may or may not have taken effect.
    OutcomeUnknown,
    /// A Redis Cluster refused the call unrun, for now: a failover or a slot migration is
    /// under way. The node that said so is reachable.
    ClusterRefused,
    /// The store was reached and said no: an error it answered with (a script error, out of
    /// memory, a wrong type, a command it refuses), or the embedded store full.
    Refused,
    /// The store answered something this version cannot read.
    Corrupt,
}

impl ErrorClass {
    /// Whether the store was not reached or did not answer, so that the same call may succeed
    /// later without anyone changing anything.
    pub const fn is_transient(self) -> bool {
        matches!(
            self,
            ErrorClass::Unreachable | ErrorClass::OutcomeUnknown | ErrorClass::ClusterRefused
        )
    }

    /// Whether the circuit breaker counts the error as a failure to reach the store.
    pub const fn counts_against_breaker(self) -> bool {
        matches!(self, ErrorClass::Unreachable | ErrorClass::OutcomeUnknown)
    }

    /// Whether a failed acquire is answered by its policy's fail mode (rather than always as an
    /// error).
    pub const fn answered_by_fail_mode(self) -> bool {
        true
    }

    /// Whether a policy read may be answered from the cache instead (once it is loaded).
    pub const fn may_serve_cached(self) -> bool {
        self.is_transient()
    }
}

impl StoreError {
    /// What the error means to its reader: see [`ErrorClass`].
    pub const fn class(&self) -> ErrorClass {
        match self {
            StoreError::Unavailable(_) => ErrorClass::Unreachable,
            StoreError::OutcomeUnknown(_) => ErrorClass::OutcomeUnknown,
            StoreError::ClusterRefused(_) => ErrorClass::ClusterRefused,
            StoreError::Server(_) | StoreError::Full(_) => ErrorClass::Refused,
            StoreError::Corrupt(_) => ErrorClass::Corrupt,
        }
    }

    /// Whether the same call may succeed later without anyone changing anything
    /// ([`ErrorClass::is_transient`]).
    pub const fn is_transient(&self) -> bool {
        self.class().is_transient()
    }

    // The constructors take the message as a `String` or a `&str`; add the error that reported
    // it with `caused_by`.

    pub fn unavailable(cause: impl Into<Cause>) -> Self {
        StoreError::Unavailable(cause.into())
    }

    pub fn outcome_unknown(cause: impl Into<Cause>) -> Self {
        StoreError::OutcomeUnknown(cause.into())
    }

    pub fn server(cause: impl Into<Cause>) -> Self {
        StoreError::Server(cause.into())
    }

    pub fn cluster_refused(cause: impl Into<Cause>) -> Self {
        StoreError::ClusterRefused(cause.into())
    }

    pub fn corrupt(cause: impl Into<Cause>) -> Self {
        StoreError::Corrupt(cause.into())
    }

    /// Keeps `source` as the error that caused this one. `Full` has no cause to keep it in.
    pub fn caused_by(mut self, source: impl Into<BoxedError>) -> Self {
        if let Some(cause) = self.cause_mut() {
            cause.source = Some(source.into());
        }
        self
    }

    /// The same error for a call whose outcome is settled: its connection proves nothing was
    /// sent, or (a refused decision) whether it took effect does not matter. An unknown outcome
    /// becomes `Unavailable`; any other error is unchanged.
    pub fn outcome_known(self) -> Self {
        match self {
            StoreError::OutcomeUnknown(cause) => StoreError::Unavailable(cause),
            other => other,
        }
    }

    /// The same error again, for each decision of a batch whose call failed: the same variant
    /// and words, and the source's words as a source of their own.
    pub fn duplicate(&self) -> Self {
        let copy = |c: &Cause| Cause {
            message: c.message.clone(),
            source: c.source.as_ref().map(|s| BoxedError::from(s.to_string())),
        };
        match self {
            StoreError::Unavailable(c) => StoreError::Unavailable(copy(c)),
            StoreError::OutcomeUnknown(c) => StoreError::OutcomeUnknown(copy(c)),
            StoreError::Server(c) => StoreError::Server(copy(c)),
            StoreError::ClusterRefused(c) => StoreError::ClusterRefused(copy(c)),
            StoreError::Corrupt(c) => StoreError::Corrupt(copy(c)),
            StoreError::Full(max) => StoreError::Full(*max),
        }
    }

    fn cause(&self) -> Option<&Cause> {
        match self {
            StoreError::Unavailable(c)
            | StoreError::OutcomeUnknown(c)
            | StoreError::Server(c)
            | StoreError::ClusterRefused(c)
            | StoreError::Corrupt(c) => Some(c),
            StoreError::Full(_) => None,
        }
    }

    fn cause_mut(&mut self) -> Option<&mut Cause> {
        match self {
            StoreError::Unavailable(c)
            | StoreError::OutcomeUnknown(c)
            | StoreError::Server(c)
            | StoreError::ClusterRefused(c)
            | StoreError::Corrupt(c) => Some(c),
            StoreError::Full(_) => None,
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Unavailable(c) => write!(f, "store unavailable: {c}"),
            StoreError::OutcomeUnknown(c) => write!(f, "no answer from the store: {c}"),
            StoreError::Server(c) => write!(f, "store error: {c}"),
            StoreError::ClusterRefused(c) => {
                write!(f, "the Redis Cluster cannot serve the key for now: {c}")
            }
            StoreError::Corrupt(c) => write!(f, "stored data is corrupt: {c}"),
            StoreError::Full(max) => write!(
                f,
                "the embedded store is full: it keeps state for at most {max} subjects \
                 (limits.max_embedded_subjects)"
            ),
        }
    }
}

// Written out rather than derived with thiserror: a `#[source]` field must itself be the source,
// and `Cause` as a link of its own would repeat the message in every printed chain.
impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let source = self.cause()?.source.as_deref()?;
        Some(source)
    }
}

/// An error of any kind, kept as the source of a [`StoreError`].
pub type BoxedError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong, in words, and the error that reported it, if any
/// ([`StoreError::caused_by`]). Reads as its message (`Display`, and `Deref` to `str`).
#[derive(Debug)]
pub struct Cause {
    message: String,
    source: Option<BoxedError>,
}

impl From<String> for Cause {
    fn from(message: String) -> Self {
        Cause {
            message,
            source: None,
        }
    }
}

impl From<&str> for Cause {
    fn from(message: &str) -> Self {
        Cause::from(message.to_owned())
    }
}

impl std::ops::Deref for Cause {
    type Target = str;

    fn deref(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
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
    /// The policy of this name as the writer last saw it, if any: read only where a record
    /// written by an older version lacks the kind and descriptor shape the write compares.
    pub seen: Option<&'a Policy>,
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
    /// Another live policy serves the same descriptor shape ([`Written::claimed_by`]).
    Claimed,
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
            "claimed" => WriteStatus::Claimed,
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
    /// The written policy's incarnation ([`Policy::incarnation`]), as the store now hands it
    /// out: the change's version for a creation, the replaced policy's for a replacement; 0 for
    /// a deletion, a refusal or a probe. A replacement that changes the policy's kind (rate or
    /// concurrency) starts a new one, as a deletion does.
    pub incarnation: u64,
    /// For [`WriteStatus::Claimed`], the policy that serves the shape.
    pub claimed_by: Option<String>,
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

/// The most limits, over all plans, that one joint acquire decides atomically (one script's
/// worth of nested parts; see `lua/common.lua`).
pub const MAX_JOINT_LIMITS: usize = crate::limiter::MAX_LIMITS;

/// The limits of a joint acquire's plans, in order.
pub fn joint_limits(plans: &[Plan<'_>]) -> usize {
    plans.iter().map(|p| p.params.len()).sum()
}

/// The operations every store provides.
pub trait Store: Send + Sync {
    /// Decides one plan over all of its limits atomically, as [`crate::limiter::decide_op`]
    /// does: an acquire (allowed only if every limit admits its cost, and then every limit takes
    /// it; otherwise none changes), a peek (which writes nothing, on Redis with a read-only
    /// script call), a report or a refund (with its ticket's marks and record, or without one).
    fn decide(&self, plan: &Plan<'_>) -> impl Future<Output = Result<Verdict, StoreError>> + Send;

    /// Decides one acquire over the limits of several subjects atomically (the Envoy
    /// descriptors of one request), as [`crate::limiter::decide_joint`] does: allowed only if
    /// every limit of every part admits its part's cost, and then each takes it; otherwise none
    /// changes. `plans` are acquires of distinct subjects, of rate policies, at the time of the
    /// first, with at most [`MAX_JOINT_LIMITS`] limits in all; on a Cluster, all of their keys in
    /// one slot. Answers one verdict per plan, each `allowed` as the whole was (its limits'
    /// decisions say which admitted).
    fn acquire_joint(
        &self,
        plans: &[Plan<'_>],
    ) -> impl Future<Output = Result<Vec<Verdict>, StoreError>> + Send;

    /// Decides one lease call on the subject's leases under the plan's concurrency policy, with
    /// its ledger, atomically, as [`crate::limiter::concurrency::decide`] does (a `Look` writes
    /// nothing, on Redis with a read-only script call; a `Sweep` is refused: it is
    /// [`Store::sweep_leases`]).
    fn lease(
        &self,
        plan: &LeasePlan<'_>,
    ) -> impl Future<Output = Result<LeaseAnswer, StoreError>> + Send;

    /// Drops the concurrency policy's expired leases from its ledger and counts them, as
    /// [`crate::limiter::concurrency::sweep`] does: `expired` and the live `leases` left.
    fn sweep_leases(
        &self,
        policy: &Policy,
        now_us: Option<u64>,
    ) -> impl Future<Output = Result<LeaseAnswer, StoreError>> + Send;

    /// The concurrency policies whose ledgers may hold leases, for the lease sweep: on Redis the
    /// lease index (see [`key::lease_index`]), at most [`MAX_INDEX_READ`] of them; on the
    /// embedded store every ledger it holds.
    fn leased_ledgers(&self) -> impl Future<Output = Result<Vec<LeasedLedger>, StoreError>> + Send;

    /// Takes `entry` out of the lease index, unless a take or renewal wrote it again since it
    /// was read: for a ledger found empty after `entry.until_us`, or of a policy that is gone.
    fn unindex_ledger(
        &self,
        entry: &LeasedLedger,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The deadline for a take sent now (`now_us`, or the store's clock estimated): the time on
    /// the store's clock after which the take must grant nothing
    /// ([`LeaseCall::deadline_us`]), because its sender will have answered without it. `None`
    /// on a store whose calls always answer (the embedded one).
    fn lease_deadline(&self, now_us: Option<u64>) -> Option<u64>;

    /// Deletes the subject's state for every limit of the policy, atomically.
    fn reset(
        &self,
        policy: &Policy,
        key: &LimitKey,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

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

/// The most lease index entries one sweep reads.
pub const MAX_INDEX_READ: usize = 100_000;

/// A ledger that may hold leases, as the lease index has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeasedLedger {
    pub policy: String,
    pub incarnation: u64,
    /// After this time (µs, the store's clock) the ledger holds no lease, unless a take or
    /// renewal wrote the entry again; `u64::MAX` on the embedded store.
    pub until_us: u64,
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

    async fn ping(&self) -> Result<(), StoreError> {
        dispatch!(self, s => s.ping())
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn every_error_is_read_as_its_class_says() {
        use ErrorClass::*;
        // The rows of `ErrorClass`'s table: error, class, transient, the breaker counts it,
        // answered by fail mode, cached policies served instead.
        let table = [
            (
                StoreError::unavailable("refused"),
                Unreachable,
                [true, true, true, true],
            ),
            (
                StoreError::outcome_unknown("no answer"),
                OutcomeUnknown,
                [true, true, true, true],
            ),
            (
                StoreError::cluster_refused("CLUSTERDOWN"),
                ClusterRefused,
                [true, false, true, true],
            ),
            (
                StoreError::server("OOM"),
                Refused,
                [false, false, true, false],
            ),
            (StoreError::Full(2), Refused, [false, false, true, false]),
            (
                StoreError::corrupt("policy hash"),
                Corrupt,
                [false, false, true, false],
            ),
        ];
        for (error, class, [transient, breaker, fail_mode, cached]) in table {
            assert_eq!(error.class(), class, "{error}");
            assert_eq!(error.is_transient(), transient, "{error}");
            assert_eq!(class.is_transient(), transient, "{error}");
            assert_eq!(class.counts_against_breaker(), breaker, "{error}");
            assert_eq!(class.answered_by_fail_mode(), fail_mode, "{error}");
            assert_eq!(class.may_serve_cached(), cached, "{error}");
        }
    }

    #[test]
    fn redis_errors_are_classified_and_kept_as_the_source() {
        use ::redis::{ErrorKind, RedisError, ServerErrorKind};
        let cases = [
            (
                RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
                ErrorClass::Unreachable,
                "store unavailable: connection refused: ",
            ),
            (
                RedisError::from((ErrorKind::AuthenticationFailed, "WRONGPASS")),
                ErrorClass::Unreachable,
                "store unavailable: authentication failed: ",
            ),
            (
                RedisError::from((ErrorKind::Server(ServerErrorKind::BusyLoading), "LOADING")),
                ErrorClass::Unreachable,
                "store unavailable: Redis is loading its data: ",
            ),
            (
                RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
                ErrorClass::OutcomeUnknown,
                "no answer from the store: connection failed: ",
            ),
            (
                RedisError::from((
                    ErrorKind::Server(ServerErrorKind::ResponseError),
                    "OOM command not allowed",
                )),
                ErrorClass::Refused,
                "store error: ",
            ),
            (
                RedisError::from((
                    ErrorKind::Server(ServerErrorKind::ClusterDown),
                    "The cluster is down",
                )),
                ErrorClass::ClusterRefused,
                "the Redis Cluster cannot serve the key for now: ",
            ),
            (
                RedisError::from((ErrorKind::Server(ServerErrorKind::Moved), "MOVED")),
                ErrorClass::ClusterRefused,
                "the Redis Cluster cannot serve the key for now: ",
            ),
            (
                RedisError::from((
                    ErrorKind::Client,
                    connection::CLUSTER_REFUSED,
                    "TRYAGAIN".to_owned(),
                )),
                ErrorClass::ClusterRefused,
                "the Redis Cluster cannot serve the key for now: ",
            ),
            (
                RedisError::from((
                    ErrorKind::Client,
                    connection::SENT_THEN_FAILED,
                    "broken pipe".to_owned(),
                )),
                ErrorClass::OutcomeUnknown,
                "no answer from the store: connection failed: ",
            ),
        ];
        for (redis_error, class, text) in cases {
            let said = redis_error.to_string();
            let error = StoreError::from(redis_error);
            assert_eq!(error.class(), class, "{error}");
            assert_eq!(error.to_string(), format!("{text}{said}"));
            let source = error
                .source()
                .and_then(|s| s.downcast_ref::<RedisError>())
                .map(ToString::to_string);
            assert_eq!(source.as_deref(), Some(said.as_str()), "{error}");
        }
    }

    #[test]
    fn an_outcome_made_known_is_unavailable_with_its_message_and_source() {
        let io = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        let error = StoreError::outcome_unknown("connection failed")
            .caused_by(io)
            .outcome_known();
        assert!(matches!(&error, StoreError::Unavailable(m) if &**m == "connection failed"));
        assert_eq!(error.to_string(), "store unavailable: connection failed");
        assert!(error
            .source()
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .is_some());
        let server = StoreError::server("OOM").outcome_known();
        assert_eq!(server.class(), ErrorClass::Refused);
    }

    #[test]
    fn messages_read_as_before_sources_were_kept() {
        assert_eq!(
            StoreError::unavailable("x").to_string(),
            "store unavailable: x"
        );
        assert_eq!(
            StoreError::outcome_unknown("x").to_string(),
            "no answer from the store: x"
        );
        assert_eq!(StoreError::server("x").to_string(), "store error: x");
        assert_eq!(
            StoreError::corrupt("x").to_string(),
            "stored data is corrupt: x"
        );
        assert_eq!(
            StoreError::Full(7).to_string(),
            "the embedded store is full: it keeps state for at most 7 subjects \
             (limits.max_embedded_subjects)"
        );
        assert!(StoreError::Full(7).caused_by("ignored").source().is_none());
    }
}
