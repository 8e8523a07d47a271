//! Validation of client input: policy documents (rate policies and concurrency policies), and
//! the fields of an acquire.
//!
//! Every error names the field at fault. Wrong JSON types are [`ValidationError::is_malformed`]
//! (HTTP 400); values of the right type that are out of range, missing, or do not belong to the
//! algorithm are not (HTTP 422).

use serde_json::{Map, Number, Value};

use super::calendar::{self, Calendar};
use super::{
    concurrency, near_limit, Algorithm, Descriptor, FailMode, Kind, Limit, Mode, NearLimitRatio,
    Policy, PolicyName, Rate, RequestLimits, Tiers, MAX_DESCRIPTION_BYTES, MAX_LIMITS,
};
use crate::limiter::reservation::LONGEST_WAIT_MS;
use crate::limiter::{Field, ScriptArgs};

/// Why client input was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("the body must be a JSON object")]
    NotAnObject,
    #[error("`{field}` must be {expected}")]
    WrongType {
        field: String,
        expected: &'static str,
    },
    #[error("`{field}` is required{context}")]
    Missing { field: String, context: String },
    #[error("`{field}` {reason}")]
    Invalid { field: String, reason: String },
    #[error("`{field}` is not a field of {algorithm} policies")]
    NotApplicable {
        field: String,
        algorithm: &'static str,
    },
    #[error("unknown field `{field}`")]
    Unknown { field: String },
}

impl ValidationError {
    /// The field at fault, when there is one.
    pub fn field(&self) -> Option<&str> {
        match self {
            ValidationError::NotAnObject => None,
            ValidationError::WrongType { field, .. }
            | ValidationError::Missing { field, .. }
            | ValidationError::Invalid { field, .. }
            | ValidationError::NotApplicable { field, .. }
            | ValidationError::Unknown { field } => Some(field),
        }
    }

    /// Whether the input was malformed (wrong JSON types) rather than out of range.
    pub fn is_malformed(&self) -> bool {
        matches!(
            self,
            ValidationError::NotAnObject | ValidationError::WrongType { .. }
        )
    }

    pub fn invalid(field: &str, reason: impl Into<String>) -> Self {
        ValidationError::Invalid {
            field: field.to_owned(),
            reason: reason.into(),
        }
    }

    /// The same error with its field prefixed, for policies nested in a larger document.
    pub fn within(self, prefix: &str) -> Self {
        let join = |f: String| format!("{prefix}.{f}");
        match self {
            ValidationError::NotAnObject => ValidationError::WrongType {
                field: prefix.to_owned(),
                expected: "an object",
            },
            ValidationError::WrongType { field, expected } => ValidationError::WrongType {
                field: join(field),
                expected,
            },
            ValidationError::Missing { field, context } => ValidationError::Missing {
                field: join(field),
                context,
            },
            ValidationError::Invalid { field, reason } => ValidationError::Invalid {
                field: join(field),
                reason,
            },
            ValidationError::NotApplicable { field, algorithm } => ValidationError::NotApplicable {
                field: join(field),
                algorithm,
            },
            ValidationError::Unknown { field } => ValidationError::Unknown { field: join(field) },
        }
    }
}

/// Fields of a policy besides its limit's (flat form) or its `limits`.
const POLICY_FIELDS: [&str; 8] = [
    "name",
    "description",
    "fail_mode",
    "mode",
    "descriptor",
    "tiers",
    "request_limits",
    near_limit::FIELD,
];

