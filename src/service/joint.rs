//! Several subjects decided as one request: the Envoy descriptors of one `ShouldRateLimit` call.
//!
//! All or nothing: when any enforced descriptor denies, none of them keeps anything. How that
//! holds depends on the store:
//! - The embedded store and one Redis decide every enforced subject in one atomic step
//!   (`Store::acquire_joint`: the shards' locks, or one script), when their limits number at most
//!   `MAX_JOINT_LIMITS` in all.
//! - A Redis Cluster keeps different subjects on different slots, which no one script may touch.
//!   There (and past `MAX_JOINT_LIMITS` limits) the subjects are decided one after another, in
//!   order; at the first denial the rest are only looked at (a peek), and what the earlier ones
//!   took is refunded with their tickets. Nothing stays taken, but between the take and the
//!   refund (one round trip) another request may find those units gone.
//!
//! Around that step: two descriptors that name the same policy and subject are one subject,
//! decided once for the sum of their costs; a descriptor of cost 0 (`hits_addend` set to 0)
//! takes nothing and answers what an acquire of 1 unit would (a peek); a policy in shadow mode
//! is decided after the others, on its own (it answers allowed whatever it decides), taking only
//! when they allowed; a cost above a limit's quota denies without asking the store. A
//! descriptor's own `limit` ([`Hit::limit`]) is decided with where its policy allows one and no
//! override applies (`resolve`); a subject named twice takes the first one's.

use super::cache::{Effect, Found};
use super::resolve::{given_limits, Resolved};
use std::time::Instant;

use super::{Acquired, DecidedBy, RateLimiter, ServiceError};
use crate::limiter::{Decision, Op, Verdict};
use crate::policy::request_limits::Requested;
use crate::policy::{LimitKey, Mode};
use crate::store::{joint_limits, Ask, Plan, Store, MAX_JOINT_LIMITS};

/// One descriptor's subject, as matched to its policy, and the units it asks for.
#[derive(Debug, Clone)]
pub struct Hit {
    /// The policy that serves the descriptor, as the cache has it.
    pub found: Found,
    pub key: LimitKey,
    /// Units to take; 0 takes nothing (a peek of 1 unit).
    pub cost: u64,
    /// The limit the descriptor gave (its `limit`), when its policy lets requests give one:
    /// decided with as `resolve` says (clamped, and only where no override applies).
    pub limit: Option<Requested>,
}

/// One subject of the request: the asks that name it, their summed cost, and the first one's
/// limit (every one within the policy's maximum, whichever it is).
struct Subject {
    found: Found,
    key: LimitKey,
    cost: u64,
    limit: Option<Requested>,
}

/// How a subject is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Enforced,
    /// Above its tightest limit's quota: denied, never sent.
    AboveQuota,
    Shadow,
    Peek,
}

impl RateLimiter {
    /// Decides `hits` together, all or nothing (see the module documentation), and answers one
    /// [`Acquired`] per hit, in order. Fails as a lone acquire would (`fail_mode: closed` and an
    /// unreachable store): the request as a whole gets no answer.
    pub async fn acquire_together(&self, hits: &[Hit]) -> Result<Vec<Acquired>, ServiceError> {
        let started = Instant::now();
        // One subject per (policy, key): hits naming the same one add up their costs.
        let mut subjects: Vec<Subject> = Vec::with_capacity(hits.len());
        let mut of_ask = Vec::with_capacity(hits.len());
        for ask in hits {
            let same = subjects
                .iter()
                .position(|s| s.found.policy.name == ask.found.policy.name && s.key == ask.key);
            match same {
                Some(i) => {
                    subjects[i].cost = subjects[i].cost.saturating_add(ask.cost);
                    of_ask.push(i);
                }
                None => {
                    of_ask.push(subjects.len());
                    subjects.push(Subject {
                        found: ask.found.clone(),
                        key: ask.key.clone(),
                        cost: ask.cost,
                        limit: ask.limit,
                    });
                }
            }
        }
        let kinds: Vec<Kind> = subjects
            .iter()
            .map(|s| {
                let quota = self.quota_of(s);
                if s.cost == 0 {
                    Kind::Peek
                } else if self.shadow || s.found.policy.mode() == Mode::Shadow {
                    Kind::Shadow
                } else if s.cost > quota {
                    Kind::AboveQuota
                } else {
                    Kind::Enforced
                }
            })
            .collect();
        let mut answers: Vec<Option<Acquired>> = subjects.iter().map(|_| None).collect();

        let enforced: Vec<usize> = (0..subjects.len())
            .filter(|&i| kinds[i] == Kind::Enforced)
            .collect();
        let above = kinds.contains(&Kind::AboveQuota);
        let allowed = if above {
            // Denied whatever the others say: nothing is taken, each is looked at.
            for &i in &enforced {
                answers[i] = Some(self.look(&subjects[i]).await?);
            }
            false
        } else {
            self.decide_enforced(&subjects, &enforced, &mut answers)
                .await?
        };
        for (i, s) in subjects.iter().enumerate() {
            match kinds[i] {
                Kind::Enforced => {}
                Kind::AboveQuota => {
                    let mut a = self.look(s).await?;
                    // Nothing can admit this cost: the limits it exceeds deny.
                    let mut verdict = Verdict::at(a.verdict.at_us);
                    let limits = a.limits().to_vec();
                    for (l, d) in limits.iter().zip(a.verdict.limits()) {
                        let exceeds = s.cost > l.params.quota();
                        verdict.push(Decision {
                            allowed: d.allowed && !exceeds,
                            retry_after_us: if exceeds {
                                crate::limiter::MAX_WAIT_US
                            } else {
                                d.retry_after_us
                            },
                            ..*d
                        });
                    }
                    verdict.allowed = false;
                    a.verdict = verdict;
                    a.op = Op::Acquire;
                    answers[i] = Some(a);
                }
                Kind::Shadow => {
                    let op = if allowed { Op::Acquire } else { Op::Peek };
                    let cost = s.cost.min(self.quota_of(s));
                    let cost = cost.max(1);
                    let ask = match op {
                        Op::Acquire => Ask::Acquire { cost },
                        _ => Ask::Peek { cost },
                    };
                    answers[i] = Some(self.decide_subject(s, ask).await?);
                }
                Kind::Peek => answers[i] = Some(self.look(s).await?),
            }
        }
        if enforced.len() > 1 {
            self.acquire_seconds.record(started.elapsed().as_secs_f64());
        }
        Ok(of_ask
            .into_iter()
            .filter_map(|i| answers[i].clone())
            .collect())
    }

