//! Overrides: their writes (checked against the policy as the store has it, and refused by the
//! store when the policy changed meanwhile, when another override has the same match, or past
//! the caps), their reads, and `resolve`, which explains what applies to a subject and why.
//!
//! A write is in force on this instance at once, and on every other within the change log's
//! bound (`redis.policy_refresh_ms`); on Redis it is also announced on the denial cache's
//! channel, so that the other instances read the change at once rather than keep a cached
//! denial the override ends (see `upkeep`).

use std::sync::Arc;

use serde_json::Value;

use super::cache::{Applied, Effect};
use super::{denials, RateLimiter, ServiceError};
use crate::policy::overrides::{parse_override, Override, OverrideId, Written};
use crate::policy::{LimitKey, Limits, Policy, PolicyName, ValidationError};
use crate::store::{
    Etag, OverrideCaps, OverrideOp, OverrideStatus, OverrideWrite, OverrideWritten, Precondition,
    Store,
};

/// How many times a write is checked again against a policy that changed under it.
const ATTEMPTS: usize = 3;
/// The most expired overrides one sweep deletes.
const SWEEP: usize = 100;

/// What `resolve` answers for one subject.
#[derive(Debug)]
pub struct Resolution {
    pub policy: Arc<Policy>,
    /// The override that applies now, if one does.
    pub applied: Option<Arc<Applied>>,
    /// The limits the subject is decided with (none under `unlimited` or `block`).
    pub limits: Option<Arc<Limits>>,
    /// Every override matching the key, by precedence, with why each does or does not apply.
    pub candidates: Vec<Candidate>,
    /// The time the answer is for (µs).
    pub at_us: u64,
}

/// One override matching a key, as `resolve` explains it.
#[derive(Debug)]
pub struct Candidate {
    pub applied: Arc<Applied>,
    /// `None` when it applies; otherwise why not.
    pub passed_over: Option<String>,
}

impl RateLimiter {
    /// The caps on one policy's overrides.
    pub fn override_caps(&self) -> OverrideCaps {
        self.override_caps
    }

    /// Creates an override of `policy` from a client's document.
    pub async fn create_override(
        &self,
        policy: &PolicyName,
        body: &Value,
    ) -> Result<(Override, Etag), ServiceError> {
        let id = OverrideId::random();
        self.write_override(
            OverrideOp::Create,
            policy,
            &id,
            Some(body),
            &Precondition::Absent,
        )
        .await
        .and_then(wrote)
    }

    /// Replaces the override `id` of `policy` with a client's document, if `precondition` holds
    /// (its `created_at` is kept).
    pub async fn replace_override(
        &self,
        policy: &PolicyName,
        id: &OverrideId,
        body: &Value,
        precondition: &Precondition,
    ) -> Result<(Override, Etag), ServiceError> {
        self.write_override(OverrideOp::Replace, policy, id, Some(body), precondition)
            .await
            .and_then(wrote)
    }

    /// Checks a client's replacement of the override `id` of `policy` as a write would (the
    /// policy exists and takes it), writing nothing: for a write whose precondition can never
    /// hold, so that bad input is answered as bad input before the 412, as for a policy.
    pub async fn check_override(
        &self,
        policy: &PolicyName,
        id: &OverrideId,
        body: &Value,
    ) -> Result<(), ServiceError> {
        let (current, _) = self.get_policy(policy).await?;
        parse_override(body, &current, Some(id), self.clock.now_us())
            .map(|_| ())
            .map_err(ServiceError::Invalid)
    }

    /// Deletes the override `id` of `policy`, if `precondition` holds.
    pub async fn delete_override(
        &self,
        policy: &PolicyName,
        id: &OverrideId,
        precondition: &Precondition,
    ) -> Result<(), ServiceError> {
        self.write_override(OverrideOp::Delete, policy, id, None, precondition)
            .await
            .map(|_| ())
    }