/// Validates a policy document, in the flat form (`{"name", "algorithm", <fields>…}`, one limit)
/// or the `limits` form (`{"name", "limits": [{"name", "algorithm", <fields>…}…]}`). `path_name`,
/// when given, is the name from the URL: a `name` in the body must match it, and may be left
/// out. The only place policy input is read: the API and the configuration file both come
/// through here (a stored document is read by [`super::stored`], to the same bounds).
pub fn parse_policy(
    value: &Value,
    path_name: Option<&PolicyName>,
) -> Result<Policy, ValidationError> {
    let doc = value.as_object().ok_or(ValidationError::NotAnObject)?;

    let name = match (optional_str(doc, "name")?, path_name) {
        (Some(body), Some(path)) if body != path.as_str() => {
            return Err(ValidationError::invalid(
                "name",
                format!("`{body}` does not match the name in the path, `{path}`"),
            ))
        }
        (Some(body), _) => {
            PolicyName::parse(body).map_err(|r| ValidationError::invalid("name", r))?
        }
        (None, Some(path)) => path.clone(),
        (None, None) => {
            return Err(ValidationError::Missing {
                field: "name".into(),
                context: String::new(),
            })
        }
    };

    let limits = match doc.get("limits") {
        None | Some(Value::Null) => match parse_flat(doc)? {
            Parsed::Rate(limit) => Limits::Rate(vec![limit.named(name.clone())]),
            Parsed::Concurrency(params) => Limits::Concurrency(params),
        },
        Some(Value::Array(entries)) => Limits::Rate(parse_limits(doc, entries, &name)?),
        Some(_) => return Err(wrong_type("limits", "an array of limits")),
    };

    let description = match doc.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(description(s)?.to_owned()),
        Some(_) => return Err(wrong_type("description", "a string")),
    };

    let fail_mode = match optional_str(doc, "fail_mode")? {
        None => FailMode::default(),
        Some("open") => FailMode::Open,
        Some("closed") => FailMode::Closed,
        Some("local") => FailMode::Local,
        Some(other) => {
            return Err(ValidationError::invalid(
                "fail_mode",
                format!("`{other}` is not one of open, closed, local"),
            ))
        }
    };

    let mode = match optional_str(doc, "mode")? {
        None => Mode::default(),
        Some("enforce") => Mode::Enforce,
        Some("shadow") => Mode::Shadow,
        Some(other) => {
            return Err(ValidationError::invalid(
                "mode",
                format!("`{other}` is not one of enforce, shadow"),
            ))
        }
    };

    let descriptor = match doc.get("descriptor") {
        None | Some(Value::Null) => None,
        Some(d) => Some(Descriptor::parse(d)?),
    };

    let tiers = doc.get("tiers").filter(|t| !t.is_null());
    let request_limits = doc.get("request_limits").filter(|r| !r.is_null());
    let near_limit_ratio = doc
        .get(near_limit::FIELD)
        .filter(|r| !r.is_null())
        .map(NearLimitRatio::parse)
        .transpose()?;
    match limits {
        Limits::Rate(limits) => {
            let rate = Rate::new(limits)?
                .with_mode(mode)
                .with_descriptor(descriptor)
                .with_near_limit_ratio(near_limit_ratio);
            let request_limits = request_limits
                .map(|r| RequestLimits::parse(r, rate.limits()))
                .transpose()?;
            let rate = rate.with_request_limits(request_limits);
            let rate = match tiers {
                Some(t) => {
                    let tiers = Tiers::parse(t, rate.limits())?;
                    rate.with_tiers(tiers)
                }
                None => rate,
            };
            Ok(Policy::of_kind(
                name,
                Kind::Rate(rate),
                description,
                fail_mode,
            ))
        }
        Limits::Concurrency(params) => {
            only_rate_fields(
                mode,
                descriptor.as_ref(),
                tiers.is_some(),
                request_limits.is_some(),
                near_limit_ratio.is_some(),
            )?;
            Ok(Policy::concurrent(name, params, description, fail_mode))
        }
    }
}

/// A `description` within [`MAX_DESCRIPTION_BYTES`].
pub(super) fn description(text: &str) -> Result<&str, ValidationError> {
    if text.len() > MAX_DESCRIPTION_BYTES {
        return Err(ValidationError::invalid(
            "description",
            format!("must be at most {MAX_DESCRIPTION_BYTES} bytes"),
        ));
    }
    Ok(text)
}

