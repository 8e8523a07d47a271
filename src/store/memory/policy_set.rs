//! The embedded store's policy set: the same rules as `lua/policy_write.lua` and
//! `lua/policy_read.lua` (versions, deletions remembered up to a floor, seeding once, the cap,
//! preconditions, descriptor shapes claimed by one policy each, a new incarnation when a policy
//! changes kind), in process memory, so that the service above cannot tell the stores apart.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use crate::policy::overrides::{Override, OverrideId};
use crate::policy::{Policy, PolicyName};
use crate::store::overrides::{
    self as ov, OverrideOp, OverrideStatus, OverrideWrite, OverrideWritten,
};
use crate::store::{
    new_generation, Change, ChangePage, Entry, Etag, PolicyWrite, Precondition, WriteKind,
};
use crate::store::{WriteStatus, Written};

/// Deletions remembered, as in `policy_write.lua`.
const MAX_DELETED: usize = 10_000;

/// One policy's overrides: by id (with the version of each one's last write), and the id of each
/// match, for the refusal of a second override of the same match.
#[derive(Debug, Default)]
struct Overrides {
    by_id: HashMap<OverrideId, (Override, u64)>,
    matches: HashMap<String, OverrideId>,
    exact: u64,
    patterns: u64,
}

impl Overrides {
    fn count(&mut self, m: &crate::policy::overrides::Match, by: i64) {
        let n = if ov::class(m) == "exact" {
            &mut self.exact
        } else {
            &mut self.patterns
        };
        *n = n.saturating_add_signed(by);
    }

    fn counted(&self, m: &crate::policy::overrides::Match) -> u64 {
        if ov::class(m) == "exact" {
            self.exact
        } else {
            self.patterns
        }
    }
}

/// Whether `precondition` holds for an entry at version `current` (`None`: absent) of the store's
/// `generation`, as the scripts check it.
fn holds(precondition: &Precondition, current: Option<u64>, generation: &str) -> bool {
    match precondition {
        Precondition::None => true,
        Precondition::Absent => current.is_none(),
        Precondition::Exists => current.is_some(),
        Precondition::Matches(etag) => {
            current.is_some_and(|v| *etag == format!("{generation}.{v}"))
        }
    }
}

