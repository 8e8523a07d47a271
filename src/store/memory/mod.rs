//! The embedded store: limiter state and policies in this process.
//!
//! It runs the same pure decision functions the Lua scripts mirror, so its answers match
//! Redis's; but its limits are per process, not shared between instances. State lives in a
//! fixed number of independently locked shards; every entry carries the expiry its algorithm
//! asked for, expired entries read as absent, and [`MemoryStore::evict_expired`] (run every
//! second by the service) frees them, so memory stays bounded by the live subjects.
//!
//! A subject's limits (one per limit of its policy) are in one shard and decided together under
//! its lock, as one script decides them on Redis. Each limit's state is one entry, and so are a
//! subject's leases under a concurrency limit (expiring with the last of them); "subjects" below
//! counts entries. Each concurrency policy's ledger of leases (see `limiter::concurrency`) is kept
//! beside the shards, under its own lock, taken after a shard's.
//!
//! The number of subjects is capped (`limits.max_embedded_subjects`). At the cap, a subject that
//! has no state yet first makes the store free what has expired (at most every
//! [`SWEEP_EVERY_US`]); if the store is still full, its acquire fails with [`StoreError::Full`],
//! which the service answers by the policy's fail mode. Subjects that have state keep deciding
//! exactly. Each refusal is counted in `ratelimiter_embedded_store_full_total` and logged, at most
//! one line a second with the count.
//!
//! This file holds the store, its shards and its [`Store`] implementation; joint acquires are
//! in `joint.rs`, leases and ledgers in `leases.rs`, and policies in `policy_set.rs`.

mod joint;
mod leases;
mod policy_set;

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use self::policy_set::PolicySet;
use super::{
    key, Ask, ChangePage, Etag, LeasePlan, OverrideWrite, OverrideWritten, Plan, PolicyWrite,
    Store, StoreError, Written,
};
use crate::limiter::concurrency::{self, LeaseAnswer};
use crate::limiter::reservation::{self, Queued};
use crate::limiter::{State, Verdict, MAX_LIMITS};
use crate::metrics as m;
use crate::policy::overrides::{Override, OverrideId};
use crate::policy::{LimitKey, Policy, PolicyName};
use crate::telemetry::Summarized;

const SHARDS: usize = 64;

/// The shortest time between two sweeps of expired entries forced by a full store: a flood of new
/// subjects at the cap must not make every one of their acquires walk every shard.
pub const SWEEP_EVERY_US: u64 = 100_000;

#[derive(Debug)]
struct Slot {
    state: Kept,
    expires_at_us: u64,
}

/// What one entry holds: one limit's state, or one subject's leases under a concurrency limit
/// (their key names differ, see `key`, so one is never read as the other).
#[derive(Debug)]
enum Kept {
    Limit(State),
    Leases(concurrency::State),
    /// A ticket's record: the units refunded with it so far (see `store::Claim`).
    Spent(u64),
    /// A subject's queue of reservations: the latest time anything is booked for (µs), which
    /// is also when the entry expires (`limiter::reservation`).
    Queue(u64),
}

/// The in-process store.
pub struct MemoryStore {
    prefix: String,
    shards: Box<[Mutex<HashMap<String, Slot>>]>,
    /// Entries in `shards` plus slots taken by new subjects whose acquire is deciding: changed
    /// only under a shard's lock, or by a reservation that checks the cap, so it never exceeds
    /// `max_subjects`.
    subjects: AtomicU64,
    max_subjects: u64,
    /// When a full store last swept expired entries (µs).
    swept_at_us: AtomicU64,
    /// Refusals, logged one line a second with their count.
    refused: Summarized,
    policies: Mutex<PolicySet>,
    /// Each concurrency policy's ledger, by the policy's name and incarnation: locked after a
    /// shard, never before one. Not counted as subjects: it holds only what the subjects'
    /// entries hold. A ledger left empty is removed, so these are the ledgers that hold leases.
    ledgers: Mutex<HashMap<(String, u64), concurrency::Ledger>>,
    /// Whether any subject ever had a queue of reservations: until one does, no decision
    /// builds a queue's name to look for it. Set under the lock of the shard the first queue is
    /// written to, before writing it, and read under a shard's lock, so a decision that could
    /// find a queue always sees it set.
    booked: AtomicBool,
}

