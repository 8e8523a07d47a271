//! The local denial cache: an instance answers repeated acquires of a subject that has no unit
//! left itself, without asking Redis, and exactly, until the time Redis computed.
//!
//! Why it is exact. A denial consumes nothing, so a subject whose acquire of 1 unit Redis denied
//! stays denied until the retry time Redis gave, unless something gives units back or changes
//! the answer: a refund, a report (debt moves the retry time later), a reset, or a change to the
//! policy. So an entry is made only from Redis's denial of an acquire of `cost` 1 (then no cost
//! can pass) on a policy of one limit in enforce mode; it answers acquires of `cost` 1 only (a
//! larger cost's retry time is its own); and it is keyed by the policy's name and version and the
//! subject's key, so a changed policy never meets an entry of its old version. Its deadlines are
//! counted from the moment this instance began deciding the request that made it, before it was
//! sent: Redis decided after that moment,
//! so they are never later than Redis's (a cached `retry_after_ms` may be shorter than Redis's by
//! the round trip, never longer). An entry lives until its retry time, and never longer than
//! the bound `limits.denial_cache_ms`; while it lives it answers Redis's retry and reset times,
//! counted down, whatever the bound.
//!
//! Invalidation. Every instance that refunds, reports or resets a subject on the shared store
//! publishes `<policy>:<key>` on the Redis channel `<prefix>:denials` after the store answered,
//! and every instance subscribed to it drops its entry for that subject. An instance uses its
//! cache only while it is subscribed: it empties it when the subscription ends, and starts again
//! once subscribed anew, so a message sent while it was away cannot be missed unnoticed. A reply
//! that arrives after an invalidation in its shard since its request was sent makes no entry
//! (each shard counts its invalidations), so a denial decided before a refund cannot be cached
//! after the refund's message. What is left is a message that Redis accepted and lost on the
//! way (the subscriber's connection breaking after the publish): the bound limits that case.
//!
//! Memory: at most `limits.denial_cache_entries` entries, about 100 bytes each plus the key;
//! when full, expired entries are dropped first, and a new denial that still finds no room is not
//! cached.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

const SHARDS: usize = 16;

/// One cached denial.
#[derive(Debug)]
struct Entry {
    policy: Box<str>,
    version: u64,
    key: Box<str>,
    /// When the entry stops answering: the retry time, or the bound if sooner.
    until: Instant,
    /// When an acquire of 1 unit may pass again, as Redis answered it; what a hit counts down
    /// to, so that an entry cut short by the bound never promises an earlier retry than Redis.
    retry_at: Instant,
    /// When the limit will be full again, as Redis answered it.
    reset_at: Instant,
}

#[derive(Debug, Default)]
struct Shard {
    /// By a hash of `(policy, key)`; the entry holds both, so a collision is a miss.
    entries: HashMap<u64, Entry>,
    /// Invalidations seen by this shard.
    epoch: u64,
}

/// What a cached denial answers: the time until an acquire of 1 unit may pass, and until the
/// limit is full again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denied {
    pub retry_after: Duration,
    pub reset_after: Duration,
}

/// What [`DenialCache::check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// A cached denial, to answer with.
    Hit(Denied),
    /// None: ask Redis, with the ticket its reply needs to be cached (`None` while the cache is
    /// not live).
    Miss(Option<Ticket>),
}

/// A request's place in its shard's history, taken before it is sent: its reply may make an
/// entry only if no invalidation came in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    epoch: u64,
    sent: Instant,
}

/// The cache (see the module doc).
#[derive(Debug)]
pub struct DenialCache {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    bound: Duration,
    /// Subscribed to the invalidations: only then is the cache used.
    live: AtomicBool,
}

// A panic while a shard is locked leaves it whole (entries are inserted and removed whole).
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(|e| e.into_inner())
}

fn hash(policy: &str, key: &str) -> u64 {
    let mut h = DefaultHasher::new();
    policy.hash(&mut h);
    key.hash(&mut h);
    h.finish()
}

