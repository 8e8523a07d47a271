//! The policy model: what a policy is and how it is validated.
//!
//! A policy is of one of two kinds: rate limits (one to [`MAX_LIMITS`] of the algorithms of
//! [`Algorithm`], decided together), or one concurrency limit held by leases ([`concurrency`]).
//!
//! A [`Policy`] only exists validated: [`input::parse_policy`] turns client JSON into one or
//! names the field that is wrong, [`stored`] reads back what a store kept to the same bounds, and
//! every later layer trusts it. Its [`Kind`] holds what only one kind has. The HTTP shape of a policy
//! (`PolicyDoc`) lives here too, so that the OpenAPI schema and the validation describe the same
//! fields.

pub mod calendar;
pub mod concurrency;
pub mod descriptor;
pub mod input;
mod name;
pub mod near_limit;
pub mod overrides;
pub mod request_limits;
pub mod stored;
pub mod tiers;

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use std::sync::Arc;

use crate::limiter::{fixed_window, ScriptArgs};
pub use crate::limiter::{Algorithm, Params, MAX_LIMITS, MAX_PERIOD_MS, MAX_UNITS};

pub use calendar::Calendar;
pub use descriptor::Descriptor;
pub use input::{parse_policy, ValidationError};
pub use name::{LimitKey, PolicyName, MAX_KEY_BYTES, NAME_PATTERN};
pub use near_limit::NearLimitRatio;
pub use request_limits::RequestLimits;
pub use tiers::{Changes, Limits, Tiers};

/// Longest `description`, in bytes.
pub const MAX_DESCRIPTION_BYTES: usize = 1_024;

/// What the service answers for a policy when its store cannot be reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailMode {
    /// Allow, and mark the answer `"degraded": true`.
    #[default]
    Open,
    /// Answer 503 with `Retry-After`.
    Closed,
    /// Decide in this instance, with the embedded store's algorithms, until the store is back:
    /// limits still hold, per instance, and answers are marked `"degraded": true`.
    Local,
}

impl FailMode {
    pub const fn as_str(self) -> &'static str {
        match self {
            FailMode::Open => "open",
            FailMode::Closed => "closed",
            FailMode::Local => "local",
        }
    }
}

/// Whether a policy's denials are enforced, or only reported (`mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Denials are answered as denials.
    #[default]
    Enforce,
    /// Every acquire is decided and counted exactly as in `enforce` (a would-be denial takes
    /// nothing), but answered as allowed, with `"shadow": true` and what enforcement would have
    /// answered: for rolling a limit out by watching what it would deny.
    Shadow,
}

impl Mode {
    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
        }
    }
}

/// One limit of a policy: an algorithm and its parameters, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// Its own name in a policy of several limits; the policy's name in a policy of one. It is
    /// what identifies the limit's state across changes to the policy.
    pub name: PolicyName,
    /// The values of the algorithm's fields ([`Algorithm::fields`]) as the user gave them, in
    /// that order; a calendar limit has only its `limit`.
    values: ScriptArgs,
    /// Derived from the values once, so that no acquire recomputes them. A calendar limit's
    /// boundaries depend on the time: it is decided with [`Limit::params_at`].
    pub params: Params,
    /// A `fixed_window`'s calendar, when its windows are calendar periods rather than multiples
    /// of `window_ms` since the epoch.
    calendar: Option<Arc<Calendar>>,
}

impl Limit {
    /// A limit from values already checked against the bounds of `algorithm`'s fields.
    pub fn new(name: PolicyName, algorithm: Algorithm, values: &[u64]) -> Self {
        Self {
            name,
            values: ScriptArgs::new(values),
            params: algorithm.params(values),
            calendar: None,
        }
    }

    /// A `fixed_window` of `limit` (already within its bounds) per period of `calendar`.
    pub fn calendar(name: PolicyName, limit: u64, calendar: Calendar) -> Self {
        Self::on_calendar(name, limit, Arc::new(calendar))
    }

    fn on_calendar(name: PolicyName, limit: u64, calendar: Arc<Calendar>) -> Self {
        Self {
            name,
            values: ScriptArgs::new(&[limit]),
            // Never decided as it is: every plan is built by `service::resolve`, which decides
            // with `params_at`'s boundaries. Decided with these (all zeros), a count would fall
            // in a window already ended.
            params: Params::FixedWindow(fixed_window::Params {
                limit,
                window_us: 0,
                calendar: Some(fixed_window::Bounds {
                    start_us: 0,
                    end_us: 0,
                    next_end_us: 0,
                }),
            }),
            calendar: Some(calendar),
        }
    }

