//! The IETF `RateLimit-Policy`, `RateLimit` and `Retry-After` field values of a decision's answer
//! (httpapi draft-10/-11 syntax), written once for both edges: the HTTP API sets them as headers
//! ([`crate::api`], into the one buffer of its answer), the gRPC service as Envoy's
//! `response_headers_to_add` ([`crate::grpc`], into strings).
//!
//! Each limit is one list item, named `"<policy>"`, or `"<policy>/<limit>"` for each limit of a
//! policy of several (policy and limit names hold no `/`, so the two never meet); items are
//! comma-separated, in the order of the answers and of each policy's limits.

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

/// `"<name>";q=<quota>;w=<window seconds>` for each limit of each answer's policy.
pub fn ratelimit_policy<'a>(out: &mut impl Sink, answers: impl IntoIterator<Item = &'a Acquired>) {
    let mut first = true;
    for a in answers {
        for l in &a.policy.limits {
            separate(out, &mut first);
            item(out, a, l.name.as_str());
            out.text(";q=");
            out.number(l.params.quota());
            out.text(";w=");
            out.number(l.window_seconds());
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
        for (l, d) in a.policy.limits.iter().zip(a.verdict.limits()) {
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

fn item(out: &mut impl Sink, a: &Acquired, limit: &str) {
    out.text("\"");
    out.text(a.policy.name.as_str());
    if a.policy.is_composite() {
        out.text("/");
        out.text(limit);
    }
    out.text("\"");
}
