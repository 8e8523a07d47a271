//! The in-process copy of every policy, read on every acquire, and the rules that keep it from
//! ever going back in time.
//!
//! The cache follows the store's change log: it knows the store's `generation` (which changes
//! when the store loses its data) and `applied`, the version up to which every change has been
//! applied. Each entry carries the version of the change that wrote it. A change is applied only
//! when it is newer than both `applied` and the entry it would replace, so a slow answer (a write
//! made through this instance, a page read before a newer one) never replaces newer knowledge.
//! A deletion this instance made ahead of `applied` is kept as a tombstone until the change log
//! has caught up with it, and a full reload keeps what this instance wrote while its pages were
//! being read.
//!
//! Reads take a shared lock for one hash lookup and three reference-count increments (the
//! policy, its generation, and its decision counters, which so need no lock of their own).

mod overrides;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

pub use self::overrides::{Applied, Effect, PolicyOverrides};
use super::counters::Counted;
use crate::policy::overrides::OverrideId;
use crate::policy::Policy;
use crate::store::overrides::parse_member;
use crate::store::{Change, Entry as Item, Etag};

/// What the cache holds for one name.
#[derive(Debug, Clone)]
struct Entry {
    /// `None`: deleted at `version` (a tombstone).
    policy: Option<Arc<Policy>>,
    version: u64,
    /// The policy's decision counters, so that a decision takes this one lock, not a second.
    counters: Counted,
    /// The policy's entry of `Inner::override_epochs`, kept here too so that a decision reads it
    /// with the policy, without a second lookup.
    override_epoch: u64,
}

/// A policy as this instance enforces it: the policy, the ETag of its version, and its decision
/// counters.
#[derive(Debug, Clone)]
pub struct Found {
    pub policy: Arc<Policy>,
    pub etag: Etag,
    pub(super) counters: Counted,
    /// The version of the newest change to the policy's overrides (0: none), which the denial
    /// cache keys the policy's subjects by beside the policy's own.
    pub overrides_changed: u64,
    /// The override of the subject, when it was looked up with the policy under the same lock
    /// ([`PolicyCache::get_for`]): `Some(None)` when none applies; `None` when not looked up.
    pub(super) applied: Option<Option<Arc<Applied>>>,
}

#[derive(Debug, Default)]
pub struct PolicyCache {
    inner: RwLock<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// `None` before the first load.
    generation: Option<Arc<str>>,
    applied: u64,
    entries: HashMap<Arc<str>, Entry>,
    /// Names whose entry is a tombstone, with its version.
    tombstones: HashMap<Arc<str>, u64>,
    /// Entries that hold a policy.
    live: usize,
    /// The live policies that serve Envoy descriptors, by `Descriptor::index_key` (domain and
    /// entry keys), in no order.
    descriptors: HashMap<String, Vec<Arc<Policy>>>,
    /// Each policy's overrides, by policy name; a policy without any has no entry.
    overrides: HashMap<Arc<str>, PolicyOverrides>,
    /// The version of the newest change to each policy's overrides, kept when they are all
    /// deleted (so that the denial cache never goes back to a version it keyed denials by
    /// before them) and dropped with the policy.
    override_epochs: HashMap<Arc<str>, u64>,
}

/// Where the cache stands in the store's change log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    pub generation: Option<Arc<str>>,
    pub applied: u64,
}

impl Inner {
    /// Applies one change of the log (a policy's or an override's) newer than `applied`.
    fn apply_change(&mut self, name: &str, version: u64, item: Option<Item>) {
        match (parse_member(name), item) {
            (Some((policy, id)), Some(Item::Override(o))) => {
                self.apply_override(policy, id, version, Some(o))
            }
            (Some((policy, id)), None) => self.apply_override(policy, id, version, None),
            (None, Some(Item::Policy(p))) => self.apply(name, version, Some(p)),
            (None, None) => self.apply(name, version, None),
            // A name of one kind holding the other: not written by any store.
            (_, Some(_)) => {}
        }
    }

