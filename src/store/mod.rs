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
//!
//! One folder per backend: [`memory`] and [`redis`] (whose parts `batch`, `breaker`, `calls`,
//! `connection`, `scripts` and `topology` are also re-exported here, at their former paths).
//! This file holds the [`Store`] trait and the types both backends share; [`key`] names the
//! state of a subject; `error.rs` holds [`StoreError`] and its [`ErrorClass`] table, and
//! `any.rs` [`AnyStore`].

pub mod key;
pub mod memory;
mod plan;
pub mod redis;
pub mod top;

mod any;
mod error;
pub mod overrides;

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use crate::limiter::concurrency::LeaseAnswer;
use crate::limiter::Verdict;
use crate::policy::overrides::{Override, OverrideId};
use crate::policy::{LimitKey, Policy, PolicyName};

pub use self::any::{AnyStore, StoreStatus};
pub use self::error::{BoxedError, Cause, ErrorClass, StoreError};
pub use self::memory::MemoryStore;
pub use self::overrides::{
    OverrideCaps, OverrideOp, OverrideStatus, OverrideWrite, OverrideWritten,
};
pub use self::plan::{Ask, Claim, LeasePlan, Plan};
// The Redis store's parts, at the paths they had before it had a folder of its own.
pub use self::redis::RedisStore;
pub use self::redis::{batch, breaker, calls, connection, scripts, topology};

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

/// One policy or override changed after a given version: its state now.
#[derive(Debug, Clone)]
pub struct Change {
    /// A policy's name, or an override's `<policy>/<id>` ([`overrides::member`]).
    pub name: String,
    /// The version of the change.
    pub version: u64,
    /// What the name holds now, or `None` when it was deleted.
    pub entry: Option<Entry>,
}

/// What a change log name holds.
// A change is read once, from a page, and moved into the cache: boxing the larger kind would
// save nothing but an allocation's worth of copying.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Entry {
    Policy(Policy),
    Override(Override),
}

impl Change {
    /// The policy this change leaves, if it is a policy's and not a deletion.
    pub fn policy(&self) -> Option<&Policy> {
        match &self.entry {
            Some(Entry::Policy(p)) => Some(p),
            _ => None,
        }
    }

    /// Whether the name is an override's.
    pub fn is_override(&self) -> bool {
        overrides::parse_member(&self.name).is_some()
    }
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
    /// ([`crate::limiter::concurrency::LeaseCall::deadline_us`]), because its sender will have answered without it. `None`
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

    /// Writes (or refuses to write) one override of a policy, atomically with the change
    /// tracking, the uniqueness of its match and the caps ([`overrides`]).
    fn write_override(
        &self,
        write: OverrideWrite<'_>,
    ) -> impl Future<Output = Result<OverrideWritten, StoreError>> + Send;

    /// One override and its ETag, in one consistent read.
    fn read_override(
        &self,
        policy: &PolicyName,
        id: &OverrideId,
    ) -> impl Future<Output = Result<Option<(Override, Etag)>, StoreError>> + Send;

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