/// Refuses, for a concurrency policy, what only rate policies have.
pub(super) fn only_rate_fields(
    mode: Mode,
    descriptor: Option<&Descriptor>,
    tiers: bool,
    request_limits: bool,
    near_limit_ratio: bool,
) -> Result<(), ValidationError> {
    // A lease is held, not spent: a concurrency policy's use is `ratelimiter_leases_in_use`.
    if near_limit_ratio {
        return Err(ValidationError::invalid(
            near_limit::FIELD,
            "is for rate policies: a concurrency policy counts no near-limit acquires",
        ));
    }
    // A lease is not a request of Envoy's, and holds no rate to give.
    if request_limits {
        return Err(ValidationError::invalid(
            "request_limits",
            "is for rate policies: a concurrency policy's limit is not given by requests",
        ));
    }
    // A concurrency limit's subjects are not given other limits (no tiers, no overrides) yet.
    if tiers {
        return Err(ValidationError::invalid(
            "tiers",
            "is for rate policies: a concurrency policy has no tiers",
        ));
    }
    // Envoy's rate-limit service decides requests, not units of work held for a while.
    if descriptor.is_some() {
        return Err(ValidationError::invalid(
            "descriptor",
            "is for rate policies: a concurrency policy is held by leases, not decided per \
             request over gRPC",
        ));
    }
    // Shadow mode answers acquires as allowed whatever was decided; what a lease would do in it
    // (a lease id for a slot not held?) is not settled, so it is refused rather than guessed.
    if mode == Mode::Shadow {
        return Err(ValidationError::invalid(
            "mode",
            "must be `enforce` for a concurrency policy: shadow mode is not supported for \
             concurrency limits yet",
        ));
    }
    Ok(())
}

/// What a policy document limits: rate limits, or a concurrency limit.
enum Limits {
    Rate(Vec<Limit>),
    Concurrency(concurrency::Params),
}

/// The limit of a flat policy: a rate algorithm's, or a concurrency limit.
enum Parsed {
    Rate(ParsedLimit),
    Concurrency(concurrency::Params),
}

/// The flat form's limit: `algorithm` and its fields beside the policy's own fields.
fn parse_flat(doc: &Map<String, Value>) -> Result<Parsed, ValidationError> {
    if optional_str(doc, "algorithm")? != Some(concurrency::NAME) {
        return Ok(Parsed::Rate(parse_limit(doc, &POLICY_FIELDS)?));
    }
    refuse_stray_fields(
        doc,
        &POLICY_FIELDS,
        concurrency::NAME,
        concurrency::is_field,
    )?;
    Ok(Parsed::Concurrency(concurrency::parse(doc)?))
}

/// The `limits` form: 1 to [`MAX_LIMITS`] limits with unique names. A single limit's name may be
/// left out and is the policy's (the policy reads back in the flat form).
fn parse_limits(
    doc: &Map<String, Value>,
    entries: &[Value],
    policy: &PolicyName,
) -> Result<Vec<Limit>, ValidationError> {
    // Fields of a limit belong inside it: refuse them beside `limits`, in a stable order.
    let mut keys: Vec<&String> = doc.keys().collect();
    keys.sort();
    for key in keys {
        if key == "limits" || POLICY_FIELDS.contains(&key.as_str()) {
            continue;
        }
        if key == "algorithm" || is_limit_field(key) {
            return Err(ValidationError::invalid(
                key,
                "belongs inside each of `limits`, not beside it",
            ));
        }
        return Err(ValidationError::Unknown { field: key.clone() });
    }
    if entries.is_empty() || entries.len() > MAX_LIMITS {
        return Err(ValidationError::invalid(
            "limits",
            format!("must hold 1 to {MAX_LIMITS} limits"),
        ));
    }
    let mut limits: Vec<Limit> = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let at = format!("limits[{i}]");
        let fields = entry
            .as_object()
            .ok_or_else(|| wrong_type(&at, "an object"))?;
        let parsed = parse_limit(fields, &["name"]).map_err(|e| e.within(&at))?;
        let name = match (
            optional_str(fields, "name").map_err(|e| e.within(&at))?,
            entries.len(),
        ) {
            (Some(n), _) => PolicyName::parse(n)
                .map_err(|r| ValidationError::invalid(&format!("{at}.name"), r))?,
            (None, 1) => policy.clone(),
            (None, _) => {
                return Err(ValidationError::Missing {
                    field: format!("{at}.name"),
                    context: " when a policy has several limits".into(),
                })
            }
        };
        if let Some(j) = limits.iter().position(|l| l.name == name) {
            return Err(ValidationError::invalid(
                &format!("{at}.name"),
                format!("`{name}` is the name of limits[{j}] already"),
            ));
        }
        limits.push(parsed.named(name));
    }
    // One limit is the flat form: it carries the policy's name.
    if let [one] = limits.as_mut_slice() {
        one.name = policy.clone();
    }
    Ok(limits)
}

