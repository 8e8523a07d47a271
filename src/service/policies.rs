//! Policies: how this instance's cache follows the store, and policy reads and writes.
//!
//! The store keeps a change log: every write gets the next version, and a page read
//! (`Store::policy_changes`) returns the policies changed after a version, oldest first. The
//! background loop asks for the changes after the cache's version every `policy_refresh_ms`:
//! when nothing changed that is one small read, and when something did, only what changed is
//! read, in pages of [`PAGE`] policies, each a store call with its own deadline. A full reload,
//! also in pages, happens only at start-up, when the store's generation changes (it lost its
//! data, or it is another store) or when the cache is too far behind to be brought up to date
//! from the deletions the store still remembers.
//!
//! A store seen for the first time (at start-up, or after it lost its data) gets the configured
//! policies that it lacks: each is created once per generation of the store, so a policy the
//! configuration file lists and an admin deleted through the API stays deleted.
//!
//! An acquire for a name the cache lacks does not read the store itself: it waits for a refresh,
//! shared by every miss and started at most once per [`MISS_RECHECK`], so a policy just created
//! through another instance is found at once, while a flood of unknown names costs the store at
//! most one small read per [`MISS_RECHECK`].

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::cache::Found;
use super::{RateLimiter, ServiceError};
use crate::metrics as m;
use crate::policy::{Policy, PolicyName};
use crate::store::{
    Change, Etag, PolicyWrite, Precondition, Store, StoreError, WriteKind, WriteStatus, Written,
};

/// Policies per page of the change log.
pub const PAGE: usize = 500;
/// How often misses may start a refresh.
pub const MISS_RECHECK: Duration = Duration::from_millis(50);

/// The state of following the store.
pub struct PolicySync {
    configured: Vec<Policy>,
    max_policies: u64,
    stale_after: Duration,
    /// Held for the whole of a refresh, so that one runs at a time; holds when the last one
    /// started.
    running: tokio::sync::Mutex<Option<Instant>>,
    /// When the cache was last brought up to date with the store.
    refreshed: Mutex<Option<Instant>>,
    /// The generation of the store in which every configured policy has been seeded.
    seeded: Mutex<Option<Arc<str>>>,
    full_pages: Pages,
    incremental_pages: Pages,
    /// How far behind the store the cache is (`ratelimiter_policy_cache_lag_*`).
    lag: Mutex<Lag>,
}

/// What the refreshes have learnt of the cache's lag behind the store.
#[derive(Debug, Clone, Copy)]
struct Lag {
    /// The store's change-log version in the latest page read of the cache's generation.
    seen: u64,
    /// Whether the latest refresh succeeded and left the cache at or past `seen`.
    current: bool,
    /// When the cache was last known current (at start: the time the cache was created, when
    /// it was current with nothing).
    current_at: Instant,
}

/// Pages read, for this instance's view (`/readyz`) and for the process-wide metric.
struct Pages {
    read: std::sync::atomic::AtomicU64,
    metric: metrics::Counter,
}

impl Pages {
    fn new(kind: &'static str) -> Self {
        Self {
            read: std::sync::atomic::AtomicU64::new(0),
            metric: metrics::counter!(m::POLICY_PAGES, "kind" => kind),
        }
    }

    fn increment(&self) {
        self.read.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.metric.increment(1);
    }

