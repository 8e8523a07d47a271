//! One policy's overrides as this instance enforces them: each as the change log last gave it,
//! and an index of the live ones, each compiled against the policy as it is now into what it
//! does ([`Effect`]), so that a decision only looks it up.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::policy::overrides::{Match, MatchKind, Override, OverrideId, OverrideIndex, Sets};
use crate::policy::{Limits, Policy, PolicyName};

/// What an override does to the subjects it matches, against the policy as it is now.
#[derive(Debug, Clone)]
pub enum Effect {
    /// Decided with the limits of this tier of the policy (shared by every subject given it).
    Tier {
        name: PolicyName,
        limits: Arc<Limits>,
    },
    /// Decided with the override's own `limits` applied to the policy's, held in the override's
    /// own memory: every decision of its subject reads them.
    Limits(Limits),
    Unlimited,
    Block,
    /// It no longer applies: the policy lost the tier it names (or is no longer a rate policy).
    Stale(String),
}

impl Effect {
    /// The limits it decides with: a tier's or its own (`None` for the others).
    pub fn limits(&self) -> Option<&Limits> {
        match self {
            Effect::Tier { limits, .. } => Some(limits),
            Effect::Limits(limits) => Some(limits),
            Effect::Unlimited | Effect::Block | Effect::Stale(_) => None,
        }
    }

    /// The tier it gives, if it gives one.
    pub fn tier(&self) -> Option<&PolicyName> {
        match self {
            Effect::Tier { name, .. } => Some(name),
            _ => None,
        }
    }
}

/// An override compiled against its policy. What a decision reads of it (its id, the kind of
/// its match, its expiry, the limits) is copied into this one block, so that answering a subject
/// that has an override follows no pointer beyond it (at 100,000 overrides, each a likely cache
/// miss); the override itself is for what explains it (`resolve`, the list).
#[derive(Debug, Clone)]
pub struct Applied {
    pub id: OverrideId,
    pub kind: MatchKind,
    /// The override's expiry.
    pub expires_at_us: Option<u64>,
    /// The version of its last write.
    pub version: u64,
    pub effect: Effect,
    /// What of its `limits` the policy no longer has (passed over).
    pub passed_over: Vec<String>,
    pub over: Arc<Override>,
}

impl Applied {
    pub fn compile(policy: &Policy, over: Arc<Override>, version: u64) -> Self {
        let mut passed_over = Vec::new();
        let effect = match (policy.rate(), &over.sets) {
            (None, _) => Effect::Stale("the policy is not a rate policy".into()),
            (Some(rate), Sets::Tier(t)) => match rate.tiers().get(t.as_str()) {
                Some(tier) => Effect::Tier {
                    name: t.clone(),
                    limits: tier.limits.clone(),
                },
                None => Effect::Stale(format!("the policy has no tier `{t}` any more")),
            },
            (Some(rate), Sets::Limits(changes)) => {
                passed_over = changes.stale(rate.limits());
                Effect::Limits(changes.apply(rate.limits()))
            }
            (Some(_), Sets::Unlimited) => Effect::Unlimited,
            (Some(_), Sets::Block) => Effect::Block,
        };
        Self {
            id: over.id,
            kind: over.matches.kind(),
            expires_at_us: over.expires_at_us,
            version,
            effect,
            passed_over,
            over,
        }
    }

    /// Whether it applies at `now_us`: live, and not stale.
    pub fn applies(&self, now_us: u64) -> bool {
        now_us < self.until_us()
    }

    /// It applies before this time (µs): its expiry, `u64::MAX` without one, 0 when stale.
    fn until_us(&self) -> u64 {
        match self.effect {
            Effect::Stale(_) => 0,
            _ => self.expires_at_us.unwrap_or(u64::MAX),
        }
    }
}

/// An indexed override: when it stops applying, beside the override itself, so that the
/// lookup of a decision reads its liveness from the index's own memory instead of following two
/// pointers to the override's document (at 100,000 subjects, each a likely cache miss).
#[derive(Debug, Clone)]
struct Indexed {
    /// [`Applied::until_us`], copied.
    until_us: u64,
    applied: Arc<Applied>,
}

impl Indexed {
    fn of(applied: Arc<Applied>) -> Self {
        Self {
            until_us: applied.until_us(),
            applied,
        }
    }
}

/// One policy's overrides.
#[derive(Debug, Default)]
pub struct PolicyOverrides {
    /// By id, in order (what a list pages through): the override (`None`: deleted, a
    /// tombstone) and the version of its last change.
    entries: BTreeMap<OverrideId, (Option<Arc<Override>>, u64)>,
    index: OverrideIndex<Indexed>,
    /// Whether an override was ever indexed over another of the same match (this instance's own
    /// write applied before the deletion it followed): only then can a removal uncover another
    /// to index, which takes a scan.
    shadowed: bool,
}

