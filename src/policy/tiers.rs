//! Limits for some subjects other than the policy's own: [`Changes`] (new values for some
//! fields of some limits, by limit name) and the policy's named [`Tiers`] of them.
//!
//! A tier (`"tiers": {"pro": {"minute": {"rate": 1000, "burst": 200}}}`) and an override's
//! `limits` are the same thing: per limit of the policy, by its name (a flat policy's one limit is
//! named after the policy), the fields whose values replace the limit's own. Each value is
//! checked against its field's bounds, as the limit's own are; a field the limit's algorithm does
//! not have is refused (`algorithm` too: a tier cannot change a limit's algorithm, which would
//! give its state to another algorithm's script), and so is a limit the policy does not have.
//! Replacement, not minimum: a change may raise a limit as well as lower it.
//!
//! What the changed limits are is computed once, when the policy (or the override) is read, into
//! [`Limits`]: the same limits, in the same order and under the same names, so that the subject's
//! state keys stay the ones its policy's limits name and its usage carries over.

use std::collections::BTreeMap;

use serde::ser::SerializeMap;
use serde_json::Value;
use smallvec::SmallVec;

use super::input::{bounded, whole, ValidationError};
use super::{Limit, Params, PolicyName};

/// The most tiers one policy may name.
pub const MAX_TIERS: usize = 64;

/// New values for some fields of some limits, by limit name, in name order; validated against
/// the limits they were read for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes(Vec<LimitChange>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct LimitChange {
    limit: PolicyName,
    /// Field name and value, in the algorithm's field order when checked.
    fields: Vec<(String, u64)>,
}

/// A changes document as read, before validation: limit → field → integer.
type Raw = BTreeMap<String, BTreeMap<String, i128>>;

impl Changes {
    /// Reads changes for `limits` from JSON (an object of limit names, each an object of fields),
    /// naming the place of an error below `at` (`tiers.pro`, `limits`).
    pub fn parse(value: &Value, limits: &[Limit], at: &str) -> Result<Self, ValidationError> {
        let doc = value
            .as_object()
            .ok_or_else(|| ValidationError::WrongType {
                field: at.to_owned(),
                expected: "an object of limit names, each an object of the fields to change",
            })?;
        let mut raw = Raw::new();
        for (limit, fields) in doc {
            let place = format!("{at}.{limit}");
            let fields = fields
                .as_object()
                .ok_or_else(|| ValidationError::WrongType {
                    field: place.clone(),
                    expected: "an object of the limit's fields to change",
                })?;
            let mut values = BTreeMap::new();
            for (field, v) in fields {
                let n = match v {
                    Value::Number(n) => whole(n),
                    _ if field == "algorithm" => None,
                    _ => {
                        return Err(ValidationError::WrongType {
                            field: format!("{place}.{field}"),
                            expected: "an integer",
                        })
                    }
                };
                // Bounds and fractions are checked with the field, once it is known to be one.
                values.insert(field.clone(), n.unwrap_or(i128::MIN));
            }
            raw.insert(limit.clone(), values);
        }
        Self::check(raw, limits, at)
    }

    /// Changes as a store kept them, checked as input is.
    pub fn from_stored(
        stored: &BTreeMap<String, BTreeMap<String, u64>>,
        limits: &[Limit],
        at: &str,
    ) -> Result<Self, ValidationError> {
        let raw = stored
            .iter()
            .map(|(l, fields)| {
                let fields = fields
                    .iter()
                    .map(|(f, v)| (f.clone(), i128::from(*v)))
                    .collect();
                (l.clone(), fields)
            })
            .collect();
        Self::check(raw, limits, at)
    }