    /// Decides `ask` for one hit alone (a negative hit's refund), with the policy its descriptor
    /// matched and the limit it gave.
    pub async fn decide_hit(&self, hit: &Hit, ask: Ask<&str>) -> Result<Acquired, ServiceError> {
        let subject = Subject {
            found: hit.found.clone(),
            key: hit.key.clone(),
            cost: hit.cost,
            limit: hit.limit,
        };
        self.decide_subject(&subject, ask).await
    }

    /// The most units the subject can be granted at once: the tightest of the limits it is
    /// decided with (an override's, the request's, or its policy's); unbounded under an
    /// `unlimited` or `block` override, which no cost exceeds.
    fn quota_of(&self, s: &Subject) -> u64 {
        let (found, key) = (&s.found, &s.key);
        let now = self.clock.now_us();
        let applied = (found.overrides_changed > 0)
            .then(|| {
                self.cache
                    .override_for(found.policy.name.as_str(), key.as_str(), now)
            })
            .flatten();
        match applied.as_deref().map(|a| &a.effect) {
            Some(Effect::Tier { limits, .. }) => limits.tightest().params.quota(),
            Some(Effect::Limits(limits)) => limits.tightest().params.quota(),
            Some(Effect::Unlimited | Effect::Block) => u64::MAX,
            _ => match given_limits(&found.policy, applied.as_deref(), s.limit) {
                Some(given) => given.tightest().params.quota(),
                None => found
                    .policy
                    .rate()
                    .map_or(0, |r| r.tightest().params.quota()),
            },
        }
    }

    /// What an acquire of 1 unit would answer for the subject, taking nothing.
    async fn look(&self, s: &Subject) -> Result<Acquired, ServiceError> {
        self.decide_subject(s, Ask::Peek { cost: 1 }).await
    }

    /// Decides `ask` for the subject alone, with the policy its descriptor matched.
    async fn decide_subject(&self, s: &Subject, ask: Ask<&str>) -> Result<Acquired, ServiceError> {
        let started = Instant::now();
        let resolved = self
            .resolve_with(s.found.clone(), &s.key, ask, s.limit)
            .await?;
        self.decide_resolved(resolved, &s.key, started).await
    }

