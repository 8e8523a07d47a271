//! A rate policy's `request_limits`: whether a request may give its own limit, and the most it
//! may give. Envoy's rate-limit filter can send one with a descriptor (`RateLimitDescriptor.limit`,
//! a `RateLimitOverride { requests_per_unit, unit }`, from the route's `limit` action or dynamic
//! metadata); without `request_limits` it is ignored, and with it the request is decided with
//! that limit in place of the policy's, clamped to the maximum, so that a client never grants
//! itself more than the operator allowed.
//!
//! Only for a rate policy of one limit: what one rate means for several limits (which of them it
//! replaces) is not guessed, so the field is refused there. How a rate becomes each algorithm's
//! fields is the algorithm's own ([`crate::limiter::Rule::per_period`]): a window of the unit
//! admitting `requests_per_unit`, a bucket (or a GCRA burst) of `requests_per_unit` refilled over
//! the unit.
//!
//! The clamp ([`RequestLimits::limit_for`]). The maximum is `M` per unit `V`; the request asks
//! `r` per unit `U`. It is honoured as asked when it is no looser in either respect: its rate
//! `r / U` at most `M / V` (units per second, compared exactly by cross-multiplying), and its
//! quota, the most units at once, `r` at most `M`. Otherwise it is clamped, keeping its unit, to
//! `r' = min(r, M, floor(M · U / V))`: the largest quota of that unit within both bounds; when
//! no whole unit fits (`U` too short for one unit at the maximum rate), the maximum itself, `M`
//! per `V`.

use serde_json::{Map, Value};

use super::input::{bounded, whole, ValidationError};
use super::{Limit, Limits};

/// The time units of Envoy's `RateLimitUnit` that a limit can have (a window or a period of at
/// most 31 days): `YEAR` cannot, and `UNKNOWN` is none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    /// 30 days, as envoyproxy/ratelimit counts one.
    Month,
}

impl Unit {
    pub const ALL: [Unit; 6] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|u| u.as_str() == s)
    }

    /// Its length in milliseconds.
    pub const fn ms(self) -> u64 {
        const S: u64 = 1_000;
        match self {
            Unit::Second => S,
            Unit::Minute => 60 * S,
            Unit::Hour => 3_600 * S,
            Unit::Day => 86_400 * S,
            Unit::Week => 7 * 86_400 * S,
            Unit::Month => 30 * 86_400 * S,
        }
    }
}

/// The limit a request asks for: `requests_per_unit` (at least 1) per `unit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requested {
    pub requests_per_unit: u64,
    pub unit: Unit,
}

impl Requested {
    /// A request's limit, or why it cannot be one: a `requests_per_unit` of 0.
    pub fn new(requests_per_unit: u64, unit: Unit) -> Result<Self, &'static str> {
        if requests_per_unit == 0 {
            return Err("its limit's requests_per_unit must be at least 1");
        }
        Ok(Self {
            requests_per_unit,
            unit,
        })
    }
}

/// A rate policy's `request_limits`: requests may give their own limit, of at most
/// `max_requests_per_unit` per `unit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RequestLimits {
    pub max_requests_per_unit: u64,
    pub unit: Unit,
}

/// The limits a request is decided with, from its own limit: as asked, or clamped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Given {
    pub limits: Limits,
    /// Whether the request asked for more than the maximum.
    pub clamped: bool,
}

/// The members of `request_limits`.
const MEMBERS: [&str; 2] = ["max_requests_per_unit", "unit"];

