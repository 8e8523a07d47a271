//! The IETF `RateLimit-Policy`, `RateLimit` and `Retry-After` field values of a decision's answer
//! (httpapi draft-10/-11 syntax), written once for both edges: the HTTP API sets them as headers
//! ([`crate::api`], into the one buffer of its answer), the gRPC service as Envoy's
//! `response_headers_to_add` ([`crate::grpc`], into strings).
//!
//! Each limit is one list item, named `"<policy>"`, or `"<policy>/<limit>"` for each limit of a
//! policy of several (policy and limit names hold no `/`, so the two never meet); items are
//! comma-separated, in the order of the answers and of each policy's limits.

use crate::policy::{Limit, Rate};

use crate::service::{Acquired, DecidedBy};

/// Where field values are written; numbers in decimal, without passing through a `String`.
pub trait Sink {
    fn text(&mut self, text: &str);
    fn number(&mut self, n: u64);
}

impl Sink for String {
    fn text(&mut self, text: &str) {
        self.push_str(text);
    }

    fn number(&mut self, n: u64) {
        self.push_str(itoa::Buffer::new().format(n));
    }
}

/// `"<name>";q=<quota>;w=<window seconds>` for each limit of each answer's policy; a calendar
/// limit's `w` is the length of the period that holds the decision's time.
pub fn ratelimit_policy<'a>(out: &mut impl Sink, answers: impl IntoIterator<Item = &'a Acquired>) {
    let mut first = true;
    for a in answers {
        for l in limits(a) {
            separate(out, &mut first);
            item(out, a, l.name.as_str());
            out.text(";q=");
            out.number(l.params.quota());
            out.text(";w=");
            out.number(l.window_seconds_at(a.verdict.at_us));
        }
    }
}

/// `"<name>";r=<remaining>;t=<seconds until reset>` for each limit of each answer that counted
/// (a fail-open answer counted nothing, so it has no remaining quota to report). Whether any
/// answer counted: without one, the field is left out.
pub fn ratelimit<'a>(out: &mut impl Sink, answers: impl IntoIterator<Item = &'a Acquired>) -> bool {
    let mut counted = false;
    let mut first = true;
    for a in answers {
        if a.decided_by == DecidedBy::FailOpen {
            continue;
        }
        counted = true;
        for (l, d) in limits(a).iter().zip(a.verdict.limits()) {
            separate(out, &mut first);
            item(out, a, l.name.as_str());
            out.text(";r=");
            out.number(d.remaining);
            out.text(";t=");
            out.number(d.reset_after_us.div_ceil(1_000_000));
        }
    }
    counted
}

/// `Retry-After` for a wait of `retry_after_us`: whole seconds, rounded up, at least 1.
pub fn retry_after(out: &mut impl Sink, retry_after_us: u64) {
    out.number(retry_after_us.div_ceil(1_000_000).max(1));
}

fn separate(out: &mut impl Sink, first: &mut bool) {
    if !std::mem::take(first) {
        out.text(", ");
    }
}

/// The limits the answer's subject was decided with (an override's, or its policy's).
fn limits(a: &Acquired) -> &[Limit] {
    a.limits()
}

/// `id=<override id>;match=<kind>[;tier=<tier>]`, naming the override that applied to the
/// answer's subject (nothing when none did).
pub fn override_field(out: &mut impl Sink, a: &Acquired) {
    let Some(applied) = a.applied.as_deref() else {
        return;
    };
    out.text("id=");
    out.text(applied.id.as_str());
    out.text(";match=");
    out.text(applied.kind.as_str());
    if let Some(tier) = a.tier() {
        out.text(";tier=");
        out.text(tier);
    }
}

fn item(out: &mut impl Sink, a: &Acquired, limit: &str) {
    out.text("\"");
    out.text(a.policy.name.as_str());
    if a.policy.rate().is_some_and(Rate::is_composite) {
        out.text("/");
        out.text(limit);
    }
    out.text("\"");
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::limiter::{Decision, Op, Verdict};
    use crate::policy::input::parse_policy;
    use crate::store::Etag;

    fn answer(policy: serde_json::Value, decided_by: DecidedBy, left: &[(u64, u64)]) -> Acquired {
        let mut verdict = Verdict::at(0);
        for &(remaining, reset_after_us) in left {
            verdict.push(Decision {
                allowed: true,
                remaining,
                reset_after_us,
                retry_after_us: 0,
            });
        }
        Acquired {
            op: Op::Acquire,
            policy: Arc::new(parse_policy(&policy, None).expect("valid policy")),
            etag: Etag {
                generation: "g".into(),
                version: 1,
            },
            verdict,
            degraded: decided_by.is_degraded(),
            decided_by,
            shadow: false,
            ticket: None,
            delay_us: None,
            applied: None,
            given: None,
        }
    }

    fn one() -> serde_json::Value {
        json!({"name": "one", "algorithm": "fixed_window", "limit": 10, "window_ms": 60000})
    }

    fn two() -> serde_json::Value {
        json!({"name": "two", "limits": [
            {"name": "burst", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000},
            {"name": "daily", "algorithm": "fixed_window", "limit": 100, "window_ms": 86400000}
        ]})
    }

    #[test]
    fn items_name_the_policy_and_each_limit_of_several() {
        let a = answer(one(), DecidedBy::Embedded, &[(9, 59_000_001)]);
        let b = answer(two(), DecidedBy::Redis, &[(4, 1_000_000), (99, 1)]);
        let mut policy = String::new();
        ratelimit_policy(&mut policy, [&a, &b]);
        assert_eq!(
            policy,
            r#""one";q=10;w=60, "two/burst";q=5;w=1, "two/daily";q=100;w=86400"#
        );
        let mut left = String::new();
        assert!(ratelimit(&mut left, [&a, &b]));
        assert_eq!(
            left,
            r#""one";r=9;t=60, "two/burst";r=4;t=1, "two/daily";r=99;t=1"#
        );
    }

    #[test]
    fn a_fail_open_answer_has_no_remaining_quota() {
        let open = answer(one(), DecidedBy::FailOpen, &[(10, 0)]);
        let counted = answer(two(), DecidedBy::FailLocal, &[(4, 0), (99, 0)]);
        let mut left = String::new();
        assert!(!ratelimit(&mut left, [&open]));
        assert_eq!(left, "");
        assert!(ratelimit(&mut left, [&open, &counted]));
        assert_eq!(left, r#""two/burst";r=4;t=0, "two/daily";r=99;t=0"#);
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up_and_at_least_one() {
        for (us, text) in [(0, "1"), (1, "1"), (1_000_000, "1"), (1_000_001, "2")] {
            let mut out = String::new();
            retry_after(&mut out, us);
            assert_eq!(out, text, "{us} µs");
        }
    }
}