fn is_field_of(algorithm: Algorithm, key: &str) -> bool {
    algorithm.fields().iter().any(|f| f.name == key)
}

/// Whether `key` is a field of any kind of rate limit (`calendar` included).
pub(super) fn is_limit_field(key: &str) -> bool {
    key == calendar::FIELD || Algorithm::ALL.iter().any(|a| is_field_of(*a, key))
}

/// Whether `key` is a field of any kind of limit.
pub(super) fn is_any_field(key: &str) -> bool {
    is_limit_field(key) || concurrency::is_field(key)
}

/// Why a concurrency limit is refused among `limits`.
const MIXED: &str = "`concurrency` cannot be one of `limits`: a concurrency limit is a policy of \
                     its own (mixing it with rate limits in one policy is not supported yet)";

/// One rate limit as read, before it is given its name.
pub(super) struct ParsedLimit {
    algorithm: Algorithm,
    values: ScriptArgs,
    calendar: Option<Calendar>,
}

impl ParsedLimit {
    pub(super) fn named(self, name: super::PolicyName) -> Limit {
        match self.calendar {
            Some(c) => Limit::calendar(name, self.values.as_slice()[0], c),
            None => Limit::new(name, self.algorithm, self.values.as_slice()),
        }
    }
}

/// Why `calendar` is offered on `fixed_window` only.
pub(super) const CALENDAR_ALGORITHMS: &str = "is offered for fixed_window limits only: a \
    sliding window weighs the previous window by the share of the current one that has passed, \
    which assumes windows of one length, and a calendar's are not (a month is 28 to 31 days, a \
    day of a DST change 23 or 25 hours); a bucket or GCRA refills continuously and has no \
    window to align";

/// One rate limit's `algorithm`, fields and `calendar`, from an object that may also hold
/// `others` (the flat form's rate limit, or an entry of `limits`, where a concurrency limit is
/// refused). Each value is checked against its field's bounds ([`crate::limiter::Field`]); a
/// `calendar` takes the place of `window_ms`, on a `fixed_window` only.
fn parse_limit(doc: &Map<String, Value>, others: &[&str]) -> Result<ParsedLimit, ValidationError> {
    let algorithm_name =
        optional_str(doc, "algorithm")?.ok_or_else(|| ValidationError::Missing {
            field: "algorithm".into(),
            context: String::new(),
        })?;
    let algorithm = rate_algorithm(algorithm_name)?;
    let calendar = match doc.get(calendar::FIELD) {
        None | Some(Value::Null) => None,
        Some(_) if algorithm != Algorithm::FixedWindow => {
            return Err(ValidationError::invalid(
                calendar::FIELD,
                CALENDAR_ALGORITHMS,
            ))
        }
        Some(v) => Some(Calendar::parse(v)?),
    };
    refuse_stray_fields(doc, others, algorithm.as_str(), |key| {
        is_field_of(algorithm, key) || (calendar.is_some() && key == calendar::FIELD)
    })?;

    let fields = match calendar {
        Some(_) => {
            if doc.get("window_ms").is_some_and(|v| !v.is_null()) {
                return Err(ValidationError::invalid(
                    "window_ms",
                    "cannot be given with `calendar`: a calendar limit's period is its unit",
                ));
            }
            &algorithm.fields()[..1]
        }
        None => algorithm.fields(),
    };
    let mut values = [0; 4];
    for (slot, field) in values.iter_mut().zip(fields) {
        *slot = match required_int(doc, field, algorithm.as_str()) {
            Err(ValidationError::Missing { field, context })
                if field == "window_ms" && algorithm == Algorithm::FixedWindow =>
            {
                return Err(ValidationError::Missing {
                    field,
                    context: format!("{context} (or `calendar`, for calendar periods)"),
                })
            }
            other => other?,
        };
    }
    Ok(ParsedLimit {
        algorithm,
        values: ScriptArgs::new(&values[..fields.len()]),
        calendar,
    })
}

