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
//! # Time zones
//!
//! A calendar limit's changes may also give it a `time_zone` (an IANA name of the bundled
//! database, as the limit's `calendar.time_zone`): `{"daily": {"time_zone": "Asia/Tokyo"}}`, so
//! that the subjects given the changes count their days (weeks, months…) from their own
//! midnight, with the calendar's unit and anchors kept. An unknown zone, or a `time_zone` for a
//! limit that is not a calendar limit, is refused (422 naming `<at>.<limit>.time_zone`); a value
//! that is not a string is malformed (400). A subject whose zone changes keeps its count until
//! the end of the period it was counted in, as for any change of a limit's parameters (see
//! `limiter::fixed_window`): a count made under Berlin's day carries until Berlin's midnight,
//! and from then on its periods are Tokyo's days. A `time_zone` kept for a limit that is no
//! longer a calendar limit (the policy changed since), or a zone the database no longer has, is
//! passed over and named stale (`daily.time_zone`), as a field the limit lost is.
//!
//! Stored as read: the time zone beside the fields' integers (`{"daily": {"limit": 5,
//! "time_zone": "Asia/Tokyo"}}`, [`StoredChanges`]), so that a document of integers only, as
//! earlier versions wrote, reads back unchanged.
//!
//! What the changed limits are is computed once, when the policy (or the override) is read, into
//! [`Limits`]: the same limits, in the same order and under the same names, so that the subject's
//! state keys stay the ones its policy's limits name and its usage carries over.

use std::collections::BTreeMap;

use serde::ser::SerializeMap;
use serde::Deserialize;
use serde_json::Value;
use smallvec::SmallVec;

use super::calendar::Zone;
use super::input::{bounded, whole, ValidationError};
use super::{Limit, Params, PolicyName};

/// The most tiers one policy may name.
pub const MAX_TIERS: usize = 64;

/// The change that gives a calendar limit another time zone.
pub const TIME_ZONE: &str = "time_zone";

/// Changes as a store keeps them: limit → its changes.
pub type StoredChanges = BTreeMap<String, StoredLimitChange>;

/// One limit's changes as a store keeps them: the fields' new values and, for a calendar limit,
/// its `time_zone` (absent in what earlier versions wrote, which reads back as no zone change).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct StoredLimitChange {
    #[serde(default)]
    pub time_zone: Option<String>,
    /// The fields' values (every other key).
    #[serde(flatten)]
    pub fields: BTreeMap<String, u64>,
}

/// New values for some fields of some limits, by limit name, in name order; validated against
/// the limits they were read for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes(Vec<LimitChange>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct LimitChange {
    limit: PolicyName,
    /// Field name and value, in the algorithm's field order when checked.
    fields: Vec<(String, u64)>,
    /// A calendar limit's time zone instead of its own.
    time_zone: Option<ZoneChange>,
}

/// A `time_zone` change.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ZoneChange {
    Known(Zone),
    /// Kept by a store, of a name the bundled database does not have (it had when the change
    /// was written): passed over, and shown as written.
    Unknown(String),
}

impl ZoneChange {
    fn name(&self) -> &str {
        match self {
            ZoneChange::Known(z) => z.name(),
            ZoneChange::Unknown(name) => name,
        }
    }

    /// The zone, when the database has it and `limit` is a calendar limit.
    fn for_limit(&self, limit: &Limit) -> Option<&Zone> {
        match self {
            ZoneChange::Known(z) if limit.calendar_of().is_some() => Some(z),
            _ => None,
        }
    }
}

/// A changes document as read, before validation.
type Raw = BTreeMap<String, RawLimit>;

