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

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use super::policy_set::PolicySet;
use super::{key, ChangePage, Etag, LeasePlan, Plan, PolicyWrite, Store, StoreError, Written};
use crate::limiter::concurrency::{self, LeaseAnswer, LeaseOp};
use crate::limiter::{decide_joint, decide_op, State, Verdict, MAX_LIMITS};
use crate::metrics as m;
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
    /// under one lock ([`decide_op`]; a refund's ticket record is read and written under the
    /// same lock).
    /// Only an acquire, a report or a refund's first use of a ticket may need new entries, and
    /// fail with [`StoreError::Full`] as [`MemoryStore::acquire_at`] does.
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
        let verdict = decide_op(
            params,
            &mut states[..n],
            &mut ttls[..n],
            op,
            cost,
            now,
            marks,
        );
        let mut kept = 0;
        for (i, name) in names.iter_mut().enumerate() {
            let expiry = ttls[i].map_or(expires[i], |ttl| now.saturating_add(ttl));
            kept += put_back(&mut shard, name, states[i].take(), expiry, now);
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

    /// Decides a joint acquire at an explicit time ([`Store::acquire_joint`]), under the locks of
    /// every shard its subjects are in, taken in shard order so that two joint acquires can
    /// never each hold a lock the other waits for. Fails with [`StoreError::Full`] as [`MemoryStore::acquire_at`] does.
    pub fn acquire_joint_at(
        &self,
        plans: &[Plan<'_>],
        now: u64,
    ) -> Result<Vec<Verdict>, StoreError> {
        let mut names: Vec<String> = Vec::new();
        let mut params = Vec::new();
        let mut costs = Vec::new();
        // Each limit's shard, as an index into `shards`.
        let mut homes = Vec::new();
        for plan in plans {
            let (keys, n) = key::state_keys(&self.prefix, plan.policy, plan.key);
            let home = self.shard_index(plan.policy.name.as_str(), plan.key.as_str());
            for (name, p) in keys.into_iter().zip(plan.params).take(n) {
                names.push(name);
                params.push(*p);
                costs.push(plan.cost());
                homes.push(home);
            }
        }
        let mut order = homes.clone();
        order.sort_unstable();
        order.dedup();
        let lock_all = || -> Vec<MutexGuard<'_, HashMap<String, Slot>>> {
            order.iter().map(|i| lock(&self.shards[*i])).collect()
        };
        let at = |home: usize| order.binary_search(&home).unwrap_or(0);
        let mut shards = lock_all();
        let missing = |shards: &[MutexGuard<'_, HashMap<String, Slot>>]| -> u64 {
            names
                .iter()
                .zip(&homes)
                .filter(|(n, h)| !shards[at(**h)].contains_key(n.as_str()))
                .count() as u64
        };
        let mut reserved = self.reserve_count(missing(&shards));
        if reserved.is_none() {
            // The sweep locks every shard: these must be released first.
            drop(shards);
            self.sweep_when_full(now);
            shards = lock_all();
            reserved = self.reserve_count(missing(&shards));
        }
        let reserved = reserved.ok_or_else(|| self.refuse())?;
        let n = names.len();
        let mut states: Vec<Option<State>> = (0..n).map(|_| None).collect();
        let mut expires = vec![0; n];
        let mut taken_out = 0;
        for (i, name) in names.iter().enumerate() {
            let shard = &mut shards[at(homes[i])];
            taken_out += take_out(shard, name, now, &mut states[i], &mut expires[i]);
        }
        let mut ttls = vec![None; n];
        let (allowed, decisions) = decide_joint(&params, &mut states, &mut ttls, &costs, now);
        let mut kept = 0;
        for (i, name) in names.iter_mut().enumerate() {
            let expiry = ttls[i].map_or(expires[i], |ttl| now.saturating_add(ttl));
            kept += put_back(
                &mut shards[at(homes[i])],
                name,
                states[i].take(),
                expiry,
                now,
            );
        }
        self.subjects
            .fetch_sub(taken_out + reserved - kept, Ordering::Relaxed);
        let mut decisions = decisions.into_iter();
        Ok(plans
            .iter()
            .map(|plan| {
                let mut verdict = Verdict::at(now);
                for d in decisions.by_ref().take(plan.params.len()) {
                    verdict.push(d);
                }
                verdict.allowed = allowed;
                verdict
            })
            .collect())
    }

    /// Decides one lease call at an explicit time under one shard's lock, with the policy's
    /// ledger, as [`concurrency::decide`] does (the service's `local` fail mode calls it with
    /// its own clock). The subject's leases are one entry, which expires with its last lease;
    /// only a take creates one, and fails with [`StoreError::Full`] as
    /// [`MemoryStore::acquire_at`] does.
    pub fn lease_at(&self, plan: &LeasePlan<'_>, now: u64) -> Result<LeaseAnswer, StoreError> {
        let LeasePlan {
            policy,
            key,
            call,
            at_us: _,
        } = *plan;
        if let Some(problem) = call.problem() {
            return Err(StoreError::server(format!("refused lease call: {problem}")));
        }
        if call.op == LeaseOp::Sweep {
            return Err(StoreError::server(
                "refused lease call: a sweep names no subject",
            ));
        }
        let (policy, incarnation) = (policy.name.as_str(), policy.incarnation());
        let mut name = String::new();
        key::lease_key(&mut name, &self.prefix, policy, incarnation, key.as_str());
        let ledger_name = (policy.to_owned(), incarnation);
        let shard_lock = self.shard(policy, key.as_str());
        let mut shard = lock(shard_lock);
        // An entry whose expiry has passed holds only expired leases: absent, as the Redis key
        // would be.
        if call.op == LeaseOp::Look {
            let leases = match shard.get(&name) {
                Some(Slot {
                    state: Kept::Leases(state),
                    expires_at_us,
                }) if *expires_at_us > now => Some(state),
                _ => None,
            };
            let ledgers = lock(&self.ledgers);
            let empty = concurrency::Ledger::default();
            let ledger = ledgers.get(&ledger_name).unwrap_or(&empty);
            return Ok(concurrency::look(leases, ledger, &call, now));
        }
        // Only a take can create an entry: it takes a slot first, as an acquire does.
        let mut reserved = 0;
        if call.op == LeaseOp::Take {
            let names = std::slice::from_ref(&name);
            reserved = match self.reserve(&shard, names) {
                Some(r) => r,
                None => {
                    drop(shard);
                    self.sweep_when_full(now);
                    shard = lock(shard_lock);
                    self.reserve(&shard, names).ok_or_else(|| self.refuse())?
                }
            };
        }
        let mut taken_out = 0;
        let mut state = None;
        let mut expires_at_us = 0;
        if let Some(slot) = shard.remove(&name) {
            taken_out = 1;
            if let (true, Kept::Leases(leases)) = (slot.expires_at_us > now, slot.state) {
                state = Some(leases);
                expires_at_us = slot.expires_at_us;
            }
        }
        let (state, answer, ttl) = {
            let mut ledgers = lock(&self.ledgers);
            let ledger = ledgers.entry(ledger_name.clone()).or_default();
            let decided = concurrency::decide(state, ledger, &call, now);
            if ledger.is_empty() {
                ledgers.remove(&ledger_name);
            }
            decided
        };
        let mut kept = 0;
        if let Some(state) = state {
            let expires_at_us = ttl.map_or(expires_at_us, |ttl| now.saturating_add(ttl));
            shard.insert(
                name,
                Slot {
                    state: Kept::Leases(state),
                    expires_at_us,
                },
            );
            kept = 1;
        }
        self.subjects
            .fetch_sub(taken_out + reserved - kept, Ordering::Relaxed);
        Ok(answer)
    }

    /// Sweeps a concurrency policy's ledger at an explicit time, as [`concurrency::sweep`]
    /// does.
    pub fn sweep_leases_at(&self, policy: &Policy, now: u64) -> LeaseAnswer {
        let ledger_name = (policy.name.as_str().to_owned(), policy.incarnation());
        let mut ledgers = lock(&self.ledgers);
        let Some(ledger) = ledgers.get_mut(&ledger_name) else {
            return concurrency::sweep(&mut concurrency::Ledger::default(), now);
        };
        let answer = concurrency::sweep(ledger, now);
        if ledger.is_empty() {
            ledgers.remove(&ledger_name);
        }
        answer
    }

    /// Deletes the subject's state for every limit of the policy; returns how many limits had
    /// state.
    pub fn clear(&self, policy: &Policy, key: &LimitKey) -> usize {
        let (names, n) = key::state_keys(&self.prefix, policy, key);
        let mut shard = lock(self.shard(policy.name.as_str(), key.as_str()));
        let removed = names[..n]
            .iter()
            .filter(|name| shard.remove(name.as_str()).is_some())
            .count();
        self.subjects.fetch_sub(removed as u64, Ordering::Relaxed);
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
        self.lease_at(plan, plan.at_us.unwrap_or_else(system_now_us))
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

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::concurrency::LeaseCall;
    use crate::policy::{Algorithm, FailMode};

    impl MemoryStore {
        fn lease_on(
            &self,
            policy: &Policy,
            key: &LimitKey,
            call: LeaseCall<'_>,
            now: u64,
        ) -> Result<LeaseAnswer, StoreError> {
            let plan = LeasePlan {
                policy,
                key,
                call,
                at_us: None,
            };
            self.lease_at(&plan, now)
        }
    }

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

    fn lease(op: LeaseOp, member: &str, cost: u64) -> LeaseCall<'_> {
        LeaseCall {
            op,
            member,
            cost,
            lease_us: 1_000_000,
            limit: 2,
            deadline_us: None,
        }
    }

    fn member(n: u8) -> String {
        format!("{n:032x}:1")
    }

    /// A concurrency policy `c` of incarnation 1.
    fn c() -> Policy {
        let name = PolicyName::parse("c").expect("valid");
        let params = concurrency::Params {
            limit: 2,
            lease_us: 1_000_000,
            max_lease_us: 1_000_000,
        };
        Policy::concurrent(name, params, None, FailMode::Closed).with_incarnation(1)
    }

    #[test]
    fn the_ledger_counts_an_expiry_whose_subject_expired_with_it_once() {
        let store = MemoryStore::new("rl", 100);
        let (k, a) = (key("k"), member(1));
        let took = store
            .lease_on(&c(), &k, lease(LeaseOp::Take, &a, 1), 0)
            .expect("room");
        assert_eq!((took.ok, took.leases), (true, 1));
        // The subject's entry goes with its lease; the ledger still counts the expiry, once.
        assert_eq!(store.evict_expired(1_000_000), 1);
        assert_eq!(store.sweep_leases_at(&c(), 999_999).leases, 1);
        let swept = store.sweep_leases_at(&c(), 1_000_000);
        assert_eq!((swept.expired, swept.leases), (1, 0));
        assert_eq!(store.sweep_leases_at(&c(), 2_000_000).expired, 0);
        // A ledger no sweep reaches goes a grace after its last lease.
        let took = store
            .lease_on(&c(), &k, lease(LeaseOp::Take, &a, 1), 0)
            .expect("room");
        assert_eq!(took.leases, 1);
        let grace = concurrency::LEDGER_GRACE_MS * 1_000;
        store.evict_expired(1_000_000 + grace - 1);
        assert_eq!(lock(&store.ledgers).len(), 1);
        store.evict_expired(1_000_000 + grace);
        assert!(lock(&store.ledgers).is_empty());
    }

    #[test]
    fn a_policy_created_again_does_not_know_its_predecessor_s_leases() {
        let store = MemoryStore::new("rl", 100);
        let (k, a) = (key("k"), member(1));
        let full = |p: &Policy| {
            store
                .lease_on(p, &k, lease(LeaseOp::Take, &member(2), 1), 0)
                .expect("room")
        };
        assert!(
            store
                .lease_on(&c(), &k, lease(LeaseOp::Take, &a, 1), 0)
                .expect("room")
                .ok
        );
        let again = c().with_incarnation(2);
        let renewed = store
            .lease_on(&again, &k, lease(LeaseOp::Renew, &a, 1), 10)
            .expect("decided");
        assert_eq!((renewed.ok, renewed.leases), (false, 0));
        assert_eq!(full(&again).in_use, 1);
        assert_eq!(full(&c()).in_use, 2);
    }

    #[test]
    fn leases_are_one_entry_that_expires_with_the_last_lease() {
        let store = MemoryStore::new("rl", 100);
        let k = key("k");
        let (a, b) = (member(1), member(2));
        let take = |m: &str, now| store.lease_on(&c(), &k, lease(LeaseOp::Take, m, 1), now);
        assert!(take(&a, 0).expect("room").ok);
        assert!(take(&b, 500_000).expect("room").ok);
        assert!(!take(&member(3), 600_000).expect("decided").ok);
        assert_eq!(store.len(), 1);
        // a's lease ends at 1 s, b's at 1.5 s: the entry lives until b's.
        assert_eq!(store.evict_expired(1_499_999), 0);
        let look = store
            .lease_on(&c(), &k, lease(LeaseOp::Look, "", 2), 1_200_000)
            .expect("decided");
        assert_eq!(
            (look.ok, look.in_use, look.retry_after_us),
            (false, 1, 300_000)
        );
        assert_eq!(store.evict_expired(1_500_000), 1);
        assert!(store.is_empty());
    }

    #[test]
    fn releasing_the_last_lease_frees_the_entry_and_a_look_takes_none() {
        let store = MemoryStore::new("rl", 1);
        let (k, a) = (key("k"), member(1));
        let look = store
            .lease_on(&c(), &k, lease(LeaseOp::Look, "", 1), 0)
            .expect("decided");
        assert!(look.ok);
        assert!(store.is_empty());
        assert!(
            store
                .lease_on(&c(), &k, lease(LeaseOp::Take, &a, 1), 0)
                .expect("room")
                .ok
        );
        // Full: another subject's take is refused, its look and release still answered.
        let other = key("other");
        assert!(matches!(
            store.lease_on(&c(), &other, lease(LeaseOp::Take, &a, 1), 0),
            Err(StoreError::Full(1))
        ));
        assert!(
            !store
                .lease_on(&c(), &other, lease(LeaseOp::Release, &a, 1), 0)
                .expect("decided")
                .ok
        );
        let released = store
            .lease_on(&c(), &k, lease(LeaseOp::Release, &a, 1), 10)
            .expect("decided");
        assert!(released.ok);
        assert!(store.is_empty());
        assert!(
            store
                .lease_on(&c(), &other, lease(LeaseOp::Take, &a, 1), 20)
                .expect("room")
                .ok
        );
    }

    #[test]
    fn a_lease_call_the_script_could_not_read_back_is_refused() {
        let store = MemoryStore::new("rl", 10);
        let wrong_cost = lease(LeaseOp::Take, "0123456789abcdef0123456789abcdef:2", 1);
        assert!(store.lease_on(&c(), &key("k"), wrong_cost, 0).is_err());
        assert!(store.is_empty());
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
