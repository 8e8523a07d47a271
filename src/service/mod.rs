//! The rate limiter as the API sees it: acquires decided by the store with the cached policy,
//! and what to answer when the store fails.
//!
//! Acquires read the policy from the in-process cache ([`cache`]) and make one store call. When
//! the store cannot answer, the policy's fail mode decides: `open` allows, `closed` refuses,
//! `local` decides with an in-process store until the shared one is back. Acquires, peeks,
//! reports, refunds and resets are for rate policies; leases on concurrency policies are in
//! [`leases`], their ids in [`lease_id`], the undoing of those the store may have run after it
//! failed on them in [`undo`]. How the cache follows the store, and policy reads and
//! writes, are in [`policies`]; readiness in [`readiness`]. Repeated acquires of a subject
//! that Redis denied are answered by this instance until their retry time ([`denials`]).
//! Several subjects decided as one request, all or nothing (Envoy's descriptors), are in
//! [`joint`].

mod answer;
pub mod cache;
pub mod clock;
mod counters;
pub mod denials;
mod error;
pub mod fail_mode;
pub mod joint;
pub mod lease_id;
pub mod leases;
pub mod policies;
pub mod readiness;
pub mod resolve;
pub mod ticket;
pub mod undo;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use metrics::Histogram;

use crate::config::LimitsSettings;
use crate::limiter::{Decision, Op, Verdict};
use crate::metrics as m;
use crate::policy::{Kind, LimitKey, Policy};
use crate::store::breaker::BreakerState;
use crate::store::memory::system_now_us;
use crate::store::{AnyStore, MemoryStore, Plan, Store, StoreError};
use crate::telemetry::Summarized;

pub use crate::store::Ask;
pub use answer::{Acquired, DecidedBy};
pub use cache::PolicyCache;
pub use clock::Clock;
use counters::DecisionCounters;
use denials::Lookup;
pub use error::ServiceError;
pub use joint::Hit;
pub use lease_id::LeaseId;
pub use leases::{Leased, Released};
pub use policies::PolicySync;
use resolve::Resolved;
pub use ticket::Ticket;

pub struct RateLimiter {
    store: AnyStore,
    cache: PolicyCache,
    sync: PolicySync,
    /// What each fail mode answers when the store fails, and the in-process store that `local`
    /// decides with while a shared store is unreachable.
    fail_modes: fail_mode::FailModes,
    /// The time decisions are made at: the store's, or one set by hand in tests.
    clock: Clock,
    counters: RwLock<HashMap<Arc<str>, Arc<DecisionCounters>>>,
    leases: leases::LeaseMetrics,
    /// Lease calls to undo on the shared store once it answers (see [`undo`]).
    undos: Arc<undo::UndoQueue>,
    /// `limits.lease_sweep_budget`, and where the next sweep starts among the indexed ledgers.
    sweep_budget: usize,
    sweep_cursor: std::sync::atomic::AtomicUsize,
    acquire_seconds: Histogram,
    /// `limits.shadow`: every policy in shadow mode.
    shadow: bool,
    /// Denials answered without asking Redis; `None` without Redis or with `limits.denial_cache`
    /// off.
    denials: Option<Arc<denials::DenialCache>>,
    /// The keys that sign and verify tickets: the store's shared ring on Redis (loaded by
    /// [`RateLimiter::load_ticket_keys`]), a random key of this process on the embedded store.
    tickets: ticket::Keyring,
    /// Ticket ids: a bijection of a random seed and a counter, so unique in this process and
    /// unrelated across processes.
    ticket_seed: u64,
    ticket_count: AtomicU64,
    /// When the ring was last read again for a ticket signed by a key it did not hold.
    ticket_keys_read: Mutex<Option<Instant>>,
    /// `limits.ticketless_refunds`.
    ticketless_refunds: bool,
}

