//! What a policy's fail mode answers when its store failed: one table, read by a lone decision,
//! a joint acquire and a lease call.
//!
//! Every error a store answers is answered by the fail mode
//! ([`crate::store::ErrorClass::answered_by_fail_mode`]). Then ([`fallback`]):
//!
//! | `fail_mode` | a store to fall back on | answer |
//! |---|---|---|
//! | `closed` | either | the error ([`Fallback::Refuse`]) |
//! | `local` | yes (the shared store failed) | this instance's embedded store decides (`fail_local`), or, when it cannot, as `open` ([`Fallback::Local`]) |
//! | `local` | no (the embedded store is the store, and is full) | as `open` ([`Fallback::Allow`]) |
//! | `open` | either | allowed, counting nothing (`fail_open`) ([`Fallback::Allow`]) |
//!
//! What that means for each kind of call:
//! - **A decision** ([`FailModes::decision`]): `closed` answers the error as what it is (a
//!   decision whose call may have been counted by Redis is `outcome-unknown`, one that provably
//!   was not is `store-unavailable`); `local` falls back to `open` when the embedded store is full.
//!   An `open` answer leaves each limit its quota less an acquire's or a peek's cost, or its whole
//!   quota after a report or a refund, which recorded nothing.
//! - **A joint acquire** ([`FailModes::joint`]), all or nothing: any `closed` part refuses the
//!   whole; otherwise each part by its own fail mode, as it would be alone: the `local` parts are
//!   decided together by the embedded store, the `open` parts count nothing, and every part is
//!   allowed as the local parts were (all of them, when there are none, or the embedded store is
//!   full).
//! - **A lease call** ([`FailModes::lease`]): `closed` answers the error with its outcome settled
//!   (`store-unavailable`): a take whose outcome is unknown is undone once the store answers
//!   (`undo`), and a renewal or a release is retried by its holder. `local` falls back to `open`
//!   also for a renewal or a release the embedded store does not know: the lease was most likely
//!   taken on the shared store before it failed, and a 404 would tell a holder whose lease is
//!   still live there to stop its work. `open` grants a take, renews a renewal, and answers a
//!   release as done without knowing whether the lease was live.
//!
//! An outage fails every call: each kind logs one line a second, with how many there were.

use super::DecidedBy;
use crate::limiter::concurrency::{LeaseAnswer, LeaseCall, LeaseOp};
use crate::limiter::{Decision, Op, Params, Verdict};
use crate::policy::FailMode;
use crate::store::{LeasePlan, MemoryStore, Plan, StoreError};
use crate::telemetry::Summarized;

/// What a fail mode does with a call its store failed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Answer the error.
    Refuse,
    /// Decide with this instance's embedded store; allow as `open` when it cannot.
    Local,
    /// Allow, counting nothing.
    Allow,
}

/// The row of the table (see the module documentation) for `mode`, with or without an embedded
/// store to fall back on (`local`: the store that failed is a shared one).
pub const fn fallback(mode: FailMode, local: bool) -> Fallback {
    match (mode, local) {
        (FailMode::Closed, _) => Fallback::Refuse,
        (FailMode::Local, true) => Fallback::Local,
        (FailMode::Local, false) | (FailMode::Open, _) => Fallback::Allow,
    }
}

/// The fail modes of one service: the table, and the embedded store that `local` decides with
/// while a shared store fails (`None` on the embedded store).
pub struct FailModes {
    local: Option<MemoryStore>,
}

impl FailModes {
    pub fn new(local: Option<MemoryStore>) -> Self {
        Self { local }
    }

    /// The embedded store `local` decides with, beside a shared store.
    pub fn local(&self) -> Option<&MemoryStore> {
        self.local.as_ref()
    }

    /// The answer to a decision whose store failed with `error`: the verdict and who gave it, or
    /// the error. `now` is this instance's time (µs).
    pub fn decision(
        &self,
        plan: &Plan<'_>,
        error: StoreError,
        now: u64,
    ) -> Result<(Verdict, DecidedBy), StoreError> {
        if !error.class().answered_by_fail_mode() {
            return Err(error);
        }
        let policy = plan.policy;
        static DEGRADED: Summarized = Summarized::per_second();
        if let Some(count) = DEGRADED.hit() {
            tracing::warn!(policy = %policy.name, %error, fail_mode = policy.fail_mode.as_str(), count, "store failed; answering by fail mode (count: decisions since the last such line)");
        }
        match (
            fallback(policy.fail_mode, self.local.is_some()),
            &self.local,
        ) {
            (Fallback::Refuse, _) => return Err(error),
            (Fallback::Local, Some(local)) => {
                // A full embedded store (`StoreError::Full`) allows, as `open` does.
                if let Ok(verdict) = local.decide_at(plan, now) {
                    return Ok((verdict, DecidedBy::FailLocal));
                }
            }
            (Fallback::Local | Fallback::Allow, _) => {}
        }
        Ok((
            open_verdict(plan.params, plan.op(), plan.cost(), now),
            DecidedBy::FailOpen,
        ))
    }

