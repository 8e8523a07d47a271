//! The metrics of decisions, per policy: its counters, registered once when the policy is first
//! decided.

use std::sync::{Arc, OnceLock};

use metrics::Counter;

use super::cache::{Applied, Effect};
use crate::limiter::{Op, Verdict};
use crate::metrics as m;

/// A policy's counters, registered once.
pub(super) struct DecisionCounters {
    pub(super) allowed: Counter,
    pub(super) denied: Counter,
    pub(super) degraded: Counter,
    pub(super) shadow_denied: Counter,
    pub(super) shadow_denied_units: Counter,
    pub(super) peeks: Counter,
    pub(super) reports: Counter,
    pub(super) refunds: Counter,
    pub(super) resets: Counter,
    pub(super) reported_units: Counter,
    pub(super) refunded_units: Counter,
    pub(super) cache_hits: Counter,
    /// Decisions by the kind of the override's match (`none`, `exact`, `prefix`, `cidr`) and what
    /// it set (`none`, `tier`, `limits`, `unlimited`, `block`): bounded, never a key or an id.
    by_override: [[Counter; 5]; 4],
}

impl DecisionCounters {
    /// Counts one answered operation of `cost` units.
    pub(super) fn count(&self, op: Op, cost: u64, verdict: &Verdict, degraded: bool, shadow: bool) {
        match op {
            Op::Acquire => match (degraded, verdict.allowed) {
                (true, _) => self.degraded.increment(1),
                (false, true) => self.allowed.increment(1),
                (false, false) if shadow => {
                    // Answered as allowed: counted as such, and as a would-be denial.
                    self.allowed.increment(1);
                    self.shadow_denied.increment(1);
                    self.shadow_denied_units.increment(cost);
                }
                (false, false) => self.denied.increment(1),
            },
            Op::Peek => self.peeks.increment(1),
            Op::Report => {
                self.reports.increment(1);
                self.reported_units
                    .increment(verdict.units().iter().copied().max().unwrap_or(0));
            }
            Op::Refund => {
                self.refunds.increment(1);
                self.refunded_units
                    .increment(verdict.units().iter().copied().min().unwrap_or(0));
            }
        }
    }

    /// Counts one decision by the override that applied to it.
    pub(super) fn count_override(&self, applied: Option<&Applied>) {
        let (source, effect) = match applied {
            None => (0, 0),
            Some(a) => (
                1 + a.kind as usize,
                match &a.effect {
                    Effect::Tier { .. } => 1,
                    Effect::Limits(_) | Effect::Stale(_) => 2,
                    Effect::Unlimited => 3,
                    Effect::Block => 4,
                },
            ),
        };
        self.by_override[source][effect].increment(1);
    }

    pub(super) fn new(policy: &str) -> Self {
        let counter = |outcome: &'static str| metrics::counter!(m::DECISIONS, "policy" => policy.to_owned(), "outcome" => outcome);
        let op = |op: &'static str| metrics::counter!(m::OPERATIONS, "policy" => policy.to_owned(), "operation" => op);
        let units = |op: &'static str| metrics::counter!(m::OPERATION_UNITS, "policy" => policy.to_owned(), "operation" => op);
        Self {
            allowed: counter("allowed"),
            denied: counter("denied"),
            degraded: counter("degraded"),
            shadow_denied: metrics::counter!(m::SHADOW_DENIED, "policy" => policy.to_owned()),
            shadow_denied_units: metrics::counter!(m::SHADOW_DENIED_UNITS, "policy" => policy.to_owned()),
            peeks: op("peek"),
            reports: op("report"),
            refunds: op("refund"),
            resets: op("reset"),
            reported_units: units("report"),
            refunded_units: units("refund"),
            cache_hits: metrics::counter!(m::DENIAL_CACHE_HITS, "policy" => policy.to_owned()),
            by_override: ["none", "exact", "prefix", "cidr"].map(|source| {
                ["none", "tier", "limits", "unlimited", "block"].map(|effect| {
                    metrics::counter!(m::OVERRIDE_DECISIONS, "policy" => policy.to_owned(), "source" => source, "effect" => effect)
                })
            }),
        }
    }
}

/// A policy's counters as its cache entry holds them, shared by the copies the entry hands out,
/// and registered by the first decision that counts (so that a policy never decided shows
/// none, as before they were kept here).
#[derive(Clone, Default)]
pub(super) struct Counted(Arc<OnceLock<DecisionCounters>>);

impl Counted {
    /// The counters of the policy named `policy`.
    pub(super) fn of(&self, policy: &str) -> &DecisionCounters {
        self.0.get_or_init(|| DecisionCounters::new(policy))
    }
}

impl std::fmt::Debug for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Counted")
    }
}