/// The rate algorithm named `name` (a concurrency limit is refused: it is a policy of its own).
pub(super) fn rate_algorithm(name: &str) -> Result<Algorithm, ValidationError> {
    if name == concurrency::NAME {
        return Err(ValidationError::invalid("algorithm", MIXED));
    }
    Algorithm::parse(name).ok_or_else(|| {
        let mut names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.as_str()).collect();
        names.push(concurrency::NAME);
        ValidationError::invalid(
            "algorithm",
            format!("`{name}` is not one of {}", names.join(", ")),
        )
    })
}

/// Refuses any field of `doc` but `algorithm`, `others` and the fields of the kind `kind`
/// (`own`), first in a stable order, so that the error does not depend on map order: a field of
/// another kind is not applicable, anything else unknown.
fn refuse_stray_fields(
    doc: &Map<String, Value>,
    others: &[&str],
    kind: &'static str,
    own: impl Fn(&str) -> bool,
) -> Result<(), ValidationError> {
    let mut keys: Vec<&String> = doc.keys().collect();
    keys.sort();
    for key in keys {
        if key == "algorithm" || others.contains(&key.as_str()) || own(key) {
            continue;
        }
        if is_any_field(key) {
            return Err(ValidationError::NotApplicable {
                field: key.clone(),
                algorithm: kind,
            });
        }
        return Err(ValidationError::Unknown { field: key.clone() });
    }
    Ok(())
}

/// Validates a `cost`: an integer of at least 1 (the policy's own bound is checked later).
pub fn parse_cost(value: &Number) -> Result<u64, ValidationError> {
    match whole(value) {
        Some(n) if n >= 1 => {
            u64::try_from(n).map_err(|_| ValidationError::invalid("cost", "is too large"))
        }
        _ => Err(ValidationError::invalid(
            "cost",
            "must be an integer of at least 1",
        )),
    }
}

/// Validates an acquire's `max_wait_ms`: an integer (a whole number, as JSON Schema counts
/// `2000.0`) from 0 to [`LONGEST_WAIT_MS`].
pub fn parse_max_wait(value: &Number) -> Result<u64, ValidationError> {
    match whole(value) {
        Some(n) if (0..=i128::from(LONGEST_WAIT_MS)).contains(&n) => {
            u64::try_from(n).map_err(|_| ValidationError::invalid("max_wait_ms", "is too large"))
        }
        _ => Err(ValidationError::invalid(
            "max_wait_ms",
            format!("must be an integer from 0 to {LONGEST_WAIT_MS} (one hour)"),
        )),
    }
}

fn wrong_type(field: &str, expected: &'static str) -> ValidationError {
    ValidationError::WrongType {
        field: field.to_owned(),
        expected,
    }
}

fn optional_str<'a>(
    doc: &'a Map<String, Value>,
    field: &str,
) -> Result<Option<&'a str>, ValidationError> {
    match doc.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(wrong_type(field, "a string")),
    }
}

/// A JSON number as an integer: `Some` when it is whole, `None` when it has a fraction.
fn integer(value: &Value, field: &str) -> Result<Option<i128>, ValidationError> {
    match value {
        Value::Number(n) => Ok(whole(n)),
        _ => Err(wrong_type(field, "an integer")),
    }
}

/// The number's value when it is whole (`2`, `2.0`, `1e3`), `None` when it has a fraction.
pub(super) fn whole(n: &Number) -> Option<i128> {
    if let Some(i) = n.as_i64() {
        Some(i128::from(i))
    } else if let Some(u) = n.as_u64() {
        Some(i128::from(u))
    } else {
        let f = n.as_f64().unwrap_or(f64::NAN);
        (f.fract() == 0.0 && f.abs() < 1e30).then_some(f as i128)
    }
}

/// A required integer field of a limit of the kind `kind`, within the field's bounds.
pub(super) fn required_int(
    doc: &Map<String, Value>,
    field: &Field,
    kind: &str,
) -> Result<u64, ValidationError> {
    let value = match doc.get(field.name) {
        None | Some(Value::Null) => return Err(missing(field, kind)),
        Some(v) => v,
    };
    match integer(value, field.name)? {
        Some(n) => bounded(field, n),
        None => Err(ValidationError::invalid(
            field.name,
            "must be a whole number",
        )),
    }
}

