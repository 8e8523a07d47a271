//! The concurrency kind of policy, as documents name it: `{"algorithm": "concurrency", "limit",
//! "lease_ms", "max_lease_ms"}` in the flat form (`max_lease_ms` optional), and nowhere else.
//!
//! A concurrency limit is not one of the rate algorithms of [`crate::limiter::Algorithm`] (whose
//! rules acquire, peek, report and refund units): it is held by leases
//! ([`crate::limiter::concurrency`]). Its fields are described here with the same [`Field`] the
//! rate algorithms use, so that validation, its messages and the OpenAPI schema read one set of
//! bounds.

use serde_json::{Map, Number, Value};

use super::input::{required_int, whole, ValidationError};
use crate::limiter::concurrency::{MAX_LEASE_MS, MAX_LIMIT};
use crate::limiter::Field;

pub use crate::limiter::concurrency::Params;

/// The kind's one name: JSON `algorithm`.
pub const NAME: &str = "concurrency";

/// `limit`: units held at once.
pub const LIMIT: Field = Field {
    name: "limit",
    min: 1,
    max: MAX_LIMIT,
    doc: "units held at once by live leases, at most",
    example: 5,
};

/// `lease_ms`: a lease's lifetime when the call names none.
pub const LEASE_MS: Field = Field {
    name: "lease_ms",
    min: 1,
    max: MAX_LEASE_MS,
    doc: "a lease's lifetime in milliseconds when the take or renewal names none; a holder that \
          needs longer renews",
    example: 30_000,
};

/// `max_lease_ms`: the longest lease a take or renewal may ask for; optional.
pub const MAX_LEASE: Field = Field {
    name: "max_lease_ms",
    min: 1,
    max: MAX_LEASE_MS,
    doc: "the longest `lease_ms` a take or renewal may ask for, at least `lease_ms`; left out, \
          it is `lease_ms` (a longer request is refused with 422 naming `lease_ms`), so that no \
          client can hold a slot longer than the policy says without renewing",
    example: 300_000,
};

/// The required fields, in document order.
pub const FIELDS: [Field; 2] = [LIMIT, LEASE_MS];

/// Whether `key` is a field of concurrency policies.
pub fn is_field(key: &str) -> bool {
    FIELDS.iter().any(|f| f.name == key) || key == MAX_LEASE.name
}

/// The parameters from a flat document whose `algorithm` is [`NAME`]; stray fields have been
/// refused by the caller.
pub(super) fn parse(doc: &Map<String, Value>) -> Result<Params, ValidationError> {
    let limit = required_int(doc, &LIMIT, NAME)?;
    let lease_ms = required_int(doc, &LEASE_MS, NAME)?;
    let max_lease_ms = match doc.get(MAX_LEASE.name) {
        None | Some(Value::Null) => None,
        Some(_) => Some(required_int(doc, &MAX_LEASE, NAME)?),
    };
    params(limit, lease_ms, max_lease_ms)
}

/// The parameters from fields within their bounds; `max_lease_ms` left out is `lease_ms`.
pub(super) fn params(
    limit: u64,
    lease_ms: u64,
    max_lease_ms: Option<u64>,
) -> Result<Params, ValidationError> {
    let max_lease_ms = max_lease_ms.unwrap_or(lease_ms);
    if max_lease_ms < lease_ms {
        return Err(ValidationError::invalid(
            MAX_LEASE.name,
            format!("must be at least `lease_ms` ({lease_ms})"),
        ));
    }
    Ok(Params {
        limit,
        lease_us: lease_ms * 1_000,
        max_lease_us: max_lease_ms * 1_000,
    })
}

/// The fields' values as a document shows them, in document order (`max_lease_ms` always
/// shown, so that a client reads the bound it is held to).
pub fn values(params: &Params) -> [(&'static str, u64); 3] {
    [
        (LIMIT.name, params.limit),
        (LEASE_MS.name, params.lease_us / 1_000),
        (MAX_LEASE.name, params.max_lease_us / 1_000),
    ]
}

/// Validates a lease call's `lease_ms`: an integer within [`LEASE_MS`]'s bounds (the policy's
/// `max_lease_ms` is checked by the service, which knows the policy).
pub fn parse_lease_ms(value: &Number) -> Result<u64, ValidationError> {
    let (min, max) = (LEASE_MS.min, LEASE_MS.max);
    match whole(value) {
        Some(n) if n >= i128::from(min) && n <= i128::from(max) => Ok(n as u64),
        _ => Err(ValidationError::invalid(
            LEASE_MS.name,
            format!("must be an integer from {min} to {max}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn max_lease_ms_defaults_to_lease_ms_and_is_at_least_it() {
        let doc = |v: Value| v.as_object().cloned().expect("an object");
        let p = parse(&doc(json!({"limit": 2, "lease_ms": 1000}))).expect("valid");
        assert_eq!(p.max_lease_us, 1_000_000);
        let p = parse(&doc(
            json!({"limit": 2, "lease_ms": 1000, "max_lease_ms": 5000}),
        ))
        .expect("valid");
        assert_eq!(p.max_lease_us, 5_000_000);
        assert_eq!(values(&p)[2], ("max_lease_ms", 5000));
        for bad in [json!(999), json!(0), json!(86_400_001), json!(1.5)] {
            let e = parse(&doc(
                json!({"limit": 2, "lease_ms": 1000, "max_lease_ms": bad}),
            ))
            .expect_err("refused");
            assert_eq!(e.field(), Some("max_lease_ms"));
        }
    }

    #[test]
    fn lease_ms_is_a_whole_number_within_a_day() {
        let n = |v: Value| match v {
            Value::Number(n) => n,
            _ => unreachable!(),
        };
        assert_eq!(parse_lease_ms(&n(json!(1))), Ok(1));
        assert_eq!(parse_lease_ms(&n(json!(2000.0))), Ok(2000));
        assert_eq!(parse_lease_ms(&n(json!(86_400_000))), Ok(86_400_000));
        for bad in [
            json!(0),
            json!(-1),
            json!(1.5),
            json!(86_400_001),
            json!(1e30),
        ] {
            assert_eq!(
                parse_lease_ms(&n(bad)).expect_err("refused").field(),
                Some("lease_ms")
            );
        }
    }
}
