//! Redis key names, shared by both stores so that they address state identically.
//!
//! State: `<prefix>:{<policy>:<escaped key>}:<algorithm>` for a policy's limit named after the
//! policy (the one limit of a flat policy), `<prefix>:{<policy>:<escaped key>}:<limit>:<algorithm>`
//! for any other limit. The braces are a Redis Cluster hash tag, so all of one subject's keys,
//! every limit's, live on one slot and one script can decide them together. The caller's key is escaped so that no
//! byte of it can end the tag early or imitate another policy's or key's name: `%`, `{`, `}`,
//! `:` and ASCII control bytes become `%XX`, which makes the mapping injective (policy names
//! hold none of those bytes). The limit's name (which cannot hold `:`) and the algorithm are
//! part of the name, so a limit keeps its state across a change to the policy only while its
//! name and algorithm stay the same, and one script is never handed another's state.
//!
//! Leases under a concurrency policy live on the policy's own hash tag,
//! `{<policy>@<incarnation>}`, so that one script can keep a subject's leases and the policy's
//! ledger of every lease together (the ledger is what the gauge of leases in use and the count of
//! expiries are read from; see `lua/concurrency.lua`): `<prefix>:{<policy>@<incarnation>}:lease:<escaped key>`
//! for a subject ([`lease_key`]), `<prefix>:{<policy>@<incarnation>}:leases` for the ledger
//! ([`lease_ledger`]). No state key's tag holds `@` (policy names cannot), so the two never
//! meet. The incarnation (see `Policy::incarnation`) changes when the policy is deleted and
//! created again, which makes the old leases unknown. On a Cluster, a concurrency policy's leases
//! are all on one slot: lease calls are per unit of work, not per request, so one node serves
//! them, and different policies spread over the nodes.
//!
//! A ticket's record of the units refunded with it, `<prefix>:{<policy>:<escaped key>}:ticket:<16
//! hex>` ([`ticket_record`]), is on its subject's hash tag, so that the refund script keeps it
//! with the subject's state; the ring of keys that sign tickets is `<prefix>:ticket-keys`
//! ([`ticket_keys`]).
//!
//! The lease index, `<prefix>:{leased}:ledgers` ([`lease_index`]), is a sorted set of the
//! concurrency policies whose ledgers may hold leases, `<policy>@<incarnation>`
//! ([`lease_index_member`]), each scored by a time on Redis's clock (µs) after which its ledger
//! holds none: the lease sweep reads it instead of visiting every concurrency policy. It is one
//! key on one slot (a Cluster's lease scripts cannot write a key of another slot, so the store
//! writes it with a call of its own before a take or renewal). Its tag holds neither `:` nor
//! `@`, so no state or lease key shares it.
//!
//! The top offenders' summaries of a policy, one minute each (see `store::top`), are
//! `<prefix>:{top/<policy>}:<minute>:d`, `:a` and `:n` (sorted sets of the denied, allowed and
//! near-limit counts by subject) and `:m` (a hash of each one's total and error bound), on one
//! hash tag per policy so that one script folds an instance's summaries into them ([`top_keys`]).
//! The tag holds `/`, which neither a policy name nor a key of a state tag (`<policy>:`…) can
//! start with, so it meets no other tag.
//!
//! The start-up check of the Redis user's permissions writes `<prefix>:{probe}:<kind>` for a
//! moment ([`acl_probe`]).
//!
//! Policies: `<prefix>:{policies}:policy:<name>` hashes and the keys that track changes to them
//! (`meta`, `names`, `deleted`, `seeded`; see [`PolicyKeys`]) share one hash tag, so one script
//! can change them together, on a cluster too.

use std::fmt::Write as _;

use crate::limiter::MAX_LIMITS;
use crate::policy::{Algorithm, LimitKey, Policy};

/// Writes the state key of one subject's limit to `buf` (cleared first), reusing its
/// allocation. `limit` is `None` for a limit named after its policy.
pub fn state_key(
    buf: &mut String,
    prefix: &str,
    policy: &str,
    key: &str,
    limit: Option<&str>,
    algorithm: Algorithm,
) {
    let alg = algorithm.as_str();
    let limit_len = limit.map_or(0, |l| l.len() + 1);
    subject(buf, prefix, policy, key, limit_len + alg.len());
    if let Some(limit) = limit {
        buf.push_str(limit);
        buf.push(':');
    }
    buf.push_str(alg);
}