    /// The same limit with `values` for its fields (a tier's or an override's, in the order of
    /// [`Limit::fields`]): a calendar limit keeps its calendar.
    pub fn with_values(&self, values: &[u64]) -> Self {
        match &self.calendar {
            None => Self::new(self.name.clone(), self.algorithm(), values),
            Some(c) => Self::on_calendar(
                self.name.clone(),
                values.first().copied().unwrap_or(0),
                c.clone(),
            ),
        }
    }

    /// The same calendar limit in another time zone (an override's); any other limit as it is.
    pub fn with_zone(&self, zone: &calendar::Zone) -> Self {
        match &self.calendar {
            Some(c) if c.zone() != zone => Self {
                calendar: Some(Arc::new(c.in_zone(zone.clone()))),
                ..self.clone()
            },
            _ => self.clone(),
        }
    }

    pub fn algorithm(&self) -> Algorithm {
        self.params.algorithm()
    }

    /// The limit's calendar, if its windows are calendar periods.
    pub fn calendar_of(&self) -> Option<&Calendar> {
        self.calendar.as_deref()
    }

    /// Each field's name and value, in the algorithm's order (a calendar limit has no
    /// `window_ms`).
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        self.algorithm()
            .fields()
            .iter()
            .map(|f| f.name)
            .zip(self.values.as_slice().iter().copied())
    }

    /// The parameters to decide with at `now_us` (the instance's time): a calendar limit's with
    /// the boundaries of the period that holds it and the end of the next one; any other
    /// limit's as they are.
    pub fn params_at(&self, now_us: u64) -> Params {
        let Some(c) = self.calendar.as_deref() else {
            return self.params;
        };
        let now = i64::try_from(now_us).unwrap_or(i64::MAX);
        let this = crate::limiter::calendar::period(c, now);
        let next = crate::limiter::calendar::period(c, this.end_us);
        let us = |t: i64| u64::try_from(t).unwrap_or(0);
        Params::FixedWindow(fixed_window::Params {
            limit: self.params.quota(),
            window_us: us(this.len_us()),
            calendar: Some(fixed_window::Bounds {
                start_us: us(this.start_us),
                end_us: us(this.end_us),
                next_end_us: us(next.end_us),
            }),
        })
    }

    /// The time window in whole seconds, rounded up, for `RateLimit-Policy`'s `w` at `now_us`:
    /// the window, the time to refill from empty, or the length of the calendar period that
    /// holds `now_us` (23 or 25 hours on the day of a DST change).
    pub fn window_seconds_at(&self, now_us: u64) -> u64 {
        self.params_at(now_us).window_us().div_ceil(1_000_000)
    }
}

/// A validated policy, of one of two kinds ([`Kind`]): a rate policy, one to [`MAX_LIMITS`] rate
/// limits on the same subjects, decided together (acquire, peek, report, refund); or a
/// concurrency policy, one concurrency limit held by leases.
///
/// Two policies are equal when their documents are: the incarnation is left out (see the
/// `PartialEq` impl).
#[derive(Debug, Clone)]
pub struct Policy {
    pub name: PolicyName,
    pub description: Option<String>,
    pub fail_mode: FailMode,
    /// What the policy limits, and how: what is decided by kind is decided by matching it.
    pub kind: Kind,
    /// The store's version of the write that created the policy (0 for a policy not read from a
    /// store, or created before stores kept it): kept by every replacement, new after a delete
    /// and a create. Not part of the document. It names a concurrency policy's lease keys, so
    /// that deleting the policy makes its leases unknown even to a policy of the same name
    /// created later.
    incarnation: u64,
}

/// The kinds of policy. Acquires, peeks, reports, refunds and resets of state are for rate
/// policies, leases for concurrency policies: a new kind is a compile error wherever that is
/// decided.
// A rate policy holds its first limit inline ([`Limits`]); a policy lives in an `Arc`, built
// once per change, so the size of the smaller kind costs nothing, and a box would cost every
// decision a pointer.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// Rate limits, decided together.
    Rate(Rate),
    /// One concurrency limit, held by leases.
    Concurrency(concurrency::Params),
}