/// One limit's changes as read: field → integer (`i128::MIN` for a value that is not a whole
/// number), and the time zone's name.
#[derive(Default)]
struct RawLimit {
    fields: BTreeMap<String, i128>,
    time_zone: Option<String>,
}

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
            let mut values = RawLimit::default();
            for (field, v) in fields {
                if field == TIME_ZONE {
                    values.time_zone = Some(v.as_str().map(str::to_owned).ok_or_else(|| {
                        ValidationError::WrongType {
                            field: format!("{place}.{field}"),
                            expected: "an IANA time-zone name (a string)",
                        }
                    })?);
                    continue;
                }
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
                values.fields.insert(field.clone(), n.unwrap_or(i128::MIN));
            }
            raw.insert(limit.clone(), values);
        }
        Self::check(raw, limits, at)
    }

    /// Changes as a store kept them, checked as input is.
    pub fn from_stored(
        stored: &StoredChanges,
        limits: &[Limit],
        at: &str,
    ) -> Result<Self, ValidationError> {
        let raw = stored
            .iter()
            .map(|(l, change)| {
                let fields = change
                    .fields
                    .iter()
                    .map(|(f, v)| (f.clone(), i128::from(*v)))
                    .collect();
                let time_zone = change.time_zone.clone();
                (l.clone(), RawLimit { fields, time_zone })
            })
            .collect();
        Self::check(raw, limits, at)
    }

    fn check(raw: Raw, limits: &[Limit], at: &str) -> Result<Self, ValidationError> {
        let mut changes = Vec::with_capacity(raw.len());
        for (name, RawLimit { fields, time_zone }) in raw {
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
            if limit.calendar_of().is_some() && fields.contains_key("window_ms") {
                return Err(ValidationError::invalid(
                    &format!("{place}.window_ms"),
                    "cannot be set for a calendar limit: its period is its calendar's unit",
                ));
            }
            let time_zone = match time_zone {
                None => None,
                Some(zone) => {
                    let field = format!("{place}.{TIME_ZONE}");
                    if limit.calendar_of().is_none() {
                        return Err(ValidationError::invalid(
                            &field,
                            "applies only to a calendar limit (one with `calendar`), whose \
                             periods are days, weeks, months… of a time zone",
                        ));
                    }
                    let zone = Zone::lookup(&zone)
                        .map_err(|reason| ValidationError::invalid(&field, reason))?;
                    Some(ZoneChange::Known(zone))
                }
            };
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
                time_zone,
            });
        }
        Ok(Self(changes))
    }

    /// Changes kept as a store holds them, unchecked: an override's, which was checked against
    /// its policy when written, and is applied to the policy as it is now ([`Changes::apply`]
    /// passes over what no longer fits it).
    pub fn kept(stored: StoredChanges) -> Self {
        let changes = stored
            .into_iter()
            .filter_map(|(limit, change)| {
                Some(LimitChange {
                    limit: PolicyName::parse(&limit).ok()?,
                    fields: change.fields.into_iter().collect(),
                    time_zone: change.time_zone.map(|name| match Zone::lookup(&name) {
                        Ok(zone) => ZoneChange::Known(zone),
                        Err(_) => ZoneChange::Unknown(name),
                    }),
                })
            })
            .collect();
        Self(changes)
    }

    /// Whether nothing is changed.
    pub fn is_empty(&self) -> bool {
        self.0
            .iter()
            .all(|c| c.fields.is_empty() && c.time_zone.is_none())
    }

    /// `limits` with these changes: the new values, and a calendar limit's new time zone
    /// ([`Limit::with_zone`]). A limit or a field no longer among `limits` (the policy was
    /// changed after the changes were written), or a time zone for a limit that is no longer a
    /// calendar limit, is passed over.
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
                let changed = l.with_values(&values[..fields.len().min(l.fields().count())]);
                match c.time_zone.as_ref().and_then(|z| z.for_limit(l)) {
                    Some(zone) => changed.with_zone(zone),
                    None => changed,
                }
            })
            .collect();
        Limits::new(changed)
    }

    /// The names of the limits and fields these changes name that `limits` lacks (or whose values
    /// are out of the bounds of the limit's field), and `<limit>.time_zone` for a time zone of a
    /// limit that is no longer a calendar limit (or that the database no longer has): what a
    /// policy changed since they were written left stale (`resolve` shows them).
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
                        .map(|(f, _)| format!("{}.{f}", c.limit))
                        .chain(
                            c.time_zone
                                .as_ref()
                                .filter(|z| z.for_limit(l).is_none())
                                .map(|_| format!("{}.{TIME_ZONE}", c.limit)),
                        ),
                ),
            }
        }
        stale
    }
}

/// `{"<limit>": {"<field>": value…, "time_zone"?: "<IANA name>"}…}`, as read (and as stored,
/// [`StoredChanges`]).
impl serde::Serialize for Changes {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        struct Fields<'a>(&'a LimitChange);
        impl serde::Serialize for Fields<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let c = self.0;
                let n = c.fields.len() + usize::from(c.time_zone.is_some());
                let mut map = serializer.serialize_map(Some(n))?;
                for (f, v) in &c.fields {
                    map.serialize_entry(f, v)?;
                }
                if let Some(z) = &c.time_zone {
                    map.serialize_entry(TIME_ZONE, z.name())?;
                }
                map.end()
            }
        }
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for c in &self.0 {
            map.serialize_entry(c.limit.as_str(), &Fields(c))?;
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
    /// Whether any limit is a calendar one, whose parameters depend on the time
    /// ([`Limits::params_at`]).
    calendar: bool,
}