impl DenialCache {
    /// An empty cache of at most `max_entries` entries, each living at most `bound`; not live
    /// until [`DenialCache::set_live`].
    pub fn new(max_entries: usize, bound: Duration) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            per_shard: max_entries.div_ceil(SHARDS).max(1),
            bound,
            live: AtomicBool::new(false),
        }
    }

    fn shard(&self, h: u64) -> &Mutex<Shard> {
        &self.shards[(h as usize) % SHARDS]
    }

    /// Whether the cache is in use (subscribed to the invalidations).
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// Starts (subscribed) or stops (the subscription ended) using the cache; either way it is
    /// emptied, and every request in flight loses its right to make an entry.
    pub fn set_live(&self, live: bool) {
        self.live.store(live, Ordering::Release);
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            shard.entries.clear();
            shard.epoch += 1;
        }
    }

    /// The cached denial of the subject, if there is one of this policy version still in force
    /// at `now`; otherwise, while the cache is live, the ticket with which the reply to the
    /// request about to be sent may make one (its deadlines count from `now`, which is no later
    /// than the sending). One hash and one lock, on every acquire that may meet the cache.
    pub fn check(&self, policy: &str, version: u64, key: &str, now: Instant) -> Lookup {
        if !self.is_live() {
            return Lookup::Miss(None);
        }
        let h = hash(policy, key);
        let mut shard = lock(self.shard(h));
        let ticket = Ticket {
            epoch: shard.epoch,
            sent: now,
        };
        let Some(entry) = shard.entries.get(&h) else {
            return Lookup::Miss(Some(ticket));
        };
        if &*entry.policy != policy || &*entry.key != key {
            return Lookup::Miss(Some(ticket));
        }
        if entry.version != version || entry.until <= now {
            shard.entries.remove(&h);
            return Lookup::Miss(Some(ticket));
        }
        Lookup::Hit(Denied {
            retry_after: entry.retry_at.saturating_duration_since(now),
            reset_after: entry.reset_at.saturating_duration_since(now),
        })
    }

    /// Caches Redis's denial of an acquire of 1 unit, sent at `ticket`, that answered
    /// `denied` (times from the decision); unless an invalidation came since, the deadline has
    /// passed already at `now`, or there is no room. Says whether it did.
    pub fn insert(
        &self,
        policy: &str,
        version: u64,
        key: &str,
        ticket: Ticket,
        denied: Denied,
        now: Instant,
    ) -> bool {
        let until = ticket.sent + denied.retry_after.min(self.bound);
        if until <= now || !self.is_live() {
            return false;
        }
        let h = hash(policy, key);
        let mut shard = lock(self.shard(h));
        if shard.epoch != ticket.epoch {
            return false;
        }
        if shard.entries.len() >= self.per_shard && !shard.entries.contains_key(&h) {
            shard.entries.retain(|_, e| e.until > now);
            if shard.entries.len() >= self.per_shard {
                return false;
            }
        }
        shard.entries.insert(
            h,
            Entry {
                policy: policy.into(),
                version,
                key: key.into(),
                until,
                retry_at: ticket.sent + denied.retry_after,
                reset_at: ticket.sent + denied.reset_after,
            },
        );
        true
    }

    /// Drops the subject's entry, and keeps replies to requests already sent from making one.
    pub fn invalidate(&self, policy: &str, key: &str) {
        let h = hash(policy, key);
        let mut shard = lock(self.shard(h));
        shard.epoch += 1;
        if shard
            .entries
            .get(&h)
            .is_some_and(|e| &*e.policy == policy && &*e.key == key)
        {
            shard.entries.remove(&h);
        }
    }

    /// Entries held, expired ones not dropped yet included.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).entries.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The message that invalidates a subject: `<policy>:<key>` (policy names hold no `:`).
pub fn message(policy: &str, key: &str) -> String {
    format!("{policy}:{key}")
}

/// The message that tells every instance that a policy's overrides changed: `<policy>/` (no
/// subject message ends so without a `:` first, which [`parse_message`] needs).
pub fn overrides_message(policy: &str) -> String {
    format!("{policy}/")
}

/// The policy of an [`overrides_message`].
pub fn parse_overrides_message(message: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(message).ok()?;
    let policy = text.strip_suffix('/')?;
    (!policy.contains(':') && !policy.contains('/')).then_some(policy)
}