/// A rate policy's limits, with what only rate policies have: a [`Mode`], an Envoy
/// [`Descriptor`] (a concurrency policy is always enforced, and is not decided over gRPC) and
/// [`Tiers`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rate {
    /// 1 to [`MAX_LIMITS`], of unique names ([`Rate::new`]).
    limits: Limits,
    mode: Mode,
    /// The Envoy rate-limit descriptors the policy serves over gRPC.
    descriptor: Option<Descriptor>,
    /// Other limits, by name, that an override may give a subject.
    tiers: Tiers,
    /// Whether a request may give its own limit (Envoy's descriptor `limit`), and the most.
    request_limits: Option<RequestLimits>,
    /// The share of a quota from which an allowed acquire counts as near the limit, when the
    /// document gives one (else [`near_limit::DEFAULT`]).
    near_limit_ratio: Option<NearLimitRatio>,
}

impl Rate {
    /// Rate limits, enforced, serving no descriptor and naming no tiers: 1 to [`MAX_LIMITS`] of
    /// them, of unique names (the messages are those of [`parse_policy`], which checks the same
    /// with the place in the document).
    pub fn new(limits: Vec<Limit>) -> Result<Self, ValidationError> {
        if limits.is_empty() || limits.len() > MAX_LIMITS {
            return Err(ValidationError::invalid(
                "limits",
                format!("must hold 1 to {MAX_LIMITS} limits"),
            ));
        }
        for (i, limit) in limits.iter().enumerate() {
            if let Some(j) = limits[..i].iter().position(|l| l.name == limit.name) {
                return Err(ValidationError::invalid(
                    &format!("limits[{i}].name"),
                    format!("`{}` is the name of limits[{j}] already", limit.name),
                ));
            }
        }
        Ok(Self::checked(limits))
    }

    /// Limits known to hold the invariants of [`Rate::new`].
    fn checked(limits: Vec<Limit>) -> Self {
        Self {
            limits: Limits::new(limits),
            mode: Mode::Enforce,
            descriptor: None,
            tiers: Tiers::default(),
            request_limits: None,
            near_limit_ratio: None,
        }
    }

    /// The same limits in `mode`.
    pub fn with_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The same limits serving `descriptor` over gRPC.
    pub fn with_descriptor(mut self, descriptor: Option<Descriptor>) -> Self {
        self.descriptor = descriptor;
        self
    }

    /// The same limits naming `tiers` (read for these limits: [`Tiers::parse`]).
    pub fn with_tiers(mut self, tiers: Tiers) -> Self {
        self.tiers = tiers;
        self
    }

    /// The same limits letting requests give their own limit, of at most `request_limits` (read
    /// for these limits: [`RequestLimits::parse`]).
    pub fn with_request_limits(mut self, request_limits: Option<RequestLimits>) -> Self {
        self.request_limits = request_limits;
        self
    }

    /// The same limits counting near-limit acquires from `ratio` (`None`: the default).
    pub fn with_near_limit_ratio(mut self, ratio: Option<NearLimitRatio>) -> Self {
        self.near_limit_ratio = ratio;
        self
    }

    /// The `near_limit_ratio` the document gives, if it gives one.
    pub fn near_limit_ratio(&self) -> Option<NearLimitRatio> {
        self.near_limit_ratio
    }

    /// The ratio near-limit acquires are counted from: the document's, or the default.
    pub fn near_limit(&self) -> NearLimitRatio {
        self.near_limit_ratio.unwrap_or_default()
    }

    /// Whether a request may give its own limit, and the most it may give.
    pub fn request_limits(&self) -> Option<&RequestLimits> {
        self.request_limits.as_ref()
    }

    /// The limits, in policy order: never empty.
    pub fn limits(&self) -> &[Limit] {
        self.limits.limits()
    }

    /// The limits with their parameters, as a subject without an override is decided with them.
    pub fn own(&self) -> &Limits {
        &self.limits
    }

