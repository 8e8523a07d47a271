//! The rate limiter as the API sees it: what the application does with a request, one job per
//! file.
//!
//! A request becomes a value first: [`resolve`] reads the policy from the in-process cache
//! ([`cache`]), checks its kind and the cost, turns a refund's ticket into its marks, and builds
//! the [`crate::store::Plan`] a store decides; the time comes from the service's [`clock`] (the
//! store's own, or one set by hand in tests). Then, for rate policies, `decisions` (`acquire`,
//! `peek`, `report`, `refund`, `reset`) asks the local denial cache ([`denials`]: repeated
//! acquires of a subject that Redis denied are answered by this instance until their retry
//! time) or the store, counts the answer (`counters`) and issues its ticket ([`ticket`]);
//! several subjects decided as one request, all or nothing (Envoy's descriptors), are
//! [`joint`]; leases on concurrency policies are [`leases`], their ids [`lease_id`], the undoing
//! of those the store may have run after it failed on them [`undo`]. When the store cannot
//! answer, every kind of call goes by one table: [`fail_mode`] (`open` allows, `closed` refuses,
//! `local` decides with an in-process store until the shared one is back). How the cache
//! follows the store, and policy reads and writes, are in [`policies`]; overrides (per-subject
//! limits: their writes, reads and the explanation of what applies) in [`overrides`], their
//! lookup in `resolve`; readiness in
//! [`readiness`]; the background loop and the gauges in `upkeep`; answers and errors in
//! `answer` and `error`. Who is denied, allowed or near the limit most: [`top`], counted
//! beside the counters of every acquire.

mod answer;
pub mod cache;
pub mod clock;
mod counters;
mod decisions;
pub mod denials;
mod error;
pub mod fail_mode;
pub mod joint;
pub mod lease_id;
pub mod leases;
pub mod overrides;
pub mod policies;
pub mod readiness;
pub mod resolve;
pub mod ticket;
pub mod top;
pub mod undo;
mod upkeep;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics::Histogram;

use crate::config::LimitsSettings;
use crate::metrics as m;
use crate::policy::Policy;
use crate::store::{AnyStore, MemoryStore, StoreError};

pub use crate::store::Ask;
pub use answer::{Acquired, DecidedBy};
pub use cache::{Found, PolicyCache};
pub use clock::Clock;
pub use error::ServiceError;
pub use joint::Hit;
pub use lease_id::LeaseId;
pub use leases::{Leased, Released};
pub use policies::PolicySync;
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
    /// `limits.max_exact_overrides` and `limits.max_pattern_overrides`.
    override_caps: crate::store::OverrideCaps,
    /// Every policy's top offenders (see [`top`]).
    top: top::Top,
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
            override_caps: crate::store::OverrideCaps {
                exact: limits.max_exact_overrides,
                patterns: limits.max_pattern_overrides,
            },
            top: top::Top::new(&crate::config::TopSettings::default()),
        }
    }

    /// The same service, counting its top offenders as `settings` say (`top.*`).
    pub fn with_top(mut self, settings: &crate::config::TopSettings) -> Self {
        self.top = top::Top::new(settings);
        self
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
}

#[cfg(test)]
mod tests;
