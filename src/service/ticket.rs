//! Tickets: what an allowed acquire or a report took, so that a refund can give the units back
//! where they were taken from, and nowhere else.
//!
//! A ticket names the subject it was issued for (a digest of policy and key, so that a ticket
//! sent with another subject is refused rather than applied), the units taken, and one mark per
//! limit: the time the take stops counting ([`Verdict::marks`]), from which each algorithm tells
//! whether its window, log entry or unrefilled units are still there ([`crate::limiter::Rule::refund`]).
//! It is opaque to clients: `1.<units>.<digest>.<mark>[.<mark>…]`, all in plain digits and hex.
//! Nothing in it is secret or signed: a refund without a ticket is allowed anyway, and every
//! refund is bounded by what the subject has in use.

use std::fmt;

use crate::limiter::{Verdict, MAX_LIMITS};
use crate::policy::{LimitKey, Policy};

/// The version of the format, its first field.
const VERSION: &str = "1";

/// Longest ticket accepted, in bytes: the longest one issued is under 200.
pub const MAX_TICKET_BYTES: usize = 256;

/// A parsed or issued ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    /// The units taken.
    pub units: u64,
    digest: u32,
    marks: [u64; MAX_LIMITS],
    len: usize,
}

/// FNV-1a over the policy's name and the key, which cannot contain the separator.
fn digest(policy: &Policy, key: &LimitKey) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    let bytes = policy
        .name
        .as_str()
        .bytes()
        .chain([0])
        .chain(key.as_str().bytes());
    for b in bytes {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

impl Ticket {
    /// The ticket of `units` taken from `policy`'s subject `key` by `verdict`.
    pub fn issue(policy: &Policy, key: &LimitKey, units: u64, verdict: &Verdict) -> Self {
        let mut marks = [0; MAX_LIMITS];
        let mut len = 0;
        for (slot, mark) in marks.iter_mut().zip(verdict.marks()) {
            *slot = mark;
            len += 1;
        }
        Self {
            units,
            digest: digest(policy, key),
            marks,
            len,
        }
    }

    /// A ticket as [`Ticket`]'s `Display` wrote it, or why it is not one.
    pub fn parse(s: &str) -> Result<Self, &'static str> {
        const MALFORMED: &str = "is not a ticket this service issued";
        if s.len() > MAX_TICKET_BYTES {
            return Err(MALFORMED);
        }
        let mut fields = s.split('.');
        if fields.next() != Some(VERSION) {
            return Err(MALFORMED);
        }
        let units = fields
            .next()
            .and_then(|u| u.parse::<u64>().ok())
            .filter(|u| *u > 0)
            .ok_or(MALFORMED)?;
        let digest = fields
            .next()
            .filter(|d| d.len() == 8)
            .and_then(|d| u32::from_str_radix(d, 16).ok())
            .ok_or(MALFORMED)?;
        let mut marks = [0; MAX_LIMITS];
        let mut len = 0;
        for field in fields {
            let mark = field.parse::<u64>().map_err(|_| MALFORMED)?;
            *marks.get_mut(len).ok_or(MALFORMED)? = mark;
            len += 1;
        }
        if len == 0 {
            return Err(MALFORMED);
        }
        Ok(Self {
            units,
            digest,
            marks,
            len,
        })
    }

    /// Whether the ticket was issued for this policy's subject `key`.
    pub fn is_for(&self, policy: &Policy, key: &LimitKey) -> bool {
        self.digest == digest(policy, key)
    }

    /// The marks a refund applies it with: one per limit of `policy`, or, when the policy's
    /// limits have changed in number since the ticket was issued, marks that no take holds, so
    /// that the refund gives nothing back (a changed policy ends every ticket).
    pub fn marks_for(&self, policy: &Policy) -> ([u64; MAX_LIMITS], usize) {
        let n = policy.limits.len().min(MAX_LIMITS);
        if self.len == n {
            (self.marks, n)
        } else {
            ([0; MAX_LIMITS], n)
        }
    }
}

impl fmt::Display for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{VERSION}.{}.{:08x}", self.units, self.digest)?;
        for mark in &self.marks[..self.len] {
            write!(f, ".{mark}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Decision, Verdict};
    use crate::policy::{Algorithm, FailMode, PolicyName};

    fn policy(name: &str) -> Policy {
        let name = PolicyName::parse(name).expect("valid");
        Policy::single(
            name,
            Algorithm::FixedWindow,
            &[5, 1_000],
            None,
            FailMode::Open,
        )
    }

    fn key(k: &str) -> LimitKey {
        LimitKey::parse(k.into()).expect("valid")
    }

    fn verdict() -> Verdict {
        let mut v = Verdict::at(1_000_000);
        v.push(Decision {
            allowed: true,
            remaining: 3,
            reset_after_us: 250,
            retry_after_us: 0,
        });
        v
    }

    #[test]
    fn a_ticket_reads_back_as_issued_and_names_its_subject() {
        let p = policy("p");
        let t = Ticket::issue(&p, &key("k"), 2, &verdict());
        let text = t.to_string();
        assert!(
            text.starts_with("1.2.") && text.ends_with(".1000250"),
            "{text}"
        );
        let back = Ticket::parse(&text).expect("parses");
        assert_eq!(back, t);
        assert!(back.is_for(&p, &key("k")));
        assert!(!back.is_for(&p, &key("k2")));
        assert!(!back.is_for(&policy("q"), &key("k")));
        assert_eq!(back.marks_for(&p), (t.marks, 1));
    }

    #[test]
    fn a_policy_with_another_number_of_limits_gets_marks_no_take_holds() {
        let p = policy("p");
        let t = Ticket::parse("1.2.00000000.5.6").expect("parses");
        assert_eq!(t.marks_for(&p), ([0; MAX_LIMITS], 1));
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "",
            "1",
            "2.1.00000000.5",
            "1.0.00000000.5",
            "1.1.0000000.5",
            "1.1.0000000g.5",
            "1.1.00000000",
            "1.1.00000000.x",
            "1.1.00000000.1.2.3.4.5.6.7.8.9",
            "1.-1.00000000.5",
        ] {
            assert!(Ticket::parse(bad).is_err(), "{bad:?}");
        }
        assert!(Ticket::parse(&"1".repeat(MAX_TICKET_BYTES + 1)).is_err());
    }
}