impl PolicyOverrides {
    /// Applies one change newer than the entry it replaces; `policy` is the policy as this
    /// instance has it (`None` before it arrives: indexed when it does, [`Self::rebuild`]).
    /// Returns whether it was applied.
    ///
    /// A change older than the policy's incarnation belongs to a policy of the name that was
    /// deleted before this one was created (a page read before the deletion, applied after the
    /// name came back): it is dropped, as the deletion dropped the overrides it knew of.
    pub fn apply(
        &mut self,
        id: OverrideId,
        version: u64,
        over: Option<Override>,
        policy: Option<&Policy>,
    ) -> bool {
        if self.entries.get(&id).is_some_and(|(_, v)| *v >= version)
            || policy.is_some_and(|p| version < p.incarnation())
        {
            return false;
        }
        let over = over.map(Arc::new);
        let old = self.entries.insert(id, (over.clone(), version));
        if let Some((Some(old), _)) = old {
            self.unindex(&old, policy);
        }
        if let (Some(new), Some(policy)) = (over, policy) {
            self.index_one(Arc::new(Applied::compile(policy, new, version)));
        }
        true
    }

    /// Drops the tombstone of `id` at `version`, once the log has caught up with it.
    pub fn forget(&mut self, id: &OverrideId, version: u64) {
        if self
            .entries
            .get(id)
            .is_some_and(|(o, v)| o.is_none() && *v <= version)
        {
            self.entries.remove(id);
        }
    }

    /// Compiles every live override again against `policy` (it changed), after dropping those
    /// older than its incarnation (see [`Self::apply`]): they arrived while the name had no
    /// policy, from before its deletion.
    pub fn rebuild(&mut self, policy: &Policy) {
        self.index = OverrideIndex::default();
        self.shadowed = false;
        let born = policy.incarnation();
        self.entries.retain(|_, (_, v)| *v >= born);
        let live: Vec<(Arc<Override>, u64)> = self
            .entries
            .values()
            .filter_map(|(o, v)| o.clone().map(|o| (o, *v)))
            .collect();
        for (o, v) in live {
            self.index_one(Arc::new(Applied::compile(policy, o, v)));
        }
    }

    /// Indexes `applied`; when another override of the same match is indexed (a write of this
    /// instance applied before the deletion it followed), the newer wins.
    fn index_one(&mut self, applied: Arc<Applied>) {
        let m = applied.over.matches.clone();
        if let Some(there) = self.index.get(&m) {
            if there.applied.over.id != applied.over.id {
                self.shadowed = true;
            }
            if there.applied.version > applied.version {
                return;
            }
            self.index.remove(&m);
        }
        let _ = self.index.insert(m, Indexed::of(applied));
    }

    /// Takes `old` out of the index if it is the one indexed for its match, and indexes the
    /// newest other live override of that match, if any.
    fn unindex(&mut self, old: &Override, policy: Option<&Policy>) {
        let m: &Match = &old.matches;
        if self
            .index
            .get(m)
            .is_none_or(|a| a.applied.over.id != old.id)
        {
            return;
        }
        self.index.remove(m);
        if !self.shadowed {
            return;
        }
        let next = self
            .entries
            .values()
            .filter_map(|(o, v)| {
                o.as_ref()
                    .filter(|o| o.matches == *m)
                    .map(|o| (o.clone(), *v))
            })
            .max_by_key(|(_, v)| *v);
        if let (Some((o, v)), Some(policy)) = (next, policy) {
            self.index_one(Arc::new(Applied::compile(policy, o, v)));
        }
    }

    /// The override applying to `key` at `now_us`.
    pub fn find(&self, key: &str, now_us: u64) -> Option<&Arc<Applied>> {
        self.index
            .find_where(key, |a| now_us < a.until_us)
            .map(|a| &a.applied)
    }

    /// Every override matching `key`, in order of precedence (the one that applies, if live,
    /// among them): what `resolve` explains.
    pub fn candidates(&self, key: &str) -> Vec<Arc<Applied>> {
        self.index
            .candidates(key)
            .into_iter()
            .map(|(_, a)| a.applied.clone())
            .collect()
    }

    /// At most `limit` overrides (expired ones included) after the id `after`, by id, and
    /// whether more follow.
    pub fn page(&self, after: Option<&str>, limit: usize) -> (Vec<(Arc<Override>, u64)>, bool) {
        let mut live = self
            .entries
            .iter()
            .skip_while(|(id, _)| after.is_some_and(|a| id.as_str() <= a))
            .filter_map(|(_, (o, v))| o.clone().map(|o| (o, *v)));
        let page: Vec<_> = live.by_ref().take(limit).collect();
        let more = live.next().is_some();
        (page, more)
    }

    /// The overrides that have expired by `now_us`, at most `max`, with their versions: what
    /// the sweep deletes.
    pub fn expired(&self, now_us: u64, max: usize) -> Vec<(Arc<Override>, u64)> {
        self.entries
            .values()
            .filter_map(|(o, v)| o.clone().map(|o| (o, *v)))
            .filter(|(o, _)| !o.is_live(now_us))
            .take(max)
            .collect()
    }

    pub fn get(&self, id: &OverrideId) -> Option<(Arc<Override>, u64)> {
        self.entries
            .get(id)
            .and_then(|(o, v)| o.clone().map(|o| (o, *v)))
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
