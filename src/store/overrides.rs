//! What the stores keep of overrides, beside the policies: the types of an override write and
//! its answer, shared by both backends (`lua/override_write.lua` on Redis, `memory::policy_set`
//! in process).
//!
//! Overrides follow the policies' change log: each write takes the next version of the policy
//! set, and a page of changes holds policies and overrides alike, in version order, so that an
//! override is in force on every instance within the same bound as a policy change, and never
//! before the policy version it was checked against. An override is named in the log
//! `<policy>/<id>` ([`member`]): no policy name holds `/`. Deleting a policy (or changing its
//! kind) deletes its overrides with it, in the same step; their entries leave the log without a
//! deletion of their own, since every instance drops a deleted policy's overrides with it.
//!
//! Two overrides of one policy never have the same match (`policy::overrides` explains why that
//! is all resolution needs to be independent of order): the store refuses the second
//! ([`OverrideStatus::Conflict`]) in the same atomic step that writes, and caps the overrides of
//! each class per policy ([`OverrideCaps`]).

use crate::policy::overrides::{Match, MatchKind, Override, OverrideId};
use crate::policy::PolicyName;

use super::{Etag, Precondition};

/// What an override write does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverrideOp {
    /// A new override (its id must be new).
    Create,
    /// Replaces an existing override.
    Replace,
    Delete,
}

impl OverrideOp {
    pub const fn as_str(self) -> &'static str {
        match self {
            OverrideOp::Create => "create",
            OverrideOp::Replace => "put",
            OverrideOp::Delete => "delete",
        }
    }
}

/// The most overrides of each class one policy may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverrideCaps {
    /// Exact keys.
    pub exact: u64,
    /// Prefixes and ranges together: what a lookup may search.
    pub patterns: u64,
}

/// The class an override counts in, for [`OverrideCaps`]: `exact` or `pattern`.
pub fn class(m: &Match) -> &'static str {
    match m.kind() {
        MatchKind::Exact => "exact",
        MatchKind::Prefix | MatchKind::Cidr => "pattern",
    }
}

impl OverrideCaps {
    /// The cap of `m`'s class.
    pub fn of(&self, m: &Match) -> u64 {
        match m.kind() {
            MatchKind::Exact => self.exact,
            MatchKind::Prefix | MatchKind::Cidr => self.patterns,
        }
    }
}

/// One override write.
#[derive(Debug, Clone, Copy)]
pub struct OverrideWrite<'a> {
    pub op: OverrideOp,
    pub policy: &'a PolicyName,
    /// For a create or a replacement, the version of the policy the override was checked
    /// against: the write is refused ([`OverrideStatus::PolicyChanged`]) if the policy has been
    /// written since.
    pub policy_version: u64,
    pub id: &'a OverrideId,
    /// The override to store (create, replace).
    pub doc: Option<&'a Override>,
    /// On the override (`If-Match`).
    pub precondition: &'a Precondition,
    pub caps: OverrideCaps,
}

/// What an override write did, or why it did nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverrideStatus {
    Created,
    Replaced,
    Deleted,
    /// No override of that id (replace, delete), or one exists already (create).
    Missing,
    Exists,
    /// The policy does not exist, or is not a rate policy.
    NoPolicy,
    /// The policy was written after the version the override was checked against.
    PolicyChanged,
    /// Another override of the policy has the same match ([`OverrideWritten::other`]).
    Conflict,
    /// The policy has as many overrides of the class as its cap allows.
    Full,
    PreconditionFailed,
}

impl OverrideStatus {
    pub(crate) fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "created" => Self::Created,
            "replaced" => Self::Replaced,
            "deleted" => Self::Deleted,
            "missing" => Self::Missing,
            "exists" => Self::Exists,
            "no_policy" => Self::NoPolicy,
            "policy_changed" => Self::PolicyChanged,
            "conflict" => Self::Conflict,
            "full" => Self::Full,
            "precondition_failed" => Self::PreconditionFailed,
            _ => return None,
        })
    }
}

/// The answer to an override write: what happened, and the ETag the change was given (for a
/// refusal, the override's current one; version 0 when it does not exist).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverrideWritten {
    pub status: OverrideStatus,
    pub etag: Etag,
    /// For [`OverrideStatus::Conflict`], the override that has the match.
    pub other: Option<String>,
}

/// An override's name in the change log: `<policy>/<id>`.
pub fn member(policy: &str, id: &str) -> String {
    format!("{policy}/{id}")
}

/// The policy and id of a change log name, when it is an override's.
pub fn parse_member(name: &str) -> Option<(&str, &str)> {
    name.split_once('/')
}

/// The text a match is kept under, unique per match: its class letter and its text.
pub fn canonical(m: &Match) -> String {
    match m {
        Match::Key(k) => format!("k:{}", k.as_str()),
        Match::Prefix(p) => format!("p:{p}"),
        Match::Cidr(net) => format!("c:{net}"),
    }
}