    fn check(raw: Raw, limits: &[Limit], at: &str) -> Result<Self, ValidationError> {
        let mut changes = Vec::with_capacity(raw.len());
        for (name, fields) in raw {
            let place = format!("{at}.{name}");
            let Some(limit) = limits.iter().find(|l| l.name.as_str() == name) else {
                let names: Vec<&str> = limits.iter().map(|l| l.name.as_str()).collect();
                return Err(ValidationError::invalid(
                    &place,
                    format!(
                        "is not a limit of the policy (its limits: {})",
                        names.join(", ")
                    ),
                ));
            };
            let algorithm = limit.algorithm();
            let mut changed = Vec::with_capacity(fields.len());
            for field in algorithm.fields() {
                if let Some(n) = fields.get(field.name) {
                    let value = if *n == i128::MIN {
                        Err(ValidationError::invalid(
                            field.name,
                            "must be a whole number",
                        ))
                    } else {
                        bounded(field, *n)
                    };
                    changed.push((field.name.to_owned(), value.map_err(|e| e.within(&place))?));
                }
            }
            if let Some(stray) = fields
                .keys()
                .find(|f| !algorithm.fields().iter().any(|a| a.name == *f))
            {
                let field = format!("{place}.{stray}");
                if stray == "algorithm" {
                    return Err(ValidationError::invalid(
                        &field,
                        "cannot be changed: a limit keeps its algorithm (and so its state) \
                         for every subject",
                    ));
                }
                if super::input::is_any_field(stray) {
                    return Err(ValidationError::NotApplicable {
                        field,
                        algorithm: algorithm.as_str(),
                    });
                }
                return Err(ValidationError::Unknown { field });
            }
            changes.push(LimitChange {
                limit: limit.name.clone(),
                fields: changed,
            });
        }
        Ok(Self(changes))
    }

    /// Changes kept as a store holds them, unchecked: an override's, which was checked against
    /// its policy when written, and is applied to the policy as it is now ([`Changes::apply`]
    /// passes over what no longer fits it).
    pub fn kept(stored: BTreeMap<String, BTreeMap<String, u64>>) -> Self {
        let changes = stored
            .into_iter()
            .filter_map(|(limit, fields)| {
                Some(LimitChange {
                    limit: PolicyName::parse(&limit).ok()?,
                    fields: fields.into_iter().collect(),
                })
            })
            .collect();
        Self(changes)
    }

    /// Whether nothing is changed.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|c| c.fields.is_empty())
    }

    /// `limits` with these changes. A limit or a field no longer among `limits` (the policy was
    /// changed after the changes were written) is passed over.
    pub fn apply(&self, limits: &[Limit]) -> Limits {
        let changed = limits
            .iter()
            .map(|l| {
                let Some(c) = self.0.iter().find(|c| c.limit == l.name) else {
                    return l.clone();
                };
                let fields = l.algorithm().fields();
                let mut values = [0; 4];
                for ((slot, (name, value)), field) in values.iter_mut().zip(l.fields()).zip(fields)
                {
                    *slot = c
                        .fields
                        .iter()
                        .find(|(f, v)| f == name && bounded(field, i128::from(*v)).is_ok())
                        .map_or(value, |(_, v)| *v);
                }
                Limit::new(l.name.clone(), l.algorithm(), &values[..fields.len()])
            })
            .collect();
        Limits::new(changed)
    }

    /// The names of the limits and fields these changes name that `limits` lacks (or whose values
    /// are out of the bounds of the limit's field): what a policy changed since they were written
    /// left stale (`resolve` shows them).
    pub fn stale(&self, limits: &[Limit]) -> Vec<String> {
        let mut stale = Vec::new();
        for c in &self.0 {
            match limits.iter().find(|l| l.name == c.limit) {
                None => stale.push(c.limit.to_string()),
                Some(l) => stale.extend(
                    c.fields
                        .iter()
                        .filter(|(f, v)| {
                            !l.algorithm()
                                .fields()
                                .iter()
                                .any(|a| a.name == f && bounded(a, i128::from(*v)).is_ok())
                        })
                        .map(|(f, _)| format!("{}.{f}", c.limit)),
                ),
            }
        }
        stale
    }
}

/// `{"<limit>": {"<field>": value…}…}`, as read.
impl serde::Serialize for Changes {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        struct Fields<'a>(&'a [(String, u64)]);
        impl serde::Serialize for Fields<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut map = serializer.serialize_map(Some(self.0.len()))?;
                for (f, v) in self.0 {
                    map.serialize_entry(f, v)?;
                }
                map.end()
            }
        }
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for c in &self.0 {
            map.serialize_entry(c.limit.as_str(), &Fields(&c.fields))?;
        }
        map.end()
    }
}

/// A policy's limits as one subject is decided with them: the policy's own, or changed. Never
/// empty; in the policy's order and under its limits' names.
///
/// The first limit is held inline: most policies have one, and an override's own limits are
/// read by every decision of its subject, where at 100,000 overrides each pointer followed is a
/// likely cache miss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    limits: SmallVec<[Limit; 1]>,
    /// Each limit's parameters, as the stores take them: derived once.
    params: SmallVec<[Params; 1]>,
}

