//! A policy as the stores keep it: the typed shape of the document that
//! [`PolicyDoc`](super::PolicyDoc)'s
//! `Serialize` writes ([`StoredDoc`]), its conversion back into a [`Policy`], and the one
//! migration from the layout that earlier versions wrote ([`from_legacy_fields`]).
//!
//! A stored document is trusted no more than input: the conversion checks the same bounds with
//! the same messages as [`parse_policy`](super::parse_policy) (a document it would refuse is
//! refused here too), but reads a typed shape instead of walking JSON, and names what is stored
//! in one place. What is written is not decided here: the stores write `PolicyDoc`.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Number, Value};

use super::input::{
    bounded, description, is_any_field, is_limit_field, missing, only_rate_fields, rate_algorithm,
    CALENDAR_ALGORITHMS,
};
use super::tiers::StoredChanges;
use super::{
    concurrency, Algorithm, Calendar, Descriptor, FailMode, Kind, Limit, Mode, NearLimitRatio,
    Policy, PolicyName, Rate, RequestLimits, Tiers, ValidationError,
};
use crate::limiter::Field;

/// A stored policy document, as [`PolicyDoc`](super::PolicyDoc) writes it: the flat form (`algorithm` and its fields beside the policy's own
/// fields, for one rate limit or a concurrency limit) or the `limits` form (several rate limits).
/// `fail_mode` and `mode` default as in input, for documents written before they were.
#[derive(Debug, Clone, Deserialize)]
pub struct StoredDoc {
    name: String,
    #[serde(default)]
    algorithm: Option<String>,
    #[serde(default)]
    limits: Option<Vec<StoredLimit>>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    fail_mode: FailMode,
    #[serde(default)]
    mode: Mode,
    /// Kept as JSON: [`Descriptor::parse`] is its one reader.
    #[serde(default)]
    descriptor: Option<Value>,
    #[serde(default)]
    tiers: Option<StoredTiers>,
    /// Kept as JSON: [`RequestLimits::parse`] is its one reader, for input too.
    #[serde(default)]
    request_limits: Option<Value>,
    /// Kept as JSON: [`NearLimitRatio::parse`] is its one reader, for input too.
    #[serde(default)]
    near_limit_ratio: Option<Value>,
    /// The flat form's limit's calendar, kept as JSON: [`Calendar::parse`] is its one reader.
    #[serde(default)]
    calendar: Option<Value>,
    /// The flat form's algorithm's fields (every other key of the document).
    #[serde(flatten)]
    fields: BTreeMap<String, u64>,
}

/// A stored document's `tiers`: tier → limit → its changes (field → value, and a calendar
/// limit's `time_zone`).
type StoredTiers = BTreeMap<String, StoredChanges>;

/// One entry of a stored document's `limits`.
#[derive(Debug, Clone, Deserialize)]
struct StoredLimit {
    name: String,
    algorithm: String,
    /// Kept as JSON: [`Calendar::parse`] is its one reader.
    #[serde(default)]
    calendar: Option<Value>,
    /// The algorithm's fields (every other key of the entry).
    #[serde(flatten)]
    fields: BTreeMap<String, u64>,
}

impl StoredDoc {
    /// The document in `json`, as the stores keep it in one field.
    pub fn from_json(json: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(json)
    }
}

impl TryFrom<StoredDoc> for Policy {
    type Error = ValidationError;