    /// Applies one override change, unless the override's entry is newer still.
    fn apply_override(
        &mut self,
        policy: &str,
        id: &str,
        version: u64,
        over: Option<crate::policy::overrides::Override>,
    ) {
        let Some(id) = OverrideId::parse(id) else {
            return;
        };
        let live = self.entries.get(policy).and_then(|e| e.policy.clone());
        let deleted = over.is_none();
        let epoch = self.override_epochs.entry(Arc::from(policy)).or_default();
        *epoch = (*epoch).max(version);
        let epoch = *epoch;
        if let Some(e) = self.entries.get_mut(policy) {
            e.override_epoch = epoch;
        }
        let set = self.overrides.entry(Arc::from(policy)).or_default();
        if set.apply(id, version, over, live.as_deref()) && deleted {
            if version > self.applied {
                let member = crate::store::overrides::member(policy, id.as_str());
                self.tombstones.insert(Arc::from(member), version);
            } else {
                set.forget(&id, version);
            }
        }
        if set.is_empty() {
            self.overrides.remove(policy);
        }
    }

    /// Applies one policy change newer than `applied`, unless the entry is newer still.
    fn apply(&mut self, name: &str, version: u64, policy: Option<Policy>) {
        if let Some(e) = self.entries.get(name) {
            if e.version >= version {
                return;
            }
        }
        let owned: Arc<str> = Arc::from(name);
        self.tombstones.remove(&owned);
        let policy = policy.map(Arc::new);
        let old = match &policy {
            Some(p) => self.entries.insert(
                owned,
                Entry {
                    policy: Some(p.clone()),
                    version,
                    counters: Counted::default(),
                    override_epoch: self.override_epochs.get(name).copied().unwrap_or(0),
                },
            ),
            None if version > self.applied => {
                self.tombstones.insert(owned.clone(), version);
                self.entries.insert(
                    owned,
                    Entry {
                        policy: None,
                        version,
                        counters: Counted::default(),
                        override_epoch: 0,
                    },
                )
            }
            // Known deleted up to `applied`: nothing older can be applied any more, so no
            // tombstone is needed.
            None => self.entries.remove(&owned),
        };
        let old = old.and_then(|e| e.policy);
        self.live = self.live - usize::from(old.is_some()) + usize::from(policy.is_some());
        // A deleted policy's overrides went with it, and so did those of a policy that came back
        // as another incarnation (of another kind); a replaced one's are compiled again.
        match (&old, &policy) {
            (Some(o), Some(p)) if o.incarnation() == p.incarnation() => {
                if let Some(set) = self.overrides.get_mut(name) {
                    set.rebuild(p);
                }
            }
            (None, Some(p)) => {
                if let Some(set) = self.overrides.get_mut(name) {
                    set.rebuild(p);
                }
            }
            _ => {
                self.overrides.remove(name);
                self.override_epochs.remove(name);
            }
        }
        if let Some((old, d)) = old.as_ref().and_then(|o| Some((o, o.descriptor()?))) {
            let index = d.index_key();
            if let Some(list) = self.descriptors.get_mut(&index) {
                list.retain(|p| !Arc::ptr_eq(p, old));
                if list.is_empty() {
                    self.descriptors.remove(&index);
                }
            }
        }
        if let Some((p, d)) = policy.as_ref().and_then(|p| Some((p, p.descriptor()?))) {
            self.descriptors
                .entry(d.index_key())
                .or_default()
                .push(p.clone());
        }
    }

    /// Moves `applied` forward and drops the tombstones it has caught up with.
    fn advance(&mut self, applied: u64) {
        self.applied = self.applied.max(applied);
        let applied = self.applied;
        let entries = &mut self.entries;
        let overrides = &mut self.overrides;
        self.tombstones.retain(|name, version| {
            if *version > applied {
                return true;
            }
            if let Some((policy, id)) = parse_member(name) {
                if let (Some(set), Some(id)) = (overrides.get_mut(policy), OverrideId::parse(id)) {
                    set.forget(&id, *version);
                    if set.is_empty() {
                        overrides.remove(policy);
                    }
                }
                return false;
            }
            if entries
                .get(name)
                .is_some_and(|e| e.policy.is_none() && e.version <= applied)
            {
                entries.remove(name);
            }
            false
        });
    }
}