impl RequestLimits {
    /// Reads `request_limits` for a rate policy of `limits` (input and stored documents alike),
    /// naming the member at fault: refused for a policy of several limits, and its maximum
    /// within the bounds of the limit's quota field.
    pub fn parse(value: &Value, limits: &[Limit]) -> Result<Self, ValidationError> {
        let doc = value
            .as_object()
            .ok_or_else(|| ValidationError::WrongType {
                field: "request_limits".into(),
                expected: "an object with `max_requests_per_unit` and `unit`",
            })?;
        let mut stray: Vec<&String> = doc
            .keys()
            .filter(|k| !MEMBERS.contains(&k.as_str()))
            .collect();
        stray.sort();
        if let Some(k) = stray.first() {
            return Err(ValidationError::Unknown {
                field: format!("request_limits.{k}"),
            });
        }
        let [limit] = limits else {
            return Err(ValidationError::invalid(
                "request_limits",
                "is for a policy of one limit: which of several limits a request's one limit \
                 would replace is not defined",
            ));
        };
        let max = max_of(doc, limit)?;
        let unit = match doc.get("unit") {
            None | Some(Value::Null) => return Err(missing("request_limits.unit")),
            Some(Value::String(s)) => Unit::parse(s).ok_or_else(|| {
                let names: Vec<&str> = Unit::ALL.iter().map(|u| u.as_str()).collect();
                ValidationError::invalid(
                    "request_limits.unit",
                    format!("`{s}` is not one of {}", names.join(", ")),
                )
            })?,
            Some(_) => {
                return Err(ValidationError::WrongType {
                    field: "request_limits.unit".into(),
                    expected: "a string",
                })
            }
        };
        Ok(Self {
            max_requests_per_unit: max,
            unit,
        })
    }

    /// The limits a request that asks for `asked` is decided with, in place of the policy's one
    /// `limit` (of the same name and algorithm): see the module documentation for the clamp.
    pub fn limit_for(&self, limit: &Limit, asked: Requested) -> Given {
        let (r, u) = (
            u128::from(asked.requests_per_unit),
            u128::from(asked.unit.ms()),
        );
        let (m, v) = (
            u128::from(self.max_requests_per_unit),
            u128::from(self.unit.ms()),
        );
        let within = r <= m && r * v <= m * u;
        let (requests, period_ms) = if within {
            (r, u)
        } else {
            match r.min(m).min(m * u / v) {
                0 => (m, v),
                clamped => (clamped, u),
            }
        };
        // Both at most the maximum and a unit, which `parse` kept within the fields' bounds.
        let requests = u64::try_from(requests).unwrap_or(self.max_requests_per_unit);
        let period_ms = u64::try_from(period_ms).unwrap_or(self.unit.ms());
        let algorithm = limit.algorithm();
        let values = algorithm.per_period(requests, period_ms);
        Given {
            limits: Limits::new(vec![Limit::new(
                limit.name.clone(),
                algorithm,
                values.as_slice(),
            )]),
            clamped: !within,
        }
    }
}

/// `max_requests_per_unit`: a whole number within every bound a limit of that many units per
/// period has in `limit`'s algorithm (the quota field's, and for a GCRA `rate` too).
fn max_of(doc: &Map<String, Value>, limit: &Limit) -> Result<u64, ValidationError> {
    const FIELD: &str = "request_limits.max_requests_per_unit";
    let n = match doc.get("max_requests_per_unit") {
        None | Some(Value::Null) => return Err(missing(FIELD)),
        Some(Value::Number(n)) => {
            whole(n).ok_or_else(|| ValidationError::invalid(FIELD, "must be a whole number"))?
        }
        Some(_) => {
            return Err(ValidationError::WrongType {
                field: FIELD.into(),
                expected: "an integer",
            })
        }
    };
    let algorithm = limit.algorithm();
    // The fields a rate sets to its number of requests: those whose value `per_period` makes it.
    let probe = algorithm.per_period(2, 1);
    let mut max = u64::MAX;
    let mut min = 1;
    for (field, value) in algorithm.fields().iter().zip(probe) {
        if value == 2 {
            max = max.min(field.max);
            min = min.max(field.min);
        }
    }
    let field = crate::limiter::Field {
        name: FIELD,
        min,
        max,
        doc: "",
        example: 0,
    };
    bounded(&field, n).map_err(|e| match e {
        ValidationError::Invalid { field, reason } => ValidationError::Invalid {
            field,
            reason: format!("{reason} for a {} limit", algorithm.as_str()),
        },
        other => other,
    })
}

