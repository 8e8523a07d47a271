//! Lease ids: what a client holds for a lease, and all the service needs to find it again.
//!
//! `l1~<policy>~<key, base64url without padding>~<32 lowercase hex digits>~<cost>`: the policy
//! and the subject say where the lease's state is (on a Redis Cluster, which slot), the random
//! part names the lease among its subject's, and the cost is the units it holds. Within its
//! subject, the store knows the lease by its member string, `<32 hex digits>:<cost>`.
//!
//! Nothing in it is signed: it cannot be forged into another subject's lease because the random
//! part is 128 bits from the operating system's CSPRNG (`getrandom`), never shown to anyone but
//! the holder, so an id altered anywhere names another policy, another subject or another
//! member, none of which holds a lease of that name. Every part has exactly one spelling
//! (canonical base64, lowercase hex, a cost without leading zeros), so an altered id never reads
//! as the same lease either: it is an unknown lease, or not a lease id at all. `~` is in neither
//! alphabet, nor in policy names, and is unreserved in URLs, so the id goes into a path as it is.

use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

use crate::limiter::concurrency::MAX_LIMIT;
use crate::policy::{LimitKey, PolicyName};

/// The version of the format, its first field.
const VERSION: &str = "l1";
/// Separates the fields.
const SEP: char = '~';
/// Bytes of the random part.
const RANDOM_BYTES: usize = 16;

/// Longest lease id, in bytes: `l1~` + 64 (policy) + `~` + 342 (256 bytes of key in base64) +
/// `~` + 32 + `~` + 5 (cost), rounded up.
pub const MAX_LEASE_ID_BYTES: usize = 512;

/// What a lease id says, as the OpenAPI schema states it.
pub const LEASE_ID_PATTERN: &str =
    "^l1~[A-Za-z0-9][A-Za-z0-9_.-]{0,63}~[A-Za-z0-9_-]{2,342}~[0-9a-f]{32}~[1-9][0-9]{0,4}$";

/// A lease id, issued or parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseId {
    policy: PolicyName,
    key: LimitKey,
    /// `<32 hex digits>:<cost>`.
    member: String,
    cost: u64,
}

/// The operating system could not give random bytes for a lease id.
#[derive(Debug, thiserror::Error)]
#[error("no random bytes for a lease id: {0}")]
pub struct NoRandomness(getrandom::Error);

impl LeaseId {
    /// A new lease id of `cost` units for the subject `key` of `policy`, with a fresh random
    /// part.
    pub fn issue(policy: &PolicyName, key: &LimitKey, cost: u64) -> Result<Self, NoRandomness> {
        let mut random = [0u8; RANDOM_BYTES];
        getrandom::fill(&mut random).map_err(NoRandomness)?;
        let mut member = String::with_capacity(2 * RANDOM_BYTES + 6);
        for b in random {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            member.push(HEX[usize::from(b >> 4)] as char);
            member.push(HEX[usize::from(b & 0xF)] as char);
        }
        member.push(':');
        member.push_str(itoa::Buffer::new().format(cost));
        Ok(Self {
            policy: policy.clone(),
            key: key.clone(),
            member,
            cost,
        })
    }

