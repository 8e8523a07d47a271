//! Which master of a Redis Cluster owns each slot, so that each master has a circuit breaker of
//! its own: when one master fails, only the calls for the keys it owns are answered by their
//! policy's fail mode, and every other key is still decided by Redis.
//!
//! The map comes from `CLUSTER SLOTS`, read when the store opens and then every second (the
//! service's housekeeping), so a failover moves a slot's calls to the promoted replica's breaker
//! (a fresh, closed one) within about a second. A slot that the map does not know yet (before the
//! first read, or a range no master serves) is called through the store's own breaker, as on one
//! Redis. A slot is computed as Redis Cluster does: CRC16 (XMODEM) of the key's hash tag, modulo
//! 16,384.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use redis::Value;

use super::breaker::{Breaker, BreakerState};
use crate::store::key::hash_tag;

/// Slots in a Redis Cluster.
pub const SLOTS: usize = 16_384;

/// The slot of `key`, as Redis Cluster computes it.
pub fn key_slot(key: &str) -> u16 {
    let mut crc: u16 = 0;
    for byte in hash_tag(key).bytes() {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOTS as u16
}

/// Each slot's master, and each master's breaker.
#[derive(Default)]
struct Map {
    /// Index into `masters` per slot; `u16::MAX` where no master is known.
    owner: Vec<u16>,
    /// Each master's `host:port` and breaker.
    masters: Vec<(String, Arc<Breaker>)>,
}

/// The slot map and the breakers (see the module doc).
#[derive(Default)]
pub struct Topology {
    map: RwLock<Map>,
}

impl Topology {
    /// The breaker of the master that owns `key`'s slot, if the map knows it.
    pub fn breaker_for(&self, key: &str) -> Option<Arc<Breaker>> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        let owner = *map.owner.get(usize::from(key_slot(key)))?;
        map.masters
            .get(usize::from(owner))
            .map(|(_, breaker)| breaker.clone())
    }

    /// The breaker of the master at `address`, if the map has it.
    pub fn breaker_of(&self, address: &str) -> Option<Arc<Breaker>> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        map.masters
            .iter()
            .find(|(a, _)| a == address)
            .map(|(_, breaker)| breaker.clone())
    }

    /// The index of the master that owns `key`'s slot, if the map knows it: the same for every
    /// key of that master until the map changes.
    pub fn master_index(&self, key: &str) -> Option<usize> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        let owner = *map.owner.get(usize::from(key_slot(key)))?;
        (usize::from(owner) < map.masters.len()).then_some(usize::from(owner))
    }

    /// Replaces the map with `ranges` (`(first slot, last slot, master host:port)`), keeping the
    /// breaker of every master still in it; a new master gets a closed breaker like `template`.
    pub fn update(&self, ranges: &[(u16, u16, String)], template: &Breaker) {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        let old: HashMap<String, Arc<Breaker>> = map.masters.drain(..).collect();
        let mut owner = vec![u16::MAX; SLOTS];
        let mut masters: Vec<(String, Arc<Breaker>)> = Vec::new();
        for (first, last, address) in ranges {
            let index = match masters.iter().position(|(a, _)| a == address) {
                Some(i) => i,
                None => {
                    let breaker = old
                        .get(address)
                        .cloned()
                        .unwrap_or_else(|| Arc::new(template.like()));
                    masters.push((address.clone(), breaker));
                    masters.len() - 1
                }
            };
            let index = u16::try_from(index).unwrap_or(u16::MAX);
            let (first, last) = (usize::from(*first), usize::from(*last).min(SLOTS - 1));
            if let Some(range) = owner.get_mut(first..=last) {
                range.fill(index);
            }
        }
        *map = Map { owner, masters };
    }

    /// Gives every master a new closed breaker like `template` (the store's breaker settings
    /// changed).
    pub fn reset_breakers(&self, template: &Breaker) {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        for (_, breaker) in &mut map.masters {
            *breaker = Arc::new(template.like());
        }
    }

    /// Each master's address and breaker state.
    pub fn states(&self) -> Vec<(String, BreakerState)> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        map.masters
            .iter()
            .map(|(address, breaker)| (address.clone(), breaker.state()))
            .collect()
    }
}

/// `CLUSTER SLOTS`'s reply as `(first slot, last slot, master host:port)` ranges; `None` when it
/// is not that shape.
pub fn parse_slots(reply: &Value) -> Option<Vec<(u16, u16, String)>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    ranges
        .iter()
        .map(|range| {
            let Value::Array(fields) = range else {
                return None;
            };
            let slot = |v: &Value| match v {
                Value::Int(n) => u16::try_from(*n).ok(),
                _ => None,
            };
            let (first, last) = (slot(fields.first()?)?, slot(fields.get(1)?)?);
            let Value::Array(master) = fields.get(2)? else {
                return None;
            };
            let host = match master.first()? {
                Value::BulkString(b) => String::from_utf8(b.clone()).ok()?,
                Value::SimpleString(s) => s.clone(),
                _ => return None,
            };
            let Value::Int(port) = master.get(1)? else {
                return None;
            };
            Some((first, last, format!("{host}:{port}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn slots_are_redis_cluster_s() {
        // Values from Redis's own CLUSTER KEYSLOT.
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("123456789"), 12739);
        assert_eq!(
            key_slot("rl:{api:user-42}:token_bucket"),
            key_slot("api:user-42")
        );
        assert_eq!(key_slot("{}x"), key_slot("{}x"));
    }

    #[test]
    fn each_master_keeps_its_breaker_across_updates_and_a_new_one_gets_a_fresh_one() {
        let template = Breaker::new(1, Duration::from_secs(60));
        let topology = Topology::default();
        assert!(topology.breaker_for("foo").is_none(), "no map yet");
        let ranges = vec![
            (0, 8_191, "a:1".to_owned()),
            (8_192, 16_383, "b:2".to_owned()),
        ];
        topology.update(&ranges, &template);
        let b = topology.breaker_for("foo").expect("foo is on b");
        let permit = b.permit().expect("closed");
        b.record(permit, false);
        assert_eq!(b.state(), BreakerState::Open);
        // a's keys are untouched by b's failure.
        let a_key = (0..100)
            .map(|i| format!("k{i}"))
            .find(|k| key_slot(k) < 8_192)
            .expect("a key on a");
        let a = topology.breaker_for(&a_key).expect("on a");
        assert_eq!(a.state(), BreakerState::Closed);
        // b fails over to c: c's breaker is fresh; b's is kept while b still owns slots.
        let moved = vec![
            (0, 8_191, "a:1".to_owned()),
            (8_192, 12_000, "c:3".to_owned()),
            (12_001, 16_383, "b:2".to_owned()),
        ];
        topology.update(&moved, &template);
        assert_eq!(
            topology.breaker_for("foo").expect("foo on b").state(),
            BreakerState::Open
        );
        let states = topology.states();
        assert_eq!(states.len(), 3);
        assert!(states.contains(&("c:3".to_owned(), BreakerState::Closed)));
    }

    #[test]
    fn cluster_slots_replies_are_read_and_others_refused() {
        let master = |host: &str, port| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let reply = Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(5460),
            master("127.0.0.1", 7000),
            master("127.0.0.1", 7003),
        ])]);
        assert_eq!(
            parse_slots(&reply),
            Some(vec![(0, 5460, "127.0.0.1:7000".to_owned())])
        );
        assert_eq!(parse_slots(&Value::Int(1)), None);
    }
}
