//! The policy model: what a policy is and how it is validated.
//!
//! A policy is of one of two kinds: rate limits (one to [`MAX_LIMITS`] of the algorithms of
//! [`Algorithm`], decided together), or one concurrency limit held by leases ([`concurrency`]).
//!
//! A [`Policy`] only exists validated: [`input::parse_policy`] turns client JSON into one or
//! names the field that is wrong, and every later layer trusts it. The HTTP shape of a policy
//! (`PolicyDoc`) lives here too, so that the OpenAPI schema and the validation describe the same
//! fields.

pub mod concurrency;
pub mod descriptor;
pub mod input;
mod name;

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::limiter::ScriptArgs;
pub use crate::limiter::{Algorithm, Params, MAX_LIMITS, MAX_PERIOD_MS, MAX_UNITS};

pub use descriptor::Descriptor;
pub use input::{parse_policy, ValidationError};
pub use name::{LimitKey, PolicyName, MAX_KEY_BYTES, NAME_PATTERN};

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
    /// that order.
    values: ScriptArgs,
    /// Derived from the values once, so that no acquire recomputes them.
    pub params: Params,
}

impl Limit {
    /// A limit from values already checked against the bounds of `algorithm`'s fields.
    pub fn new(name: PolicyName, algorithm: Algorithm, values: &[u64]) -> Self {
        Self {
            name,
            values: ScriptArgs::new(values),
            params: algorithm.params(values),
        }
    }

    pub fn algorithm(&self) -> Algorithm {
        self.params.algorithm()
    }

    /// Each field's name and value, in the algorithm's order.
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        self.algorithm()
            .fields()
            .iter()
            .map(|f| f.name)
            .zip(self.values.as_slice().iter().copied())
    }

    /// The time window in whole seconds, rounded up, for `RateLimit-Policy`'s `w`: the window,
    /// or the time to refill from empty.
    pub fn window_seconds(&self) -> u64 {
        self.params.window_us().div_ceil(1_000_000)
    }
}

/// A validated policy, of one of two kinds: a rate policy, one to [`MAX_LIMITS`] rate limits on
/// the same subjects, decided together (acquire, peek, report, refund); or a concurrency policy,
/// one concurrency limit held by leases ([`Policy::concurrency`]), which has no `limits`.
///
/// Two policies are equal when their documents are: the incarnation is left out (see the
/// `PartialEq` impl).
#[derive(Debug, Clone)]
pub struct Policy {
    pub name: PolicyName,
    /// The rate limits; empty for a concurrency policy.
    pub limits: Vec<Limit>,
    pub description: Option<String>,
    pub fail_mode: FailMode,
    /// Always [`Mode::Enforce`] for a concurrency policy.
    pub mode: Mode,
    /// The Envoy rate-limit descriptors the policy serves over gRPC; always `None` for a
    /// concurrency policy.
    pub descriptor: Option<Descriptor>,
    /// Each limit's parameters, in order, as the stores take them.
    params: Box<[Params]>,
    /// A concurrency policy's limit; `None` for a rate policy.
    concurrency: Option<concurrency::Params>,
    /// The store's version of the write that created the policy (0 for a policy not read from a
    /// store, or created before stores kept it): kept by every replacement, new after a delete
    /// and a create. Not part of the document. It names a concurrency policy's lease keys, so
    /// that deleting the policy makes its leases unknown even to a policy of the same name
    /// created later.
    incarnation: u64,
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
            limits,
            description,
            fail_mode,
            mode,
            descriptor,
            params,
            concurrency,
            incarnation: _,
        } = self;
        *name == other.name
            && *limits == other.limits
            && *description == other.description
            && *fail_mode == other.fail_mode
            && *mode == other.mode
            && *descriptor == other.descriptor
            && *params == other.params
            && *concurrency == other.concurrency
    }
}

impl Eq for Policy {}