    fn get(&self) -> u64 {
        self.read.load(std::sync::atomic::Ordering::Relaxed)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl PolicySync {
    pub fn new(configured: Vec<Policy>, max_policies: u64, stale_after: Duration) -> Self {
        Self {
            configured,
            max_policies,
            stale_after,
            running: tokio::sync::Mutex::new(None),
            refreshed: Mutex::new(None),
            seeded: Mutex::new(None),
            full_pages: Pages::new("full"),
            incremental_pages: Pages::new("incremental"),
            lag: Mutex::new(Lag {
                seen: 0,
                current: false,
                current_at: Instant::now(),
            }),
        }
    }

    /// A page of the change log said the store is at `version`.
    fn saw(&self, version: u64) {
        lock(&self.lag).seen = version;
    }

    /// A refresh ended (`ok`: without a store error), leaving the cache at `applied`.
    fn settle_lag(&self, ok: bool, applied: u64) {
        let mut lag = lock(&self.lag);
        lag.current = ok && applied >= lag.seen;
        if lag.current {
            lag.current_at = Instant::now();
        }
    }

    /// How far behind the store the cache at `applied` is: versions (the store's latest version
    /// read less `applied`) and time (since it was last known current; zero while it is).
    pub fn lag(&self, applied: u64) -> (u64, Duration) {
        let lag = *lock(&self.lag);
        let behind = match lag.current {
            true => Duration::ZERO,
            false => lag.current_at.elapsed(),
        };
        (lag.seen.saturating_sub(applied), behind)
    }

    /// Time since the cache was last brought up to date.
    pub fn age(&self) -> Option<Duration> {
        lock(&self.refreshed).map(|t| t.elapsed())
    }

    /// Pages of the change log this instance has read: `(full, incremental)`.
    pub fn pages(&self) -> (u64, u64) {
        (self.full_pages.get(), self.incremental_pages.get())
    }

    /// Whether the cache has gone without a refresh for longer than its bound.
    pub fn is_stale(&self) -> bool {
        self.age().is_none_or(|age| age > self.stale_after)
    }

    pub fn stale_after(&self) -> Duration {
        self.stale_after
    }

    /// Whether every configured policy has been seeded into the store's generation `g`.
    pub fn seeded_in(&self, generation: Option<&str>) -> bool {
        self.configured.is_empty() || lock(&self.seeded).as_deref() == generation
    }
}

/// The ETag of the policy, as a header value: quoted.
pub fn etag_header(etag: &Etag) -> String {
    format!("\"{etag}\"")
}

impl RateLimiter {
    /// The policy from the cache. On a miss, waits for a refresh (shared, and at most one per
    /// [`MISS_RECHECK`]) in case it was just created through another instance.
    pub(super) async fn policy(&self, name: &str) -> Result<Found, ServiceError> {
        if let Some(hit) = self.cache.get(name) {
            return Ok(hit);
        }
        let arrived = Instant::now();
        if let Err(e) = self
            .refresh_unless_started_after(arrived.checked_sub(MISS_RECHECK))
            .await
        {
            tracing::debug!(error = %e, "could not refresh policies after a miss");
        }
        self.cache
            .get(name)
            .ok_or_else(|| ServiceError::UnknownPolicy(name.to_owned()))
    }

    /// The policy from the cache with the override of its subject `key` looked up with it
    /// ([`super::cache::PolicyCache::get_for`]); on a miss, as [`RateLimiter::policy`].
    pub(super) async fn policy_for(&self, name: &str, key: &str) -> Result<Found, ServiceError> {
        if let Some(hit) = self.cache.get_for(name, key, self.clock.now_us()) {
            return Ok(hit);
        }
        self.policy(name).await
    }

    /// Brings the cache up to date with the store.
    pub async fn refresh(&self) -> Result<(), StoreError> {
        self.refresh_unless_started_after(None).await
    }

    /// Refreshes, unless a refresh started after `after` (it would see the same).
    async fn refresh_unless_started_after(&self, after: Option<Instant>) -> Result<(), StoreError> {
        let mut last_started = self.sync.running.lock().await;
        if let (Some(after), Some(last)) = (after, *last_started) {
            if last >= after {
                return Ok(());
            }
        }
        *last_started = Some(Instant::now());
        let result = self.bring_up_to_date().await;
        self.sync
            .settle_lag(result.is_ok(), self.cache.position().applied);
        result
    }

    /// One refresh: follows the change log from where the cache stands, or reloads.
    async fn bring_up_to_date(&self) -> Result<(), StoreError> {
        let position = self.cache.position();
        // Follow the change log from where the cache stands, unless there is nothing loaded yet
        // (the full load reads from the start anyway), the store is another generation, or it
        // has forgotten deletions the cache has not seen.
        let followed = match &position.generation {
            None => None,
            Some(cache) => {
                let page = self.store.policy_changes(position.applied, PAGE).await?;
                if page.generation.as_ref() == Some(cache) {
                    self.sync.saw(page.version);
                }
                (page.generation.as_ref() == Some(cache) && position.applied >= page.floor)
                    .then(|| (cache.clone(), page))
            }
        };
        match followed {
            Some((generation, mut page)) => {
                if !self.sync.seeded_in(Some(&generation)) {
                    // A configured policy did not fit before; it may now.
                    self.seed().await?;
                    page = self.store.policy_changes(position.applied, PAGE).await?;
                }
                self.follow(generation, page).await?;
            }
            None => self.reload().await?,
        }
        *lock(&self.sync.refreshed) = Some(Instant::now());
        Ok(())
    }

    /// Applies the change log page by page, starting from `page`.
    async fn follow(
        &self,
        generation: Arc<str>,
        mut page: crate::store::ChangePage,
    ) -> Result<(), StoreError> {
        loop {
            if !page.changes.is_empty() {
                self.sync.incremental_pages.increment();
            }
            let full = page.changes.len() >= PAGE;
            let upto = match (full, page.changes.last()) {
                (true, Some(last)) => last.version,
                _ => page.version,
            };
            self.cache.apply_page(&generation, page.changes, upto);
            if !full {
                return Ok(());
            }
            page = self.store.policy_changes(upto, PAGE).await?;
            if page.generation.as_deref() != Some(&*generation) {
                // The store lost its data meanwhile: the next refresh reloads.
                return Ok(());
            }
            self.sync.saw(page.version);
        }
    }

    /// Loads every policy afresh, page by page, after making sure the store has a generation
    /// and the configured policies.
    async fn reload(&self) -> Result<(), StoreError> {
        let generation = self.seed().await?;
        let mut policies: Vec<Change> = Vec::new();
        let mut since = 0;
        loop {
            let page = self.store.policy_changes(since, PAGE).await?;
            if page.generation.as_deref() != Some(&*generation) {
                return Err(StoreError::Unavailable(
                    "the store lost its data while its policies were being loaded".into(),
                ));
            }
            self.sync.full_pages.increment();
            self.sync.saw(page.version);
            let full = page.changes.len() >= PAGE;
            since = match (full, page.changes.last()) {
                (true, Some(last)) => last.version,
                _ => page.version,
            };
            // A policy changed while the pages are read moves to a later page: keep its latest.
            policies.extend(page.changes);
            if !full {
                break;
            }
        }
        policies.sort_by(|a, b| a.name.cmp(&b.name).then(b.version.cmp(&a.version)));
        policies.dedup_by(|later, first| later.name == first.name);
        let count = policies.iter().filter(|c| c.policy().is_some()).count();
        tracing::info!(%generation, version = since, policies = count, "loaded every policy");
        self.cache.replace_all(generation, policies, since);
        Ok(())
    }

    /// Gives the store a generation if it has none, and creates each configured policy it has
    /// never had in this generation. Returns the store's generation.
    async fn seed(&self) -> Result<Arc<str>, StoreError> {
        let probe = self
            .write(WriteKind::Probe, None, None, &Precondition::None, None)
            .await?;
        let generation = probe.etag.generation;
        if self.sync.seeded_in(Some(&generation)) {
            return Ok(generation);
        }
        let mut complete = true;
        for policy in &self.sync.configured {
            let written = self
                .write(
                    WriteKind::Seed,
                    Some(&policy.name),
                    Some(policy),
                    &Precondition::None,
                    None,
                )
                .await?;
            match written.status {
                WriteStatus::Created => {
                    tracing::info!(policy = %policy.name, "created policy from the configuration")
                }
                WriteStatus::Full => {
                    complete = false;
                    tracing::error!(
                        policy = %policy.name,
                        "cannot create policy from the configuration: limits.max_policies reached"
                    )
                }
                _ => {}
            }
        }
        if complete {
            *lock(&self.sync.seeded) = Some(generation.clone());
        }
        Ok(generation)
    }

    pub(super) async fn write(
        &self,
        kind: WriteKind,
        name: Option<&PolicyName>,
        policy: Option<&Policy>,
        precondition: &Precondition,
        seen: Option<&Policy>,
    ) -> Result<Written, StoreError> {
        // The probe names no policy; any valid name does.
        let placeholder;
        let name = match name {
            Some(n) => n,
            None => {
                placeholder = PolicyName::parse("probe").map_err(|_| {
                    StoreError::Corrupt("`probe` is not a valid policy name".into())
                })?;
                &placeholder
            }
        };
        self.store
            .write_policy(PolicyWrite {
                kind,
                name,
                policy,
                precondition,
                max_policies: self.sync.max_policies,
                seen,
            })
            .await
    }

    /// Live policies sorted by name, at most `limit` after the name `after`, and the cursor of
    /// the next page. From this instance's cache brought up to date first, or as it is while the
    /// store is unreachable.
    pub async fn list_policies(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<(Arc<Policy>, Etag)>, Option<String>), ServiceError> {
        if let Err(e) = self.refresh().await {
            if !(e.class().may_serve_cached() && self.cache.is_loaded()) {
                return Err(e.into());
            }
            tracing::warn!(error = %e, "store unreachable; listing cached policies");
        }
        let Some(generation) = self.cache.position().generation else {
            return Err(StoreError::Unavailable("policies have not been loaded yet".into()).into());
        };
        let all = self.cache.list();
        let start = match after {
            Some(after) => all.partition_point(|(p, _)| p.name.as_str() <= after),
            None => 0,
        };
        let page: Vec<(Arc<Policy>, Etag)> = all[start..]
            .iter()
            .take(limit)
            .map(|(p, version)| {
                let etag = Etag {
                    generation: generation.clone(),
                    version: *version,
                };
                (p.clone(), etag)
            })
            .collect();
        let next = (start + page.len() < all.len())
            .then(|| page.last().map(|(p, _)| p.name.to_string()))
            .flatten();
        Ok((page, next))
    }

    /// One policy and its ETag, from the store; from the cache while the store is unreachable.
    pub async fn get_policy(&self, name: &PolicyName) -> Result<(Policy, Etag), ServiceError> {
        let found = match self.store.read_policy(name).await {
            Ok(found) => found,
            Err(e) if e.class().may_serve_cached() && self.cache.is_loaded() => {
                tracing::warn!(error = %e, "store unreachable; reading the cached policy");
                self.cache
                    .get(name.as_str())
                    .map(|f| ((*f.policy).clone(), f.etag))
            }
            Err(e) => return Err(e.into()),
        };
        found.ok_or_else(|| ServiceError::UnknownPolicy(name.to_string()))
    }

    /// Creates (`WriteKind::Create`), creates or replaces (`Put`) or deletes (`Delete`) a policy,
    /// if `precondition` holds; this instance enforces the change at once.
    pub async fn change_policy(
        &self,
        kind: WriteKind,
        name: &PolicyName,
        policy: Option<Policy>,
        precondition: &Precondition,
    ) -> Result<Written, ServiceError> {
        let claimed = |other: String| {
            let domain = policy.as_ref().and_then(|p| p.descriptor());
            ServiceError::DescriptorClaimed {
                domain: domain.map(|d| d.domain.clone()).unwrap_or_default(),
                other,
            }
        };
        if let Some(p) = policy.as_ref().filter(|p| p.descriptor().is_some()) {
            // The store's write claims the shape atomically; this check, against the store's
            // policies as of now, also finds the claims of policies written before the store
            // kept them. A policy keeping its own shape is never refused.
            self.refresh().await?;
            let keeps = self
                .cache
                .get(name.as_str())
                .is_some_and(|own| own.policy.shape() == p.shape());
            if let Some(other) = self.cache.shape_claimed_by(p).filter(|_| !keeps) {
                return Err(claimed(other));
            }
        }
        let seen = self.cache.get(name.as_str()).map(|f| f.policy);
        let written = self
            .write(
                kind,
                Some(name),
                policy.as_ref(),
                precondition,
                seen.as_deref(),
            )
            .await?;
        let current = (written.etag.version > 0).then(|| written.etag.clone());
        match written.status {
            WriteStatus::Created | WriteStatus::Replaced | WriteStatus::Deleted => {
                // As the store now hands it out, so that this instance's cache agrees with what
                // the others read.
                let policy = policy.map(|p| p.with_incarnation(written.incarnation));
                self.cache.apply_own(&written.etag, name.as_str(), policy);
                Ok(written)
            }
            WriteStatus::Exists => Err(ServiceError::PolicyExists(name.to_string())),
            WriteStatus::Missing => Err(ServiceError::UnknownPolicy(name.to_string())),
            WriteStatus::Full => Err(ServiceError::TooManyPolicies(self.sync.max_policies)),
            WriteStatus::Claimed => Err(claimed(written.claimed_by.unwrap_or_default())),
            WriteStatus::PreconditionFailed => Err(ServiceError::PreconditionFailed { current }),
            WriteStatus::Probed => Ok(written),
        }
    }
}