impl Limits {
    /// `limits`, which the caller keeps to the invariants of [`super::Rate::new`].
    pub(super) fn new(limits: Vec<Limit>) -> Self {
        Self {
            params: limits.iter().map(|l| l.params).collect(),
            limits: SmallVec::from_vec(limits),
        }
    }

    /// No limits: what a concurrency policy has of rate limits.
    pub fn empty() -> Self {
        Self::new(Vec::new())
    }

    pub fn limits(&self) -> &[Limit] {
        &self.limits
    }

    pub fn params(&self) -> &[Params] {
        &self.params
    }

    /// The limit whose quota is smallest (the first such): a cost above it can never be granted.
    /// Only for limits of a rate policy, which are never empty.
    pub fn tightest(&self) -> &Limit {
        let mut tightest = &self.limits[0];
        for l in &self.limits[1..] {
            if l.params.quota() < tightest.params.quota() {
                tightest = l;
            }
        }
        tightest
    }
}

/// A policy's tiers by name, each changes of its limits and the limits they make.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tiers(BTreeMap<PolicyName, Tier>);

/// One tier: its changes, and the policy's limits with them (shared by every subject given the
/// tier).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tier {
    pub changes: Changes,
    pub limits: std::sync::Arc<Limits>,
}

impl Tiers {
    /// Reads `tiers` (an object of tier names) for a policy of `limits`.
    pub fn parse(value: &Value, limits: &[Limit]) -> Result<Self, ValidationError> {
        let doc = value
            .as_object()
            .ok_or_else(|| ValidationError::WrongType {
                field: "tiers".into(),
                expected: "an object of tier names, each an object of limit names",
            })?;
        let mut tiers = Vec::with_capacity(doc.len());
        for (name, tier) in doc {
            let at = format!("tiers.{name}");
            tiers.push((name.as_str(), Changes::parse(tier, limits, &at)?));
        }
        Self::named(tiers, limits)
    }

    /// Tiers as a store kept them, checked as input is.
    pub fn from_stored(
        stored: &BTreeMap<String, BTreeMap<String, BTreeMap<String, u64>>>,
        limits: &[Limit],
    ) -> Result<Self, ValidationError> {
        let mut tiers = Vec::with_capacity(stored.len());
        for (name, tier) in stored {
            let at = format!("tiers.{name}");
            tiers.push((name.as_str(), Changes::from_stored(tier, limits, &at)?));
        }
        Self::named(tiers, limits)
    }

    fn named(tiers: Vec<(&str, Changes)>, limits: &[Limit]) -> Result<Self, ValidationError> {
        if tiers.len() > MAX_TIERS {
            return Err(ValidationError::invalid(
                "tiers",
                format!("must name at most {MAX_TIERS} tiers"),
            ));
        }
        let mut out = BTreeMap::new();
        for (name, changes) in tiers {
            let tier = PolicyName::parse(name).map_err(|r| {
                ValidationError::invalid(
                    &format!("tiers.{name}"),
                    format!("is not a valid tier name: {r}"),
                )
            })?;
            let limits = std::sync::Arc::new(changes.apply(limits));
            out.insert(tier, Tier { changes, limits });
        }
        Ok(Self(out))
    }

    pub fn get(&self, name: &str) -> Option<&Tier> {
        self.0.get(name)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The tiers' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &PolicyName> {
        self.0.keys()
    }

    /// Each tier, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&PolicyName, &Tier)> {
        self.0.iter()
    }
}

/// `{"<tier>": {"<limit>": {"<field>": value…}…}…}`, as read.
impl serde::Serialize for Tiers {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, tier) in &self.0 {
            map.serialize_entry(name.as_str(), &tier.changes)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::parse_policy;
    use serde_json::json;

    fn api() -> crate::policy::Policy {
        parse_policy(
            &json!({"name": "api", "limits": [
                {"name": "minute", "algorithm": "gcra", "rate": 100, "period_ms": 60000, "burst": 20},
                {"name": "daily", "algorithm": "fixed_window", "limit": 10000, "window_ms": 86400000}]}),
            None,
        )
        .expect("valid")
    }