/// Writes the key of a ticket's record of the units refunded with it to `buf` (cleared first):
/// `<prefix>:{<policy>:<escaped key>}:ticket:<16 hex>`, on its subject's hash tag so that the
/// refund script can read and write it with the subject's state on a Cluster. (No state key
/// ends so: an algorithm's name ends each.)
pub fn ticket_record(buf: &mut String, prefix: &str, policy: &str, key: &str, id: u64) {
    subject(buf, prefix, policy, key, 23);
    let _ = write!(buf, "ticket:{id:016x}");
}

/// Writes the key of a subject's queue of reservations (issue 29: the latest time anything is
/// booked for, read by `lua/reserve.lua`) to `buf` (cleared first): `<prefix>:{<policy>:<escaped
/// key>}:queue`, on its subject's hash tag with its limits' states. (No state key ends so.)
pub fn queue_key(buf: &mut String, prefix: &str, policy: &str, key: &str) {
    subject(buf, prefix, policy, key, 5);
    buf.push_str("queue");
}

/// The key of the ring of keys that sign tickets, shared by every instance:
/// `<prefix>:ticket-keys` (see `service::ticket::Keyring`).
pub fn ticket_keys(prefix: &str) -> String {
    format!("{prefix}:ticket-keys")
}

/// One of the keys the start-up check of the Redis user's permissions writes for a moment
/// (`store::redis::acl`): `<prefix>:{probe}:<kind>`. Its tag holds no `:`, `@` or `/` and is not
/// `policies` or `leased`, so it meets no other tag.
pub fn acl_probe(prefix: &str, kind: &str) -> String {
    format!("{prefix}:{{probe}}:{kind}")
}

/// Writes the key of one subject's leases under a concurrency policy to `buf` (cleared first):
/// `<prefix>:{<policy>@<incarnation>}:lease:<escaped key>`, on the policy's hash tag.
pub fn lease_key(buf: &mut String, prefix: &str, policy: &str, incarnation: u64, key: &str) {
    lease_tag(buf, prefix, policy, incarnation, key.len() + 6);
    buf.push_str("lease:");
    push_escaped(buf, key);
}

/// Writes the key of a concurrency policy's ledger to `buf` (cleared first):
/// `<prefix>:{<policy>@<incarnation>}:leases`.
pub fn lease_ledger(buf: &mut String, prefix: &str, policy: &str, incarnation: u64) {
    lease_tag(buf, prefix, policy, incarnation, 6);
    buf.push_str("leases");
}

/// The lease index: `<prefix>:{leased}:ledgers` (see the module doc).
pub fn lease_index(prefix: &str) -> String {
    format!("{prefix}:{{leased}}:ledgers")
}

/// A concurrency policy's member in the lease index: `<policy>@<incarnation>`.
pub fn lease_index_member(policy: &str, incarnation: u64) -> String {
    format!("{policy}@{incarnation}")
}

/// The policy and incarnation of a lease index member, if it is one.
pub fn parse_lease_index_member(member: &str) -> Option<(&str, u64)> {
    let (policy, incarnation) = member.rsplit_once('@')?;
    Some((policy, incarnation.parse().ok()?))
}

/// The keys of one minute of a policy's top-offender summaries: the sorted sets of the denied,
/// allowed and near-limit counts, then the hash of their totals and bounds (see the module doc).
pub fn top_keys(prefix: &str, policy: &str, minute: u64) -> [String; 4] {
    ["d", "a", "n", "m"].map(|part| format!("{prefix}:{{top/{policy}}}:{minute}:{part}"))
}

/// Writes `<prefix>:{<policy>@<incarnation>}:` to `buf` (cleared first), with room for `tail`
/// more bytes.
fn lease_tag(buf: &mut String, prefix: &str, policy: &str, incarnation: u64, tail: usize) {
    use std::fmt::Write;
    buf.clear();
    buf.reserve(prefix.len() + policy.len() + tail + 26);
    buf.push_str(prefix);
    buf.push_str(":{");
    buf.push_str(policy);
    // Writing to a String cannot fail.
    let _ = write!(buf, "@{incarnation}}}:");
}