/// A bijection of u64 (SplitMix64's finaliser): distinct counters give distinct ids.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl RateLimiter {
    /// `configured` are the policies of the configuration file, created once per store
    /// generation; `max_policies` bounds the store's policy set; the cache counts as stale when
    /// it has not been refreshed for `stale_after`; `max_embedded_subjects` caps the in-process
    /// store that `local` fail mode decides with.
    pub fn new(
        store: AnyStore,
        key_prefix: &str,
        configured: Vec<Policy>,
        limits: &LimitsSettings,
        stale_after: Duration,
    ) -> Self {
        let local = store
            .is_shared()
            .then(|| MemoryStore::new(key_prefix, limits.max_embedded_subjects));
        let denials = (store.is_shared() && limits.denial_cache).then(|| {
            let entries = usize::try_from(limits.denial_cache_entries).unwrap_or(usize::MAX);
            Arc::new(denials::DenialCache::new(
                entries,
                limits.denial_cache_bound(),
            ))
        });
        // Installs the recorder before the first counter is registered.
        let _ = m::handle();
        let mut seed = [0u8; 8];
        // Without randomness (never on a working system) ids still differ within the process.
        let _ = getrandom::fill(&mut seed);
        let tickets = if store.is_shared() {
            // The ring is the store's: read by `load_ticket_keys`.
            ticket::Keyring::default()
        } else {
            // Without Redis the key is this process's own: its tickets end with it, as its
            // state does. (A missing random key leaves the ring empty: no tickets are issued.)
            ticket::Key::random(1)
                .map(ticket::Keyring::of)
                .unwrap_or_default()
        };
        Self {
            store,
            cache: PolicyCache::default(),
            sync: PolicySync::new(configured, limits.max_policies, stale_after),
            fail_modes: fail_mode::FailModes::new(local),
            clock: Clock::store(),
            counters: RwLock::default(),
            leases: leases::LeaseMetrics::default(),
            undos: Arc::new(undo::UndoQueue::new(limits.lease_undo_queue)),
            sweep_budget: limits.lease_sweep_budget,
            sweep_cursor: std::sync::atomic::AtomicUsize::new(0),
            acquire_seconds: metrics::histogram!(m::ACQUIRE_SECONDS),
            shadow: limits.shadow,
            denials,
            tickets,
            ticket_seed: u64::from_le_bytes(seed),
            ticket_count: AtomicU64::new(0),
            ticket_keys_read: Mutex::new(None),
            ticketless_refunds: limits.ticketless_refunds,
        }
    }

    /// Whether a refund may come without a ticket (`limits.ticketless_refunds`), as Envoy's
    /// `is_negative_hits` do.
    pub fn allows_ticketless_refunds(&self) -> bool {
        self.ticketless_refunds
    }

    /// Reads the ring of ticket keys from Redis, creating its first key when there is none
    /// (atomically, so that every instance starting at once signs with the same key). Nothing
    /// to do on the embedded store.
    pub async fn load_ticket_keys(&self) -> Result<(), StoreError> {
        let fresh = || {
            let key = ticket::Key::random(1).map_err(|e| {
                StoreError::server(format!("no random bytes for a ticket key: {e}"))
            })?;
            Ok(ticket::Keyring::text_of(&key))
        };
        let Some(text) = self.store.ticket_keys(fresh).await? else {
            return Ok(());
        };
        self.tickets
            .load(&text)
            .map_err(|e| StoreError::corrupt(format!("the ticket key ring: {e}")))
    }

    /// Rotates the ticket keys (`POST /v1/tickets/rotate`): a fresh key signs from now on, the
    /// current one becomes the previous one and still verifies, and the previous one ends (its
    /// tickets are refused). Every instance reads the ring again within `redis.policy_refresh_ms`,
    /// or at once on a ticket signed by a key it does not hold. Answers the new key's id.
    pub async fn rotate_ticket_keys(&self) -> Result<u32, ServiceError> {
        let mut fresh = [0u8; ticket::KEY_BYTES];
        getrandom::fill(&mut fresh)
            .map_err(|e| StoreError::server(format!("no random bytes for a ticket key: {e}")))?;
        let text = match self.store.rotate_ticket_keys(&fresh).await? {
            Some(text) => text,
            // The embedded store keeps no ring: this process's own is rotated here.
            None => ticket::rotated(self.tickets.current_text().as_deref(), fresh),
        };
        self.tickets
            .load(&text)
            .map_err(|e| StoreError::corrupt(format!("the ticket key ring: {e}")))?;
        Ok(self.tickets.current_id().unwrap_or(0))
    }

    pub fn store(&self) -> &AnyStore {
        &self.store
    }

    pub fn cache(&self) -> &PolicyCache {
        &self.cache
    }

    pub fn sync(&self) -> &PolicySync {
        &self.sync
    }

    /// The service's clock: tests that drive time set it.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Decides one acquire of `cost` units for the policy named `name` (already checked with
    /// [`crate::policy::PolicyName::check`]).
    pub async fn acquire(
        &self,
        name: &str,
        key: &LimitKey,
        cost: u64,
    ) -> Result<Acquired, ServiceError> {
        self.decide(name, key, Ask::Acquire { cost }).await
    }

    /// Decides one operation for the policy named `name` (already checked with
    /// [`crate::policy::PolicyName::check`]): an acquire or a peek of at most the quota of every
    /// limit, a report, or a refund (of at most its ticket's units, within its windows, when it
    /// names one). See [`RateLimiter::resolve`].
    pub async fn decide(
        &self,
        name: &str,
        key: &LimitKey,
        ask: Ask<&str>,
    ) -> Result<Acquired, ServiceError> {
        let started = Instant::now();
        let resolved = self.resolve(name, key, ask).await?;
        self.decide_resolved(resolved, key, started).await
    }

    /// Decides a resolved request: by the local denial cache, the store, or, when the store
    /// fails, the fail mode; then counts it and issues its ticket.
    pub(super) async fn decide_resolved(
        &self,
        resolved: Resolved,
        key: &LimitKey,
        started: Instant,
    ) -> Result<Acquired, ServiceError> {
        let plan = resolved.plan(key, self.clock.at_us());
        let result = self.ask_store(&plan, &resolved, started).await;
        let (op, cost) = (plan.op(), plan.cost());
        if op == Op::Acquire {
            self.acquire_seconds.record(started.elapsed().as_secs_f64());
        }
        let (verdict, decided_by) = result?;
        let Resolved {
            policy,
            etag,
            shadow,
            ..
        } = resolved;
        let degraded = decided_by.is_degraded();
        let counters = self.counters(&policy);
        if decided_by == DecidedBy::LocalCache {
            counters.cache_hits.increment(1);
        }
        // A refund, a report or a reset may give units back or move the retry time: every
        // instance's cached denial of the subject goes.
        if matches!(op, Op::Report | Op::Refund)
            && !degraded
            && verdict.units().iter().any(|u| *u > 0)
        {
            self.invalidate_denials(&policy, key).await;
        }
        counters.count(op, cost, &verdict, degraded, shadow);
        // What was taken, for a refund: an allowed acquire's cost, or what a report recorded.
        // A fail-open answer took nothing.
        let taken = match op {
            Op::Acquire if verdict.allowed => cost,
            Op::Report => verdict.units().iter().copied().max().unwrap_or(0),
            _ => 0,
        };
        let ticket = (taken > 0 && decided_by != DecidedBy::FailOpen)
            .then(|| {
                let id = mix(self.ticket_seed ^ self.ticket_count.fetch_add(1, Ordering::Relaxed));
                self.tickets.issue(&policy, key, taken, &verdict, id)
            })
            .flatten();
        Ok(Acquired {
            op,
            policy,
            etag,
            verdict,
            degraded,
            decided_by,
            shadow,
            ticket,
        })
    }

    /// The verdict for `plan` and who gave it: a cached denial, the store's, or the fail mode's
    /// when the store fails.
    async fn ask_store(
        &self,
        plan: &Plan<'_>,
        resolved: &Resolved,
        started: Instant,
    ) -> Result<(Verdict, DecidedBy), ServiceError> {
        // Only an enforced acquire of 1 unit of a one-limit policy meets the denial cache (see
        // `denials`: a larger cost's retry time is its own).
        let denials = match &self.denials {
            Some(d)
                if plan.op() == Op::Acquire
                    && plan.cost() == 1
                    && !resolved.shadow
                    && plan.params.len() == 1 =>
            {
                Some(d)
            }
            _ => None,
        };
        let (name, version, key) = (
            plan.policy.name.as_str(),
            resolved.etag.version,
            plan.key.as_str(),
        );
        let lookup = denials.map(|d| d.check(name, version, key, started));
        if let Some(Lookup::Hit(denied)) = lookup {
            return Ok((
                cached_denial(denied, self.clock.now_us()),
                DecidedBy::LocalCache,
            ));
        }
        match self.store.decide(plan).await {
            Ok(verdict) => {
                if let (Some(d), Some(Lookup::Miss(Some(ticket)))) = (denials, lookup) {
                    if let Some(denied) = denial_of(&verdict) {
                        d.insert(name, version, key, ticket, denied, Instant::now());
                    }
                }
                Ok((verdict, self.store_decider()))
            }
            Err(e) => Ok(self.fail_modes.decision(plan, e, self.clock.now_us())?),
        }
    }

    /// Deletes the subject `key`'s state for every limit of the policy named `name`, or, of a
    /// concurrency policy, ends every lease of the subject (their ids are unknown from then on:
    /// a support tool for a stuck holder). Not a decision: a failing store is an error whatever
    /// the fail mode (`local` also clears this instance's own state, so that the reset holds for
    /// what it decides meanwhile).
    pub async fn reset(&self, name: &str, key: &LimitKey) -> Result<(), ServiceError> {
        let (policy, _) = self.policy(name).await?;
        match policy.kind {
            Kind::Concurrency(_) => {
                self.reset_leases(&policy, key).await?;
                self.counters(&policy).resets.increment(1);
                return Ok(());
            }
            Kind::Rate(_) => {}
        }
        if let Some(local) = self.fail_modes.local() {
            local.clear(&policy, key);
        }
        self.store.reset(&policy, key).await?;
        self.invalidate_denials(&policy, key).await;
        self.counters(&policy).resets.increment(1);
        Ok(())
    }

    /// Drops this instance's cached denial of the subject, and tells every instance to (see
    /// `denials`). A message that cannot be sent is logged: the other instances' entries end by
    /// their bound, `limits.denial_cache_ms`.
    async fn invalidate_denials(&self, policy: &Policy, key: &LimitKey) {
        if !self.store.is_shared() {
            return;
        }
        if let Some(d) = &self.denials {
            d.invalidate(policy.name.as_str(), key.as_str());
        }
        let message = denials::message(policy.name.as_str(), key.as_str());
        if let Err(e) = self.store.publish_invalidation(&message).await {
            static UNSENT: Summarized = Summarized::per_second();
            if let Some(count) = UNSENT.hit() {
                tracing::warn!(policy = %policy.name, error = %e, count, "could not publish a denial cache invalidation; other instances' cached denials of the subject end by limits.denial_cache_ms");
            }
        }
    }

    fn counters(&self, policy: &Policy) -> Arc<DecisionCounters> {
        let name = policy.name.as_str();
        if let Some(c) = self
            .counters
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            return c.clone();
        }
        self.counters
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(Arc::from(name))
            .or_insert_with(|| Arc::new(DecisionCounters::new(name)))
            .clone()
    }

    /// Who decides when the store answers.
    fn store_decider(&self) -> DecidedBy {
        if self.store.is_shared() {
            DecidedBy::Redis
        } else {
            DecidedBy::Embedded
        }
    }

    /// The in-process store: the main one, or the one `local` fail mode decides with.
    fn memory(&self) -> Option<&MemoryStore> {
        self.store.embedded().or(self.fail_modes.local())
    }

    /// The Prometheus text exposition, with the state gauges brought up to date.
    pub fn render_metrics(&self) -> String {
        metrics::gauge!(m::POLICIES).set(self.cache.len() as f64);
        let position = self.cache.position();
        metrics::gauge!(m::POLICY_VERSION).set(position.applied as f64);
        if let Some(age) = self.sync.age() {
            metrics::gauge!(m::POLICY_AGE).set(age.as_secs_f64());
        }
        if let Some(memory) = self.memory() {
            metrics::gauge!(m::EMBEDDED_SUBJECTS).set(memory.len() as f64);
        }
        let status = self.store.status();
        if let Some(current) = status.breaker {
            for state in [
                BreakerState::Closed,
                BreakerState::HalfOpen,
                BreakerState::Open,
            ] {
                metrics::gauge!(m::BREAKER_STATE, "state" => state.as_str())
                    .set(f64::from(u8::from(state == current)));
            }
        }
        if let Some(d) = &self.denials {
            metrics::gauge!(m::DENIAL_CACHE_ENTRIES).set(d.len() as f64);
        }
        for (master, state) in self.store.master_breakers() {
            metrics::gauge!(m::MASTER_BREAKER_OPEN, "master" => master)
                .set(f64::from(u8::from(state == BreakerState::Open)));
        }
        if let Some((in_use, idle)) = status.connections {
            metrics::gauge!(m::POOL_CONNECTIONS, "state" => "in_use").set(f64::from(in_use));
            metrics::gauge!(m::POOL_CONNECTIONS, "state" => "idle").set(f64::from(idle));
        }
        m::handle().render()
    }

    /// Keeps the cache in step with the store, and in-process memory bounded, until the
    /// process ends; and, with the denial cache, listens for its invalidations.
    pub fn spawn_background(self: &Arc<Self>, refresh_every: Duration) {
        if self.denials.is_some() {
            tokio::spawn(listen_for_invalidations(Arc::downgrade(self)));
        }
        tokio::spawn(undo::drain_forever(
            Arc::downgrade(self),
            self.undos.clone(),
        ));
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(refresh_every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_housekeeping = Instant::now();
            loop {
                tick.tick().await;
                let Some(this) = weak.upgrade() else { return };
                if let Err(e) = this.refresh().await {
                    tracing::debug!(error = %e, "could not refresh policies; serving the cached ones");
                }
                // A rotation made by another instance: signed with from now on.
                if let Err(e) = this.load_ticket_keys().await {
                    tracing::debug!(error = %e, "could not read the ticket keys; keeping the last ones");
                }
                if last_housekeeping.elapsed() >= Duration::from_secs(1) {
                    last_housekeeping = Instant::now();
                    let now = system_now_us();
                    if let Some(memory) = this.memory() {
                        let evicted = memory.evict_expired(now);
                        tracing::trace!(evicted, "evicted expired state");
                    }
                    this.sweep_leases().await;
                    if let Err(e) = this.store.housekeeping().await {
                        tracing::debug!(error = %e, "could not read the cluster's slot map; keeping the last one");
                    }
                    m::handle().run_upkeep();
                }
            }
        });
    }
}

