//! The embedded store's joint acquires: several subjects decided as one step, all or nothing,
//! under the locks of every shard they are in, each with its queue of reservations.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use super::{lock, put_back, queued, take_out, MemoryStore, Slot};
use crate::limiter::reservation::decide_joint_queued;
use crate::limiter::{State, Verdict};
use crate::store::{key, Plan, StoreError};

impl MemoryStore {
    /// Decides a joint acquire at an explicit time ([`crate::store::Store::acquire_joint`]), under the locks of
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
        // Each limit's shard, as an index into `shards`, and its subject (an index into `plans`).
        let mut homes = Vec::new();
        let mut subjects = Vec::new();
        for (j, plan) in plans.iter().enumerate() {
            let (keys, n) = key::state_keys(&self.prefix, plan.policy, plan.key);
            let home = self.shard_index(plan.policy.name.as_str(), plan.key.as_str());
            for (name, p) in keys.into_iter().zip(plan.params).take(n) {
                names.push(name);
                params.push(*p);
                costs.push(plan.cost());
                homes.push(home);
                subjects.push(j);
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
        // Each subject's queue, once anything was booked on this store (none: no limit has one).
        let mut queues = Vec::new();
        if self.booked.load(Ordering::Relaxed) {
            let mut name = String::new();
            let of_subjects: Vec<Option<u64>> = plans
                .iter()
                .map(|plan| {
                    let (policy, subject) = (plan.policy.name.as_str(), plan.key.as_str());
                    name.clear();
                    key::queue_key(&mut name, &self.prefix, policy, subject);
                    queued(&shards[at(self.shard_index(policy, subject))], &name, now)
                })
                .collect();
            queues.extend(subjects.iter().map(|j| of_subjects[*j]));
        }
        let mut ttls = vec![None; n];
        let (allowed, decisions) =
            decide_joint_queued(&params, &mut states, &mut ttls, &costs, now, &queues);
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
}