impl Limits {
    /// `limits`, which the caller keeps to the invariants of [`super::Rate::new`].
    pub(super) fn new(limits: Vec<Limit>) -> Self {
        Self {
            params: limits.iter().map(|l| l.params).collect(),
            calendar: limits.iter().any(|l| l.calendar_of().is_some()),
            limits: SmallVec::from_vec(limits),
        }
    }

    /// The parameters to decide with at `now_us` (the instance's time), when any limit is a
    /// calendar one ([`Limit::params_at`]); `None` when they are [`Limits::params`], whatever
    /// the time.
    pub fn params_at(&self, now_us: u64) -> Option<Box<[Params]>> {
        self.calendar
            .then(|| self.limits.iter().map(|l| l.params_at(now_us)).collect())
    }

    /// The same limits, each calendar limit in `zone` instead of its own time zone (an
    /// override's).
    pub fn in_zone(&self, zone: &super::calendar::Zone) -> Self {
        Self::new(self.limits.iter().map(|l| l.with_zone(zone)).collect())
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
        stored: &BTreeMap<String, StoredChanges>,
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

    /// A gcra `minute` and a calendar `daily` of 5 a day in Berlin.
    fn calendar_limits() -> Vec<Limit> {
        parse_policy(
            &json!({"name": "cal", "limits": [
                {"name": "minute", "algorithm": "gcra", "rate": 100, "period_ms": 60000, "burst": 20},
                {"name": "daily", "algorithm": "fixed_window", "limit": 5,
                 "calendar": {"unit": "day", "time_zone": "Europe/Berlin"}}]}),
            None,
        )
        .expect("valid")
        .rate()
        .map(|r| r.limits().to_vec())
        .unwrap_or_default()
    }

    fn zone_of(limits: &Limits, i: usize) -> Option<&str> {
        limits.limits()[i].calendar_of().map(|c| c.zone().name())
    }

    #[test]
    fn a_time_zone_moves_a_calendar_limit_and_keeps_its_unit_and_values() {
        let limits = calendar_limits();
        let c = Changes::parse(
            &json!({"daily": {"limit": 7, "time_zone": "asia/tokyo"}}),
            &limits,
            "limits",
        )
        .expect("valid");
        let applied = c.apply(&limits);
        assert_eq!(zone_of(&applied, 1), Some("Asia/Tokyo"));
        assert_eq!(applied.params()[1].quota(), 7);
        assert_eq!(
            applied.limits()[1].calendar_of().map(|c| c.unit()),
            limits[1].calendar_of().map(|c| c.unit())
        );
        assert_eq!(applied.limits()[0], limits[0], "the other limit as it was");
        // Read back in the database's spelling, beside the fields.
        let shown = serde_json::to_value(&c).expect("serializes");
        assert_eq!(
            shown,
            json!({"daily": {"limit": 7, "time_zone": "Asia/Tokyo"}})
        );
        // A zone alone is a change.
        let only = Changes::parse(&json!({"daily": {"time_zone": "Asia/Tokyo"}}), &limits, "l")
            .expect("valid");
        assert!(!only.is_empty());
        assert_eq!(zone_of(&only.apply(&limits), 1), Some("Asia/Tokyo"));
        assert_eq!(only.apply(&limits).params()[1].quota(), 5);
        // Tokyo's days end at 15:00 UTC, Berlin's (in winter) at 23:00 UTC.
        let now = 1_796_385_600_000_000; // 2026-12-04T12:00:00Z
        let end = |l: &Limits| match l.params_at(now).map(|p| p[1]) {
            Some(Params::FixedWindow(p)) => p.calendar.map(|b| b.end_us),
            _ => None,
        };
        assert_eq!(end(&only.apply(&limits)), Some(1_796_396_400_000_000));
        assert_eq!(
            end(&Changes::default().apply(&limits)),
            Some(1_796_425_200_000_000)
        );
    }

    #[test]
    fn a_time_zone_is_refused_naming_it_when_unknown_misplaced_or_not_a_string() {
        let epoch = limits();
        let limits = calendar_limits();
        for (v, malformed) in [
            (json!({"daily": {"time_zone": "Mars/Olympus_Mons"}}), false),
            (json!({"daily": {"time_zone": "Etc/Unknown"}}), false),
            (json!({"daily": {"time_zone": ""}}), false),
            (json!({"minute": {"time_zone": "Asia/Tokyo"}}), false),
            (json!({"daily": {"time_zone": 9}}), true),
            (json!({"daily": {"time_zone": null}}), true),
            (json!({"daily": {"time_zone": ["Asia/Tokyo"]}}), true),
        ] {
            let e = Changes::parse(&v, &limits, "limits").expect_err("refused");
            let limit = v.as_object().and_then(|m| m.keys().next()).cloned();
            let field = format!("limits.{}.time_zone", limit.unwrap_or_default());
            assert_eq!(
                (e.field(), e.is_malformed()),
                (Some(field.as_str()), malformed),
                "{v}: {e}"
            );
        }
        // An epoch window is no calendar limit either.
        let e = Changes::parse(&json!({"daily": {"time_zone": "Asia/Tokyo"}}), &epoch, "t")
            .expect_err("refused");
        assert_eq!(e.field(), Some("t.daily.time_zone"), "{e}");
    }

    #[test]
    fn stored_changes_keep_the_zone_and_the_old_layout_reads_back() {
        let limits = calendar_limits();
        let c = Changes::parse(
            &json!({"daily": {"limit": 7, "time_zone": "Asia/Tokyo"}, "minute": {"rate": 5}}),
            &limits,
            "t",
        )
        .expect("valid");
        let text = serde_json::to_string(&c).expect("serializes");
        let stored: StoredChanges = serde_json::from_str(&text).expect("the stored layout");
        assert_eq!(
            stored.get("daily").and_then(|d| d.time_zone.as_deref()),
            Some("Asia/Tokyo")
        );
        assert_eq!(
            Changes::from_stored(&stored, &limits, "t").expect("valid"),
            c
        );
        assert_eq!(Changes::kept(stored), c);
        // Integers only, as earlier versions wrote: no zone change.
        let old: StoredChanges =
            serde_json::from_str(r#"{"daily": {"limit": 7}}"#).expect("the old layout");
        let kept = Changes::kept(old);
        assert_eq!(zone_of(&kept.apply(&limits), 1), Some("Europe/Berlin"));
        assert_eq!(
            serde_json::to_value(&kept).expect("serializes"),
            json!({"daily": {"limit": 7}})
        );
        // A zone the database does not have is kept as written, passed over and named stale.
        let gone: StoredChanges =
            serde_json::from_str(r#"{"daily": {"time_zone": "Atlantis/Capital"}}"#)
                .expect("stored");
        let kept = Changes::kept(gone);
        assert_eq!(zone_of(&kept.apply(&limits), 1), Some("Europe/Berlin"));
        assert_eq!(kept.stale(&limits), vec!["daily.time_zone".to_owned()]);
        assert_eq!(
            serde_json::to_value(&kept).expect("serializes"),
            json!({"daily": {"time_zone": "Atlantis/Capital"}})
        );
    }

    #[test]
    fn a_time_zone_for_a_limit_no_longer_on_the_calendar_is_stale_and_passed_over() {
        let calendar = calendar_limits();
        let c = Changes::parse(
            &json!({"daily": {"limit": 7, "time_zone": "Asia/Tokyo"}}),
            &calendar,
            "t",
        )
        .expect("valid");
        assert!(c.stale(&calendar).is_empty());
        // The policy's `daily` is now a window of 86,400,000 ms.
        let epoch = limits();
        let applied = c.apply(&epoch);
        assert_eq!(applied.limits()[1].calendar_of(), None);
        assert_eq!(applied.params()[1].quota(), 7, "its limit still applies");
        assert_eq!(c.stale(&epoch), vec!["daily.time_zone".to_owned()]);
    }

    #[test]
    fn tiers_may_give_a_time_zone_and_keep_it_stored() {
        let limits = calendar_limits();
        let v =
            json!({"jp": {"daily": {"time_zone": "Asia/Tokyo"}}, "pro": {"daily": {"limit": 50}}});
        let tiers = Tiers::parse(&v, &limits).expect("valid");
        assert_eq!(serde_json::to_value(&tiers).expect("serializes"), v);
        assert_eq!(
            tiers.get("jp").and_then(|t| zone_of(&t.limits, 1)),
            Some("Asia/Tokyo")
        );
        let stored: BTreeMap<String, StoredChanges> =
            serde_json::from_value(v.clone()).expect("stored layout");
        assert_eq!(Tiers::from_stored(&stored, &limits).expect("valid"), tiers);
        let e = Tiers::parse(&json!({"jp": {"daily": {"time_zone": "Nowhere"}}}), &limits)
            .expect_err("refused");
        assert_eq!(e.field(), Some("tiers.jp.daily.time_zone"));
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