/// Writes `<prefix>:{<policy>:<escaped key>}:` to `buf` (cleared first), with room for `tail`
/// more bytes.
fn subject(buf: &mut String, prefix: &str, policy: &str, key: &str, tail: usize) {
    buf.clear();
    buf.reserve(prefix.len() + policy.len() + key.len() + tail + 5);
    buf.push_str(prefix);
    buf.push_str(":{");
    buf.push_str(policy);
    buf.push(':');
    push_escaped(buf, key);
    buf.push_str("}:");
}

/// The state keys of every limit of `policy` for the subject `key`, in policy order: the first
/// `n` of the array, with `n` the number of limits (at most [`MAX_LIMITS`]).
pub fn state_keys(prefix: &str, policy: &Policy, key: &LimitKey) -> ([String; MAX_LIMITS], usize) {
    let mut names: [String; MAX_LIMITS] = Default::default();
    let params = policy.params();
    for (i, (name, p)) in names.iter_mut().zip(params).enumerate() {
        state_key(
            name,
            prefix,
            policy.name.as_str(),
            key.as_str(),
            policy.state_name(i),
            p.algorithm(),
        );
    }
    (names, params.len().min(MAX_LIMITS))
}

/// Appends `key` to `buf` with `%`, `{`, `}`, `:` and ASCII control bytes as `%XX`.
fn push_escaped(buf: &mut String, key: &str) {
    if key.bytes().any(needs_escape) {
        for c in key.chars() {
            if c.is_ascii() && needs_escape(c as u8) {
                const HEX: &[u8; 16] = b"0123456789ABCDEF";
                let b = c as u8;
                buf.push('%');
                buf.push(HEX[usize::from(b >> 4)] as char);
                buf.push(HEX[usize::from(b & 0xF)] as char);
            } else {
                buf.push(c);
            }
        }
    } else {
        buf.push_str(key);
    }
}

fn needs_escape(b: u8) -> bool {
    matches!(b, b'%' | b'{' | b'}' | b':') || b.is_ascii_control()
}

/// The keys of the policy set, all on the `{policies}` hash tag (see `lua/policy_write.lua`).
#[derive(Debug, Clone)]
pub struct PolicyKeys {
    pub meta: String,
    pub names: String,
    pub deleted: String,
    pub seeded: String,
    /// Descriptor shape -> the policy that claims it.
    pub shapes: String,
    /// Prefix of each policy's hash; the name follows.
    pub hash_prefix: String,
    /// The set of names and the version counter of the layout before the change log, adopted
    /// once (see `lua/policy_write.lua`).
    pub legacy_index: String,
    pub legacy_version: String,
}

impl PolicyKeys {
    pub fn new(prefix: &str) -> Self {
        let key = |part: &str| format!("{prefix}:{{policies}}:{part}");
        Self {
            meta: key("meta"),
            names: key("names"),
            deleted: key("deleted"),
            seeded: key("seeded"),
            shapes: key("shapes"),
            hash_prefix: key("policy:"),
            legacy_index: key("index"),
            legacy_version: key("version"),
        }
    }

    /// The hash holding one policy.
    pub fn hash(&self, name: &str) -> String {
        format!("{}{name}", self.hash_prefix)
    }

    /// The hash holding one override of a policy: the policy's hash key, `/`, the id (see
    /// `store::overrides`).
    pub fn override_hash(&self, policy: &str, id: &str) -> String {
        format!("{}{policy}/{id}", self.hash_prefix)
    }

    /// The keys of one policy's overrides: the ids of their matches, and the matches of each
    /// class (see `lua/override_write.lua`).
    pub fn overrides_of(&self, policy: &str) -> [String; 3] {
        let base = &self.hash_prefix[..self.hash_prefix.len() - "policy:".len()];
        [
            format!("{base}overrides:{policy}"),
            format!("{base}matches:{policy}:exact"),
            format!("{base}matches:{policy}:pattern"),
        ]
    }
}