    fn limits() -> Vec<Limit> {
        api()
            .rate()
            .map(|r| r.limits().to_vec())
            .unwrap_or_default()
    }

    #[test]
    fn changes_replace_only_the_named_fields_of_the_named_limits() {
        let limits = limits();
        let c = Changes::parse(
            &json!({"minute": {"rate": 1000, "burst": 200}}),
            &limits,
            "t",
        )
        .expect("valid");
        let changed = c.apply(&limits);
        let fields: Vec<Vec<(&str, u64)>> = changed
            .limits()
            .iter()
            .map(|l| l.fields().collect())
            .collect();
        assert_eq!(
            fields,
            vec![
                vec![("rate", 1000), ("period_ms", 60000), ("burst", 200)],
                vec![("limit", 10000), ("window_ms", 86400000)],
            ]
        );
        assert_eq!(changed.params()[0].quota(), 200, "raised, not the minimum");
        let lower = Changes::parse(&json!({"daily": {"limit": 5}}), &limits, "t").expect("valid");
        assert_eq!(lower.apply(&limits).tightest().name.as_str(), "daily");
        assert_eq!(
            serde_json::to_value(&c).expect("serializes"),
            json!({"minute": {"rate": 1000, "burst": 200}})
        );
    }

    #[test]
    fn errors_name_the_field_below_the_place() {
        let limits = limits();
        for (v, field, malformed) in [
            (
                json!({"minute": {"rate": 0}}),
                "tiers.pro.minute.rate",
                false,
            ),
            (
                json!({"minute": {"rate": 1.5}}),
                "tiers.pro.minute.rate",
                false,
            ),
            (
                json!({"minute": {"rate": "9"}}),
                "tiers.pro.minute.rate",
                true,
            ),
            (
                json!({"minute": {"limit": 9}}),
                "tiers.pro.minute.limit",
                false,
            ),
            (
                json!({"minute": {"colour": 9}}),
                "tiers.pro.minute.colour",
                false,
            ),
            (
                json!({"minute": {"algorithm": "token_bucket"}}),
                "tiers.pro.minute.algorithm",
                false,
            ),
            (json!({"hourly": {"limit": 9}}), "tiers.pro.hourly", false),
            (json!({"minute": 5}), "tiers.pro.minute", true),
            (json!([1]), "tiers.pro", true),
        ] {
            let e = Changes::parse(&v, &limits, "tiers.pro").expect_err("refused");
            assert_eq!(
                (e.field(), e.is_malformed()),
                (Some(field), malformed),
                "{v}: {e}"
            );
        }
    }

    #[test]
    fn tiers_read_back_as_written_and_refuse_bad_names_and_too_many() {
        let limits = limits();
        let v = json!({"pro": {"minute": {"rate": 1000, "burst": 200}},
                       "enterprise": {"minute": {"rate": 10000, "burst": 2000}, "daily": {"limit": 5000000}},
                       "free": {}});
        let tiers = Tiers::parse(&v, &limits).expect("valid");
        assert_eq!(serde_json::to_value(&tiers).expect("serializes"), v);
        assert_eq!(
            tiers
                .get("enterprise")
                .map(|t| t.limits.params()[1].quota()),
            Some(5_000_000)
        );
        assert_eq!(
            tiers.get("free").map(|t| t.limits.limits()),
            Some(&limits[..])
        );
        let e = Tiers::parse(&json!({"a:b": {}}), &limits).expect_err("refused");
        assert_eq!(e.field(), Some("tiers.a:b"));
        let many: serde_json::Map<String, Value> = (0..=MAX_TIERS)
            .map(|i| (format!("t{i}"), json!({})))
            .collect();
        let e = Tiers::parse(&Value::Object(many), &limits).expect_err("refused");
        assert_eq!(e.field(), Some("tiers"));
    }

    #[test]
    fn changes_for_a_policy_changed_since_pass_over_what_it_lost() {
        let limits = limits();
        let c = Changes::parse(
            &json!({"minute": {"rate": 1000}, "daily": {"limit": 7}}),
            &limits,
            "t",
        )
        .expect("valid");
        let only_daily: Vec<Limit> = limits[1..].to_vec();
        let applied = c.apply(&only_daily);
        assert_eq!(applied.params()[0].quota(), 7);
        assert_eq!(c.stale(&only_daily), vec!["minute".to_owned()]);
        assert!(c.stale(&limits).is_empty());
    }
}