impl Policy {
    /// A policy of `limits`, which the caller has checked: 1 to [`MAX_LIMITS`], unique names.
    pub fn new(
        name: PolicyName,
        limits: Vec<Limit>,
        description: Option<String>,
        fail_mode: FailMode,
    ) -> Self {
        Self {
            params: limits.iter().map(|l| l.params).collect(),
            name,
            limits,
            description,
            fail_mode,
            mode: Mode::Enforce,
            descriptor: None,
            concurrency: None,
            incarnation: 0,
        }
    }

    /// A concurrency policy: `params` held by leases, no rate limits.
    pub fn concurrent(
        name: PolicyName,
        params: concurrency::Params,
        description: Option<String>,
        fail_mode: FailMode,
    ) -> Self {
        Self {
            name,
            limits: Vec::new(),
            description,
            fail_mode,
            mode: Mode::Enforce,
            descriptor: None,
            params: Box::new([]),
            concurrency: Some(params),
            incarnation: 0,
        }
    }

    /// A concurrency policy's limit, or `None` for a rate policy. Acquires, peeks, reports,
    /// refunds and resets are for rate policies only, leases for concurrency policies only.
    pub fn concurrency(&self) -> Option<concurrency::Params> {
        self.concurrency
    }

    /// The policy's kind as the stores record it beside the document: `"concurrency"` or
    /// `"rate"`. A write that changes it starts a new incarnation.
    pub fn kind(&self) -> &'static str {
        if self.concurrency.is_some() {
            concurrency::NAME
        } else {
            "rate"
        }
    }

    /// The Envoy descriptor shape the policy claims ([`Descriptor::shape`]), if it serves one.
    pub fn shape(&self) -> Option<String> {
        self.descriptor.as_ref().map(Descriptor::shape)
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

    /// The same policy in `mode`.
    pub fn with_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The same policy serving `descriptor` over gRPC.
    pub fn with_descriptor(mut self, descriptor: Option<Descriptor>) -> Self {
        self.descriptor = descriptor;
        self
    }

    /// A policy of one limit, from values already checked against `algorithm`'s fields.
    pub fn single(
        name: PolicyName,
        algorithm: Algorithm,
        values: &[u64],
        description: Option<String>,
        fail_mode: FailMode,
    ) -> Self {
        let limit = Limit::new(name.clone(), algorithm, values);
        Self::new(name, vec![limit], description, fail_mode)
    }

    /// Each limit's parameters, in policy order.
    pub fn params(&self) -> &[Params] {
        &self.params
    }

    /// Whether the policy has several limits (and so reads back in the `limits` form).
    pub fn is_composite(&self) -> bool {
        self.limits.len() > 1
    }

    /// The limit whose quota is smallest (the first such): a cost above it can never be granted.
    pub fn tightest(&self) -> Option<&Limit> {
        self.limits.iter().min_by_key(|l| l.params.quota())
    }

    /// The state key suffix of limit `i`: `None` for a limit named after its policy (the one
    /// limit of a flat policy, whose state keys predate several limits), else its name.
    pub fn state_name(&self, i: usize) -> Option<&str> {
        self.limits
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
                map.end()
            }
        }
        let p = &self.0;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("name", p.name.as_str())?;
        match (p.concurrency, p.limits.as_slice()) {
            (Some(params), _) => {
                map.serialize_entry("algorithm", concurrency::NAME)?;
                for (field, value) in concurrency::values(&params) {
                    map.serialize_entry(field, &value)?;
                }
            }
            (None, [one]) => {
                map.serialize_entry("algorithm", &one.algorithm())?;
                for (field, value) in one.fields() {
                    map.serialize_entry(field, &value)?;
                }
            }
            (None, limits) => {
                let docs: Vec<LimitDoc<'_>> = limits.iter().map(LimitDoc).collect();
                map.serialize_entry("limits", &docs)?;
            }
        }
        if let Some(d) = &p.description {
            map.serialize_entry("description", d)?;
        }
        map.serialize_entry("fail_mode", &p.fail_mode)?;
        map.serialize_entry("mode", &p.mode)?;
        if let Some(d) = &p.descriptor {
            map.serialize_entry("descriptor", d)?;
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
        assert_ne!(
            stored,
            policy(5).with_mode(Mode::Shadow).with_incarnation(7)
        );
    }
}