fn missing(field: &str) -> ValidationError {
    ValidationError::Missing {
        field: field.into(),
        context: " in `request_limits`".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Algorithm;
    use crate::policy::{parse_policy, Policy};
    use serde_json::json;

    fn policy(v: Value) -> Policy {
        parse_policy(&v, None).expect("valid")
    }

    fn one(p: &Policy) -> (&Limit, RequestLimits) {
        let rate = p.rate().expect("a rate policy");
        (&rate.limits()[0], *rate.request_limits().expect("set"))
    }

    fn asked(r: u64, unit: Unit) -> Requested {
        Requested::new(r, unit).expect("valid")
    }

    /// The one limit of `given`: its fields, and whether it was clamped.
    fn fields(given: &Given) -> (Vec<(&'static str, u64)>, bool) {
        (given.limits.limits()[0].fields().collect(), given.clamped)
    }

    #[test]
    fn a_rate_maps_onto_each_algorithm_as_a_window_or_a_bucket_of_its_unit() {
        let cases = [
            (
                json!({"algorithm": "fixed_window", "limit": 5, "window_ms": 1000}),
                vec![("limit", 30), ("window_ms", 60_000)],
            ),
            (
                json!({"algorithm": "sliding_window_log", "limit": 5, "window_ms": 1000}),
                vec![("limit", 30), ("window_ms", 60_000)],
            ),
            (
                json!({"algorithm": "sliding_window_counter", "limit": 5, "window_ms": 1000}),
                vec![("limit", 30), ("window_ms", 60_000)],
            ),
            (
                json!({"algorithm": "token_bucket", "capacity": 5, "refill_tokens": 1, "refill_period_ms": 1000}),
                vec![
                    ("capacity", 30),
                    ("refill_tokens", 30),
                    ("refill_period_ms", 60_000),
                ],
            ),
            (
                json!({"algorithm": "gcra", "rate": 5, "period_ms": 1000, "burst": 2}),
                vec![("rate", 30), ("period_ms", 60_000), ("burst", 30)],
            ),
        ];
        for (mut v, expected) in cases {
            v["name"] = json!("p");
            v["request_limits"] = json!({"max_requests_per_unit": 100, "unit": "minute"});
            let p = policy(v.clone());
            let (limit, max) = one(&p);
            let given = max.limit_for(limit, asked(30, Unit::Minute));
            assert_eq!(fields(&given), (expected, false), "{v}");
            let params = given.limits.params()[0];
            assert_eq!(
                (params.quota(), params.window_us()),
                (30, 60_000_000),
                "{v}"
            );
        }
    }

    #[test]
    fn a_request_above_the_maximum_is_clamped_in_rate_and_in_quota() {
        let p = policy(json!({"name": "p", "algorithm": "fixed_window", "limit": 5,
            "window_ms": 1000, "request_limits": {"max_requests_per_unit": 100, "unit": "minute"}}));
        let (limit, max) = one(&p);
        let at = |r, unit| fields(&max.limit_for(limit, asked(r, unit)));
        // Within: as asked, whatever its unit.
        assert_eq!(
            at(100, Unit::Minute),
            (vec![("limit", 100), ("window_ms", 60_000)], false)
        );
        assert_eq!(
            at(1, Unit::Second),
            (vec![("limit", 1), ("window_ms", 1_000)], false)
        );
        assert_eq!(
            at(50, Unit::Hour),
            (vec![("limit", 50), ("window_ms", 3_600_000)], false)
        );
        // Above in rate: 2 a second is 120 a minute; the most a second may have is 1 (100/60).
        assert_eq!(
            at(2, Unit::Second),
            (vec![("limit", 1), ("window_ms", 1_000)], true)
        );
        assert_eq!(
            at(101, Unit::Minute),
            (vec![("limit", 100), ("window_ms", 60_000)], true)
        );
        // Above in quota only: 1000 an hour is a slower rate, but 1000 at once.
        assert_eq!(
            at(1_000, Unit::Hour),
            (vec![("limit", 100), ("window_ms", 3_600_000)], true)
        );
        let p = policy(
            json!({"name": "p", "algorithm": "gcra", "rate": 1, "period_ms": 1000,
            "burst": 1, "request_limits": {"max_requests_per_unit": 10, "unit": "hour"}}),
        );
        let (limit, max) = one(&p);
        // No whole unit of a second fits 10 an hour: the maximum itself.
        assert_eq!(
            fields(&max.limit_for(limit, asked(5, Unit::Second))),
            (
                vec![("rate", 10), ("period_ms", 3_600_000), ("burst", 10)],
                true
            )
        );
    }

    #[test]
    fn the_largest_maximum_of_each_algorithm_makes_valid_fields() {
        for algorithm in Algorithm::ALL {
            let mut v = json!({"name": "p", "algorithm": algorithm.as_str()});
            for f in algorithm.fields() {
                v[f.name] = json!(f.min);
            }
            let max = algorithm
                .fields()
                .iter()
                .find(|f| f.name == algorithm.quota_field())
                .map_or(0, |f| f.max);
            v["request_limits"] = json!({"max_requests_per_unit": max, "unit": "month"});
            let p = policy(v.clone());
            let (limit, rl) = one(&p);
            let given = rl.limit_for(limit, asked(u64::from(u32::MAX), Unit::Month));
            let fields: Vec<(&str, u64)> = given.limits.limits()[0].fields().collect();
            for ((name, value), field) in fields.iter().zip(algorithm.fields()) {
                assert!(
                    bounded(field, i128::from(*value)).is_ok(),
                    "{v}: {name} = {value}"
                );
            }
            let mut over = v.clone();
            over["request_limits"]["max_requests_per_unit"] = json!(max + 1);
            let e = parse_policy(&over, None).expect_err("above the field's bound");
            assert_eq!(e.field(), Some("request_limits.max_requests_per_unit"));
        }
    }

    #[test]
    fn bad_request_limits_name_the_member() {
        let fw = json!({"name": "p", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000});
        let with = |rl: Value| {
            let mut v = fw.clone();
            v["request_limits"] = rl;
            parse_policy(&v, None).expect_err("refused")
        };
        for (rl, field, malformed) in [
            (json!(5), "request_limits", true),
            (
                json!({"unit": "minute"}),
                "request_limits.max_requests_per_unit",
                false,
            ),
            (
                json!({"max_requests_per_unit": 0, "unit": "minute"}),
                "request_limits.max_requests_per_unit",
                false,
            ),
            (
                json!({"max_requests_per_unit": 1.5, "unit": "minute"}),
                "request_limits.max_requests_per_unit",
                false,
            ),
            (
                json!({"max_requests_per_unit": "5", "unit": "minute"}),
                "request_limits.max_requests_per_unit",
                true,
            ),
            (
                json!({"max_requests_per_unit": 5}),
                "request_limits.unit",
                false,
            ),
            (
                json!({"max_requests_per_unit": 5, "unit": "year"}),
                "request_limits.unit",
                false,
            ),
            (
                json!({"max_requests_per_unit": 5, "unit": 1}),
                "request_limits.unit",
                true,
            ),
            (
                json!({"max_requests_per_unit": 5, "unit": "minute", "burst": 1}),
                "request_limits.burst",
                false,
            ),
        ] {
            let e = with(rl.clone());
            assert_eq!(
                (e.field(), e.is_malformed()),
                (Some(field), malformed),
                "{rl}: {e}"
            );
        }
        let composite = json!({"name": "p", "limits": [
            {"name": "a", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000},
            {"name": "b", "algorithm": "fixed_window", "limit": 50, "window_ms": 60000}],
            "request_limits": {"max_requests_per_unit": 5, "unit": "minute"}});
        let e = parse_policy(&composite, None).expect_err("several limits");
        assert_eq!(e.field(), Some("request_limits"));
        let concurrency = json!({"name": "c", "algorithm": "concurrency", "limit": 5,
            "lease_ms": 1000, "request_limits": {"max_requests_per_unit": 5, "unit": "minute"}});
        let e = parse_policy(&concurrency, None).expect_err("a concurrency policy");
        assert_eq!(e.field(), Some("request_limits"));
    }

    #[test]
    fn request_limits_read_back_as_written() {
        let v = json!({"name": "p", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000,
            "fail_mode": "open", "mode": "enforce",
            "request_limits": {"max_requests_per_unit": 100, "unit": "minute"}});
        let p = policy(v.clone());
        assert_eq!(serde_json::to_value(p.to_doc()).expect("serializes"), v);
        let without = policy(
            json!({"name": "p", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000}),
        );
        assert!(without.rate().and_then(|r| r.request_limits()).is_none());
        assert!(serde_json::to_value(without.to_doc())
            .expect("serializes")
            .get("request_limits")
            .is_none());
    }
}
