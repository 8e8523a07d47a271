//! Readiness: whether this instance can decide with current policies right now, and if not,
//! why, in words fit for a public endpoint (the raw cause goes to the log).

use super::RateLimiter;
use crate::store::breaker::BreakerState;
use crate::store::{Precondition, WriteKind};

/// Why an instance is not ready.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unready {
    #[error("policies have not been loaded yet")]
    NotLoaded,
    #[error("the policy cache has not been brought up to date for over {0} ms")]
    Stale(u128),
    #[error("policies listed in the configuration file are missing from the store")]
    ConfiguredMissing,
    #[error("the store is unreachable")]
    Unreachable,
    #[error("the store refuses writes (out of memory, or another error it answered with)")]
    RefusesWrites,
}

impl RateLimiter {
    /// `None` when this instance can decide with current policies; otherwise why not. Proves that
    /// the store takes writes with a write that changes nothing, which Redis refuses while out of
    /// memory.
    pub async fn unready(&self) -> Option<Unready> {
        if self.store.status().breaker == Some(BreakerState::Open) {
            return Some(Unready::Unreachable);
        }
        let position = self.cache.position();
        if position.generation.is_none() {
            return Some(Unready::NotLoaded);
        }
        if let Err(e) = self
            .write(WriteKind::Probe, None, None, &Precondition::None, None)
            .await
        {
            tracing::warn!(error = %e, "not ready: the store refused a probe write");
            return Some(if e.class().is_transient() {
                Unready::Unreachable
            } else {
                Unready::RefusesWrites
            });
        }
        if self.sync.is_stale() {
            return Some(Unready::Stale(self.sync.stale_after().as_millis()));
        }
        if !self.sync.seeded_in(position.generation.as_deref()) {
            return Some(Unready::ConfiguredMissing);
        }
        None
    }
}