/// A message's policy and key.
pub fn parse_message(message: &[u8]) -> Option<(&str, &str)> {
    std::str::from_utf8(message).ok()?.split_once(':')
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn live(max: usize) -> DenialCache {
        let cache = DenialCache::new(max, 1_000 * MS);
        cache.set_live(true);
        cache
    }

    impl DenialCache {
        fn denied(&self, policy: &str, version: u64, key: &str, now: Instant) -> Option<Denied> {
            match self.check(policy, version, key, now) {
                Lookup::Hit(d) => Some(d),
                Lookup::Miss(_) => None,
            }
        }

        fn ticket(&self, policy: &str, key: &str) -> Option<Ticket> {
            match self.check(policy, u64::MAX, key, Instant::now()) {
                Lookup::Miss(t) => t,
                Lookup::Hit(_) => None,
            }
        }
    }

    fn denied(retry_ms: u64, reset_ms: u64) -> Denied {
        Denied {
            retry_after: Duration::from_millis(retry_ms),
            reset_after: Duration::from_millis(reset_ms),
        }
    }

    #[test]
    fn a_denial_is_answered_counting_down_from_when_its_request_was_sent() {
        let cache = live(10);
        let t = cache.ticket("p", "k").expect("live");
        assert!(cache.insert("p", 3, "k", t, denied(300, 500), t.sent + 2 * MS));
        let at = t.sent + 100 * MS;
        assert_eq!(cache.denied("p", 3, "k", at), Some(denied(200, 400)));
        // Another policy or key: nothing.
        assert_eq!(cache.denied("q", 3, "k", at), None);
        assert_eq!(cache.denied("p", 3, "j", at), None);
        assert!(cache.denied("p", 3, "k", at).is_some());
        // At the retry time the entry is gone.
        assert_eq!(cache.denied("p", 3, "k", t.sent + 300 * MS), None);
        // Another version of the policy: nothing, and the old version's entry is dropped.
        let t = cache.ticket("p", "k").expect("live");
        assert!(cache.insert("p", 3, "k", t, denied(300, 500), t.sent));
        assert_eq!(cache.denied("p", 4, "k", t.sent), None);
        assert_eq!(cache.denied("p", 3, "k", t.sent), None);
        assert!(cache.is_empty());
    }

    #[test]
    fn an_entry_lives_no_longer_than_the_bound() {
        let cache = live(10);
        let t = cache.ticket("p", "k").expect("live");
        assert!(cache.insert("p", 1, "k", t, denied(60_000, 60_000), t.sent));
        let d = cache
            .denied("p", 1, "k", t.sent + 999 * MS)
            .expect("cached");
        // It answers Redis's times, counted down: the bound shortens its life, not them.
        assert_eq!(d.retry_after, 59_001 * MS);
        assert_eq!(d.reset_after, 59_001 * MS);
        assert_eq!(cache.denied("p", 1, "k", t.sent + 1_000 * MS), None);
    }

    #[test]
    fn an_invalidation_drops_the_entry_and_refuses_replies_sent_before_it() {
        let cache = live(10);
        let before = cache.ticket("p", "k").expect("live");
        cache.invalidate("p", "k");
        assert!(!cache.insert("p", 1, "k", before, denied(50, 50), before.sent));
        let t = cache.ticket("p", "k").expect("live");
        assert!(cache.insert("p", 1, "k", t, denied(50, 50), t.sent));
        cache.invalidate("p", "other-key-in-maybe-another-shard");
        cache.invalidate("p", "k");
        assert_eq!(cache.denied("p", 1, "k", t.sent), None);
    }

    #[test]
    fn a_cache_not_subscribed_is_not_used_and_is_emptied() {
        let cache = live(10);
        let t = cache.ticket("p", "k").expect("live");
        assert!(cache.insert("p", 1, "k", t, denied(50, 50), t.sent));
        cache.set_live(false);
        assert!(cache.is_empty());
        assert_eq!(cache.ticket("p", "k"), None);
        assert!(!cache.insert("p", 1, "k", t, denied(50, 50), t.sent));
        // Subscribed again: a request sent before is still refused.
        cache.set_live(true);
        assert!(!cache.insert("p", 1, "k", t, denied(50, 50), t.sent));
        assert_eq!(cache.denied("p", 1, "k", t.sent), None);
    }

    #[test]
    fn a_full_cache_drops_expired_entries_first_and_then_caches_nothing_more() {
        let cache = live(SHARDS);
        let now = Instant::now();
        // One entry per shard at most: fill every shard with short entries.
        let mut shard_of = HashMap::new();
        for i in 0..1_000 {
            let key = format!("k{i}");
            let s = hash("p", &key) as usize % SHARDS;
            shard_of.entry(s).or_insert(key);
        }
        assert_eq!(shard_of.len(), SHARDS);
        for key in shard_of.values() {
            let t = cache.ticket("p", key).expect("live");
            assert!(cache.insert("p", 1, key, t, denied(10, 10), now));
        }
        assert_eq!(cache.len(), SHARDS);
        let (s, key) = shard_of.iter().next().expect("a shard");
        let other = (0..10_000)
            .map(|i| format!("x{i}"))
            .find(|k| hash("p", k) as usize % SHARDS == *s)
            .expect("another key of that shard");
        let t = cache.ticket("p", &other).expect("live");
        assert!(!cache.insert("p", 1, &other, t, denied(10, 10), now));
        // Once the first has expired, there is room.
        assert!(cache.insert("p", 1, &other, t, denied(60, 60), t.sent + 20 * MS));
        assert_eq!(cache.denied("p", 1, key, t.sent + 20 * MS), None);
        assert!(cache.denied("p", 1, &other, t.sent + 20 * MS).is_some());
    }

    #[test]
    fn messages_name_the_policy_and_the_whole_key() {
        let m = message("p", "a:b\n");
        assert_eq!(parse_message(m.as_bytes()), Some(("p", "a:b\n")));
        assert_eq!(parse_message(b"\xff"), None);
        // The start-up check of the Redis user's permissions publishes it: no instance acts.
        let probe = crate::store::redis::acl::PROBE_MESSAGE.as_bytes();
        assert_eq!(parse_message(probe), None);
        assert_eq!(parse_overrides_message(probe), None);
    }
}
