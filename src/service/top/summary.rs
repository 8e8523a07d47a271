//! A bounded-memory heavy-hitters summary of one dimension of a policy's decisions:
//! Space-Saving (Metwally, Agrawal and El Abbadi, "Efficient Computation of Frequent and Top-k
//! Elements in Data Streams", ICDT 2005), weighted, so that a summary can be added into another
//! (the merge of Cafaro et al.'s parallel Space-Saving), which is how an instance's summary of a
//! second is folded into a minute's, here and in `lua/top.lua`.
//!
//! With capacity `k`: a subject already tracked gains the weight; a new one takes a free slot,
//! or evicts the subject with the smallest count and starts from that count plus its weight.
//! So the counts always add up to the total weight `N`, the smallest count is at most `N / k`,
//! every count overstates its subject by at most the largest count ever evicted (the `floor`),
//! and a subject that is not tracked has at most the floor. Adding summaries adds their bounds:
//! a summary's [`Summary::bound`] is its floor plus the bounds of every summary added into it
//! (`carried`), and every count it answers is within it of the subject's true count. A
//! subject whose true count is above the bound is always tracked.
//!
//! Memory is `k` slots, each holding its key; a slot keeps its key after a [`Summary::reset`]
//! (with a count of 0, evicted first and at no cost to the bound), so a subject seen every
//! second is recorded without allocating, and a key is copied only when it takes a slot.

use std::hash::{BuildHasher, RandomState};

use hashbrown::HashTable;

use crate::store::top::Tally;

/// One tracked subject.
#[derive(Debug, Clone)]
struct Slot {
    key: String,
    hash: u64,
    count: u64,
}

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct Summary {
    capacity: usize,
    /// Index into `slots`, by the key's hash.
    table: HashTable<u32>,
    slots: Vec<Slot>,
    total: u64,
    /// The largest count evicted.
    floor: u64,
    /// The bounds of the summaries added into this one.
    carried: u64,
    /// Subjects with a count evicted since the last reset.
    evicted: u64,
}

impl Summary {
    /// An empty summary of at most `capacity` subjects (at most `u32::MAX`).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.min(u32::MAX as usize),
            table: HashTable::new(),
            slots: Vec::new(),
            total: 0,
            floor: 0,
            carried: 0,
            evicted: 0,
        }
    }

    /// Counts `weight` decisions of the subject `key`, whose hash (by the hasher every summary
    /// that is added to this one uses) is `hash`.
    pub fn add(&mut self, hash: u64, key: &str, weight: u64) {
        if self.capacity == 0 || weight == 0 {
            return;
        }
        self.total = self.total.saturating_add(weight);
        let Self { table, slots, .. } = self;
        if let Some(&i) = table.find(hash, |&i| slots[i as usize].key == key) {
            let slot = &mut slots[i as usize];
            slot.count = slot.count.saturating_add(weight);
            return;
        }
        if slots.len() < self.capacity {
            let i = slots.len() as u32;
            slots.push(Slot {
                key: key.to_owned(),
                hash,
                count: weight,
            });
            table.insert_unique(hash, i, |&j| slots[j as usize].hash);
            return;
        }
        // Evict the smallest count: a zero (a slot kept from before a reset) ends the search.
        let (mut least, mut min) = (0, u64::MAX);
        for (i, s) in slots.iter().enumerate() {
            if s.count < min {
                (least, min) = (i, s.count);
                if min == 0 {
                    break;
                }
            }
        }
        let old = slots[least].hash;
        if let Ok(entry) = table.find_entry(old, |&j| j as usize == least) {
            entry.remove();
        }
        let slot = &mut slots[least];
        self.floor = self.floor.max(slot.count);
        self.evicted += u64::from(slot.count > 0);
        slot.key.clear();
        slot.key.push_str(key);
        slot.hash = hash;
        slot.count = slot.count.saturating_add(weight);
        table.insert_unique(hash, least as u32, |&j| slots[j as usize].hash);
    }

    /// Adds every count of `other` into this summary, and its bound to this one's.
    pub fn merge(&mut self, other: &Summary) {
        for s in other.slots.iter().filter(|s| s.count > 0) {
            self.add(s.hash, &s.key, s.count);
        }
        self.carried = self.carried.saturating_add(other.bound());
    }

    /// Every count is within this of its subject's true count; an untracked subject has at
    /// most this.
    pub fn bound(&self) -> u64 {
        self.floor.saturating_add(self.carried)
    }

    /// The decisions counted.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The count of `key`, 0 when untracked.
    pub fn count(&self, hash: u64, key: &str) -> u64 {
        self.table
            .find(hash, |&i| self.slots[i as usize].key == key)
            .map_or(0, |&i| self.slots[i as usize].count)
    }

    /// The tracked subjects with a count above 0, with their counts.
    pub fn entries(&self) -> impl Iterator<Item = (&str, u64)> {
        self.slots
            .iter()
            .filter(|s| s.count > 0)
            .map(|s| (s.key.as_str(), s.count))
    }

    /// The summary as the store takes it.
    pub fn tally(&self) -> Tally {
        Tally {
            total: self.total,
            bound: self.bound(),
            entries: self.entries().map(|(k, c)| (k.to_owned(), c)).collect(),
        }
    }

    /// Empties the summary, keeping its slots' keys (at a count of 0) for the subjects that
    /// come back.
    pub fn reset(&mut self) {
        for s in &mut self.slots {
            s.count = 0;
        }
        self.total = 0;
        self.floor = 0;
        self.carried = 0;
        self.evicted = 0;
    }

    /// Subjects with a count evicted since the last reset.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Whether nothing has been counted since the last reset.
    pub fn is_empty(&self) -> bool {
        self.total == 0 && self.carried == 0
    }

    /// The heap bytes the summary holds: its slots, their keys and the table.
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.slots.iter().map(|s| s.key.capacity()).sum::<usize>()
            + self.table.capacity() * (std::mem::size_of::<u32>() + 1)
    }
}