    /// A lease id as [`LeaseId`]'s `Display` wrote it, or why it is not one.
    pub fn parse(s: &str) -> Result<Self, &'static str> {
        const MALFORMED: &str = "is not a lease id this service issued";
        if s.len() > MAX_LEASE_ID_BYTES {
            return Err(MALFORMED);
        }
        let mut fields = s.split(SEP);
        let (Some(VERSION), Some(policy), Some(key), Some(random), Some(cost), None) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            return Err(MALFORMED);
        };
        let policy = PolicyName::parse(policy).map_err(|_| MALFORMED)?;
        // The engine refuses padding and non-zero trailing bits: one spelling per key.
        let key = URL_SAFE_NO_PAD
            .decode(key)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .and_then(|k| LimitKey::parse(k).ok())
            .ok_or(MALFORMED)?;
        if random.len() != 2 * RANDOM_BYTES
            || !random
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(MALFORMED);
        }
        if cost.starts_with('0') || !cost.bytes().all(|b| b.is_ascii_digit()) {
            return Err(MALFORMED);
        }
        let cost = cost
            .parse::<u64>()
            .ok()
            .filter(|c| (1..=MAX_LIMIT).contains(c))
            .ok_or(MALFORMED)?;
        let mut member = String::with_capacity(random.len() + 6);
        member.push_str(random);
        member.push(':');
        member.push_str(itoa::Buffer::new().format(cost));
        Ok(Self {
            policy,
            key,
            member,
            cost,
        })
    }

    pub fn policy(&self) -> &PolicyName {
        &self.policy
    }

    pub fn key(&self) -> &LimitKey {
        &self.key
    }

    /// The lease's name among its subject's leases in the store: `<32 hex digits>:<cost>`.
    pub fn member(&self) -> &str {
        &self.member
    }

    /// Units the lease holds.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    fn random(&self) -> &str {
        self.member
            .split_once(':')
            .map_or(self.member.as_str(), |(r, _)| r)
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{VERSION}{SEP}{}{SEP}{}{SEP}{}{SEP}{}",
            self.policy,
            URL_SAFE_NO_PAD.encode(self.key.as_str()),
            self.random(),
            self.cost
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(policy: &str, key: &str, cost: u64) -> LeaseId {
        LeaseId::issue(
            &PolicyName::parse(policy).expect("valid"),
            &LimitKey::parse(key.into()).expect("valid"),
            cost,
        )
        .expect("random bytes")
    }

    fn pattern_matches(s: &str) -> bool {
        // The pattern's parts, checked by hand (no regex crate here).
        let parts: Vec<&str> = s.split('~').collect();
        parts.len() == 5
            && parts[0] == "l1"
            && PolicyName::check(parts[1]).is_ok()
            && (2..=342).contains(&parts[2].len())
            && parts[2]
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && parts[3].len() == 32
            && (1..=5).contains(&parts[4].len())
            && !parts[4].starts_with('0')
    }

    #[test]
    fn an_issued_id_reads_back_as_issued() {
        let a = id("exports", "customer:7 {é}", 3);
        let text = a.to_string();
        assert!(text.starts_with("l1~exports~"), "{text}");
        assert!(text.ends_with("~3"), "{text}");
        assert!(pattern_matches(&text), "{text}");
        let back = LeaseId::parse(&text).expect("parses");
        assert_eq!(back, a);
        assert_eq!(back.key().as_str(), "customer:7 {é}");
        assert_eq!(back.cost(), 3);
        let (random, cost) = back.member().split_once(':').expect("member");
        assert_eq!((random.len(), cost), (32, "3"));
        assert!(random
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    }

    #[test]
    fn ids_are_drawn_afresh_and_the_longest_fits_the_bound() {
        let a = id("p", "k", 1);
        let b = id("p", "k", 1);
        assert_ne!(a.member(), b.member());
        let long = id(&"p".repeat(64), &"\u{7f}".repeat(256), MAX_LIMIT).to_string();
        assert!(long.len() <= MAX_LEASE_ID_BYTES, "{}", long.len());
        assert!(pattern_matches(&long), "{long}");
        assert_eq!(LeaseId::parse(&long).expect("parses").cost(), MAX_LIMIT);
    }

    #[test]
    fn an_id_altered_anywhere_is_another_lease_or_none() {
        let a = id("exports", "customer-7", 2);
        let text = a.to_string();
        for i in 0..text.len() {
            for replacement in ['0', 'a', 'A', '~', '-', '_', '9', 'f', 'g'] {
                let mut altered = text.clone();
                altered.replace_range(i..=i, &replacement.to_string());
                if altered == text {
                    continue;
                }
                if let Ok(other) = LeaseId::parse(&altered) {
                    assert!(
                        other.policy() != a.policy()
                            || other.key() != a.key()
                            || other.member() != a.member(),
                        "{altered} reads as {text}"
                    );
                }
            }
        }
    }

    #[test]
    fn anything_else_is_refused() {
        let good = id("p", "k", 1).to_string();
        let random = good.split('~').nth(3).expect("a random part");
        for bad in [
            String::new(),
            "l1".into(),
            format!("l2~p~aw~{random}~1"),
            format!("l1~-p~aw~{random}~1"),
            format!("l1~p~~{random}~1"),
            format!("l1~p~aw=~{random}~1"),
            format!("l1~p~a~{random}~1"),
            format!("l1~p~ax~{random}~1"),
            format!("l1~p~aw~{}~1", random.to_uppercase()),
            format!("l1~p~aw~{}~1", &random[1..]),
            format!("l1~p~aw~{random}~0"),
            format!("l1~p~aw~{random}~01"),
            format!("l1~p~aw~{random}~+1"),
            format!("l1~p~aw~{random}~10001"),
            format!("l1~p~aw~{random}~1~"),
            format!("l1~p~_w~{random}~1"),
            "x".repeat(MAX_LEASE_ID_BYTES + 1),
        ] {
            assert!(LeaseId::parse(&bad).is_err(), "{bad:?}");
        }
        assert!(LeaseId::parse(&format!("l1~p~aw~{random}~1")).is_ok());
    }
}