/// Microseconds since the Unix epoch by the system clock.
pub fn system_now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

// A panic while a shard is locked cannot leave a half-updated entry (entries are replaced
// whole), so a poisoned lock is still safe to use.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl MemoryStore {
    /// An empty store that keeps state for at most `max_subjects` subjects.
    pub fn new(prefix: &str, max_subjects: u64) -> Self {
        Self {
            prefix: prefix.to_owned(),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            subjects: AtomicU64::new(0),
            max_subjects,
            // Never: the first of each is due at once.
            swept_at_us: AtomicU64::new(u64::MAX),
            refused: Summarized::per_second(),
            policies: Mutex::new(PolicySet::default()),
            ledgers: Mutex::new(HashMap::new()),
            booked: AtomicBool::new(false),
        }
    }

    /// Decides one acquire over all of the policy's limits at an explicit time, under one lock.
    /// Fails with [`StoreError::Full`] only when a limit without state needs an entry while the
    /// store holds `max_subjects` entries that have not expired.
    pub fn acquire_at(
        &self,
        policy: &Policy,
        key: &LimitKey,
        cost: u64,
        now: u64,
    ) -> Result<Verdict, StoreError> {
        self.decide_at(&Plan::acquire(policy, key, cost), now)
    }

    /// Decides one plan over all of its limits at an explicit time (the plan's own is not read),
    /// under one lock, with the subject's queue ([`reservation::decide_queued`], or
    /// [`reservation::reserve`] for a reservation, which moves the queue; a refund's ticket
    /// record is read and written under the same lock).
    /// Only an acquire, a reservation, a report or a refund's first use of a ticket may need new
    /// entries, and fail with [`StoreError::Full`] as [`MemoryStore::acquire_at`] does.
    pub fn decide_at(&self, plan: &Plan<'_>, now: u64) -> Result<Verdict, StoreError> {
        let Plan {
            policy,
            key,
            ask,
            params,
            at_us: _,
        } = *plan;
        let (op, cost, marks, ticket) = (ask.op(), ask.cost(), plan.marks(), plan.claim());
        let (mut names, n) = key::state_keys(&self.prefix, policy, key);
        let names = &mut names[..n];
        // All of a subject's limits are in one shard, decided under its one lock.
        let shard_lock = self.shard(policy.name.as_str(), key.as_str());
        let mut shard = lock(shard_lock);
        // Limits with an entry (live, or expired and not evicted yet) reuse it; for an operation
        // that may create state, the others take a slot before deciding, so that the count never
        // passes the cap however many new subjects arrive at once.
        let mut reserved = 0;
        if op.creates_state() {
            reserved = match self.reserve(&shard, names) {
                Some(r) => r,
                None => {
                    // The sweep locks every shard: this one must be released first.
                    drop(shard);
                    self.sweep_when_full(now);
                    shard = lock(shard_lock);
                    self.reserve(&shard, names).ok_or_else(|| self.refuse())?
                }
            };
        }
        // The subject's queue: read by every decision once anything was booked, and one more
        // entry for a reservation, whose slot is taken before deciding, as a ticket record's is.
        let books = matches!(ask, Ask::Reserve { .. });
        let queue_name = (books || self.booked.load(Ordering::Relaxed)).then(|| {
            let mut name = String::new();
            key::queue_key(&mut name, &self.prefix, policy.name.as_str(), key.as_str());
            name
        });
        let queue = queue_name.as_deref().and_then(|q| queued(&shard, q, now));
        let new_queue = queue_name
            .as_deref()
            .is_some_and(|q| !shard.contains_key(q));
        if books && new_queue {
            if self.reserve_count(1).is_none() {
                self.subjects.fetch_sub(reserved, Ordering::Relaxed);
                return Err(self.refuse());
            }
            reserved += 1;
        }
        // A ticket gives back at most what it took less what it gave before; its record is one
        // more entry, reserved before anything is given so that a full store gives nothing.
        let mut cost = cost;
        let mut record = None;
        if let Some(t) = ticket {
            let mut name = String::new();
            key::ticket_record(
                &mut name,
                &self.prefix,
                policy.name.as_str(),
                key.as_str(),
                t.id,
            );
            let spent = match shard.get(&name) {
                Some(Slot {
                    state: Kept::Spent(units),
                    expires_at_us,
                }) if *expires_at_us > now => Some(*units),
                Some(_) => Some(0),
                None => None,
            };
            if spent.is_none() {
                if self.reserve_count(1).is_none() {
                    return Err(self.refuse());
                }
                reserved += 1;
            }
            let spent = spent.unwrap_or(0);
            cost = cost.min(t.units.saturating_sub(spent));
            record = Some((name, spent, t.ends_at_us));
        }
        // Taken out and put back: the pure functions own the state while they decide. Each
        // entry taken out, and each reserved slot, is one counted subject until put back.
        let mut states: [Option<State>; MAX_LIMITS] = Default::default();
        let mut expires = [0; MAX_LIMITS];
        let mut taken_out = 0;
        for (i, name) in names.iter().enumerate() {
            taken_out += take_out(&mut shard, name, now, &mut states[i], &mut expires[i]);
        }
        let mut ttls = [None; MAX_LIMITS];
        let (states_n, ttls_n) = (&mut states[..n], &mut ttls[..n]);
        let (verdict, booked) = match ask {
            Ask::Reserve { max_wait_us, .. } => {
                let r =
                    reservation::reserve(params, states_n, ttls_n, cost, now, queue, max_wait_us);
                (r.verdict, r.queue_us)
            }
            _ => {
                let queued = Queued {
                    now_us: now,
                    queue_us: queue,
                };
                let v =
                    reservation::decide_queued(params, states_n, ttls_n, (op, cost, marks), queued);
                (v, None)
            }
        };
        let mut kept = 0;
        for (i, name) in names.iter_mut().enumerate() {
            let expiry = ttls[i].map_or(expires[i], |ttl| now.saturating_add(ttl));
            kept += put_back(&mut shard, name, states[i].take(), expiry, now);
        }
        if let (Some(q), Some(name)) = (booked.filter(|&q| q > now), queue_name) {
            self.booked.store(true, Ordering::Relaxed);
            let slot = Slot {
                state: Kept::Queue(q),
                expires_at_us: q,
            };
            let existed = shard.insert(name, slot).is_some();
            kept += u64::from(!existed);
        }
        if let Some((name, spent, ends_at_us)) = record {
            let given = verdict.units().iter().copied().max().unwrap_or(0);
            let existed = shard.contains_key(&name);
            if given > 0 && ends_at_us > now {
                let slot = Slot {
                    state: Kept::Spent(spent + given),
                    expires_at_us: ends_at_us,
                };
                shard.insert(name, slot);
                kept += u64::from(!existed);
            }
        }
        self.subjects
            .fetch_sub(taken_out + reserved - kept, Ordering::Relaxed);
        Ok(verdict)
    }

    /// Deletes the subject's state for every limit of the policy, and its queue of
    /// reservations; returns how many limits had state.
    pub fn clear(&self, policy: &Policy, key: &LimitKey) -> usize {
        let (names, n) = key::state_keys(&self.prefix, policy, key);
        let mut queue = String::new();
        key::queue_key(&mut queue, &self.prefix, policy.name.as_str(), key.as_str());
        let mut shard = lock(self.shard(policy.name.as_str(), key.as_str()));
        let removed = names[..n]
            .iter()
            .filter(|name| shard.remove(name.as_str()).is_some())
            .count();
        let queued = usize::from(shard.remove(&queue).is_some());
        self.subjects
            .fetch_sub((removed + queued) as u64, Ordering::Relaxed);
        removed
    }

    /// Takes one slot for each of `names` that has no entry in `shard`, unless the store would be
    /// over its cap; all of them (and says how many) or none.
    fn reserve(&self, shard: &HashMap<String, Slot>, names: &[String]) -> Option<u64> {
        let missing = names.iter().filter(|n| !shard.contains_key(*n)).count() as u64;
        self.reserve_count(missing)
    }

    /// Takes `missing` slots, unless the store would be over its cap.
    fn reserve_count(&self, missing: u64) -> Option<u64> {
        if missing == 0 {
            return Some(0);
        }
        self.subjects
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n + missing <= self.max_subjects).then_some(n + missing)
            })
            .ok()
            .map(|_| missing)
    }

    /// Frees expired entries, unless a full store already did less than [`SWEEP_EVERY_US`] ago.
    fn sweep_when_full(&self, now: u64) {
        let last = self.swept_at_us.load(Ordering::Relaxed);
        // `now < last`: the clock stepped back; sweeping then is harmless.
        let due = now < last || now - last >= SWEEP_EVERY_US;
        if due
            && self
                .swept_at_us
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let evicted = self.evict_expired(now);
            tracing::debug!(evicted, "embedded store full: evicted expired state");
        }
    }

    /// Counts a refused subject, logs at most one line a second, and returns the error.
    fn refuse(&self) -> StoreError {
        metrics::counter!(m::EMBEDDED_STORE_FULL).increment(1);
        if let Some(refused) = self.refused.hit() {
            tracing::warn!(
                refused,
                max_subjects = self.max_subjects,
                "embedded store full (limits.max_embedded_subjects): new subjects get no state \
                 and are answered by their policy's fail mode"
            );
        }
        StoreError::Full(self.max_subjects)
    }

    /// Frees every entry that has expired by `now`; returns how many there were.
    pub fn evict_expired(&self, now: u64) -> usize {
        // A ledger lives on a grace after its last lease, as on Redis; one that no sweep reaches
        // any more (its policy deleted) goes then.
        let grace = concurrency::LEDGER_GRACE_MS * 1_000;
        lock(&self.ledgers).retain(|_, l| l.last().is_some_and(|last| last + grace > now));
        self.shards
            .iter()
            .map(|shard| {
                let mut shard = lock(shard);
                let before = shard.len();
                shard.retain(|_, slot| slot.expires_at_us > now);
                let evicted = before - shard.len();
                self.subjects.fetch_sub(evicted as u64, Ordering::Relaxed);
                evicted
            })
            .sum()
    }

    /// Subjects with state (expired ones not evicted yet included), and new subjects deciding.
    pub fn len(&self) -> usize {
        usize::try_from(self.subjects.load(Ordering::Relaxed)).unwrap_or(usize::MAX)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shard of one subject: by policy and key, so that every limit's state is in it.
    fn shard(&self, policy: &str, key: &str) -> &Mutex<HashMap<String, Slot>> {
        &self.shards[self.shard_index(policy, key)]
    }

    fn shard_index(&self, policy: &str, key: &str) -> usize {
        let mut h = DefaultHasher::new();
        policy.hash(&mut h);
        key.hash(&mut h);
        (h.finish() as usize) % SHARDS
    }
}

