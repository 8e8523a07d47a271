//! `near_limit_ratio`: the share of a limit's quota from which an allowed acquire counts as near
//! the limit (`ratelimiter_near_limit_total`), as Envoy's rate-limit service counts `near_limit`.
//!
//! A rate policy's optional field, a number in (0, 1], 0.8 when left out. The bounds live here
//! once: the check, its message and the OpenAPI schema read them. The comparison is done in
//! whole millionths, so that a ratio of 0.8 of a quota of 10 is near at 2 remaining exactly, as
//! it reads, and not one unit later by a floating-point rounding.

use serde_json::Value;

use super::ValidationError;

/// The field's name in a policy document.
pub const FIELD: &str = "near_limit_ratio";
/// The ratio when a policy gives none, as Envoy's (80 %).
pub const DEFAULT: f64 = 0.8;
/// The least ratio, excluded: a ratio of 0 would count every allowed acquire.
pub const MIN_EXCLUSIVE: f64 = 0.0;
/// The greatest ratio, included: 1 counts only the acquires that leave nothing.
pub const MAX: f64 = 1.0;
/// The ratio's resolution: it is compared in millionths.
const SCALE: u64 = 1_000_000;

/// A validated `near_limit_ratio`: a finite number in (0, 1].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NearLimitRatio {
    /// As given, for reading the document back.
    ratio: f64,
    /// The quota share that may remain, in millionths: `(1 - ratio) × 1 000 000`, rounded.
    remaining_millionths: u64,
}

// The value is finite (checked by `parse`), so equality is an equivalence.
impl Eq for NearLimitRatio {}

impl Default for NearLimitRatio {
    fn default() -> Self {
        Self::new(DEFAULT)
    }
}

impl NearLimitRatio {
    /// A ratio already known to be within the bounds.
    fn new(ratio: f64) -> Self {
        let used = (ratio * SCALE as f64).round() as u64;
        Self {
            ratio,
            remaining_millionths: SCALE.saturating_sub(used.min(SCALE)),
        }
    }

    /// Reads the field's JSON value: a number in (0, 1]. Any other type is malformed (400); a
    /// number out of bounds is refused (422). Both name the field.
    pub fn parse(value: &Value) -> Result<Self, ValidationError> {
        let ratio = match value {
            Value::Number(n) => n.as_f64(),
            _ => None,
        }
        .ok_or(ValidationError::WrongType {
            field: FIELD.to_owned(),
            expected: "a number",
        })?;
        if !(ratio.is_finite() && ratio > MIN_EXCLUSIVE && ratio <= MAX) {
            return Err(ValidationError::invalid(
                FIELD,
                format!("must be a number greater than {MIN_EXCLUSIVE} and at most {MAX}"),
            ));
        }
        Ok(Self::new(ratio))
    }

    /// The ratio as given.
    pub fn get(self) -> f64 {
        self.ratio
    }

    /// Whether an allowed acquire that left `remaining` of `quota` is near the limit: the used
    /// share is at least the ratio, i.e. `remaining <= (1 - ratio) × quota`.
    pub fn is_near(self, remaining: u64, quota: u64) -> bool {
        u128::from(remaining) * u128::from(SCALE)
            <= u128::from(self.remaining_millionths) * u128::from(quota)
    }
}

impl serde::Serialize for NearLimitRatio {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(self.ratio)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_default_counts_from_eighty_percent_used() {
        let r = NearLimitRatio::default();
        // A quota of 10: near once 8 are used, that is 2 or fewer remain.
        assert!(!r.is_near(3, 10));
        assert!(r.is_near(2, 10));
        assert!(r.is_near(0, 10));
        // A quota of 3: 0.6 may remain, so only 0 does.
        assert!(!r.is_near(1, 3));
        assert!(r.is_near(0, 3));
    }

    #[test]
    fn a_ratio_of_one_counts_only_what_leaves_nothing() {
        let r = NearLimitRatio::parse(&json!(1)).expect("valid");
        assert!(r.is_near(0, 10));
        assert!(!r.is_near(1, 10));
        assert!(!r.is_near(1, u64::MAX));
    }

    #[test]
    fn bounds_and_types_are_checked_and_name_the_field() {
        for bad in [json!(0), json!(-0.5), json!(1.000_001), json!(2)] {
            let e = NearLimitRatio::parse(&bad).expect_err("out of bounds");
            assert_eq!(e.field(), Some(FIELD));
            assert!(!e.is_malformed(), "{bad}");
            assert_eq!(
                e.to_string(),
                "`near_limit_ratio` must be a number greater than 0 and at most 1"
            );
        }
        for bad in [json!("0.8"), json!(true), json!({})] {
            let e = NearLimitRatio::parse(&bad).expect_err("not a number");
            assert_eq!(e.field(), Some(FIELD));
            assert!(e.is_malformed(), "{bad}");
        }
        let r = NearLimitRatio::parse(&json!(0.000_001)).expect("valid");
        assert_eq!(r.get(), 0.000_001);
        assert!(r.is_near(9, 10) && !r.is_near(10, 10));
    }
}