    fn try_from(doc: StoredDoc) -> Result<Self, ValidationError> {
        let StoredDoc {
            name,
            algorithm,
            limits,
            description: text,
            fail_mode,
            mode,
            descriptor,
            tiers,
            request_limits,
            near_limit_ratio,
            calendar,
            fields,
        } = doc;
        let request_limits = request_limits.filter(|r| !r.is_null());
        let near_limit_ratio = near_limit_ratio
            .filter(|r| !r.is_null())
            .map(|r| NearLimitRatio::parse(&r))
            .transpose()?;
        let name = PolicyName::parse(&name).map_err(|r| ValidationError::invalid("name", r))?;
        let description = text
            .as_deref()
            .map(description)
            .transpose()?
            .map(str::to_owned);
        let descriptor = descriptor
            .filter(|d| !d.is_null())
            .map(|d| Descriptor::parse(&d))
            .transpose()?;
        let kind = match (limits, algorithm) {
            (Some(entries), algorithm) => {
                // Fields of a limit belong inside it, as in input.
                if algorithm.is_some() {
                    return Err(beside_limits("algorithm"));
                }
                if let Some(key) = fields.keys().next() {
                    return Err(beside_limits(key));
                }
                if calendar.as_ref().is_some_and(|c| !c.is_null()) {
                    return Err(beside_limits(super::calendar::FIELD));
                }
                let rate = with_tiers(rate(&name, entries, mode, descriptor)?, tiers)?
                    .with_near_limit_ratio(near_limit_ratio);
                Kind::Rate(with_request_limits(rate, request_limits.as_ref())?)
            }
            (None, Some(algorithm)) if algorithm == concurrency::NAME => {
                only_rate_fields(
                    mode,
                    descriptor.as_ref(),
                    tiers.is_some(),
                    request_limits.is_some(),
                    near_limit_ratio.is_some(),
                )?;
                if calendar.as_ref().is_some_and(|c| !c.is_null()) {
                    return Err(ValidationError::NotApplicable {
                        field: super::calendar::FIELD.into(),
                        algorithm: concurrency::NAME,
                    });
                }
                Kind::Concurrency(concurrency_params(&fields)?)
            }
            (None, Some(algorithm)) => {
                let limit = rate_limit(name.clone(), &algorithm, &fields, calendar.as_ref())?;
                let rate = Rate::new(vec![limit])?
                    .with_mode(mode)
                    .with_descriptor(descriptor)
                    .with_near_limit_ratio(near_limit_ratio);
                let rate = with_tiers(rate, tiers)?;
                Kind::Rate(with_request_limits(rate, request_limits.as_ref())?)
            }
            (None, None) => {
                return Err(ValidationError::Missing {
                    field: "algorithm".into(),
                    context: String::new(),
                })
            }
        };
        Ok(Policy::of_kind(name, kind, description, fail_mode))
    }
}

/// A policy from the fields of a hash written by the versions before policies were stored as
/// one JSON document (this crate's builds before the `doc` field, all of version 0.1.0): one
/// field per field of a flat document, every value a string. Numbers are read back from the
/// fields that hold them; a name or a description that looks like a number stays a string.
/// The fields are the document's only: `born`, `kind` and `shape` are the store's, removed by
/// the caller.
pub fn from_legacy_fields(fields: Vec<(String, String)>) -> Result<Policy, LegacyError> {
    let map: Map<String, Value> = fields
        .into_iter()
        .map(|(k, v)| {
            let value = match v.parse::<u64>() {
                Ok(n)
                    if !matches!(
                        k.as_str(),
                        "name" | "description" | "algorithm" | "fail_mode"
                    ) =>
                {
                    Value::Number(Number::from(n))
                }
                _ => Value::String(v),
            };
            (k, value)
        })
        .collect();
    let doc: StoredDoc = serde_json::from_value(Value::Object(map)).map_err(LegacyError::Shape)?;
    Policy::try_from(doc).map_err(LegacyError::Invalid)
}

/// Why a legacy hash does not decode.
#[derive(Debug, thiserror::Error)]
pub enum LegacyError {
    #[error("{0}")]
    Shape(serde_json::Error),
    #[error("{0}")]
    Invalid(ValidationError),
}

/// The rate limits with their stored tiers, checked as input is.
fn with_tiers(rate: Rate, tiers: Option<StoredTiers>) -> Result<Rate, ValidationError> {
    match tiers {
        None => Ok(rate),
        Some(t) => {
            let tiers = Tiers::from_stored(&t, rate.limits())?;
            Ok(rate.with_tiers(tiers))
        }
    }
}

/// The rate limits with their stored `request_limits`, checked as input is.
fn with_request_limits(rate: Rate, stored: Option<&Value>) -> Result<Rate, ValidationError> {
    let request_limits = stored
        .map(|r| RequestLimits::parse(r, rate.limits()))
        .transpose()?;
    Ok(rate.with_request_limits(request_limits))
}

fn beside_limits(key: &str) -> ValidationError {
    if key == "algorithm" || is_limit_field(key) {
        return ValidationError::invalid(key, "belongs inside each of `limits`, not beside it");
    }
    ValidationError::Unknown { field: key.into() }
}