/// The subject's queue of reservations kept under `name` in its shard ([`Kept::Queue`]), while
/// it has not passed at `now`.
fn queued(shard: &HashMap<String, Slot>, name: &str, now: u64) -> Option<u64> {
    match shard.get(name) {
        Some(Slot {
            state: Kept::Queue(q),
            expires_at_us,
        }) if *expires_at_us > now => Some(*q),
        _ => None,
    }
}

/// Takes a limit's entry `name` out of its shard, for the pure functions to own while they
/// decide: its state and expiry into `state` and `expires` when it is live. Answers the entries
/// taken out (0 or 1; an expired one counts too: it leaves the shard).
fn take_out(
    shard: &mut HashMap<String, Slot>,
    name: &str,
    now: u64,
    state: &mut Option<State>,
    expires: &mut u64,
) -> u64 {
    let Some(slot) = shard.remove(name) else {
        return 0;
    };
    if let (true, Kept::Limit(live)) = (slot.expires_at_us > now, slot.state) {
        *state = Some(live);
        *expires = slot.expires_at_us;
    }
    1
}

/// Puts a limit's decided `state` back into its shard under `name` (taken from the buffer),
/// unless it expires by `now` or there is none. Answers the entries put back (0 or 1).
fn put_back(
    shard: &mut HashMap<String, Slot>,
    name: &mut String,
    state: Option<State>,
    expires_at_us: u64,
    now: u64,
) -> u64 {
    match state {
        Some(state) if expires_at_us > now => {
            shard.insert(
                std::mem::take(name),
                Slot {
                    state: Kept::Limit(state),
                    expires_at_us,
                },
            );
            1
        }
        _ => 0,
    }
}