/// The hasher every summary of a process uses, so that summaries can be added together with the
/// hashes they hold.
#[derive(Debug, Default, Clone)]
pub struct KeyHasher(RandomState);

impl KeyHasher {
    pub fn hash(&self, key: &str) -> u64 {
        self.0.hash_one(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn feed(s: &mut Summary, h: &KeyHasher, stream: &[(String, u64)]) {
        for (k, w) in stream {
            s.add(h.hash(k), k, *w);
        }
    }

    fn truth(stream: &[(String, u64)]) -> HashMap<String, u64> {
        let mut t = HashMap::new();
        for (k, w) in stream {
            *t.entry(k.clone()).or_default() += w;
        }
        t
    }

    /// Every subject's count (0 when untracked) is within the bound of its true count.
    fn within_bound(s: &Summary, h: &KeyHasher, truth: &HashMap<String, u64>) {
        for (k, &t) in truth {
            let c = s.count(h.hash(k), k);
            assert!(
                c.abs_diff(t) <= s.bound(),
                "{k}: {c} vs {t}, bound {}",
                s.bound()
            );
        }
        assert_eq!(s.total(), truth.values().sum::<u64>());
        assert_eq!(s.entries().map(|(_, c)| c).sum::<u64>(), s.total());
    }

    #[test]
    fn below_capacity_the_counts_are_exact() {
        let h = KeyHasher::default();
        let mut s = Summary::new(4);
        let stream: Vec<(String, u64)> = ["a", "b", "a", "c", "a"]
            .iter()
            .map(|k| (k.to_string(), 1))
            .collect();
        feed(&mut s, &h, &stream);
        assert_eq!(s.bound(), 0);
        assert_eq!(s.count(h.hash("a"), "a"), 3);
        assert_eq!(s.count(h.hash("z"), "z"), 0);
    }

    #[test]
    fn a_flooding_subject_stays_tracked_among_many_trickling_ones() {
        let h = KeyHasher::default();
        let mut s = Summary::new(16);
        for i in 0..10_000u64 {
            let k = if i % 3 == 0 {
                "flood".to_owned()
            } else {
                format!("t{i}")
            };
            s.add(h.hash(&k), &k, 1);
        }
        let c = s.count(h.hash("flood"), "flood");
        assert!(c >= 3_334 && c <= 3_334 + s.bound());
        assert!(s.bound() <= s.total() / 16);
    }

    #[test]
    fn a_reset_keeps_the_keys_but_no_count_and_evicting_them_costs_nothing() {
        let h = KeyHasher::default();
        let mut s = Summary::new(2);
        for k in ["a", "b"] {
            s.add(h.hash(k), k, 5);
        }
        s.reset();
        assert!(s.is_empty());
        assert_eq!(s.entries().count(), 0);
        for k in ["c", "a"] {
            s.add(h.hash(k), k, 1);
        }
        assert_eq!(s.bound(), 0);
        assert_eq!(s.count(h.hash("a"), "a"), 1);
        assert_eq!(s.count(h.hash("c"), "c"), 1);
    }

    proptest! {
        #[test]
        fn counts_stay_within_the_bound(
            stream in proptest::collection::vec(("[a-p]", 1u64..5), 0..300),
            cap in 1usize..10,
        ) {
            let stream: Vec<(String, u64)> = stream;
            let h = KeyHasher::default();
            let mut s = Summary::new(cap);
            feed(&mut s, &h, &stream);
            within_bound(&s, &h, &truth(&stream));
            prop_assert!(s.bound() <= s.total() / cap as u64);
        }

        #[test]
        fn merged_summaries_stay_within_the_sum_of_their_bounds(
            parts in proptest::collection::vec(
                proptest::collection::vec(("[a-p]", 1u64..5), 0..100), 1..6),
            cap in 1usize..8,
        ) {
            let h = KeyHasher::default();
            let mut merged = Summary::new(cap);
            let mut all = Vec::new();
            let mut part = Summary::new(cap);
            for p in &parts {
                part.reset();
                feed(&mut part, &h, p);
                merged.merge(&part);
                all.extend(p.iter().cloned());
            }
            within_bound(&merged, &h, &truth(&all));
        }
    }
}