/// Keeps the denial cache subscribed to its invalidations, using it only while subscribed (see
/// `denials`): subscribes, drops the entry of each subject named, and when the subscription
/// ends, empties the cache and subscribes again a second later. Ends with the limiter.
async fn listen_for_invalidations(limiter: std::sync::Weak<RateLimiter>) {
    use futures_util::StreamExt;
    loop {
        let Some(this) = limiter.upgrade() else {
            return;
        };
        let Some(cache) = this.denials.clone() else {
            return;
        };
        let Some(subscribed) = this.store.invalidations().await else {
            return;
        };
        drop(this);
        match subscribed {
            Ok(mut messages) => {
                cache.set_live(true);
                tracing::debug!("denial cache subscribed to its invalidations");
                let received = metrics::counter!(m::DENIAL_CACHE_INVALIDATIONS);
                while let Some(message) = messages.next().await {
                    if let Some((policy, key)) = denials::parse_message(&message) {
                        cache.invalidate(policy, key);
                        received.increment(1);
                    }
                }
                cache.set_live(false);
                tracing::warn!("the denial cache's subscription ended; every acquire asks Redis until it is subscribed again");
            }
            Err(e) => {
                tracing::debug!(error = %e, "could not subscribe the denial cache; every acquire asks Redis meanwhile");
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A denial from the cache as the verdict of a one-limit policy: nothing left, and the times as
/// the cache counts them down.
fn cached_denial(denied: denials::Denied, now_us: u64) -> Verdict {
    let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    let mut verdict = Verdict::at(now_us);
    verdict.push(Decision {
        allowed: false,
        remaining: 0,
        reset_after_us: us(denied.reset_after),
        retry_after_us: us(denied.retry_after),
    });
    verdict
}

/// What the cache keeps of Redis's denial of 1 unit of a one-limit policy: its times, when it
/// shows nothing left (always, for a denial of 1 unit; checked all the same).
fn denial_of(verdict: &Verdict) -> Option<denials::Denied> {
    match verdict.limits() {
        [d] if !d.allowed && d.remaining == 0 && d.retry_after_us > 0 => Some(denials::Denied {
            retry_after: Duration::from_micros(d.retry_after_us),
            reset_after: Duration::from_micros(d.reset_after_us),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