impl PolicyCache {
    /// The policy and the ETag of the version this instance enforces.
    pub fn get(&self, name: &str) -> Option<Found> {
        let inner = self.read();
        let entry = inner.entries.get(name)?;
        let policy = entry.policy.clone()?;
        let generation = inner.generation.clone()?;
        Some(Found {
            policy,
            etag: Etag {
                generation,
                version: entry.version,
            },
            counters: entry.counters.clone(),
            overrides_changed: entry.override_epoch,
            applied: None,
        })
    }

    /// The policy serving an Envoy descriptor of `domain` with these `(key, value)` entries, and
    /// its ETag: among the policies of the domain with exactly these keys in order whose fixed
    /// values the descriptor has, the most specific (`Descriptor::more_specific_than`; by name
    /// between equals, which validation keeps from existing).
    pub fn for_descriptor(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Found> {
        let index = crate::policy::descriptor::index_key(domain, entries.iter().map(|e| e.0));
        let inner = self.read();
        let candidates = inner.descriptors.get(&index)?;
        // The most specific wins; between shapes neither beats (validation keeps two such from
        // both serving), the first by name, so every instance picks the same.
        let best = candidates
            .iter()
            .filter_map(|p| Some((p, p.descriptor()?)))
            .filter(|(_, d)| d.matches(entries.iter().map(|e| e.1)))
            .reduce(|best, next| {
                let wins = next.1.more_specific_than(best.1)
                    || (!best.1.more_specific_than(next.1) && next.0.name < best.0.name);
                if wins {
                    next
                } else {
                    best
                }
            })
            .map(|(p, _)| p);
        let policy = best?.clone();
        let entry = inner.entries.get(policy.name.as_str())?;
        let generation = inner.generation.clone()?;
        let changed = entry.override_epoch;
        Some(Found {
            policy,
            etag: Etag {
                generation,
                version: entry.version,
            },
            counters: entry.counters.clone(),
            overrides_changed: changed,
            applied: None,
        })
    }

    /// The name of a live policy, other than one of `policy`'s name, that serves the same
    /// descriptor shape as `policy` (`Descriptor::shape`), if any.
    pub fn shape_claimed_by(&self, policy: &Policy) -> Option<String> {
        let d = policy.descriptor()?;
        let shape = d.shape();
        let inner = self.read();
        inner
            .descriptors
            .get(&d.index_key())?
            .iter()
            .find(|p| p.name != policy.name && p.descriptor().is_some_and(|o| o.shape() == shape))
            .map(|p| p.name.to_string())
    }

    pub fn position(&self) -> Position {
        let inner = self.read();
        Position {
            generation: inner.generation.clone(),
            applied: inner.applied,
        }
    }

    /// Whether the first load has happened.
    pub fn is_loaded(&self) -> bool {
        self.read().generation.is_some()
    }

    /// Every live policy with its version, sorted by name.
    pub fn list(&self) -> Vec<(Arc<Policy>, u64)> {
        let mut all: Vec<(Arc<Policy>, u64)> = self
            .read()
            .entries
            .values()
            .filter_map(|e| e.policy.clone().map(|p| (p, e.version)))
            .collect();
        all.sort_unstable_by(|a, b| a.0.name.cmp(&b.0.name));
        all
    }

    /// The live policies that `keep` accepts, in no order: for housekeeping that visits a few
    /// kinds of policy every second, without copying and sorting them all as [`PolicyCache::list`]
    /// does.
    pub fn filtered(&self, keep: impl Fn(&Policy) -> bool) -> Vec<Arc<Policy>> {
        self.read()
            .entries
            .values()
            .filter_map(|e| e.policy.as_ref().filter(|p| keep(p)).cloned())
            .collect()
    }

    /// Live policies.
    pub fn len(&self) -> usize {
        self.read().live
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Applies a change this instance made itself, as the store answered it. Ignored when it
    /// belongs to another generation or the change log has already been applied past it.
    pub fn apply_own(&self, etag: &Etag, name: &str, policy: Option<Policy>) {
        let mut inner = self.write();
        if inner.generation.as_deref() != Some(&*etag.generation) || etag.version <= inner.applied {
            return;
        }
        inner.apply(name, etag.version, policy);
    }

    /// Applies an override change this instance made itself, as the store answered it; ignored
    /// as [`PolicyCache::apply_own`] ignores a policy change.
    pub fn apply_own_override(
        &self,
        etag: &Etag,
        policy: &str,
        id: &OverrideId,
        over: Option<crate::policy::overrides::Override>,
    ) {
        let mut inner = self.write();
        if inner.generation.as_deref() != Some(&*etag.generation) || etag.version <= inner.applied {
            return;
        }
        inner.apply_override(policy, id.as_str(), etag.version, over);
    }

    /// The policy and the override that applies to its subject `key` at `now_us`, if any
    /// ([`Found::applied`]): under one lock, as [`PolicyCache::get`] (a second lock per decision
    /// is a second write to the lock's shared counter, which the cores then pass between them).
    pub fn get_for(&self, name: &str, key: &str, now_us: u64) -> Option<Found> {
        let inner = self.read();
        let entry = inner.entries.get(name)?;
        let policy = entry.policy.clone()?;
        let generation = inner.generation.clone()?;
        // A policy that never had overrides costs no second lookup.
        let applied = (entry.override_epoch > 0)
            .then(|| inner.overrides.get(name)?.find(key, now_us).cloned())
            .flatten();
        Some(Found {
            policy,
            etag: Etag {
                generation,
                version: entry.version,
            },
            counters: entry.counters.clone(),
            overrides_changed: entry.override_epoch,
            applied: Some(applied),
        })
    }

    /// The override of the policy named `name` that applies to its subject `key` at `now_us`.
    pub fn override_for(&self, name: &str, key: &str, now_us: u64) -> Option<Arc<Applied>> {
        self.read().overrides.get(name)?.find(key, now_us).cloned()
    }

    /// Overrides expired by `now_us`, at most `max` over every policy: each with its policy's
    /// name and its ETag.
    pub fn expired_overrides(
        &self,
        now_us: u64,
        max: usize,
    ) -> Vec<(Arc<str>, Arc<crate::policy::overrides::Override>, Etag)> {
        let inner = self.read();
        let Some(generation) = inner.generation.clone() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (policy, set) in &inner.overrides {
            if out.len() >= max {
                break;
            }
            for (o, version) in set.expired(now_us, max - out.len()) {
                let etag = Etag {
                    generation: generation.clone(),
                    version,
                };
                out.push((policy.clone(), o, etag));
            }
        }
        out
    }

    /// Runs `f` on the policy's overrides (none: `f(None)`).
    pub fn with_overrides<T>(
        &self,
        policy: &str,
        f: impl FnOnce(Option<&PolicyOverrides>) -> T,
    ) -> T {
        let inner = self.read();
        f(inner.overrides.get(policy))
    }

    /// Applies one page of the change log, read after `applied`, and moves `applied` to
    /// `upto` (the version of its last change, or the store's version when the page was the
    /// last one). Ignored when the generation is not the cache's.
    pub fn apply_page(&self, generation: &str, changes: Vec<Change>, upto: u64) {
        let mut inner = self.write();
        if inner.generation.as_deref() != Some(generation) {
            return;
        }
        for c in changes {
            if c.version > inner.applied {
                inner.apply_change(&c.name, c.version, c.entry);
            }
        }
        inner.advance(upto);
    }

    /// Replaces everything with a full load of `generation`, complete up to `applied`.
    pub fn replace_all(&self, generation: Arc<str>, policies: Vec<Change>, applied: u64) {
        let mut fresh = Inner {
            generation: Some(generation.clone()),
            applied,
            ..Inner::default()
        };
        // Policies first, so that each override is compiled against its policy as it arrives.
        let (policies, overrides): (Vec<Change>, Vec<Change>) = policies
            .into_iter()
            .filter(|c| c.entry.is_some())
            .partition(|c| !c.is_override());
        for c in policies.into_iter().chain(overrides) {
            fresh.apply_change(&c.name, c.version, c.entry);
        }
        let mut inner = self.write();
        // Changes this instance made itself while the pages were being read are newer than
        // the load: keep them. (Its own override writes meanwhile are in the log: the next
        // refresh applies them.)
        if inner.generation.as_deref() == Some(&*generation) {
            for (name, e) in inner.entries.drain().filter(|(_, e)| e.version > applied) {
                fresh.apply(&name, e.version, e.policy.map(|p| (*p).clone()));
            }
        }
        *inner = fresh;
    }

    // A poisoned lock only means a writer panicked between two whole-entry assignments: the
    // map itself is always consistent, so keep serving it.
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Algorithm, FailMode, PolicyName};

    fn policy(limit: u64) -> Policy {
        Policy::single(
            PolicyName::parse("p").expect("valid"),
            Algorithm::FixedWindow,
            &[limit, 1_000],
            None,
            FailMode::Open,
        )
    }

    fn change(version: u64, limit: Option<u64>) -> Change {
        Change {
            name: "p".into(),
            version,
            entry: limit.map(|l| Item::Policy(policy(l))),
        }
    }

    fn etag(version: u64) -> Etag {
        Etag {
            generation: "g".into(),
            version,
        }
    }

    fn limit(cache: &PolicyCache) -> Option<u64> {
        cache.get("p").map(|f| f.policy.params()[0].quota())
    }

    #[test]
    fn an_older_answer_never_replaces_a_newer_one() {
        let cache = PolicyCache::default();
        cache.replace_all("g".into(), vec![change(1, Some(1))], 1);
        cache.apply_page("g", vec![change(3, Some(3))], 3);
        // This instance's own write at version 2 answers late.
        cache.apply_own(&etag(2), "p", Some(policy(2)));
        assert_eq!(limit(&cache), Some(3));
        assert_eq!(cache.get("p").map(|f| f.etag.version), Some(3));
    }

    #[test]
    fn an_own_deletion_is_not_undone_by_a_page_read_before_it() {
        let cache = PolicyCache::default();
        cache.replace_all("g".into(), vec![change(1, Some(1))], 1);
        cache.apply_own(&etag(3), "p", None);
        assert_eq!(limit(&cache), None);
        // A page read before the deletion carries a replacement at version 2.
        cache.apply_page("g", vec![change(2, Some(2))], 2);
        assert_eq!(limit(&cache), None, "the tombstone holds");
        cache.apply_page("g", vec![change(3, None)], 3);
        assert_eq!(limit(&cache), None);
        assert_eq!(cache.len(), 0);
        assert!(
            cache.read().tombstones.is_empty(),
            "tombstone dropped once applied"
        );
    }

    #[test]
    fn a_name_deleted_recreated_and_deleted_again_counts_and_holds() {
        let cache = PolicyCache::default();
        cache.replace_all("g".into(), vec![change(1, Some(1))], 1);
        // All through this instance, before its next refresh.
        cache.apply_own(&etag(2), "p", None);
        cache.apply_own(&etag(3), "p", Some(policy(3)));
        assert_eq!(cache.len(), 1);
        cache.apply_own(&etag(4), "p", None);
        assert_eq!(cache.len(), 0);
        // A page read before the last deletion catches up to version 3 only.
        cache.apply_page("g", vec![change(2, None), change(3, Some(3))], 3);
        assert_eq!(limit(&cache), None, "the newer deletion holds");
        assert_eq!(cache.len(), 0);
        cache.apply_page("g", vec![change(4, None)], 4);
        assert_eq!((limit(&cache), cache.len()), (None, 0));
    }

    #[test]
    fn a_full_reload_keeps_what_this_instance_wrote_meanwhile() {
        let cache = PolicyCache::default();
        cache.replace_all("g".into(), vec![change(1, Some(1))], 1);
        // Written through this instance while a reload read its pages up to version 5.
        cache.apply_own(&etag(6), "p", Some(policy(6)));
        cache.replace_all("g".into(), vec![change(5, Some(5))], 5);
        assert_eq!(limit(&cache), Some(6));
        // Of another generation (the store lost its data), nothing is kept.
        cache.replace_all("h".into(), vec![], 0);
        assert_eq!(limit(&cache), None);
    }

    #[test]
    fn changes_of_another_generation_are_ignored() {
        let cache = PolicyCache::default();
        cache.replace_all("g".into(), vec![change(5, Some(5))], 5);
        cache.apply_page("other", vec![change(6, None)], 6);
        cache.apply_own(
            &Etag {
                generation: "other".into(),
                version: 7,
            },
            "p",
            None,
        );
        assert_eq!(limit(&cache), Some(5));
        assert_eq!(cache.position().applied, 5);
    }

    fn over(id: &str, key: &str, tier: &str) -> crate::policy::overrides::Override {
        use crate::policy::overrides::{Match, Override, OverrideId, Sets};
        Override {
            id: OverrideId::parse(id).expect("id"),
            matches: Match::Key(crate::policy::LimitKey::parse(key.to_owned()).expect("key")),
            sets: Sets::Tier(PolicyName::parse(tier).expect("tier")),
            expires_at_us: None,
            reason: None,
            created_at_us: 0,
        }
    }

    fn tiered(version: u64) -> Change {
        let p = crate::policy::parse_policy(
            &serde_json::json!({"name": "p", "algorithm": "fixed_window", "limit": 1, "window_ms": 1000,
                                "tiers": {"a": {"p": {"limit": 10}}, "b": {"p": {"limit": 20}}}}),
            None,
        )
        .expect("valid");
        Change {
            name: "p".into(),
            version,
            entry: Some(Item::Policy(p)),
        }
    }

    fn over_change(
        version: u64,
        id: &str,
        o: Option<crate::policy::overrides::Override>,
    ) -> Change {
        Change {
            name: format!("p/{id}"),
            version,
            entry: o.map(Item::Override),
        }
    }

    const A: &str = "000000000000000a";
    const B: &str = "000000000000000b";

    /// The quota the override of `key` gives, if one applies.
    fn quota_for(cache: &PolicyCache, key: &str) -> Option<u64> {
        let a = cache.override_for("p", key, 0)?;
        a.effect.limits().map(|limits| limits.params()[0].quota())
    }

    #[test]
    fn overrides_follow_the_log_and_their_policy() {
        let cache = PolicyCache::default();
        // A full load lists an override before its policy's later replacement: both apply.
        cache.replace_all(
            "g".into(),
            vec![over_change(2, A, Some(over(A, "k", "a"))), tiered(3)],
            3,
        );
        assert_eq!(quota_for(&cache, "k"), Some(10));
        assert_eq!(cache.get("p").map(|f| f.overrides_changed), Some(2));
        // Replaced through the log: the newer wins, an older page changes nothing.
        cache.apply_page("g", vec![over_change(4, A, Some(over(A, "k", "b")))], 4);
        cache.apply_own_override(&etag(3), "p", &id(A), Some(over(A, "k", "a")));
        assert_eq!(quota_for(&cache, "k"), Some(20));
        // Deleting the policy deletes its overrides; a new policy of the name has none.
        cache.apply_page("g", vec![change(5, None)], 5);
        cache.apply_page("g", vec![tiered(6)], 6);
        assert_eq!(quota_for(&cache, "k"), None);
        assert_eq!(cache.get("p").map(|f| f.overrides_changed), Some(0));
    }

    fn id(s: &str) -> crate::policy::overrides::OverrideId {
        crate::policy::overrides::OverrideId::parse(s).expect("id")
    }

    #[test]
    fn an_own_deletion_holds_against_a_page_read_before_it() {
        let cache = PolicyCache::default();
        cache.replace_all(
            "g".into(),
            vec![tiered(1), over_change(2, A, Some(over(A, "k", "a")))],
            2,
        );
        cache.apply_own_override(&etag(3), "p", &id(A), None);
        assert_eq!(quota_for(&cache, "k"), None);
        // A page read before the deletion still carries the override.
        cache.apply_page("g", vec![over_change(2, A, Some(over(A, "k", "b")))], 2);
        assert_eq!(quota_for(&cache, "k"), None, "the tombstone holds");
        cache.apply_page("g", vec![over_change(3, A, None)], 3);
        assert!(cache.read().tombstones.is_empty(), "dropped once applied");
        assert!(
            cache.read().overrides.is_empty(),
            "nothing left of the policy's overrides"
        );
    }

    /// A tiered policy `p` created by the write of version `born`.
    fn born(version: u64, born: u64) -> Policy {
        match tiered(version).entry {
            Some(Item::Policy(p)) => p.with_incarnation(born),
            _ => unreachable!("tiered() holds a policy"),
        }
    }

    #[test]
    fn a_page_read_before_a_deletion_brings_no_override_back_to_the_recreated_policy() {
        // The page arrives after the recreation.
        let cache = PolicyCache::default();
        cache.replace_all("g".into(), vec![tiered(1)], 1);
        cache.apply_own_override(&etag(2), "p", &id(A), Some(over(A, "k", "a")));
        cache.apply_own(&etag(3), "p", None);
        cache.apply_own(&etag(4), "p", Some(born(4, 4)));
        cache.apply_page("g", vec![over_change(2, A, Some(over(A, "k", "a")))], 2);
        assert_eq!(
            quota_for(&cache, "k"),
            None,
            "A belonged to the deleted policy"
        );
        assert!(!cache.with_overrides("p", |s| s.is_some()));
        // The page arrives between the deletion and the recreation.
        let cache = PolicyCache::default();
        cache.replace_all("g".into(), vec![tiered(1)], 1);
        cache.apply_own_override(&etag(2), "p", &id(A), Some(over(A, "k", "a")));
        cache.apply_own(&etag(3), "p", None);
        cache.apply_page("g", vec![over_change(2, A, Some(over(A, "k", "a")))], 2);
        cache.apply_own(&etag(4), "p", Some(born(4, 4)));
        assert_eq!(
            quota_for(&cache, "k"),
            None,
            "A belonged to the deleted policy"
        );
        // An override written after the recreation applies.
        cache.apply_own_override(&etag(5), "p", &id(B), Some(over(B, "k", "b")));
        assert_eq!(quota_for(&cache, "k"), Some(20));
    }

    #[test]
    fn an_own_write_of_a_match_applied_before_the_deletion_it_followed_wins() {
        let cache = PolicyCache::default();
        cache.replace_all(
            "g".into(),
            vec![tiered(1), over_change(2, A, Some(over(A, "k", "a")))],
            2,
        );
        // Another instance deleted A at 3; this one then wrote B, of the same match, at 4, and
        // applies its own write before the log brings the deletion.
        cache.apply_own_override(&etag(4), "p", &id(B), Some(over(B, "k", "b")));
        assert_eq!(quota_for(&cache, "k"), Some(20));
        cache.apply_page(
            "g",
            vec![
                over_change(3, A, None),
                over_change(4, B, Some(over(B, "k", "b"))),
            ],
            4,
        );
        assert_eq!(quota_for(&cache, "k"), Some(20));
        // The other way round: B deleted, A (older, same match) still there is indexed again.
        let cache = PolicyCache::default();
        cache.replace_all(
            "g".into(),
            vec![tiered(1), over_change(2, A, Some(over(A, "k", "a")))],
            2,
        );
        cache.apply_own_override(&etag(4), "p", &id(B), Some(over(B, "k", "b")));
        cache.apply_own_override(&etag(5), "p", &id(B), None);
        assert_eq!(
            quota_for(&cache, "k"),
            Some(10),
            "A, until the log says it is gone"
        );
    }
}