/// The hash tag of a key as Redis Cluster computes it: the bytes between the first `{` and the
/// first `}` after it, when that is not empty; otherwise the whole key.
pub fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        if let Some(len) = key[open + 1..].find('}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(policy: &str, k: &str) -> String {
        let mut buf = String::new();
        state_key(&mut buf, "rl", policy, k, None, Algorithm::TokenBucket);
        buf
    }

    #[test]
    fn plain_keys_are_kept_readable() {
        assert_eq!(key("api", "user-42"), "rl:{api:user-42}:token_bucket");
    }

    #[test]
    fn other_limits_are_named_inside_the_subject_s_slot() {
        let mut buf = String::new();
        state_key(
            &mut buf,
            "rl",
            "api",
            "u",
            Some("daily"),
            Algorithm::FixedWindow,
        );
        assert_eq!(buf, "rl:{api:u}:daily:fixed_window");
        assert_eq!(hash_tag(&buf), "api:u");
    }

    #[test]
    fn a_ticket_s_record_is_on_its_subject_s_hash_tag() {
        let mut buf = String::from("junk");
        ticket_record(&mut buf, "rl", "api", "a}b", 0xab);
        assert_eq!(buf, "rl:{api:a%7Db}:ticket:00000000000000ab");
        assert_eq!(hash_tag(&buf), hash_tag(&key("api", "a}b")));
        assert_eq!(ticket_keys("rl"), "rl:ticket-keys");
    }

    #[test]
    fn a_policy_s_leases_and_ledger_share_its_incarnation_s_hash_tag() {
        let mut buf = String::new();
        lease_key(&mut buf, "rl", "exports", 7, "a}b{c:d%");
        assert_eq!(buf, "rl:{exports@7}:lease:a%7Db%7Bc%3Ad%25");
        let mut ledger = String::new();
        lease_ledger(&mut ledger, "rl", "exports", 7);
        assert_eq!(ledger, "rl:{exports@7}:leases");
        assert_eq!(hash_tag(&buf), hash_tag(&ledger));
        lease_key(&mut buf, "rl", "exports", 8, "a}b{c:d%");
        assert_ne!(hash_tag(&buf), hash_tag(&ledger));
        // No subject's key is the ledger's, whatever its key.
        lease_key(&mut buf, "rl", "exports", 7, "s");
        assert_ne!(buf, ledger);
    }

    #[test]
    fn a_minute_of_top_summaries_is_on_its_policy_s_own_tag() {
        let keys = top_keys("rl", "api", 29_000_000);
        assert_eq!(keys[0], "rl:{top/api}:29000000:d");
        assert_eq!(keys[3], "rl:{top/api}:29000000:m");
        assert!(keys.iter().all(|k| hash_tag(k) == "top/api"));
        // No subject's state shares it, whatever its policy and key.
        assert_ne!(hash_tag(&key("top", "api")), hash_tag(&keys[0]));
    }

    #[test]
    fn braces_and_colons_cannot_leave_the_hash_tag() {
        let k = key("api", "a}b{c:d%");
        assert_eq!(k, "rl:{api:a%7Db%7Bc%3Ad%25}:token_bucket");
        assert_eq!(hash_tag(&k), "api:a%7Db%7Bc%3Ad%25");
    }

    #[test]
    fn a_key_cannot_imitate_another_policy() {
        // Policy "a" with key "b:c" and policy "a:b" (not a valid name) with key "c" would meet
        // without escaping.
        assert_ne!(key("a", "b:c"), "rl:{a:b:c}:token_bucket");
    }

    proptest! {
        #[test]
        fn distinct_subjects_get_distinct_keys_on_their_own_tag(
            p1 in "[a-z]{1,3}", k1 in "\\PC{1,8}|[{}:%\\x00-\\x1f]{1,4}",
            p2 in "[a-z]{1,3}", k2 in "\\PC{1,8}|[{}:%\\x00-\\x1f]{1,4}",
        ) {
            let (a, b) = (key(&p1, &k1), key(&p2, &k2));
            prop_assert_eq!(a == b, p1 == p2 && k1 == k2);
            let tag_start = format!("{}:", p1);
            prop_assert!(hash_tag(&a).starts_with(&tag_start));
            prop_assert_eq!(hash_tag(&a).len() + "rl:{".len() + "}:token_bucket".len(), a.len());
        }
    }
}
