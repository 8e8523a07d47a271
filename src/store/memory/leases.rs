//! The embedded store's leases: a subject's leases under a concurrency limit are one entry of
//! its shard, expiring with the last of them, and each policy's ledger is kept beside the
//! shards, under its own lock, taken after a shard's (see [`concurrency`]).

use std::sync::atomic::Ordering;

use super::{lock, system_now_us, Kept, MemoryStore, Slot};
use crate::limiter::concurrency::{self, LeaseAnswer, LeaseOp};
use crate::policy::Policy;
use crate::store::{key, LeasePlan, StoreError};

impl MemoryStore {
    /// Decides one lease call under one shard's lock, with the policy's ledger, as
    /// [`concurrency::decide`] does, at `now` (a time set by hand), or, when `None`, at the
    /// system clock read under the subject's lock: so calls on one subject see times in the
    /// order they hold it, and a denial never measures its wait from an instant before the take
    /// that filled the slot (which would answer a `retry_after` longer than any lease). The subject's leases are one entry, which expires with its last lease;
    /// only a take creates one, and fails with [`StoreError::Full`] as
    /// [`MemoryStore::acquire_at`] does.
    pub fn lease_at(
        &self,
        plan: &LeasePlan<'_>,
        now: Option<u64>,
    ) -> Result<LeaseAnswer, StoreError> {
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
        let now = now.unwrap_or_else(system_now_us);
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::concurrency::LeaseCall;
    use crate::policy::LimitKey;

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
            self.lease_at(&plan, Some(now))
        }
    }
    use crate::policy::{FailMode, PolicyName};

    fn key(k: &str) -> LimitKey {
        LimitKey::parse(k.into()).expect("valid")
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
}
