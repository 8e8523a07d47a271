//! The top offenders of each policy, without a label per subject: who is denied, allowed or
//! near their limit most, in bounded memory (`GET /v1/policies/{name}/top`).
//!
//! Every acquire decided (by the store, the denial cache, an override, or a fail mode) is
//! counted in the policy's live summaries, one per dimension ([`summary`]: Space-Saving, `k` =
//! `top.subjects` slots), under a short lock of the policy's own. Every `top.fold_ms` the
//! background task swaps them for their spares and, off the acquire path, folds them: into Redis
//! (one `lua/top.lua` call per policy that decided anything, into that minute's summaries every
//! instance shares), or, on the embedded store, into this process's minute summaries (the last
//! 61 kept). A fold that fails is kept as it is and sent again, unchanged, before the next: Redis
//! applies each fold once ([`FoldId`]), so a fold that timed out while Redis hung, and ran when it
//! woke, is not counted twice; while one is kept, the live summaries go on counting.
//!
//! `top` adds up the minutes of its window (the minute in progress and the 1, 5 or 60 before:
//! between W and W+1 minutes of decisions, as of the last fold): counts, exact totals, and
//! bounds. Every count answered is within the answer's `error_bound` of the subject's true
//! count in those minutes: the sum over the window's minutes of each minute's bound, which is
//! the floor of its shared summary plus the bounds of every summary folded into it (each at most
//! its own total / `k`), so at most 2 N / k for N decisions in the window (see [`summary`]).
//! Decisions are counted in the minute of the fold that carries them: up to `top.fold_ms` late.

pub mod summary;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use self::summary::{KeyHasher, Summary};
use super::{DecidedBy, RateLimiter, ServiceError};
use metrics::Counter;

use crate::config::TopSettings;
use crate::limiter::{Params, Verdict};
use crate::metrics as m;
use crate::policy::{NearLimitRatio, Policy, Rate};
use crate::store::top::{FoldId, Minute, Tally, DIMENSIONS, MINUTE_TTL_S};
use crate::telemetry::Summarized;

/// The policy's `near_limit_ratio` (its default when the document gives none): the same rule
/// as `ratelimiter_near_limit_total` counts by.
pub fn near_limit_ratio(policy: &Policy) -> NearLimitRatio {
    policy
        .rate()
        .and_then(Rate::near_limit_ratio)
        .unwrap_or_default()
}

/// Whether an allowed `verdict` over `params` left any limit near its quota.
pub fn is_near_limit(verdict: &Verdict, params: &[Params], ratio: NearLimitRatio) -> bool {
    verdict.allowed
        && verdict
            .limits()
            .iter()
            .zip(params)
            .any(|(d, p)| ratio.is_near(d.remaining, p.quota()))
}

/// The dimension a subject is ranked by, in the order of [`DIMENSIONS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    Denied = 0,
    Allowed = 1,
    NearLimit = 2,
}

impl By {
    pub const ALL: [By; DIMENSIONS] = [By::Denied, By::Allowed, By::NearLimit];

    pub fn as_str(self) -> &'static str {
        match self {
            By::Denied => "denied",
            By::Allowed => "allowed",
            By::NearLimit => "near_limit",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        By::ALL.into_iter().find(|b| b.as_str() == s)
    }
}

/// The windows `top` answers, in minutes before the one in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    OneMinute,
    FiveMinutes,
    OneHour,
}

impl Window {
    pub const ALL: [Window; 3] = [Window::OneMinute, Window::FiveMinutes, Window::OneHour];

    pub fn as_str(self) -> &'static str {
        match self {
            Window::OneMinute => "1m",
            Window::FiveMinutes => "5m",
            Window::OneHour => "1h",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Window::ALL.into_iter().find(|w| w.as_str() == s)
    }

    fn minutes(self) -> u64 {
        match self {
            Window::OneMinute => 1,
            Window::FiveMinutes => 5,
            Window::OneHour => 60,
        }
    }
}

/// The minutes kept on the embedded store: the longest window and the minute in progress.
const KEPT_MINUTES: usize = 61;

