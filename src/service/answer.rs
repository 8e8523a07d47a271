//! What a decision answers: the answer itself ([`Acquired`]) and who decided it ([`DecidedBy`]),
//! read by both edges and by the `RateLimit` fields (`crate::fields`).

use std::sync::Arc;

use super::cache::Applied;
use super::Ticket;
use crate::limiter::{Op, Verdict};
use crate::policy::{Limit, Limits, Policy, PolicyName, Rate};
use crate::store::Etag;

/// Who decided an acquire: the answer's `decided_by`. [`DecidedBy::Redis`] and
/// [`DecidedBy::Embedded`] are decisions of the policy's shared (or only) store, and
/// [`DecidedBy::LocalCache`] repeats one of Redis's denials exactly; the others are the fail
/// mode's answers while that store could not be asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DecidedBy {
    /// Redis (one server or a Cluster) decided: limits shared by every instance.
    Redis,
    /// The embedded store of this instance decided (the service runs without Redis).
    Embedded,
    /// `fail_mode: open`: the store could not be asked, and the request was allowed without
    /// counting anything. Not a real allow.
    FailOpen,
    /// `fail_mode: local`: the store could not be asked, and this instance decided with its own
    /// in-process store (limits per instance).
    FailLocal,
    /// This instance answered a denial that Redis decided for the same subject and policy
    /// version, before the retry time Redis gave (the local denial cache): exact, not degraded.
    LocalCache,
    /// An override of the subject decided without the store: `unlimited` (allowed) or `block`
    /// (denied).
    Override,
}

impl DecidedBy {
    /// Every value, in declaration order (which `as usize` indexes).
    pub const ALL: [DecidedBy; 6] = [
        DecidedBy::Redis,
        DecidedBy::Embedded,
        DecidedBy::FailOpen,
        DecidedBy::FailLocal,
        DecidedBy::LocalCache,
        DecidedBy::Override,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            DecidedBy::Redis => "redis",
            DecidedBy::Embedded => "embedded",
            DecidedBy::FailOpen => "fail_open",
            DecidedBy::FailLocal => "fail_local",
            DecidedBy::LocalCache => "local_cache",
            DecidedBy::Override => "override",
        }
    }

    /// Whether the store could not be asked (the answer's `degraded`).
    pub const fn is_degraded(self) -> bool {
        matches!(self, DecidedBy::FailOpen | DecidedBy::FailLocal)
    }

    /// Whether its verdict says how close the subject came to its limits, so that an allowed one
    /// can count as near the limit (metrics, top offenders): not a fail-open answer, whose
    /// remaining is made up, nor an override's `unlimited`, which leaves the whole quota.
    pub const fn knows_remaining(self) -> bool {
        !matches!(self, DecidedBy::FailOpen | DecidedBy::Override)
    }
}

/// One answered acquire, peek, report or refund.
#[derive(Debug, Clone)]
pub struct Acquired {
    pub op: Op,
    pub policy: Arc<Policy>,
    /// The version of the policy this instance decided with.
    pub etag: Etag,
    /// Each limit's decision, and whether the acquire was allowed: in shadow mode, what
    /// enforcement decided (the answer is allowed all the same).
    pub verdict: Verdict,
    /// The shared store could not be asked: the policy's fail mode (`open` or `local`) decided.
    pub degraded: bool,
    pub decided_by: DecidedBy,
    /// The policy is in shadow mode (its own `mode`, or `limits.shadow`), and this is an
    /// acquire or a peek: the answer is allowed whatever `verdict` says.
    pub shadow: bool,
    /// What an allowed acquire or a report took, for a refund; `None` when nothing was taken.
    pub ticket: Option<Ticket>,
    /// A reservation (an acquire that accepts a wait) that the answer allows: how long after the
    /// decision's time to act, in µs. 0 when the cost fits now, and when the answer holds
    /// nobody back (shadow mode, a `fail_open` answer, an `unlimited` override); `None` for
    /// every other answer.
    pub delay_us: Option<u64>,
    /// The override that applied to the subject, if one did.
    pub applied: Option<Arc<Applied>>,
    /// The limits the request gave (an Envoy descriptor's `limit`, as clamped), when they
    /// replaced the policy's.
    pub given: Option<Arc<Limits>>,
}

impl Acquired {
    /// The limits the subject was decided with, in policy order: an override's, the request's,
    /// or the policy's.
    pub fn limits(&self) -> &[Limit] {
        if let Some(limits) = self.applied.as_deref().and_then(|a| a.effect.limits()) {
            return limits.limits();
        }
        match (&self.applied, &self.given) {
            (None, Some(given)) => given.limits(),
            _ => self.policy.rate().map_or(&[], Rate::limits),
        }
    }

    /// The tier the subject was decided with, if an override gave it one.
    pub fn tier(&self) -> Option<&str> {
        self.applied
            .as_deref()
            .and_then(|a| a.effect.tier())
            .map(PolicyName::as_str)
    }

    /// Whether the answer allows: the verdict, or always in shadow mode.
    pub fn allowed(&self) -> bool {
        self.shadow || self.verdict.allowed
    }

    /// Units a refund gave back to every limit (the fewest over the limits); 0 for the other
    /// operations.
    pub fn refunded(&self) -> u64 {
        match self.op {
            Op::Refund => self.verdict.units().iter().copied().min().unwrap_or(0),
            _ => 0,
        }
    }
}