/// The `limits` form's rate limits: 1 to [`super::MAX_LIMITS`] of unique names; one carries
/// the policy's name.
fn rate(
    policy: &PolicyName,
    entries: Vec<StoredLimit>,
    mode: Mode,
    descriptor: Option<Descriptor>,
) -> Result<Rate, ValidationError> {
    let one = entries.len() == 1;
    let mut limits = Vec::with_capacity(entries.len());
    for (i, entry) in entries.into_iter().enumerate() {
        let at = format!("limits[{i}]");
        let name = PolicyName::parse(&entry.name)
            .map_err(|r| ValidationError::invalid(&format!("{at}.name"), r))?;
        // One limit is the flat form: it carries the policy's name.
        let name = if one { policy.clone() } else { name };
        let limit = rate_limit(
            name,
            &entry.algorithm,
            &entry.fields,
            entry.calendar.as_ref(),
        )
        .map_err(|e| e.within(&at))?;
        limits.push(limit);
    }
    Ok(Rate::new(limits)?
        .with_mode(mode)
        .with_descriptor(descriptor))
}

/// One rate limit named `name`, of `algorithm` and its fields, with its `calendar` if it has
/// one (then in place of `window_ms`, on a `fixed_window` only, as in input).
fn rate_limit(
    name: PolicyName,
    algorithm: &str,
    fields: &BTreeMap<String, u64>,
    calendar: Option<&Value>,
) -> Result<Limit, ValidationError> {
    let algorithm = rate_algorithm(algorithm)?;
    refuse_stray(fields, algorithm.as_str(), |key| {
        is_field_of(algorithm, key)
    })?;
    if let Some(c) = calendar.filter(|c| !c.is_null()) {
        if algorithm != Algorithm::FixedWindow {
            return Err(ValidationError::invalid(
                super::calendar::FIELD,
                CALENDAR_ALGORITHMS,
            ));
        }
        if fields.contains_key("window_ms") {
            return Err(ValidationError::invalid(
                "window_ms",
                "cannot be given with `calendar`: a calendar limit's period is its unit",
            ));
        }
        let limit = value(fields, &algorithm.fields()[0], algorithm.as_str())?;
        return Ok(Limit::calendar(name, limit, Calendar::parse(c)?));
    }
    let mut values = [0; 4];
    for (slot, field) in values.iter_mut().zip(algorithm.fields()) {
        *slot = value(fields, field, algorithm.as_str())?;
    }
    Ok(Limit::new(
        name,
        algorithm,
        &values[..algorithm.fields().len()],
    ))
}

/// A concurrency limit's parameters from its fields.
fn concurrency_params(
    fields: &BTreeMap<String, u64>,
) -> Result<concurrency::Params, ValidationError> {
    refuse_stray(fields, concurrency::NAME, concurrency::is_field)?;
    let limit = value(fields, &concurrency::LIMIT, concurrency::NAME)?;
    let lease_ms = value(fields, &concurrency::LEASE_MS, concurrency::NAME)?;
    let max_lease_ms = match fields.get(concurrency::MAX_LEASE.name) {
        None => None,
        Some(n) => Some(bounded(&concurrency::MAX_LEASE, i128::from(*n))?),
    };
    concurrency::params(limit, lease_ms, max_lease_ms)
}

/// Required `field` of a limit of the kind `kind`, within its bounds.
fn value(
    fields: &BTreeMap<String, u64>,
    field: &Field,
    kind: &str,
) -> Result<u64, ValidationError> {
    let n = fields.get(field.name).ok_or_else(|| missing(field, kind))?;
    bounded(field, i128::from(*n))
}

/// Refuses the first field (in key order, as input does) that is not one of the kind `kind`.
fn refuse_stray(
    fields: &BTreeMap<String, u64>,
    kind: &'static str,
    own: impl Fn(&str) -> bool,
) -> Result<(), ValidationError> {
    match fields.keys().find(|k| !own(k)) {
        None => Ok(()),
        Some(key) if is_any_field(key) => Err(ValidationError::NotApplicable {
            field: key.clone(),
            algorithm: kind,
        }),
        Some(key) => Err(ValidationError::Unknown { field: key.clone() }),
    }
}