/// A decision as the summaries count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    pub allowed: bool,
    pub near_limit: bool,
}

/// One summary per dimension.
type Dims = [Summary; DIMENSIONS];

fn dims(capacity: usize) -> Dims {
    std::array::from_fn(|_| Summary::new(capacity))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One policy's summaries.
struct PolicyTop {
    /// What the acquires count in.
    live: Mutex<Dims>,
    /// What the fold swaps them for; only the fold task locks it.
    spare: Mutex<Dims>,
    /// On the embedded store: the minutes kept, oldest first.
    minutes: Mutex<VecDeque<(u64, Dims)>>,
    /// On Redis: the fold that failed, sent again before anything newer; only the fold task
    /// locks it.
    unsent: Mutex<Option<Unsent>>,
}

/// A fold whose outcome is not known, as it was first sent.
struct Unsent {
    minute: u64,
    fold: FoldId,
    tallies: [Tally; DIMENSIONS],
}

impl PolicyTop {
    fn new(capacity: usize) -> Self {
        Self {
            live: Mutex::new(dims(capacity)),
            spare: Mutex::new(dims(capacity)),
            minutes: Mutex::new(VecDeque::new()),
            unsent: Mutex::new(None),
        }
    }

    fn count(&self, hash: u64, key: &str, counted: Counted) {
        let mut live = lock(&self.live);
        if !counted.allowed {
            live[By::Denied as usize].add(hash, key, 1);
            return;
        }
        live[By::Allowed as usize].add(hash, key, 1);
        if counted.near_limit {
            live[By::NearLimit as usize].add(hash, key, 1);
        }
    }
}

/// How keys are shown.
enum Reveal {
    Plain,
    Hashed(Hmac<Sha256>),
}

/// Every policy's summaries, and how they are shown.
pub struct Top {
    capacity: usize,
    fold_every: Duration,
    hasher: KeyHasher,
    policies: RwLock<HashMap<Arc<str>, Arc<PolicyTop>>>,
    reveal: Reveal,
    /// Folds into Redis that succeeded, and that failed (`ratelimiter_top_folds_total`).
    folds: [Counter; 2],
    /// `ratelimiter_top_dropped_total`.
    evicted: Counter,
    /// This instance's id in its folds ([`FoldId`]), and the next fold's sequence number.
    instance: u64,
    seq: std::sync::atomic::AtomicU64,
}

impl Top {
    pub fn new(settings: &TopSettings) -> Self {
        let reveal = if settings.hash_keys {
            let mut drawn = [0u8; 32];
            let salt: &[u8] = match &settings.salt {
                Some(s) => s.expose().as_bytes(),
                None => {
                    // Without randomness (never on a working system) the hashes still hide the
                    // keys from whoever does not know that the salt is all zeros.
                    let _ = getrandom::fill(&mut drawn);
                    &drawn
                }
            };
            match Hmac::<Sha256>::new_from_slice(salt) {
                Ok(mac) => Reveal::Hashed(mac),
                // HMAC takes a key of any length.
                Err(_) => Reveal::Plain,
            }
        } else {
            Reveal::Plain
        };
        // Registered now (the recorder first), so that both show 0 before anything happens.
        crate::metrics::handle();
        let folds = ["ok", "error"].map(|o| metrics::counter!(m::TOP_FOLDS, "outcome" => o));
        let evicted = metrics::counter!(m::TOP_EVICTED);
        folds.iter().chain([&evicted]).for_each(|c| c.increment(0));
        let mut id = [0u8; 8];
        // Without randomness (never on a working system) the id is still unique per process
        // start among instances started at different nanoseconds.
        if getrandom::fill(&mut id).is_err() {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            id = (now ^ u64::from(std::process::id())).to_le_bytes();
        }
        Self {
            folds,
            evicted,
            instance: u64::from_le_bytes(id),
            seq: std::sync::atomic::AtomicU64::new(1),
            capacity: settings.subjects,
            fold_every: settings.fold_every(),
            hasher: KeyHasher::default(),
            policies: RwLock::new(HashMap::new()),
            reveal,
        }
    }

    /// Counts one decision of `policy` for the subject `key`: a shared lock of the map and the
    /// policy's own lock; the policy's entry is made (and its name copied) by its first.
    pub fn count(&self, policy: &str, key: &str, counted: Counted) {
        if self.capacity == 0 {
            return;
        }
        let hash = self.hasher.hash(key);
        {
            // Counted under the shared lock: no reference count to touch on every decision.
            let policies = self.policies.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(p) = policies.get(policy) {
                p.count(hash, key, counted);
                return;
            }
        }
        self.policies
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(Arc::from(policy))
            .or_insert_with(|| Arc::new(PolicyTop::new(self.capacity)))
            .count(hash, key, counted);
    }

    fn show(&self, key: &str) -> String {
        match &self.reveal {
            Reveal::Plain => key.to_owned(),
            Reveal::Hashed(mac) => {
                let mut mac = mac.clone();
                mac.update(key.as_bytes());
                let digest = mac.finalize().into_bytes();
                let mut out = String::with_capacity(5 + 32);
                out.push_str("hmac:");
                for b in &digest[..16] {
                    use std::fmt::Write;
                    let _ = write!(out, "{b:02x}");
                }
                out
            }
        }
    }

    fn snapshot(&self) -> Vec<(Arc<str>, Arc<PolicyTop>)> {
        self.policies
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The heap bytes held for `policy`'s summaries (live, spare and kept minutes).
    pub fn heap_bytes(&self, policy: &str) -> usize {
        let Some(p) = self
            .policies
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(policy)
            .cloned()
        else {
            return 0;
        };
        let of = |d: &Dims| d.iter().map(Summary::heap_bytes).sum::<usize>();
        let minutes: usize = lock(&p.minutes).iter().map(|(_, d)| of(d)).sum();
        let live = of(&lock(&p.live));
        let spare = of(&lock(&p.spare));
        live + spare + minutes
    }
}

/// One subject of an answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Offender {
    /// The key, or its salted hash with `top.hash_keys`.
    pub key: String,
    /// Counts by dimension, in the order of [`By::ALL`].
    pub counts: [u64; DIMENSIONS],
    /// The count ranked by, over the window's total of that dimension.
    pub share: f64,
}

/// What `top` answers.
#[derive(Debug, Clone)]
pub struct TopAnswer {
    pub policy: String,
    pub by: By,
    pub window: Window,
    /// By dimension: every count of that dimension is within it of the true count.
    pub bounds: [u64; DIMENSIONS],
    /// By dimension: the decisions counted in the window, exactly.
    pub totals: [u64; DIMENSIONS],
    pub subjects: Vec<Offender>,
}

/// Unix time in minutes.
fn minute_of(now_us: u64) -> u64 {
    now_us / 60_000_000
}

impl RateLimiter {
    /// Counts an acquire's decision for the top offenders of `policy`; near the limit by the
    /// rule `ratelimiter_near_limit_total` counts by.
    pub(super) fn count_top(
        &self,
        policy: &Policy,
        key: &str,
        verdict: &Verdict,
        params: &[Params],
        decided_by: DecidedBy,
    ) {
        let counted = Counted {
            allowed: verdict.allowed,
            near_limit: decided_by.knows_remaining()
                && is_near_limit(verdict, params, near_limit_ratio(policy)),
        };
        self.top.count(policy.name.as_str(), key, counted);
    }

    /// The `limit` heaviest subjects of the policy named `name` by `by` in `window` (see the
    /// module documentation).
    pub async fn top(
        &self,
        name: &str,
        by: By,
        window: Window,
        limit: usize,
    ) -> Result<TopAnswer, ServiceError> {
        let found = self.policy(name).await?;
        let policy = found.policy.name.as_str();
        let now = minute_of(self.clock.now_us());
        let wanted: Vec<u64> = (now.saturating_sub(window.minutes())..=now).collect();
        let minutes = if self.store.is_shared() {
            self.store.read_top(policy, &wanted).await?
        } else {
            self.local_minutes(policy, &wanted)
        };
        let mut sums: [HashMap<String, u64>; DIMENSIONS] = Default::default();
        let (mut bounds, mut totals) = ([0u64; DIMENSIONS], [0u64; DIMENSIONS]);
        for m in minutes {
            for (d, t) in m.tallies.into_iter().enumerate() {
                bounds[d] = bounds[d].saturating_add(t.bound);
                totals[d] = totals[d].saturating_add(t.total);
                for (k, c) in t.entries {
                    *sums[d].entry(k).or_default() += c;
                }
            }
        }
        let mut ranked: Vec<(&String, u64)> =
            sums[by as usize].iter().map(|(k, c)| (k, *c)).collect();
        ranked.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        ranked.truncate(limit);
        let total = totals[by as usize].max(1) as f64;
        let subjects = ranked
            .into_iter()
            .map(|(k, c)| Offender {
                key: self.top.show(k),
                counts: std::array::from_fn(|d| sums[d].get(k).copied().unwrap_or(0)),
                share: c as f64 / total,
            })
            .collect();
        Ok(TopAnswer {
            policy: policy.to_owned(),
            by,
            window,
            bounds,
            totals,
            subjects,
        })
    }

    /// The embedded store's minutes of `policy` among `wanted`.
    fn local_minutes(&self, policy: &str, wanted: &[u64]) -> Vec<Minute> {
        let Some(p) = self
            .top
            .policies
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(policy)
            .cloned()
        else {
            return Vec::new();
        };
        let kept = lock(&p.minutes);
        let minutes = kept
            .iter()
            .filter(|(m, _)| wanted.contains(m))
            .map(|(m, d)| Minute {
                minute: *m,
                tallies: std::array::from_fn(|i| d[i].tally()),
            })
            .collect();
        minutes
    }

    /// Folds every policy's live summaries (see the module documentation); drops the summaries
    /// of policies that are gone.
    pub(super) async fn fold_top(&self) {
        let minute = minute_of(self.clock.now_us());
        for (name, p) in self.top.snapshot() {
            let unsent = lock(&p.unsent).take();
            if let Some(u) = unsent {
                // A minute Redis no longer keeps is not written again.
                if minute.saturating_sub(u.minute) < MINUTE_TTL_S / 60 {
                    if let Err(e) = self.send_fold(&name, u.minute, u.fold, &u.tallies).await {
                        self.unfolded(&name, &e);
                        *lock(&p.unsent) = Some(u);
                        continue;
                    }
                }
            }
            let Some(tallies) = self.swap_out(&name, &p, minute) else {
                continue;
            };
            lock(&p.spare).iter_mut().for_each(Summary::reset);
            let fold = FoldId {
                instance: self.top.instance,
                seq: self
                    .top
                    .seq
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            };
            if let Err(e) = self.send_fold(&name, minute, fold, &tallies).await {
                self.unfolded(&name, &e);
                *lock(&p.unsent) = Some(Unsent {
                    minute,
                    fold,
                    tallies,
                });
            }
        }
    }

    /// One fold into Redis, counted by its outcome.
    async fn send_fold(
        &self,
        name: &str,
        minute: u64,
        fold: FoldId,
        tallies: &[Tally; DIMENSIONS],
    ) -> Result<(), crate::store::StoreError> {
        let folded = self
            .store
            .fold_top(name, minute, self.top.capacity, fold, tallies)
            .await;
        self.top.folds[usize::from(folded.is_err())].increment(1);
        folded
    }

    fn unfolded(&self, name: &str, e: &crate::store::StoreError) {
        static UNFOLDED: Summarized = Summarized::per_second();
        if let Some(count) = UNFOLDED.hit() {
            tracing::debug!(policy = %name, error = %e, count, "could not fold the top offenders into Redis; sending the fold again next time");
        }
    }

    /// Swaps a policy's live summaries for its spares; on Redis, answers what to fold (`None`
    /// when nothing was counted); on the embedded store, adds them into the minute's summaries
    /// here and answers `None`.
    fn swap_out(&self, name: &str, p: &PolicyTop, minute: u64) -> Option<[Tally; DIMENSIONS]> {
        let mut spare = lock(&p.spare);
        std::mem::swap(&mut *lock(&p.live), &mut *spare);
        self.top
            .evicted
            .increment(spare.iter().map(Summary::evicted).sum());
        if spare.iter().all(Summary::is_empty) {
            if self.cache.get(name).is_none() {
                self.top
                    .policies
                    .write()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(name);
            }
            return None;
        }
        if self.store.is_shared() {
            return Some(std::array::from_fn(|d| spare[d].tally()));
        }
        let mut kept = lock(&p.minutes);
        if kept.back().is_none_or(|(m, _)| *m != minute) {
            // The oldest minute's slots are reused for the new one.
            let fresh = if kept.len() >= KEPT_MINUTES {
                kept.pop_front().map(|(_, mut d)| {
                    d.iter_mut().for_each(Summary::reset);
                    d
                })
            } else {
                None
            };
            kept.push_back((minute, fresh.unwrap_or_else(|| dims(self.top.capacity))));
        }
        if let Some((_, current)) = kept.back_mut() {
            for (c, s) in current.iter_mut().zip(spare.iter()) {
                c.merge(s);
            }
        }
        spare.iter_mut().for_each(Summary::reset);
        None
    }

    /// How often the fold runs: `top.fold_ms`.
    pub(super) fn fold_every(&self) -> Duration {
        self.top.fold_every
    }

    /// The heap bytes this process holds for `policy`'s top offenders.
    pub fn top_heap_bytes(&self, policy: &str) -> usize {
        self.top.heap_bytes(policy)
    }
}

/// Folds every `top.fold_ms` until the limiter ends (see [`RateLimiter::fold_top`]).
pub(super) async fn fold_forever(limiter: Weak<RateLimiter>) {
    let Some(every) = limiter.upgrade().map(|l| l.fold_every()) else {
        return;
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(this) = limiter.upgrade() else {
            return;
        };
        if this.top.capacity == 0 {
            return;
        }
        this.fold_top().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_the_limit_is_at_most_a_fifth_of_the_quota_left_by_default() {
        let near = NearLimitRatio::default();
        assert!(near.is_near(10, 50));
        assert!(!near.is_near(11, 50));
        assert!(near.is_near(0, 50));
        assert!(near.is_near(2, 10));
        assert!(!near.is_near(3, 10));
        assert!(near.is_near(200, 1_000));
        assert!(!near.is_near(201, 1_000));
    }

    #[test]
    fn a_policy_s_summaries_hold_a_bounded_heap_however_many_subjects() {
        let top = Top::new(&TopSettings::default());
        let denied = Counted {
            allowed: false,
            near_limit: false,
        };
        let near = Counted {
            allowed: true,
            near_limit: true,
        };
        for i in 0..20_000 {
            // 32-byte keys.
            let key = format!("subject-{i:024}");
            top.count("api", &key, denied);
            top.count("api", &key, near);
        }
        let bytes = top.heap_bytes("api");
        eprintln!("one policy's live summaries, 128 slots each, 32-byte keys: {bytes} bytes");
        // Three summaries of 128 slots (the spares stay empty until a fold): a 40-byte slot and
        // its key each, and the table (at most 512 buckets of 5 bytes: evictions leave
        // tombstones, so it may grow once past 256).
        assert!(bytes <= 3 * (128 * (40 + 32) + 512 * 5), "{bytes}");
    }

    #[test]
    fn by_and_window_read_their_own_names() {
        for b in By::ALL {
            assert_eq!(By::parse(b.as_str()), Some(b));
        }
        for w in Window::ALL {
            assert_eq!(Window::parse(w.as_str()), Some(w));
        }
        assert_eq!(By::parse("Denied"), None);
        assert_eq!(Window::parse("60m"), None);
    }
}
