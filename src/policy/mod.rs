//! The policy model: what a policy is and how it is validated.
//!
//! A [`Policy`] only exists validated: [`input::parse_policy`] turns client JSON into one or
//! names the field that is wrong, and every later layer trusts it. The HTTP shape of a policy
//! (`PolicyDoc`) lives here too, so that the OpenAPI schema and the validation describe the same
//! fields.

pub mod input;
mod name;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::limiter::{
    fixed_window, gcra, sliding_window_counter, sliding_window_log, token_bucket,
};
pub use crate::limiter::{Algorithm, Params};

pub use input::{parse_policy, ValidationError};
pub use name::{LimitKey, PolicyName};

/// Largest `limit`, `capacity` and `refill_tokens`.
pub const MAX_UNITS: u64 = 1_000_000_000;
/// Longest `window_ms` and `refill_period_ms`: 31 days.
pub const MAX_PERIOD_MS: u64 = 31 * 24 * 3_600 * 1_000;
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

/// An algorithm with its validated parameters, as the user gave them (milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    FixedWindow {
        limit: u64,
        window_ms: u64,
    },
    SlidingWindowLog {
        limit: u64,
        window_ms: u64,
    },
    SlidingWindowCounter {
        limit: u64,
        window_ms: u64,
    },
    TokenBucket {
        capacity: u64,
        refill_tokens: u64,
        refill_period_ms: u64,
    },
    Gcra {
        rate: u64,
        period_ms: u64,
        burst: u64,
    },
}

impl Limit {
    pub const fn algorithm(&self) -> Algorithm {
        match self {
            Limit::FixedWindow { .. } => Algorithm::FixedWindow,
            Limit::SlidingWindowLog { .. } => Algorithm::SlidingWindowLog,
            Limit::SlidingWindowCounter { .. } => Algorithm::SlidingWindowCounter,
            Limit::TokenBucket { .. } => Algorithm::TokenBucket,
            Limit::Gcra { .. } => Algorithm::Gcra,
        }
    }

    /// The name of the field that holds the quota ([`Params::quota`]).
    pub const fn quota_field(&self) -> &'static str {
        match self {
            Limit::TokenBucket { .. } => "capacity",
            Limit::Gcra { .. } => "burst",
            _ => "limit",
        }
    }

    /// The policy's time window in whole seconds, rounded up, for `RateLimit-Policy`'s `w`:
    /// the window, or for a token bucket the time to refill it from empty.
    pub fn window_seconds(&self) -> u64 {
        match *self {
            Limit::FixedWindow { window_ms, .. }
            | Limit::SlidingWindowLog { window_ms, .. }
            | Limit::SlidingWindowCounter { window_ms, .. } => window_ms.div_ceil(1_000),
            Limit::TokenBucket {
                capacity,
                refill_tokens,
                refill_period_ms,
            } => {
                let ms = u128::from(capacity) * u128::from(refill_period_ms);
                let ms = ms.div_ceil(u128::from(refill_tokens));
                u64::try_from(ms.div_ceil(1_000)).unwrap_or(u64::MAX)
            }
            Limit::Gcra {
                rate,
                period_ms,
                burst,
            } => {
                let ms = u128::from(burst) * u128::from(period_ms);
                let ms = ms.div_ceil(u128::from(rate));
                u64::try_from(ms.div_ceil(1_000)).unwrap_or(u64::MAX)
            }
        }
    }

    /// The parameters of the decision function.
    pub fn params(&self) -> Params {
        match *self {
            Limit::FixedWindow { limit, window_ms } => Params::FixedWindow(fixed_window::Params {
                limit,
                window_us: window_ms * 1_000,
            }),
            Limit::SlidingWindowLog { limit, window_ms } => {
                Params::SlidingWindowLog(sliding_window_log::Params {
                    limit,
                    window_us: window_ms * 1_000,
                })
            }
            Limit::SlidingWindowCounter { limit, window_ms } => {
                Params::SlidingWindowCounter(sliding_window_counter::Params {
                    limit,
                    window_us: window_ms * 1_000,
                })
            }
            Limit::TokenBucket {
                capacity,
                refill_tokens,
                refill_period_ms,
            } => Params::TokenBucket(token_bucket::Params::new(
                capacity,
                refill_tokens,
                refill_period_ms * 1_000,
            )),
            Limit::Gcra {
                rate,
                period_ms,
                burst,
            } => Params::Gcra(gcra::Params::new(rate, period_ms, burst)),
        }
    }
}