    async fn write_override(
        &self,
        op: OverrideOp,
        policy: &PolicyName,
        id: &OverrideId,
        body: Option<&Value>,
        precondition: &Precondition,
    ) -> Result<(Option<Override>, Etag), ServiceError> {
        for _ in 0..ATTEMPTS {
            // Checked against the policy as the store has it now; the store refuses the write if
            // the policy is written before it lands.
            let (current, policy_etag) = self.get_policy(policy).await?;
            let doc = match body {
                None => None,
                Some(body) => {
                    let now = self.clock.now_us();
                    let written: Written = parse_override(
                        body,
                        &current,
                        (op != OverrideOp::Create).then_some(id),
                        now,
                    )
                    .map_err(ServiceError::Invalid)?;
                    let created = match op {
                        OverrideOp::Create => now,
                        _ => self
                            .store
                            .read_override(policy, id)
                            .await?
                            .map_or(now, |(o, _)| o.created_at_us),
                    };
                    Some(written.into_override(*id, created))
                }
            };
            let answer = self
                .store
                .write_override(OverrideWrite {
                    op,
                    policy,
                    policy_version: policy_etag.version,
                    id,
                    doc: doc.as_ref(),
                    precondition,
                    caps: self.override_caps,
                })
                .await?;
            match self.written(policy, id, doc, answer).await? {
                Some(done) => return Ok(done),
                None => continue,
            }
        }
        Err(ServiceError::PolicyChanging(policy.to_string()))
    }

    /// What a write's answer means: done (`Some`), to be checked again (`None`: the policy
    /// changed), or refused.
    async fn written(
        &self,
        policy: &PolicyName,
        id: &OverrideId,
        doc: Option<Override>,
        answer: OverrideWritten,
    ) -> Result<Option<(Option<Override>, Etag)>, ServiceError> {
        let current = (answer.etag.version > 0).then(|| answer.etag.clone());
        match answer.status {
            OverrideStatus::Created | OverrideStatus::Replaced | OverrideStatus::Deleted => {
                self.cache
                    .apply_own_override(&answer.etag, policy.as_str(), id, doc.clone());
                self.announce_override_change(policy).await;
                Ok(Some((doc, answer.etag)))
            }
            OverrideStatus::PolicyChanged => Ok(None),
            OverrideStatus::Missing => Err(ServiceError::UnknownOverride(id.to_string())),
            OverrideStatus::Exists => Err(ServiceError::Store(crate::store::StoreError::corrupt(
                "a fresh random override id is taken",
            ))),
            OverrideStatus::NoPolicy => Err(ServiceError::UnknownPolicy(policy.to_string())),
            OverrideStatus::Conflict => Err(ServiceError::OverrideConflict {
                other: answer.other.unwrap_or_default(),
            }),
            OverrideStatus::Full => Err(ServiceError::TooManyOverrides(self.override_caps)),
            OverrideStatus::PreconditionFailed => Err(ServiceError::PreconditionFailed { current }),
        }
    }

    /// Tells every instance that `policy`'s overrides changed, so that each reads the change at
    /// once (an instance holding a cached denial the change ends must not answer it meanwhile).
    /// A message that cannot be sent is logged: the others see the change within the log's
    /// bound.
    async fn announce_override_change(&self, policy: &PolicyName) {
        if !self.store.is_shared() {
            return;
        }
        if let Err(e) = self
            .store
            .publish_invalidation(&denials::overrides_message(policy.as_str()))
            .await
        {
            tracing::warn!(policy = %policy, error = %e, "could not announce an override change; other instances apply it within redis.policy_refresh_ms");
        }
    }

    /// Deletes overrides that have expired (at most [`SWEEP`] a call), each only if it is still
    /// the version this instance has (another instance sweeping too, or a replacement that
    /// extended it, makes the deletion a refusal that changes nothing). An expired override
    /// already applies to nothing; this keeps the lists and the caps from filling with them.
    pub async fn sweep_expired_overrides(&self) {
        let now = self.clock.now_us();
        for (policy, o, etag) in self.cache.expired_overrides(now, SWEEP) {
            let Ok(name) = PolicyName::parse(&policy) else {
                continue;
            };
            let precondition = Precondition::Matches(etag.to_string());
            let written = self
                .store
                .write_override(OverrideWrite {
                    op: OverrideOp::Delete,
                    policy: &name,
                    policy_version: 0,
                    id: &o.id,
                    doc: None,
                    precondition: &precondition,
                    caps: self.override_caps,
                })
                .await;
            match written {
                Ok(answer) => {
                    if let Err(e) = self.written(&name, &o.id, None, answer).await {
                        tracing::debug!(policy = %name, id = %o.id, error = %e, "an expired override was not swept");
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "could not sweep expired overrides; trying again later");
                    return;
                }
            }
        }
    }

