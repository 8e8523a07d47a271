//! The embedded store's policy set: the same rules as `lua/policy_write.lua` and
//! `lua/policy_read.lua` (versions, deletions remembered up to a floor, seeding once, the cap,
//! preconditions), in process memory, so that the service above cannot tell the stores apart.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::{new_generation, Change, ChangePage, Etag, PolicyWrite, Precondition, WriteKind};
use super::{WriteStatus, Written};
use crate::policy::{Policy, PolicyName};

/// Deletions remembered, as in `policy_write.lua`.
const MAX_DELETED: usize = 10_000;

#[derive(Debug)]
pub struct PolicySet {
    generation: Arc<str>,
    version: u64,
    floor: u64,
    live: HashMap<PolicyName, (Policy, u64)>,
    /// Deleted names by the version of their deletion, and the reverse.
    deleted: BTreeMap<u64, PolicyName>,
    deleted_at: HashMap<PolicyName, u64>,
    seeded: HashSet<PolicyName>,
}

impl Default for PolicySet {
    fn default() -> Self {
        Self {
            generation: new_generation().into(),
            version: 0,
            floor: 0,
            live: HashMap::new(),
            deleted: BTreeMap::new(),
            deleted_at: HashMap::new(),
            seeded: HashSet::new(),
        }
    }
}

impl PolicySet {
    fn etag(&self, version: u64) -> Etag {
        Etag {
            generation: self.generation.clone(),
            version,
        }
    }

    pub fn write(&mut self, w: PolicyWrite<'_>) -> Written {
        let current = self.live.get(w.name).map(|(_, v)| *v);
        let generation = self.generation.clone();
        let done = |status, version| Written {
            status,
            etag: Etag {
                generation: generation.clone(),
                version,
            },
            incarnation: 0,
        };
        if w.kind == WriteKind::Probe {
            return done(WriteStatus::Probed, self.version);
        }
        let refuse = |status| done(status, current.unwrap_or(0));
        match w.precondition {
            Precondition::None => {}
            Precondition::Absent if current.is_some() => {
                return refuse(WriteStatus::PreconditionFailed)
            }
            Precondition::Absent => {}
            Precondition::Exists if current.is_none() => {
                return refuse(WriteStatus::PreconditionFailed)
            }
            Precondition::Exists => {}
            Precondition::Matches(etag) => {
                if current.is_none_or(|v| *etag != format!("{generation}.{v}")) {
                    return refuse(WriteStatus::PreconditionFailed);
                }
            }
        }
        match (w.kind, current) {
            (WriteKind::Delete, None) => return refuse(WriteStatus::Missing),
            (WriteKind::Delete, Some(_)) => {
                self.live.remove(w.name);
                self.version += 1;
                self.deleted.insert(self.version, w.name.clone());
                self.deleted_at.insert(w.name.clone(), self.version);
                if self.deleted.len() > MAX_DELETED {
                    if let Some((v, name)) = self.deleted.pop_first() {
                        self.deleted_at.remove(&name);
                        self.floor = v;
                    }
                }
                return done(WriteStatus::Deleted, self.version);
            }
            (WriteKind::Seed, _) if current.is_some() || self.seeded.contains(w.name) => {
                return refuse(WriteStatus::Exists)
            }
            (WriteKind::Create, Some(_)) => return refuse(WriteStatus::Exists),
            _ => {}
        }
        let Some(policy) = w.policy else {
            return refuse(WriteStatus::Missing);
        };
        if current.is_none() && self.live.len() as u64 >= w.max_policies {
            return refuse(WriteStatus::Full);
        }
        if w.kind == WriteKind::Seed {
            self.seeded.insert(w.name.clone());
        }
        self.version += 1;
        self.live
            .insert(w.name.clone(), (policy.clone(), self.version));
        if let Some(v) = self.deleted_at.remove(w.name) {
            self.deleted.remove(&v);
        }
        let status = match current {
            Some(_) => WriteStatus::Replaced,
            None => WriteStatus::Created,
        };
        done(status, self.version)
    }

    pub fn changes(&self, since: u64, max: usize) -> ChangePage {
        let mut changes: Vec<Change> = Vec::new();
        if since < self.version {
            changes.extend(self.live.iter().filter(|(_, (_, v))| *v > since).map(
                |(name, (policy, v))| Change {
                    name: name.to_string(),
                    version: *v,
                    policy: Some(policy.clone()),
                },
            ));
            changes.extend(self.deleted.range(since + 1..).map(|(v, name)| Change {
                name: name.to_string(),
                version: *v,
                policy: None,
            }));
            changes.sort_unstable_by_key(|c| c.version);
            changes.truncate(max);
        }
        ChangePage {
            generation: Some(self.generation.clone()),
            version: self.version,
            floor: self.floor,
            changes,
        }
    }

    pub fn read(&self, name: &PolicyName) -> Option<(Policy, Etag)> {
        self.live.get(name).map(|(p, v)| (p.clone(), self.etag(*v)))
    }
}
