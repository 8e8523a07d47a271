//! The metrics of decisions, per policy: its counters, registered once when the policy is first
//! decided.

use metrics::Counter;

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
}

impl DecisionCounters {
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
        }
    }
}