/// A validated policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub name: PolicyName,
    pub limit: Limit,
    pub description: Option<String>,
    pub fail_mode: FailMode,
    /// Derived from `limit` once, so that no acquire recomputes it.
    pub params: Params,
}

impl Policy {
    pub fn new(
        name: PolicyName,
        limit: Limit,
        description: Option<String>,
        fail_mode: FailMode,
    ) -> Self {
        Self {
            name,
            params: limit.params(),
            limit,
            description,
            fail_mode,
        }
    }

    pub fn algorithm(&self) -> Algorithm {
        self.limit.algorithm()
    }

    /// The policy as the API shows it.
    pub fn to_doc(&self) -> PolicyDoc {
        let mut doc = PolicyDoc {
            name: self.name.to_string(),
            algorithm: self.algorithm(),
            limit: None,
            window_ms: None,
            capacity: None,
            refill_tokens: None,
            refill_period_ms: None,
            rate: None,
            period_ms: None,
            burst: None,
            description: self.description.clone(),
            fail_mode: self.fail_mode,
        };
        match self.limit {
            Limit::FixedWindow { limit, window_ms }
            | Limit::SlidingWindowLog { limit, window_ms }
            | Limit::SlidingWindowCounter { limit, window_ms } => {
                doc.limit = Some(limit);
                doc.window_ms = Some(window_ms);
            }
            Limit::TokenBucket {
                capacity,
                refill_tokens,
                refill_period_ms,
            } => {
                doc.capacity = Some(capacity);
                doc.refill_tokens = Some(refill_tokens);
                doc.refill_period_ms = Some(refill_period_ms);
            }
            Limit::Gcra {
                rate,
                period_ms,
                burst,
            } => {
                doc.rate = Some(rate);
                doc.period_ms = Some(period_ms);
                doc.burst = Some(burst);
            }
        }
        doc
    }
}

/// A rate-limit policy. Window algorithms (`fixed_window`, `sliding_window_log`,
/// `sliding_window_counter`) take `limit` and `window_ms`; `token_bucket` takes `capacity`,
/// `refill_tokens` and `refill_period_ms`; `gcra` takes `rate`, `period_ms` and `burst`. Fields
/// of the other algorithms are rejected.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[schema(example = json!({
    "name": "api-per-user",
    "algorithm": "token_bucket",
    "capacity": 20,
    "refill_tokens": 10,
    "refill_period_ms": 1000,
    "description": "10 requests per second per user, bursts of 20",
    "fail_mode": "open"
}))]
pub struct PolicyDoc {
    /// Unique name: `^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`.
    #[schema(
        pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        example = "api-per-user"
    )]
    pub name: String,
    /// The algorithm, which decides the other fields.
    #[schema(example = "token_bucket")]
    pub algorithm: Algorithm,
    /// Window algorithms: units allowed per window (1 to 1,000,000,000; at most 10,000 for
    /// `sliding_window_log`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1_000_000_000, example = 100)]
    pub limit: Option<u64>,
    /// Window algorithms: window length in milliseconds (1 to 2,678,400,000, that is 31 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 2_678_400_000_u64, example = 60000)]
    pub window_ms: Option<u64>,
    /// `token_bucket`: tokens the bucket holds; it starts full (1 to 1,000,000,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1_000_000_000, example = 20)]
    pub capacity: Option<u64>,
    /// `token_bucket`: tokens added per `refill_period_ms`, continuously (1 to 1,000,000,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1_000_000_000, example = 10)]
    pub refill_tokens: Option<u64>,
    /// `token_bucket`: the period in milliseconds over which `refill_tokens` are added
    /// (1 to 2,678,400,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 2_678_400_000_u64, example = 1000)]
    pub refill_period_ms: Option<u64>,
    /// `gcra`: units per `period_ms`, sustained (1 to 1,000,000,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1_000_000_000, example = 10)]
    pub rate: Option<u64>,
    /// `gcra`: the period in milliseconds over which `rate` units are allowed (1 to
    /// 2,678,400,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 2_678_400_000_u64, example = 1000)]
    pub period_ms: Option<u64>,
    /// `gcra`: the most units at once, the capacity (1 to 1,000,000,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1_000_000_000, example = 20)]
    pub burst: Option<u64>,
    /// Free text for operators, at most 1,024 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        max_length = 1024,
        example = "10 requests per second per user, bursts of 20"
    )]
    pub description: Option<String>,
    /// What to answer when the store cannot be reached: `open` (default) allows and marks the
    /// answer degraded, `closed` answers 503, `local` decides in this instance (limits per
    /// instance, answers marked degraded).
    #[serde(default)]
    #[schema(example = "open")]
    pub fail_mode: FailMode,
}