fn is_field_of(algorithm: Algorithm, key: &str) -> bool {
    algorithm.fields().iter().any(|f| f.name == key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::parse_policy;
    use serde_json::json;

    fn stored(v: &Value) -> Result<Policy, String> {
        let doc = StoredDoc::from_json(&v.to_string()).map_err(|e| e.to_string())?;
        Policy::try_from(doc).map_err(|e| e.to_string())
    }

    #[test]
    fn every_kind_and_form_reads_back_as_the_document_it_was_written_from() {
        for v in [
            json!({"name": "a", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000, "description": "42", "fail_mode": "closed", "mode": "shadow"}),
            json!({"name": "b", "algorithm": "gcra", "rate": 10, "period_ms": 1000, "burst": 5, "descriptor": {"domain": "d", "entries": [{"key": "k"}]}}),
            json!({"name": "c", "limits": [
                {"name": "burst", "algorithm": "token_bucket", "capacity": 20, "refill_tokens": 10, "refill_period_ms": 1000},
                {"name": "daily", "algorithm": "fixed_window", "limit": 10000, "window_ms": 86400000}
            ], "fail_mode": "local", "mode": "enforce"}),
            json!({"name": "t", "limits": [
                {"name": "minute", "algorithm": "gcra", "rate": 100, "period_ms": 60000, "burst": 20},
                {"name": "daily", "algorithm": "fixed_window", "limit": 10000, "window_ms": 86400000}
            ], "tiers": {"pro": {"minute": {"rate": 1000, "burst": 200}}, "free": {}}}),
            json!({"name": "f", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000, "tiers": {"pro": {"f": {"limit": 50}}}}),
            json!({"name": "r", "algorithm": "token_bucket", "capacity": 5, "refill_tokens": 5, "refill_period_ms": 1000, "request_limits": {"max_requests_per_unit": 100, "unit": "minute"}}),
            json!({"name": "d", "algorithm": "concurrency", "limit": 5, "lease_ms": 30000, "max_lease_ms": 60000}),
            json!({"name": "e", "algorithm": "concurrency", "limit": 5, "lease_ms": 30000}),
            json!({"name": "n", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000, "near_limit_ratio": 0.9}),
            json!({"name": "m", "limits": [
                {"name": "x", "algorithm": "fixed_window", "limit": 5, "window_ms": 1},
                {"name": "y", "algorithm": "gcra", "rate": 5, "period_ms": 1000, "burst": 5}
            ], "near_limit_ratio": 1}),
        ] {
            let input = parse_policy(&v, None).expect("valid");
            let written = serde_json::to_string(&input.to_doc()).expect("serializes");
            let read =
                Policy::try_from(StoredDoc::from_json(&written).expect("shape")).expect("valid");
            assert_eq!(read, input, "{v}");
            assert_eq!(stored(&v), Ok(input), "{v}");
        }
    }

    #[test]
    fn what_input_refuses_a_stored_document_refuses() {
        for v in [
            json!({"name": "a", "algorithm": "fixed_window", "limit": 0, "window_ms": 1000}),
            json!({"name": "a", "algorithm": "fixed_window", "limit": 5}),
            json!({"name": "a", "algorithm": "fixed_window", "limit": 5, "window_ms": 1, "capacity": 1}),
            json!({"name": "a", "algorithm": "fixed_window", "limit": 5, "window_ms": 1, "colour": 1}),
            json!({"name": "a", "algorithm": "fixed_window", "limit": "5", "window_ms": 1}),
            json!({"name": "a", "algorithm": "leaky", "limit": 5}),
            json!({"name": "a:b", "algorithm": "fixed_window", "limit": 5, "window_ms": 1}),
            json!({"name": "a", "algorithm": "fixed_window", "limit": 5, "window_ms": 1, "mode": "dry_run"}),
            json!({"name": "a", "algorithm": "fixed_window", "limit": 5, "window_ms": 1, "description": "x".repeat(1025)}),
            json!({"name": "a", "algorithm": "fixed_window", "limit": 5, "window_ms": 1, "descriptor": {"domain": ""}}),
            json!({"name": "a", "limits": []}),
            json!({"name": "a", "limits": [
                {"name": "x", "algorithm": "fixed_window", "limit": 5, "window_ms": 1},
                {"name": "x", "algorithm": "fixed_window", "limit": 5, "window_ms": 1}
            ]}),
            json!({"name": "a", "limits": [
                {"name": "x", "algorithm": "fixed_window", "limit": 5, "window_ms": 1},
                {"name": "y", "algorithm": "concurrency", "limit": 5, "lease_ms": 1}
            ]}),
            json!({"name": "a", "algorithm": "fixed_window", "limits": [
                {"name": "x", "algorithm": "fixed_window", "limit": 5, "window_ms": 1}
            ]}),
            json!({"name": "c", "algorithm": "concurrency", "limit": 5, "lease_ms": 1000, "mode": "shadow"}),
            json!({"name": "c", "algorithm": "concurrency", "limit": 5, "lease_ms": 1000, "max_lease_ms": 999}),
            json!({"name": "c", "algorithm": "concurrency", "limit": 5, "lease_ms": 1000, "window_ms": 1}),
            json!({"name": "c", "algorithm": "concurrency", "limit": 5, "lease_ms": 1000, "tiers": {}}),
            json!({"name": "f", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000, "tiers": {"pro": {"f": {"limit": 0}}}}),
            json!({"name": "f", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000, "tiers": {"pro": {"g": {"limit": 5}}}}),
            json!({"name": "c", "algorithm": "concurrency", "limit": 5, "lease_ms": 1000, "descriptor": {"domain": "d", "entries": [{"key": "k"}]}}),
            json!({"algorithm": "fixed_window", "limit": 5, "window_ms": 1}),
            json!({"name": "a"}),
            json!({"name": "r", "algorithm": "fixed_window", "limit": 5, "window_ms": 1, "request_limits": {"max_requests_per_unit": 0, "unit": "minute"}}),
            json!({"name": "r", "algorithm": "sliding_window_log", "limit": 5, "window_ms": 1, "request_limits": {"max_requests_per_unit": 10001, "unit": "minute"}}),
            json!({"name": "r", "algorithm": "fixed_window", "limit": 5, "window_ms": 1, "request_limits": {"max_requests_per_unit": 5, "unit": "year"}}),
            json!({"name": "r", "algorithm": "fixed_window", "limit": 5, "window_ms": 1, "request_limits": {"max_requests_per_unit": 5}}),
            json!({"name": "r", "algorithm": "fixed_window", "limit": 5, "window_ms": 1, "request_limits": {"max_requests_per_unit": 5, "unit": "minute", "x": 1}}),
            json!({"name": "r", "limits": [
                {"name": "x", "algorithm": "fixed_window", "limit": 5, "window_ms": 1},
                {"name": "y", "algorithm": "fixed_window", "limit": 5, "window_ms": 2}
            ], "request_limits": {"max_requests_per_unit": 5, "unit": "minute"}}),
            json!({"name": "c", "algorithm": "concurrency", "limit": 5, "lease_ms": 1000, "request_limits": {"max_requests_per_unit": 5, "unit": "minute"}}),
            json!({"name": "n", "algorithm": "fixed_window", "limit": 5, "window_ms": 1, "near_limit_ratio": 0}),
            json!({"name": "n", "algorithm": "fixed_window", "limit": 5, "window_ms": 1, "near_limit_ratio": 1.5}),
            json!({"name": "n", "algorithm": "fixed_window", "limit": 5, "window_ms": 1, "near_limit_ratio": "0.8"}),
            json!({"name": "c", "algorithm": "concurrency", "limit": 5, "lease_ms": 1000, "near_limit_ratio": 0.8}),
        ] {
            assert!(parse_policy(&v, None).is_err(), "input accepts {v}");
            assert!(stored(&v).is_err(), "a stored document accepts {v}");
        }
    }

    #[test]
    fn errors_name_the_field_as_input_does() {
        for (v, field) in [
            (
                json!({"name": "a", "algorithm": "fixed_window", "limit": 0, "window_ms": 1000}),
                "limit",
            ),
            (
                json!({"name": "c", "algorithm": "concurrency", "limit": 5, "lease_ms": 1000, "max_lease_ms": 999}),
                "max_lease_ms",
            ),
            (
                json!({"name": "c", "algorithm": "concurrency", "limit": 5, "lease_ms": 1000, "mode": "shadow"}),
                "mode",
            ),
        ] {
            let input = parse_policy(&v, None).expect_err("refused");
            let doc = StoredDoc::from_json(&v.to_string()).expect("shape");
            let read = Policy::try_from(doc).expect_err("refused");
            assert_eq!((input.field(), read.field()), (Some(field), Some(field)));
            assert_eq!(input.to_string(), read.to_string());
        }
    }
}