#[derive(Debug)]
pub struct PolicySet {
    generation: Arc<str>,
    version: u64,
    floor: u64,
    /// Live policies, each carrying its incarnation, and the version of its last write.
    live: HashMap<PolicyName, (Policy, u64)>,
    /// Deleted names (a policy's, or an override's `<policy>/<id>`) by the version of their
    /// deletion, and the reverse.
    deleted: BTreeMap<u64, String>,
    deleted_at: HashMap<String, u64>,
    /// Each policy's overrides, as `lua/override_write.lua` keeps them.
    overrides: HashMap<PolicyName, Overrides>,
    /// Live overrides by the version of their last write.
    override_log: BTreeMap<u64, (PolicyName, OverrideId)>,
    seeded: HashSet<PolicyName>,
    /// Descriptor shape -> the live policy that claims it.
    shapes: HashMap<String, PolicyName>,
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
            overrides: HashMap::new(),
            override_log: BTreeMap::new(),
            seeded: HashSet::new(),
            shapes: HashMap::new(),
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
            claimed_by: None,
        };
        if w.kind == WriteKind::Probe {
            return done(WriteStatus::Probed, self.version);
        }
        let refuse = |status| done(status, current.unwrap_or(0));
        if !holds(w.precondition, current, &generation) {
            return refuse(WriteStatus::PreconditionFailed);
        }
        match (w.kind, current) {
            (WriteKind::Delete, None) => return refuse(WriteStatus::Missing),
            (WriteKind::Delete, Some(_)) => {
                if let Some((old, _)) = self.live.remove(w.name) {
                    self.release(old.shape(), w.name);
                }
                self.drop_overrides(w.name);
                self.version += 1;
                self.remember_deleted(w.name.to_string());
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
        let old = self.live.get(w.name).map(|(p, _)| p);
        let old_shape = old.and_then(Policy::shape);
        let shape = policy.shape();
        // As in `policy_write.lua`: the first policy written with a shape claims it, and one
        // keeping its own shape is never refused.
        if let Some(shape) = shape.as_ref().filter(|s| old_shape.as_ref() != Some(*s)) {
            if let Some(owner) = self.shapes.get(shape).filter(|o| *o != w.name) {
                return Written {
                    claimed_by: Some(owner.to_string()),
                    ..refuse(WriteStatus::Claimed)
                };
            }
        }
        if w.kind == WriteKind::Seed {
            self.seeded.insert(w.name.clone());
        }
        self.version += 1;
        // A replacement keeps the incarnation of the policy it replaces unless it changes the
        // policy's kind; a creation's is its version, as in `policy_write.lua`.
        let (status, incarnation) = match old {
            Some(old) if old.kind_name() == policy.kind_name() => {
                (WriteStatus::Replaced, old.incarnation())
            }
            Some(_) => (WriteStatus::Replaced, self.version),
            None => (WriteStatus::Created, self.version),
        };
        if old.is_some_and(|o| o.kind_name() != policy.kind_name()) {
            // A new incarnation of another kind has none of the old one's overrides.
            self.drop_overrides(w.name);
        }
        if old_shape != shape {
            self.release(old_shape, w.name);
        }
        if let Some(shape) = shape {
            self.shapes.insert(shape, w.name.clone());
        }
        let policy = policy.clone().with_incarnation(incarnation);
        self.live.insert(w.name.clone(), (policy, self.version));
        if let Some(v) = self.deleted_at.remove(w.name.as_str()) {
            self.deleted.remove(&v);
        }
        Written {
            incarnation,
            ..done(status, self.version)
        }
    }

    /// Records the deletion of `name` at the current version, forgetting the oldest beyond
    /// [`MAX_DELETED`].
    fn remember_deleted(&mut self, name: String) {
        self.deleted.insert(self.version, name.clone());
        self.deleted_at.insert(name, self.version);
        if self.deleted.len() > MAX_DELETED {
            if let Some((v, name)) = self.deleted.pop_first() {
                self.deleted_at.remove(&name);
                self.floor = v;
            }
        }
    }

    /// Deletes every override of the policy `name`, without a deletion each in the log: the
    /// policy's deletion or change of kind is what every instance applies them with.
    fn drop_overrides(&mut self, name: &PolicyName) {
        if let Some(gone) = self.overrides.remove(name) {
            for (_, v) in gone.by_id.values() {
                self.override_log.remove(v);
            }
        }
    }

    /// Writes one override, as `lua/override_write.lua` does.
    pub fn write_override(&mut self, w: OverrideWrite<'_>) -> OverrideWritten {
        let member = ov::member(w.policy.as_str(), w.id.as_str());
        let current = self
            .overrides
            .get(w.policy)
            .and_then(|o| o.by_id.get(w.id))
            .map(|(_, v)| *v);
        let generation = self.generation.clone();
        let answer = |status, version, other: Option<&OverrideId>| OverrideWritten {
            status,
            etag: Etag {
                generation: generation.clone(),
                version,
            },
            other: other.map(|o| o.to_string()),
        };
        let refuse = |status| answer(status, current.unwrap_or(0), None);
        let policy_version = match self.live.get(w.policy) {
            Some((p, v)) if p.rate().is_some() => *v,
            _ => return refuse(OverrideStatus::NoPolicy),
        };
        if !holds(w.precondition, current, &generation) {
            return refuse(OverrideStatus::PreconditionFailed);
        }
        match (w.op, current) {
            (OverrideOp::Create, Some(_)) => return refuse(OverrideStatus::Exists),
            (OverrideOp::Replace | OverrideOp::Delete, None) => {
                return refuse(OverrideStatus::Missing)
            }
            _ => {}
        }
        if w.op == OverrideOp::Delete {
            let set = self.overrides.entry(w.policy.clone()).or_default();
            if let Some((old, v)) = set.by_id.remove(w.id) {
                set.matches.remove(&ov::canonical(&old.matches));
                set.count(&old.matches, -1);
                self.override_log.remove(&v);
            }
            self.version += 1;
            self.remember_deleted(member);
            return answer(OverrideStatus::Deleted, self.version, None);
        }
        let Some(doc) = w.doc else {
            return refuse(OverrideStatus::Missing);
        };
        if w.policy_version != policy_version {
            return refuse(OverrideStatus::PolicyChanged);
        }
        let set = self.overrides.entry(w.policy.clone()).or_default();
        let canonical = ov::canonical(&doc.matches);
        let old = set.by_id.get(w.id).map(|(o, _)| o.matches.clone());
        if let Some(other) = set.matches.get(&canonical).filter(|o| *o != w.id) {
            let other = *other;
            return answer(OverrideStatus::Conflict, current.unwrap_or(0), Some(&other));
        }
        let same_class = old
            .as_ref()
            .is_some_and(|o| ov::class(o) == ov::class(&doc.matches));
        if !same_class && set.counted(&doc.matches) >= w.caps.of(&doc.matches) {
            return refuse(OverrideStatus::Full);
        }
        if let Some(old) = &old {
            set.matches.remove(&ov::canonical(old));
            set.count(old, -1);
        }
        set.matches.insert(canonical, *w.id);
        set.count(&doc.matches, 1);
        self.version += 1;
        if let Some((_, v)) = set.by_id.insert(*w.id, (doc.clone(), self.version)) {
            self.override_log.remove(&v);
        }
        self.override_log
            .insert(self.version, (w.policy.clone(), *w.id));
        if let Some(v) = self.deleted_at.remove(&member) {
            self.deleted.remove(&v);
        }
        let status = if current.is_some() {
            OverrideStatus::Replaced
        } else {
            OverrideStatus::Created
        };
        answer(status, self.version, None)
    }

    pub fn read_override(&self, policy: &PolicyName, id: &OverrideId) -> Option<(Override, Etag)> {
        let (o, v) = self.overrides.get(policy)?.by_id.get(id)?;
        Some((o.clone(), self.etag(*v)))
    }

    /// Gives up `name`'s claim on `shape`, if it holds it.
    fn release(&mut self, shape: Option<String>, name: &PolicyName) {
        if let Some(shape) = shape {
            if self.shapes.get(&shape) == Some(name) {
                self.shapes.remove(&shape);
            }
        }
    }

    pub fn changes(&self, since: u64, max: usize) -> ChangePage {
        let mut changes: Vec<Change> = Vec::new();
        if since < self.version {
            changes.extend(self.live.iter().filter(|(_, (_, v))| *v > since).map(
                |(name, (policy, v))| Change {
                    name: name.to_string(),
                    version: *v,
                    entry: Some(Entry::Policy(policy.clone())),
                },
            ));
            changes.extend(self.deleted.range(since + 1..).map(|(v, name)| Change {
                name: name.clone(),
                version: *v,
                entry: None,
            }));
            let overrides = self.override_log.range(since + 1..).take(max);
            changes.extend(overrides.filter_map(|(v, (policy, id))| {
                let (o, _) = self.overrides.get(policy)?.by_id.get(id)?;
                Some(Change {
                    name: ov::member(policy.as_str(), id.as_str()),
                    version: *v,
                    entry: Some(Entry::Override(o.clone())),
                })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Algorithm, FailMode};

    fn name(n: &str) -> PolicyName {
        PolicyName::parse(n).expect("valid")
    }

    fn policy(n: &str, limit: u64) -> Policy {
        Policy::single(
            name(n),
            Algorithm::FixedWindow,
            &[limit, 1_000],
            None,
            FailMode::Open,
        )
    }

    fn write(set: &mut PolicySet, kind: WriteKind, p: &Policy) -> Written {
        set.write(PolicyWrite {
            kind,
            name: &p.name,
            policy: (kind != WriteKind::Delete).then_some(p),
            precondition: &Precondition::None,
            max_policies: 10,
            seen: None,
        })
    }

    /// The incarnation `read` and `changes` hand out for `n`.
    fn incarnations(set: &PolicySet, n: &str) -> (Option<u64>, Option<u64>) {
        let read = set.read(&name(n)).map(|(p, _)| p.incarnation());
        let changed = set
            .changes(0, 100)
            .changes
            .into_iter()
            .find(|c| c.name == n)
            .and_then(|c| c.policy().cloned())
            .map(|p| p.incarnation());
        (read, changed)
    }

    #[test]
    fn a_policy_carries_the_version_of_the_write_that_created_it() {
        let mut set = PolicySet::default();
        write(&mut set, WriteKind::Create, &policy("other", 1));
        let created = write(&mut set, WriteKind::Create, &policy("p", 1));
        assert_eq!(created.status, WriteStatus::Created);
        assert_eq!(created.incarnation, created.etag.version);
        assert_eq!(created.incarnation, 2);
        assert_eq!(incarnations(&set, "p"), (Some(2), Some(2)));

        let replaced = write(&mut set, WriteKind::Put, &policy("p", 2));
        assert_eq!(replaced.status, WriteStatus::Replaced);
        assert_eq!((replaced.etag.version, replaced.incarnation), (3, 2));
        assert_eq!(incarnations(&set, "p"), (Some(2), Some(2)));
        assert_eq!(set.read(&name("p")).map(|(p, _)| p), Some(policy("p", 2)));

        let deleted = write(&mut set, WriteKind::Delete, &policy("p", 2));
        assert_eq!(
            (deleted.status, deleted.incarnation),
            (WriteStatus::Deleted, 0)
        );
        assert_eq!(incarnations(&set, "p"), (None, None));

        let again = write(&mut set, WriteKind::Put, &policy("p", 3));
        assert_eq!(again.status, WriteStatus::Created);
        assert_eq!((again.etag.version, again.incarnation), (5, 5));
        assert_eq!(incarnations(&set, "p"), (Some(5), Some(5)));
    }

    #[test]
    fn a_seed_creates_an_incarnation_and_refusals_and_probes_carry_none() {
        let mut set = PolicySet::default();
        let seeded = write(&mut set, WriteKind::Seed, &policy("p", 1));
        assert_eq!(
            (seeded.status, seeded.incarnation),
            (WriteStatus::Created, 1)
        );
        assert_eq!(incarnations(&set, "p"), (Some(1), Some(1)));
        for kind in [WriteKind::Create, WriteKind::Seed, WriteKind::Probe] {
            let refused = write(&mut set, kind, &policy("p", 2));
            assert_ne!(refused.status, WriteStatus::Created, "{kind:?}");
            assert_eq!(refused.incarnation, 0, "{kind:?}");
        }
        let missing = write(&mut set, WriteKind::Delete, &policy("q", 1));
        assert_eq!(
            (missing.status, missing.incarnation),
            (WriteStatus::Missing, 0)
        );
        let failed = set.write(PolicyWrite {
            kind: WriteKind::Put,
            name: &name("p"),
            policy: Some(&policy("p", 2)),
            precondition: &Precondition::Absent,
            max_policies: 10,
            seen: None,
        });
        assert_eq!(
            (failed.status, failed.incarnation),
            (WriteStatus::PreconditionFailed, 0)
        );
        assert_eq!(incarnations(&set, "p"), (Some(1), Some(1)), "unchanged");
    }

    fn over(id: &str, m: serde_json::Value) -> Override {
        use crate::policy::overrides::{Match, Sets};
        Override {
            id: OverrideId::parse(id).expect("id"),
            matches: Match::parse(&m).expect("match"),
            sets: Sets::Block,
            expires_at_us: None,
            reason: None,
            created_at_us: 0,
        }
    }

    fn write_over(
        set: &mut PolicySet,
        op: OverrideOp,
        policy_version: u64,
        o: &Override,
    ) -> OverrideWritten {
        set.write_override(OverrideWrite {
            op,
            policy: &name("p"),
            policy_version,
            id: &o.id,
            doc: (op != OverrideOp::Delete).then_some(o),
            precondition: &Precondition::None,
            caps: ov::OverrideCaps {
                exact: 2,
                patterns: 1,
            },
        })
    }

    #[test]
    fn overrides_share_the_log_and_go_with_their_policy() {
        use serde_json::json;
        let mut set = PolicySet::default();
        let a = over("000000000000000a", json!({"key": "k"}));
        assert_eq!(
            write_over(&mut set, OverrideOp::Create, 1, &a).status,
            OverrideStatus::NoPolicy
        );
        write(&mut set, WriteKind::Create, &policy("p", 1));
        assert_eq!(
            write_over(&mut set, OverrideOp::Create, 0, &a).status,
            OverrideStatus::PolicyChanged,
            "checked against another version of the policy"
        );
        let created = write_over(&mut set, OverrideOp::Create, 1, &a);
        assert_eq!(
            (created.status, created.etag.version),
            (OverrideStatus::Created, 2)
        );
        let same = over("000000000000000b", json!({"key": "k"}));
        let refused = write_over(&mut set, OverrideOp::Create, 1, &same);
        assert_eq!(
            (refused.status, refused.other.as_deref()),
            (OverrideStatus::Conflict, Some("000000000000000a"))
        );
        let b = over("000000000000000b", json!({"prefix": "x"}));
        assert_eq!(
            write_over(&mut set, OverrideOp::Create, 1, &b).status,
            OverrideStatus::Created
        );
        let c = over("000000000000000c", json!({"cidr": "10.0.0.0/8"}));
        assert_eq!(
            write_over(&mut set, OverrideOp::Create, 1, &c).status,
            OverrideStatus::Full
        );
        // The log holds the policy and both overrides, in version order.
        let page = set.changes(0, 100);
        let names: Vec<&str> = page.changes.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["p", "p/000000000000000a", "p/000000000000000b"]);
        // The cap counts policies only.
        for i in 0..9 {
            write(&mut set, WriteKind::Create, &policy(&format!("q{i}"), 1));
        }
        assert_eq!(set.live.len(), 10);
        // Deleting the policy deletes them, without a deletion each in the log.
        write(&mut set, WriteKind::Delete, &policy("p", 1));
        assert_eq!(set.read_override(&name("p"), &a.id), None);
        let since = set.changes(3, 100);
        assert!(
            since.changes.iter().all(|c| !c.is_override()),
            "{:?}",
            since.changes
        );
        write(&mut set, WriteKind::Create, &policy("p", 1));
        let v = set.read(&name("p")).map(|(_, e)| e.version).unwrap_or(0);
        assert_eq!(
            write_over(&mut set, OverrideOp::Create, v, &same).status,
            OverrideStatus::Created
        );
        let deleted = write_over(&mut set, OverrideOp::Delete, 0, &same);
        assert_eq!(deleted.status, OverrideStatus::Deleted);
        let last = set.changes(deleted.etag.version - 1, 10);
        assert_eq!(
            last.changes
                .iter()
                .map(|c| (c.name.as_str(), c.entry.is_none()))
                .collect::<Vec<_>>(),
            [("p/000000000000000b", true)]
        );
    }
}