/// `n` when it is within `field`'s bounds.
pub(super) fn bounded(field: &Field, n: i128) -> Result<u64, ValidationError> {
    let (min, max) = (field.min, field.max);
    if n >= i128::from(min) && n <= i128::from(max) {
        return Ok(n as u64);
    }
    Err(ValidationError::invalid(
        field.name,
        format!("must be an integer from {min} to {max}"),
    ))
}

/// The error for a required field missing from a limit of the kind `kind`.
pub(super) fn missing(field: &Field, kind: &str) -> ValidationError {
    ValidationError::Missing {
        field: field.name.to_owned(),
        context: format!(" for {kind} policies"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(v: Value) -> ValidationError {
        parse_policy(&v, None).expect_err("should be rejected")
    }

    #[test]
    fn accepts_each_algorithm() {
        for v in [
            json!({"name": "a", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000}),
            json!({"name": "b", "algorithm": "sliding_window_log", "limit": 10000, "window_ms": 1}),
            json!({"name": "c", "algorithm": "sliding_window_counter", "limit": 1, "window_ms": 2_678_400_000_u64}),
            json!({"name": "d", "algorithm": "token_bucket", "capacity": 20, "refill_tokens": 10, "refill_period_ms": 1000, "fail_mode": "closed", "description": "x", "mode": "shadow"}),
            json!({"name": "e", "algorithm": "gcra", "rate": 10, "period_ms": 1000, "burst": 5, "mode": "enforce"}),
        ] {
            let p = parse_policy(&v, None).expect("valid");
            let mut back = serde_json::to_value(p.to_doc()).expect("serializes");
            // Defaults read back written out.
            for (field, default) in [("fail_mode", "open"), ("mode", "enforce")] {
                if back[field] == default && v.get(field).is_none() {
                    back.as_object_mut().map(|o| o.remove(field));
                }
            }
            assert_eq!(back, v);
        }
    }

    #[test]
    fn errors_name_the_field() {
        let e = err(json!({"name": "a", "algorithm": "fixed_window", "limit": 0, "window_ms": 1}));
        assert_eq!(e.field(), Some("limit"));
        assert!(!e.is_malformed());
        let e =
            err(json!({"name": "a", "algorithm": "fixed_window", "limit": "5", "window_ms": 1}));
        assert_eq!(e.field(), Some("limit"));
        assert!(e.is_malformed());
        let e = err(json!({"name": "a", "algorithm": "fixed_window", "limit": 5}));
        assert_eq!(
            e.to_string(),
            "`window_ms` is required for fixed_window policies (or `calendar`, for calendar periods)"
        );
        let e = err(
            json!({"name": "a", "algorithm": "fixed_window", "limit": 5, "window_ms": 1, "capacity": 3}),
        );
        assert_eq!(
            e.to_string(),
            "`capacity` is not a field of fixed_window policies"
        );
        let e = err(json!({"name": "a", "algorithm": "leaky", "limit": 5}));
        assert_eq!(e.field(), Some("algorithm"));
        let e = err(
            json!({"name": "a", "algorithm": "fixed_window", "limit": 5, "window_ms": 1, "mode": "dry_run"}),
        );
        assert_eq!(e.field(), Some("mode"));
        assert_eq!(
            e.to_string(),
            "`mode` `dry_run` is not one of enforce, shadow"
        );
        let e = err(
            json!({"name": "a", "algorithm": "fixed_window", "limit": 5, "window_ms": 1, "mode": true}),
        );
        assert_eq!(e.field(), Some("mode"));
        assert!(e.is_malformed());
        let e = err(
            json!({"name": "a", "algorithm": "sliding_window_log", "limit": 10001, "window_ms": 1}),
        );
        assert_eq!(e.field(), Some("limit"));
        let e =
            err(json!({"name": "a", "algorithm": "fixed_window", "limit": 1.5, "window_ms": 1}));
        assert_eq!(e.field(), Some("limit"));
        let e = err(
            json!({"name": "a", "algorithm": "fixed_window", "limit": 1, "window_ms": 2_678_400_001_u64}),
        );
        assert_eq!(e.field(), Some("window_ms"));
        let e = err(
            json!({"name": "a", "algorithm": "fixed_window", "limit": 1, "window_ms": 1, "colour": 1}),
        );
        assert_eq!(e.to_string(), "unknown field `colour`");
    }

    #[test]
    fn several_limits_read_back_in_the_limits_form_and_one_in_the_flat_form() {
        let v = json!({"name": "api", "limits": [
            {"name": "burst", "algorithm": "token_bucket", "capacity": 20, "refill_tokens": 10, "refill_period_ms": 1000},
            {"name": "daily", "algorithm": "fixed_window", "limit": 10000, "window_ms": 86400000}
        ], "fail_mode": "closed", "mode": "enforce"});
        let p = parse_policy(&v, None).expect("valid");
        assert_eq!(p.rate().map(|r| r.limits().len()), Some(2));
        assert_eq!(p.state_name(0), Some("burst"));
        assert_eq!(serde_json::to_value(p.to_doc()).expect("serializes"), v);
        // A GET body sent back is the same policy.
        let again = serde_json::to_value(p.to_doc()).expect("serializes");
        assert_eq!(parse_policy(&again, None).expect("valid"), p);

        let one = json!({"name": "api", "limits": [
            {"name": "burst", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000.0}
        ]});
        let p = parse_policy(&one, None).expect("valid");
        assert_eq!(p.state_name(0), None, "one limit carries the policy's name");
        assert_eq!(
            serde_json::to_value(p.to_doc()).expect("serializes"),
            json!({"name": "api", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000, "fail_mode": "open", "mode": "enforce"})
        );
    }

    #[test]
    fn errors_in_limits_name_the_limit_and_field() {
        let fw = json!({"algorithm": "fixed_window", "limit": 5, "window_ms": 1000});
        let with = |name: &str| {
            let mut l = fw.clone();
            l["name"] = json!(name);
            l
        };
        let cases = [
            (json!({"name": "p", "limits": []}), "limits"),
            (
                json!({"name": "p", "limits": vec![fw.clone(); 9]}),
                "limits",
            ),
            (
                json!({"name": "p", "limits": [with("a"), fw.clone()]}),
                "limits[1].name",
            ),
            (
                json!({"name": "p", "limits": [with("a"), with("a")]}),
                "limits[1].name",
            ),
            (
                json!({"name": "p", "limits": [with("a"), with("b:c")]}),
                "limits[1].name",
            ),
            (
                json!({"name": "p", "limits": [with("a"), {"name": "b", "algorithm": "fixed_window", "limit": 0, "window_ms": 1}]}),
                "limits[1].limit",
            ),
            (
                json!({"name": "p", "limits": [with("a"), {"name": "b", "algorithm": "gcra", "rate": 1, "period_ms": 1, "burst": 1, "capacity": 1}]}),
                "limits[1].capacity",
            ),
            (
                json!({"name": "p", "limits": [with("a"), {"name": "b", "algorithm": "gcra", "rate": 1, "period_ms": 1, "burst": 1, "colour": 1}]}),
                "limits[1].colour",
            ),
            (
                json!({"name": "p", "limits": [with("a")], "algorithm": "fixed_window"}),
                "algorithm",
            ),
            (
                json!({"name": "p", "limits": [with("a")], "limit": 5}),
                "limit",
            ),
            (json!({"name": "p", "limits": [with("a"), 5]}), "limits[1]"),
            (json!({"name": "p", "limits": {"a": 1}}), "limits"),
        ];
        for (v, field) in cases {
            let e = err(v.clone());
            assert_eq!(e.field(), Some(field), "{v}: {e}");
        }
    }

    #[test]
    fn a_concurrency_policy_reads_back_as_written() {
        let v = json!({"name": "exports", "algorithm": "concurrency", "limit": 5, "lease_ms": 30000, "max_lease_ms": 60000, "description": "x", "fail_mode": "closed", "mode": "enforce"});
        let p = parse_policy(&v, None).expect("valid");
        assert!(p.rate().is_none() && p.params().is_empty());
        assert_eq!(
            p.concurrency(),
            Some(concurrency::Params {
                limit: 5,
                lease_us: 30_000_000,
                max_lease_us: 60_000_000,
            })
        );
        assert_eq!(serde_json::to_value(p.to_doc()).expect("serializes"), v);
        let bare = json!({"name": "e", "algorithm": "concurrency", "limit": 10000, "lease_ms": 86_400_000});
        let p = parse_policy(&bare, None).expect("valid");
        assert_eq!((p.fail_mode, p.mode()), (FailMode::Open, Mode::Enforce));
        assert_eq!(
            parse_policy(&serde_json::to_value(p.to_doc()).expect("serializes"), None),
            Ok(p)
        );
        assert_eq!(
            parse_policy(
                &json!({"name": "r", "algorithm": "fixed_window", "limit": 1, "window_ms": 1}),
                None
            )
            .expect("valid")
            .concurrency(),
            None
        );
    }

    #[test]
    fn concurrency_errors_name_the_field() {
        let c = |extra: Value| {
            let mut v =
                json!({"name": "c", "algorithm": "concurrency", "limit": 5, "lease_ms": 1000});
            for (k, x) in extra.as_object().expect("object") {
                v[k] = x.clone();
            }
            err(v)
        };
        for (extra, field) in [
            (json!({"limit": 0}), "limit"),
            (json!({"limit": 10_001}), "limit"),
            (json!({"lease_ms": 0}), "lease_ms"),
            (json!({"lease_ms": 86_400_001}), "lease_ms"),
            (json!({"lease_ms": 1.5}), "lease_ms"),
            (json!({"limit": null}), "limit"),
            (json!({"window_ms": 1000}), "window_ms"),
            (json!({"colour": 1}), "colour"),
            (json!({"mode": "shadow"}), "mode"),
        ] {
            assert_eq!(c(extra.clone()).field(), Some(field), "{extra}");
        }
        assert_eq!(
            c(json!({"window_ms": 1})).to_string(),
            "`window_ms` is not a field of concurrency policies"
        );
        assert_eq!(
            err(json!({"name": "c", "algorithm": "concurrency", "limit": 5})).to_string(),
            "`lease_ms` is required for concurrency policies"
        );
        assert_eq!(
            err(json!({"name": "a", "algorithm": "fixed_window", "limit": 5, "window_ms": 1, "lease_ms": 1}))
                .to_string(),
            "`lease_ms` is not a field of fixed_window policies"
        );
        let e = err(json!({"name": "a", "algorithm": "leaky"}));
        assert!(e.to_string().ends_with("gcra, concurrency"), "{e}");
    }

    #[test]
    fn a_concurrency_limit_is_refused_among_limits() {
        let fw = json!({"name": "a", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000});
        let cc = json!({"name": "b", "algorithm": "concurrency", "limit": 5, "lease_ms": 1000});
        for (limits, field) in [
            (json!([fw.clone(), cc.clone()]), "limits[1].algorithm"),
            (json!([cc.clone()]), "limits[0].algorithm"),
        ] {
            let e = err(json!({"name": "p", "limits": limits}));
            assert_eq!(e.field(), Some(field), "{e}");
            assert!(!e.is_malformed());
            assert!(e.to_string().contains("policy of its own"), "{e}");
        }
    }

    #[test]
    fn the_name_in_the_body_must_match_the_path() {
        let path = PolicyName::parse("p").expect("valid");
        let v = json!({"name": "q", "algorithm": "fixed_window", "limit": 1, "window_ms": 1});
        let e = parse_policy(&v, Some(&path)).expect_err("mismatch");
        assert_eq!(e.field(), Some("name"));
        let v = json!({"algorithm": "fixed_window", "limit": 1, "window_ms": 1});
        assert_eq!(parse_policy(&v, Some(&path)).expect("valid").name, path);
    }

    #[test]
    fn cost_must_be_a_positive_integer() {
        let n = |v: Value| match v {
            Value::Number(n) => n,
            _ => unreachable!(),
        };
        assert_eq!(parse_cost(&n(json!(3))), Ok(3));
        assert_eq!(parse_cost(&n(json!(2.0))), Ok(2));
        for bad in [json!(0), json!(-1), json!(1.5)] {
            assert_eq!(
                parse_cost(&n(bad)).expect_err("rejected").field(),
                Some("cost")
            );
        }
    }
}
