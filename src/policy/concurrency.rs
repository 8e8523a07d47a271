//! The concurrency kind of policy, as documents name it: `{"algorithm": "concurrency", "limit",
//! "lease_ms"}` in the flat form, and nowhere else.
//!
//! A concurrency limit is not one of the rate algorithms of [`crate::limiter::Algorithm`] (whose
//! rules acquire, peek, report and refund units): it is held by leases
//! ([`crate::limiter::concurrency`]). Its fields are described here with the same [`Field`] the
//! rate algorithms use, so that validation, its messages and the OpenAPI schema read one set of
//! bounds.

use serde_json::{Map, Value};

use super::input::{required_int, ValidationError};
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

/// The fields, in document order.
pub const FIELDS: [Field; 2] = [LIMIT, LEASE_MS];

/// Whether `key` is a field of concurrency policies.
pub fn is_field(key: &str) -> bool {
    FIELDS.iter().any(|f| f.name == key)
}

/// The parameters from a flat document whose `algorithm` is [`NAME`]; stray fields have been
/// refused by the caller.
pub(super) fn parse(doc: &Map<String, Value>) -> Result<Params, ValidationError> {
    let limit = required_int(doc, &LIMIT, NAME)?;
    let lease_ms = required_int(doc, &LEASE_MS, NAME)?;
    Ok(Params {
        limit,
        lease_us: lease_ms * 1_000,
    })
}

/// The fields' values as a document shows them, in [`FIELDS`] order.
pub fn values(params: &Params) -> [(&'static str, u64); 2] {
    [
        (LIMIT.name, params.limit),
        (LEASE_MS.name, params.lease_us / 1_000),
    ]
}