impl Store for MemoryStore {
    async fn decide(&self, plan: &Plan<'_>) -> Result<Verdict, StoreError> {
        self.decide_at(plan, plan.at_us.unwrap_or_else(system_now_us))
    }

    async fn acquire_joint(&self, plans: &[Plan<'_>]) -> Result<Vec<Verdict>, StoreError> {
        let now = plans.first().and_then(|p| p.at_us);
        self.acquire_joint_at(plans, now.unwrap_or_else(system_now_us))
    }

    async fn lease(&self, plan: &LeasePlan<'_>) -> Result<LeaseAnswer, StoreError> {
        self.lease_at(plan, plan.at_us)
    }

    async fn sweep_leases(
        &self,
        policy: &Policy,
        now_us: Option<u64>,
    ) -> Result<LeaseAnswer, StoreError> {
        Ok(self.sweep_leases_at(policy, now_us.unwrap_or_else(system_now_us)))
    }

    async fn leased_ledgers(&self) -> Result<Vec<super::LeasedLedger>, StoreError> {
        Ok(lock(&self.ledgers)
            .keys()
            .map(|(policy, incarnation)| super::LeasedLedger {
                policy: policy.clone(),
                incarnation: *incarnation,
                until_us: u64::MAX,
            })
            .collect())
    }

    async fn unindex_ledger(&self, _entry: &super::LeasedLedger) -> Result<(), StoreError> {
        // No index: an empty ledger is removed as it empties.
        Ok(())
    }

    fn lease_deadline(&self, _now_us: Option<u64>) -> Option<u64> {
        None
    }

    async fn reset(&self, policy: &Policy, key: &LimitKey) -> Result<(), StoreError> {
        self.clear(policy, key);
        Ok(())
    }

    async fn write_policy(&self, write: PolicyWrite<'_>) -> Result<Written, StoreError> {
        Ok(lock(&self.policies).write(write))
    }

    async fn policy_changes(&self, since: u64, max: usize) -> Result<ChangePage, StoreError> {
        Ok(lock(&self.policies).changes(since, max))
    }

    async fn read_policy(&self, name: &PolicyName) -> Result<Option<(Policy, Etag)>, StoreError> {
        Ok(lock(&self.policies).read(name))
    }

    async fn write_override(&self, w: OverrideWrite<'_>) -> Result<OverrideWritten, StoreError> {
        Ok(lock(&self.policies).write_override(w))
    }

    async fn read_override(
        &self,
        policy: &PolicyName,
        id: &OverrideId,
    ) -> Result<Option<(Override, Etag)>, StoreError> {
        Ok(lock(&self.policies).read_override(policy, id))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Algorithm, FailMode};

    fn policy(algorithm: Algorithm, values: &[u64]) -> Policy {
        Policy::single(
            PolicyName::parse("p").expect("valid"),
            algorithm,
            values,
            None,
            FailMode::Open,
        )
    }

    #[test]
    fn expired_state_reads_as_absent_and_is_evicted() {
        let store = MemoryStore::new("rl", 100);
        let p = policy(Algorithm::FixedWindow, &[1, 1_000]);
        let k = LimitKey::parse("k".into()).expect("valid");
        assert!(store.acquire_at(&p, &k, 1, 0).expect("decided").allowed);
        assert!(
            !store
                .acquire_at(&p, &k, 1, 999_999)
                .expect("decided")
                .allowed
        );
        assert_eq!(store.evict_expired(999_999), 0);
        assert_eq!(store.evict_expired(1_000_000), 1);
        assert!(store.is_empty());
        assert!(
            store
                .acquire_at(&p, &k, 1, 1_000_000)
                .expect("decided")
                .allowed
        );
    }

    #[test]
    fn a_denial_keeps_the_expiry_of_the_state() {
        let store = MemoryStore::new("rl", 100);
        let p = policy(Algorithm::TokenBucket, &[1, 1, 1_000]);
        let k = LimitKey::parse("k".into()).expect("valid");
        assert!(store.acquire_at(&p, &k, 1, 0).expect("decided").allowed);
        assert!(
            !store
                .acquire_at(&p, &k, 1, 500_000)
                .expect("decided")
                .allowed
        );
        assert_eq!(store.evict_expired(1_000_000), 1);
    }

    fn key(k: &str) -> LimitKey {
        LimitKey::parse(k.into()).expect("valid")
    }

    fn one_second_window() -> Policy {
        policy(Algorithm::FixedWindow, &[2, 1_000])
    }

    #[test]
    fn a_full_store_refuses_new_subjects_and_keeps_deciding_for_the_others() {
        let store = MemoryStore::new("rl", 2);
        let p = one_second_window();
        for k in ["a", "b"] {
            assert!(store.acquire_at(&p, &key(k), 1, 0).expect("room").allowed);
        }
        assert!(matches!(
            store.acquire_at(&p, &key("c"), 1, 10),
            Err(StoreError::Full(2))
        ));
        assert!(
            store
                .acquire_at(&p, &key("a"), 1, 20)
                .expect("has state")
                .allowed
        );
        assert!(
            !store
                .acquire_at(&p, &key("a"), 1, 30)
                .expect("has state")
                .allowed
        );
        assert_eq!(store.len(), 2);
    }

    #[test]
    fn a_full_store_frees_expired_state_before_refusing() {
        let store = MemoryStore::new("rl", 2);
        let p = one_second_window();
        let allowed = |k: &str, cost: u64, now: u64| {
            store
                .acquire_at(&p, &key(k), cost, now)
                .ok()
                .map(|d| d.allowed)
        };
        // `a` expires at 1 s, `b` and `c` at 2 s.
        assert_eq!(allowed("a", 1, 0), Some(true));
        assert_eq!(allowed("b", 1, 1_200_000), Some(true));
        // Full (`a` is not evicted yet): the sweep frees `a`, and `c` takes its slot.
        assert_eq!(allowed("c", 1, 1_300_000), Some(true));
        assert_eq!(store.len(), 2);
        assert!(matches!(
            store.acquire_at(&p, &key("d"), 1, 1_300_001),
            Err(StoreError::Full(_))
        ));
        // A subject whose own state expired reuses its slot.
        assert_eq!(allowed("b", 2, 2_000_000), Some(true));
        assert_eq!(store.len(), 2);
    }

    #[test]
    fn concurrent_new_subjects_never_pass_the_cap() {
        let store = MemoryStore::new("rl", 100);
        let p = one_second_window();
        let granted: usize = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..8)
                .map(|w| {
                    let (store, p) = (&store, &p);
                    scope.spawn(move || {
                        (0..50)
                            .filter(|i| {
                                store.acquire_at(p, &key(&format!("{w}-{i}")), 1, 0).is_ok()
                            })
                            .count()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().expect("worker")).sum()
        });
        assert_eq!(granted, 100);
        assert_eq!(store.len(), 100);
        assert_eq!(store.evict_expired(1_000_000), 100);
        assert!(store.is_empty());
    }
}
