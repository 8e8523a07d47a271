//! The metrics of decisions, per policy: its counters, registered once when the policy is first
//! decided, and per limit of the policy ([`LimitCounters`]): each limit's verdicts by who
//! decided, and its near-limit acquires.
//!
//! Everything here is reached from the policy's cache entry, so counting takes no lock and no
//! lookup by label: a per-limit counter is a slot of a fixed array, indexed by the limit's
//! position, the outcome and `decided_by`, and registered by the first decision that uses it
//! (so that only the combinations that happen become series).

use std::sync::{Arc, OnceLock};

use metrics::{Counter, Histogram};

use super::cache::{Applied, Effect};
use super::DecidedBy;
use crate::limiter::{Op, Verdict};
use crate::metrics as m;
use crate::policy::{Limit, NearLimitRatio, Policy, Rate};

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
    /// The policy's name, for the counters registered later.
    policy: String,
    /// Per limit of the policy, in policy order.
    pub(super) limits: LimitCounters,
    /// Registered by the policy's first reservation, so that policies that take none show none.
    reservations: OnceLock<ReservationCounters>,
}

/// A policy's reservations (acquires that accept a wait): `ratelimiter_reservations_total` by
/// outcome, the delays handed out, and cancellations.
pub(super) struct ReservationCounters {
    now: Counter,
    delayed: Counter,
    denied: Counter,
    delay_seconds: Histogram,
    pub(super) cancels: Counter,
}

impl ReservationCounters {
    /// Counts one reservation the store decided: granted now, booked `delay_us` ahead, or denied
    /// for a wait past the one accepted.
    pub(super) fn booked(&self, verdict: &Verdict, delay_us: u64) {
        match (verdict.allowed, delay_us) {
            (false, _) => self.denied.increment(1),
            (true, 0) => self.now.increment(1),
            (true, _) => self.delayed.increment(1),
        }
        if verdict.allowed {
            // Whole µs as seconds: exact enough for a histogram whose buckets start at 1 ms.
            self.delay_seconds.record(delay_us as f64 / 1e6);
        }
    }
}

impl DecisionCounters {
    /// The policy's reservation counters, registered on first use.
    pub(super) fn reservations(&self) -> &ReservationCounters {
        self.reservations.get_or_init(|| {
            let policy = self.policy.clone();
            let outcome = |o: &'static str| metrics::counter!(m::RESERVATIONS, "policy" => policy.clone(), "outcome" => o);
            ReservationCounters {
                now: outcome("now"),
                delayed: outcome("delayed"),
                denied: outcome("denied"),
                delay_seconds: metrics::histogram!(m::RESERVATION_DELAY_SECONDS, "policy" => policy.clone()),
                cancels: metrics::counter!(m::RESERVATION_CANCELS, "policy" => policy.clone()),
            }
        })
    }

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

    pub(super) fn new(p: &Policy) -> Self {
        let policy = p.name.as_str();
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
            limits: LimitCounters::new(p),
            reservations: OnceLock::new(),
            policy: policy.to_owned(),
        }
    }
}

/// How many values `decided_by` has: the columns of a limit's decision counters.
const DECIDERS: usize = DecidedBy::ALL.len();

/// The per-limit counters of a rate policy (none for a concurrency policy):
/// `ratelimiter_limit_decisions_total{policy, limit, outcome, decided_by}` and
/// `ratelimiter_near_limit_total{policy, limit}`.
pub(super) struct LimitCounters {
    policy: Arc<str>,
    /// The ratio the policy counts near-limit acquires from.
    near: NearLimitRatio,
    limits: Vec<LimitCells>,
}

/// One limit's counters, each registered when first used.
struct LimitCells {
    name: Arc<str>,
    /// By outcome (0 allowed, 1 denied), then by `decided_by` ([`DecidedBy::ALL`]'s order).
    decisions: [[OnceLock<Counter>; DECIDERS]; 2],
    near: OnceLock<Counter>,
}

impl LimitCounters {
    fn new(policy: &Policy) -> Self {
        let rate = policy.rate();
        let limits = rate.map_or(&[][..], Rate::limits);
        Self {
            policy: Arc::from(policy.name.as_str()),
            near: rate.map(Rate::near_limit).unwrap_or_default(),
            limits: limits
                .iter()
                .map(|l| LimitCells {
                    name: Arc::from(l.name.as_str()),
                    decisions: Default::default(),
                    near: OnceLock::new(),
                })
                .collect(),
        }
    }

    /// Counts one acquire decided with `limits` (the subject's: the policy's, a tier's, an
    /// override's or the request's, always in the policy's order and of its names): each limit's
    /// own verdict under `decided_by`, and, when the acquire was allowed and took from the store,
    /// the limits it left near their quota. A limit the verdict holds no decision for (there is
    /// none today) takes the acquire's.
    pub(super) fn count(&self, limits: &[Limit], verdict: &Verdict, decided_by: DecidedBy) {
        let decisions = verdict.limits();
        let near_counts = verdict.allowed && decided_by.knows_remaining();
        for (i, cells) in self.limits.iter().enumerate() {
            let decision = decisions.get(i);
            let allowed = decision.map_or(verdict.allowed, |d| d.allowed);
            cells.decisions[usize::from(!allowed)][decided_by as usize]
                .get_or_init(|| {
                    metrics::counter!(m::LIMIT_DECISIONS,
                        "policy" => self.policy.clone(),
                        "limit" => cells.name.clone(),
                        "outcome" => if allowed { "allowed" } else { "denied" },
                        "decided_by" => decided_by.as_str())
                })
                .increment(1);
            if !near_counts {
                continue;
            }
            if let (Some(d), Some(limit)) = (decision, limits.get(i)) {
                if self.near.is_near(d.remaining, limit.params.quota()) {
                    cells
                        .near
                        .get_or_init(|| {
                            metrics::counter!(m::NEAR_LIMIT,
                                "policy" => self.policy.clone(),
                                "limit" => cells.name.clone())
                        })
                        .increment(1);
                }
            }
        }
    }
}

/// A policy's counters as its cache entry holds them, shared by the copies the entry hands out,
/// and registered by the first decision that counts (so that a policy never decided shows
/// none, as before they were kept here).
#[derive(Clone, Default)]
pub(super) struct Counted(Arc<OnceLock<DecisionCounters>>);

impl Counted {
    /// The counters of `policy` (the entry's own).
    pub(super) fn of(&self, policy: &Policy) -> &DecisionCounters {
        self.0.get_or_init(|| DecisionCounters::new(policy))
    }
}

impl std::fmt::Debug for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Counted")
    }
}
