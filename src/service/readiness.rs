//! Readiness: whether this instance can decide with current policies right now, and if not,
//! why, in words fit for a public endpoint (the raw cause goes to the log).

use super::RateLimiter;
use crate::store::breaker::BreakerState;
use crate::store::{ErrorClass, Precondition, WriteKind};

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
    /// A Redis Cluster master (`host:port`) refuses writes: its keys' decisions fail.
    #[error(
        "the Redis master {0} refuses writes (out of memory, or another error it answered with)"
    )]
    MasterRefusesWrites(String),
}

impl RateLimiter {
    /// `None` when this instance can decide with current policies; otherwise why not (see
    /// [`RateLimiter::readiness`]).
    pub async fn unready(&self) -> Option<Unready> {
        self.readiness().await.err()
    }

    /// Whether this instance can decide with current policies: `Err` with why not, or `Ok` with
    /// what is degraded meanwhile, if anything. Proves that the store takes writes with a write
    /// that changes nothing, which Redis refuses while out of memory; on a Redis Cluster, on
    /// every master (any one out of memory is named).
    ///
    /// On a Cluster, what one failover does is degraded, not unready: a master that cannot be
    /// reached (its keys answered by fail mode until its replica is promoted) or a cluster that
    /// refuses calls for now (`CLUSTERDOWN` while it promotes one). Every instance sees the same
    /// cluster, so taking them out of rotation would leave a load balancer none; the store is
    /// unreachable only when no master answers.
    pub async fn readiness(&self) -> Result<Option<String>, Unready> {
        if self.store.status().breaker == Some(BreakerState::Open) {
            return Err(Unready::Unreachable);
        }
        let position = self.cache.position();
        if position.generation.is_none() {
            return Err(Unready::NotLoaded);
        }
        let mut degraded: Vec<String> = Vec::new();
        let masters = self.store.probe_masters().await;
        let mut unreachable = 0;
        for (master, answer) in &masters {
            let Err(e) = answer else { continue };
            match e.class() {
                ErrorClass::ClusterRefused => degraded.push(format!(
                    "the Redis Cluster refuses calls for now at {master} (a failover or a slot \
                     migration under way)"
                )),
                class if class.is_transient() => {
                    unreachable += 1;
                    degraded.push(format!(
                        "the Redis master {master} is unreachable: its keys are answered by \
                         their policies' fail mode"
                    ));
                }
                _ => {
                    tracing::warn!(%master, error = %e, "not ready: a Redis master refused a probe write");
                    return Err(Unready::MasterRefusesWrites(master.clone()));
                }
            }
        }
        if !masters.is_empty() && unreachable == masters.len() {
            return Err(Unready::Unreachable);
        }
        if let Err(e) = self
            .write(WriteKind::Probe, None, None, &Precondition::None, None)
            .await
        {
            match e.class() {
                ErrorClass::ClusterRefused => degraded.push(
                    "the Redis Cluster refuses calls for now (a failover or a slot migration \
                     under way); decisions are answered by their policies' fail mode"
                        .to_owned(),
                ),
                // One master of several: policies are served from this instance's cache.
                class if class.is_transient() && !masters.is_empty() => degraded.push(
                    "the Redis master holding the policies is unreachable: policies are served \
                     from this instance's cache and cannot be changed"
                        .to_owned(),
                ),
                class => {
                    tracing::warn!(error = %e, "not ready: the store refused a probe write");
                    return Err(if class.is_transient() {
                        Unready::Unreachable
                    } else {
                        Unready::RefusesWrites
                    });
                }
            }
        }
        if self.sync.is_stale() {
            return Err(Unready::Stale(self.sync.stale_after().as_millis()));
        }
        if !self.sync.seeded_in(position.generation.as_deref()) {
            return Err(Unready::ConfiguredMissing);
        }
        if !degraded.is_empty() {
            static DEGRADED: crate::telemetry::Summarized =
                crate::telemetry::Summarized::per_second();
            if let Some(count) = DEGRADED.hit() {
                tracing::warn!(degraded = %degraded.join("; "), count, "ready, degraded");
            }
        }
        Ok((!degraded.is_empty()).then(|| degraded.join("; ")))
    }
}