    /// The answer to a joint acquire of `plans` whose store failed with `error`: each part's
    /// verdict and who gave it, or the error.
    pub fn joint(
        &self,
        plans: &[Plan<'_>],
        error: StoreError,
        now: u64,
    ) -> Result<Vec<(Verdict, DecidedBy)>, StoreError> {
        if !error.class().answered_by_fail_mode() {
            return Err(error);
        }
        let local = self.local.is_some();
        let rows: Vec<Fallback> = plans
            .iter()
            .map(|p| fallback(p.policy.fail_mode, local))
            .collect();
        if rows.contains(&Fallback::Refuse) {
            // As what it is, like one subject's decision.
            return Err(error);
        }
        static DEGRADED: Summarized = Summarized::per_second();
        if let Some(count) = DEGRADED.hit() {
            tracing::warn!(%error, count, "store failed on a joint acquire; answering by fail modes");
        }
        let open = |p: &Plan<'_>| {
            (
                open_verdict(p.params, Op::Acquire, p.cost(), now),
                DecidedBy::FailOpen,
            )
        };
        let mut answers: Vec<(Verdict, DecidedBy)> = plans.iter().map(open).collect();
        let locals: Vec<usize> = (0..plans.len())
            .filter(|&i| rows[i] == Fallback::Local)
            .collect();
        let decided = match (&self.local, locals.as_slice()) {
            (Some(store), [_, ..]) => {
                let parts: Vec<Plan<'_>> = locals.iter().map(|&i| plans[i]).collect();
                // A full embedded store allows every part, as `open` does.
                store.acquire_joint_at(&parts, now).ok()
            }
            _ => None,
        };
        if let Some(verdicts) = decided {
            let allowed = verdicts.iter().all(|v| v.allowed);
            for (&i, verdict) in locals.iter().zip(verdicts) {
                answers[i] = (verdict, DecidedBy::FailLocal);
            }
            for (verdict, _) in &mut answers {
                verdict.allowed = allowed;
            }
        }
        Ok(answers)
    }

    /// The answer to a lease call whose store failed with `error`: the answer and who gave it, or
    /// the error. What to undo on the store once it answers is the caller's (`undo`).
    pub fn lease(
        &self,
        plan: &LeasePlan<'_>,
        error: StoreError,
        now: u64,
    ) -> Result<(LeaseAnswer, DecidedBy), StoreError> {
        if !error.class().answered_by_fail_mode() {
            return Err(error);
        }
        let (policy, call) = (plan.policy, plan.call);
        static DEGRADED: Summarized = Summarized::per_second();
        if let Some(count) = DEGRADED.hit() {
            tracing::warn!(policy = %policy.name, %error, op = call.op.as_str(), fail_mode = policy.fail_mode.as_str(), count, "store failed on a lease call; answering by fail mode (count: calls since the last such line)");
        }
        match (
            fallback(policy.fail_mode, self.local.is_some()),
            &self.local,
        ) {
            (Fallback::Refuse, _) => return Err(error.outcome_known()),
            (Fallback::Local, Some(local)) => {
                // The embedded store has no deadline: it always answers.
                let local_plan = LeasePlan {
                    call: LeaseCall {
                        deadline_us: None,
                        ..call
                    },
                    ..*plan
                };
                if let Ok(answer) = local.lease_at(&local_plan, plan.at_us) {
                    if answer.ok || matches!(call.op, LeaseOp::Take | LeaseOp::Look) {
                        return Ok((answer, DecidedBy::FailLocal));
                    }
                }
            }
            (Fallback::Local | Fallback::Allow, _) => {}
        }
        Ok((open_lease(&call, now), DecidedBy::FailOpen))
    }
}

/// A fail-open verdict: allowed, each limit with its quota less `cost` left (an acquire or a
/// peek) or its whole quota (a report or a refund, which recorded nothing).
pub fn open_verdict(params: &[Params], op: Op, cost: u64, now: u64) -> Verdict {
    let mut verdict = Verdict::at(now);
    for p in params {
        let remaining = match op {
            Op::Acquire | Op::Peek => p.quota().saturating_sub(cost),
            Op::Report | Op::Refund => p.quota(),
        };
        verdict.push(Decision {
            allowed: true,
            remaining,
            reset_after_us: 0,
            retry_after_us: 0,
        });
    }
    verdict
}

/// A fail-open lease answer: a take is granted and a renewal succeeds, for the call's lifetime; a
/// release is done, but whether the lease was live is not known.
fn open_lease(call: &LeaseCall<'_>, now: u64) -> LeaseAnswer {
    let holds = matches!(call.op, LeaseOp::Take | LeaseOp::Renew);
    LeaseAnswer {
        ok: holds,
        in_use: if holds { call.cost } else { 0 },
        expires_in_us: if holds { call.lease_us } else { 0 },
        ..LeaseAnswer::at(now)
    }
}

#[cfg(test)]
mod tests;