    /// Each limit's parameters, in policy order.
    pub fn params(&self) -> &[Params] {
        self.limits.params()
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn descriptor(&self) -> Option<&Descriptor> {
        self.descriptor.as_ref()
    }

    pub fn tiers(&self) -> &Tiers {
        &self.tiers
    }

    /// Whether there are several limits (and so the policy reads back in the `limits` form).
    pub fn is_composite(&self) -> bool {
        self.limits().len() > 1
    }

    /// The limit whose quota is smallest (the first such): a cost above it can never be granted.
    pub fn tightest(&self) -> &Limit {
        self.limits.tightest()
    }
}

// By hand, to leave `incarnation` out: it is store metadata, like the ETag's version, not part of
// the document, so a policy read back from a store equals the one that was written (and a
// policy parsed from input equals a stored one with the same document). Code that cares which
// creation a policy comes from compares `incarnation()` itself. Every other field is compared;
// the destructuring makes a new field a compile error here until it is decided on.
impl PartialEq for Policy {
    fn eq(&self, other: &Self) -> bool {
        let Policy {
            name,
            description,
            fail_mode,
            kind,
            incarnation: _,
        } = self;
        *name == other.name
            && *description == other.description
            && *fail_mode == other.fail_mode
            && *kind == other.kind
    }
}

impl Eq for Policy {}

impl Policy {
    /// A policy of `kind`.
    pub fn of_kind(
        name: PolicyName,
        kind: Kind,
        description: Option<String>,
        fail_mode: FailMode,
    ) -> Self {
        Self {
            name,
            description,
            fail_mode,
            kind,
            incarnation: 0,
        }
    }

    /// A rate policy of `limits`, enforced and serving no descriptor; refused unless there are 1
    /// to [`MAX_LIMITS`] of unique names ([`Rate::new`]).
    pub fn new(
        name: PolicyName,
        limits: Vec<Limit>,
        description: Option<String>,
        fail_mode: FailMode,
    ) -> Result<Self, ValidationError> {
        let rate = Rate::new(limits)?;
        Ok(Self::of_kind(
            name,
            Kind::Rate(rate),
            description,
            fail_mode,
        ))
    }

    /// A rate policy of one limit, from values already checked against `algorithm`'s fields.
    pub fn single(
        name: PolicyName,
        algorithm: Algorithm,
        values: &[u64],
        description: Option<String>,
        fail_mode: FailMode,
    ) -> Self {
        let limit = Limit::new(name.clone(), algorithm, values);
        let rate = Rate::checked(vec![limit]);
        Self::of_kind(name, Kind::Rate(rate), description, fail_mode)
    }

    /// A concurrency policy: `params` held by leases.
    pub fn concurrent(
        name: PolicyName,
        params: concurrency::Params,
        description: Option<String>,
        fail_mode: FailMode,
    ) -> Self {
        Self::of_kind(name, Kind::Concurrency(params), description, fail_mode)
    }

    /// A rate policy's limits, or `None` for another kind.
    pub fn rate(&self) -> Option<&Rate> {
        match &self.kind {
            Kind::Rate(rate) => Some(rate),
            Kind::Concurrency(_) => None,
        }
    }

    /// A concurrency policy's limit, or `None` for another kind.
    pub fn concurrency(&self) -> Option<concurrency::Params> {
        match &self.kind {
            Kind::Concurrency(params) => Some(*params),
            Kind::Rate(_) => None,
        }
    }

    /// The policy's kind as the stores record it beside the document: `"concurrency"` or
    /// `"rate"`. A write that changes it starts a new incarnation.
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            Kind::Rate(_) => "rate",
            Kind::Concurrency(_) => concurrency::NAME,
        }
    }

    /// Whether denials are enforced: a concurrency policy's always are.
    pub fn mode(&self) -> Mode {
        match &self.kind {
            Kind::Rate(rate) => rate.mode,
            Kind::Concurrency(_) => Mode::Enforce,
        }
    }

    /// The Envoy descriptor the policy serves over gRPC: a rate policy's, if it has one.
    pub fn descriptor(&self) -> Option<&Descriptor> {
        match &self.kind {
            Kind::Rate(rate) => rate.descriptor(),
            Kind::Concurrency(_) => None,
        }
    }

    /// The Envoy descriptor shape the policy claims ([`Descriptor::shape`]), if it serves one.
    pub fn shape(&self) -> Option<String> {
        self.descriptor().map(Descriptor::shape)
    }

    /// The store's version of the write that created this policy (see the field).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The same policy as created by the store's write of version `incarnation`.
    pub fn with_incarnation(mut self, incarnation: u64) -> Self {
        self.incarnation = incarnation;
        self
    }

    /// What the stores decide and name state keys by: each rate limit's parameters, in policy
    /// order; none for a concurrency policy, which has no state decided by rate scripts.
    pub fn params(&self) -> &[Params] {
        match &self.kind {
            Kind::Rate(rate) => rate.params(),
            Kind::Concurrency(_) => &[],
        }
    }

    /// The state key suffix of rate limit `i`: `None` for a limit named after its policy (the
    /// one limit of a flat policy, whose state keys predate several limits), else its name.
    pub fn state_name(&self, i: usize) -> Option<&str> {
        self.rate()?
            .limits()
            .get(i)
            .map(|l| l.name.as_str())
            .filter(|n| *n != self.name.as_str())
    }

    /// The policy as the API shows it.
    pub fn to_doc(&self) -> PolicyDoc {
        PolicyDoc(self.clone())
    }
}