    /// Decides the enforced subjects `which`, all or nothing; answers whether they were allowed.
    async fn decide_enforced(
        &self,
        subjects: &[Subject],
        which: &[usize],
        answers: &mut [Option<Acquired>],
    ) -> Result<bool, ServiceError> {
        match which {
            [] => return Ok(true),
            [one] => {
                let s = &subjects[*one];
                let a = self
                    .decide_subject(s, Ask::Acquire { cost: s.cost })
                    .await?;
                let allowed = a.verdict.allowed;
                answers[*one] = Some(a);
                return Ok(allowed);
            }
            _ => {}
        }
        let mut resolved = Vec::with_capacity(which.len());
        for &i in which {
            let s = &subjects[i];
            let ask = Ask::Acquire { cost: s.cost };
            let r = self
                .resolve_with(s.found.clone(), &s.key, ask, s.limit)
                .await?;
            resolved.push(r);
        }
        // Subjects an override decides alone (`unlimited`, `block`) take no part in the joint
        // step: a block denies the whole request (the others are only looked at), an unlimited
        // subject is allowed beside whatever the others decide.
        if resolved.iter().any(Resolved::decided_alone) {
            return self.decide_in_turn(subjects, which, answers).await;
        }
        let at_us = self.clock.at_us();
        let plans: Vec<Plan<'_>> = which
            .iter()
            .zip(&resolved)
            .map(|(&i, r)| r.plan(&subjects[i].key, at_us))
            .collect();
        if !self.store.decides_jointly() || joint_limits(&plans) > MAX_JOINT_LIMITS {
            return self.decide_in_turn(subjects, which, answers).await;
        }
        let joint = self.store.acquire_joint(&plans);
        let joint =
            crate::trace::store_call("store acquire joint", self.store_decider().as_str(), joint);
        let decided: Vec<(Verdict, DecidedBy)> = match joint.await {
            Ok(verdicts) => {
                let by = self.store_decider();
                verdicts.into_iter().map(|v| (v, by)).collect()
            }
            Err(e) => self.fail_modes.joint(&plans, e, self.clock.now_us())?,
        };
        let allowed = decided.iter().all(|(v, _)| v.allowed);
        let mut resolved_applied = vec![None; subjects.len()];
        let mut resolved_given = vec![None; subjects.len()];
        for (&i, r) in which.iter().zip(&resolved) {
            resolved_applied[i] = r.applied.clone();
            resolved_given[i] = r.given.clone();
        }
        for (j, ((&i, (verdict, decided_by)), r)) in
            which.iter().zip(decided).zip(&resolved).enumerate()
        {
            let s = &subjects[i];
            self.count_top(
                &s.found.policy,
                s.key.as_str(),
                &verdict,
                plans[j].params,
                decided_by,
            );
            let counters = s.found.counters.of(&s.found.policy);
            counters
                .limits
                .count(r.limits().limits(), &verdict, decided_by);
            match (decided_by.is_degraded(), verdict.allowed) {
                (true, _) => counters.degraded.increment(1),
                (false, true) => counters.allowed.increment(1),
                (false, false) => counters.denied.increment(1),
            }
            answers[i] = Some(Acquired {
                op: Op::Acquire,
                policy: s.found.policy.clone(),
                etag: s.found.etag.clone(),
                verdict,
                degraded: decided_by.is_degraded(),
                decided_by,
                shadow: false,
                ticket: None,
                delay_us: None,
                applied: resolved_applied[i].clone(),
                given: resolved_given[i].clone(),
            });
        }
        Ok(allowed)
    }

    /// The joint step on a Cluster, or past `MAX_JOINT_LIMITS` limits: each subject in turn; at
    /// the first denial the rest are peeked and what the earlier ones took is refunded.
    async fn decide_in_turn(
        &self,
        subjects: &[Subject],
        which: &[usize],
        answers: &mut [Option<Acquired>],
    ) -> Result<bool, ServiceError> {
        let mut allowed = true;
        let mut taken: Vec<usize> = Vec::new();
        for &i in which {
            let s = &subjects[i];
            let decided = if allowed {
                self.decide_subject(s, Ask::Acquire { cost: s.cost }).await
            } else {
                self.look(s).await
            };
            let a = match decided {
                Ok(a) => a,
                Err(e) => {
                    self.give_back(subjects, &taken, answers).await;
                    return Err(e);
                }
            };
            if allowed && a.verdict.allowed {
                taken.push(i);
            } else {
                allowed = false;
            }
            answers[i] = Some(a);
        }
        if !allowed {
            self.give_back(subjects, &taken, answers).await;
        }
        Ok(allowed)
    }

    /// Refunds what the acquires of `taken` took, with their tickets, and answers each with the
    /// subject as the refund left it. A refund that fails is logged: those units come back when
    /// their window passes.
    async fn give_back(
        &self,
        subjects: &[Subject],
        taken: &[usize],
        answers: &mut [Option<Acquired>],
    ) {
        for &i in taken {
            let s = &subjects[i];
            let Some(ticket) = answers[i].as_ref().and_then(|a| a.ticket.as_ref()) else {
                continue;
            };
            let text = ticket.to_string();
            let ask = Ask::Refund {
                cost: s.cost,
                ticket: Some(text.as_str()),
            };
            match self.decide_subject(s, ask).await {
                Ok(refunded) => answers[i] = Some(refunded),
                Err(e) => {
                    tracing::warn!(policy = %s.found.policy.name, error = %e, "could not give back what a descriptor took when another denied; its units return when their window passes");
                }
            }
        }
    }
}