    /// One override of `policy` and its ETag, from the store; from the cache while the store is
    /// unreachable.
    pub async fn get_override(
        &self,
        policy: &PolicyName,
        id: &OverrideId,
    ) -> Result<(Override, Etag), ServiceError> {
        let found = match self.store.read_override(policy, id).await {
            Ok(found) => found,
            Err(e) if e.class().may_serve_cached() && self.cache.is_loaded() => {
                tracing::warn!(error = %e, "store unreachable; reading the cached override");
                let generation = self.cache.position().generation;
                self.cache
                    .with_overrides(policy.as_str(), |set| set.and_then(|s| s.get(id)))
                    .zip(generation)
                    .map(|((o, version), generation)| {
                        (
                            (*o).clone(),
                            Etag {
                                generation,
                                version,
                            },
                        )
                    })
            }
            Err(e) => return Err(e.into()),
        };
        match found {
            Some(found) => Ok(found),
            None => {
                // A missing policy is named as such.
                self.get_policy(policy).await?;
                Err(ServiceError::UnknownOverride(id.to_string()))
            }
        }
    }

    /// The overrides of `policy` sorted by id, at most `limit` after the id `after`, and the
    /// cursor of the next page: from this instance's cache brought up to date first (as
    /// [`RateLimiter::list_policies`]).
    pub async fn list_overrides(
        &self,
        policy: &PolicyName,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<(Arc<Override>, Etag)>, Option<String>), ServiceError> {
        if let Err(e) = self.refresh().await {
            if !(e.class().may_serve_cached() && self.cache.is_loaded()) {
                return Err(e.into());
            }
            tracing::warn!(error = %e, "store unreachable; listing cached overrides");
        }
        self.policy(policy.as_str()).await?;
        let generation = self
            .cache
            .position()
            .generation
            .unwrap_or_else(|| Arc::from(""));
        let (found, more) = self.cache.with_overrides(policy.as_str(), |set| {
            set.map(|s| s.page(after, limit)).unwrap_or_default()
        });
        let page: Vec<(Arc<Override>, Etag)> = found
            .into_iter()
            .map(|(o, version)| {
                let etag = Etag {
                    generation: generation.clone(),
                    version,
                };
                (o, etag)
            })
            .collect();
        let next = more
            .then(|| page.last().map(|(o, _)| o.id.to_string()))
            .flatten();
        Ok((page, next))
    }

    /// What applies to the subject `key` of `policy` now, and why: every override matching it, by
    /// precedence, the one that applies, and the limits it is decided with. Consumes nothing.
    pub async fn resolve_key(
        &self,
        policy: &PolicyName,
        key: &LimitKey,
    ) -> Result<Resolution, ServiceError> {
        let found = self.policy(policy.as_str()).await?;
        if found.policy.rate().is_none() {
            return Err(ServiceError::ConcurrencyPolicy(policy.to_string()));
        }
        let now = self.clock.now_us();
        let candidates = self.cache.with_overrides(policy.as_str(), |set| {
            set.map(|s| s.candidates(key.as_str())).unwrap_or_default()
        });
        let applied = candidates.iter().find(|a| a.applies(now)).cloned();
        let limits = match applied.as_deref().map(|a| &a.effect) {
            Some(Effect::Tier { limits, .. }) => Some(limits.clone()),
            Some(Effect::Limits(limits)) => Some(Arc::new(limits.clone())),
            Some(Effect::Unlimited | Effect::Block) => None,
            _ => found.policy.rate().map(|r| Arc::new(r.own().clone())),
        };
        let candidates = candidates
            .into_iter()
            .map(|a| {
                let passed_over = match (&a.effect, &applied) {
                    (Effect::Stale(why), _) => Some(why.clone()),
                    _ if !a.over.is_live(now) => Some(format!(
                        "expired at {}",
                        crate::policy::overrides::rfc3339(a.over.expires_at_us.unwrap_or(0))
                    )),
                    (_, Some(winner)) if winner.over.id != a.over.id => Some(format!(
                        "outranked by override {} (an exact key beats a range, a narrower range a \
                         wider one, a range a prefix, a longer prefix a shorter one)",
                        winner.over.id
                    )),
                    _ => None,
                };
                Candidate {
                    applied: a,
                    passed_over,
                }
            })
            .collect();
        Ok(Resolution {
            policy: found.policy,
            applied,
            limits,
            candidates,
            at_us: now,
        })
    }
}

/// The document a create or a replacement wrote (`write_override` returns one for each).
fn wrote(done: (Option<Override>, Etag)) -> Result<(Override, Etag), ServiceError> {
    match done {
        (Some(o), etag) => Ok((o, etag)),
        (None, _) => Err(ServiceError::Store(crate::store::StoreError::corrupt(
            "an override write answered without its document",
        ))),
    }
}

impl From<ValidationError> for ServiceError {
    fn from(e: ValidationError) -> Self {
        ServiceError::Invalid(e)
    }
}