/// A policy as the API shows it and the store keeps it: one limit in the flat form
/// (`{"name", "algorithm", <fields>…}`, also a concurrency policy's), several in the `limits`
/// form. Its schema is in
/// `crate::api::schema`; input is read by [`parse_policy`].
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyDoc(pub Policy);

impl Serialize for PolicyDoc {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        struct LimitDoc<'a>(&'a Limit);
        impl Serialize for LimitDoc<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut map = serializer.serialize_map(None)?;
                map.serialize_entry("name", self.0.name.as_str())?;
                map.serialize_entry("algorithm", &self.0.algorithm())?;
                for (field, value) in self.0.fields() {
                    map.serialize_entry(field, &value)?;
                }
                if let Some(c) = self.0.calendar_of() {
                    map.serialize_entry(calendar::FIELD, &c.to_input())?;
                }
                map.end()
            }
        }
        let p = &self.0;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("name", p.name.as_str())?;
        match &p.kind {
            Kind::Concurrency(params) => {
                map.serialize_entry("algorithm", concurrency::NAME)?;
                for (field, value) in concurrency::values(params) {
                    map.serialize_entry(field, &value)?;
                }
            }
            Kind::Rate(rate) => match rate.limits() {
                [one] => {
                    map.serialize_entry("algorithm", &one.algorithm())?;
                    for (field, value) in one.fields() {
                        map.serialize_entry(field, &value)?;
                    }
                    if let Some(c) = one.calendar_of() {
                        map.serialize_entry(calendar::FIELD, &c.to_input())?;
                    }
                }
                limits => {
                    let docs: Vec<LimitDoc<'_>> = limits.iter().map(LimitDoc).collect();
                    map.serialize_entry("limits", &docs)?;
                }
            },
        }
        if let Some(d) = &p.description {
            map.serialize_entry("description", d)?;
        }
        map.serialize_entry("fail_mode", &p.fail_mode)?;
        map.serialize_entry("mode", &p.mode())?;
        if let Some(d) = p.descriptor() {
            map.serialize_entry("descriptor", d)?;
        }
        if let Some(tiers) = p.rate().map(Rate::tiers).filter(|t| !t.is_empty()) {
            map.serialize_entry("tiers", tiers)?;
        }
        if let Some(r) = p.rate().and_then(Rate::request_limits) {
            map.serialize_entry("request_limits", r)?;
        }
        if let Some(r) = p.rate().and_then(Rate::near_limit_ratio) {
            map.serialize_entry(near_limit::FIELD, &r)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(limit: u64) -> Policy {
        let name = PolicyName::parse("p").expect("valid");
        Policy::single(
            name,
            Algorithm::FixedWindow,
            &[limit, 1_000],
            None,
            FailMode::Open,
        )
    }

    #[test]
    fn equality_is_of_the_document_not_of_the_incarnation() {
        let stored = policy(5).with_incarnation(7);
        assert_eq!(stored.incarnation(), 7);
        assert_eq!(stored, policy(5), "the incarnation is store metadata");
        assert_eq!(stored.to_doc(), policy(5).to_doc());
        assert_ne!(stored, policy(6).with_incarnation(7));
        let mut shadow = policy(5);
        if let Kind::Rate(rate) = shadow.kind {
            shadow.kind = Kind::Rate(rate.with_mode(Mode::Shadow));
        }
        assert_ne!(stored, shadow.with_incarnation(7));
    }
}
