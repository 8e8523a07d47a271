//! What runs beside the requests: the top offenders' fold (`top`), the background loop (the policy cache following the store,
//! the ticket key ring, the in-process stores' eviction, the lease sweep, the store's own
//! housekeeping), the denial cache's subscription to its invalidations, and the state gauges
//! brought up to date for `/metrics`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{denials, undo, RateLimiter};
use crate::metrics as m;
use crate::policy::Policy;
use crate::store::breaker::BreakerState;
use crate::store::memory::system_now_us;

impl RateLimiter {
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
        let mut out = m::Exposition::new(m::handle().render());
        let (versions, behind) = self.sync.lag(position.applied);
        out.gauge(
            m::POLICY_LAG_VERSIONS,
            "Policy change-log versions the store has that this instance's cache has not applied",
            [(Vec::new(), versions as f64)],
        );
        out.gauge(
            m::POLICY_LAG_SECONDS,
            "Seconds since this instance's policy cache was last known current with the store (0 while current)",
            [(Vec::new(), behind.as_secs_f64())],
        );
        let policies = self.cache.list();
        out.gauge(
            m::LIMIT_QUOTA,
            "Configured quota of each limit of each rate policy, and of each of its tiers",
            policies.iter().flat_map(|(p, _)| quotas(p)),
        );
        out.into_text()
    }

    /// Keeps the cache in step with the store, and in-process memory bounded, until the
    /// process ends; and, with the denial cache, listens for its invalidations.
    pub fn spawn_background(self: &Arc<Self>, refresh_every: Duration) {
        if self.denials.is_some() {
            tokio::spawn(listen_for_invalidations(Arc::downgrade(self)));
        }
        tokio::spawn(super::top::fold_forever(Arc::downgrade(self)));
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
                    this.sweep_expired_overrides().await;
                    if let Err(e) = this.store.housekeeping().await {
                        tracing::debug!(error = %e, "could not read the cluster's slot map; keeping the last one");
                    }
                    m::handle().run_upkeep();
                }
            }
        });
    }
}

/// The `ratelimiter_limit_quota` samples of a policy: each limit's quota, with `tier=""`, then
/// each tier's limits with the tier's name. None for a concurrency policy.
fn quotas(policy: &Policy) -> Vec<(Vec<(&str, &str)>, f64)> {
    let Some(rate) = policy.rate() else {
        return Vec::new();
    };
    let name = policy.name.as_str();
    let own = std::iter::once(("", rate.limits()));
    let tiers = rate
        .tiers()
        .iter()
        .map(|(tier, t)| (tier.as_str(), t.limits.limits()));
    let mut out = Vec::new();
    for (tier, limits) in own.chain(tiers) {
        for l in limits {
            let labels = vec![("policy", name), ("limit", l.name.as_str()), ("tier", tier)];
            out.push((labels, l.params.quota() as f64));
        }
    }
    out
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
                    if let Some(policy) = denials::parse_overrides_message(&message) {
                        // Another instance changed the policy's overrides: read the change now,
                        // which also moves the policy's denials to a new version (none cached
                        // before it is answered after it).
                        if let Some(this) = limiter.upgrade() {
                            tracing::debug!(
                                policy,
                                "overrides changed on another instance; refreshing"
                            );
                            tokio::spawn(async move {
                                if let Err(e) = this.refresh().await {
                                    tracing::debug!(error = %e, "could not refresh after an override change");
                                }
                            });
                        }
                        received.increment(1);
                    } else if let Some((policy, key)) = denials::parse_message(&message) {
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
